"""seq_idx (the document index hybrid and linear-attention layers reset on) and the
context-parallel fields, in every collate.

Each expected value is recounted from the columns alone: from ``segment_ids`` (a new document
starts where the id changes; the padding tail is one more index) or, with padded segments, from
``position_ids`` restarting at 0; the ``PackedSeqParams`` fields from the real lengths.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from loader_helpers import pack, random_docs, write_input  # noqa: E402

from packtool.loader import HFCollator, PackedDataset, collate, collate_flat  # noqa: E402


def _recount_from_segments(seg_BC: np.ndarray, flat: bool) -> np.ndarray:
    """Document index per token: +1 wherever segment_ids changes (row starts included)."""
    B, C = seg_BC.shape
    start = np.ones((B, C), dtype=bool)
    start[:, 1:] = seg_BC[:, 1:] != seg_BC[:, :-1]
    if flat:
        return (np.cumsum(start.reshape(-1)) - 1).reshape(1, -1)
    return np.cumsum(start, axis=1) - 1


def _recount_from_positions(pos_BC: np.ndarray, flat: bool) -> np.ndarray:
    start = pos_BC == 0
    if flat:
        return (np.cumsum(start.reshape(-1)) - 1).reshape(1, -1)
    return np.cumsum(start, axis=1) - 1


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Rows of several documents, some with a padding tail (C = 64)."""
    tmp = tmp_path_factory.mktemp("plain")
    return pack(write_input(tmp / "in", random_docs(60, 40, seed=3)), tmp / "out", 64)


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """The same kind of rows packed with --segment-multiple 8."""
    tmp = tmp_path_factory.mktemp("cp")
    return pack(write_input(tmp / "in", random_docs(60, 40, seed=4)), tmp / "out", 64,
                "--segment-multiple", "8")


def _items(path, n=5):
    ds = PackedDataset(path)
    multi = [i for i in range(len(ds)) if len(ds[i]["doc_ids"]) >= 2]
    tails = [i for i in range(len(ds)) if int(np.asarray(ds[i]["segment_ids"])[-1]) == 0]
    pick = (multi[:n - 1] + tails[:1])
    assert len(multi) >= 2 and tails, "the fixture must hold multi-document and padded rows"
    return [ds[i] for i in pick]


def test_seq_idx_equals_a_recount_from_segment_ids_in_every_collate(plain):
    """[B, C] collate and HFCollator count per row, collate_flat and HFCollator(flatten) over the
    batch; int32 everywhere, as mamba-ssm, causal-conv1d and Hugging Face take it."""
    items = _items(plain)
    seg = np.stack([np.asarray(it["segment_ids"]) for it in items])
    for batch, flat in ((collate(items), False), (collate_flat(items), True),
                        (HFCollator()(items), False), (HFCollator(flatten=True)(items), True)):
        got = batch["seq_idx"]
        assert got.dtype == torch.int32
        assert got.shape == ((1, seg.size) if flat else seg.shape)
        assert np.array_equal(got.numpy(), _recount_from_segments(seg, flat))


def test_seq_idx_marks_every_span_of_cu_seqlens(plain):
    """Megatron's rule: seq_idx = repeat(arange(S), diff(cu_seqlens)) over the flattened batch,
    so it and cu_seqlens never disagree."""
    items = _items(plain)
    b = collate(items)
    cu = b["cu_seqlens"].numpy().astype(np.int64)
    want = np.repeat(np.arange(cu.size - 1), np.diff(cu))
    assert np.array_equal(collate_flat(items)["seq_idx"].numpy()[0], want)


def test_hf_collator_recounts_seq_idx_when_trainer_dropped_the_structure_columns(plain):
    """Trainer keeps only input_ids, position_ids and labels before the collator: seq_idx then
    comes from the positions restarting at 0, and is the same."""
    items = _items(plain)
    slim = [{k: it[k] for k in ("input_ids", "position_ids", "labels")} for it in items]
    seg = np.stack([np.asarray(it["segment_ids"]) for it in items])
    assert np.array_equal(HFCollator()(slim)["seq_idx"].numpy(), _recount_from_segments(seg, False))
    assert "seq_idx" not in HFCollator(seq_idx=False)(slim)


def test_padded_rows_give_seq_idx_over_whole_spans_and_packed_seq_params(padded):
    """--segment-multiple 8: the padding after a document carries its index (positions go on
    there); cu_seqlens_q holds the real lengths, cu_seqlens_q_padded the spans, as
    TransformerEngine's THD format takes them; a row's real lengths follow the previous row's
    total, its spans the previous row's end."""
    items = _items(padded)
    pos = np.stack([np.asarray(it["position_ids"]) for it in items])
    for batch, flat in ((collate(items), False), (collate_flat(items), True),
                        (HFCollator()(items), False)):
        assert np.array_equal(batch["seq_idx"].numpy(), _recount_from_positions(pos, flat))
    for b in (collate(items), collate_flat(items)):
        cu = b["cu_seqlens_q_padded"]
        assert cu is b["cu_seqlens_kv_padded"] and b["cu_seqlens_q"] is b["cu_seqlens_kv"]
        assert cu.dtype == b["cu_seqlens_q"].dtype == torch.int32
        assert torch.equal(cu, b.get("cu_seqlens", b.get("cu_seq_lens_q")))
        assert (torch.diff(cu) % 8 == 0).all()
        real = []
        for it in items:
            seg = np.asarray(it["segment_ids"])
            spans = np.diff(np.asarray(it["cu_seqlens"]))
            k = len(it["doc_ids"])
            per_doc = [int((seg == q).sum()) for q in range(1, k + 1)]
            real += per_doc + [int(s) for s in spans[k:]]  # the tail counts whole
        assert torch.equal(b["cu_seqlens_q"], torch.tensor(np.concatenate([[0], np.cumsum(real)]),
                                                           dtype=torch.int32))
        assert b["max_seqlen_q"] == b["max_seqlen_kv"] == int(torch.diff(cu).max())
    assert "cu_seqlens_q" not in collate(_items_plain_like(items))


def _items_plain_like(items):
    """The same items without the unpadded column: no PackedSeqParams fields are made up."""
    return [{k: v for k, v in it.items() if k != "cu_seqlens_unpadded"} for it in items]
