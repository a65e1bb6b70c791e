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
import math
import os
import time
from typing import Callable, Iterable

import numpy as np

from packtool.errors import ConfigError, exc_line
from packtool.types import IGNORE_INDEX
from packtool.verify.contract import (CONTRACT_CHECKS, DEFAULT_ROWS, PADDED_CHECK,
                                      WHOLE_OUTPUT_CHECKS, check_row_contract, pad_target_span,
                                      scan_contract, select_rows)
from packtool.verify.report import FAIL, PASS, SKIP, CheckResult, VerifyReport
from packtool.stats import plural

log = logging.getLogger(__name__)

__all__ = ["ALL_BACKENDS", "ALL_CHECKS", "DEFAULT_ROWS", "DEFAULT_ROW_WINDOW", "CheckResult",
           "VerifyReport", "run_verify", "row_windows", "row_window_ok", "estimate_seconds",
           "place_probe",
           "select_rows", "check_row_contract", "negative_control"]

ALL_BACKENDS = ("sdpa", "flex", "varlen", "flash", "hf", "hybrid", "mamba")
#: model checks, then the column checks (``--check`` accepts any of them)
ALL_CHECKS = ("logits_match", "isolation", "loss_denominator", "grad_zero_ignored",
              "grad_zero_padding", "finite") + CONTRACT_CHECKS


def _row_sets(reader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global indices (int64, sorted) of the rows holding two or more documents, of those holding
    a target, and of those holding padding, reading only ``doc_ids``, ``num_targets`` and
    ``cu_seqlens`` (with ``--segment-multiple``, ``cu_seqlens_unpadded``).

    A row holds padding when its documents' real tokens end before C: ``cu_seqlens`` (with
    ``--segment-multiple``, ``cu_seqlens_unpadded``, the real lengths summed) at its
    ``len(doc_ids)``-th entry is below C."""
    ends = "cu_seqlens_unpadded" if "cu_seqlens_unpadded" in reader.columns else "cu_seqlens"
    multi, targeted, padded = [], [], []
    for block in reader.iter_blocks(["doc_ids", "num_targets", ends]):
        n = np.diff(block.ragged["doc_ids"][1])  # shape: (R,)
        v, off = block.ragged[ends]
        at = np.minimum(off[:-1] + n, off[1:] - 1)  # each row's entry after its documents
        multi.append(block.first + np.flatnonzero(n >= 2))
        targeted.append(block.first + np.flatnonzero(np.asarray(block.scalars["num_targets"]) > 0))
        padded.append(block.first + np.flatnonzero(v[np.maximum(at, 0)] < reader.capacity))
    join = (lambda parts: np.concatenate(parts).astype(np.int64) if parts
            else np.zeros(0, dtype=np.int64))
    return join(multi), join(targeted), join(padded)


def _pick(seed: int, *tiers: np.ndarray) -> int | None:
    """A seeded pick among the rows of the first non-empty tier, or None when all are empty."""
    for t in tiers:
        if t.size:
            return int(t[np.random.default_rng(seed).integers(t.size)])
    return None


def _rows_to_add(idx: np.ndarray, multi: np.ndarray, targeted: np.ndarray, padded: np.ndarray,
                 seed: int, found: str = "",
                 reachable: np.ndarray | None = None) -> list[tuple[int, str]]:
    """The rows to run beside the sampled ``idx`` so that every model check has something to
    measure where the output has it, each with the note that says why: a row holding two
    documents (``isolation``), a row holding a target (``loss_denominator``, the gradient
    checks: without a target there is no loss), a row holding padding and a target
    (``grad_zero_padding``); each holding the others' features too where a row does.

    Args:
        idx: int64[k], the sampled rows; multi, targeted, padded: int64 sorted global indices
            of the rows holding two documents, a target, padding (all of them or those known).
        found: how the rows were found, added to each note.
        reachable: int64 sorted global indices of the rows holding padding and a target that
            one row window holds together (``ContractScan.pad_target_rows``), taken first for
            ``grad_zero_padding``; None: not known (``--no-scan``).
    """
    out: list[tuple[int, str]] = []
    run = set(idx.tolist())
    multi_t = np.intersect1d(multi, targeted)

    def add(row, note):
        out.append((row, note))
        run.add(row)

    def has(rows) -> bool:
        return bool(np.isin(np.fromiter(run, np.int64, len(run)), rows).any())

    if multi.size and not has(multi):
        row = _pick(seed, multi_t, multi)
        add(row, f"no sampled row held two documents; added row {row}{found}")
    if targeted.size and not has(targeted):
        row = _pick(seed, multi_t, targeted)
        add(row, f"no sampled row holds a target; added row {row}, which does{found}")
    padded_t = np.intersect1d(padded, targeted)
    reach = np.zeros(0, dtype=np.int64) if reachable is None else reachable
    need = next((p for p in (reach, padded_t) if p.size), padded)
    if need.size and not has(need):
        row = _pick(seed, np.intersect1d(need, multi), need)
        what = ("no sampled row has padding" if not has(padded) else
                "no sampled row with padding holds a target" if not has(padded_t) else
                "no sampled row holds padding and a target close enough for one window")
        add(row, f"{what}; added row {row}, which does{found}")
    return out


def _scan_more(scan, reader, convention: str, row: int, label_masked: bool) -> None:
    """Check the column contract of one more row and add what it found to ``scan``."""
    more = scan_contract(reader, convention, indices=[row], label_masked=label_masked)
    for k, v in more.bad.items():
        scan.bad.setdefault(k, []).extend(v)
    scan.segments.update(more.segments)
    scan.padded.extend(more.padded)
    scan.targeted.extend(more.targeted)
    scan.pad_target.update(more.pad_target)
    scan.rows_checked += more.rows_checked


def _longest_span(reader) -> int:
    """The longest ``cu_seqlens`` span of every row of the output (its largest
    ``max_seqlen``, a document piece or the padding tail), reading that column alone: positions
    restart at 0 in each span, so training feeds positions up to this less one."""
    longest = 0
    for block in reader.iter_blocks(["max_seqlen"]):
        v = block.scalars["max_seqlen"]
        if len(v):
            longest = max(longest, int(np.max(v)))
    return longest


def _later_documents(reader) -> tuple[int, int]:
    """:func:`~packtool.verify.contract.later_documents` over every row of the output, reading
    ``doc_ids`` and ``cu_seqlens`` alone (with ``--segment-multiple`` also
    ``cu_seqlens_unpadded``): ``(start, end)`` in tokens, ``(0, 0)`` when no row holds two
    documents."""
    from packtool.verify.contract import later_documents

    cols = ["doc_ids", "cu_seqlens"]
    if "cu_seqlens_unpadded" in reader.columns:
        cols.append("cu_seqlens_unpadded")
    start = end = 0
    for block in reader.iter_blocks(cols):
        a, b = later_documents(block.ragged, reader.capacity)
        start, end = max(start, a), max(end, b)
    return start, end


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
    row_window: int | None = None,
    indices: Iterable[int] | None = None,
) -> VerifyReport:
    """Verify a packed output directory.

    Args:
        path: the packed output: a directory, a ``file:`` URI or a store URI.
        rows: rows run through the models (``None``: :data:`DEFAULT_ROWS`; ``0``: all), spread
            over all shards and drawn from rows holding two documents or more; when none of
            them has padding and the output has some, one padded row more (holding two
            documents if one does), so that the padding checks run.
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
        progress: ``callable(str)`` told what runs, one line per backend and batch, after a
            first line saying how long verify expects to take (:func:`estimate_seconds`).
        check_hashes: compare every shard's sha256 with the manifest before anything else
            (False: sizes, footers and the page checksums of what is read).
        hf_config: a Hugging Face config (a ``PretrainedConfig``, or a ``config.json`` path,
            its directory or a cached model name: never downloaded) whose architecture the
            ``hf`` backend builds, shrunk, instead of its tiny Llama; without ``backends`` only
            ``hf`` runs. A leak is reported as "documents leak in <layer>: this model needs ...".
        row_window: the model checks run on windows of this many tokens of each sampled row
            (:func:`row_windows`: each across a document boundary, one into the padding tail
            when the row has one, and where the row lets one hold them, padding with a target
            and a target), at least 2; None: :data:`DEFAULT_ROW_WINDOW`; 0 or at least C: whole
            rows. The column scan always covers every token of every row.
        indices: global row indices (int, 0 .. num_rows - 1) to run through the models
            exactly, no row sampled or added (``report.indices`` of an earlier run: the
            negative control, :func:`negative_control`); the column contract is then checked
            on these rows only, as with ``scan_all=False``. None: sample as above.

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is the verdict, ``report.indices`` the global
        indices of the rows run through the models.

    Raises:
        ConfigError: unknown backend or check, batch_size < 1, bad device or memory size, a
            ``row_window`` below 0 or of 1, an index in ``indices`` outside the output's rows.
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
    asked_models = sorted(c for c in wanted if c not in CONTRACT_CHECKS)
    if data_only and checks is not None and asked_models:  # would pass having checked nothing
        raise ConfigError(f"--check {asked_models[0]} runs the model, and --data-only runs none; "
                          "drop one of them")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device {device!r}: choose auto, cpu or cuda")
    if explicit and not backends and not data_only:
        raise ConfigError("no backend given; name one with --backend or pass --data-only")
    if row_window is not None and not row_window_ok(row_window):
        raise ConfigError(f"row_window must be 0 (whole rows) or >= 2 tokens, got {row_window}")

    if not data_only:  # say it before the column scan, not after it
        from packtool.verify import has_torch

        if not has_torch():
            from packtool.errors import MissingDependencyError, install_hint

            raise MissingDependencyError(
                "torch is not installed; packtool verify runs its attention checks with it: "
                + install_hint("verify") + "; or pass --data-only to check the columns alone "
                "(NumPy, no torch)")
    window = None
    if progress:  # before any work: what verify expects to take, from the manifest alone
        from packtool.formats.manifest import read_manifest

        m = read_manifest(path)
        if m.is_packed and m.num_rows:
            window = _window_tokens(m.capacity, row_window)
            est = estimate_seconds(m.num_rows if scan_all else 0, m.capacity,
                                   0 if data_only else (rows or DEFAULT_ROWS) if rows != 0
                                   else m.num_rows, window, backends, explicit, device, compile,
                                   hash_bytes=sum(s.bytes for s in m.shards)
                                   if check_hashes else 0)
            progress(f"verify: expecting about {_duration(est['total'])} on an idle machine "
                     f"({est['detail']})")
    t0 = time.perf_counter()  # the sha256 alone, not the estimate above
    # with the scan, its totals check recounts every total (rows included) and fails; without
    # it (--no-scan: no totals check) rows that do not add up are refused as every reader does
    reader = PackedOutput.open(path, integrity="sha256" if check_hashes else "footer",
                               rows_add_up=not scan_all, reopen="rerun the same packtool verify")
    if check_hashes:
        _say(progress, f"verify: sha256 of {plural(len(reader.shards), 'shard')} checked "
             f"({time.perf_counter() - t0:.1f} s; --no-hash skips it)")
    convention = reader.labels.convention
    n_rows = reader.num_rows
    # an input labels column (SFT prompt masking) leaves some targets -100 on purpose
    label_masked = reader.manifest.label_masked
    report = VerifyReport(reader.location.display, [], n_rows, data_only,
                          models_wanted=bool(asked_models))
    if n_rows == 0:
        return report
    window = _window_tokens(reader.capacity, row_window)
    # where the output's documents after a row's first lie at the farthest (start, end); None:
    # not known from the rows scanned (read from cu_seqlens when the far-token probe asks)
    reach = None

    # 1. the column contract
    _say(progress, "verify: data: checking the column contract of "
         + ("all " + plural(n_rows, "row") if scan_all else "the sampled rows"))
    if indices is not None:  # exactly these rows (the negative control: the main run's)
        idx = np.unique(np.asarray(list(indices), dtype=np.int64))
        out_of_range = idx[(idx < 0) | (idx >= n_rows)]
        if out_of_range.size:
            raise ConfigError(f"row index {int(out_of_range[0])} is outside the output's "
                              f"{plural(n_rows, 'row')} (0 .. {n_rows - 1})")
        scan = scan_contract(reader, convention, indices=idx, label_masked=label_masked)
        multi = np.array([i for i in idx.tolist() if scan.segments[i] >= 2], dtype=np.int64)
        report.multi_doc_rows = bool(multi.size) or None
        has_targets = bool(scan.target_rows().size)
        has_padded_targets = bool(scan.pad_target_rows(window).size)
    elif scan_all:
        scan = scan_contract(reader, convention, label_masked=label_masked)
        seg = np.zeros(n_rows, dtype=np.int64)  # shape: (num_rows,)
        for g, k in scan.segments.items():
            seg[g] = k
        multi = np.flatnonzero(seg >= 2)
        targeted = scan.target_rows()
        report.multi_doc_rows = bool(multi.size)
        reach = (scan.far_start, scan.far_end)  # every row scanned: the output's own
        # what the output holds for the loss and gradient checks to measure
        has_targets = bool(targeted.size)
        # grad_zero_padding measures a window holding both padding and a target
        has_padded_targets = bool(scan.pad_target_rows(window).size)
        # drawn from the rows holding two documents (all rows when none does), those holding a
        # target first: every model check measures them
        pool = multi if multi.size else np.arange(n_rows, dtype=np.int64)
        first = np.intersect1d(pool, targeted)
        idx = first[select_rows(first.size, rows, seed)]
        want = DEFAULT_ROWS if rows is None else rows
        rest = np.setdiff1d(pool, first)
        if rest.size and (want <= 0 or idx.size < want):
            idx = np.union1d(idx, rest[select_rows(rest.size, want - idx.size if want > 0 else 0,
                                                   seed)])
        if not data_only:
            extra = _rows_to_add(idx, multi, targeted, scan.padded_rows(), seed,
                                 reachable=scan.pad_target_rows(window))
            report.notes.extend(note for _, note in extra)
            idx = np.unique(np.append(idx, [r for r, _ in extra]).astype(np.int64))
    else:
        idx = select_rows(n_rows, rows, seed)
        scan = scan_contract(reader, convention, indices=idx, label_masked=label_masked)
        multi = np.array([i for i in idx.tolist() if scan.segments[i] >= 2], dtype=np.int64)
        targeted = scan.target_rows()
        report.multi_doc_rows = bool(multi.size) or None
        has_targets = bool(targeted.size)
        has_padded_targets = bool(scan.pad_target_rows(window).size)
        if not data_only and not (np.intersect1d(multi, targeted).size and has_padded_targets):
            # what the sample lacks may be elsewhere: the cheap columns of every row say
            multi, targeted, padded = _row_sets(reader)
            report.multi_doc_rows = bool(multi.size)
            has_targets = bool(targeted.size)
            if not multi.size:
                report.notes.append("no row of the output holds two or more documents")
            for row, note in _rows_to_add(idx, multi, targeted, padded, seed,
                                          ", found by reading doc_ids, num_targets and "
                                          "cu_seqlens"):
                report.notes.append(note)
                _scan_more(scan, reader, convention, row, label_masked)
                idx = np.sort(np.append(idx, row))
            # the labels of the rows scanned say whether a window holds padding and a target
            has_padded_targets = bool(scan.pad_target_rows(window).size)
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
        why = scan.not_run.get(check)
        if check == "padding" and "pad_id" not in reader.manifest.options:
            why = "the manifest records no pad_id"
        elif (check == "padding" and not scan.padded_rows().size
              and not scan.bad.get("segment_ids")):  # segment_ids rebuilt from cu_seqlens
            why = "no padding in the rows checked: no token outside a document to compare"
        if why and not bad:
            report.add(CheckResult("data", check, SKIP, {"rows_checked": scan.rows_checked},
                                   None, why, required=checks is not None))
            continue
        figs = {"rows_checked": scan.rows_checked, "rows_bad": len(bad)}
        if check == "totals":
            figs = {"rows_checked": scan.rows_checked, "figures_wrong": len(bad)}
        if check == "padding":
            figs["pad_id"] = reader.manifest.options["pad_id"]
        if check == "cu_seqlens" and scan.segment_multiple > 1:
            figs["segment_multiple"] = scan.segment_multiple
        if check == "labels" and not scan.labels_stored:
            figs["labels"] = f"not stored; derived ({convention})"
        report.add(CheckResult("data", check, FAIL if bad else PASS, figs,
                               bad[0][0] if bad else None, bad[0][1] if bad else ""))
    _say(progress, f"verify: data: {plural(scan.rows_checked, 'row')} checked "
         f"({time.perf_counter() - t0:.1f} s)")
    if data_only:
        return report

    report.indices = [int(i) for i in idx]
    if report.multi_doc_rows is False:
        reach = (0, 0)
    _run_models(report, reader, [int(i) for i in idx], reader.capacity, convention, explicit,
                backends, wanted, seed, batch_size, compile, attend_overrides or {}, device,
                max_memory, progress, label_masked, window, hf_config, scan.bad, reach)
    from packtool.verify.equivalence import NO_PADDED_TARGETS, NO_PADDING, NO_TARGETS

    # a check the output gives nothing to look at (no padding in the rows run; no boundary
    # between documents anywhere, B22; no target anywhere, so no loss) is skipped, required
    # only when named with --check
    for r in report.results:
        no_boundary = r.check == "isolation" and report.multi_doc_rows is False
        no_targets = ((r.message == NO_TARGETS and not has_targets)
                      or (r.message == NO_PADDED_TARGETS and not has_padded_targets))
        if r.status == SKIP and (no_boundary or no_targets or r.message == NO_PADDING):
            r.required = checks is not None and r.check in checks
            if no_boundary:
                r.message = "no row of the output holds two or more documents"
            elif r.message == NO_TARGETS:
                r.message = ("no row of the output holds a target (a label other than -100): "
                             "no loss, so nothing to compare and no gradient to look at")
            elif no_targets and window < reader.capacity and scan.pad_target:
                # rows hold both, but never within one window: no window verify could run
                # holds what the check needs
                closest = min(scan.pad_target.values())
                r.message = (f"no window of --row-window {window} tokens holds both padding "
                             f"and a target: the closest such pair in the rows "
                             f"{'scanned' if not scan_all else 'of the output'} takes "
                             f"{closest} tokens; pass --row-window {closest} or more (0: "
                             "whole rows) to measure it")
            elif no_targets:
                r.message = ("no row of the output holds both padding and a target: no loss "
                             "gradient could reach the padding")
        elif (r.status == SKIP and r.check == "isolation" and report.windows
              and report.multi_doc_rows and not r.figures.get("rows_multi_doc")):
            # rows with two documents were run, but no window of them held a boundary (a
            # window of 2 cannot reach across a --segment-multiple span's padding)
            r.message = (f"no window of --row-window {window} tokens run through the model "
                         "holds two documents, though the rows do; pass a larger --row-window "
                         "(0: whole rows)")
    _say(progress, f"verify: done in {time.perf_counter() - t0:.1f} s")
    return report


def negative_control(path: str | os.PathLike, *, rows: int | None = None, seed: int = 0,
                     batch_size: int = 4, device: str = "auto", max_memory: int | None = None,
                     row_window: int | None = None, scan_all: bool = True,
                     indices: Iterable[int] | None = None) -> dict:
    """Run the ``sdpa`` checks once more on the same sampled rows with a plain causal mask (no
    document blocks, what packing without a mask computes), which a packed row must fail: the
    proof that verify would have caught a leak on this output (B02, B29).

    Args:
        path, rows, seed, batch_size, device, max_memory, row_window, scan_all: as
            :func:`run_verify`; without ``indices`` the rows are sampled as it samples them
            with these (the column scan of every row included with ``scan_all``).
        indices: the global row indices the model checks ran on (``report.indices`` of the
            :func:`run_verify` this controls): exactly these rows, and their row windows, run
            again, with no new sample and no column scan of the other rows.

    Returns:
        ``{"mask": "plain causal", "backend": "sdpa", "caught": bool, "check": str | None,
        "where": dict | None, "figures": dict, "rows": [{"shard", "row"}], "windows": int}``:
        ``caught`` when ``isolation`` or ``logits_match`` failed (``check``, ``where`` and
        ``figures`` of the first such failure); False means verify could not tell this broken
        mask from a good one here (no row run holds two documents); ``applicable``: False
        when it is known that no row of the output holds two documents (nothing can leak
        between documents, so no check can catch the mask; with ``indices``, known only when
        none of them does and the caller knows the rest: ``verify --negative-control`` sets it
        from its report); ``rows`` and ``windows`` as in the report of :func:`run_verify`.

    Raises:
        As :func:`run_verify`.
    """
    from packtool.verify import require_torch

    torch = require_torch()
    F = torch.nn.functional

    def plain(batch, device):
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)

    rep = run_verify(path, rows=rows, seed=seed, backends=["sdpa"],
                     checks=["isolation", "logits_match"], batch_size=batch_size,
                     attend_overrides={"sdpa": plain}, scan_all=scan_all, device=device,
                     max_memory=max_memory, check_hashes=False, row_window=row_window,
                     indices=indices)
    bad = [r for r in rep.results if r.backend == "sdpa" and r.status == FAIL
           and r.check in ("isolation", "logits_match")]
    first = bad[0] if bad else None
    return {"mask": "plain causal", "backend": "sdpa", "caught": first is not None,
            "check": first.check if first else None, "where": first.where if first else None,
            "figures": dict(first.figures) if first else {},
            "applicable": rep.multi_doc_rows is not False,
            "rows": [{"shard": s, "row": r} for s, r in rep.rows], "windows": rep.windows}


def row_window_ok(window: int) -> bool:
    """True for a ``row_window`` the model checks can run: 0 (whole rows) or 2 tokens or more
    (a one-token window has nothing to predict; :func:`row_windows`)."""
    return window == 0 or window >= 2


def _run_models(report, reader, idx, capacity, convention, explicit, backends, wanted, seed,
                batch_size, compile, overrides, device, max_memory, progress, label_masked,
                window, hf_config=None, contract_bad=None, reach=None):
    """Run the sampled rows (their row windows of ``window`` tokens) through every backend and
    add the model checks to ``report``.

    ``contract_bad`` is the column scan's ``{check: [(where, message)]}`` (every column check,
    asked for or not): a model check that fails on rows breaking the contract blames the data,
    also when ``--check`` left the column check that found it out of the report. ``reach``:
    ``(start, end)`` of the output's documents after a row's first, at the farthest
    (:func:`~packtool.verify.contract.later_documents`); None: read when needed.
    """
    from packtool.verify import has_cuda, require_torch

    torch = require_torch()
    from packtool.verify.equivalence import (MODEL_CHECKS, Measurements, doc_refs, measure_batch,
                                             nonfinite_only, place_effect, run_checks)
    from packtool.loader import PackedDataset, collate
    from packtool.verify.model import build_model
    from packtool.verify.runners import exact_float32, make_runner, memory_budget, unavailable

    dev = ("cuda" if has_cuda() else "cpu") if device == "auto" else device
    try:
        budget = memory_budget(max_memory)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    report.notes.append(f"memory budget {budget}")
    model_checks = [c for c in MODEL_CHECKS if c in wanted]
    if not model_checks:  # --check of column checks only: no model runs, each backend says so
        for name in backends if explicit else ():
            reason = unavailable(name, dev)
            report.add(CheckResult(name, "all", SKIP, {}, None, reason or (
                "not run: every check asked for (--check) is a column check"),
                required=bool(reason)))
        return
    base = build_model(seed=seed)
    # what training feeds the user's model, held against its position limit: positions up to
    # the longest span of every row less one, in rows of C tokens
    longest = _longest_span(reader) if hf_config is not None else None
    runners = []
    for name in backends:
        reason = unavailable(name, dev)
        runner = None
        if not reason:
            runner, reason = make_runner(name, base, device=dev, capacity=window,
                                         budget=budget, seed=seed, compile=compile,
                                         hf_config=hf_config, longest=longest, row=capacity)
        if runner is None:
            report.add(CheckResult(name, "all", SKIP, {}, None, reason, required=explicit))
            _say(progress, f"verify: {name}: skipped ({reason})")
            continue
        fault = getattr(runner, "position_fault", None)
        if fault:  # training on these rows would raise: nothing the packed checks could add
            report.add(CheckResult(name, "run", FAIL, {**runner.describe(),
                                                       "longest_span": longest}, None, fault,
                                   True, runner.device, runner.dtype_name))
            _say(progress, f"verify: {name}: FAILED: {fault}")
            continue
        runners.append(runner)
    if not runners or not model_checks:
        return
    per_row = max(r.row_bytes(window) for r in runners)
    B = int(max(1, min(batch_size, budget.bytes // max(per_row, 1))))
    # the rows through the loader's own dataset, on the same reader, with the labels the
    # checks below expect; the stored segment_ids / position_ids go through the models (the
    # loader's default derives them from cu_seqlens, which the column checks prove equal)
    ds = PackedDataset(reader, labels=convention, structure="stored")
    items = [ds[i] for i in idx]
    report.rows = [(it["shard"], it["row"]) for it in items]
    unasked = _unasked_faults(report, contract_bad or {})
    row_faults = _row_faults(report, contract_bad or {})
    reported = {r.check for r in report.results if r.backend == "data"}
    reached = 0  # the farthest end (tokens) of a document after a window's first, run below
    if window < capacity:
        items = [w for it in items for w in row_windows(it, window)]
        report.windows = len(items)
        reached = max((b for it in items for _, b in _spans(it)[1:]), default=0)
        report.notes.append(f"{plural(len(idx), 'row')} in batches of {B}; the model checks on "
                            f"{plural(len(items), 'window')} of {window} of their {capacity} "
                            "tokens "
                            f"(first tokens {[it['window'][0] for it in items]})")
    else:
        report.notes.append(f"{plural(len(idx), 'row')} in batches of {B}")
    shifted = convention == "shifted"
    meas = {r.name: Measurements(r.name, r.device, r.dtype_name, r.backward,
                                 r.no_backward_reason, extra=r.describe(),
                                 grad_pad_tol=getattr(r, "grad_pad_tol", 0.0)) for r in runners}
    failed: dict[str, str] = {}
    elapsed = {r.name: 0.0 for r in runners}
    leak_probe = None  # a batch holding a multi-document row, to locate a leak in
    nb = -(-len(items) // B)
    with exact_float32():
        for bi in range(nb):
            chunk = items[bi * B:(bi + 1) * B]
            batch = collate(chunk)
            # reports name the row's segment numbers and the window's place
            batch["segment_base"] = [it.get("segment_base", 0) for it in chunk]
            batch["window"] = [it.get("window") for it in chunk]
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
                _say(progress, f"verify: batch {bi + 1}/{nb}: {runner.name} ({runner.device}, "
                     f"{runner.dtype_name}): "
                     + (f"{plural(len(chunk), 'row')} of {capacity}" if window >= capacity
                        else f"{plural(len(chunk), 'window')} of "
                        f"{window} of a row's {capacity} tokens"))
                try:
                    with torch.no_grad():
                        key = runner.ref_key
                        if key not in refs_by_key:
                            refs_by_key[key] = doc_refs(runner, flat_docs, docs, budget.bytes,
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
                    msg = exc_line(exc)
                    failed[runner.name] = msg
                    log.debug("backend %s raised", runner.name, exc_info=True)
                elapsed[runner.name] += time.perf_counter() - t
    for runner in runners:
        name = runner.name
        if name in failed:
            hf_cfg = getattr(runner, "config", None)
            why = (f"the backend raised {failed[name]}" if hf_cfg is None else
                   f"the {hf_cfg.model_type} model of --hf-config, shrunk to a test size, raised "
                   f"{failed[name]}: transformers cannot run this config here, so no packed row "
                   "was checked with it")
            report.add(CheckResult(name, "run", FAIL, runner.describe(), None, why, True,
                                   runner.device, runner.dtype_name))
            _say(progress, f"verify: {name}: FAILED to run: {failed[name]}")
            continue
        m = meas[name]
        if runner.dtype != torch.float32:
            m.extra["eager_bf16_max_abs_diff"] = runner.eager_error
        m.extra.update(runner.describe())  # what the run learnt (e.g. seq_idx refused)
        m.extra["seconds"] = round(elapsed[name], 2)
        res = run_checks(m, model_checks)
        # a model check failing on a row whose columns break the contract follows from that
        # column fault: it names the row and the column checks at fault, never the model
        linked = _link_to_column_faults(res.values(), row_faults, reported)
        linked += _link_skips_to_column_faults(res.values(), row_faults, report.rows, reported,
                                               m.rows_multi_doc)
        # NaN or inf is no leak (each check says so, and where it comes from)
        leaked = [r for c, r in res.items() if c in ("logits_match", "isolation")
                  and r.status == FAIL and not nonfinite_only(r)
                  and not any(r is x for x in linked)]
        broken = sorted({r.check for r in report.results
                         if r.backend == "data" and r.status == FAIL})
        if leaked and (broken or unasked):  # the data, not the model, is at fault
            found = ([f"{', '.join(broken)} failed above"] if broken else []) + [
                f"{c} (a column check --check left out) fails at shard {w['shard']} row "
                f"{w['row']}: {msg}" for c, (w, msg) in unasked.items()]
            why = (f"the rows break the output contract ({'; '.join(found)}), so packed and "
                   "per-document outputs differ because of the data, whatever the model: rerun "
                   "the same packtool pack with --overwrite")
            for r in leaked:
                r.message = f"{why}; {r.message}" if r.message else why
        elif (leaked and res.get("isolation") is not None
              and res["isolation"].status == PASS):
            # the logits differ, yet changing a document moves no other: no leak, a place effect
            effect = getattr(runner, "batch_position_effect", None)
            why = ("the packed logits differ from the per-document ones though no document "
                   "reads another (isolation passed): "
                   + place_effect(effect() if effect is not None else None))
            for r in leaked:
                r.message = f"{why}; {r.message}" if r.message else why
        elif (not leaked and window < capacity and longest is not None
              and res.get("logits_match") is not None
              and res["logits_match"].status == PASS):
            _windows_below_switch(res["logits_match"], runner, window, longest)
            if (res["logits_match"].status == PASS
                    and getattr(runner, "config", None) is not None):
                if reach is None:
                    reach = _later_documents(reader)
                _windows_before_far_tokens(res["logits_match"], runner, window, capacity,
                                           longest, budget, seed, reach, reached,
                                           res.get("isolation"), report.warnings)
        elif leaked and leak_probe is not None and hasattr(runner, "diagnose"):
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


def _windows_below_switch(lm, runner, window: int, longest: int) -> None:
    """Fail ``lm`` (a passed ``logits_match`` of the ``hf`` backend on row windows) when the
    user's rotary scaling follows the batch's largest position
    (:func:`~packtool.verify.hf_model.position_switch`) and the output's longest span passes
    its switch, which the windows' positions did not reach: training on whole rows would give
    a document beside a longer one other logits than alone (the place effect whole rows
    measure)."""
    from packtool.verify.equivalence import place_effect
    from packtool.verify.hf_model import position_switch

    cfg = getattr(runner, "config", None)
    switch = position_switch(cfg) if cfg is not None else None
    if switch is None or not switch[1] or longest <= switch[1]:
        return
    lm.status, lm.where = FAIL, None  # no measured row shows it: the output's longest does
    lm.figures["longest_span"] = longest
    lm.message = (f"the windows of {window} tokens run through the model keep its positions "
                  f"below {switch[2]} = {switch[1]}, but the output's longest span is {longest} "
                  "tokens, which training on whole rows feeds: "
                  + place_effect(runner.batch_position_effect())
                  + " (--row-window 0 measures it)")


def place_probe(runner, capacity: int, longest: int, seed: int, start: int | None = None,
                end: int | None = None) -> tuple[float, float, int]:
    """How far the logits of a document placed late in a full row of C tokens are from the same
    document's alone: the effect of a token's index in the row (ALiBi built from the token's
    index, as Falcon and BLOOM build it), which row windows, whose tokens sit at indices below
    the window, never reach.

    The row is documents of ``longest`` tokens back to back (positions restarting in each, as
    training feeds the output's longest spans), then the probed document, ending at token
    ``end`` - 1 and starting at ``start`` or before, so that it holds L = min(64, longest,
    C // 2) tokens or more, then documents of ``longest`` tokens again up to C; one forward
    pass without gradients, and one of the document alone.

    Args:
        runner: a :class:`~packtool.verify.runners.Runner` (``forward``, ``reference``).
        capacity: C of the output's rows (tokens); longest: the output's longest span
            (tokens, >= 1).
        seed: random token ids from this seed.
        start: the farthest first token (index in the row) the document may take: the
            output's farthest document start (:func:`~packtool.verify.contract.later_documents`);
            None: ``end`` - L.
        end: one past the document's last token (tokens, <= C): the farthest end of the
            output's documents after a row's first; None: C.

    Returns:
        (largest absolute difference of the document's float32 logits, the runner's tolerance
        for them, the document's first token in the row).
    """
    from packtool.loader import collate
    from packtool.verify import require_torch

    torch = require_torch()
    L = max(1, min(64, longest, capacity // 2))
    end = capacity if end is None else max(1, min(int(end), capacity))
    first = end - L if start is None else min(int(start), end - L)
    first = max(first, end - max(longest, 1), 1 if end > 1 else 0)  # a document the output holds

    def fill(n):
        return [longest] * (n // longest) + ([n % longest] if n % longest else [])

    lengths = fill(first) + [end - first] + fill(capacity - end)
    seg = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, runner.vocab, (capacity,), generator=g, dtype=torch.int32)
    if getattr(runner, "reserved", None) is not None:  # never the test model's padding token
        ids = torch.where(ids == runner.reserved, (ids + 1) % runner.vocab, ids)
    batch = collate([{"input_ids": ids.numpy(), "segment_ids": seg}])
    with torch.no_grad():
        packed = runner.forward(runner.embed(batch["input_ids"]), batch)[0, first:end].float()
        alone = runner.reference([batch["input_ids"][0, first:end]], 0)[0].float()
    diff = float((packed.to(alone.device) - alone).abs().max())
    return diff, runner.tolerance(float(alone.abs().max())), first


def _windows_before_far_tokens(lm, runner, window: int, capacity: int, longest: int, budget,
                               seed: int, reach: tuple[int, int], reached: int, isolation,
                               warnings: list) -> None:
    """Fail ``lm`` (a passed ``logits_match`` of the ``hf`` backend of ``--hf-config`` on row
    windows) when the user's model gives a document where the output's own documents sit in a
    whole row other logits than alone (:func:`place_probe`): the windows' tokens sit at indices
    below ``window``, whole rows reach C - 1. Other backends are packtool's own model, whose
    output follows ``position_ids`` alone.

    ``reach`` is ``(start, end)`` of the output's documents after a row's first, at the
    farthest (:func:`~packtool.verify.contract.later_documents`): with none (one document per
    row, every document at token 0 as alone), or none ending past ``reached`` (the farthest end
    of a document after a window's first in the windows run), there is nothing to probe; the
    probe's document starts at ``start`` or before and ends at ``end`` - 1. A probe row that
    does not fit ``budget`` (a :class:`~packtool.verify.runners.MemoryBudget`) is said in the
    figures and as one of the report's ``warnings``, naming the ``--max-memory`` it needs.
    ``isolation`` (the backend's result, or None when not run) words the failure."""
    from packtool.verify.equivalence import place_effect

    if getattr(runner, "config", None) is None:
        return
    far_start, far_end = reach
    lm.figures["far_start"] = far_start
    if far_start <= 0:
        lm.figures["far_tokens"] = ("not probed: no row holds two documents, so every document "
                                    "starts at token 0, as alone")
        return
    if far_end <= reached:
        lm.figures["far_tokens"] = (f"not probed: the output's later documents end by token "
                                    f"{far_end - 1}, within the windows run (to token "
                                    f"{reached - 1})")
        return
    need = runner.row_bytes(capacity, backward=False)
    if need > budget.bytes:
        size = (f"{math.ceil(need / (1 << 20))}M" if need < 1 << 30
                else f"{math.ceil(need / (1 << 30) * 10) / 10:g}G")
        lm.figures["far_tokens"] = (f"not probed: a row of {capacity} tokens needs about "
                                    f"{size}, over the memory budget")
        warnings.append(
            f"{runner.name}: the far-token probe did not run: one forward of a whole row of "
            f"{capacity} tokens needs about {size}, over the memory budget {budget}, so a model "
            "whose output follows a token's index in the row (ALiBi) could pass these windows "
            f"of {window} tokens and still differ on whole rows; pass --max-memory {size} or "
            "more to probe it")
        return
    diff, tol, start = place_probe(runner, capacity, longest, seed, start=far_start,
                                   end=far_end)
    lm.figures["far_tokens_start"] = start
    lm.figures["far_tokens_max_abs_diff"] = float(f"{diff:.3g}")
    if diff <= tol:
        return
    effect = place_effect(runner.batch_position_effect())
    if isolation is not None and isolation.status == PASS:
        why = "though no document reads another (isolation passed): " + effect
    else:
        did = ("was not run (--check left it out)" if isolation is None
               else "was skipped" if isolation.status == SKIP else "failed")
        why = (f"and isolation {did}, so a leak between documents is not ruled out; if no "
               "document reads another, " + effect)
    lm.status, lm.where = FAIL, None  # no measured window shows it: a whole row does
    lm.message = (f"the windows of {window} tokens run through the model keep each token at an "
                  f"index below {window}, but in a whole row of {capacity} tokens a document "
                  f"starting at token {start} (the output's later documents start by token "
                  f"{far_start} and reach token {far_end - 1}) gets logits that differ by "
                  f"{diff:.3g} (> {tol:.3g}) from its own alone, " + why
                  + " (--row-window 0 measures it on the output's rows)")


def _row_faults(report, contract_bad: dict) -> dict:
    """``{(shard, row): {check: message}}``: the column checks (asked for or not) that fail on
    each row run through the models (``report.rows``), in report order, with the first message
    of each. The checks of the whole output and the schema name no row: left out."""
    fed = set(report.rows)
    out: dict = {}
    for check in CONTRACT_CHECKS:
        if check in WHOLE_OUTPUT_CHECKS or check == "schema":
            continue
        for w, msg in contract_bad.get(check, ()):
            key = (w["shard"], w["row"]) if w and "row" in w else None
            if key in fed:
                out.setdefault(key, {}).setdefault(check, msg)
    return out


def _link_to_column_faults(results, row_faults: dict, reported: set) -> list:
    """Prefix the message of every failed model check of ``results`` whose row (its
    ``where``) breaks the column contract (``row_faults``, :func:`_row_faults`) with that
    fault: ``row 340 breaks the labels contract (see labels): ...``; a column check that
    ``--check`` left out of the report (not in ``reported``) is named with its message.
    Returns the results changed."""
    linked = []
    for r in results:
        w = r.where or {}
        faults = row_faults.get((w.get("shard"), w.get("row"))) if r.status == FAIL else None
        if not faults:
            continue
        why = (f"{_breaks(w['row'], faults, reported)}: the {r.check} failure follows from "
               "that column fault, not from the model: rerun the same packtool pack with "
               "--overwrite")
        r.message = f"{why}; {r.message}" if r.message else why
        linked.append(r)
    return linked


def _breaks(row: int, faults: dict, reported: set) -> str:
    """``row 340 breaks the labels contract (see labels)``: the column checks ``faults``
    (``{check: message}``) failing on one row, a check left out of the report (not in
    ``reported``) named with its message."""
    see = "; ".join(c if c in reported else f"{c} (a column check --check left out) "
                    f"fails there: {msg}" for c, msg in faults.items())
    return f"row {row} breaks the {', '.join(faults)} contract (see {see})"


def _link_skips_to_column_faults(results, row_faults: dict, rows: list, reported: set,
                                 rows_multi_doc: int) -> list:
    """Fail every model check of ``results`` skipped for having nothing to measure in the rows
    run (no padding, no target, no row of two documents:
    :data:`~packtool.verify.equivalence.SKIP_COLUMNS`) when one of those rows (``rows``,
    ``[(shard, row)]`` in run order) breaks a column check that the skip read: padding given a
    segment id hides the padding from the model, labels all -100 the targets, a doc_ids entry
    left out a document. The check then names the first such row and its column faults
    (:func:`_breaks`), never "nothing to measure"; ``rows_multi_doc`` (the rows run holding
    two documents) goes into its figures, as for a check that ran. Returns the results
    changed."""
    from packtool.verify.equivalence import SKIP_COLUMNS

    linked = []
    for r in results:
        columns = SKIP_COLUMNS.get(r.message) if r.status == SKIP else None
        if not columns:
            continue
        for shard, row in rows:
            faults = {c: msg for c, msg in row_faults.get((shard, row), {}).items()
                      if c in columns}
            if faults:
                break
        else:
            continue
        r.message = (f"{_breaks(row, faults, reported)}: {r.check} found nothing to measure "
                     f"({r.message}) because of that column fault, not because the output "
                     "lacks it: rerun the same packtool pack with --overwrite")
        r.status, r.where, r.required = FAIL, {"shard": shard, "row": row}, True
        r.figures = {**r.figures, "rows_multi_doc": rows_multi_doc}
        linked.append(r)
    return linked


def _unasked_faults(report, contract_bad: dict) -> dict:
    """``{check: (where, message)}``: the first fault of each column check left out of
    ``report`` (``--check`` did not ask for it) on a row run through the models
    (``report.rows``). The checks of the whole output (``doc_offsets``, ``totals``) say
    nothing of a row's columns and the schema's names no row: both are left out."""
    reported = {r.check for r in report.results if r.backend == "data"}
    fed = set(report.rows)
    out = {}
    for check in CONTRACT_CHECKS:
        if check in reported or check in WHOLE_OUTPUT_CHECKS:
            continue
        hit = [(w, msg) for w, msg in contract_bad.get(check, ())
               if w and "row" in w and (w["shard"], w["row"]) in fed]
        if hit:
            out[check] = hit[0]
    return out


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
    real = _padding_start(item)
    return [(a, min(b, real)) for a, b in zip(cu[:-1], cu[1:]) if a < real]


def _padding_start(item) -> int:
    """Where one row's padding tail starts (C when it has none), by its stored ``cu_seqlens``:
    the end of its first len(doc_ids) spans (the documents; one more span is the padding);
    only when ``doc_ids`` do not fit ``cu_seqlens`` (a broken row), the count of its
    non-zero ``segment_ids``. Without ``--segment-multiple``."""
    cu = np.asarray(item["cu_seqlens"], dtype=np.int64)
    k = len(item["doc_ids"])
    if 0 <= cu.size - 1 - k <= 1:
        return int(cu[k])
    return int(np.count_nonzero(np.asarray(item["segment_ids"])))


#: Tokens of each sampled row that the model checks run on (a window across document
#: boundaries): at C = 8192 the checks cost about a twentieth of whole rows (docs/verify.md).
DEFAULT_ROW_WINDOW = 1024


def _window_tokens(capacity: int, row_window: int | None) -> int:
    w = DEFAULT_ROW_WINDOW if row_window is None else row_window
    return capacity if w <= 0 or w >= capacity else int(w)


def row_windows(item: dict, window: int) -> list[dict]:
    """Windows of ``window`` consecutive tokens of one loader item, each an item of its own.

    Each window holds a boundary between two documents whenever the row has one: the first
    window starts at the first document whose span is shorter than the window and that another
    document follows, so it holds that document whole and its end; when only the row's last
    document is that short, the window ends with it (the boundary into it inside); when every
    document is longer, it is centred on the first boundary. When
    the row has a padding tail that this window does not reach, a second window holds the
    boundary from the last document into the padding (whose gradients and finiteness are
    checked). Then, where the row lets a window hold what none of these holds, one does: padding
    and a target with the token it is predicted from (``grad_zero_padding`` measures only such
    windows: see :func:`~packtool.verify.contract.pad_target_span`), else padding alone; a
    target (the loss checks). That window takes the padding window's place when it holds the
    boundary into the padding tail too, else it is one more. A window starts at a document's first token whenever one lets it hold its
    boundary; else (a long document before the boundary, near the row's end) it starts inside
    that document, and the window's part of it is then a document of its own, as the
    per-document reference computes it: its ``position_ids`` rebased to start at 0, and its
    first label -100 (its predecessor is outside the window). The convolution and recurrence of
    the hybrid backends, reset where ``seq_idx`` changes, then start at the window's first
    token, as the reference does. A document cut by the window's end is compared with its own
    first tokens alone (every backend is causal).

    Inside a window the other token columns are the row's own: ``segment_ids`` and the
    ``position_ids`` of the documents that start in it as stored, ``cu_seqlens`` the stored
    boundaries inside the window (so a boundary stored in the wrong place is still seen), and,
    for a ``--segment-multiple`` output, ``cu_seqlens_unpadded`` the real lengths of those spans
    inside the window. ``doc_ids`` and ``doc_offsets`` list the documents whose spans overlap
    the window (a document entered mid-way with the offset of the window's first token);
    ``source_ids`` is left out (the model checks do not read it, the column scan checks it on
    whole rows). A stored shifted label that would predict a token past the window's end
    becomes -100 (nothing past the window is computed).

    Args:
        item: a row from :class:`packtool.loader.PackedDataset` (capacity C > ``window``).
        window: tokens (>= 2).

    Returns:
        One to three items of C = ``window`` with the row's keys, plus ``window`` = (first
        token, end) in the row and ``segment_base``: the row's segment number of the window's
        first document, less one (reports name the row's segments).
    """
    cu = np.asarray(item["cu_seqlens"], dtype=np.int64)
    seg = np.asarray(item["segment_ids"])
    C = seg.size
    unpadded = item.get("cu_seqlens_unpadded")
    if unpadded is None:  # documents back to back, then the padding tail
        tail = _padding_start(item)  # where the padding tail starts
        starts = cu[:-1][cu[:-1] < tail]  # first token of each document
        ends = np.append(starts[1:], tail)  # end of its real tokens
        span_ends = ends
    else:  # --segment-multiple: each document's span holds its tokens, then padding
        k = min(len(item["doc_ids"]), cu.size - 1)
        starts = cu[:k]
        ends = starts + np.diff(np.asarray(unpadded, dtype=np.int64))[:k]
        span_ends = cu[1:k + 1]
        tail = int(cu[k])
    short = np.flatnonzero(span_ends - starts < window)
    inner = short[short < starts.size - 1]  # short and followed by a document
    if inner.size:  # that document whole and the boundary into the next
        firsts = [int(starts[inner[0]])]
    elif short.size and starts.size > 1:  # only the last document is short: the window ends
        firsts = [max(0, int(span_ends[-1]) - window)]  # with it, the boundary into it inside
    elif short.size:  # the row's one document, and the boundary into the padding
        firsts = [int(starts[short[0]])]
    else:  # every document is longer than the window: centred on the first boundary
        firsts = [max(0, int(starts[1]) - window // 2) if starts.size > 1 else 0]
    if tail < C and not tail < min(firsts[0], C - window) + window:  # the padding boundary
        firsts.append(max(int(starts[-1]), tail - window // 2))

    def make(a: int, to_start: bool = True) -> dict:
        a = max(0, min(a, C - window))
        q0 = int(np.searchsorted(starts, a, side="right")) - 1  # the document holding a
        s0 = int(starts[q0])
        if a > s0:
            if to_start and ((cu > s0) & (cu < s0 + window)).any():
                a = s0  # from the document's start the window still holds a boundary
            elif a >= ends[q0]:  # not inside a span's own padding: from a real token
                a = int(ends[q0]) - 1
        b = a + window
        mid = a > s0  # the window enters document q0 mid-way
        w = {k: v for k, v in item.items() if k != "source_ids"}
        for name in ("input_ids", "segment_ids", "position_ids", "labels"):
            if item.get(name) is not None:
                w[name] = np.asarray(item[name])[a:b]
        inside = cu[(cu > a) & (cu < b)] - a
        w["cu_seqlens"] = np.concatenate([[0], inside, [window]]).astype(np.int32)
        w["max_seqlen"] = int(np.diff(w["cu_seqlens"]).max())
        q1 = int(np.searchsorted(starts, b, side="left"))  # documents overlapping the window
        for name in ("doc_ids", "doc_offsets"):
            if item.get(name) is not None:
                w[name] = np.array(np.asarray(item[name])[q0:q1])
        if mid:  # the window's part of document q0 is a document of its own
            first_end = int(w["cu_seqlens"][1])
            pos = np.array(w["position_ids"])
            pos[:first_end] -= pos[0]
            w["position_ids"] = pos
            if w.get("doc_offsets") is not None and len(w["doc_offsets"]):
                w["doc_offsets"][0] += a - s0
            if item.get("labels") is not None and item.get("labels_mode") != "shifted":
                lab = np.array(w["labels"])
                lab[0] = -100  # the token before it, its context, is outside the window
                w["labels"] = lab
        if unpadded is not None:  # each span's real tokens inside the window
            lo = w["cu_seqlens"][:-1].astype(np.int64) + a
            hi = w["cu_seqlens"][1:].astype(np.int64) + a
            q = np.searchsorted(starts, lo, side="right") - 1  # the document holding lo
            doc = (q >= 0) & (lo < span_ends[np.maximum(q, 0)])
            real = np.where(doc, np.clip(np.minimum(ends[np.maximum(q, 0)], hi) - lo, 0, None),
                            hi - lo)
            w["cu_seqlens_unpadded"] = np.concatenate([[0], np.cumsum(real)]).astype(np.int32)
        if item.get("labels") is not None and item.get("labels_mode") == "shifted" and b < C \
                and seg[b] == seg[b - 1]:
            lab = np.array(w["labels"])
            lab[-1] = -100  # it predicts token b, outside the window
            w["labels"] = lab
        w["window"] = (a, b)
        w["segment_base"] = q0
        return w

    out = []
    for a in firsts:
        w = make(a)
        if not out or out[-1]["window"][0] != w["window"][0]:
            out.append(w)
    # the loss and gradient checks measure windows holding a target (grad_zero_padding and
    # finite, windows holding padding too): where the row lets a window hold what none above
    # holds, one does, in the padding window's place when it holds that boundary too
    shifted = item.get("labels_mode") == "shifted"
    labels = item.get("labels")
    lab = None if labels is None else np.asarray(labels)
    tgt = np.zeros(0, dtype=np.int64) if lab is None else np.flatnonzero(lab != IGNORE_INDEX)
    if not shifted:
        tgt = tgt[tgt > 0]  # nothing predicts a row's first token
    pad = np.flatnonzero(seg == 0)
    extra = 0 if shifted else 1  # the token a target is predicted from

    def padded(w):
        return bool((np.asarray(w["segment_ids"]) == 0).any())

    def both(w):
        return padded(w) and _holds(w, shifted)

    w = None
    span = (int(pad_target_span(lab[None], seg[None], "shifted" if shifted else "unshifted")[0])
            if pad.size and tgt.size else window + 1)
    if span <= window and not any(both(w) for w in out):  # the closest target and padding
        k = np.searchsorted(pad, tgt)  # shape: (T,)
        before, after = pad[np.maximum(k - 1, 0)], pad[np.minimum(k, pad.size - 1)]
        need_b = np.where(before < tgt, tgt - before + 1, C + 1)
        need_a = np.where(after > tgt, after - tgt + 1 + extra, C + 1)
        i = int(np.argmin(np.minimum(need_b, need_a)))
        t = int(tgt[i])
        p = int(before[i] if need_b[i] <= need_a[i] else after[i])
        lo, hi = min(p, t - extra), max(p, t)
        w = _first_holding(make, (lo, hi - window + 1, (lo + hi + 1 - window) // 2), both)
    elif pad.size and not any(padded(w) for w in out):  # the padding alone
        w = _first_holding(make, (tail - window // 2, tail - 1, int(pad[0]) - 1), padded)
    if w is not None:
        a, b = w["window"]
        if len(firsts) > 1 and len(out) > 1 and a < int(ends[-1]) and tail < b:
            out[-1] = w  # it holds the padding boundary too: in the padding window's place
        else:
            out.append(w)
    if tgt.size and not any(_holds(w, shifted) for w in out):  # the row's first target
        t = int(tgt[0])
        w = _first_holding(make, (t - extra, t - window // 2), lambda w: _holds(w, shifted))
        if w is not None:
            out.append(w)
    return out


def _holds(w: dict, shifted: bool, padding: bool = False) -> bool:
    """Whether a row window holds a target with the token it is predicted from (and, with
    ``padding``, a padding token too)."""
    lab = np.asarray(w["labels"])
    if not ((lab if shifted else lab[1:]) != IGNORE_INDEX).any():
        return False
    return not padding or bool((np.asarray(w["segment_ids"]) == 0).any())


def _first_holding(make, firsts, holds) -> dict | None:
    """The first window ``make(a)`` of the starts ``firsts`` that ``holds``, or None: each placed
    as :func:`row_windows` places a window (at a document's first token where one lets it hold
    a boundary), then, none holding, each exactly there."""
    for to_start in (True, False):
        for a in firsts:
            w = make(int(a), to_start)
            if holds(w):
                return w
    return None


# -- how long verify expects to take ----------------------------------------------------------

#: Seconds per token of the column scan (NumPy over whole row groups), measured on a 2-core
#: AMD EPYC VM (docs/verify.md).
_SCAN_S_PER_TOKEN = 4.5e-8
#: Seconds per byte of the shards' sha256 check (hashing 0.5 ns a byte plus reading the file
#: from the page cache; the same machine).
_HASH_S_PER_BYTE = 1e-9
#: Seconds per token of one backend's model passes on CPU (packed forward, backward, the
#: isolation forward, and its share of the per-document references; FlexAttention eager, as
#: below 2,048 tokens), and per token pair of attention; the same machine. A row gives one
#: window, or two when its padding tail is checked too (about a quarter of them).
_MODEL_S_PER_TOKEN = {"sdpa": 2.5e-4, "flex": 4e-4, "hf": 1.5e-4, "hybrid": 2.5e-4}
_MODEL_S_PER_PAIR = {"sdpa": 3e-8, "flex": 3e-8, "hf": 3e-8, "hybrid": 3e-8}
#: the backends that run on CPU (the others need CUDA)
_CPU_BACKENDS = ("sdpa", "flex", "hf", "hybrid")
_WINDOWS_PER_ROW = 1.25
#: Start-up of torch (and transformers for hf), and torch.compile of FlexAttention, seconds.
_TORCH_S, _HF_S, _COMPILE_S = 2.5, 2.5, 25.0
_GPU_SPEEDUP = 20.0


def estimate_seconds(scan_rows: int, capacity: int, model_rows: int, window: int,
                     backends, explicit: bool, device: str, compile: bool | None,
                     hash_bytes: int = 0) -> dict:
    """What verify expects to take, in seconds, from the output's size and the options.

    Args:
        hash_bytes: bytes of the shards whose sha256 is checked first (0: none, ``--no-hash``).
        scan_rows: rows whose columns are scanned (0: none); capacity: C.
        model_rows: rows run through the models (0: none); window: tokens of each.
        backends: the backends asked for; explicit: named by the user (else those that
            cannot run here are left out).
        device: ``auto``, ``cpu`` or ``cuda``; compile: as :func:`run_verify`.

    Returns:
        ``{"total": seconds, "detail": one line naming the parts}``. A rough figure (the
        constants were measured on one machine), for planning, not a promise.
    """
    from packtool.verify import has_cuda, has_flex_attention, has_transformers

    hashing = hash_bytes * _HASH_S_PER_BYTE
    parts = [f"sha256 of {hash_bytes / 2**20:,.0f} MiB {_duration(hashing)}"] if hash_bytes \
        else []
    scan = scan_rows * capacity * _SCAN_S_PER_TOKEN
    parts += [f"column scan {_duration(scan)}"] if scan_rows else []
    total = hashing + scan
    if model_rows:  # only then is torch imported (to ask for a GPU): --data-only needs none
        cuda = has_cuda() if device == "auto" else device == "cuda"
        runs = [b for b in backends if explicit or b in _CPU_BACKENDS]
        if not cuda:
            runs = [b for b in runs if b in _CPU_BACKENDS]
        if "flex" in runs and not has_flex_attention():
            runs.remove("flex")
        if "hf" in runs and not has_transformers():
            runs.remove("hf")
        per_row = _WINDOWS_PER_ROW if window < capacity else 1.0
        tokens = model_rows * window * per_row
        models = 0.0
        for b in runs:
            models += (tokens * _MODEL_S_PER_TOKEN.get(b, 2.5e-4)
                       + model_rows * per_row * window**2 * _MODEL_S_PER_PAIR.get(b, 3e-8))
        if cuda:
            models /= _GPU_SPEEDUP
        start = _TORCH_S + (_HF_S if "hf" in runs else 0.0)
        compiled = "flex" in runs and (compile if compile is not None
                                       else cuda or window >= 2048)
        total += models + start + (_COMPILE_S if compiled else 0.0)
        what = (f"{plural(model_rows, 'row')} of {window} tokens" if window >= capacity
                else f"{plural(model_rows, 'row')} in windows of {window} tokens")
        parts.append(f"{', '.join(runs) or 'no backend'} on {what} {_duration(models)}, "
                     f"torch start-up {_duration(start)}")
        if compiled:
            parts.append(f"FlexAttention compile about {_duration(_COMPILE_S)} once")
    return {"total": total, "detail": "; ".join(parts) or "nothing to run"}


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
