"""Row layout: from a plan and the documents' tokens to the packed columns.

For a row of capacity C holding segments of lengths l1..lk and p = C - sum(l) padding tokens:

- ``input_ids``: the segments' tokens, then ``pad_id`` * p;
- ``segment_ids``: 1..k per segment, 0 on the padding tail;
- ``position_ids``: 0..l-1 in each segment; the padding tail counts as one pseudo-segment
  (0..p-1), so every row starts at position 0 and positions never exceed C - 1;
- ``cu_seqlens``: [0, l1, l1+l2, ..., C]: the padding tail is one more segment when p > 0, so the
  last entry is always C, entries strictly increase (no zero-length segment) and no query row of
  a varlen kernel is left fully masked; ``max_seqlen`` = max difference;
- ``labels``: unshifted (the model shifts; Hugging Face convention): the token, except -100 at
  each segment's first token and on padding; shifted: labels[i] = input_ids[i+1] inside the same
  segment, else -100;
- ``num_targets`` = count(labels != -100) = sum over segments of (l - 1): the effective targets.

With ``segment_multiple`` N > 1 (context parallelism) each segment spans ``ceil(l / N) * N`` slots:
its tokens, then padding inside the row (``pad_id``, segment id 0, label -100, positions
continuing l..span-1, so the padding is part of its document's span and, under causal
attention, a key of nothing but later padding of that span). ``cu_seqlens`` holds the spans
(where each sequence starts in the row: TransformerEngine's ``cu_seqlens_q_padded``) and
``cu_seqlens_unpadded`` the real lengths summed (its ``cu_seqlens_q``), the padding tail counted
whole in both; ``max_seqlen`` is the longest span. ``num_targets`` is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.core import _kernels as K
from packtool.core.packing import PackPlan, segment_spans
from packtool.errors import ConfigError
from packtool.types import LabelMode

__all__ = ["PackedRows", "layout_rows", "append_eos", "gather_segments"]

_LABEL_CODE = {LabelMode.UNSHIFTED: K.LABELS_UNSHIFTED, LabelMode.SHIFTED: K.LABELS_SHIFTED,
               LabelMode.NONE: K.LABELS_NONE}


@dataclass(frozen=True, eq=False)
class PackedRows:
    """Columns of ``n`` packed rows (all int32 unless noted)."""

    input_ids: np.ndarray  #: int32[n, C]
    segment_ids: np.ndarray  #: int32[n, C], 1..k, 0 = padding
    position_ids: np.ndarray  #: int32[n, C]
    labels: np.ndarray | None  #: int32[n, C], -100 = ignored; None for ``labels="none"``
    cu_values: np.ndarray  #: int32[total], all rows' cu_seqlens back to back
    cu_offsets: np.ndarray  #: int64[n + 1], row k's cu_seqlens = cu_values[cu_offsets[k]:cu_offsets[k+1]]
    num_targets: np.ndarray  #: int32[n], effective targets per row
    max_seqlen: np.ndarray  #: int32[n]
    doc_ids: np.ndarray  #: int64[segments], global document index of each segment
    doc_offsets: np.ndarray  #: int64[segments], token offset of each segment in its document
    seg_offsets: np.ndarray  #: int64[n + 1], row k's segments = doc_ids[seg_offsets[k]:seg_offsets[k+1]]
    #: int32[total] with ``segment_multiple`` > 1: real lengths summed per row, offsets
    #: ``cu_offsets`` (the padding tail counted whole); None when segments are not padded
    cu_unpadded_values: np.ndarray | None = None
    #: int32[segments], the source id of each segment (``pack --source-column``), else None
    source_ids: np.ndarray | None = None

    def cu_seqlens(self, k: int) -> np.ndarray:
        """int32[segments_k + 1 (+1 with padding)]: cumulative lengths of row ``k``."""
        return self.cu_values[self.cu_offsets[k]:self.cu_offsets[k + 1]]

    def cu_seqlens_unpadded(self, k: int) -> np.ndarray:
        """int32[segments_k + 1 (+1 with padding)]: row ``k``'s real lengths summed (equal to
        :meth:`cu_seqlens` when segments are not padded)."""
        if self.cu_unpadded_values is None:
            return self.cu_seqlens(k)
        return self.cu_unpadded_values[self.cu_offsets[k]:self.cu_offsets[k + 1]]


def layout_rows(
    plan: PackPlan,
    rows: np.ndarray,
    tokens: np.ndarray,
    doc_starts: np.ndarray,
    *,
    pad_id: int = 0,
    labels: LabelMode | str = LabelMode.UNSHIFTED,
    targets: np.ndarray | None = None,
    segment_multiple: int | None = None,
) -> PackedRows:
    """Materialise rows ``rows`` of ``plan`` into packed columns.

    Args:
        plan: the packing plan (capacity C).
        rows: int[n], plan row ids in output order.
        tokens: int32[T], every document's tokens back to back (any array-like, e.g. a memmap).
        doc_starts: int64[num_docs], index in ``tokens`` of each document's first token.
        pad_id: token id written on padding (int32 range).
        labels: ``unshifted`` (default), ``shifted`` or ``none``.
        targets: optional uint8[T] input target flags, like ``tokens`` (0: the input label was
            -100, e.g. an SFT prompt): such a token is never a target, in addition to the
            boundary rule, and ``num_targets`` counts what is left
            (:func:`packtool.core.masks.mask_labels`).
        segment_multiple: N: each segment spans ``ceil(len / N) * N`` slots, padding inside the
            row after it (module docstring); None: ``plan.segment_multiple``.

    Returns:
        :class:`PackedRows` (shapes documented on its fields).

    Raises:
        ConfigError: ``pad_id`` outside int32, unknown label mode, a row id out of range, or a
            ``segment_multiple`` < 1 or whose spans do not fit a row.
    """
    try:
        mode = LabelMode(labels)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not -(2**31) <= int(pad_id) < 2**31:
        raise ConfigError(f"--pad-id must fit int32, got {pad_id}")
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= plan.num_rows):
        raise ConfigError(f"row ids must lie in 0..{plan.num_rows - 1}")
    # only the segments of the requested rows are gathered (bounded memory per shard)
    seg_counts = plan.row_offsets[rows + 1] - plan.row_offsets[rows]
    seg_offsets = np.zeros(rows.size + 1, dtype=np.int64)  # shape: (n + 1,)
    np.cumsum(seg_counts, out=seg_offsets[1:])
    if rows.size:
        seg_index = np.repeat(plan.row_offsets[rows] - seg_offsets[:-1], seg_counts) + np.arange(
            seg_offsets[-1])
    else:
        seg_index = np.zeros(0, dtype=np.int64)
    doc_ids = plan.seg_doc[seg_index]
    doc_offsets = plan.seg_offset[seg_index]
    seg_len = np.ascontiguousarray(plan.seg_len[seg_index])
    seg_src = np.asarray(doc_starts, dtype=np.int64)[doc_ids] + doc_offsets
    local_rows = np.arange(rows.size, dtype=np.int64)
    tok = tokens if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 else np.asarray(
        tokens, dtype=np.int32)
    out = K._fill_rows(local_rows, seg_offsets, seg_len, seg_src, tok, plan.capacity,
                       np.int32(pad_id), _LABEL_CODE[mode])
    ids, seg, pos, lab, cu_values, cu_offsets, num_targets, max_seqlen = out
    if targets is not None:
        from packtool.core.masks import mask_labels

        mask_labels(lab, num_targets, seg_offsets, seg_len, seg_src, targets,
                    shifted=mode is LabelMode.SHIFTED)
    multiple = plan.segment_multiple if segment_multiple is None else int(segment_multiple)
    cu_unpadded = None
    if multiple != 1:
        if multiple < 1:
            raise ConfigError(f"segment_multiple must be >= 1, got {multiple}")
        cs = np.concatenate([[0], np.cumsum(segment_spans(seg_len, multiple))])
        per_row = cs[seg_offsets[1:]] - cs[seg_offsets[:-1]]  # shape: (n,), slots taken
        if per_row.size and per_row.max() > plan.capacity:
            raise ConfigError(f"segments padded to a multiple of {multiple} do not fit a row "
                              f"of {plan.capacity}; plan with segment_multiple={multiple}")
        cu_values, cu_unpadded, cu_offsets, max_seqlen = K._spread_segments(
            ids, seg, pos, lab, seg_offsets, seg_len, np.int64(multiple), np.int32(pad_id))
    return PackedRows(ids, seg, pos, None if mode is LabelMode.NONE else lab, cu_values,
                      cu_offsets, num_targets, max_seqlen, doc_ids, doc_offsets, seg_offsets,
                      cu_unpadded_values=cu_unpadded)


def gather_segments(values: np.ndarray, src: np.ndarray, lens: np.ndarray,
                    out: np.ndarray | None = None, dest: np.ndarray | None = None) -> np.ndarray:
    """Copy segments of a flat array: ``values[src[q] : src[q] + lens[q]]`` for each ``q``.

    Args:
        values: 1-D array (any dtype, e.g. int32 tokens or uint8 target flags).
        src: int[S], first item of each segment in ``values``.
        lens: int[S], items of each segment (>= 0).
        out: where to copy (1-D, ``values``' dtype); None: a new array of ``sum(lens)`` items.
        dest: int[S], first item of each segment in ``out``; None: back to back from 0.

    Returns:
        ``out`` (the segments back to back unless ``dest`` says otherwise).

    Raises:
        ValueError: a segment outside ``values`` or ``out``, or mismatched dtypes/shapes.
    """
    src = np.ascontiguousarray(src, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    if src.shape != lens.shape or src.ndim != 1:
        raise ValueError(f"src and lens must be 1-D of one shape, got {src.shape}, {lens.shape}")
    if dest is None:
        dest = np.zeros(lens.size, dtype=np.int64)
        if lens.size:
            np.cumsum(lens[:-1], out=dest[1:])
    dest = np.ascontiguousarray(dest, dtype=np.int64)
    if out is None:
        out = np.empty(int(lens.sum()), dtype=values.dtype)
    if out.dtype != values.dtype or dest.shape != src.shape:
        raise ValueError("out must have the dtype of values, dest the shape of src")
    if src.size and (lens.min() < 0 or src.min() < 0 or (src + lens).max() > values.size
                     or dest.min() < 0 or (dest + lens).max() > out.size):
        raise ValueError("a segment lies outside values or out")
    K._copy_segments(values, src, lens, out, dest)
    return out


def append_eos(lengths: np.ndarray, tokens: np.ndarray, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Append ``eos_id`` to every non-empty document that does not already end with it.

    Args:
        lengths: int64[docs], tokens per document.
        tokens: int32[sum(lengths)], documents back to back.
        eos_id: end-of-document token id (int32 range).

    Returns:
        (lengths int64[docs], tokens int32[sum(new lengths)]); empty documents stay empty. The
        counts and target flags: :func:`packtool.core.masks.add_boundary_tokens`.
    """
    from packtool.core.masks import add_boundary_tokens

    new_lengths, out, _, _ = add_boundary_tokens(lengths, tokens, eos=eos_id)
    return new_lengths, out
