"""What every collate function needs, and that the batch path (rows gathered as slices of the
decoded row groups) builds exactly the batch that collating items builds."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from packtool.loader import (HFCollator, PackedDataset, PackedIterableDataset,  # noqa: E402
                             collate, collate_flat)

from loader_helpers import many_groups, pack, write_input  # noqa: E402,F401

COLLATES = {"collate": collate, "collate_flat": collate_flat, "hf": HFCollator(),
            "hf_flat": HFCollator(flatten=True)}


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """Rows with padding tails: docs of 3 and 2 tokens at C = 8, --no-shuffle."""
    d = tmp_path_factory.mktemp("padded")
    docs = [[11, 12, 13], [21, 22], [31, 32, 33, 34, 35], [41, 42, 43, 44]]
    return pack(write_input(d / "in", docs), d / "out", 8, "--no-shuffle", "--strategy",
                "ordered")


@pytest.mark.parametrize("name", list(COLLATES))
def test_position_only_items_are_refused_by_every_collate(padded, name):
    """input_ids and position_ids alone: the padding tail restarts at 0 like a document, so
    no collate can tell it apart; each refuses, naming segment_ids and labels."""
    ds = PackedDataset(padded)
    items = [{k: ds[i][k] for k in ("input_ids", "position_ids")} for i in range(len(ds))]
    with pytest.raises(ValueError, match=r"segment_ids.*labels.*padding tail"):
        COLLATES[name](items)


@pytest.mark.parametrize("extra", [(), ("doc_ids",), ("source_ids",), ("doc_offsets",)])
def test_segments_rebuilt_from_positions_are_0_on_the_padding_tail(padded, extra):
    """Items of input_ids, position_ids and labels (what Trainer keeps), with or without a
    per-segment column: collate's segment_ids equal the stored ones (0 on every padding
    tail, never one more segment), and everything else of the batch is the full batch's."""
    ds = PackedDataset(padded)
    full = [ds[i] for i in range(len(ds))]
    assert any((it["segment_ids"] == 0).any() for it in full)  # the case has padding tails
    if extra == ("source_ids",):
        for it in full:
            it["source_ids"] = np.arange(len(it["doc_ids"]), dtype=np.int32)
    keys = ("input_ids", "position_ids", "labels", *extra)
    want = collate(full)
    got = collate([{k: it[k] for k in keys} for it in full])
    for k in ("segment_ids", "input_ids", "position_ids", "labels", "cu_seqlens", "seq_idx"):
        assert torch.equal(got[k], want[k]), k
    assert got["num_targets"] == want["num_targets"]
    if extra == ("source_ids",):
        assert torch.equal(got["token_source_ids"], want["token_source_ids"])
        assert (got["token_source_ids"] == -1).sum() == (want["segment_ids"] == 0).sum()


def test_a_last_document_without_targets_is_numbered_as_padding_without_per_segment_columns():
    """Positions and labels alone cannot tell a last document without targets from the padding
    tail: both are numbered 0 (documented); the loss and cu_seqlens do not change."""
    item = {"input_ids": np.array([11, 12, 13, 21, 22, 7], np.int32),
            "position_ids": np.array([0, 1, 2, 0, 1, 0], np.int32),
            "labels": np.array([-100, 12, 13, -100, 22, -100], np.int32)}
    b = collate([item])
    assert b["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 0]]
    assert b["cu_seqlens"].tolist() == [0, 3, 5, 6] and b["num_targets"] == 3
    one = {k: v[:3] for k, v in item.items()}  # one document filling the row: never padding
    one["labels"] = np.full(3, -100, np.int32)
    assert collate([one])["segment_ids"].tolist() == [[1, 1, 1]]


def test_columns_no_collate_can_use_are_refused_when_the_dataset_is_built(padded):
    for cls, kw in ((PackedDataset, {}), (PackedIterableDataset, {"rank": 0, "world_size": 1})):
        for cols in (["input_ids", "position_ids"], ["segment_ids", "labels"]):
            with pytest.raises(ValueError, match="missing"):
                cls(padded, columns=cols, **kw)
    with pytest.raises(ValueError, match="missing"):
        PackedIterableDataset(padded, columns=["input_ids", "position_ids"], batch_size=2)


def test_a_refusal_of_columns_names_every_set_of_columns_that_would_do(padded):
    """columns=['input_ids', 'cu_seqlens'] was refused as "missing segment_ids", though doc_ids
    would do as well: every refused subset of the columns names what it lacks of each set
    that makes a batch (input_ids and one of segment_ids, cu_seqlens + doc_ids, position_ids +
    labels), with what it holds of that set; a dataset given any one of them is built, and
    every collate takes its items."""
    from itertools import combinations

    from packtool.loader.collate import check_item_columns

    names = ("input_ids", "segment_ids", "cu_seqlens", "doc_ids", "position_ids", "labels")
    sets = (("segment_ids",), ("cu_seqlens", "doc_ids"), ("position_ids", "labels"))
    refused = 0
    for n in range(len(names) + 1):
        for cols in combinations(names, n):
            have = set(cols)
            if "input_ids" in have and any(set(s) <= have for s in sets):
                check_item_columns(cols)
                continue
            with pytest.raises(ValueError) as err:
                check_item_columns(cols)
            refused += 1
            msg = str(err.value)
            said = msg.split("(columns: ", 1)[1].split("): ", 1)[0].split("; missing ", 1)[1]
            assert ("input_ids" in said) == ("input_ids" not in have), (cols, msg)
            if any(set(s) <= have for s in sets):
                continue  # only input_ids lacks
            for s in sets:
                lack = " and ".join(c for c in s if c not in have)
                kept = " and ".join(c for c in s if c in have)
                assert lack + (f" (beside {kept})" if kept else "") in said, (cols, msg)
    assert refused > 40
    with pytest.raises(ValueError, match=r"missing one of: segment_ids; doc_ids \(beside "
                                         r"cu_seqlens\); position_ids and labels\)"):
        PackedDataset(padded, columns=["input_ids", "cu_seqlens"])
    for added in (["segment_ids"], ["doc_ids"], ["position_ids", "labels"]):
        ds = PackedDataset(padded, columns=["input_ids", "cu_seqlens", *added])
        items = [ds[i] for i in range(len(ds))]
        for name, make in COLLATES.items():
            assert make(items)["labels"].numel() == len(ds) * 8, (added, name)


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    """An SFT output: an input labels column masks each document's prompt (its first two
    tokens), so 4 of 7 non-first tokens are targets, not 5."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("prompted")
    (d / "in").mkdir()
    pq.write_table(pa.table({"input_ids": [[5, 6, 7, 8], [9, 10, 11]],
                             "labels": [[-100, -100, 7, 8], [-100, 10, 11]]}),
                   d / "in" / "a.parquet")
    return pack(d / "in", d / "out", 8, "--no-shuffle", "--strategy", "ordered")


@pytest.mark.parametrize("cols", [["input_ids", "cu_seqlens", "doc_ids"],
                                  ["input_ids", "segment_ids"],
                                  ["input_ids", "segment_ids", "position_ids"]])
def test_a_columns_subset_without_the_masked_labels_is_refused(prompted, cols, tmp_path):
    """Labels rebuilt from the boundaries would train the masked prompt tokens (5 targets
    instead of 4): every dataset refuses such columns, a mixture too; with labels kept, every
    collate hands out the stored masks."""
    kws = ((PackedDataset, {}), (PackedIterableDataset, {"rank": 0, "world_size": 1}),
           (PackedIterableDataset, {"batch_size": 1}))
    for cls, kw in kws:
        with pytest.raises(ValueError, match=r"labels.*-100 on purpose.*add 'labels'"):
            cls(prompted, columns=cols, **kw)
    with pytest.raises(ValueError, match=r"-100 on purpose"):
        PackedIterableDataset({"a": prompted, "b": shutil.copytree(prompted, tmp_path / "b")},
                              weights={"a": 1, "b": 1}, columns=cols, rank=0, world_size=1)
    ds = PackedDataset(prompted, columns=cols + ["labels"])
    for name, fn in COLLATES.items():
        batch = fn([ds[0]])
        lab = batch["labels"].reshape(-1).tolist()
        assert lab == [-100, -100, 7, 8, -100, 10, 11, -100], name
    full = PackedIterableDataset(prompted, batch_size=1, rank=0, world_size=1)
    assert next(iter(full))["labels"].reshape(-1).tolist() == [-100, -100, 7, 8, -100, 10,
                                                                11, -100]


@pytest.mark.parametrize("cols", [["input_ids", "segment_ids"],
                                  ["input_ids", "position_ids", "labels"]])
@pytest.mark.parametrize("name", list(COLLATES))
def test_every_collate_builds_the_full_batch_from_an_accepted_subset(padded, cols, name):
    """A subset that keeps segment_ids, or positions with labels, gives the same labels,
    positions, boundaries and targets as the full items (the padding never a target)."""
    full = PackedDataset(padded)
    sub = PackedDataset(padded, columns=cols)
    n = len(full)
    ref = COLLATES[name]([full[i] for i in range(n)])
    got = COLLATES[name]([sub[i] for i in range(n)])
    for k in ("input_ids", "labels", "position_ids", "cu_seqlens", "cu_seq_lens_q",
              "num_targets", "max_seqlen"):
        if k in ref:
            a, b = ref[k], got[k]
            assert (torch.equal(a, b) if torch.is_tensor(a) else a == b), k
    lab = got["labels"].reshape(n, -1)
    seg = torch.as_tensor(np.stack([full[i]["segment_ids"] for i in range(n)]))
    assert bool((lab[seg == 0] == -100).all())  # padding never trained


@pytest.mark.parametrize("name", list(COLLATES))
def test_batches_gathered_from_row_groups_equal_collated_items(many_groups, name):
    """PackedIterableDataset(batch_size=5, collate_fn=f) yields f(items) for the same rows, for
    every collate function: the gathered path changes speed, not content."""
    kw = dict(rank=1, world_size=2, seed=6, shuffle_buffer=9)
    items = list(PackedIterableDataset(many_groups, **kw))
    batches = list(PackedIterableDataset(many_groups, batch_size=5, collate_fn=COLLATES[name],
                                         **kw))
    assert len(batches) == -(-len(items) // 5)
    for b, k in zip(batches, range(0, len(items), 5)):
        ref = COLLATES[name](items[k:k + 5])
        assert ref.keys() == b.keys()
        for key, v in ref.items():
            if torch.is_tensor(v):
                assert v.dtype == b[key].dtype and torch.equal(v, b[key]), key
            elif key == "doc_ids":
                assert all(np.array_equal(x, y) for x, y in zip(v, b[key]))
            else:
                assert v == b[key], key


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(1, 9), min_size=0, max_size=5), min_size=1, max_size=4),
       st.sampled_from(["unshifted", "shifted"]))
def test_batch_labels_equal_the_read_side_rule(rows_segments, convention):
    """The labels a batch derives (one int64 cast, -100 written at boundaries and over padding
    tails) equal the reader's rule, unshifted_labels / shifted_labels, for any segment layout
    (one-token segments, full rows, rows of padding only), and the targets count them."""
    from packtool.formats.packed import shifted_labels, unshifted_labels
    from packtool.loader.collate import _derived_labels64

    C = 16
    seg = np.zeros((len(rows_segments), C), dtype=np.int32)
    cu = []
    for r, lens in enumerate(rows_segments):
        at = 0
        for q, n in enumerate(lens, start=1):
            n = min(n, C - at)
            if n <= 0:
                break
            seg[r, at:at + n] = q
            cu.append(r * C + at)
            at += n
        if at < C:
            cu.append(r * C + at)  # the padding tail
    cu.append(seg.size)
    ids = np.arange(seg.size, dtype=np.int32).reshape(seg.shape) + 100
    lab, n = _derived_labels64(ids, seg, np.asarray(cu), convention)
    ref = (shifted_labels if convention == "shifted" else unshifted_labels)(ids, seg)
    assert lab.dtype == np.int64 and lab.tolist() == ref.tolist()
    assert n == int((ref != -100).sum())


@pytest.mark.parametrize("kw", [{}, {"batch_size": 2}, {"num_workers": 1}])
def test_a_dataloader_that_batches_the_datasets_batches_is_refused(many_groups, kw):
    """batch_size on the dataset and the DataLoader's default batch_size=1 stacked [1, B, C]
    batches (num_targets a tensor), batch_size=2 failed at the first short batch, workers with
    a TypeError: one ValueError naming batch_size=None; with it the batches are [B, C]."""
    ds = PackedIterableDataset(many_groups, rank=0, world_size=1, batch_size=4)
    with pytest.raises(Exception, match=r"yields whole batches \(batch_size=4\).*batch_size=None"):
        next(iter(torch.utils.data.DataLoader(ds, **kw)))
    b = next(iter(torch.utils.data.DataLoader(ds, batch_size=None, **{
        k: v for k, v in kw.items() if k == "num_workers"})))
    assert b["input_ids"].shape[0] == 4 and isinstance(b["num_targets"], int)
    with pytest.raises(ValueError, match=r"not one batch \(a dict\).*batch_size=None"):
        next(iter(torch.utils.data.DataLoader(ds, batch_size=None, collate_fn=collate)))


@pytest.mark.parametrize("name", list(COLLATES))
@pytest.mark.parametrize("made_by", ["collate", "collate_flat", "dataset"])
def test_a_list_of_batches_already_made_is_refused_as_batches(many_groups, name, made_by):
    """Batches already made (by a dataset given batch_size=, or by a collate) handed to a
    collate as if they were rows: refused in one line saying so, naming the fix. It said the
    items were of different capacity (pack every output with the same --capacity), or that a
    cu_seqlens must rise from 0 to C = 2: advice about packing for a mistake in the loop."""
    if made_by == "dataset":
        made = list(PackedIterableDataset(many_groups, rank=0, world_size=1, batch_size=2))
    else:
        items = [PackedDataset(many_groups)[i] for i in range(4)]
        made = [COLLATES[made_by](items[:2]), COLLATES[made_by](items[2:])]
    for batches in (made[:2], made[:1]):
        with pytest.raises(ValueError, match=r"batch item 0 is a batch already made .*not one "
                                             r"row.*as it is"):
            COLLATES[name](batches)


@pytest.mark.parametrize("name", list(COLLATES))
@pytest.mark.parametrize("column,length", [("position_ids", 7), ("position_ids", 9),
                                           ("labels", 10), ("segment_ids", 7)])
def test_per_token_columns_of_another_length_are_refused_by_every_collate(padded, name,
                                                                        column, length):
    """B27: an item whose transform padded or cut one per-token column only (position_ids of 7
    beside input_ids of 8): every collate refuses it naming the item, the column and both
    lengths (collate made a [1, 7] position_ids beside [1, 8] input_ids; the others failed
    with a reshape error)."""
    ds = PackedDataset(padded, labels="unshifted")
    items = [dict(ds[i]) for i in range(2)]
    col = np.asarray(items[1][column])
    items[1][column] = np.resize(col, length)
    with pytest.raises(ValueError, match=rf"^batch item 1: {column} holds {length} values and "
                                         r"input_ids 8"):
        COLLATES[name](items)


@pytest.mark.parametrize("name", list(COLLATES))
@pytest.mark.parametrize("cu", [[0, 3, 5], [0, 3, 3, 5, 8], [1, 3, 5, 8], [0, 5, 3, 8]])
def test_an_item_whose_cu_seqlens_does_not_rise_from_0_to_c_is_refused(padded, name, cu):
    """B07: cu_seqlens ending at the real tokens (the padding tail joined to the last
    document: the batch's cu_seqlens disagreed with its seq_idx and segment_ids), holding an
    empty span, not starting at 0 or not rising: every collate refuses the item."""
    ds = PackedDataset(padded)
    items = [dict(ds[i]) for i in range(2)]
    assert list(items[0]["cu_seqlens"]) == [0, 3, 5, 8]
    items[0]["cu_seqlens"] = np.asarray(cu, dtype=np.int32)
    with pytest.raises(ValueError, match=r"^batch item 0: cu_seqlens .* must rise from 0 to "
                                         r"C = 8"):
        COLLATES[name](items)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 6).flatmap(lambda C: st.tuples(st.just(C), st.lists(
    st.lists(st.integers(-1, C + 1), max_size=5).map(sorted), min_size=1, max_size=4))))
def test_batch_span_check_matches_the_per_item_rule(case):
    """The one-pass B07 check over a batch's concatenated cu_seqlens says what checking each
    item alone says (starts at 0, ends at C, strictly rising, at least one span)."""
    from packtool.loader.collate import _spans_cover

    C, lists = case
    parts = [np.asarray(v, dtype=np.int32) for v in lists]
    offs = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([p.size for p in parts], out=offs[1:])
    alone = all(p.size >= 2 and p[0] == 0 and p[-1] == C and bool((np.diff(p) > 0).all())
                for p in parts)
    assert _spans_cover(np.concatenate(parts), offs, C) == alone


def test_rows_of_outputs_packed_with_other_options_are_refused_in_one_batch(tmp_path):
    """Rows of a --segment-multiple output beside rows of a plain one, a row without
    source_ids beside one with them, rows of another capacity: every collate refuses the
    batch naming both items and what differs, whichever comes first (a bare KeyError when
    the first lacked a column; with the other order the batch lost the --segment-multiple
    fields in silence)."""
    src = write_input(tmp_path / "in", [[1, 2, 3], [4, 5], [6, 7, 8, 9]])
    pq.write_table(pa.table({"input_ids": [[1, 2, 3], [4, 5]], "src": ["a", "b"]}),
                   tmp_path / "s.parquet")
    plain = PackedDataset(pack(src, tmp_path / "plain", 16))[0]
    multiple = PackedDataset(pack(src, tmp_path / "m", 16, "--segment-multiple", "4"))[0]
    sourced = PackedDataset(pack(tmp_path / "s.parquet", tmp_path / "src", 16,
                                 "--source-column", "src"))[0]
    wider = PackedDataset(pack(src, tmp_path / "w", 32))[0]
    for fn in (collate, collate_flat, HFCollator()):
        for a, b, only in ((plain, multiple, "cu_seqlens_unpadded"),
                           (multiple, plain, "cu_seqlens_unpadded"),
                           (plain, sourced, "source_ids"), (sourced, plain, "source_ids")):
            with pytest.raises(ValueError, match=rf"batch items 0 and 1 carry different "
                                                 rf"columns \(only item [01] carries .*{only}"):
                fn([a, b])
        with pytest.raises(ValueError, match=r"batch items 0 and 1 hold rows of different "
                                             r"capacity \(16 and 32 tokens\)"):
            fn([plain, wider])


@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_a_dataloader_batching_items_with_torchs_default_collate_is_told_to_pass_collate(
        tmp_path, kind):
    """DataLoader(dataset, batch_size=8) with no collate_fn: torch's default collate cannot
    stack the items' per-document columns and failed inside torch ('stack expects each tensor
    to be equal size'); it is refused naming collate_fn=collate. Items of per-token columns
    only (a columns= subset) are stacked by it as before, and collate_fn=collate works."""
    from torch.utils.data import DataLoader

    src = write_input(tmp_path / "in", [[1, 2, 3], [4, 5], [6, 7, 8, 9], [1], [2, 2]])
    out = pack(src, tmp_path / "out", 8)
    make = PackedIterableDataset if kind == "iterable" else PackedDataset
    with pytest.raises(ValueError, match=r"torch's default collate, which cannot stack their "
                                         r"per-document columns .* collate_fn=collate"):
        next(iter(DataLoader(make(out), batch_size=2)))
    batch = next(iter(DataLoader(make(out), batch_size=2, collate_fn=collate)))
    assert batch["input_ids"].shape == (2, 8)
    per_token = ["input_ids", "segment_ids", "position_ids", "labels"]
    batch = next(iter(DataLoader(make(out, columns=per_token), batch_size=2)))
    assert batch["segment_ids"].shape == (2, 8)
    # one dataset object read by a DataLoader that batches fine, then by one that does not:
    # the second is refused too (the map-style dataset took the first as leave to stop looking)
    ds = make(out)
    for _ in range(2):
        assert next(iter(DataLoader(ds, batch_size=2, collate_fn=collate)))["input_ids"].shape \
            == (2, 8)
        with pytest.raises(ValueError, match=r"torch's default collate, which cannot stack "):
            next(iter(DataLoader(ds, batch_size=2)))


@pytest.mark.parametrize("name", list(COLLATES))
def test_rows_in_a_datasets_table_format_or_a_slice_are_refused_in_one_line(padded, name):
    """Rows of a datasets.Dataset in pandas or arrow format (items that are DataFrames or
    Tables, or one of them for a slice), or a slice d[0:2] in any format (a dict of columns of
    several rows): one line saying items must be a list of row dicts, naming the forms that
    work; those forms (python, numpy, torch rows) build the same batch as the packed items."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("pandas")
    items = [PackedDataset(padded)[i] for i in range(2)]
    d = datasets.Dataset.from_list([{k: v.tolist() if hasattr(v, "tolist") else v
                                     for k, v in it.items()} for it in items])
    fn = COLLATES[name]
    bad = [[d.with_format("pandas")[i] for i in range(2)], d.with_format("pandas")[0:2],
           [d.with_format("arrow")[i] for i in range(2)], d.with_format("arrow")[0:2],
           d[0:2], d.with_format("numpy")[0:2], d.with_format("torch")[0:2]]
    for batch in bad:
        with pytest.raises(ValueError, match=r"items must be a list of row dicts \(python, "
                                             r"numpy or torch format.*with_format\('numpy'\)"
                           ) as err:
            fn(batch)
        assert "\n" not in str(err.value)
    want = fn(items)
    for fmt in (None, "numpy", "torch"):
        got = fn([d.with_format(fmt)[i] for i in range(2)])
        for k in ("input_ids", "position_ids", "labels"):
            assert torch.equal(got[k], want[k]), (fmt, k)
