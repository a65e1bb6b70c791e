"""``packtool verify``: prove that packed rows compute what separate documents compute.

The driver. The jobs live in their own modules:

* :mod:`packtool.verify.contract`: the output contract, NumPy only (runs without torch);
* :mod:`packtool.verify.runners`: one runner per attention backend with its device, dtype,
  tolerance and memory estimate;
* :mod:`packtool.verify.equivalence`: the measurement pass and the named model checks;
* :mod:`packtool.verify.report`: results and the verdict.

:func:`run_verify` checks the column contract (every row, or the sampled rows with
``scan_all=False``), then runs a sample of rows through every backend in batches that fit the
memory budget, comparing with per-document forwards computed once per batch and device. See
:mod:`packtool.verify.report` for when the verdict is OK: never by accident (no rows, every backend
skipped, or no row holding two documents all give a non-zero exit).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterable

import numpy as np

from packtool.errors import ConfigError
from packtool.verify.contract import (CONTRACT_CHECKS, DEFAULT_ROWS, PADDED_CHECK,
                                      check_row_contract, scan_contract, select_rows)
from packtool.verify.report import FAIL, PASS, SKIP, CheckResult, VerifyReport

log = logging.getLogger(__name__)

__all__ = ["ALL_BACKENDS", "ALL_CHECKS", "DEFAULT_ROWS", "CheckResult", "VerifyReport",
           "run_verify", "select_rows", "check_row_contract"]

ALL_BACKENDS = ("sdpa", "flex", "varlen", "flash", "hf", "hybrid", "mamba")
#: model checks, then the column checks (``--check`` accepts any of them)
ALL_CHECKS = ("logits_match", "isolation", "loss_denominator", "grad_zero_ignored",
              "grad_zero_padding", "finite") + CONTRACT_CHECKS


def _find_multi_doc_row(reader, seed: int) -> int | None:
    """Global index of a row holding two or more documents, reading only ``doc_ids``, or None
    when no row has two (a seeded pick among all such rows)."""
    hits = []
    for block in reader.iter_blocks(["doc_ids"]):
        n = np.diff(block.ragged["doc_ids"][1])
        hit = np.flatnonzero(n >= 2)
        if hit.size:
            hits.append(block.first + hit)
    if not hits:
        return None
    rows = np.concatenate(hits)
    return int(rows[np.random.default_rng(seed).integers(rows.size)])


def _say(progress, msg):
    log.info(msg)
    if progress:
        progress(msg)


def run_verify(
    path: str | os.PathLike,
    *,
    rows: int | None = None,
    seed: int = 0,
    backends: Iterable[str] | None = None,
    checks: Iterable[str] | None = None,
    batch_size: int = 4,
    compile: bool | None = None,
    attend_overrides: dict[str, Callable] | None = None,
    scan_all: bool = True,
    data_only: bool = False,
    device: str = "auto",
    max_memory: int | None = None,
    progress: Callable[[str], None] | None = None,
    check_hashes: bool = True,
    hf_config=None,
) -> VerifyReport:
    """Verify a packed output directory.

    Args:
        path: the packed output: a directory, a ``file:`` URI or a store URI.
        rows: rows run through the models (``None``: :data:`DEFAULT_ROWS`; ``0``: all), spread
            over all shards and drawn from rows holding two documents or more.
        seed: seeds the row sample and the test models.
        backends: backends to run, each then required (a skip makes the verdict false); None runs
            every backend that can run here and lists the others as skipped, not required.
        checks: checks to report (any of :data:`ALL_CHECKS`); None: all.
        batch_size: most rows per forward pass (B); fewer when the memory budget says so.
        compile: FlexAttention through ``torch.compile``; None decides by device and capacity.
        attend_overrides: ``{backend: factory(batch, device) -> attend}`` replacing a backend's
            attention (negative controls: a broken mask must make verify fail).
        scan_all: check the columns of every row (NumPy, streaming by row group); False: only the
            sampled rows, plus, when none of them holds two documents, the first such row found
            by reading ``doc_ids`` alone.
        data_only: the column checks only (no torch needed); the verdict then does not ask for
            an attention check.
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda`` for sdpa, flex and hf.
        max_memory: bytes for model passes (None: derived, see
            :func:`~packtool.verify.runners.memory_budget`).
        progress: ``callable(str)`` told what runs, one line per backend and batch.
        check_hashes: compare every shard's sha256 with the manifest before anything else
            (False: sizes, footers and the page checksums of what is read).
        hf_config: a Hugging Face config (a ``PretrainedConfig``, or a ``config.json`` path,
            its directory or a cached model name: never downloaded) whose architecture the
            ``hf`` backend builds, shrunk, instead of its tiny Llama; without ``backends`` only
            ``hf`` runs. A leak is reported as "documents leak in <layer>: this model needs ...".

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is the verdict.

    Raises:
        ConfigError: unknown backend or check, batch_size < 1, bad device or memory size.
        InputError: ``hf_config`` names no usable config (:func:`~packtool.verify.hf_model.load_hf_config`).
        ManifestError: not a complete packed output, or a shard that differs from its manifest.
        MissingDependencyError: torch is missing and ``data_only`` is False.
    """
    from packtool.formats.packed import PackedOutput

    if hf_config is not None and not data_only:
        if isinstance(hf_config, (str, os.PathLike)):
            from packtool.verify.hf_model import load_hf_config

            hf_config = load_hf_config(str(hf_config))
        if backends is None:
            backends = ["hf"]  # the user's model is the question
    explicit = backends is not None
    backends = list(dict.fromkeys(backends)) if explicit else list(ALL_BACKENDS)
    unknown = [b for b in backends if b not in ALL_BACKENDS]
    if unknown:
        raise ConfigError(f"unknown backend(s) {unknown}; choose from {', '.join(ALL_BACKENDS)}")
    wanted = set(ALL_CHECKS) if checks is None else set(checks)
    bad_checks = sorted(wanted - set(ALL_CHECKS))
    if bad_checks:
        raise ConfigError(f"unknown check(s) {bad_checks}; choose from {', '.join(ALL_CHECKS)}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device {device!r}: choose auto, cpu or cuda")
    if explicit and not backends and not data_only:
        raise ConfigError("no backend given; name one with --backend or pass --data-only")

    if not data_only:  # say it before the column scan, not after it
        from packtool.verify import has_torch

        if not has_torch():
            from packtool.errors import MissingDependencyError, install_hint

            raise MissingDependencyError(
                "torch is not installed; packtool verify runs its attention checks with it: "
                + install_hint("verify") + "; or pass --data-only to check the columns alone "
                "(NumPy, no torch)")
    t0 = time.perf_counter()
    reader = PackedOutput.open(path, integrity="sha256" if check_hashes else "footer")
    if check_hashes:
        _say(progress, f"verify: sha256 of {len(reader.shards)} shard(s) checked "
             f"({time.perf_counter() - t0:.1f} s; --no-hash skips it)")
    convention = reader.labels.convention
    n_rows = reader.num_rows
    # an input labels column (SFT prompt masking) leaves some targets -100 on purpose
    label_masked = reader.manifest.label_masked
    report = VerifyReport(reader.location.display, [], n_rows, data_only)
    if n_rows == 0:
        return report

    # 1. the column contract
    _say(progress, f"verify: data: checking the column contract of "
         f"{'all ' + str(n_rows) if scan_all else 'the sampled'} rows")
    if scan_all:
        scan = scan_contract(reader, convention, label_masked=label_masked)
        seg = np.zeros(n_rows, dtype=np.int64)  # shape: (num_rows,)
        for g, k in scan.segments.items():
            seg[g] = k
        multi = np.flatnonzero(seg >= 2)
        pool = multi if multi.size else np.arange(n_rows)
        idx = pool[select_rows(pool.size, rows, seed)]
    else:
        idx = select_rows(n_rows, rows, seed)
        scan = scan_contract(reader, convention, indices=idx, label_masked=label_masked)
        if not data_only and all(scan.segments[int(i)] < 2 for i in idx):
            extra = _find_multi_doc_row(reader, seed)
            if extra is None:
                report.notes.append("no row of the output holds two or more documents")
            else:
                report.notes.append(f"no sampled row held two documents; added row {extra}, "
                                    "found by reading doc_ids")
                more = scan_contract(reader, convention, indices=[extra],
                                     label_masked=label_masked)
                for k, v in more.bad.items():
                    scan.bad.setdefault(k, []).extend(v)
                scan.segments.update(more.segments)
                scan.rows_checked += more.rows_checked
                idx = np.sort(np.append(idx, extra))
    for check in CONTRACT_CHECKS:
        if check not in wanted:
            continue
        bad = scan.bad.get(check, [])
        if check == PADDED_CHECK and scan.segment_multiple == 1 and not bad:
            if checks is not None:  # asked for by name: say why it does not apply
                report.add(CheckResult("data", check, SKIP, {}, None, "not stored: packed "
                                       "without --segment-multiple (equal to cu_seqlens)",
                                       required=False))
            continue
        figs = {"rows_checked": scan.rows_checked, "rows_bad": len(bad)}
        if check == "cu_seqlens" and scan.segment_multiple > 1:
            figs["segment_multiple"] = scan.segment_multiple
        if check == "labels" and not scan.labels_stored:
            figs["labels"] = f"not stored; derived ({convention})"
        report.add(CheckResult("data", check, FAIL if bad else PASS, figs,
                               bad[0][0] if bad else None, bad[0][1] if bad else ""))
    _say(progress, f"verify: data: {scan.rows_checked} rows checked "
         f"({time.perf_counter() - t0:.1f} s)")
    if data_only:
        return report

    _run_models(report, reader, [int(i) for i in idx], reader.capacity, convention, explicit,
                backends, wanted, seed, batch_size, compile, attend_overrides or {}, device,
                max_memory, progress, label_masked, hf_config)
    _say(progress, f"verify: done in {time.perf_counter() - t0:.1f} s")
    return report


def _run_models(report, reader, idx, capacity, convention, explicit, backends, wanted, seed,
                batch_size, compile, overrides, device, max_memory, progress, label_masked,
                hf_config=None):
    """Run the sampled rows through every backend and add the model checks to ``report``."""
    from packtool.verify import has_cuda, require_torch

    torch = require_torch()
    from packtool.verify.equivalence import MODEL_CHECKS, Measurements, measure_batch, run_checks
    from packtool.loader import PackedDataset, collate
    from packtool.verify.model import build_model
    from packtool.verify.runners import make_runner, memory_budget, unavailable

    dev = ("cuda" if has_cuda() else "cpu") if device == "auto" else device
    try:
        budget = memory_budget(max_memory)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    report.notes.append(f"memory budget {budget}")
    model_checks = [c for c in MODEL_CHECKS if c in wanted]
    base = build_model(seed=seed)
    runners = []
    for name in backends:
        reason = unavailable(name, dev)
        runner = None
        if not reason:
            runner, reason = make_runner(name, base, device=dev, capacity=capacity,
                                         budget=budget, seed=seed, compile=compile,
                                         hf_config=hf_config)
        if runner is None:
            report.add(CheckResult(name, "all", SKIP, {}, None, reason, required=explicit))
            _say(progress, f"verify: {name}: skipped ({reason})")
            continue
        runners.append(runner)
    if not runners or not model_checks:
        return
    per_row = max(r.row_bytes(capacity) for r in runners)
    B = int(max(1, min(batch_size, budget.bytes // max(per_row, 1))))
    report.notes.append(f"{len(idx)} rows in batches of {B}")
    # the rows through the loader's own dataset, on the same reader, with the labels the
    # checks below expect; the stored segment_ids / position_ids go through the models (the
    # loader's default derives them from cu_seqlens, which the column checks prove equal)
    ds = PackedDataset(reader, labels=convention, structure="stored")
    items = [ds[i] for i in idx]
    report.rows = [(it["shard"], it["row"]) for it in items]
    shifted = convention == "shifted"
    meas = {r.name: Measurements(r.name, r.device, r.dtype_name, r.backward,
                                 r.no_backward_reason, extra=r.describe(),
                                 grad_pad_tol=getattr(r, "grad_pad_tol", 0.0)) for r in runners}
    failed: dict[str, str] = {}
    elapsed = {r.name: 0.0 for r in runners}
    leak_probe = None  # a batch holding a multi-document row, to locate a leak in
    nb = -(-len(items) // B)
    prev_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        for bi in range(nb):
            chunk = items[bi * B:(bi + 1) * B]
            batch = collate(chunk)
            spans = [_spans(it) for it in chunk]
            if leak_probe is None and any(len(sp) >= 2 for sp in spans):
                leak_probe = (batch, spans)
            docs = [[batch["input_ids"][r, a:b] for a, b in sp] for r, sp in enumerate(spans)]
            flat_docs = [d for row in docs for d in row]
            refs_by_key: dict = {}
            for runner in runners:
                if runner.name in failed:
                    continue
                t = time.perf_counter()
                _say(progress, f"verify: [{bi + 1}/{nb}] {runner.name} ({runner.device}, "
                     f"{runner.dtype_name}): {len(chunk)} rows of {capacity}")
                try:
                    with torch.no_grad():
                        key = runner.ref_key
                        if key not in refs_by_key:
                            refs_by_key[key] = _doc_refs(runner, flat_docs, docs, budget.bytes,
                                                         batch["labels"], spans, shifted,
                                                         label_masked)
                        refs = refs_by_key[key]
                        if runner.dtype != torch.float32:
                            lo = runner.reference(flat_docs, budget.bytes, model=runner.model)
                            ref_flat = [d for row in refs for d in row]
                            runner.eager_error = max([runner.eager_error] + [
                                float((a.float() - b[0]).abs().max())
                                for a, b in zip(lo, ref_flat)])
                    measure_batch(meas[runner.name], runner, batch, spans, refs, shifted,
                                  overrides.get(runner.name))
                except Exception as exc:  # an available backend that breaks is a failure
                    if isinstance(exc, (KeyboardInterrupt, MemoryError)):
                        raise
                    msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    failed[runner.name] = msg
                    log.debug("backend %s raised", runner.name, exc_info=True)
                elapsed[runner.name] += time.perf_counter() - t
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev_tf32
    for runner in runners:
        name = runner.name
        if name in failed:
            report.add(CheckResult(name, "run", FAIL, runner.describe(), None,
                                   f"the backend raised {failed[name]}", True, runner.device,
                                   runner.dtype_name))
            _say(progress, f"verify: {name}: FAILED to run: {failed[name]}")
            continue
        m = meas[name]
        if runner.dtype != torch.float32:
            m.extra["eager_bf16_max_abs_diff"] = runner.eager_error
        m.extra.update(runner.describe())  # what the run learnt (e.g. seq_idx refused)
        m.extra["seconds"] = round(elapsed[name], 2)
        res = run_checks(m, model_checks)
        leaked = [r for c, r in res.items() if c in ("logits_match", "isolation")
                  and r.status == FAIL]
        if leaked and leak_probe is not None and hasattr(runner, "diagnose"):
            try:
                why = runner.diagnose(*leak_probe)
            except Exception as exc:  # the diagnosis is a help, never a new failure
                log.debug("leak diagnosis failed", exc_info=True)
                why = f"(could not locate the leak: {type(exc).__name__}: {exc})"
            for r in leaked:
                r.message = f"{why}; {r.message}" if r.message else why
        for r in res.values():
            if r.status == SKIP and not explicit and r.check == "grad_zero_padding":
                r.required = False
            report.add(r)
        bad = [c for c, r in res.items() if r.status == FAIL]
        _say(progress, f"verify: {name} ({runner.device}, {runner.dtype_name}): "
             f"{'FAIL ' + ', '.join(bad) if bad else 'pass'} in {elapsed[name]:.1f} s")


def _spans(item) -> list:
    """Real document spans [(a, b)] of one row, cut by its stored cu_seqlens (with
    ``--segment-multiple``: the first len(doc_ids) spans, each cut to its real length from
    ``cu_seqlens_unpadded``)."""
    cu = [int(x) for x in np.asarray(item["cu_seqlens"])]
    unpadded = item.get("cu_seqlens_unpadded")
    if unpadded is not None:
        real = np.diff(np.asarray(unpadded, dtype=np.int64))
        return [(cu[q], cu[q] + int(real[q])) for q in range(min(len(item["doc_ids"]),
                                                                  len(cu) - 1))]
    seg = np.asarray(item["segment_ids"])
    real = int(np.count_nonzero(seg))
    return [(a, min(b, real)) for a, b in zip(cu[:-1], cu[1:]) if a < real]


def _doc_refs(runner, flat_docs, docs, budget_bytes, labels_BC, spans, shifted, label_masked):
    """Per row, per document: (float32 logits [L, V], loss sum, targets) of the document alone.

    The targets of a document are its tokens 1..L-1 whose label is kept (all of them unless the
    pack read input label masks, which leave some -100 on purpose).
    """
    from packtool.types import IGNORE_INDEX
    from packtool.verify import require_torch

    torch = require_torch()
    F = torch.nn.functional
    logits = runner.reference(flat_docs, budget_bytes)
    out, k = [], 0
    for r, row in enumerate(docs):
        row_refs = []
        for (a, b), toks in zip(spans[r], row):
            lg = logits[k]
            k += 1
            L = int(toks.shape[0])
            lab = labels_BC[r, a:b - 1] if shifted else labels_BC[r, a + 1:b]
            keep = ((lab != IGNORE_INDEX) if label_masked
                    else torch.ones(max(L - 1, 0), dtype=torch.bool)).to(lg.device)
            n = int(keep.sum()) if L > 1 else 0
            tgt = toks[1:].to(lg.device).long() % lg.shape[-1]  # the loss takes Long targets
            s = float(F.cross_entropy(lg[:-1][keep], tgt[keep], reduction="sum")) if n else 0.0
            row_refs.append((lg, s, n))
        out.append(row_refs)
    return out
