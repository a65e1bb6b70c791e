"""The torch data path: collate dtypes/shapes (B06, B24, B28) and the document masks (B22)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packtool.formats.packed import PackedOutput  # noqa: E402
from packtool.verify.loader import PackedDataset, collate  # noqa: E402
from packtool.verify.masks import block_causal_mask, document_block_mask  # noqa: E402

from packed_helpers import pack_docs  # noqa: E402

DOCS = [[11, 12, 13], [21, 22], [31, 32, 33, 34, 35], [41], [51, 52, 53, 54]]


@pytest.fixture
def out(tmp_path):
    return pack_docs(tmp_path, DOCS, 6, "--strategy", "ordered")


def test_collate_dtypes_and_shapes_B06_B24_B28(out):
    """cu_seqlens int32 [S+1] offset by row*C, max_seqlen a Python int; ids and segments int32
    [B, C]; positions int64 (B28: long, what position code indexes with), labels int64 (the
    loss needs Long)."""
    ds = PackedDataset(out)
    assert len(ds) == 3  # ordered at C=6: [11,12,13,21,22] [31..35] [41,51..54], all padded
    batch = collate([ds[i] for i in range(len(ds))])
    B, C = 3, 6
    for k in ("input_ids", "labels", "position_ids", "segment_ids"):
        want = torch.int64 if k in ("labels", "position_ids") else torch.int32
        assert batch[k].shape == (B, C) and batch[k].dtype == want, k
    table = torch.randn(C, 4)
    pos = batch["position_ids"]
    assert torch.equal(table[pos], table[pos.long()]) and int(pos.max()) < C
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.ndim == 1
    per_row = [np.asarray(ds[i]["cu_seqlens"]) for i in range(B)]
    want = np.concatenate([c[:-1] + r * C for r, c in enumerate(per_row)] + [[B * C]])
    assert cu.tolist() == want.tolist()
    assert cu.shape[0] == sum(len(c) - 1 for c in per_row) + 1
    assert type(batch["max_seqlen"]) is int
    assert batch["max_seqlen"] == max(int(np.diff(c).max()) for c in per_row)
    assert batch["num_targets"] == int((batch["labels"] != -100).sum())
    # every row padded or not ends its segments at C: the flattened buffer is covered (B07)
    assert torch.all(torch.diff(cu) > 0)


def test_dataset_reads_any_row_by_index(out):
    """Random access by index returns the same rows as streaming them in order."""
    ds = PackedDataset(out)
    streamed = [b.row(i) for b in PackedOutput.open(out).iter_blocks() for i in range(b.num_rows)]
    for i in [2, 0, 1, -1]:
        assert ds[i]["input_ids"].tolist() == streamed[i]["input_ids"].tolist()
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_b28_b06_values_of_the_contract_row(tmp_path):
    """docs [[11,12,13],[21,22]] at C=6 load as positions [0,1,2,0,1,0] (torch.long, B28),
    cu [0,3,5,6] (torch.int32, B06)."""
    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 6)
    batch = collate([PackedDataset(out)[0]])
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 0]
    assert batch["position_ids"].dtype == torch.long
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 6] and batch["max_seqlen"] == 3


def test_b22_sdpa_mask_gives_padding_its_own_block():
    """docs [[5,6,7]] at C=5: padding rows see themselves, so no softmax row is empty."""
    seg = torch.tensor([[1, 1, 1, 0, 0]])
    m = block_causal_mask(seg)
    assert m.shape == (1, 1, 5, 5) and m.dtype == torch.bool
    assert m[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                                      [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    o = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=m)
    o.sum().backward()
    assert torch.isfinite(o).all() and torch.isfinite(q.grad).all()


def test_flex_block_mask_equals_sdpa_mask():
    """The FlexAttention document mask allows exactly what the SDPA boolean mask allows."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    seg = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 2, 2, 2]])
    q, k, v = (torch.randn(2, 2, 8, 8) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                           attn_mask=block_causal_mask(seg))
    out = flex_attention(q, k, v, block_mask=document_block_mask(seg))
    assert torch.allclose(out, ref, atol=1e-5)


def test_block_mask_rejects_wrong_rank():
    with pytest.raises(ValueError):
        block_causal_mask(torch.zeros(5, dtype=torch.long))


def test_dataloader_with_workers_and_collate(out):
    """A torch DataLoader (two worker processes) over PackedDataset yields every row once."""
    dl = torch.utils.data.DataLoader(PackedDataset(out), batch_size=2, collate_fn=collate,
                                     num_workers=2)
    seen = [row for b in dl for row in b["row"]]
    assert sorted(seen) == [0, 1, 2]


def test_missing_torch_names_the_verify_extra(monkeypatch):
    """Without torch, the torch path fails with a one-line error naming the pip extra."""
    import sys

    from packtool.errors import MissingDependencyError
    from packtool.verify import require_torch

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependencyError,
                       match=r"pip install 'torch>=[\d.]+' --index-url \S+/whl/cpu"):
        require_torch()


def test_labels_none_output_trains_with_derived_labels(tmp_path):
    """--labels none omits the column; the loader derives the unshifted labels, so the loss
    denominator (num_targets) is sum(len - 1), not 0 (which would make the loss NaN)."""
    from packed_helpers import pack_docs

    from packtool.verify.checks import run_verify
    from packtool.verify.loader import PackedDataset, collate

    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 6, "--labels", "none")
    batch = collate([PackedDataset(out)[0]])
    assert batch["labels"].tolist() == [[-100, 12, 13, -100, 22, -100]]
    assert batch["num_targets"] == 3
    rep = run_verify(out, rows=0, backends=["sdpa"])
    assert rep.ok, rep.format_text()
    loss = next(r for r in rep.results if r.backend == "sdpa" and r.check == "loss_denominator")
    assert loss.status == "pass"


def test_deprecated_dataset_says_shifted_for_shifted_labels_derived_from_no_column(tmp_path):
    """B05 through the deprecated packtool.verify.loader: an output without a labels column read
    with labels="shifted" gave shifted labels under labels_mode "none" (read as unshifted), so
    collate called them unshifted and HFCollator / collate_flat passed them on unconverted: a
    model that shifts again trained each token on the one two ahead. Items now say the
    convention of the labels they carry; "none" stays for the derived unshifted labels."""
    from packtool.loader import HFCollator, collate_flat

    out = pack_docs(tmp_path, [[11, 12, 13, 14]], 4, "--labels", "none")
    shifted = PackedDataset(out, labels="shifted")[0]
    assert shifted["labels"].tolist() == [12, 13, 14, -100]
    assert shifted["labels_mode"] == "shifted"
    assert collate([shifted])["labels_convention"] == "shifted"
    assert collate_flat([shifted])["labels"].tolist() == [[-100, 12, 13, 14]]
    assert HFCollator()([shifted])["labels"].tolist() == [[-100, 12, 13, 14]]
    plain = PackedDataset(out)[0]
    assert plain["labels_mode"] == "none" and plain["labels"].tolist() == [-100, 12, 13, 14]
    assert collate_flat([plain])["labels"].tolist() == [[-100, 12, 13, 14]]
