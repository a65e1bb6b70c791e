"""``packtool pack``: the one driver. Every run is a list of windows mapped by an engine.

    read (pipeline/read.py) -> plan (pipeline/plan.py) -> layout (pipeline/layout.py)
        -> write (pipeline/write.py), engines (packtool/engines/) beside, OUTPUT owned by
        packtool/output.py

1. The inputs are listed and their footers checked; the corpus is cut into windows
   (no ``--window-docs``: one window of the whole corpus).
2. The engine maps :func:`~packtool.pipeline.plan.prepare_window` over the windows: each
   window's tokens are validated and spilled to OUTPUT's scratch directory, its rows are
   planned from the lengths alone and spilled again in the window's (seeded, shuffled) row
   order, and only counts come back. A bad value in any window stops the run here, before
   anything outside the scratch directory is written.
3. :func:`~packtool.pipeline.plan.merge_windows` decides which window every output row comes
   from (a seeded shuffle of the window labels: as mixed as one permutation of all rows), and
   the engine maps :func:`~packtool.pipeline.write.write_shard_task` over the output shards;
   each reads, per row group and window present, one contiguous range of that window's row
   spill.
4. The manifest (:data:`~packtool.formats.manifest.MANIFEST_NAME`) is written last
   (:meth:`packtool.output.Output.commit`).

Memory: the document lengths and plan of a window (about 50 bytes per document piece) per
window task, with the tokens in the spill; one record batch and 16 MiB of row-ordered tokens
per window task; one row group and its shard's segments per writing task. Spills are read with
``pread``, never memory-mapped (see :mod:`packtool.pipeline.layout`).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from packtool._version import __version__
from packtool.config import PackConfig
from packtool.engines import make_engine
from packtool.errors import InputError
from packtool.formats.manifest import (FORMAT_VERSION, InputEntry, LabelsInfo, Manifest,
                                       WindowEntry, shard_name)
from packtool.formats.reader import discover_inputs
from packtool.formats.schema import labels_convention, packed_schema
from packtool.output import Output, fingerprint
from packtool.pipeline.layout import WindowSpills
from packtool.pipeline.plan import WindowInfo, merge_windows, prepare_window
from packtool.pipeline.read import Window, file_rows, input_labels_config, plan_windows
from packtool.pipeline.write import ShardJob, write_shard_task
from packtool.signals import interruptible, test_pause
from packtool.stats import PackStats

__all__ = ["run_pack", "PackResult", "plan_windows", "Window"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackResult:
    """What :func:`run_pack` did."""

    stats: PackStats  #: counts of the whole output
    manifest: Manifest  #: the manifest written (or found, when ``already_complete``)
    seconds: float  #: wall time, engine start-up included
    shards_reused: int  #: shards kept from an interrupted identical run
    already_complete: bool = False  #: OUTPUT already held this pack: nothing was done
    warnings: list = field(default_factory=list)  #: loud notes (e.g. many tokens dropped)
    windows_reused: int = 0  #: windows kept finished from an identical run that was killed
    holdout: "PackResult | None" = None  #: the held-out pack of ``--holdout``, when asked for


def _progress(total, desc, unit, enabled):
    """A tqdm bar on stderr; counts stay integers (``3/33 shard``), only an open-ended count
    (``total=None``) is abbreviated (``1.2M doc``)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=f" {unit}", unit_scale=total is None, leave=False,
                disable=not enabled, file=sys.stderr)


def _window_record(w: Window, info: WindowInfo) -> WindowEntry:
    s = info.stats
    return WindowEntry(w.index, w.first_doc, w.docs,
                       tuple({"path": str(p.path), "first_row": p.first_row, "docs": p.docs}
                             for p in w.parts),
                       s.tokens_in, s.real_tokens, s.rows, s.lower_bound_rows, s.extra_rows)


def _shown(path) -> str:
    """How the manifest names an input file: its path, or its URI without secret options."""
    from packtool.location import Location

    return Location.parse(path).display


def _warnings(cfg: PackConfig, stats: PackStats) -> list[str]:
    note = stats.overflow_warning(cfg.overflow.value)
    return [note] if note else []


def _source_table(column: str | None, infos: list[WindowInfo]):
    """``--source-column``: the output's id -> value table (the sorted values of every window)
    and, per window, int32[its ids] -> the table's ids; ``((), None)`` without the option.

    Raises:
        InputError: the column holds strings in some windows and integers in others.
    """
    if column is None:
        return (), None
    kinds = {type(v) is str for i in infos for v in i.sources}
    if len(kinds) > 1:
        raise InputError(f"--source-column {column!r} holds strings in some input files and "
                         "integers in others; cast it to one type before packing")
    table = tuple(sorted({v for i in infos for v in i.sources}))
    index = {v: k for k, v in enumerate(table)}
    maps = tuple(np.asarray([index[v] for v in i.sources], dtype=np.int32) for i in infos)
    return table, maps


def _shard_jobs(labels: np.ndarray, n_windows: int, per: int, out: Output) -> list[ShardJob]:
    """One job per ``per`` output rows: the window of each row and, per window present, the
    position in its row order of its first row in the shard (the rows it took before)."""
    taken = np.zeros(n_windows, dtype=np.int64)  # rows of each window in earlier shards
    jobs = []
    for s in range(-(-labels.size // per)):
        windows = labels[s * per:(s + 1) * per]
        present, counts = np.unique(windows, return_counts=True)
        jobs.append(ShardJob(s, shard_name(s), windows, taken[present].copy(), str(out.path),
                             str(out.tmp), out.resume, out.promised(shard_name(s))))
        taken[present] += counts
    return jobs


def run_pack(cfg: PackConfig, *, progress: bool = True) -> PackResult:
    """Pack ``cfg.inputs`` into ``cfg.output`` (phases in the module docstring).

    Returns:
        :class:`PackResult` with the merged :class:`PackStats` and the manifest.

    Raises:
        InputError, SchemaError: bad input (file, row and fix named); OUTPUT is as before.
        OutputError: OUTPUT cannot be used (another pack holds it, not empty, full disk...).
        PackingError: a document over capacity with ``--overflow error``.
        EngineError: a Ray task failed (OUTPUT is left resumable).
        MissingDependencyError: ``--engine ray`` without Ray installed.
        KeyboardInterrupt: Ctrl-C; OUTPUT is as before or resumable.
    """
    if cfg.holdout is not None and cfg.holdout_part is None:  # two packs, one per side
        from packtool.pipeline.holdout import run_holdout

        return run_holdout(cfg, run_pack, progress=progress)
    t0 = time.perf_counter()
    show = progress and sys.stderr.isatty()
    files = discover_inputs(list(cfg.inputs), skip_unsupported=cfg.skip_unsupported)
    cfg = input_labels_config(cfg, files)  # an input labels column: labels are stored
    windows = plan_windows(files, cfg.column, cfg.window_docs)  # footers only
    fp = fingerprint(cfg.layout_options(), files)
    with interruptible(), Output(cfg.output, cfg.inputs, fp, overwrite=cfg.overwrite) as out:
        if out.complete:
            m = out.manifest
            return PackResult(m.totals, m, time.perf_counter() - t0, len(m.shards), True,
                              _warnings(cfg, m.totals))
        tokens = sorted(w.tokens + (w.docs if cfg.append_eos is not None else 0)
                        for w in windows)
        # the row spills, plus the input-order spills of the windows being read at once
        out.check_space(4 * (sum(tokens) + sum(tokens[-max(1, cfg.workers):])))
        with make_engine(cfg.engine.value, workers=cfg.workers,
                         ray_address=cfg.ray_address) as engine:
            infos: list[WindowInfo] = []
            with _progress(len(windows), "read+plan", "window", show) as bar:
                # fewer windows than local workers: the spare ones help rewrite a window's rows
                threads = max(1, cfg.workers // len(windows)) if engine.name == "local" else 1
                for info in engine.map(prepare_window,
                                       [(cfg, w, str(out.tmp), threads) for w in windows]):
                    infos.append(info)
                    bar.update(1)
            total = PackStats(capacity=cfg.capacity)
            for info in infos:
                total = total + info.stats
            if total.tokens_in == 0:
                where = files[0].path if len(files) == 1 else f"{len(files)} input files"
                what = (f"all {total.docs_in} documents in column {cfg.column!r} are empty"
                        if total.docs_in else "no documents (empty shards)")
                raise InputError(f"{where}: no tokens to pack: {what}; check the INPUT and "
                                 "--column")
            log.info("planned %d windows, %d rows", len(infos), total.rows)
            labels = merge_windows([i.rows for i in infos], seed=cfg.seed, shuffle=cfg.shuffle)
            source_values, source_maps = _source_table(cfg.source_column, infos)
            spills = WindowSpills(tuple(i.directory for i in infos),
                                  tuple(i.first_doc for i in infos),
                                  tuple(i.targets for i in infos), cfg.capacity, source_maps)
            jobs = _shard_jobs(labels, len(infos), cfg.rows_per_shard, out)
            out.begin_write()
            # a full disk while writing: about the rows left at capacity * 4 bytes per column
            out.bytes_needed = 4 * cfg.capacity * labels.size
            outputs, reused = [], 0
            with _progress(len(jobs), "write", "shard", show) as bar:
                for entry, was_reused in engine.map(write_shard_task,
                                                    [(cfg, j, spills) for j in jobs]):
                    outputs.append(entry)
                    out.shard_written(entry)
                    reused += was_reused
                    out.bytes_needed = max(0, out.bytes_needed - 4 * cfg.capacity * entry.rows)
                    bar.update(1)
        test_pause("manifest")
        labels_mode = cfg.labels.value
        manifest = Manifest(
            format_version=FORMAT_VERSION, packtool_version=__version__, fingerprint=fp,
            capacity=cfg.capacity,
            labels=LabelsInfo(labels_mode != "none", labels_convention(labels_mode)),
            options={k: v for k, v in cfg.layout_options().items() if k != "labels"},
            inputs=tuple(InputEntry(_shown(f.path), r, f.bytes)
                         for f, r in zip(files, file_rows(windows, len(files)))),
            shards=tuple(outputs), totals=total,
            windows=tuple(_window_record(w, i) for w, i in zip(windows, infos))
            if cfg.window_docs is not None else (),
            source_column=cfg.source_column, source_values=source_values)
        out.commit(manifest, packed_schema(cfg.capacity, cfg.labels.value,
                                           cfg.segment_multiple,
                                           sources=cfg.source_column is not None))
    return PackResult(total, manifest, time.perf_counter() - t0, reused, False,
                      _warnings(cfg, total), windows_reused=sum(i.reused for i in infos))
