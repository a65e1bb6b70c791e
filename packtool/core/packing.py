"""Packing plans: which piece of which document goes into which row.

Three strategies, all planned from document lengths alone (no tokens needed):

``obfd``
    Best-Fit-Decreasing (Ding et al. 2024, "Fewer Truncations Improve Language Modeling",
    arXiv 2404.10830, Sec. 3.2 and Appendix B). Documents longer than the capacity C are first
    cut into chunks of C (``--overflow split``); chunks are sorted by length descending with a
    counting sort (O(S + C), stable: ties by document index, then chunk index), and each chunk goes
    into the open bin with the smallest remaining capacity that still fits it, or a new bin.
    The "smallest fitting remaining capacity" query runs on a segment tree over remaining
    capacities 0..C with fan-out 64 (one 64-bit word per node, find-next-set-bit), so a placement
    costs O(log_64 C) word operations and the whole plan O(S + C). Ties between bins with equal
    remaining capacity go to the bin that reached that remaining capacity most recently.
    Chunks of equal length are placed in bulk: the best-fit bin for a chunk of length l with r
    tokens free takes min(r // l, chunks left) of them at once, which is exactly what placing
    them one by one under the tie rule does, so the tree is searched only when the stack of bins
    with r tokens free runs empty. Measured on 2 cores of an AMD EPYC VM, 10 M web-like
    documents at C = 2048 plan in about 0.16 s (best of 3; 0.3 to 0.65 s in a fresh process,
    which also pays the page faults of the plan's memory): see ``docs/benchmarks.md``.
    The paper reports fewer than 0.003 % extra sequences over ceil(tokens / C) at C = 2048; on
    ``sample_data/`` the plan needs 0 to 1 rows over that bound (see README).
``ordered``
    Order-preserving next-fit (documents in input order; a new row when the next one does not
    fit). Never reorders, pays in padding.
``concat``
    The classic baseline: one continuous stream of documents cut every C tokens. Documents
    straddle rows, but each piece is still its own segment, so ``concat`` + document masking is
    the paper's Concat+Mask row.

Empty documents are skipped and counted. A plan is a CSR table (rows -> segments); tokens are
laid out later by :func:`packtool.core.layout.layout_rows`.

**Segments padded to a multiple N** (``segment_multiple``, ``pack --segment-multiple N``, for
context parallelism: TransformerEngine's THD format splits every sequence into 2 x cp pieces, so
each must be a multiple of N = 2 x cp). Every document length L is rounded up to
``ceil(L / N) * N`` and those lengths are planned by the strategy above, unchanged; the plan
then stores each segment's real length ``min(planned, L - offset)``, and its span in the row is
``ceil(real / N) * N`` (:func:`segment_spans`). C must be a multiple of N: then a document is
over C after rounding exactly when it is over C before, split chunks of C and truncation at C are
whole multiples of N, and the padding tail (C minus the spans) is a multiple of N too. The cost
is the padding inside the rows plus the rows it adds; ``pack`` records both (``stats``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from packtool.core import _kernels as K
from packtool.errors import ConfigError, PackingError
from packtool.types import Overflow, Strategy

__all__ = ["PackPlan", "drop_underfilled", "integer_array", "min_fill_tokens", "pack_lengths",
           "segment_spans", "MAX_CAPACITY"]

#: Largest accepted capacity (tokens per row). Rows are stored as int32 lists; 2**24 tokens per
#: row is already 64 MiB per column per row.
MAX_CAPACITY = 2**24

_OVERFLOW_CODE = {Overflow.SPLIT: K.OVERFLOW_SPLIT, Overflow.TRUNCATE: K.OVERFLOW_TRUNCATE,
                  Overflow.DROP: K.OVERFLOW_DROP}


@dataclass(frozen=True, eq=False)
class PackPlan:
    """Rows of a packing plan as a CSR table.

    Row ``r`` holds segments ``row_offsets[r]:row_offsets[r + 1]`` in layout order; segment ``q``
    is ``seg_len[q]`` tokens of document ``seg_doc[q]`` starting at token ``seg_offset[q]``.
    """

    capacity: int  #: tokens per row (C)
    row_offsets: np.ndarray  #: int64[num_rows + 1]
    seg_doc: np.ndarray  #: int64[num_segments], global document index
    seg_offset: np.ndarray  #: int64[num_segments], token offset inside the document
    seg_len: np.ndarray  #: int64[num_segments], real tokens, 1..C
    counts: dict = field(default_factory=dict)  #: documents/tokens skipped, split, cut, dropped
    #: N: each segment takes ``ceil(seg_len / N) * N`` slots of its row (:func:`segment_spans`)
    segment_multiple: int = 1

    @property
    def num_rows(self) -> int:
        return int(self.row_offsets.shape[0] - 1)

    @property
    def num_segments(self) -> int:
        return int(self.seg_len.shape[0])

    def row_lengths(self) -> np.ndarray:
        """int64[num_rows]: real (non-padding) tokens in each row."""
        csum = np.concatenate([[0], np.cumsum(self.seg_len)])
        return csum[self.row_offsets[1:]] - csum[self.row_offsets[:-1]]

    def segment_padding(self) -> int:
        """Padding tokens inside the rows, after the segments (0 when ``segment_multiple`` is 1)."""
        if self.segment_multiple == 1:
            return 0
        return int((segment_spans(self.seg_len, self.segment_multiple) - self.seg_len).sum())


def segment_spans(seg_len: np.ndarray, multiple: int) -> np.ndarray:
    """Slots each segment takes in its row: its length rounded up to a multiple of ``multiple``.

    Args:
        seg_len: int[S], real tokens per segment (>= 1).
        multiple: N >= 1.

    Returns:
        int64[S], ``ceil(seg_len / N) * N``.
    """
    seg_len = np.asarray(seg_len, dtype=np.int64)
    return -(-seg_len // multiple) * multiple


def integer_array(values, name: str, error: type = ConfigError) -> np.ndarray:
    """``values`` as a C-contiguous int64 array, refusing what would be cut to an integer.

    Args:
        values: an array-like of integers (any NumPy integer dtype, or Python ints).
        name: what the values are, for the message (``lengths``, ``doc_starts``).
        error: the exception class raised.

    Returns:
        int64 array of ``values``' shape, equal values.

    Raises:
        ``error``: values that are not integers (floats, bools, strings, objects: never cut
            or cast), or unsigned values above 2**63 - 1.
    """
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and arr.size == 0):
        raise error(f"{name} must be integers, got dtype {arr.dtype}; nothing is cut or cast "
                    "to an integer")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size \
            and arr.max() > np.iinfo(np.int64).max:
        bad = int(np.argmax(arr.reshape(-1) > np.iinfo(np.int64).max))
        raise error(f"{name}[{bad}] = {int(arr.reshape(-1)[bad])} does not fit int64")
    return np.ascontiguousarray(arr, dtype=np.int64)


def pack_lengths(
    lengths: np.ndarray,
    capacity: int,
    *,
    strategy: Strategy | str = Strategy.OBFD,
    overflow: Overflow | str = Overflow.SPLIT,
    segment_multiple: int = 1,
    min_fill: float = 0.0,
) -> PackPlan:
    """Plan rows of exactly ``capacity`` tokens from document lengths.

    Args:
        lengths: int[num_docs], document lengths in tokens (>= 0; 0 = empty, skipped).
        capacity: tokens per row, 2..MAX_CAPACITY.
        strategy: ``obfd`` (best-fit-decreasing, arXiv 2404.10830), ``ordered`` (next-fit in
            input order) or ``concat`` (stream cut every ``capacity`` tokens).
        overflow: for documents longer than ``capacity``: ``split`` (chunks of C, the last
            shorter; for ``concat`` the stream itself cuts them), ``truncate`` (keep the first C),
            ``drop`` or ``error``.
        segment_multiple: N >= 1: every segment takes a multiple of N slots of its row (the
            lengths are planned rounded up; see the module docstring). ``capacity`` must be a
            multiple of N.
        min_fill: F in [0, 1]: rows holding fewer than ``ceil(F * capacity)`` real tokens are
            left out of the plan (:func:`drop_underfilled`; 0 keeps every row, 1 keeps only rows
            without padding).

    Returns:
        A :class:`PackPlan` whose ``seg_len`` are real tokens. ``counts`` holds ``docs_in``, ``tokens_in``, ``docs_empty``,
        ``docs_split``, ``split_fragments`` (chunks beyond the first of split documents),
        ``docs_truncated``, ``tokens_truncated`` (the tails cut), ``docs_dropped``,
        ``tokens_dropped`` (every token not written: the truncated tails, the dropped documents'
        tokens and, with ``min_fill``, ``tokens_under_min_fill``; ``tokens_in`` = sum of
        ``seg_len`` + ``tokens_dropped``) and ``docs_cut`` (documents spread over more than one
        segment).

    Raises:
        ConfigError: capacity out of range, an unknown strategy/overflow name,
            ``segment_multiple`` < 1 or not a divisor of ``capacity``, or ``min_fill`` outside
            [0, 1].
        PackingError: lengths that are not integers (floats, bools, strings: never cut), a
            negative length, or a document over capacity with ``overflow="error"``
            (the message names the document index and its length).
    """
    try:
        strategy = Strategy(strategy)
        overflow = Overflow(overflow)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(capacity, (int, np.integer)) or not 2 <= capacity <= MAX_CAPACITY:
        raise ConfigError(f"capacity must be an integer in 2..{MAX_CAPACITY}, got {capacity!r}")
    capacity = int(capacity)
    if not isinstance(segment_multiple, (int, np.integer)) or segment_multiple < 1:
        raise ConfigError(f"segment_multiple must be an integer >= 1, got {segment_multiple!r}")
    segment_multiple = int(segment_multiple)
    if capacity % segment_multiple:
        raise ConfigError(f"capacity {capacity} is not a multiple of segment_multiple "
                          f"{segment_multiple}: padded segments and the padding tail must all "
                          "be multiples of it")
    lengths = integer_array(lengths, "lengths", PackingError)  # shape: (num_docs,)
    if lengths.ndim != 1:
        raise PackingError(f"lengths must be 1-D, got shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        bad = int(np.argmax(lengths < 0))
        raise PackingError(f"document {bad} has negative length {int(lengths[bad])}")
    if overflow is Overflow.ERROR and lengths.size and lengths.max() > capacity:
        bad = int(np.argmax(lengths > capacity))
        raise PackingError(
            f"document {bad} has {int(lengths[bad])} tokens, more than --capacity {capacity}; "
            "use --overflow split|truncate|drop or a larger capacity"
        )
    if (isinstance(min_fill, bool) or not isinstance(min_fill, numbers.Real)
            or not 0 <= min_fill <= 1):
        raise ConfigError(f"min_fill must be a fraction of the capacity in [0, 1], "
                          f"got {min_fill!r}")
    if min_fill > 0:
        plan = pack_lengths(lengths, capacity, strategy=strategy, overflow=overflow,
                            segment_multiple=segment_multiple)
        return drop_underfilled(plan, min_fill_tokens(min_fill, capacity))
    if segment_multiple > 1:
        return _plan_padded(lengths, capacity, strategy, overflow, segment_multiple)
    code = _OVERFLOW_CODE.get(overflow, K.OVERFLOW_SPLIT)
    tokens_in = int(lengths.sum())
    if strategy is Strategy.OBFD:
        return _plan_obfd(lengths, capacity, code, tokens_in)
    if strategy is Strategy.CONCAT and overflow in (Overflow.SPLIT, Overflow.ERROR):
        # the stream cuts long documents itself: no chunking by C before it
        chunk_cap = max(capacity, int(lengths.max()) if lengths.size else 0)
        chunks, c = K._split_chunks(lengths, chunk_cap, code)
    else:
        chunks, c = K._split_chunks(lengths, capacity, code)
    counts = _counts(lengths.size, tokens_in, c)
    if strategy is Strategy.CONCAT:
        row_offsets, seg_doc, seg_offset, seg_len = K._concat_segments(chunks, capacity)
        # chunks here are whole (or truncated) documents; each cut document has exactly one
        # piece at offset > 0 right after its first piece
        counts["docs_cut"] = int(np.count_nonzero((seg_offset[1:] > 0) & (seg_offset[:-1] == 0)))
    else:
        row_offsets = K._ordered_rows(chunks, capacity)
        seg_doc, seg_offset, seg_len = chunks[:, 0], chunks[:, 1], chunks[:, 2]  # views
        counts["docs_cut"] = counts["docs_split"]  # only split documents span several segments
    return PackPlan(capacity, row_offsets, seg_doc, seg_offset, seg_len, counts)


def min_fill_tokens(min_fill: float, capacity: int) -> int:
    """``ceil(min_fill * capacity)`` real tokens, with ``min_fill`` taken as the decimal it
    prints as (0.3 of 10 is 3, not the 4 of 0.3's binary value; 0.1000000000001 of 10 is 2)."""
    return math.ceil(Fraction(str(min_fill)) * int(capacity))


def drop_underfilled(plan: PackPlan, min_tokens: int) -> PackPlan:
    """``plan`` without the rows holding fewer than ``min_tokens`` real tokens (``pack
    --min-fill``: e.g. every row full, no padding, when ``min_tokens`` is the capacity).

    The kept rows stay in their order, their segments unchanged. Counts: ``rows_dropped``,
    ``tokens_under_min_fill`` (the real tokens of the dropped rows); ``tokens_dropped`` grows by
    those tokens too, ``docs_dropped`` by the documents none of whose pieces is kept (a split
    document that keeps some pieces counts only its lost tokens), counted apart in
    ``docs_under_min_fill`` with their tokens in ``doc_tokens_under_min_fill``; ``docs_cut``
    becomes the documents spread over more than one kept segment, and ``docs_split`` /
    ``split_fragments`` the split documents with a piece kept and their kept pieces beyond the
    first.

    Args:
        plan: a :class:`PackPlan`.
        min_tokens: real tokens a row needs to be kept (<= 0 keeps every row).

    Returns:
        A new :class:`PackPlan` (``plan`` itself when no row is dropped).
    """
    real = plan.row_lengths()  # shape: (num_rows,)
    keep = real >= min_tokens
    if keep.all():
        return plan
    per_row = np.diff(plan.row_offsets)  # shape: (num_rows,), segments per row
    seg_keep = np.repeat(keep, per_row)  # shape: (S,)
    row_offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(per_row[keep], out=row_offsets[1:])
    kept_docs, kept_pieces = np.unique(plan.seg_doc[seg_keep], return_counts=True)
    all_docs, all_pieces = np.unique(plan.seg_doc, return_counts=True)
    counts = dict(plan.counts)
    if counts.get("docs_split"):  # obfd / ordered: the documents split are those of 2+ pieces
        split = np.isin(kept_docs, all_docs[all_pieces > 1])
        counts["docs_split"] = int(np.count_nonzero(split))
        counts["split_fragments"] = int((kept_pieces[split] - 1).sum())
    counts["rows_dropped"] = counts.get("rows_dropped", 0) + int((~keep).sum())
    lost = int(real[~keep].sum())
    counts["tokens_dropped"] = counts.get("tokens_dropped", 0) + lost
    counts["tokens_under_min_fill"] = counts.get("tokens_under_min_fill", 0) + lost
    counts["docs_dropped"] = counts.get("docs_dropped", 0) + int(all_docs.size - kept_docs.size)
    # the documents left out whole with those rows, and their tokens there (the rest of the
    # rows' tokens are pieces of documents written in part)
    gone = ~np.isin(plan.seg_doc, kept_docs)  # shape: (S,)
    counts["docs_under_min_fill"] = (counts.get("docs_under_min_fill", 0)
                                     + int(all_docs.size - kept_docs.size))
    counts["doc_tokens_under_min_fill"] = (counts.get("doc_tokens_under_min_fill", 0)
                                           + int(plan.seg_len[gone].sum()))
    counts["docs_cut"] = int(np.count_nonzero(kept_pieces > 1))
    return PackPlan(plan.capacity, row_offsets, plan.seg_doc[seg_keep],
                    plan.seg_offset[seg_keep], plan.seg_len[seg_keep], counts,
                    plan.segment_multiple)


def _plan_padded(lengths: np.ndarray, capacity: int, strategy: Strategy, overflow: Overflow,
                 multiple: int) -> PackPlan:
    """The plan of the lengths rounded up to ``multiple``, with real segment lengths and the
    counts of the real lengths (split, truncated and dropped documents are the same ones)."""
    padded = -(-lengths // multiple) * multiple  # shape: (num_docs,)
    plan = pack_lengths(padded, capacity, strategy=strategy, overflow=overflow)
    seg_len = np.minimum(plan.seg_len, lengths[plan.seg_doc] - plan.seg_offset)
    cap = capacity
    if strategy is Strategy.CONCAT and overflow in (Overflow.SPLIT, Overflow.ERROR):
        cap = max(capacity, int(lengths.max()) if lengths.size else 0)  # as the stream plans it
    _, c = K._chunk_histogram(lengths, cap, _OVERFLOW_CODE.get(overflow, K.OVERFLOW_SPLIT))
    counts = _counts(lengths.size, int(lengths.sum()), c)
    counts["docs_cut"] = plan.counts["docs_cut"]
    return PackPlan(capacity, plan.row_offsets, plan.seg_doc, plan.seg_offset, seg_len, counts,
                    multiple)


def _index_dtype(num_chunks: int, num_docs: int, max_length: int = 0):
    """int32 ids (and in-chunk offsets) when they fit: half the scratch memory traffic."""
    return np.int32 if max(num_chunks, num_docs, max_length) < 2**31 - 1 else np.int64


def _plan_obfd(lengths: np.ndarray, capacity: int, code: int, tokens_in: int) -> PackPlan:
    """OBFD plan; the large arrays are allocated here by numpy (huge pages, cheap first touch)."""
    hist, c = K._chunk_histogram(lengths, capacity, code)
    s = int(c[7])
    idx = _index_dtype(s, lengths.size, int(lengths.max()) if lengths.size else 0)
    sdoc = np.empty(s, dtype=idx)  # shape: (S,)
    sfull = np.empty(s, dtype=idx)  # shape: (S,), set only where a split document ends
    runs = np.empty((s, 5), dtype=idx)  # shape: (S, 5), at most one run per chunk
    heads = np.empty(s, dtype=idx)  # shape: (S,), at most one bin per chunk
    data = np.empty((s // K._BLOCK + capacity + 2) * K._BLOCK, dtype=idx)
    row_offsets = np.empty(s + 1, dtype=np.int64)  # shape: (S + 1,), first nbins + 1 used
    seg_doc = np.empty(s, dtype=np.int64)  # shape: (S,)
    seg_offset = np.empty(s, dtype=np.int64)  # shape: (S,)
    seg_len = np.empty(s, dtype=np.int64)  # shape: (S,)
    nbins = K._obfd_plan(lengths, capacity, code, hist, sdoc, sfull, runs, heads, data,
                         row_offsets, seg_doc, seg_offset, seg_len)
    counts = _counts(lengths.size, tokens_in, c)
    counts["docs_cut"] = counts["docs_split"]  # only split documents span several segments
    return PackPlan(capacity, row_offsets[:nbins + 1], seg_doc, seg_offset, seg_len, counts)


def _counts(docs_in: int, tokens_in: int, c: np.ndarray) -> dict:
    """Overflow bookkeeping from a kernel's counts int64[8] (see ``_split_chunks``), the one
    place the kernels' counts become a plan's: ``tokens_dropped`` is every token not written,
    the kernel's dropped documents' tokens plus its truncated tails (``tokens_truncated``)."""
    return {
        "docs_in": int(docs_in),
        "tokens_in": int(tokens_in),
        "docs_empty": int(c[0]),
        "docs_split": int(c[1]),
        "split_fragments": int(c[2]),
        "docs_truncated": int(c[3]),
        "tokens_truncated": int(c[4]),
        "docs_dropped": int(c[5]),
        # every token not written: the dropped documents' and the truncated tails
        "tokens_dropped": int(c[6]) + int(c[4]),
    }
