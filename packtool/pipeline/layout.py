"""Layout: the packed columns of a group of output rows, drawn from any windows' row spills.

Every window's rows are spilled in the window's row order (:mod:`packtool.pipeline.plan`), and
the output takes each window's rows in that order (:func:`packtool.pipeline.plan.merge_windows`).
So the rows an output shard holds from one window are one contiguous run of that window's row
order, and the rows a row group holds from it are one contiguous range of its row spill: a
writing task reads, per window present in its shard, that run's row index and segments once
(:class:`ShardRows`), then per row group and window one range of tokens
(:func:`packtool.pipeline.spill.read_spill`: ``pread``, or one ranged GET when the scratch is in an
object store). Reads move forward through every window's spill, shard after shard.

No memory map of a spill exists, so its pages never enter the resident set: peak RSS (file
pages included, as ``/usr/bin/time -v`` and container memory accounting count it) stays at one
row group and one shard's segments per worker, whatever the corpus size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from packtool.core.layout import PackedRows, layout_rows
from packtool.core.packing import PackPlan
from packtool.output import window_file
from packtool.pipeline.spill import (ROW_INDEX, ROW_TARGETS, ROW_TOKENS, SEG_SOURCES, SEGMENTS,
                                     read_records, read_spill)

__all__ = ["WindowSpills", "ShardRows", "layout_group"]


@dataclass(frozen=True)
class WindowSpills:
    """Where every window's row spill is (small: it crosses processes).

    Attributes:
        dirs: directory of each window (``WindowInfo.directory``: a path or a URI), in window
            order.
        first_docs: global index of each window's first document.
        targets: whether each window has input target flags (a labels column).
        capacity: tokens per row.
        source_maps: ``--source-column``: per window, int32[ids of its own table] -> id in
            the output's table; None without the option.
    """

    dirs: tuple[str, ...]
    first_docs: tuple[int, ...]
    targets: tuple[bool, ...]
    capacity: int
    source_maps: tuple | None = None


class ShardRows:
    """Where each of one shard's rows is: its segments and its tokens, read once per window.

    For each window present, the rows the shard takes from it are a contiguous run of its row
    order: that run's row index and segments are read once (two reads per window and shard).

    Args:
        spills: the windows' spills.
        windows: int[n], the window of each of the shard's rows, in output order.
        starts: int64[k], for each window present (ascending window number), the position in
            that window's row order of its first row in the shard.

    Attributes:
        ids: int64[k], the windows present (ascending).
        slot: int64[n], each row's window as an index into ``ids``.
        seg_len, seg_doc, seg_offset: int64[segments of the shard], every segment of the
            shard's rows, window after window (``seg_doc`` global).
        row_seg: int64[n], each row's first segment in those arrays; ``row_nseg``: how many.
        row_tok: int64[n], each row's first token in its window's row spill; ``row_ntok``:
            how many.
        seg_source: int32[segments of the shard], each segment's source id in the output's
            table (``--source-column``), else None.

    Raises:
        OSError: a spill file cannot be read.
    """

    def __init__(self, spills: WindowSpills, windows: np.ndarray, starts: np.ndarray):
        windows = np.asarray(windows, dtype=np.int64)
        self.ids, self.slot, counts = np.unique(windows, return_inverse=True, return_counts=True)
        if self.ids.size != len(starts):
            raise ValueError(f"{self.ids.size} windows in the shard, {len(starts)} starts given")
        # position of each row among its window's rows in this shard
        order = np.argsort(self.slot, kind="stable")
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        local = np.empty(windows.size, dtype=np.int64)  # shape: (n,)
        local[order] = np.arange(windows.size) - np.repeat(first, counts)
        index, segments, sources = [], [], []
        for w, s, c in zip(self.ids.tolist(), np.asarray(starts).tolist(), counts.tolist()):
            d = spills.dirs[w]
            idx = read_records(window_file(d, ROW_INDEX), np.int64, 2, s, s + c + 1)
            index.append(idx)  # (first segment, first token) of each row, and the ends
            seg = read_records(window_file(d, SEGMENTS), np.int64, 3, int(idx[0, 0]),
                               int(idx[-1, 0]))  # (length, window-local document, offset)
            seg[:, 1] += spills.first_docs[w]
            segments.append(seg)
            if spills.source_maps is not None:  # the same segments' source ids, renumbered
                ids = read_records(window_file(d, SEG_SOURCES), np.int32, 1, int(idx[0, 0]),
                                   int(idx[-1, 0]))[:, 0]
                sources.append(np.asarray(spills.source_maps[w], dtype=np.int32)[ids])
        self.seg_source = None
        if spills.source_maps is not None:
            self.seg_source = (np.concatenate(sources) if sources
                               else np.zeros(0, dtype=np.int32))
        index_base = np.concatenate([[0], np.cumsum(counts + 1)])  # each window's first entry
        seg_base = np.concatenate([[0], np.cumsum([len(x) for x in segments])])
        idx_all = np.concatenate(index) if index else np.zeros((0, 2), dtype=np.int64)
        seg_all = np.concatenate(segments) if segments else np.zeros((0, 3), dtype=np.int64)
        self.seg_len, self.seg_doc, self.seg_offset = (np.ascontiguousarray(seg_all[:, i])
                                                       for i in range(3))
        p = index_base[self.slot] + local  # each row's entry in idx_all
        self.row_seg = seg_base[self.slot] + idx_all[p, 0] - idx_all[index_base[self.slot], 0]
        self.row_nseg = idx_all[p + 1, 0] - idx_all[p, 0]
        self.row_tok = idx_all[p, 1]
        self.row_ntok = idx_all[p + 1, 1] - idx_all[p, 1]


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.size, dtype=np.int64)
    if x.size:
        np.cumsum(x[:-1], out=out[1:])
    return out


def layout_group(spills: WindowSpills, shard: ShardRows, lo: int, hi: int, *, pad_id: int,
                 labels, segment_multiple: int = 1) -> PackedRows:
    """Lay out the shard's output rows ``lo .. hi - 1`` (in output order).

    For each window present, its rows here are consecutive in its row order: their tokens (and
    input target flags, for windows that have them) are one range of its row spill, read with
    one :func:`~packtool.pipeline.spill.read_spill` into one buffer, window after window. One
    :func:`packtool.core.layout.layout_rows` call then lays the rows out through a plan whose
    documents are their segments, and ``doc_ids``/``doc_offsets`` are set to the segments' real
    (global) documents and offsets.

    ``segment_multiple``: N of ``--segment-multiple`` (each segment padded to a multiple of N).

    Returns:
        :class:`PackedRows` of the ``hi - lo`` rows in output order.

    Raises:
        OSError: a spill file cannot be read (or is truncated).
    """
    slot = shard.slot[lo:hi]
    n = slot.size
    row_tok, row_ntok = shard.row_tok[lo:hi], shard.row_ntok[lo:hi]
    # each window's rows here, first and last (output order keeps its row order)
    wm = np.argsort(slot, kind="stable")
    present, first, count = np.unique(slot[wm], return_index=True, return_counts=True)
    head, tail = wm[first], wm[first + count - 1]
    t0 = row_tok[head]
    t1 = row_tok[tail] + row_ntok[tail]
    base = _exclusive_cumsum(t1 - t0)  # each window's first token in the buffer
    windows = shard.ids[present].tolist()
    any_targets = any(spills.targets[w] for w in windows)
    tokens, flags = [], []
    for w, a, b in zip(windows, t0.tolist(), t1.tolist()):
        d = spills.dirs[w]
        tokens.append(read_spill(window_file(d, ROW_TOKENS), [4 * a], [4 * (b - a)]))
        if any_targets:  # input label masks: flags beside the tokens (1 = target) if present
            flags.append(read_spill(window_file(d, ROW_TARGETS), [a], [b - a])
                         if spills.targets[w] else np.ones(b - a, dtype=np.uint8))
    buf = (tokens[0] if len(tokens) == 1 else np.concatenate(tokens)).view(np.int32)
    targets = None
    if any_targets:
        targets = flags[0] if len(flags) == 1 else np.concatenate(flags)
    # the rows' segments, in output order
    rank = np.searchsorted(present, slot)  # each row's window among those present
    row_start = base[rank] + row_tok - t0[rank]  # each row's first token in the buffer
    nseg = shard.row_nseg[lo:hi]
    offsets = np.zeros(n + 1, dtype=np.int64)  # shape: (n + 1,)
    np.cumsum(nseg, out=offsets[1:])
    seg = np.repeat(shard.row_seg[lo:hi] - offsets[:-1], nseg) + np.arange(offsets[-1])
    seg_len = shard.seg_len[seg]
    within = _exclusive_cumsum(seg_len)
    within -= np.repeat(within[offsets[:-1][nseg > 0]], nseg[nseg > 0])
    src = np.repeat(row_start, nseg) + within  # each segment's first token in the buffer
    sub = PackPlan(capacity=spills.capacity, row_offsets=offsets,
                   seg_doc=np.arange(seg.size, dtype=np.int64),
                   seg_offset=np.zeros_like(seg_len), seg_len=seg_len)
    packed = layout_rows(sub, np.arange(n, dtype=np.int64), buf, src, pad_id=pad_id,
                         labels=labels, targets=targets, segment_multiple=segment_multiple)
    return dataclasses.replace(packed, doc_ids=shard.seg_doc[seg],
                               doc_offsets=shard.seg_offset[seg],
                               source_ids=None if shard.seg_source is None
                               else shard.seg_source[seg])
