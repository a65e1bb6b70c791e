"""Layout: the packed columns of a group of output rows, drawn from any windows' plans.

Only the tokens of the rows being laid out are read from each window's spill file, with
``pread`` into a private buffer (one read per run of segments that are contiguous in the spill);
input target flags (label masks), when a window has them, are read the same way. No memory map
of the spill exists, so its pages never enter the resident set: peak RSS (file pages included,
as ``/usr/bin/time -v`` and container memory accounting count it) stays at one row group per
worker, whatever the corpus size.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from packtool.core.layout import PackedRows, layout_rows
from packtool.core.packing import PackPlan
from packtool.output import file_size, read_ranges, window_file
from packtool.pipeline.plan import TARGETS_FILE, TOKENS_FILE, load_plan

__all__ = ["WindowPlans", "layout_group"]


class WindowPlans:
    """The saved plans of a pack's windows, loaded (memory-mapped) on first use.

    Args:
        dirs: directory of each window (``WindowInfo.directory``), in window order.
        first_docs: int[windows], global index of each window's first document.
        row_starts: int64[windows + 1], global number of each window's first row.
        capacity: tokens per row.
    """

    def __init__(self, dirs, first_docs, row_starts, capacity: int, tag: str = ""):
        self.dirs = [str(d) for d in dirs]
        self.first_docs = [int(x) for x in first_docs]
        self.row_starts = np.asarray(row_starts, dtype=np.int64)
        self.capacity = capacity
        self.tag = tag  #: the run's fingerprint (names the plans' content in a store cache)
        self._plans: dict = {}
        self._targets: dict = {}

    def plan(self, w: int):
        if w not in self._plans:
            self._plans[w] = load_plan(self.dirs[w], self.capacity, self.tag)
        return self._plans[w]

    def has_targets(self, w: int) -> bool:
        """Whether window ``w`` saved input target flags (a non-empty targets file)."""
        if w not in self._targets:
            self._targets[w] = bool(file_size(window_file(self.dirs[w], TARGETS_FILE)))
        return self._targets[w]


def _read_segments(path: str, src: np.ndarray, seg_len: np.ndarray,
                   dtype=np.int32) -> np.ndarray:
    """dtype[sum(seg_len)] (read-only): items ``src[i] .. src[i] + seg_len[i] - 1`` of a flat
    spill file of ``dtype``, back to back. Segments that follow each other in the file are read
    with one ``pread``; the pieces are joined once."""
    if not src.size:
        return np.zeros(0, dtype=dtype)
    size = np.dtype(dtype).itemsize
    # runs of segments contiguous in the spill (consecutive documents, chunks of one document)
    breaks = np.flatnonzero(src[1:] != src[:-1] + seg_len[:-1]) + 1
    first = np.concatenate([[0], breaks])
    ends = np.cumsum(seg_len)
    starts = ends - seg_len
    sizes = ((ends[np.concatenate([breaks, [src.size]]) - 1] - starts[first]) * size).tolist()
    offsets = (src[first] * size).tolist()
    data = read_ranges(path, sizes, offsets)  # pread, or ranged GETs for a store
    if len(data) != int(ends[-1]) * size:
        raise OSError(f"{path}: short read ({len(data)} of {int(ends[-1]) * size} bytes): the "
                      "spill file is truncated")
    return np.frombuffer(data, dtype=dtype)


def layout_group(plans: WindowPlans, rows: np.ndarray, *, pad_id: int, labels) -> PackedRows:
    """Lay out output rows ``rows`` (int64[n], global row numbers, in output order).

    The rows' segments are gathered from their windows' plans in output order; only their
    tokens (and input target flags, for windows that have them) are read from the spills
    (:func:`_read_segments`, window by window, into one private buffer); one
    :func:`packtool.core.layout.layout_rows` call then lays them out through a plan whose
    documents are these segments, and ``doc_ids``/``doc_offsets`` are set to the segments' real
    (global) documents and offsets.

    Returns:
        :class:`PackedRows` of the ``n`` rows in the order given.
    """
    rows = np.asarray(rows, dtype=np.int64)
    n = rows.size
    win = np.searchsorted(plans.row_starts, rows, side="right") - 1  # shape: (n,)
    local = rows - plans.row_starts[win]  # row number inside its window
    counts = np.zeros(n, dtype=np.int64)  # segments per row
    windows = np.unique(win).tolist()
    for w in windows:
        pos = np.flatnonzero(win == w)
        ro = plans.plan(w)[0].row_offsets
        counts[pos] = ro[local[pos] + 1] - ro[local[pos]]
    seg_offsets = np.zeros(n + 1, dtype=np.int64)  # shape: (n + 1,)
    np.cumsum(counts, out=seg_offsets[1:])
    n_seg = int(seg_offsets[-1])
    seg_len = np.zeros(n_seg, dtype=np.int64)
    seg_doc = np.zeros(n_seg, dtype=np.int64)
    seg_off = np.zeros(n_seg, dtype=np.int64)
    starts = np.zeros(n_seg, dtype=np.int64)  # each segment's first token in the buffer
    blocks, flags, filled = [], [], 0
    has = {w: plans.has_targets(w) for w in windows}
    any_targets = any(has.values())
    for w in windows:
        plan, doc_starts = plans.plan(w)
        pos = np.flatnonzero(win == w)
        c = counts[pos]
        within = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
        dest = np.repeat(seg_offsets[pos], c) + within  # output segment numbers
        src_seg = np.repeat(plan.row_offsets[local[pos]], c) + within  # plan segment numbers
        lens = plan.seg_len[src_seg]
        docs = plan.seg_doc[src_seg]
        offs = plan.seg_offset[src_seg]
        seg_len[dest], seg_doc[dest], seg_off[dest] = lens, docs + plans.first_docs[w], offs
        starts[dest] = filled + np.cumsum(lens) - lens
        src = doc_starts[docs] + offs
        blocks.append(_read_segments(window_file(plans.dirs[w], TOKENS_FILE), src, lens))
        if any_targets:  # input label masks: flags beside the tokens (1 = target) when present
            tpath = window_file(plans.dirs[w], TARGETS_FILE)
            flags.append(_read_segments(tpath, src, lens, np.uint8) if has[w]
                         else np.ones(int(lens.sum()), dtype=np.uint8))
        filled += int(lens.sum())
    tokens = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    targets = None
    if any_targets:
        targets = flags[0] if len(flags) == 1 else np.concatenate(flags)
    sub = PackPlan(capacity=plans.capacity, row_offsets=seg_offsets,
                   seg_doc=np.arange(n_seg, dtype=np.int64), seg_offset=np.zeros_like(seg_len),
                   seg_len=seg_len)
    packed = layout_rows(sub, np.arange(n, dtype=np.int64), tokens, starts, pad_id=pad_id,
                         labels=labels, targets=targets)
    return dataclasses.replace(packed, doc_ids=seg_doc, doc_offsets=seg_off)

