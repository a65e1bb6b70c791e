"""The verify report: one result per (backend, check), and a verdict that cannot pass by accident.

Plain Python (no NumPy, no torch), so the data-only path and any CI wrapper can read it.

Every result is ``pass``, ``fail`` or ``skip``; a skip carries its reason and whether it was
*required*. A check is required when the user asked for it: any check of a backend named with
``--backend`` (or of the default set of backends that can run here), and every check named with
``--check``. The verdict (:attr:`VerifyReport.ok`) is true only when

* no check failed,
* no required check was skipped, and at least one check ran,
* the output has rows, and
* at least one attention check (``logits_match`` or ``isolation``) passed on at least one row
  holding two or more documents, so that a boundary fault could have shown; unless the user asked
  for the data checks only (``data_only``), or no row of the output holds two documents (one
  document per row: no boundary between documents exists; a model check must still have run,
  and ``isolation`` is listed as skipped, not required, unless asked for with ``--check``).

A model check with nothing to measure in the rows run is skipped with its reason, never passed:
``isolation`` without a row holding two documents, ``loss_denominator`` and the gradient checks
without a row holding a target (no loss), ``grad_zero_padding`` without padding. Such a skip is
required (the verdict is false) when the check was named with ``--check``, or when the rows
and row windows verify could have run held what those run lacked (a row whose targets all lie
further from its padding than ``--row-window`` tokens gives ``grad_zero_padding`` nothing any
window could measure: not required, the skip says which ``--row-window`` would measure it).

:meth:`VerifyReport.problems` lists, in words, every reason the verdict is false; the summary
line counts the failed checks and, through :meth:`VerifyReport.unmet`, every other reason (a
required backend unavailable, a required check not run, no check or no attention check run,
no rows), so a false verdict never reads "0 failed" alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["PASS", "FAIL", "SKIP", "ATTENTION_CHECKS", "CheckResult", "VerifyReport"]

PASS, FAIL, SKIP = "pass", "fail", "skip"
#: checks that run the model on packed rows and compare with per-document forwards
ATTENTION_CHECKS = ("logits_match", "isolation")


@dataclass
class CheckResult:
    """One check on one backend, with its figures.

    ``figures`` holds the measured values and the tolerance; for attention checks it includes
    ``rows_multi_doc``, the rows with two or more documents the check ran on.
    """

    backend: str  #: ``data`` for the column contract, else the attention backend
    check: str  #: e.g. ``logits_match``, ``isolation``, ``loss_denominator``, ``labels``
    status: str  #: ``pass`` | ``fail`` | ``skip``
    figures: dict = field(default_factory=dict)  #: measured values and the tolerance used
    where: dict | None = None  #: ``shard``, ``row``, ``segment`` of the worst case / failure
    message: str = ""  #: why it failed or was skipped
    required: bool = True  #: a skip of a required check makes the verdict false
    device: str = ""  #: ``cpu`` / ``cuda`` for attention backends
    dtype: str = ""  #: ``float32`` / ``bfloat16`` for attention backends

    def line(self) -> str:
        """One human-readable report line."""
        figs = "  ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items())
        loc = ""
        if self.where:
            loc = "  at " + " ".join(f"{k}={v}" for k, v in self.where.items())
        msg = f"  ({self.message})" if self.message and self.status != PASS else ""
        opt = "" if self.required or self.status != SKIP else " [not required]"
        name = self.backend + (f"[{self.device}]" if self.device else "")
        return f"{self.status.upper():4}  {name:12} {self.check:22} {figs}{loc}{msg}{opt}"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


@dataclass
class VerifyReport:
    """Everything verify measured and the verdict.

    Args:
        path: the OUTPUT directory.
        rows: ``[(shard, row)]`` run through the models.
        num_rows: rows in the output (0: nothing to verify).
        data_only: the user asked for the column checks only.
    """

    path: str
    rows: list  #: [(shard, row)] run through the models
    num_rows: int = -1  #: rows in the output; -1 when unknown
    data_only: bool = False
    results: list = field(default_factory=list)  #: CheckResult, in run order
    notes: list = field(default_factory=list)  #: facts that shaped the run (budget, batches)
    windows: int = 0  #: row windows run through the models (0: whole rows, ``--row-window 0``)
    #: a model check was asked for (``--check`` of column checks only asks for none)
    models_wanted: bool = True
    #: some row of the output holds two or more documents (None: not known)
    multi_doc_rows: bool | None = None
    #: global indices of the rows run through the models (``rows`` in manifest order)
    indices: list = field(default_factory=list)
    #: what the checks could not measure though the verdict does not ask for it (one line
    #: each, printed as ``warning:`` lines above the summary: a probe the memory budget left out)
    warnings: list = field(default_factory=list)

    def add(self, result: CheckResult) -> CheckResult:
        self.results.append(result)
        return result

    def get(self, backend: str, check: str) -> CheckResult | None:
        """The result of ``check`` on ``backend``, or None."""
        return next((r for r in self.results if r.backend == backend and r.check == check), None)

    @property
    def failures(self) -> list:
        return [r for r in self.results if r.status == FAIL]

    @property
    def required_skips(self) -> list:
        return [r for r in self.results if r.status == SKIP and r.required]

    @property
    def attention_ran(self) -> bool:
        """True when a model check ran (passed or failed) on a row holding two or more
        documents: a boundary fault could have shown. A failed one already makes the verdict
        false, on its own line. (Every model check is counted, so ``--check loss_denominator``
        alone can pass.)"""
        return any(r.status in (PASS, FAIL) and r.backend != "data"
                   and r.figures.get("rows_multi_doc", 0) >= 1 for r in self.results)

    @property
    def backends_run(self) -> list[str]:
        """The model backends that ran on the rows (each gave a result of a named check, not
        a skip or failure of the whole backend), in report order."""
        return list(dict.fromkeys(r.backend for r in self.results if r.backend != "data"
                                  and r.check not in ("all", "run")))

    def unmet(self) -> list[str]:
        """What makes the verdict false beside the failed checks, counted in words for the
        summary line (``1 required backend unavailable``, ``2 required checks not run``,
        ``no check ran``, ``no attention check ran``, ``nothing to verify``): a verdict that
        is false with 0 checks failed says why. Empty when :attr:`ok` or when only failed
        checks make it false."""
        if self.num_rows == 0:
            return ["nothing to verify"]
        skips = self.required_skips
        backends = sum(r.check == "all" for r in skips)
        checks = len(skips) - backends
        out = []
        if backends:
            out.append(f"{backends} required backend{'s' if backends > 1 else ''} "
                       "unavailable")
        if checks:
            out.append(f"{checks} required check{'s' if checks > 1 else ''} not run")
        probs = self.problems()
        if any(p.startswith("no check ran") for p in probs):
            out.append("no check ran")
        if any(p.startswith("no attention check ran") for p in probs):
            out.append("no attention check ran")
        return out

    def problems(self) -> list[str]:
        """Every reason the verdict is false, in words (empty when :attr:`ok`)."""
        out = []
        if self.num_rows == 0:
            out.append("nothing to verify: the output holds 0 rows")
            return out
        if not any(r.status in (PASS, FAIL) for r in self.results):
            out.append("no check ran (every check asked for was skipped, reasons above), so "
                       "nothing was verified")
        for r in self.failures:
            loc = ", ".join(f"{k} {v}" for k, v in (r.where or {}).items())
            out.append(f"check {r.check} failed on backend {r.backend}"
                       + (f" at {loc}" if loc else "") + (f": {r.message}" if r.message else ""))
        for r in self.required_skips:
            out.append(f"check {r.check} on backend {r.backend} did not run: {r.message}")
        ran_any = any(r.backend != "data" and r.status in (PASS, FAIL) for r in self.results)
        if (not self.data_only and self.models_wanted
                and not (ran_any if self.multi_doc_rows is False else self.attention_ran)):
            why = ("no attention check ran on a row holding two or more documents, so a "
                   "boundary fault could not have shown")
            ran = self.backends_run
            if not ran_any and ran:  # the backends ran; every check asked for found nothing
                why = (f"no attention check ran ({', '.join(ran)} ran, but every check asked "
                       "for was skipped, reasons above)")
            elif not ran_any:
                why = "no attention check ran (every attention backend was skipped)"
            if ran_any and self.windows and self.multi_doc_rows:
                out.append(why + "; pass a larger --row-window (0: whole rows) so a window "
                           "holds two documents")
            else:
                out.append(why + "; run a backend that works here (sdpa, flex, hf on CPU) or "
                           "pass --data-only to check the columns alone")
        return out

    @property
    def ok(self) -> bool:
        """True only when :meth:`problems` is empty (see the module docstring)."""
        return not self.problems()

    def to_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "problems": self.problems(),
                "num_rows": self.num_rows, "data_only": self.data_only,
                "rows": [{"shard": s, "row": r} for s, r in self.rows],
                "windows": self.windows,
                "notes": list(self.notes),
                "warnings": list(self.warnings),
                "results": [asdict(r) for r in self.results]}

    def format_text(self) -> str:
        head = (f"packtool verify {self.path}: {self.num_rows if self.num_rows >= 0 else '?'} "
                f"rows, {len(self.rows)} run through the models"
                + (f" ({self.windows} windows: a row's padding tail gets one of its own)"
                   if self.windows > len(self.rows) else ""))
        lines = [head] + [r.line() for r in self.results]
        lines += [f"warning: {w}" for w in self.warnings]
        n = {s: sum(r.status == s for r in self.results) for s in (PASS, FAIL, SKIP)}
        unmet = self.unmet()
        summary = (f"{'OK' if self.ok else 'FAILED'}: {n[PASS]} passed, {n[FAIL]} failed, "
                   f"{n[SKIP]} skipped" + (f"; {', '.join(unmet)}" if unmet else ""))
        lines.append(summary)
        lines += [f"  - {p}" for p in self.problems()]
        return "\n".join(lines)

    def first_failure_message(self) -> str:
        """One line for the CLI's exit message: the first reason the verdict is false."""
        probs = self.problems()
        if not probs:
            return ""
        more = f" (and {len(probs) - 1} more)" if len(probs) > 1 else ""
        return "verify failed: " + probs[0] + more
