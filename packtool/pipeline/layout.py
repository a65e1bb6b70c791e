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
from packtool.pipeline.spill import (ROW_INDEX, ROW_TARGETS, ROW_TOKENS, SEGMENTS, read_records,
                                     read_spill)

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
    """

    dirs: tuple[str, ...]
    first_docs: tuple[int, ...]
    targets: tuple[bool, ...]
    capacity: int


class ShardRows:
    """The row index and segments of one shard's rows, read once per window present.

    Args:
        spills: the windows' spills.
        windows: int[n], the window of each of the shard's rows, in output order.
        starts: int64[k], for each window present (ascending window number), the position in
            that window's row order of its first row in the shard.

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
        self.local = np.empty(windows.size, dtype=np.int64)  # shape: (n,)
        self.local[order] = np.arange(windows.size) - np.repeat(first, counts)
        self.index, self.segments = [], []
        for w, s, c in zip(self.ids.tolist(), np.asarray(starts).tolist(), counts.tolist()):
            d = spills.dirs[w]
            idx = read_records(window_file(d, ROW_INDEX), np.int64, 2, s, s + c + 1)
            self.index.append(idx)  # (first segment, first token) of each row, and the ends
            self.segments.append(read_records(window_file(d, SEGMENTS), np.int64, 3,
                                              int(idx[0, 0]), int(idx[-1, 0])))


def layout_group(spills: WindowSpills, shard: ShardRows, lo: int, hi: int, *, pad_id: int,
                 labels) -> PackedRows:
    """Lay out the shard's output rows ``lo .. hi - 1`` (in output order).

    For each window present, its rows here are consecutive in its row order: their tokens (and
    input target flags, for windows that have them) are one range of its row spill, read with
    one :func:`~packtool.pipeline.spill.read_spill`. One
    :func:`packtool.core.layout.layout_rows` call then lays the rows out through a plan whose
    documents are their segments, and ``doc_ids``/``doc_offsets`` are set to the segments' real
    (global) documents and offsets.

    Returns:
        :class:`PackedRows` of the ``hi - lo`` rows in output order.

    Raises:
        OSError: a spill file cannot be read (or is truncated).
    """
    slot = shard.slot[lo:hi]
    local = shard.local[lo:hi]
    n = slot.size
    present = np.unique(slot).tolist()
    combined = np.empty(n, dtype=np.int64)  # each output row's number in the combined plan
    offsets, lens, docs, offs, tokens, flags = [np.zeros(1, dtype=np.int64)], [], [], [], [], []
    any_targets = any(spills.targets[int(shard.ids[k])] for k in present)
    n_rows = n_seg = 0
    for k in present:
        w = int(shard.ids[k])
        d = spills.dirs[w]
        pos = np.flatnonzero(slot == k)
        j0, j1 = int(local[pos[0]]), int(local[pos[-1]]) + 1  # consecutive by construction
        idx = shard.index[k]
        s0, s1 = int(idx[j0, 0]), int(idx[j1, 0])
        t0, t1 = int(idx[j0, 1]), int(idx[j1, 1])
        segs = shard.segments[k][s0 - int(idx[0, 0]):s1 - int(idx[0, 0])]
        combined[pos] = n_rows + local[pos] - j0
        offsets.append(idx[j0 + 1:j1 + 1, 0] - s0 + n_seg)
        lens.append(segs[:, 0])
        docs.append(segs[:, 1] + spills.first_docs[w])
        offs.append(segs[:, 2])
        tokens.append(read_spill(window_file(d, ROW_TOKENS), [4 * t0], [4 * (t1 - t0)]).view(np.int32))
        if any_targets:  # input label masks: flags beside the tokens (1 = target) when present
            flags.append(read_spill(window_file(d, ROW_TARGETS), [t0], [t1 - t0]) if spills.targets[w]
                         else np.ones(t1 - t0, dtype=np.uint8))
        n_rows += j1 - j0
        n_seg += s1 - s0
    seg_len = np.concatenate(lens) if lens else np.zeros(0, dtype=np.int64)
    seg_doc = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
    seg_off = np.concatenate(offs) if offs else np.zeros(0, dtype=np.int64)
    buf = (tokens[0] if len(tokens) == 1 else
           np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int32))
    targets = None
    if any_targets:
        targets = np.concatenate(flags) if len(flags) != 1 else flags[0]
    starts = np.zeros(n_seg, dtype=np.int64)  # each segment's first token in ``buf``
    if n_seg:
        np.cumsum(seg_len[:-1], out=starts[1:])
    sub = PackPlan(capacity=spills.capacity, row_offsets=np.concatenate(offsets),
                   seg_doc=np.arange(n_seg, dtype=np.int64), seg_offset=np.zeros_like(seg_len),
                   seg_len=seg_len)
    packed = layout_rows(sub, combined, buf, starts,
                         pad_id=pad_id, labels=labels, targets=targets)
    return dataclasses.replace(packed, doc_ids=seg_doc[packed.doc_ids],
                               doc_offsets=seg_off[packed.doc_ids])
