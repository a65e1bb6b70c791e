"""A batch's structure from its rows' ``cu_seqlens``: segments, positions, labels, span indices.

Shape legend: B = rows, C = capacity, E = ``cu_seqlens`` entries of the B rows back to back,
S = spans (E - B: every document of every row, plus each row's padding tail when it has one).

The training loader reads ``input_ids``, ``cu_seqlens`` and ``doc_ids`` only, and builds the
rest of a batch from them. :func:`row_structure` does it in one pass over each row (a numba
kernel), writing the arrays the batch hands out in their final dtypes, with the definitions of
the output contract (docs/output.md; :mod:`packtool.core.layout` writes the same columns at
pack time):

- ``segment_ids``: 1..k on a row's k documents, 0 on its padding tail;
- ``position_ids``: 0..len-1 inside each span, the padding tail counted as one pseudo-segment;
- ``labels``: unshifted (the token, -100 at each segment's first token) or shifted (the next
  token of the same segment, -100 at each segment's last token), -100 on the padding tail;
- ``seq_idx``: the span index inside the row (documents 0..k-1, the padding tail k);
- ``cu_seqlens``: the spans of the rows laid end to end (row r's offset by r * C), then B * C.

Rows packed with ``--segment-multiple`` (spans that end in padding) are not handled here: their
real lengths come from ``cu_seqlens_unpadded`` (:func:`packtool.formats.packed.structure_from_cu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.core import _kernels as K

__all__ = ["RowStructure", "row_structure"]

_INT_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


@dataclass(frozen=True, eq=False)
class RowStructure:
    """What :func:`row_structure` derives for B rows.

    Attributes:
        segment_ids: int32[B, C].
        position_ids: [B, C] of the dtype asked for.
        labels: [B, C] of the dtype asked for, in the convention asked for.
        seq_idx: int32[B, C], each token's span index inside its row.
        cu_seqlens: int32[S + 1], the spans of the rows laid end to end.
        max_seqlen: the longest span (padding tails included), a Python int.
        num_targets: labels != -100, a Python int.
        bad_row: -1, or the first row whose ``cu_seqlens`` breaks the output contract (the
            other fields are then not filled).
    """

    segment_ids: np.ndarray
    position_ids: np.ndarray
    labels: np.ndarray
    seq_idx: np.ndarray
    cu_seqlens: np.ndarray
    max_seqlen: int
    num_targets: int
    bad_row: int


def row_structure(input_ids: np.ndarray, cu_values: np.ndarray, cu_offsets: np.ndarray,
                  num_segments: np.ndarray, *, convention: str = "unshifted",
                  position_dtype=np.int64, labels_dtype=np.int64, alloc=None) -> RowStructure:
    """Segments, positions, labels, span indices and batch boundaries of B rows, in one pass.

    Args:
        input_ids: int32[B, C] token ids.
        cu_values: int[E], every row's ``cu_seqlens`` back to back (0, ..., C per row).
        cu_offsets: int[B + 1], row r's entries are ``cu_values[cu_offsets[r]:cu_offsets[r + 1]]``.
        num_segments: int[B], k, the documents of each row (the length of its ``doc_ids``).
        convention: ``unshifted`` or ``shifted`` labels.
        position_dtype, labels_dtype: int32 or int64, the dtypes of the arrays returned.
        alloc: ``alloc(shape, dtype)`` -> an uninitialised C-contiguous array for each [B, C]
            array returned (every element is written); None: ``np.empty``.

    Returns:
        :class:`RowStructure`; ``bad_row`` >= 0 names the first row whose ``cu_seqlens`` does
        not start at 0, end at C and strictly increase, or does not hold k + 1 or k + 2 entries.

    Raises:
        ValueError: an unknown convention or dtype, ``input_ids`` not 2-D, B * C over
            2**31 - 1 (int32 ``cu_seqlens``), or offsets that do not fit ``cu_values``.
    """
    if convention not in ("unshifted", "shifted"):
        raise ValueError(f"unknown labels convention {convention!r}; expected unshifted or shifted")
    pos_dt, lab_dt = np.dtype(position_dtype), np.dtype(labels_dtype)
    if pos_dt not in _INT_DTYPES or lab_dt not in _INT_DTYPES:
        raise ValueError(f"position and labels dtypes must be int32 or int64, got {pos_dt}, "
                         f"{lab_dt}")
    ids = np.ascontiguousarray(input_ids, dtype=np.int32)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, C], got shape {ids.shape}")
    B, C = ids.shape
    if B * C > 2**31 - 1:
        raise ValueError(f"{B} rows x {C} tokens do not fit int32 cu_seqlens")
    cu = np.ascontiguousarray(cu_values, dtype=np.int32)
    offs = np.ascontiguousarray(cu_offsets, dtype=np.int64)
    k = np.ascontiguousarray(num_segments, dtype=np.int64)
    if offs.shape != (B + 1,) or k.shape != (B,) or offs[0] != 0 or offs[-1] != cu.size \
            or (np.diff(offs) < 0).any():
        raise ValueError(f"cu_offsets {offs.tolist()[:8]} / num_segments of {k.size} rows do "
                         f"not fit {B} rows of {cu.size} cu_seqlens values")
    alloc = np.empty if alloc is None else alloc
    seg = alloc((B, C), np.int32)  # shape: (B, C)
    pos = alloc((B, C), pos_dt)
    lab = alloc((B, C), lab_dt)
    seq = alloc((B, C), np.int32)
    out_cu = np.empty(cu.size + 1, dtype=np.int32)  # room for any prefix of valid rows
    bad, longest, targets = K._row_structure(ids.reshape(-1), cu, offs, k, convention == "shifted",
                                             seg.reshape(-1), pos.reshape(-1), lab.reshape(-1),
                                             seq.reshape(-1), out_cu)
    out_cu = out_cu[:cu.size - B + 1] if bad < 0 else out_cu[:0]  # shape: (S + 1,)
    return RowStructure(seg, pos, lab, seq, out_cu, int(longest), int(targets), int(bad))
