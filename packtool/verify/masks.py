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


def document_block_mask(segment_ids_BC):
    """FlexAttention ``BlockMask`` of :func:`document_mask_mod` for a [B, C] batch.

    Args:
        segment_ids_BC: integer tensor [B, C].

    Returns:
        ``torch.nn.attention.flex_attention.BlockMask`` for B rows, all heads, C x C.

    Raises:
        MissingDependencyError: torch is missing.
        ImportError: this torch has no FlexAttention.
    """
    require_torch()
    from torch.nn.attention.flex_attention import create_block_mask

    B, C = segment_ids_BC.shape
    return create_block_mask(document_mask_mod(segment_ids_BC), B, None, C, C,
                             device=str(segment_ids_BC.device))
