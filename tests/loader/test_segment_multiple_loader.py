"""The loader on an output packed with ``--segment-multiple 8``: segments, positions and labels
derived from ``cu_seqlens`` (the padded spans) and ``cu_seqlens_unpadded`` (the real lengths)
equal the stored columns, in the reader, in items and in whole batches gathered from row groups,
whose ``seq_idx`` and ``PackedSeqParams`` fields equal those of the same rows collated as stored
items."""

from __future__ import annotations


import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader_helpers import pack, random_docs, write_input
from packtool.errors import ManifestError
from packtool.formats.packed import PackedOutput, structure_from_cu
from packtool.loader import HFCollator, PackedDataset, collate, collate_flat

N = 8
ALL = ["input_ids", "segment_ids", "position_ids", "labels", "cu_seqlens", "cu_seqlens_unpadded",
       "doc_ids", "doc_offsets", "max_seqlen", "num_targets"]


@pytest.fixture(scope="module", params=["none", "shifted"])
def padded(request, tmp_path_factory):
    """Documents of 1..30 tokens at C = 64, N = 8, shards of 6 rows (one row group each)."""
    d = tmp_path_factory.mktemp(f"segmul-{request.param}")
    write_input(d / "in", random_docs(90, 30, seed=7))
    return pack(d / "in", d / "out", 64, "--segment-multiple", str(N), "--rows-per-shard", "6",
                "--labels", request.param)


def _has_padding_inside_spans(out) -> bool:
    o = PackedOutput.open(out)
    for g in range(o.num_row_groups):
        b = o.decode(g, ["cu_seqlens", "cu_seqlens_unpadded"])
        if not np.array_equal(b.ragged["cu_seqlens"][0], b.ragged["cu_seqlens_unpadded"][0]):
            return True
    return False


@pytest.mark.parametrize("labels", ["unshifted", "shifted"])
def test_derived_structure_of_padded_spans_equals_the_stored_columns(padded, labels,
                                                                     monkeypatch):
    """decode(structure='derived') reads cu_seqlens_unpadded, not segment_ids or position_ids,
    and hands out the stored arrays (labels derived or converted the same way)."""
    assert _has_padding_inside_spans(padded), "the fixture must pad documents inside rows"
    read = []
    real = pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kw):
        read.append(list(columns or ()))
        return real(self, i, columns=columns, **kw)

    o = PackedOutput.open(padded)
    assert o.num_row_groups > 3
    for g in range(o.num_row_groups):
        a = o.decode(g, ALL, labels)
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
        b = o.decode(g, ALL, labels, structure="derived")
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", real)
        assert a.tokens.keys() == b.tokens.keys() and a.ragged.keys() == b.ragged.keys()
        for k in a.tokens:
            assert np.array_equal(a.tokens[k], b.tokens[k]), (g, k)
    assert read and all("cu_seqlens_unpadded" in c and "segment_ids" not in c
                        and "position_ids" not in c for c in read)


def test_items_derive_what_the_shards_store(padded):
    """PackedDataset items (derived by default) equal the stored items, row by row."""
    derived, stored = PackedDataset(padded), PackedDataset(padded, structure="stored")
    assert len(derived) > 20
    for i in range(len(derived)):
        a, b = derived[i], stored[i]
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), (i, k)


def test_a_subset_without_the_real_lengths_is_refused(padded):
    """cu_seqlens and doc_ids alone give the spans, not the documents in them: refused when the
    dataset is built, naming cu_seqlens_unpadded; with it the subset is accepted."""
    with pytest.raises(ValueError, match="missing cu_seqlens_unpadded"):
        PackedDataset(padded, columns=["input_ids", "cu_seqlens", "doc_ids"])
    ds = PackedDataset(padded, columns=["input_ids", "cu_seqlens", "cu_seqlens_unpadded",
                                        "doc_ids"])
    assert "segment_ids" not in ds[0]


@pytest.mark.parametrize("cols", [["input_ids", "segment_ids"],
                                  ["input_ids", "position_ids", "labels"],
                                  ["input_ids", "segment_ids", "position_ids", "labels"]])
def test_a_subset_that_rebuilds_spans_from_segments_or_positions_is_refused(padded, cols,
                                                                            tmp_path):
    """segment_ids or positions were accepted: collate then made each document's padding a
    span of its own (cu_seqlens not multiples of N, no cu_seqlens_q), silently. Refused for
    either dataset and for a mixture holding such an output."""
    from packtool.loader import PackedIterableDataset

    from packtool.formats.manifest import read_manifest

    info = read_manifest(padded).labels  # the same input, another row order
    labels = info.convention if info.stored else "none"
    other = pack(padded.parent / "in", tmp_path / "b", 64, "--segment-multiple", str(N),
                 "--rows-per-shard", "6", "--labels", labels, "--seed", "9")
    with pytest.raises(ValueError, match=r"--segment-multiple.*missing cu_seqlens"):
        PackedDataset(padded, columns=cols)
    with pytest.raises(ValueError, match=r"--segment-multiple.*missing cu_seqlens"):
        PackedIterableDataset(padded, columns=cols, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"--segment-multiple.*missing cu_seqlens"):
        PackedIterableDataset({"a": padded, "b": other}, columns=cols, rank=0, world_size=1)


COLLATES = {"collate": collate, "collate_flat": collate_flat, "hf": HFCollator(),
            "hf_flat": HFCollator(flatten=True)}


@pytest.mark.parametrize("name", list(COLLATES))
def test_gathered_batches_equal_collated_stored_items(padded, name):
    """Whole batches (input_ids, cu_seqlens, cu_seqlens_unpadded and doc_ids decoded, the rest
    derived for the batch) equal the collate function of the same rows read with their stored
    columns: labels, positions, seq_idx, cu_seqlens_q / _padded and max_seqlen_q included."""
    torch = pytest.importorskip("torch")
    from packtool.loader import PackedIterableDataset

    kw = dict(rank=0, world_size=1, seed=2, shuffle_buffer=5)
    order = [it["index"] for it in PackedIterableDataset(padded, **kw)]
    stored = PackedDataset(padded, structure="stored")
    batches = list(PackedIterableDataset(padded, batch_size=4, collate_fn=COLLATES[name], **kw))
    assert len(batches) == -(-len(order) // 4)
    seen = set()
    for b, k in zip(batches, range(0, len(order), 4)):
        ref = COLLATES[name]([stored[i] for i in order[k:k + 4]])
        for key, v in ref.items():
            if key in ("index", "row", "shard", "source", "doc_ids"):
                continue  # provenance: the items of a mixture-free dataset differ only here
            assert key in b, key
            if torch.is_tensor(v):
                assert v.dtype == b[key].dtype and torch.equal(v, b[key]), key
            else:
                assert v == b[key], key
        seen |= set(ref)
    if name.startswith("collate"):
        assert {"seq_idx", "cu_seqlens_q", "cu_seqlens_kv_padded", "max_seqlen_q"} <= seen
    else:
        assert "seq_idx" in seen


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(1, 11), max_size=4), min_size=1, max_size=4),
       st.sampled_from([1, 2, 4]))
def test_structure_from_padded_spans_follows_the_contract(rows, n):
    """Each document's span is its real length rounded up to a multiple of n: segment q on its
    real tokens, 0 on the rest of the span and on the tail; positions run over the whole span
    (the tail one pseudo-segment). Built by hand per row and compared."""
    C = 24
    cu_vals, un_vals, offs, k, want_seg, want_pos = [], [], [0], [], [], []
    for lens in rows:
        spans, reals, at = [], [], 0
        for a in lens:
            span = -(-a // n) * n
            if at + span > C:
                break
            spans.append(span)
            reals.append(a)
            at += span
        real = len(spans)
        if at < C:
            spans.append(C - at)
            reals.append(C - at)
        cu_vals += np.concatenate([[0], np.cumsum(spans)]).tolist()
        un_vals += np.concatenate([[0], np.cumsum(reals)]).tolist()
        offs.append(len(cu_vals))
        k.append(real)
        want_seg.append(sum(([q + 1] * a + [0] * (s - a) if q < real else [0] * s
                             for q, (s, a) in enumerate(zip(spans, reals))), []))
        want_pos.append(sum((list(range(s)) for s in spans), []))
    seg, pos = structure_from_cu(np.array(cu_vals), np.array(offs), np.array(k), C,
                                 unpadded=np.array(un_vals))
    assert seg.tolist() == want_seg and pos.tolist() == want_pos


def test_real_lengths_that_do_not_fit_the_spans_are_refused():
    """A document of 0 real tokens, more real tokens than its span, a row not starting at 0 or
    an array of another size: one ManifestError naming cu_seqlens_unpadded."""
    cu = np.array([0, 8, 16, 24])
    for un in ([0, 0, 8, 16], [0, 9, 13, 21], [1, 5, 10, 18], [0, 5, 10]):
        with pytest.raises(ManifestError, match="cu_seqlens_unpadded"):
            structure_from_cu(cu, np.array([0, 4]), np.array([2]), 24, unpadded=np.array(un))
