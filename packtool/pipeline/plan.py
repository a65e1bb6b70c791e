"""Plan: one window read, planned and spilled in row order (the first task of a pack), and the
output order of every window's rows.

:func:`prepare_window` is what an engine runs once per window:

1. read and validate the window's documents (:func:`packtool.pipeline.read.read_window`),
   holding the first :data:`WINDOW_MEMORY` bytes of their tokens in memory and spilling the
   rest to a file in input order (:class:`packtool.pipeline.spill.DocSpill`);
2. plan the rows from the lengths alone (:func:`packtool.core.packing.pack_lengths`);
3. put the rows in the window's row order (:func:`window_row_order`: a seeded shuffle of the
   window's rows, or plan order with ``--no-shuffle``) and write the window's tokens in that
   order, with a row index and the segments (the files of :mod:`packtool.pipeline.spill`),
   :data:`REWRITE_TOKENS` at a time; the input-order tokens are then dropped.

So a run of consecutive rows of a window's row order is one contiguous range of its row spill:
whichever rows of a window an output row group holds, they are read with one ``pread`` (one
ranged GET when the scratch is in an object store). All of it goes to a local directory with a
unique name that is published when complete (:func:`packtool.output.publish_window`: renamed
into place, or uploaded with ``done.json`` last), so two attempts of one window (a Ray retry)
never mix their files. Only counts come back.

:func:`merge_windows` then decides which window every output row comes from: a seeded shuffle
of the window labels (each window's rows taken in its row order). A uniform shuffle of the
labels followed by uniform shuffles within windows is a uniform shuffle of all rows, so the
output is as mixed as one permutation of every row of every window would make it, while each
window's rows are read in its row order.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.core.masks import segment_targets
from packtool.core.packing import PackPlan, pack_lengths
from packtool.errors import InputError, PackingError, row_ref
from packtool.output import (WINDOW_DIR_PREFIX, WINDOW_DONE, publish_window, window_done,
                             window_file, window_workdir)
from packtool.pipeline.read import Window, read_window
from packtool.pipeline.spill import (DOC_TARGETS, DOC_TOKENS, ROW_INDEX, ROW_TARGETS,
                                     ROW_TOKENS, SEG_SOURCES, SEGMENTS, DocSpill, spill_writer)
from packtool.signals import check, test_pause
from packtool.stats import PackStats
from packtool.types import Overflow

__all__ = ["WindowInfo", "prepare_window", "window_row_order", "merge_windows", "window_dir"]

#: Tokens of the rows rewritten in row order at a time (16 MiB of int32): a window task's
#: memory for the rewrite, whatever the window size.
REWRITE_TOKENS = 1 << 22
#: Bytes of a window's input-order tokens a window task holds in memory (the rest goes to a
#: spill file and is read back with ``pread``): a window of up to 64 M tokens never touches
#: the disk before its rows are spilled in row order. Flags of a labels column add a quarter.
WINDOW_MEMORY = 256 << 20


@dataclass(frozen=True)
class WindowInfo:
    """What :func:`prepare_window` returns for one window (small: it crosses processes)."""

    index: int  #: window number
    directory: str  #: where its spill files are
    first_doc: int  #: global index of its first document
    rows: int  #: planned rows
    stats: PackStats  #: the plan's counts (PackStats.from_plan)
    reused: bool = False  #: found finished in the scratch directory (a killed run's), not redone
    targets: bool = False  #: input target flags were spilled beside the tokens (labels column)
    #: ``--source-column``: the window's own id -> value table (sorted), its segments' ids in
    #: :data:`~packtool.pipeline.spill.SEG_SOURCES`
    sources: tuple = ()


def window_dir(tmp: str | os.PathLike, index: int) -> str:
    """Directory of window ``index``'s spill files inside the scratch directory ``tmp`` (a
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


def _check_overflow(capacity: int, window: Window, lengths: np.ndarray) -> None:
    if lengths.size and lengths.max() > capacity:
        bad = int(np.argmax(lengths > capacity))
        ends = np.cumsum([p.docs for p in window.parts])  # shape: (parts,)
        k = int(np.searchsorted(ends, bad, side="right"))
        part = window.parts[k]
        row = part.first_row + bad - int(ends[k] - part.docs)
        raise PackingError(f"{part.path}: {row_ref(row)}: document {window.first_doc + bad} has "
                           f"{int(lengths[bad])} tokens, longer than --capacity {capacity}; use "
                           "--overflow split|truncate|drop or a larger --capacity")


def _row_chunk(plan: PackPlan, doc_starts: np.ndarray, rows: np.ndarray, tokens: DocSpill,
               targets: DocSpill | None) -> tuple:
    """One chunk of the row-order rewrite: (index int64[rows, 2] counted from the chunk's
    start, segments int64[S, 3], tokens int32[T], flags uint8[T] or None, effective targets)."""
    ro = plan.row_offsets
    counts = ro[rows + 1] - ro[rows]  # segments per row
    first = np.zeros(rows.size + 1, dtype=np.int64)  # shape: (rows + 1,)
    np.cumsum(counts, out=first[1:])
    n_seg = int(first[-1])
    seg = np.repeat(ro[rows] - first[:-1], counts) + np.arange(n_seg, dtype=np.int64)
    lens = np.asarray(plan.seg_len[seg], dtype=np.int64)
    docs = np.asarray(plan.seg_doc[seg], dtype=np.int64)
    offs = np.asarray(plan.seg_offset[seg], dtype=np.int64)
    starts = np.zeros(n_seg + 1, dtype=np.int64)  # each segment's first token here
    np.cumsum(lens, out=starts[1:])
    index = np.stack([first[:-1], starts[first[:-1]]], axis=1)
    segments = np.ascontiguousarray(np.stack([lens, docs, offs], axis=1))
    src = doc_starts[docs] + offs  # shape: (n_seg,), first token in input order
    toks = tokens.gather(src, lens)
    flags = None
    if targets is not None:
        flags = targets.gather(src, lens)
        effective = int(segment_targets(starts[:-1], lens, flags).sum())
    else:
        effective = int(lens.sum()) - n_seg
    return index, segments, toks, flags, effective


def _spill_rows(work: Path, plan: PackPlan, doc_starts: np.ndarray, order: np.ndarray,
                tokens: DocSpill, targets: DocSpill | None, threads: int = 1,
                doc_sources: np.ndarray | None = None) -> int:
    """Write the window's rows in ``order`` (the row spill, index and segments of
    :mod:`packtool.pipeline.spill`), gathering their segments from the input-order ``tokens``
    (and ``targets`` flags), :data:`REWRITE_TOKENS` at most at a time. With ``threads`` > 1,
    that many chunks are gathered ahead by other threads while this one writes (the files are
    written in order either way).
    ``doc_sources`` (int32[docs], ``--source-column``) writes each segment's source id to
    :data:`~packtool.pipeline.spill.SEG_SOURCES`, beside :data:`SEGMENTS`.

    Returns:
        The effective targets of the window (sum over segments of the flagged tokens 1..len-1;
        ``seg_len - 1`` each without flags).
    """
    step = max(1, REWRITE_TOKENS // plan.capacity)
    seg_base = tok_base = effective = 0

    def chunk(lo: int) -> tuple:
        return _row_chunk(plan, doc_starts, order[lo:lo + step], tokens, targets)

    los = list(range(0, order.size, step))
    pool = ThreadPoolExecutor(max_workers=threads - 1) if threads > 1 and len(los) > 1 else None
    with ExitStack() as stack:
        tok_f = stack.enter_context(spill_writer(work / ROW_TOKENS))
        idx_f = stack.enter_context(spill_writer(work / ROW_INDEX))
        seg_f = stack.enter_context(spill_writer(work / SEGMENTS))
        tgt_f = stack.enter_context(spill_writer(work / ROW_TARGETS)) if targets else None
        src_f = (stack.enter_context(spill_writer(work / SEG_SOURCES))
                 if doc_sources is not None else None)
        if pool is not None:
            stack.callback(pool.shutdown, wait=True, cancel_futures=True)
            ahead = deque(pool.submit(chunk, lo) for lo in los[:threads])
            pending = los[threads:]
        for k in range(len(los)):
            check()
            if pool is None:
                index, segments, toks, flags, eff = chunk(los[k])
            else:
                index, segments, toks, flags, eff = ahead.popleft().result()
                if pending:
                    ahead.append(pool.submit(chunk, pending.pop(0)))
            index += np.array([seg_base, tok_base], dtype=np.int64)
            idx_f.write(memoryview(np.ascontiguousarray(index)))
            seg_f.write(memoryview(segments))
            if src_f is not None:  # beside the segments: a source id per segment
                src_f.write(memoryview(np.ascontiguousarray(doc_sources[segments[:, 1]])))
            tok_f.write(memoryview(toks))
            if tgt_f is not None:
                tgt_f.write(memoryview(flags))
            effective += eff
            seg_base += segments.shape[0]
            tok_base += toks.size
        idx_f.write(memoryview(np.array([[seg_base, tok_base]], dtype=np.int64)))
    return effective


def prepare_window(cfg, window: Window, tmp: str, threads: int = 1) -> WindowInfo:
    """Read, validate, plan and spill (in row order) one window into
    ``window_dir(tmp, window.index)``.

    Args:
        cfg: :class:`packtool.config.PackConfig` (column, capacity, strategy, overflow, EOS,
            seed and shuffle).
        window: from :func:`packtool.pipeline.read.plan_windows`.
        tmp: the scratch directory of OUTPUT (on a filesystem the writing tasks see, or a
            prefix in an object store).
        threads: threads for the row-order rewrite (the bytes do not depend on it; the local
            engine gives a window its spare workers when there are fewer windows than workers).

    A window already finished in ``tmp`` (kept by :class:`packtool.output.Output` from an
    identical run that was killed) is not read again: its saved counts come back.

    Returns:
        :class:`WindowInfo` (counts only).

    Raises:
        InputError, SchemaError: bad input (file and row named).
        PackingError: a document over capacity with ``--overflow error`` (file and row named).
        OSError: a spill file cannot be written (e.g. a full disk).
    """
    final = window_dir(tmp, window.index)
    done = window_done(final)
    if done is not None:  # finished by an identical run that was killed
        stats = PackStats.from_dict(done["stats"])
        return WindowInfo(window.index, final, window.first_doc, stats.rows, stats, True,
                          done["targets"], tuple(done.get("sources") or ()))
    work = window_workdir(str(tmp), final.rsplit("/", 1)[-1])
    try:
        held = WINDOW_MEMORY // 4
        with DocSpill(work / DOC_TOKENS, np.int32, held) as tokens, \
                DocSpill(work / DOC_TARGETS, np.uint8, held) as flags:
            values = [] if cfg.source_column is not None else None
            lengths, read_counts = read_window(cfg.column, cfg.append_eos, window, tokens,
                                               cfg.read_options(), flags,
                                               cfg.holdout_split(), values)
            table, doc_sources = _window_sources(cfg.source_column, window, values)
            tokens.finish()
            flags.finish()
            check()
            test_pause("plan", window.index)
            if cfg.overflow is Overflow.ERROR:
                _check_overflow(cfg.capacity, window, lengths)
            plan = pack_lengths(lengths, cfg.capacity, strategy=cfg.strategy,
                                overflow=cfg.overflow, segment_multiple=cfg.segment_multiple)
            # what --segment-multiple costs: the rows of the same documents without it
            rows_plain = plan.num_rows if cfg.segment_multiple == 1 else pack_lengths(
                lengths, cfg.capacity, strategy=cfg.strategy, overflow=cfg.overflow).num_rows
            doc_starts = np.zeros(lengths.size, dtype=np.int64)  # shape: (docs,)
            if lengths.size:
                np.cumsum(lengths[:-1], out=doc_starts[1:])
            del lengths
            targets = flags.items > 0
            order = window_row_order(plan.num_rows, seed=cfg.seed, window=window.index,
                                     shuffle=cfg.shuffle)
            effective = _spill_rows(work, plan, doc_starts, order, tokens,
                                    flags if targets else None, threads, doc_sources)
        stats = dataclasses.replace(PackStats.from_plan(plan) + read_counts,
                                    effective_targets=effective,
                                    rows_without_segment_padding=rows_plain)
        (work / WINDOW_DONE).write_text(json.dumps({"stats": stats.to_dict(),
                                                    "targets": targets,
                                                    "sources": list(table)}))
        publish_window(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return WindowInfo(window.index, final, window.first_doc, plan.num_rows, stats,
                      targets=targets, sources=table)


def _window_sources(column: str | None, window: Window, values: list | None):
    """The window's id -> value table (sorted) and each document's id in it (int32[docs]),
    from the ``--source-column`` values read; ``((), None)`` without the option.

    Raises:
        InputError: the column holds strings in some files and integers in others.
    """
    if values is None:
        return (), None
    if not values:
        return (), np.zeros(0, dtype=np.int32)
    if len({v.dtype.kind for v in values}) > 1:
        files = ", ".join(p.path for p in window.parts[:3])
        raise InputError(f"{files}: --source-column {column!r} holds strings in some files "
                         "and integers in others; cast it to one type before packing")
    table, ids = np.unique(np.concatenate(values), return_inverse=True)
    return tuple(v.item() if hasattr(v, "item") else v for v in table), ids.astype(np.int32)
