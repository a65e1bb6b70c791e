"""Document masks built from ``segment_ids``: what training code passes to attention.

Shape legend: B = rows in the batch, C = capacity (tokens per row), H = heads.

The padding tail (segment id 0) is treated as one more block, causal within itself, so every query
row, padding included, can see at least itself and no softmax row is empty (no NaN, case B22).
Real tokens never see padding and padding never sees real tokens.
"""

from __future__ import annotations

from packtool.verify import require_torch

__all__ = ["block_causal_mask", "document_mask_mod", "document_block_mask"]


def block_causal_mask(segment_ids_BC):
    """SDPA boolean mask: True where query i may attend key j.

    ``mask[b, 0, i, j] = segment_ids[b, i] == segment_ids[b, j] and j <= i``.

    Args:
        segment_ids_BC: integer tensor [B, C]; 1..k for documents, 0 for the padding tail.

    Returns:
        bool tensor [B, 1, C, C] on the device of ``segment_ids_BC`` (broadcasts over heads).

    Raises:
        ValueError: ``segment_ids_BC`` is not 2-D.
        MissingDependencyError: torch is missing.
    """
    torch = require_torch()
    if segment_ids_BC.ndim != 2:
        raise ValueError(f"segment_ids must be [B, C], got shape {tuple(segment_ids_BC.shape)}")
    C = segment_ids_BC.shape[1]
    same_BCC = segment_ids_BC[:, :, None] == segment_ids_BC[:, None, :]
    causal_CC = torch.ones(C, C, dtype=torch.bool, device=segment_ids_BC.device).tril()
    return (same_BCC & causal_CC)[:, None]


def document_mask_mod(segment_ids_BC):
    """FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` of the same block-diagonal causal mask.

    Args:
        segment_ids_BC: integer tensor [B, C] (closed over; indexed with the batch index).

    Returns:
        A function returning a bool tensor, True where ``q_idx`` may attend ``kv_idx``.
    """

    def mask_mod(b, h, q_idx, kv_idx):
        return (segment_ids_BC[b, q_idx] == segment_ids_BC[b, kv_idx]) & (kv_idx <= q_idx)

    return mask_mod


def document_block_mask(segment_ids_BC, *, block_size: int = 128):
    """FlexAttention ``BlockMask`` of :func:`document_mask_mod` for a [B, C] batch.

    The block structure is computed from ``segment_ids`` at tile level (``block_size`` x
    ``block_size`` tiles), not by evaluating the mask on all C x C pairs: segments are contiguous
    runs and the padding tail comes last, so a tile holds an allowed pair exactly when it is on or
    below the diagonal and the segment ranges of its query and key blocks overlap. Memory is
    O(B * (C / block_size)^2) whatever C is (``create_block_mask`` materializes C x C per row:
    about 3 GB at C = 16,384). Tiles below the diagonal whose query and key blocks hold one and
    the same segment are marked full (no ``mask_mod`` call); every other non-empty tile is
    partial and runs :func:`document_mask_mod`, which decides each pair.

    Args:
        segment_ids_BC: integer tensor [B, C]: 1..k on contiguous document runs, 0 on the padding
            tail.
        block_size: tile size in tokens (FlexAttention's default 128).

    Returns:
        ``torch.nn.attention.flex_attention.BlockMask`` for B rows, all heads, C x C.

    Raises:
        MissingDependencyError: torch is missing.
        ImportError: this torch has no FlexAttention.
    """
    torch = require_torch()
    from torch.nn.attention.flex_attention import BlockMask

    B, C = segment_ids_BC.shape
    dev = segment_ids_BC.device
    nb = -(-C // block_size)
    # padding (0) sorts after every document, so ids are non-decreasing along the row
    big = torch.iinfo(torch.int64).max
    ordered_BC = torch.where(segment_ids_BC == 0, big, segment_ids_BC.to(torch.int64))
    pad = nb * block_size - C
    lo_Bn = torch.nn.functional.pad(ordered_BC, (0, pad), value=big).view(B, nb, block_size)
    hi_Bn = torch.nn.functional.pad(ordered_BC, (0, pad), value=-1).view(B, nb, block_size)
    lo_Bn, hi_Bn = lo_Bn.amin(-1), hi_Bn.amax(-1)  # min / max id in each block, [B, nb]
    qi = torch.arange(nb, device=dev)
    causal_nn = qi[None, :] <= qi[:, None]  # [q block, kv block]
    overlap_Bnn = (lo_Bn[:, :, None] <= hi_Bn[:, None, :]) & (lo_Bn[:, None, :] <= hi_Bn[:, :, None])
    any_Bnn = overlap_Bnn & causal_nn
    one_seg_Bn = lo_Bn == hi_Bn
    whole = torch.ones(nb, dtype=torch.bool, device=dev)
    if pad:
        whole[-1] = False  # the last block is cut short: never full
    full_Bnn = (any_Bnn & (qi[None, :] < qi[:, None]) & one_seg_Bn[:, :, None]
                & one_seg_Bn[:, None, :] & (lo_Bn[:, :, None] == lo_Bn[:, None, :])
                & whole[:, None] & whole[None, :])
    partial_Bnn = any_Bnn & ~full_Bnn

    def to_blocks(m_Bnn):  # counts [B, 1, nb] and indices [B, 1, nb, nb], listed first
        num = m_Bnn.sum(-1).to(torch.int32)
        idx = torch.argsort((~m_Bnn).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num[:, None], idx[:, None]

    kv_num, kv_idx = to_blocks(partial_Bnn)
    full_num, full_idx = to_blocks(full_Bnn)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size,
                                    mask_mod=document_mask_mod(segment_ids_BC),
                                    seq_lengths=(C, C))
