"""``packtool pack`` end to end: read -> spill -> plan -> lay out -> write -> manifest.

Memory stays bounded whatever the corpus size:

1. One streaming pass over the input (row group by row group) validates every token, appends
   the optional EOS, and spills the tokens to a flat int32 file under ``OUTPUT/.packtool-tmp``;
   only the document lengths (8 bytes per document) stay in memory.
2. The plan is built from the lengths alone (about 48 bytes per document piece).
3. Shards are laid out row group by row group from a memory map of the spill file, by
   ``workers`` threads (the Numba layout kernel and Parquet encoding release the GIL).
4. The manifest (:data:`~packtool.formats.manifest.MANIFEST_NAME`) is written last; until then ``OUTPUT/.packtool-in-progress.json`` marks the
   directory as incomplete. A rerun with the same inputs and options keeps the shards already
   finished (they are identical: a shard depends only on the plan), writes the rest, and ends
   with the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool import __version__
from packtool.config import PackConfig
from packtool.core.layout import append_eos, layout_rows
from packtool.core.packing import PackPlan, pack_lengths
from packtool.errors import InputError, OutputError, PackingError, PacktoolError
from packtool.formats.manifest import (FORMAT_VERSION, IN_PROGRESS_NAME, MANIFEST_NAME,
                                       SHARD_GLOB, TMP_DIR_NAME, sha256_file, shard_name,
                                       write_json_atomic, write_manifest_file)
from packtool.formats.reader import InputFile, discover_inputs, iter_token_batches, open_input
from packtool.formats.schema import labels_convention, packed_columns, packed_schema
from packtool.formats.writer import rows_to_table, write_shard
from packtool.stats import PackStats
from packtool.types import Overflow

__all__ = ["run_pack", "PackResult", "IN_PROGRESS_NAME", "TMP_DIR_NAME"]

log = logging.getLogger(__name__)


#: Test hook (used only by tests/test_crash_resume.py): ``PACKTOOL_TEST_PAUSE_AT=<phase>[:<shard>]``
#: with phase ``read``, ``plan``, ``write-shard`` or ``manifest`` makes ``pack`` print a line to
#: stderr and sleep at that point, so a test can SIGKILL it there. Unset, it costs one lookup.
PAUSE_ENV = "PACKTOOL_TEST_PAUSE_AT"


def _test_pause(phase: str, shard: int = 0) -> None:
    want = os.environ.get(PAUSE_ENV)
    if want and want.partition(":")[0] == phase and int(want.partition(":")[2] or 0) == shard:
        print(f"packtool: test pause at {want}", file=sys.stderr, flush=True)
        time.sleep(3600)


@dataclass(frozen=True)
class PackResult:
    """What :func:`run_pack` did."""

    stats: PackStats
    manifest: dict
    seconds: float
    shards_reused: int


def _progress(total, desc, unit, enabled):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False,
                disable=not enabled, file=sys.stderr)


def _fingerprint(cfg: PackConfig, files: list[InputFile]) -> str:
    """sha256 of the options that decide the bytes and of each input (path, size, mtime)."""
    blob = json.dumps({"options": cfg.layout_options(), "version": __version__,
                       "inputs": [[str(f.path), f.bytes, f.mtime_ns] for f in files]},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def _prepare_output(cfg: PackConfig, files: list[InputFile], fingerprint: str) -> bool:
    """Create or clean OUTPUT; return True when an interrupted identical pack can be resumed."""
    out = Path(cfg.output)
    out_abs = out.resolve()
    for given in cfg.inputs:
        src = Path(given).resolve()
        if _inside(out_abs, src) or _inside(src, out_abs):
            raise OutputError(f"{out}: OUTPUT overlaps INPUT {given}; choose a directory outside "
                              "the input")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: exists and is a file; OUTPUT must be a directory")
    resume = False
    if out.is_dir() and any(out.iterdir()):
        marker = out / IN_PROGRESS_NAME
        ours = marker.is_file() and not (out / MANIFEST_NAME).exists()
        if ours:
            try:
                resume = json.loads(marker.read_text())["fingerprint"] == fingerprint
            except (ValueError, KeyError):
                resume = False
        if not resume and not (cfg.overwrite or ours):
            raise OutputError(f"{out}: OUTPUT is not empty; pass --overwrite to replace it or "
                              "choose another directory")
        if not resume:
            # manifest first, so the directory never looks complete while it is being replaced
            (out / MANIFEST_NAME).unlink(missing_ok=True)
            for p in out.glob(SHARD_GLOB):
                p.unlink()
            for p in out.glob(".part-*.parquet.tmp"):
                p.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out / TMP_DIR_NAME, ignore_errors=True)
        (out / TMP_DIR_NAME).mkdir()
        write_json_atomic(out / IN_PROGRESS_NAME, {"fingerprint": fingerprint})
    except OSError as exc:
        raise OutputError(f"{out}: cannot write ({exc.strerror}); choose a writable OUTPUT") from None
    return resume


def _read_and_spill(cfg, files, spill_path, show):
    """Pass 1: validate and spill every token; return lengths int64[docs] and rows per file."""
    parts, file_rows = [], []
    with open(spill_path, "wb") as spill, _progress(sum(f.bytes for f in files), "read", "B",
                                                     show) as bar:
        for f in files:
            rows = 0
            for batch in iter_token_batches(f.path, cfg.column):
                lengths, tokens = batch.lengths, batch.tokens
                if cfg.append_eos is not None:
                    lengths, tokens = append_eos(lengths, tokens, cfg.append_eos)
                # the buffer itself, no bytes copy (a 200 MB corpus spent 0.06 s in tobytes)
                spill.write(memoryview(np.ascontiguousarray(tokens, dtype=np.int32)))
                parts.append(lengths)
                _test_pause("read")
                rows += lengths.size
            file_rows.append(rows)
            bar.update(f.bytes)
    lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return lengths, file_rows


def _row_figures(plan: PackPlan) -> np.ndarray:
    """int64[num_rows, 3]: segments, real tokens and sum of segment_len**2 of each plan row."""
    figs = np.zeros((plan.num_rows, 3), dtype=np.int64)
    if plan.num_rows:
        starts = plan.row_offsets[:-1]
        figs[:, 0] = np.diff(plan.row_offsets)
        figs[:, 1] = np.add.reduceat(plan.seg_len, starts)
        figs[:, 2] = np.add.reduceat(plan.seg_len * plan.seg_len, starts)
    return figs


def _shard_stats(capacity: int, figs: np.ndarray) -> PackStats:
    """Counts of some rows, from their :func:`_row_figures` (no tokens needed)."""
    segments, real, attn = (int(x) for x in figs.sum(axis=0))
    rows = figs.shape[0]
    return PackStats(capacity=capacity, rows=rows, segments=segments, real_tokens=real,
                     padding_tokens=rows * capacity - real, effective_targets=real - segments,
                     attention_work=attn)


def write_plan_shard(path: Path, cfg: PackConfig, schema, plan: PackPlan, rows: np.ndarray,
                     tokens: np.ndarray, doc_starts: np.ndarray, *, doc_id_offset: int = 0,
                     after_group=None) -> dict:
    """Lay out plan rows ``rows`` (int64[n], output order) and write them as one shard.

    Rows are laid out ``cfg.rows_per_group`` at a time (one Parquet row group each), so memory
    stays at one row group. ``doc_id_offset`` is added to ``doc_ids`` (windows number documents
    from their first one). ``after_group`` is called after each row group (a test hook).

    Returns:
        The manifest entry: ``{"file", "rows", "bytes", "sha256"}``.
    """
    def tables():
        for lo in range(0, rows.size, cfg.rows_per_group):
            packed = layout_rows(plan, rows[lo:lo + cfg.rows_per_group], tokens, doc_starts,
                                 pad_id=cfg.pad_id, labels=cfg.labels)
            if doc_id_offset:
                packed = dataclasses.replace(packed, doc_ids=packed.doc_ids + doc_id_offset)
            yield rows_to_table(packed, schema)
            if after_group is not None:
                after_group()

    size, digest = write_shard(path, schema, tables())  # sha256 taken while writing
    return {"file": path.name, "rows": int(rows.size), "bytes": size, "sha256": digest}


def write_manifest(out: Path, cfg: PackConfig, files: list[InputFile], file_rows: list[int],
                   outputs: list[dict], total: PackStats, **extra) -> dict:
    """Write the manifest (``OUTPUT/.packtool-manifest.parquet``, atomically, last) and drop the
    in-progress marker.

    ``extra`` adds top-level keys (the windowed engine adds ``windows``). Returns the manifest.
    """
    manifest = {
        "format_version": FORMAT_VERSION,
        "packtool_version": __version__,
        "options": cfg.layout_options(),
        "labels_shifted": cfg.labels.value == "shifted",
        "labels": {"stored": cfg.labels.value != "none",
                   "convention": labels_convention(cfg.labels.value)},
        "columns": packed_columns(cfg.labels.value),
        "inputs": [{"path": str(f.path), "rows": r, "bytes": f.bytes}
                   for f, r in zip(files, file_rows)],
        "outputs": outputs,
        **extra,
        "totals": total.to_dict(),
    }
    write_manifest_file(out, manifest, packed_schema(cfg.capacity, cfg.labels.value))
    (out / IN_PROGRESS_NAME).unlink(missing_ok=True)
    return manifest


def run_pack(cfg: PackConfig, *, progress: bool = True) -> PackResult:
    """Pack ``cfg.inputs`` into ``cfg.output`` (see the module docstring for the phases).

    Returns:
        :class:`PackResult` with the merged :class:`PackStats` and the manifest written.

    Raises:
        InputError, SchemaError: bad input (file, row and fix named).
        OutputError: OUTPUT cannot be used.
        PackingError: a document over capacity with ``--overflow error``.
    """
    if cfg.window_docs is not None:  # windowed mode, local or Ray: see packtool.windows
        from packtool.windows import run_windowed

        return run_windowed(cfg, progress=progress)
    t0 = time.perf_counter()
    show = progress and sys.stderr.isatty()
    files = discover_inputs(list(cfg.inputs))
    for f in files:  # unreadable files and bad schemas are refused before OUTPUT is touched
        open_input(f.path, cfg.column)
    fingerprint = _fingerprint(cfg, files)
    out = Path(cfg.output)
    out_existed = out.exists()
    resume = _prepare_output(cfg, files, fingerprint)
    tmp = out / TMP_DIR_NAME
    spill_path = tmp / "tokens.int32"
    try:
        lengths, file_rows = _read_and_spill(cfg, files, spill_path, show)
        log.info("read %d documents, %d tokens", lengths.size, int(lengths.sum()))
        if not lengths.any():
            where = files[0].path if len(files) == 1 else f"{len(files)} input files"
            what = (f"all {lengths.size} documents in column {cfg.column!r} are empty"
                    if lengths.size else "no documents (empty shards)")
            raise InputError(f"{where}: no tokens to pack: {what}; check the INPUT and --column")
        _test_pause("plan")
        if cfg.overflow is Overflow.ERROR and lengths.max() > cfg.capacity:
            bad = int(np.argmax(lengths > cfg.capacity))
            f = int(np.searchsorted(np.cumsum(file_rows), bad, side="right"))
            row = bad - sum(file_rows[:f])
            raise PackingError(f"{files[f].path}: row {row}: document {bad} has "
                               f"{int(lengths[bad])} tokens, more than --capacity {cfg.capacity}; "
                               "use --overflow split|truncate|drop or a larger --capacity")
        plan = pack_lengths(lengths, cfg.capacity, strategy=cfg.strategy, overflow=cfg.overflow)
    except PacktoolError:
        # bad input found while reading or planning: leave OUTPUT as it was before this run
        shutil.rmtree(tmp, ignore_errors=True)
        if not out_existed:
            shutil.rmtree(out, ignore_errors=True)
        elif not resume:
            (out / IN_PROGRESS_NAME).unlink(missing_ok=True)
        raise
    except KeyboardInterrupt:  # the spill file can be large; the marker stays for the rerun
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    doc_starts = np.zeros(lengths.size, dtype=np.int64)  # shape: (docs,)
    if lengths.size:
        np.cumsum(lengths[:-1], out=doc_starts[1:])
    n_tokens = int(lengths.sum())
    tokens = (np.memmap(spill_path, dtype=np.int32, mode="r", shape=(n_tokens,)) if n_tokens
              else np.zeros(0, dtype=np.int32))
    order = (np.random.default_rng(cfg.seed).permutation(plan.num_rows) if cfg.shuffle
             else np.arange(plan.num_rows))
    schema = packed_schema(cfg.capacity, cfg.labels.value)
    n_shards = -(-plan.num_rows // cfg.rows_per_shard)
    figs = _row_figures(plan)

    def do_shard(i: int):
        rows = order[i * cfg.rows_per_shard:(i + 1) * cfg.rows_per_shard]
        path = out / shard_name(i)
        reused = resume and path.is_file()
        if reused:
            entry = {"file": path.name, "rows": int(rows.size), "bytes": path.stat().st_size,
                     "sha256": sha256_file(path)}
        else:
            entry = write_plan_shard(path, cfg, schema, plan, rows, tokens, doc_starts,
                                     after_group=lambda: _test_pause("write-shard", i))
        return entry, _shard_stats(plan.capacity, figs[rows]), reused

    outputs, total, reused = [], PackStats(capacity=cfg.capacity), 0
    pool = ThreadPoolExecutor(max_workers=cfg.workers)
    try:
        with _progress(n_shards, "write", "shard", show) as bar:
            for entry, st, was_reused in pool.map(do_shard, range(n_shards)):
                outputs.append(entry)
                total = total + st
                reused += was_reused
                bar.update(1)
    except BaseException as exc:
        # shards being written finish under their temporary names and are renamed (complete);
        # queued ones are cancelled, so Ctrl-C stops within one shard
        pool.shutdown(wait=True, cancel_futures=True)
        if isinstance(exc, KeyboardInterrupt):  # finished shards stay for the rerun
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    pool.shutdown()
    total = total + PackStats.from_dict(plan.counts)  # documents/tokens read, split, lost
    shutil.rmtree(tmp, ignore_errors=True)
    _test_pause("manifest")
    manifest = write_manifest(out, cfg, files, file_rows, outputs, total)
    return PackResult(total, manifest, time.perf_counter() - t0, reused)
