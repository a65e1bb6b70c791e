"""Plan: one window read, spilled and planned (the first task of a pack), and the row order.

:func:`prepare_window` is what an engine runs once per window: it streams the window's tokens
into a spill file (:func:`packtool.pipeline.read.read_window`), plans the rows from the lengths
alone (:func:`packtool.core.packing.pack_lengths`) and saves the plan beside the spill. All of
it goes to a directory with a unique name that is renamed into place when complete, so two
attempts of one window (a Ray retry) never mix their files. Only counts come back.

:func:`row_order` then decides where every planned row of every window goes in the output.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.core.masks import plan_segment_targets
from packtool.core.packing import PackPlan, pack_lengths
from packtool.errors import PackingError, row_ref
from packtool.output import (WINDOW_DIR_PREFIX, WINDOW_DONE, publish_window, window_done,
                             window_file, window_workdir)
from packtool.pipeline.read import Window, read_window
from packtool.signals import check, test_pause
from packtool.stats import PackStats
from packtool.types import Overflow

__all__ = ["WindowInfo", "prepare_window", "load_plan", "row_order", "window_dir",
           "TOKENS_FILE", "TARGETS_FILE"]

#: Spill file of a window's tokens (raw int32, documents back to back) in its directory.
TOKENS_FILE = "tokens.int32"
#: Input target flags of a window's tokens (raw uint8, 0 = input label -100), when it has any.
TARGETS_FILE = "targets.uint8"
_PLAN_ARRAYS = ("row_offsets", "seg_doc", "seg_offset", "seg_len", "doc_starts")


@dataclass(frozen=True)
class WindowInfo:
    """What :func:`prepare_window` returns for one window (small: it crosses processes)."""

    index: int  #: window number
    directory: str  #: where its spill and plan are
    first_doc: int  #: global index of its first document
    rows: int  #: planned rows
    stats: PackStats  #: the plan's counts (PackStats.from_plan)
    reused: bool = False  #: found finished in the scratch directory (a killed run's), not redone


def window_dir(tmp: str | os.PathLike, index: int) -> str:
    """Directory of window ``index``'s spill and plan inside the scratch directory ``tmp`` (a
    path, or a URI when the scratch is in an object store)."""
    return window_file(str(tmp), f"{WINDOW_DIR_PREFIX}{index:05d}")


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


def prepare_window(cfg, window: Window, tmp: str) -> WindowInfo:
    """Read, validate, spill and plan one window into ``window_dir(tmp, window.index)``.

    Args:
        cfg: :class:`packtool.config.PackConfig` (column, capacity, strategy, overflow, EOS).
        window: from :func:`packtool.pipeline.read.plan_windows`.
        tmp: the scratch directory of OUTPUT (on a filesystem the writing tasks see).

    A window already finished in ``tmp`` (kept by :class:`packtool.output.Output` from an
    identical run that was killed) is not read again: its saved counts come back.

    Returns:
        :class:`WindowInfo` (counts only).

    Raises:
        InputError, SchemaError: bad input (file and row named).
        PackingError: a document over capacity with ``--overflow error`` (file and row named).
        OSError: the spill or plan cannot be written (e.g. a full disk).
    """
    final = window_dir(tmp, window.index)
    done = window_done(final)
    if done is not None:  # finished by an identical run that was killed
        stats = PackStats.from_dict(done)
        return WindowInfo(window.index, final, window.first_doc, stats.rows, stats, True)
    work = window_workdir(str(tmp), final.rsplit("/", 1)[-1])
    try:
        with open(work / TOKENS_FILE, "wb") as spill:
            lengths, read_counts = read_window(cfg.column, cfg.append_eos, window, spill,
                                               cfg.read_options(), work / TARGETS_FILE)
        check()
        test_pause("plan", window.index)
        if cfg.overflow is Overflow.ERROR:
            _check_overflow(cfg.capacity, window, lengths)
        plan = pack_lengths(lengths, cfg.capacity, strategy=cfg.strategy, overflow=cfg.overflow)
        doc_starts = np.zeros(lengths.size, dtype=np.int64)  # shape: (docs,)
        if lengths.size:
            np.cumsum(lengths[:-1], out=doc_starts[1:])
        arrays = dict(row_offsets=plan.row_offsets, seg_doc=plan.seg_doc,
                      seg_offset=plan.seg_offset, seg_len=plan.seg_len, doc_starts=doc_starts)
        for name in _PLAN_ARRAYS:
            np.save(work / f"{name}.npy", np.ascontiguousarray(arrays[name], dtype=np.int64))
        stats = PackStats.from_plan(plan) + read_counts
        if (work / TARGETS_FILE).is_file():  # input labels -100 are not targets either
            targets = np.memmap(work / TARGETS_FILE, dtype=np.uint8, mode="r")
            stats = dataclasses.replace(stats, effective_targets=int(
                plan_segment_targets(plan, doc_starts, targets).sum()))
            del targets
        (work / WINDOW_DONE).write_text(json.dumps(stats.to_dict()))
        publish_window(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return WindowInfo(window.index, final, window.first_doc, plan.num_rows, stats)


def load_plan(directory: str | os.PathLike, capacity: int,
              tag: str = "") -> tuple[PackPlan, np.ndarray]:
    """A saved window plan: memory-mapped from a directory (pages are read when touched), or
    read whole from a scratch prefix in an object store (each array one GET, kept in a
    per-process cache under ``tag``, the run's fingerprint: see
    :func:`packtool.formats.object_store.cached_bytes`).

    Returns:
        (plan, doc_starts int64[docs]): document numbers in the plan are window-local.
    """
    from packtool.formats.reader import is_remote

    arrays = {}
    for name in _PLAN_ARRAYS:
        where = window_file(str(directory), f"{name}.npy")
        if is_remote(where):
            from packtool.formats.object_store import cached_bytes

            arrays[name] = np.load(io.BytesIO(cached_bytes(where, tag)))
            continue
        try:
            arrays[name] = np.asarray(np.load(where, mmap_mode="r"))
        except ValueError:  # an empty array cannot be memory-mapped
            arrays[name] = np.load(where)
    doc_starts = arrays.pop("doc_starts")
    return PackPlan(capacity=capacity, **arrays), doc_starts


def row_order(window_rows: list[int], *, seed: int, shuffle: bool) -> np.ndarray:
    """Output order of every planned row of every window.

    Rows are numbered globally, window after window (window ``w``'s row ``r`` is
    ``sum(window_rows[:w]) + r``). With ``shuffle`` the order is
    ``numpy.random.default_rng(seed).permutation(total)``: each output shard draws its rows from
    all windows, and with one window it is the row shuffle of a single global plan. Without
    ``shuffle`` rows keep creation order (window by window).

    Returns:
        int64[sum(window_rows)], a permutation; depends only on the arguments (not on the
        engine or the worker count).
    """
    total = int(sum(window_rows))
    if shuffle:
        return np.random.default_rng(seed).permutation(total)
    return np.arange(total, dtype=np.int64)
