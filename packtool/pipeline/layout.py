"""Layout: the packed columns of a group of output rows, drawn from any windows' plans.

Tokens are read from each window's spill file through a memory map opened for one row group
and closed right after, so the pages it touched leave the process: the resident set (file-backed
pages included, as ``/usr/bin/time -v`` and container memory accounting count it) stays at a
few row groups per worker, whatever the corpus size.
"""

from __future__ import annotations

import dataclasses
import mmap
from pathlib import Path

import numpy as np

from packtool.core.layout import PackedRows, layout_rows
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

    def __init__(self, dirs, first_docs, row_starts, capacity: int):
        self.dirs = list(dirs)
        self.first_docs = [int(x) for x in first_docs]
        self.row_starts = np.asarray(row_starts, dtype=np.int64)
        self.capacity = capacity
        self._plans: dict = {}

    def plan(self, w: int):
        if w not in self._plans:
            self._plans[w] = load_plan(self.dirs[w], self.capacity)
        return self._plans[w]


def _layout_window(plans: WindowPlans, w: int, rows: np.ndarray, pad_id: int,
                   labels) -> PackedRows:
    plan, doc_starts = plans.plan(w)
    with open(Path(plans.dirs[w]) / TOKENS_FILE, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    targets_path = Path(plans.dirs[w]) / TARGETS_FILE  # input label masks, when there are any
    tm = None
    if targets_path.is_file() and targets_path.stat().st_size:
        with open(targets_path, "rb") as f:
            tm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        tokens = np.frombuffer(mm, dtype=np.int32)
        targets = None if tm is None else np.frombuffer(tm, dtype=np.uint8)
        packed = layout_rows(plan, rows, tokens, doc_starts, pad_id=pad_id, labels=labels,
                             targets=targets)
        del tokens, targets
    finally:
        for m in (mm, tm):
            try:
                if m is not None:
                    m.close()  # unmap: the pages touched leave the resident set
            except BufferError:  # pragma: no cover - a view still alive; freed with it
                pass
    if plans.first_docs[w]:  # plans number documents within their window
        packed = dataclasses.replace(packed, doc_ids=packed.doc_ids + plans.first_docs[w])
    return packed


def _scatter_ragged(parts, n: int, values: str, offsets: str):
    """Merge the ragged column ``values``/``offsets`` of ``parts`` [(positions, rows)]."""
    lens = np.zeros(n, dtype=np.int64)
    for pos, p in parts:
        lens[pos] = np.diff(getattr(p, offsets))
    new_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=new_off[1:])
    dtype = getattr(parts[0][1], values).dtype
    out = np.empty(int(new_off[-1]), dtype=dtype)
    for pos, p in parts:
        off = getattr(p, offsets)
        counts = np.diff(off)
        dest = np.repeat(new_off[pos] - off[:-1], counts) + np.arange(int(off[-1]))
        out[dest] = getattr(p, values)[off[0]:off[-1]] if off[0] else getattr(p, values)
    return out, new_off


def _merge(parts, n: int) -> PackedRows:
    """Rows of several windows' :class:`PackedRows` put at their output positions."""
    first = parts[0][1]

    def fixed(name):
        if getattr(first, name) is None:
            return None
        out = np.empty((n,) + getattr(first, name).shape[1:], dtype=getattr(first, name).dtype)
        for pos, p in parts:
            out[pos] = getattr(p, name)
        return out

    cu_values, cu_offsets = _scatter_ragged(parts, n, "cu_values", "cu_offsets")
    doc_ids, seg_offsets = _scatter_ragged(parts, n, "doc_ids", "seg_offsets")
    doc_offsets, _ = _scatter_ragged(parts, n, "doc_offsets", "seg_offsets")
    return PackedRows(fixed("input_ids"), fixed("segment_ids"), fixed("position_ids"),
                      fixed("labels"), cu_values, cu_offsets, fixed("num_targets"),
                      fixed("max_seqlen"), doc_ids, doc_offsets, seg_offsets)


def layout_group(plans: WindowPlans, rows: np.ndarray, *, pad_id: int, labels) -> PackedRows:
    """Lay out output rows ``rows`` (int64[n], global row numbers, in output order).

    Each window's rows are laid out by :func:`packtool.core.layout.layout_rows` from its plan
    and spill, then put at their positions; ``doc_ids`` are global.

    Returns:
        :class:`PackedRows` of the ``n`` rows in the order given.
    """
    rows = np.asarray(rows, dtype=np.int64)
    win = np.searchsorted(plans.row_starts, rows, side="right") - 1  # shape: (n,)
    windows = np.unique(win)
    if windows.size == 1:
        w = int(windows[0])
        return _layout_window(plans, w, rows - plans.row_starts[w], pad_id, labels)
    parts = []
    for w in windows.tolist():
        pos = np.flatnonzero(win == w)
        parts.append((pos, _layout_window(plans, w, rows[pos] - plans.row_starts[w], pad_id,
                                          labels)))
    return _merge(parts, rows.size)
