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

Two steps: the segments' tokens are put at the start of their spans (:func:`row_destinations`:
copied from memory by :func:`layout_rows`, or read straight from a spill file by the pack's
writing tasks), then one kernel, :func:`complete_rows`, writes everything else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from packtool.core import _kernels as K
from packtool.core.packing import PackPlan, integer_array, segment_spans
from packtool.errors import ConfigError
from packtool.types import LabelMode

__all__ = ["PackedRows", "layout_rows", "complete_rows", "row_destinations", "append_eos",
           "gather_segments"]

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

    The segments' tokens are copied to the start of their spans (:func:`gather_segments`,
    :func:`row_destinations`), then :func:`complete_rows` writes everything else.

    Args:
        plan: the packing plan (capacity C).
        rows: int[n], plan row ids in output order.
        tokens: int32[T], every document's tokens back to back (any array-like, e.g. a memmap).
        doc_starts: int64[num_docs], index in ``tokens`` of each document's first token.
        pad_id: token id written on padding (int32 range).
        labels: ``unshifted`` (default), ``shifted`` or ``none``.
        targets: optional uint8[T] input target flags, like ``tokens`` (0: the input label was
            -100, e.g. an SFT prompt): such a token is never a target, in addition to the
            boundary rule, and ``num_targets`` counts what is left.
        segment_multiple: N: each segment spans ``ceil(len / N) * N`` slots, padding inside the
            row after it (module docstring); None: ``plan.segment_multiple``.

    Returns:
        :class:`PackedRows` (shapes documented on its fields).

    Raises:
        ConfigError: ``pad_id`` outside int32, unknown label mode, a row id out of range, a
            ``segment_multiple`` < 1 or whose spans do not fit a row; ``tokens`` that are not
            integer ids in 0..2**31 - 1 (an int32 array is taken as is), ``doc_starts`` that are
            not one integer per planned document or that send a segment outside ``tokens``, or
            ``targets`` not one flag per token.
    """
    mode = _label_mode(labels)
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
    seg_len = np.ascontiguousarray(plan.seg_len[seg_index], dtype=np.int64)
    starts = integer_array(doc_starts, "doc_starts")
    if starts.ndim != 1 or (doc_ids.size and int(doc_ids.max()) >= starts.size):
        raise ConfigError(f"doc_starts must hold one start per planned document (at least "
                          f"{int(doc_ids.max()) + 1 if doc_ids.size else 0}), got shape "
                          f"{starts.shape}")
    seg_src = starts[doc_ids] + doc_offsets
    tok = _token_array(tokens)
    if seg_src.size and (seg_src.min() < 0 or (seg_src + seg_len).max() > tok.size):
        q = int(np.argmax((seg_src < 0) | (seg_src + seg_len > tok.size)))
        raise ConfigError(f"document {int(doc_ids[q])}: tokens {int(seg_src[q])}.."
                          f"{int(seg_src[q] + seg_len[q])} lie outside tokens ({tok.size}); "
                          "doc_starts must index tokens and the plan's lengths fit them")
    n, cap = rows.size, plan.capacity
    multiple = plan.segment_multiple if segment_multiple is None else int(segment_multiple)
    dest = row_destinations(seg_offsets, seg_len, cap, multiple)
    ids = np.empty((n, cap), dtype=np.int32)
    K._copy_segments(tok, seg_src, seg_len, ids.reshape(-1), dest)
    flags = None
    if targets is not None:
        t = targets if isinstance(targets, np.ndarray) and targets.dtype == np.uint8 \
            else np.asarray(targets, dtype=np.uint8)
        if t.shape != (tok.size,):
            raise ConfigError(f"targets must be one flag per token ({tok.size}), got shape "
                              f"{t.shape}")
        flags = np.empty((n, cap), dtype=np.uint8)
        K._copy_segments(t, seg_src, seg_len, flags.reshape(-1), dest)
    return complete_rows(seg_offsets, seg_len, ids, pad_id=pad_id, labels=mode, flags=flags,
                         doc_ids=doc_ids, doc_offsets=doc_offsets, segment_multiple=multiple)


def _token_array(tokens) -> np.ndarray:
    """``tokens`` as a 1-D int32 array (an int32 array as is, e.g. a memmap, unread);
    ConfigError for non-integers or ids outside int32 (never cut)."""
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1:
        return tokens
    arr = np.asarray(tokens)
    if arr.ndim != 1 or (arr.dtype.kind not in "iu" and arr.size):
        raise ConfigError(f"tokens must be a 1-D array of integer ids, got {arr.dtype} of shape "
                          f"{arr.shape}; nothing is cut or cast to an integer")
    if arr.size and arr.dtype != np.int32:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > np.iinfo(np.int32).max:
            bad = int(np.argmax((arr < 0) | (arr > np.iinfo(np.int32).max)))
            raise ConfigError(f"tokens[{bad}] = {int(arr[bad])} is not a token id (0..2**31 - 1)")
    return np.ascontiguousarray(arr, dtype=np.int32)


def row_destinations(seg_offsets: np.ndarray, seg_len: np.ndarray, capacity: int,
                     segment_multiple: int = 1) -> np.ndarray:
    """Where each segment's first token goes in the flat ``n * C`` buffer of ``n`` rows.

    Args:
        seg_offsets: int64[n + 1], row k's segments are ``seg_offsets[k]:seg_offsets[k+1]``.
        seg_len: int64[S], segment lengths in tokens (a row's spans sum to at most
            ``capacity``).
        capacity: tokens per row (C).
        segment_multiple: N: each segment takes ``ceil(len / N) * N`` slots (module docstring).

    Returns:
        int64[S]: ``k * C`` plus the slots of row k's earlier segments (spans back to back
        from the start of their row; with N = 1 the segments themselves).

    Raises:
        ConfigError: ``segment_multiple`` < 1, or spans that do not fit a row.
    """
    seg_offsets = np.asarray(seg_offsets, dtype=np.int64)
    seg_len = np.asarray(seg_len, dtype=np.int64)
    if segment_multiple < 1:
        raise ConfigError(f"segment_multiple must be >= 1, got {segment_multiple}")
    spans = seg_len if segment_multiple == 1 else segment_spans(seg_len, segment_multiple)
    nseg = np.diff(seg_offsets)
    within = np.zeros(spans.size, dtype=np.int64)  # shape: (S,)
    if spans.size:
        np.cumsum(spans[:-1], out=within[1:])
        firsts = seg_offsets[:-1][nseg > 0]
        within -= np.repeat(within[firsts], nseg[nseg > 0])
        last = seg_offsets[1:][nseg > 0] - 1  # each non-empty row's last segment
        if (within[last] + spans[last]).max() > capacity:
            raise ConfigError(f"segments padded to a multiple of {segment_multiple} do not fit a "
                              f"row of {capacity}; plan with segment_multiple={segment_multiple}")
    row = np.repeat(np.arange(nseg.size, dtype=np.int64), nseg)
    return row * capacity + within


def _label_mode(labels) -> LabelMode:
    try:
        return LabelMode(labels)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def complete_rows(seg_offsets: np.ndarray, seg_len: np.ndarray, input_ids: np.ndarray, *,
                  pad_id: int = 0, labels: LabelMode | str = LabelMode.UNSHIFTED,
                  flags: np.ndarray | None = None, doc_ids: np.ndarray | None = None,
                  doc_offsets: np.ndarray | None = None, source_ids: np.ndarray | None = None,
                  segment_multiple: int = 1, out: dict | None = None) -> PackedRows:
    """Finish ``n`` rows whose segments' tokens are already in place.

    Row ``k`` of ``input_ids`` holds its segments ``seg_offsets[k]:seg_offsets[k+1]`` at the
    start of their spans, back to back from position 0 (what :func:`row_destinations` says,
    e.g. read straight from a spill); the rest of every span and the row's tail are
    overwritten with ``pad_id``. Everything else of the output contract (module docstring) is
    written from the segment lengths: ``segment_ids``, ``position_ids``, ``labels``,
    ``cu_seqlens`` (and ``cu_seqlens_unpadded`` with ``segment_multiple`` > 1),
    ``max_seqlen``, ``num_targets``.

    Args:
        seg_offsets: int64[n + 1]; seg_len: int64[S], each >= 1, a row's sum <= C.
        input_ids: int32[n, C], C-contiguous; its padding tail is written in place.
        pad_id: token id written on padding (int32 range).
        labels: ``unshifted``, ``shifted`` or ``none`` (no labels column; ``num_targets`` is
            still counted).
        flags: optional uint8[n, C] aligned with ``input_ids``: 0 marks a token that is never a
            target (its input label was -100), in addition to the boundary rule.
        doc_ids, doc_offsets: int64[S], carried into the result (None: zeros).
        source_ids: int32[S], carried into the result (``pack --source-column``), or None.
        segment_multiple: N >= 1: each segment spans ``ceil(len / N) * N`` slots (the spans of
            a row sum to at most C).
        out: optional reusable buffers ``{"segment_ids", "position_ids", "labels"}`` (int32
            [at least n, C]) and ``"cu_values"``, ``"cu_unpadded"`` (int32[at least 2n + S]),
            so a writer that lays out one row group after another allocates nothing per group.

    Returns:
        :class:`PackedRows` whose arrays are ``input_ids`` and views of ``out`` when given.

    Raises:
        ConfigError: ``pad_id`` outside int32, an unknown label mode, or a ``segment_multiple``
            < 1.
        ValueError: shapes that do not match.
    """
    mode = _label_mode(labels)
    multiple = int(segment_multiple)
    if multiple < 1:
        raise ConfigError(f"segment_multiple must be >= 1, got {multiple}")
    if not -(2**31) <= int(pad_id) < 2**31:
        raise ConfigError(f"--pad-id must fit int32, got {pad_id}")
    seg_offsets = np.ascontiguousarray(seg_offsets, dtype=np.int64)
    seg_len = np.ascontiguousarray(seg_len, dtype=np.int64)
    n = seg_offsets.size - 1
    if input_ids.dtype != np.int32 or input_ids.ndim != 2 or input_ids.shape[0] != n \
            or not input_ids.flags.c_contiguous:
        raise ValueError(f"input_ids must be C-contiguous int32[{n}, C], got {input_ids.dtype}"
                         f"{list(input_ids.shape)}")
    cap = input_ids.shape[1]
    if flags is not None and (flags.shape != input_ids.shape or flags.dtype != np.uint8):
        raise ValueError("flags must be uint8 shaped like input_ids")
    out = out or {}

    def buf(name, shape, dtype):
        b = out.get(name)
        size = math.prod(shape)  # not np.prod: a tenth of the call for small row groups
        if b is None or b.size < size:
            return np.empty(shape, dtype=dtype)
        return b.reshape(-1)[:size].reshape(shape)

    if seg_len.size:  # the spans of a row must fit it (the kernel trusts them)
        spans = seg_len if multiple == 1 else segment_spans(seg_len, multiple)
        cs = np.zeros(spans.size + 1, dtype=np.int64)  # shape: (S + 1,)
        np.cumsum(spans, out=cs[1:])
        if (cs[seg_offsets[1:]] - cs[seg_offsets[:-1]]).max() > cap:
            raise ValueError(f"a row's segments take more than its {cap} slots")
    seg = buf("segment_ids", (n, cap), np.int32)
    pos = buf("position_ids", (n, cap), np.int32)
    lab = buf("labels", (n, cap), np.int32) if mode is not LabelMode.NONE else _NO_LABELS
    cu_values = buf("cu_values", (2 * n + seg_len.size,), np.int32)
    cu_unpadded = (buf("cu_unpadded", (2 * n + seg_len.size,), np.int32) if multiple > 1
                   else _NO_CU)
    cu_offsets = np.empty(n + 1, dtype=np.int64)  # shape: (n + 1,)
    num_targets = np.empty(n, dtype=np.int32)
    max_seqlen = np.empty(n, dtype=np.int32)
    K._complete_rows(seg_offsets, seg_len, input_ids, _NO_FLAGS if flags is None else flags,
                     0 if flags is None else 1, cap, np.int32(pad_id), _LABEL_CODE[mode],
                     np.int64(multiple), seg, pos, lab, cu_values, cu_unpadded, cu_offsets,
                     num_targets, max_seqlen)
    zeros = np.zeros(seg_len.size, dtype=np.int64)
    total = cu_offsets[n]
    return PackedRows(input_ids, seg, pos, None if mode is LabelMode.NONE else lab,
                      cu_values[:total], cu_offsets, num_targets, max_seqlen,
                      zeros if doc_ids is None else doc_ids,
                      zeros if doc_offsets is None else doc_offsets, seg_offsets,
                      cu_unpadded_values=cu_unpadded[:total] if multiple > 1 else None,
                      source_ids=source_ids)


_NO_LABELS = np.zeros((0, 0), dtype=np.int32)  # labels="none": nothing is written
_NO_FLAGS = np.zeros((0, 0), dtype=np.uint8)  # no input target flags
_NO_CU = np.zeros(0, dtype=np.int32)  # segments not padded: no cu_seqlens_unpadded


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
