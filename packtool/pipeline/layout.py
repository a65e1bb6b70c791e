"""Layout: the packed columns of a group of output rows, drawn from any windows.

Every window's rows are planned in the window's row order (:mod:`packtool.pipeline.plan`), and
the output takes each window's rows in that order
(:func:`packtool.pipeline.plan.merge_windows`). So the rows an output shard holds from one
window are one contiguous run of its row order: a writing task reads, per window present in its
shard, that run's row index and segments once (:class:`ShardRows`). For each row group,
:func:`layout_group` then reads every segment's tokens from the read part that spilled them
straight into its place in the row (:func:`packtool.pipeline.spill.gather_spill`: one ``pread``
per segment, about the cost of a copy in memory; with ``--segment-multiple`` N each segment at
the start of its span of a multiple of N slots), and :func:`packtool.core.layout.complete_rows`
writes the padding and every other column around them, into buffers reused from one row group
to the next. With the scratch in an object store
the tokens of the rows a row group takes from a window are one range of that window's row-order
spill (one ranged GET).

No memory map of a spill exists, so its pages never enter the resident set: peak RSS stays at
one row group and one shard's segments per worker, whatever the corpus size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.core.layout import PackedRows, complete_rows, row_destinations
from packtool.output import window_file
from packtool.pipeline.spill import (ROW_INDEX, ROW_TARGETS, ROW_TOKENS, SEG_SOURCES, SEGMENTS,
                                     TARGETS, TOKENS, SpillReader, read_records)

__all__ = ["ShardSources", "ShardRows", "RowBuffers", "layout_group"]


@dataclass(frozen=True)
class ShardSources:
    """Where every window's plan and every read part's tokens are (small: it crosses
    processes).

    Attributes:
        windows: directory of each window (a path or a URI), in window order.
        row_spills: each window's segments point into its own row-order spill (object-store
            scratch) rather than into the read parts.
        window_targets: that row spill has target flags beside it.
        parts: directory of each read part.
        token_bases: global position of each part's first token, then the total.
        part_targets: each part spilled input target flags.
        capacity: tokens per row.
        segment_multiple: N of ``--segment-multiple`` (each segment spans a multiple of N).
        sources: each window wrote its segments' source ids (``--source-column``).
    """

    windows: tuple[str, ...]
    row_spills: tuple[bool, ...]
    window_targets: tuple[bool, ...]
    parts: tuple[str, ...]
    token_bases: tuple[int, ...]
    part_targets: tuple[bool, ...]
    capacity: int
    segment_multiple: int = 1
    sources: bool = False

    @property
    def any_targets(self) -> bool:
        return any(self.part_targets) or any(self.window_targets)


class ShardRows:
    """Every segment of one shard's rows, in output order, read once per window present.

    Args:
        sources: the windows and read parts.
        windows: int[n], the window of each of the shard's rows, in output order.
        starts: int64[k], for each window present (ascending window number), the position in
            that window's row order of its first row in the shard.

    Attributes:
        seg_offsets: int64[n + 1], row k's segments are ``seg_offsets[k]:seg_offsets[k + 1]``.
        seg_len, seg_doc, seg_offset, seg_pos: int64[segments], each segment's length, global
            document, offset in it and token position (see
            :data:`packtool.pipeline.spill.SEGMENTS`).
        seg_window: int64[segments], its window.
        seg_source: int32[segments], its source id in the output's table (``--source-column``),
            else None.

    Raises:
        OSError: a plan file cannot be read.
    """

    def __init__(self, sources: ShardSources, windows: np.ndarray, starts: np.ndarray):
        windows = np.asarray(windows, dtype=np.int64)
        ids, slot, counts = np.unique(windows, return_inverse=True, return_counts=True)
        if ids.size != len(starts):
            raise ValueError(f"{ids.size} windows in the shard, {len(starts)} starts given")
        # position of each row among its window's rows in this shard
        order = np.argsort(slot, kind="stable")
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        local = np.empty(windows.size, dtype=np.int64)  # shape: (n,)
        local[order] = np.arange(windows.size) - np.repeat(first, counts)
        row_first, row_n, recs, srcs = [], [], [], []
        base = 0
        for k, (w, s, c) in enumerate(zip(ids.tolist(), np.asarray(starts).tolist(),
                                          counts.tolist())):
            d = sources.windows[w]
            idx = read_records(window_file(d, ROW_INDEX), np.int64, 1, s, s + c + 1)[:, 0]
            rec = read_records(window_file(d, SEGMENTS), np.int64, 4, int(idx[0]), int(idx[-1]))
            if sources.sources:  # the same segments' source ids
                srcs.append(read_records(window_file(d, SEG_SOURCES), np.int32, 1, int(idx[0]),
                                         int(idx[-1]))[:, 0])
            row_first.append(idx[:-1] - idx[0] + base)
            row_n.append(np.diff(idx))
            recs.append(rec)
            base += rec.shape[0]
        row_first_all = np.concatenate(row_first) if row_first else np.zeros(0, np.int64)
        row_n_all = np.concatenate(row_n) if row_n else np.zeros(0, np.int64)
        run_base = np.concatenate([[0], np.cumsum(counts)[:-1]])  # each window's first row
        p = run_base[slot] + local  # each output row's entry in the arrays above
        nseg = row_n_all[p]
        self.seg_offsets = np.zeros(windows.size + 1, dtype=np.int64)  # shape: (n + 1,)
        np.cumsum(nseg, out=self.seg_offsets[1:])
        seg = np.repeat(row_first_all[p] - self.seg_offsets[:-1], nseg) + np.arange(
            self.seg_offsets[-1], dtype=np.int64)
        rec_all = np.concatenate(recs) if recs else np.zeros((0, 4), dtype=np.int64)
        rec_all = rec_all[seg]
        self.seg_len, self.seg_doc, self.seg_offset, self.seg_pos = (
            np.ascontiguousarray(rec_all[:, i]) for i in range(4))
        wins = np.repeat(ids, [r.shape[0] for r in recs]) if recs else np.zeros(0, np.int64)
        self.seg_window = wins[seg]
        self.seg_source = None
        if sources.sources:
            self.seg_source = (np.concatenate(srcs) if srcs
                               else np.zeros(0, dtype=np.int32))[seg]
        # where each segment's tokens are read from: a file of :attr:`files` and an item in it
        spilled = np.asarray(sources.row_spills, dtype=bool)[self.seg_window]
        bases = np.asarray(sources.token_bases, dtype=np.int64)
        part = np.searchsorted(bases, self.seg_pos, side="right") - 1
        self.seg_src = np.where(spilled, self.seg_pos, self.seg_pos - bases[np.maximum(part, 0)])
        n_parts = len(sources.parts)
        self.seg_file = np.where(spilled, n_parts + self.seg_window, part)
        self.files = ([window_file(d, TOKENS) for d in sources.parts]
                      + [window_file(d, ROW_TOKENS) for d in sources.windows])
        self.flag_files = ([window_file(d, TARGETS) for d in sources.parts]
                           + [window_file(d, ROW_TARGETS) for d in sources.windows])
        self.file_flags = np.asarray(list(sources.part_targets) + list(sources.window_targets),
                                     dtype=bool)
        # each segment's place in the flat n * C buffer of the shard's rows
        self.seg_dest = row_destinations(self.seg_offsets, self.seg_len, sources.capacity,
                                         sources.segment_multiple)
        self.seg_fd: np.ndarray | None = None  # descriptor of each segment's file, once open
        self.files_local: bool | None = None


class RowBuffers:
    """The column buffers of one writing task, reused from one row group to the next (a row
    group's Arrow table is written before the next one is laid out).

    Args:
        rows: rows of the largest row group; capacity: C; labels: a labels column is stored;
        flags: target flags are needed; padded: segments are padded (``--segment-multiple``
        N > 1: a ``cu_seqlens_unpadded`` buffer too).
    """

    def __init__(self, rows: int, capacity: int, labels: bool, flags: bool,
                 padded: bool = False):
        shape = (rows, capacity)
        self.input_ids = np.empty(shape, dtype=np.int32)
        self.flags = np.empty(shape, dtype=np.uint8) if flags else None
        self.out = {"segment_ids": np.empty(shape, dtype=np.int32),
                    "position_ids": np.empty(shape, dtype=np.int32),
                    "labels": np.empty(shape, dtype=np.int32) if labels else None,
                    "cu_values": np.empty(3 * rows + capacity, dtype=np.int32),
                    "cu_unpadded": (np.empty(3 * rows + capacity, dtype=np.int32) if padded
                                    else None)}


def _gather(shard: ShardRows, a: int, b: int, dest: np.ndarray, out: np.ndarray,
            reader: SpillReader, flags: bool) -> None:
    """Read segments ``a .. b - 1`` of the shard into ``out`` at ``dest``: their tokens, or
    with ``flags`` their target flags (segments of files without flags are left alone: the
    caller set them to 1)."""
    if not flags:  # the hot path: every file local and open for the whole task
        if shard.seg_fd is None and shard.files_local is None:
            used = np.unique(shard.seg_file)  # the files this shard reads
            fds = reader.pinned([shard.files[u] for u in used.tolist()])
            shard.files_local = fds is not None
            if fds is not None:
                lut = np.full(len(shard.files), -1, dtype=np.int32)
                lut[used] = fds
                shard.seg_fd = lut[shard.seg_file]
        if shard.seg_fd is not None:
            reader.read_into(shard.seg_fd[a:b], shard.seg_src[a:b], shard.seg_len[a:b], out,
                             dest, shard.files, shard.seg_file[a:b])
            return
    which = shard.seg_file[a:b]
    src, lens = shard.seg_src[a:b], shard.seg_len[a:b]
    if flags:
        keep = shard.file_flags[which]
        which, src, lens, dest = which[keep], src[keep], lens[keep], dest[keep]
    used, which = np.unique(which, return_inverse=True)
    names = shard.flag_files if flags else shard.files
    reader.gather([names[u] for u in used.tolist()], which, src, lens, out, dest)


def layout_group(sources: ShardSources, shard: ShardRows, lo: int, hi: int, *, pad_id: int,
                 labels, buffers: RowBuffers | None = None,
                 reader: SpillReader | None = None) -> PackedRows:
    """Lay out the shard's output rows ``lo .. hi - 1`` (in output order).

    Each segment's tokens (and target flags, when any read part has them) are read straight
    into its place in its row, then :func:`packtool.core.layout.complete_rows` writes the
    padding and every other column (``doc_ids``, ``doc_offsets`` and ``source_ids`` are the
    segments' own).

    Args:
        buffers: reused buffers (None: new ones); the result's arrays are views of them.
        reader: keeps the spill files open (None: opened and closed here).

    Returns:
        :class:`PackedRows` of the ``hi - lo`` rows in output order.

    Raises:
        OSError: a spill file cannot be read (or is truncated).
    """
    n = hi - lo
    cap = sources.capacity
    flags = sources.any_targets
    if buffers is None or buffers.input_ids.shape[0] < n:
        buffers = RowBuffers(n, cap, True, flags, sources.segment_multiple > 1)
    a, b = int(shard.seg_offsets[lo]), int(shard.seg_offsets[hi])
    seg_offsets = shard.seg_offsets[lo:hi + 1] - a
    lens = shard.seg_len[a:b]
    dest = shard.seg_dest[a:b] - lo * cap  # in the flat buffer of this group's rows
    ids = buffers.input_ids[:n]
    fl = buffers.flags[:n] if flags else None
    own = reader is None
    reader = SpillReader() if own else reader
    try:
        _gather(shard, a, b, dest, ids.reshape(-1), reader, False)
        if flags:
            fl.fill(1)
            _gather(shard, a, b, dest, fl.reshape(-1), reader, True)
    finally:
        if own:
            reader.close()
    return complete_rows(seg_offsets, lens, ids, pad_id=pad_id, labels=labels, flags=fl,
                         doc_ids=shard.seg_doc[a:b], doc_offsets=shard.seg_offset[a:b],
                         source_ids=None if shard.seg_source is None else shard.seg_source[a:b],
                         segment_multiple=sources.segment_multiple, out=buffers.out)
