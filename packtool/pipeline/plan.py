"""Plan: windows of documents, each window's rows planned from the lengths alone, and the
output order of every window's rows.

**Windows.** Without ``--window-docs`` the whole corpus is one window: one global plan. With a
window size N, documents are dealt to windows in blocks spread over the whole input
(:mod:`packtool.core.windows`), so each window holds a sample of every source and length.

:func:`plan_window` is what an engine runs once per window, after the read parts are spilled
(:mod:`packtool.pipeline.read`):

1. load the window's document lengths and token positions from the read parts' document
   starts (one ranged read per block and part);
2. plan the rows (:func:`packtool.core.packing.pack_lengths`, with ``--segment-multiple``
   N each document planned as a multiple of N);
3. put the rows in the window's row order (:func:`window_row_order`: a seeded shuffle of the
   window's rows, or plan order with ``--no-shuffle``) and write the row index and the
   segments (length, document, offset, token position) in that order, with
   ``--source-column`` each segment's source id beside them
   (:mod:`packtool.pipeline.spill`). The tokens stay where the read parts spilled them: the
   writing tasks read each segment from there, straight into the row being laid out. Only
   with the scratch in an object store are the window's tokens also written in row order
   (:data:`~packtool.pipeline.spill.ROW_TOKENS`), so that a row group reads one ranged GET per
   window instead of one per segment.

All of it goes to a directory with a unique name that is published when complete
(:func:`packtool.output.publish_window`), so two attempts of one window never mix their files.
Only counts come back.

:func:`merge_windows` then decides which window every output row comes from: a seeded shuffle
of the window labels (each window's rows taken in its row order). A uniform shuffle of the
labels followed by uniform shuffles within windows is a uniform shuffle of all rows.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.core.packing import PackPlan, pack_lengths
from packtool.core.windows import DEAL_BLOCKS, Windows, plan_windows
from packtool.formats.reader import is_remote
from packtool.location import Location
from packtool.output import (WINDOW_DIR_PREFIX, WINDOW_DONE, check_scratch_seen,
                             publish_window, window_done, window_file, window_workdir)
from packtool.pipeline.read import ReadPart, added_by, check_overflow
from packtool.pipeline.spill import (DOC_SOURCES, ROW_INDEX, ROW_TARGETS, ROW_TOKENS,
                                     SEG_SOURCES, SEGMENTS, STARTS, TARGETS, TOKENS, DocSpill,
                                     read_spill, spill_writer)
from packtool.signals import check, test_pause
from packtool.stats import COUNTS_REVISION, PackStats
from packtool.types import Overflow

__all__ = ["Windows", "plan_windows", "PartIndex", "WindowInfo", "plan_window", "check_overflow",
           "window_row_order", "merge_windows", "window_dir", "DEAL_BLOCKS"]

#: Tokens of the rows rewritten in row order at a time (object-store scratch only).
REWRITE_TOKENS = 1 << 22
#: Bytes of a window's tokens the rewrite holds in memory (object-store scratch only; the rest
#: goes to a local file, read back with ``pread``).
WINDOW_MEMORY = 256 << 20


@dataclass(frozen=True)
class PartIndex:
    """Where the read parts' spills are (small: it crosses processes)."""

    dirs: tuple[str, ...]  #: directory of each read part
    first_docs: tuple[int, ...]  #: global number of each part's first document, then the total
    token_bases: tuple[int, ...]  #: global position of each part's first token, then the total
    targets: tuple[bool, ...]  #: each part spilled input target flags
    parts: tuple[ReadPart, ...]  #: the parts (for messages naming a file and row)
    #: ``--source-column``: per part, its own source ids (int32, the part's table) -> ids in
    #: the output's table; None without the option
    source_maps: tuple | None = None

    def part_of(self, doc: int) -> int:
        return int(np.searchsorted(self.first_docs, doc, side="right") - 1)

    def locate(self, doc: int) -> tuple[str, int]:
        """The input file of global document ``doc`` and its row there (0-based)."""
        part = self.parts[self.part_of(doc)]
        piece = next(p for p in part.pieces if p.first_doc <= doc < p.first_doc + p.docs)
        return piece.path, piece.first_row + doc - piece.first_doc


@dataclass(frozen=True)
class WindowInfo:
    """What :func:`plan_window` returns for one window (small: it crosses processes)."""

    index: int  #: window number
    directory: str  #: where its plan files are
    docs: int  #: documents in the window
    rows: int  #: planned rows
    stats: PackStats  #: the plan's counts (PackStats.from_plan)
    reused: bool = False  #: found finished in the scratch directory (a killed run's)
    row_spill: bool = False  #: its tokens were also written in row order (object-store scratch)
    targets: bool = False  #: ... with input target flags beside them


def window_dir(tmp: str, index: int) -> str:
    """Directory of window ``index``'s plan files inside the scratch directory ``tmp`` (a
    path, or a URI when the scratch is in an object store)."""
    return window_file(str(tmp), f"{WINDOW_DIR_PREFIX}{index:05d}")


def window_row_order(rows: int, *, seed: int, window: int, shuffle: bool) -> np.ndarray:
    """The order in which window ``window``'s planned rows are spilled and written.

    Returns:
        int64[rows], a permutation of the plan's row numbers:
        ``numpy.random.default_rng((seed, window)).permutation(rows)`` with ``shuffle``, else
        ``0 .. rows - 1`` (plan order). Depends only on the arguments.
    """
    if shuffle:
        return np.random.default_rng((seed, window)).permutation(rows).astype(np.int64)
    return np.arange(rows, dtype=np.int64)


def merge_windows(window_rows: list[int], *, seed: int, shuffle: bool) -> np.ndarray:
    """The window of every output row, in output order.

    Output row ``k`` is the next row, in its window's row order (:func:`window_row_order`), of
    window ``labels[k]``. With ``shuffle`` the labels (window ``w`` repeated ``window_rows[w]``
    times) are shuffled by ``numpy.random.default_rng(seed)``; with one window that is the
    window's own shuffled order. Without ``shuffle`` they stay sorted: creation order, window
    after window, rows in plan order.

    Returns:
        int32[sum(window_rows)]; depends only on the arguments (not on the engine or the worker
        count).
    """
    labels = np.repeat(np.arange(len(window_rows), dtype=np.int32),
                       np.asarray(window_rows, dtype=np.int64))
    if shuffle and len(window_rows) > 1:
        np.random.default_rng(seed).shuffle(labels)
    return labels


def _part_ranges(index: PartIndex, ranges: np.ndarray):
    """Per read part, the window's document ranges inside it: (part, int64[k, 2] local)."""
    fd = np.asarray(index.first_docs, dtype=np.int64)
    for p in range(len(index.dirs)):
        lo, hi = fd[p], fd[p + 1]
        a = np.maximum(ranges[:, 0], lo)
        b = np.minimum(ranges[:, 1], hi)
        keep = a < b
        if keep.any():
            yield p, np.stack([a[keep] - lo, b[keep] - lo], axis=1)


def load_window_sources(index: PartIndex, ranges: np.ndarray) -> np.ndarray:
    """int32[docs]: each of the window's documents' source id in the output's table (global
    document order, as :func:`load_window_docs`), from the read parts' document sources; -1
    for a document without one (not packed: no segment refers to it).

    Raises:
        OSError: a spill file cannot be read.
    """
    out = []
    for p, local in _part_ranges(index, ranges):
        n = local[:, 1] - local[:, 0]
        ids = read_spill(window_file(index.dirs[p], DOC_SOURCES), local[:, 0] * 4,
                         n * 4).view(np.int32)
        # the part's map, then -1: a document without a source (id -1) keeps -1
        out.append(np.append(np.asarray(index.source_maps[p], dtype=np.int32),
                             np.int32(-1))[ids])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int32)


def load_window_docs(index: PartIndex, ranges: np.ndarray):
    """The window's documents in global order: (global numbers, lengths, global token position
    of each one's first token), all int64[docs], from the read parts' document starts (one
    ranged read per part, of its ranges).

    Raises:
        OSError: a spill file cannot be read.
    """
    docs, lens, pos = [], [], []
    for p, local in _part_ranges(index, ranges):
        n = local[:, 1] - local[:, 0]
        raw = read_spill(window_file(index.dirs[p], STARTS), local[:, 0] * 8,
                         (n + 1) * 8).view(np.int64)
        # each range gives n + 1 starts: its documents' first tokens, then the end of the last
        last = np.cumsum(n + 1) - 1  # the end entry of each range
        keep = np.ones(raw.size, dtype=bool)
        keep[last] = False
        firsts = raw[keep]
        nxt = raw[np.flatnonzero(keep) + 1]
        docs.append(np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in local.tolist()])
                    + index.first_docs[p])
        lens.append(nxt - firsts)
        pos.append(firsts + index.token_bases[p])
    if not docs:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    return np.concatenate(docs), np.concatenate(lens), np.concatenate(pos)


def _rows_in_order(plan: PackPlan, order: np.ndarray):
    """The plan's segments in row order: (row index int64[rows + 1], segment numbers
    int64[S])."""
    ro = plan.row_offsets
    counts = ro[order + 1] - ro[order]
    index = np.zeros(order.size + 1, dtype=np.int64)  # shape: (rows + 1,)
    np.cumsum(counts, out=index[1:])
    seg = np.repeat(ro[order] - index[:-1], counts) + np.arange(index[-1], dtype=np.int64)
    return index, seg


def plan_window(cfg, windows: Windows, w: int, index: PartIndex, tmp: str) -> WindowInfo:
    """Plan window ``w`` and write its rows, in row order, into ``window_dir(tmp, w)``.

    Args:
        cfg: :class:`packtool.config.PackConfig` (capacity, strategy, overflow,
            segment_multiple, seed, shuffle, source_column).
        windows: the deal (:func:`plan_windows`).
        w: the window.
        index: where the read parts are.
        tmp: the scratch directory of OUTPUT (on a filesystem the writing tasks see, or a
            prefix in an object store).

    A window already finished in ``tmp`` (from an identical run that was killed) is not planned
    again: its saved counts come back.

    Returns:
        :class:`WindowInfo` (counts only).

    Raises:
        PackingError: a document over capacity with ``--overflow error`` (file and row named).
        OSError: a spill file cannot be read or written (e.g. a full disk).
    """
    check_scratch_seen(tmp)  # a node of a joined cluster with OUTPUT on a disk of its own
    final = window_dir(tmp, w)
    done = window_done(final)
    if done is not None:  # finished by an identical run that was killed
        # counts saved before their revision was recorded: tokens_dropped without truncation's
        stats = PackStats.from_dict(done["stats"], revision=done.get("counts_revision", 1))
        return WindowInfo(w, final, stats.docs_in, stats.rows, stats, True,
                          done["row_spill"], done["targets"])
    work = window_workdir(str(tmp), Location.parse(final).name)
    try:
        docs, lengths, positions = load_window_docs(index, windows.ranges(w))
        check()
        test_pause("plan", w)
        if cfg.overflow is Overflow.ERROR:
            check_overflow(cfg.capacity, lengths, docs, index.locate,
                           added_by(cfg.prepend_bos, cfg.append_eos))
        plan = pack_lengths(lengths, cfg.capacity, strategy=cfg.strategy, overflow=cfg.overflow,
                            segment_multiple=cfg.segment_multiple, min_fill=cfg.min_fill)
        # what --segment-multiple costs: the rows of the same documents without it
        rows_plain = plan.num_rows if cfg.segment_multiple == 1 else pack_lengths(
            lengths, cfg.capacity, strategy=cfg.strategy, overflow=cfg.overflow,
            min_fill=cfg.min_fill).num_rows
        order = window_row_order(plan.num_rows, seed=cfg.seed, window=w, shuffle=cfg.shuffle)
        row_index, seg = _rows_in_order(plan, order)
        del order
        local = plan.seg_doc[seg]
        rec = np.empty((seg.size, 4), dtype=np.int64)  # shape: (S, 4), SEGMENT_FIELDS
        rec[:, 0] = plan.seg_len[seg]
        rec[:, 1] = docs[local]
        rec[:, 2] = plan.seg_offset[seg]
        row_spill = is_remote(tmp)
        targets = False
        if row_spill:  # a store: the tokens in row order too, one GET per row group
            targets = any(index.targets[p] for p, _ in _part_ranges(index, windows.ranges(w)))
            _spill_rows(work, index, windows.ranges(w), lengths, local, rec, targets)
            rec[:, 3] = 0
            np.cumsum(rec[:-1, 0], out=rec[1:, 3])
        else:
            rec[:, 3] = positions[local] + rec[:, 2]
        with spill_writer(work / ROW_INDEX) as f:
            f.write(memoryview(row_index))
        with spill_writer(work / SEGMENTS) as f:
            f.write(memoryview(rec))
        if index.source_maps is not None:  # beside the segments: a source id per segment
            doc_src = load_window_sources(index, windows.ranges(w))
            with spill_writer(work / SEG_SOURCES) as f:
                f.write(memoryview(np.ascontiguousarray(doc_src[local])))
        stats = dataclasses.replace(PackStats.from_plan(plan),
                                    rows_without_segment_padding=rows_plain)
        (work / WINDOW_DONE).write_text(json.dumps({"stats": stats.to_dict(),
                                                    "counts_revision": COUNTS_REVISION,
                                                    "row_spill": row_spill,
                                                    "targets": targets}))
        publish_window(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return WindowInfo(w, final, int(docs.size), plan.num_rows, stats, False, row_spill, targets)


def _spill_rows(work: Path, index: PartIndex, ranges: np.ndarray, lengths: np.ndarray,
                local: np.ndarray, rec: np.ndarray, targets: bool) -> None:
    """Write the window's tokens (and flags) in row order (object-store scratch): its
    documents' tokens are fetched from the read parts (ranged GETs, whole documents, at most
    :data:`REWRITE_TOKENS` a time), held up to :data:`WINDOW_MEMORY` bytes and spilled beyond to
    a local file; then written segment by segment in row order."""
    held = WINDOW_MEMORY // 4
    with DocSpill(work / ".docs.int32", np.int32, held) as toks, \
            DocSpill(work / ".docs.uint8", np.uint8, held) as flags:
        for p, loc in _part_ranges(index, ranges):
            d = index.dirs[p]
            n = loc[:, 1] - loc[:, 0]
            st = read_spill(window_file(d, STARTS), loc[:, 0] * 8, (n + 1) * 8).view(np.int64)
            ends = np.cumsum(n + 1)
            for (a, b), e in zip(loc.tolist(), ends.tolist()):
                s = st[e - (b - a) - 1:e]  # this range's starts, end included
                k = 0
                while k < b - a:  # whole documents, about REWRITE_TOKENS at a time
                    j = int(np.searchsorted(s, s[k] + REWRITE_TOKENS, side="right")) - 1
                    j = min(max(j, k + 1), b - a)
                    lo, hi = int(s[k]), int(s[j])
                    check()
                    toks.write(memoryview(read_spill(window_file(d, TOKENS), [4 * lo],
                                                     [4 * (hi - lo)]).view(np.int32)))
                    if targets:
                        flags.write(memoryview(
                            read_spill(window_file(d, TARGETS), [lo], [hi - lo])
                            if index.targets[p] else np.ones(hi - lo, dtype=np.uint8)))
                    k = j
        toks.finish()
        flags.finish()
        starts = np.zeros(lengths.size, dtype=np.int64)  # window-local first token of each doc
        if lengths.size:
            np.cumsum(lengths[:-1], out=starts[1:])
        src = starts[local] + rec[:, 2]
        with spill_writer(work / ROW_TOKENS) as tok_f, \
                spill_writer(work / ROW_TARGETS) as tgt_f:
            csum = np.cumsum(rec[:, 0])
            q = 0
            while q < rec.shape[0]:
                check()
                z = int(np.searchsorted(csum, (csum[q - 1] if q else 0) + REWRITE_TOKENS,
                                        side="right"))
                z = min(max(z, q + 1), rec.shape[0])
                tok_f.write(memoryview(toks.gather(src[q:z], rec[q:z, 0])))
                if targets:
                    tgt_f.write(memoryview(flags.gather(src[q:z], rec[q:z, 0])))
                q = z
        if not targets:
            (work / ROW_TARGETS).unlink()
