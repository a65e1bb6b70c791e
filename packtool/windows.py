"""Windowed packing (``--window-docs N``): plan and write the corpus window by window.

The default pack plans every document of the corpus at once. With a window size N, the input is
cut into *windows* of about N documents and each window is planned with the chosen strategy
(OBFD by default) and written as its own shards, independently of the others. This bounds memory
by the window (its tokens and its plan) instead of the corpus, and it is what lets the Ray engine
(:mod:`packtool.engines.ray_engine`) run one task per window on any number of machines.

Windows. Input files are taken in the sorted order that defines the global document index. A file
with at most N documents is one *unit*; a bigger file is cut into units of consecutive row groups
of at most N documents (a single row group over N is a unit by itself). Units are then gathered
greedily, in order, into windows: a window is closed when the next unit would take it past N
documents. The assignment depends only on the file list and the Parquet footers, never on the
engine or the number of workers.

Output of window ``w``: shards ``part-WWWWW-SSSSS.parquet`` (``W`` = window index, ``S`` = shard
index inside the window) of ``--rows-per-shard`` rows. The manifest lists them window by window,
shard by shard. ``doc_ids`` stay global (file order, then row order, over the whole input).

Row shuffle: the rows of window ``w`` are permuted by ``numpy.random.default_rng([seed, w])``;
rows never move between windows. Windows follow the input order, so a trainer that reads the
shards in manifest order sees input-order windows of shuffled rows: shuffle the shard order (or
use a large buffer) when the input itself is sorted by source.

Cost. Each window ends with a few partly filled rows that a global plan would have topped up:
the extra rows over ceil(tokens / C) are reported per window and in total (manifest ``windows``
and ``totals``, and the summary). On web-like lengths they are about one row per window
(docs/ray.md gives the measured figure).

Resuming: when window ``w`` is complete, its shards exist under their final names and a marker
``OUTPUT/.packtool-windows/window-WWWWW.json`` records their sizes, hashes and counts. A rerun of
an interrupted identical pack (same fingerprint) and a retried Ray task both skip a window whose
marker and shards are intact; otherwise the window is rewritten with the same bytes (temporary
names, ``os.replace``).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from packtool.config import PackConfig
from packtool.core.layout import append_eos
from packtool.core.packing import PackPlan, pack_lengths
from packtool.errors import InputError, PackingError, PacktoolError
from packtool.formats.manifest import write_json_atomic
from packtool.formats.reader import InputFile, discover_inputs, iter_token_batches, open_input
from packtool.formats.schema import packed_schema
from packtool.pipeline import (TMP_DIR_NAME, PackResult, _fingerprint, _prepare_output,
                               _progress, write_manifest, write_plan_shard)
from packtool.stats import PackStats
from packtool.types import Engine, Overflow

__all__ = ["WindowPart", "Window", "WindowResult", "plan_windows", "pack_window",
           "run_windowed", "window_shard_name", "WINDOWS_DIR_NAME"]

log = logging.getLogger(__name__)

#: Per-window completion markers live here until the manifest is written.
WINDOWS_DIR_NAME = ".packtool-windows"


def window_shard_name(window: int, shard: int) -> str:
    """File name of shard ``shard`` of window ``window`` (``part-00003-00000.parquet``)."""
    return f"part-{window:05d}-{shard:05d}.parquet"


@dataclass(frozen=True)
class WindowPart:
    """Documents of one input file that belong to a window."""

    file: int  #: index of the file in the input list
    path: str  #: the input file
    row_groups: tuple[int, ...] | None  #: consecutive row-group indices; None = the whole file
    docs: int  #: documents (rows) in these row groups
    first_row: int = 0  #: row index in the file of the part's first document


@dataclass(frozen=True)
class Window:
    """A run of consecutive documents planned on its own."""

    index: int  #: window number, from 0, in input order
    first_doc: int  #: global index of the window's first document
    docs: int  #: documents in the window (empty ones included)
    parts: tuple[WindowPart, ...]  #: where they are, in input order


@dataclass(frozen=True)
class WindowResult:
    """What :func:`pack_window` wrote for one window."""

    index: int
    outputs: list  #: manifest entries {file, rows, bytes, sha256}, in shard order
    stats: PackStats  #: counts of the window (rows, tokens, padding, skipped, split, ...)
    reused: int  #: shards found complete from an earlier attempt (0 or all of them)

    def record(self, window: Window) -> dict:
        """The window's entry in the manifest (JSON-ready)."""
        s = self.stats
        return {"index": window.index, "first_doc": window.first_doc, "docs": window.docs,
                "inputs": [{"path": p.path, "row_groups": (None if p.row_groups is None
                                                           else list(p.row_groups)),
                            "docs": p.docs} for p in window.parts],
                "outputs": [o["file"] for o in self.outputs], "tokens": s.tokens_in,
                "real_tokens": s.real_tokens, "rows": s.rows,
                "lower_bound_rows": s.lower_bound_rows, "extra_rows": s.extra_rows}


def plan_windows(files: list[InputFile], column: str, window_docs: int) -> list[Window]:
    """Cut the input into windows of about ``window_docs`` documents (rules in the module doc).

    Reads only the Parquet footers (and checks the token column of every file).

    Args:
        files: input files in global document order (from :func:`discover_inputs`).
        column: token column name.
        window_docs: target documents per window, >= 1.

    Returns:
        Windows in order; ``windows[i].first_doc + windows[i].docs == windows[i+1].first_doc``.

    Raises:
        InputError, SchemaError: a file is not readable Parquet or lacks the token column.
    """
    if window_docs < 1:
        raise ValueError(f"window_docs must be >= 1, got {window_docs}")
    units: list[WindowPart] = []
    for i, f in enumerate(files):
        md = open_input(f.path, column).metadata
        if md.num_rows <= window_docs:
            units.append(WindowPart(i, str(f.path), None, md.num_rows))
            continue
        groups: list[int] = []
        docs = row = 0
        for rg in range(md.num_row_groups):
            n = md.row_group(rg).num_rows
            if groups and docs + n > window_docs:
                units.append(WindowPart(i, str(f.path), tuple(groups), docs, row - docs))
                groups, docs = [], 0
            groups.append(rg)
            docs += n
            row += n
        if groups:
            units.append(WindowPart(i, str(f.path), tuple(groups), docs, row - docs))
    windows: list[Window] = []
    current: list[WindowPart] = []
    first = docs = 0

    def close():
        nonlocal current, first, docs
        windows.append(Window(len(windows), first, docs, _merge_parts(current)))
        first += docs
        current, docs = [], 0

    for u in units:
        if current and docs + u.docs > window_docs:
            close()
        current.append(u)
        docs += u.docs
    if current:
        close()
    return windows


def _merge_parts(parts: list[WindowPart]) -> tuple[WindowPart, ...]:
    """Join consecutive row-group units of the same file into one part."""
    out: list[WindowPart] = []
    for p in parts:
        if out and out[-1].file == p.file and out[-1].row_groups and p.row_groups:
            q = out[-1]
            out[-1] = WindowPart(q.file, q.path, q.row_groups + p.row_groups, q.docs + p.docs,
                                 q.first_row)
        else:
            out.append(p)
    return tuple(out)


def _read_window(cfg: PackConfig, window: Window) -> tuple[np.ndarray, np.ndarray]:
    """Read a window: (lengths int64[docs], tokens int32[sum(lengths)]), EOS appended if set.

    Raises:
        InputError: a file holds a different number of rows than its footer said when the
            windows were planned (it changed during the pack).
    """
    lengths_parts, token_parts = [], []
    for part in window.parts:
        n = 0
        for batch in iter_token_batches(Path(part.path), cfg.column, row_groups=part.row_groups):
            lengths, tokens = batch.lengths, batch.tokens
            if cfg.append_eos is not None:
                lengths, tokens = append_eos(lengths, tokens, cfg.append_eos)
            lengths_parts.append(lengths)
            token_parts.append(np.ascontiguousarray(tokens, dtype=np.int32))
            n += lengths.size
        if n != part.docs:
            raise InputError(f"{part.path}: {n} rows read, {part.docs} expected; the file "
                             "changed during the pack: rerun packtool pack")
    lengths = np.concatenate(lengths_parts) if lengths_parts else np.zeros(0, np.int64)
    tokens = np.concatenate(token_parts) if token_parts else np.zeros(0, np.int32)
    return lengths.astype(np.int64, copy=False), tokens


def _plan_stats(plan: PackPlan) -> PackStats:
    """Counts of a whole plan (rows, segments, tokens, padding, targets, attention work)."""
    seg_len = plan.seg_len
    real = int(seg_len.sum())
    return PackStats(
        capacity=plan.capacity, rows=plan.num_rows, segments=plan.num_segments,
        real_tokens=real, padding_tokens=plan.num_rows * plan.capacity - real,
        effective_targets=real - plan.num_segments,
        attention_work=int((seg_len * seg_len).sum())) + PackStats.from_dict(plan.counts)


def _marker_path(out: Path, index: int) -> Path:
    return out / WINDOWS_DIR_NAME / f"window-{index:05d}.json"


def _load_marker(out: Path, window: Window) -> WindowResult | None:
    """The result recorded by an earlier complete attempt at ``window``, if its shards are intact."""
    path = _marker_path(out, window.index)
    try:
        rec = json.loads(path.read_text())
        outputs = rec["outputs"]
        stats = PackStats.from_dict(rec["stats"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for o in outputs:
        p = out / o["file"]
        if not p.is_file() or p.stat().st_size != o["bytes"]:
            return None
    return WindowResult(window.index, outputs, stats, len(outputs))


def pack_window(cfg: PackConfig, window: Window, output: str, workers: int = 1) -> WindowResult:
    """Read, plan and write one window; safe to run again (same bytes, same names).

    Args:
        cfg: the pack options (``capacity``, ``strategy``, ``seed``, ``rows_per_shard``...).
        window: from :func:`plan_windows`.
        output: the OUTPUT directory (already prepared by the driver).
        workers: threads laying out and encoding this window's shards (no effect on the bytes).

    Returns:
        :class:`WindowResult`; ``reused`` is the shard count when a complete earlier attempt
        was found (nothing is read or written then).

    Raises:
        InputError, SchemaError: bad input (file and row named, rows global within the file).
        PackingError: a document over capacity with ``--overflow error`` (global index named).
    """
    out = Path(output)
    done = _load_marker(out, window)
    if done is not None:
        return done
    lengths, tokens = _read_window(cfg, window)  # shapes: (docs,), (sum(lengths),)
    if cfg.overflow is Overflow.ERROR and lengths.size and lengths.max() > cfg.capacity:
        bad = int(np.argmax(lengths > cfg.capacity))
        ends = np.cumsum([p.docs for p in window.parts])  # shape: (parts,)
        k = int(np.searchsorted(ends, bad, side="right"))
        part = window.parts[k]
        row = part.first_row + bad - int(ends[k] - part.docs)
        raise PackingError(f"{part.path}: row {row}: document of {int(lengths[bad])} tokens is "
                           f"longer than --capacity {cfg.capacity}; use --overflow "
                           "split|truncate|drop or a larger --capacity")
    plan = pack_lengths(lengths, cfg.capacity, strategy=cfg.strategy, overflow=cfg.overflow)
    doc_starts = np.zeros(lengths.size, dtype=np.int64)  # shape: (docs,)
    if lengths.size:
        np.cumsum(lengths[:-1], out=doc_starts[1:])
    order = (np.random.default_rng([cfg.seed, window.index]).permutation(plan.num_rows)
             if cfg.shuffle else np.arange(plan.num_rows))
    schema = packed_schema(cfg.capacity, cfg.labels.value)
    n_shards = -(-plan.num_rows // cfg.rows_per_shard)

    def do_shard(s: int) -> dict:
        rows = order[s * cfg.rows_per_shard:(s + 1) * cfg.rows_per_shard]
        # the plan numbers documents within the window; the output keeps global ids
        return write_plan_shard(out / window_shard_name(window.index, s), cfg, schema, plan, rows,
                                tokens, doc_starts, doc_id_offset=window.first_doc)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        outputs = list(pool.map(do_shard, range(n_shards)))
    result = WindowResult(window.index, outputs, _plan_stats(plan), 0)
    marker = _marker_path(out, window.index)
    marker.parent.mkdir(exist_ok=True)
    write_json_atomic(marker, {"outputs": outputs, "stats": result.stats.to_dict()})
    return result


MapWindows = Callable[[PackConfig, list[Window], str], Iterable[WindowResult]]


def _map_local(cfg: PackConfig, windows: list[Window], output: str) -> Iterator[WindowResult]:
    """The local engine: windows one after another, ``cfg.workers`` threads inside each."""
    for w in windows:
        yield pack_window(cfg, w, output, cfg.workers)


def run_windowed(cfg: PackConfig, *, progress: bool = True,
                 map_windows: MapWindows | None = None):
    """Pack ``cfg.inputs`` window by window (``cfg.window_docs`` set) into ``cfg.output``.

    The driver lists the inputs, prepares OUTPUT (same rules as the one-plan pack: refuses a
    non-empty OUTPUT without ``--overwrite``, resumes an interrupted identical pack), cuts the
    windows, runs :func:`pack_window` on each through ``map_windows`` (results in window order),
    then writes the manifest last.

    Args:
        cfg: options; ``cfg.window_docs`` must be set. With ``cfg.engine == "ray"`` and no
            ``map_windows``, the work is handed to :func:`packtool.engines.ray_engine.run_ray`.
        progress: show a progress bar on stderr when it is a TTY.
        map_windows: runs the windows; default: in this process, one after another.

    Returns:
        :class:`packtool.pipeline.PackResult`; its manifest has a ``windows`` list (per window:
        documents, tokens, rows, lower bound and extra rows, inputs, shards).

    Raises:
        ConfigError: ``cfg.window_docs`` is None.
        InputError, SchemaError, OutputError, PackingError: as :func:`packtool.pipeline.run_pack`.
        MissingDependencyError: ``--engine ray`` without Ray installed.
    """
    from packtool.errors import ConfigError

    if cfg.window_docs is None:
        raise ConfigError("--window-docs is not set; run_windowed needs a window size")
    if map_windows is None and cfg.engine is Engine.RAY:
        from packtool.engines.ray_engine import run_ray

        return run_ray(cfg, progress=progress)
    map_windows = map_windows or _map_local
    t0 = time.perf_counter()
    show = progress and sys.stderr.isatty()
    files = discover_inputs(list(cfg.inputs))
    fingerprint = _fingerprint(cfg, files)
    windows = plan_windows(files, cfg.column, cfg.window_docs)
    out = Path(cfg.output)
    out_existed = out.exists()
    resume = _prepare_output(cfg, files, fingerprint)
    if not resume:
        shutil.rmtree(out / WINDOWS_DIR_NAME, ignore_errors=True)
    log.info("%d windows of about %d documents", len(windows), cfg.window_docs)
    total, outputs, records, reused = PackStats(capacity=cfg.capacity), [], [], 0
    try:
        with _progress(len(windows), "windows", "window", show) as bar:
            for w, res in zip(windows, map_windows(cfg, windows, str(out))):
                if res.index != w.index:
                    raise AssertionError(f"window {w.index} got the result of {res.index}")
                total = total + res.stats
                outputs.extend(res.outputs)
                records.append(res.record(w))
                reused += res.reused
                bar.update(1)
        if total.tokens_in == 0:
            raise InputError(f"{len(files)} input file(s): no tokens to pack (no documents, or "
                             f"all empty in column {cfg.column!r}); check the INPUT and --column")
    except PacktoolError:
        # bad input: a new OUTPUT is removed; an existing one keeps its in-progress marker, so
        # it never looks complete and a rerun may reuse it
        if not out_existed:
            shutil.rmtree(out, ignore_errors=True)
        raise
    file_rows = [0] * len(files)
    for w in windows:
        for p in w.parts:
            file_rows[p.file] += p.docs
    manifest = write_manifest(out, cfg, files, file_rows, outputs, total, windows=records)
    shutil.rmtree(out / WINDOWS_DIR_NAME, ignore_errors=True)
    shutil.rmtree(out / TMP_DIR_NAME, ignore_errors=True)
    return PackResult(total, manifest, time.perf_counter() - t0, reused)
