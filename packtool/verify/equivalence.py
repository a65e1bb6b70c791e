"""Packed rows against per-document forwards: one measurement pass, then small named checks.

Shape legend: B = rows in a batch, C = capacity, L = tokens of one document, V = model vocabulary.

:func:`measure_batch` runs one backend on one collated batch (packed forward, backward when the
backend has one, and a second forward with document 1 of every multi-document row changed) and
adds what it saw to a :class:`Measurements`. Each check below is a function of the measurements
alone that returns one :class:`~packtool.verify.report.CheckResult`; :data:`CHECKS` maps names to
them, and :func:`run_checks` returns the results by name:

* ``logits_match``: at every real token, packed logits equal the per-document logits;
* ``isolation``: changing document 1 changes its own logits and no other document's (B02, B29);
* ``loss_denominator``: per segment, the packed targets and loss sum equal the separate
  document's; the packed token-mean equals the token-weighted per-document loss, not a mean of
  per-document means (B19);
* ``grad_zero_ignored``: the loss gradient is exactly 0 on logits of positions without a target;
* ``grad_zero_padding``: the gradient reaching padding inputs is exactly 0 (needs a backward pass
  through attention);
* ``finite``: no NaN or inf in logits or gradients, padding included (B07, B22).

A check with nothing to measure is skipped, with the reason, never passed: ``isolation`` on rows
holding one document each, ``loss_denominator`` and the gradient checks on rows without a target
(no loss: the gradients are 0 whatever the masks; only rows holding a target count for them),
``grad_zero_padding`` on rows without padding. :func:`packtool.verify.checks.run_verify` decides
whether such a skip is required (always when named with ``--check``).

NaN or inf is never read as a leak: each check counts its non-finite values apart
(``nan_or_inf``), fails on them saying so, and says where they come from (:func:`nonfinite_cause`:
the model on a document alone, the padding alone, or the packed rows); its leak figure is taken
over the finite values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packtool.types import IGNORE_INDEX
from packtool.verify import require_torch
from packtool.verify.report import FAIL, PASS, SKIP, CheckResult

__all__ = ["MODEL_CHECKS", "CHECKS", "Measurements", "doc_refs", "measure_batch", "run_checks",
           "per_target_loss", "place_effect", "nonfinite_cause", "nonfinite_only"]

#: the model checks, in report order
MODEL_CHECKS = ("logits_match", "isolation", "loss_denominator", "grad_zero_ignored",
                "grad_zero_padding", "finite")


class _Max:
    """Running max (NaN counts as inf) and mean, with the location of the worst case; the
    non-finite values (NaN, inf) are also counted apart (:attr:`nonfinite`, the first one's
    location :attr:`nonfinite_where`), and :attr:`finite_max` and :attr:`mean` are taken over
    the finite ones."""

    def __init__(self):
        self.max, self.sum, self.n, self.where = 0.0, 0.0, 0, None
        self.finite_max, self.finite_where = 0.0, None
        self.nonfinite, self.nonfinite_where = 0, None

    def add(self, values, where):
        if values.numel() == 0:
            return
        torch = require_torch()
        ok = torch.isfinite(values)
        bad = int(values.numel() - int(ok.sum()))
        self.n += values.numel()
        if bad:
            self.nonfinite += bad
            self.nonfinite_where = self.nonfinite_where or where
            if self.where is None or self.max < float("inf"):
                self.max, self.where = float("inf"), where
            values = values[ok]
        if values.numel() == 0:
            return
        m = float(values.max())
        self.sum += float(values.sum())
        if self.finite_where is None or m > self.finite_max:
            self.finite_max, self.finite_where = m, where
        if self.where is None or m > self.max:
            self.max, self.where = m, where

    @property
    def mean(self) -> float:
        n = self.n - self.nonfinite
        return self.sum / n if n else 0.0


@dataclass
class Measurements:
    """What one backend showed over all batches (inputs of the named checks)."""

    backend: str
    device: str = ""
    dtype: str = ""
    backward: bool = True
    no_backward_reason: str = ""
    rows: int = 0
    rows_multi_doc: int = 0
    tol: float = 0.0
    logit: _Max = field(default_factory=_Max)
    iso_other: _Max = field(default_factory=_Max)
    iso_effect_min: float = float("inf")
    iso_effect_where: dict | None = None
    #: the loss gradient on the logits of positions without a target, and the gradient at
    #: padding inputs: measured in rows holding a target only (in a row without one the loss
    #: has no gradient at all, so a 0 there shows nothing)
    grad_ignored: _Max = field(default_factory=_Max)
    grad_pad: _Max = field(default_factory=_Max)
    #: rows run holding at least one target; rows run holding padding
    rows_with_targets: int = 0
    rows_padded: int = 0
    nonfinite_rows: int = 0
    nonfinite_where: dict | None = None
    #: token positions with a NaN or inf in their logits or gradients: on padding, on a
    #: document's tokens (each with the first one's location)
    nonfinite_pad: int = 0
    nonfinite_pad_where: dict | None = None
    nonfinite_real: int = 0
    nonfinite_real_where: dict | None = None
    #: the input ids at the first padding position with a NaN or inf
    nonfinite_pad_ids: tuple = ()
    #: the same ids folded into the model's vocabulary
    #: (:meth:`~packtool.verify.runners.Runner.fold`)
    nonfinite_pad_folded: frozenset = frozenset()
    #: a document whose logits alone (its reference) hold a NaN or inf, or None
    nonfinite_ref_where: dict | None = None
    #: the padding run holding the first non-finite padding position, run alone (its tokens,
    #: positions from 0, no document): (tokens, finite?), or None when not run
    pad_alone: tuple | None = None
    #: the document holding the first non-finite real token, run alone (forward and backward):
    #: (where, finite?, its token ids folded into the model's vocabulary), or None
    doc_alone: tuple | None = None
    #: the model's vocabulary (token ids are folded into it:
    #: :meth:`~packtool.verify.runners.Runner.fold`)
    vocab: int = 0
    #: NaN or inf in document 1's own change (isolation), count
    iso_effect_nonfinite: int = 0
    loss_packed_sum: float = 0.0
    loss_ref_sum: float = 0.0
    targets_packed: int = 0
    targets_ref: int = 0
    doc_means: list = field(default_factory=list)
    seg_loss: _Max = field(default_factory=_Max)
    seg_count_bad: tuple | None = None
    #: (where, count) of the first row holding targets outside its documents' spans (a label
    #: on padding): the row whose packed target count exceeds its documents'
    outside_targets: tuple | None = None
    extra: dict = field(default_factory=dict)
    #: largest gradient at a padding input that still counts as 0: 0 (exact) for every backend
    #: but kernels whose backward sums over whole chunks (rounding residues, far below 1e-9)
    grad_pad_tol: float = 0.0


def per_target_loss(logits_BCV, labels_BC, shifted: bool, vocab: int, fold=None):
    """Per-target cross-entropy re-indexed by target token, and the target mask.

    Args:
        logits_BCV: float [B, C, V]; labels_BC: int64 [B, C] with -100 where nothing is predicted.
        shifted: labels already shifted (``labels[j]`` is predicted from logits j); else the
            model shifts (``labels[j]`` is predicted from logits j - 1).
        vocab: V; label ids are folded with ``% V`` like the model's inputs.
        fold: ``fold(ids) -> ids`` folding label ids as the model's inputs are
            (:meth:`~packtool.verify.runners.Runner.fold`); None: ``% V``.

    Returns:
        ``(ce_BC, mask_BC)``: float [B, C], 0 where ignored; bool [B, C]. Position j holds the
        loss of the target predicted *inside* the segment of token j (unshifted: target token j;
        shifted: the target predicted at j).
    """
    torch = require_torch()
    F = torch.nn.functional
    B, C, V = logits_BCV.shape
    if shifted:
        pred, tgt = logits_BCV, labels_BC
    else:
        pred, tgt = logits_BCV[:, :-1], labels_BC[:, 1:]
    mask = tgt != IGNORE_INDEX
    tgt_v = torch.where(mask, tgt % vocab if fold is None else fold(tgt),
                        torch.full_like(tgt, IGNORE_INDEX))
    ce = F.cross_entropy(pred.reshape(-1, V), tgt_v.reshape(-1), ignore_index=IGNORE_INDEX,
                         reduction="none").reshape(tgt.shape)
    if not shifted:
        z = torch.zeros((B, 1), dtype=ce.dtype, device=ce.device)
        ce = torch.cat([z, ce], dim=1)
        mask = torch.cat([torch.zeros((B, 1), dtype=torch.bool, device=mask.device), mask], 1)
    return ce, mask


def doc_refs(runner, flat_docs, docs, budget_bytes, labels_BC, spans, shifted, label_masked):
    """Per row, per document: (float32 logits [L, V], loss sum, targets) of the document alone,
    the ``refs`` of :func:`measure_batch`.

    Args:
        runner: computes the logits (``runner.reference(flat_docs, budget_bytes)``).
        flat_docs: every document's tokens (1-D int tensors), row by row; docs: the same per
            row.
        budget_bytes: memory for the reference passes.
        labels_BC: int64 [B, C] labels of the batch; spans: per row, the documents' (a, b).
        shifted: the labels convention of the batch.
        label_masked: the pack read input label masks, which leave some targets -100 on
            purpose: a document's targets are its tokens 1..L-1 whose label is kept (all of
            them otherwise).
    """
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
            # folded as the inputs are; the loss takes Long targets
            tgt = runner.fold(toks[1:].to(lg.device).long())
            s = float(F.cross_entropy(lg[:-1][keep], tgt[keep], reduction="sum")) if n else 0.0
            row_refs.append((lg, s, n))
        out.append(row_refs)
    return out


def place_effect(effect: str | None) -> str:
    """Why packed logits differ from the per-document ones when no document reads another
    (``isolation`` passed, ``logits_match`` failed).

    Args:
        effect: what makes this model's output follow the other documents' positions
            (:func:`packtool.verify.hf_model.batch_position_effect`), or None.
    """
    if effect:
        return f"the model's output depends on the other documents' positions: {effect}"
    return ("the model's output depends on where a token sits in the row, not on its "
            "position_ids (a bias or embedding taken from the token's index, e.g. ALiBi); train "
            "it on one document per row")


def _where(batch, r, seg=None):
    w = {"shard": batch["shard"][r], "row": batch["row"][r]}
    if seg is not None:  # the row's segment number (a row window's are counted from its first)
        w["segment"] = seg + (batch.get("segment_base") or [0] * (r + 1))[r]
    window = (batch.get("window") or [None] * (r + 1))[r]
    if window is not None:
        w["tokens"] = f"{window[0]}..{window[1] - 1}"
    return w


def measure_batch(m: Measurements, runner, batch: dict, spans: list, refs: list,
                  shifted: bool, attend_factory=None) -> None:
    """Run ``runner`` on one collated ``batch`` and add what it shows to ``m``.

    Args:
        m: the backend's measurements so far.
        runner: a :class:`~packtool.verify.runners.Runner`.
        batch: output of ``collate`` (int64 [B, C] columns, ``cu_seqlens``, provenance).
        spans: per row, the real document spans ``[(a, b)]`` cut by the stored ``cu_seqlens``.
        refs: per row, per span, ``(logits float32 [L, V], loss sum, targets)`` of the document
            alone.
        shifted: the labels convention of the batch.
        attend_factory: replaces the backend's attention (negative controls in tests).
    """
    torch = require_torch()
    B, C = batch["input_ids"].shape
    backward = runner.backward
    ids = batch["input_ids"]
    h = runner.embed(ids).detach().requires_grad_(backward)
    with torch.set_grad_enabled(backward):
        # a copy, not the leaf: a model may scale its input embeddings in place (CTRL's
        # ``inputs_embeds *= sqrt(d)``), which autograd refuses on a leaf; the gradient still
        # reaches h
        logits = runner.forward(h.clone(), batch, attend_factory)
    # the loss-side gradient runs on a leaf copy of the logits, so it exists on every backend
    leaf = logits.detach().requires_grad_(True)
    labels = batch["labels"].to(logits.device)
    ce, tmask = per_target_loss(leaf, labels, shifted, runner.vocab, runner.fold)
    n_t = int(tmask.sum())
    loss = ce.sum() / max(n_t, 1)  # token mean over effective targets (B19)
    loss.backward()
    if backward:
        logits.backward(leaf.grad)
    # over the finite values: a NaN or inf reference would make the tolerance infinite
    ref_absmax = max((_finite_absmax(d[0]) for row in refs for d in row), default=1.0)
    m.tol = max(m.tol, runner.tolerance(ref_absmax))
    seg = batch["segment_ids"].to(logits.device)
    with torch.no_grad():
        grads = [leaf.grad] + ([h.grad] if backward else [])
        bad_BC = (~torch.isfinite(logits)).any(-1)  # a NaN or inf at the token, shape: (B, C)
        for g in grads:
            bad_BC |= (~torch.isfinite(g.float())).any(-1).to(bad_BC.device)
        bad_rows = bad_BC.any(1)
        if bool(bad_rows.any()):
            r = int(torch.nonzero(bad_rows)[0])
            m.nonfinite_rows += int(bad_rows.sum())
            m.nonfinite_where = m.nonfinite_where or _where(batch, r)
            pad_BC = (seg == 0).to(bad_BC.device)
            at_pad, at_real = bad_BC & pad_BC, bad_BC & ~pad_BC
            if bool(at_real.any()):
                m.nonfinite_real += int(at_real.sum())
                r, j = (int(x) for x in torch.nonzero(at_real)[0])
                m.nonfinite_real_where = m.nonfinite_real_where or _where(batch, r)
                q = next((q for q, (a, b) in enumerate(spans[r], start=1) if a <= j < b), None)
                if m.doc_alone is None and q is not None:  # that document alone
                    a, b = spans[r][q - 1]
                    m.vocab = int(runner.vocab)
                    m.doc_alone = (_where(batch, r, q), _alone_finite(runner, ids[r, a:b]),
                                   frozenset(int(x) for x in runner.fold(ids[r, a:b])))
            if bool(at_pad.any()):
                m.nonfinite_pad += int(at_pad.sum())
                r, j = (int(x) for x in torch.nonzero(at_pad)[0])
                if m.nonfinite_pad_where is None:
                    m.nonfinite_pad_where = _where(batch, r)
                    m.nonfinite_pad_ids = tuple(sorted({int(x) for x in ids[r][at_pad[r].cpu()]}))
                    m.nonfinite_pad_folded = frozenset(
                        int(x) for x in runner.fold(ids[r][at_pad[r].cpu()]))
                if m.pad_alone is None:  # that padding run alone: the model, or the packing?
                    a, b = _run_around(pad_BC[r].cpu(), j)
                    run = ids[r, a:b]
                    m.pad_alone = (b - a, _alone_finite(runner, run))
        g_BC = leaf.grad.abs().amax(-1)
        has_target = tmask.clone() if shifted else torch.zeros_like(tmask)
        if not shifted:
            has_target[:, :-1] = tmask[:, 1:]
        row_targets = tmask.any(1)  # shape: (B,)
        for r in range(B):
            padding = seg[r] == 0
            m.rows_padded += bool(padding.any())
            if not bool(row_targets[r]):  # no loss in this row: its gradients are 0 whatever
                continue
            m.rows_with_targets += 1
            m.grad_ignored.add(g_BC[r][~has_target[r]], _where(batch, r))
            if backward:
                m.grad_pad.add(h.grad[r][padding].float().abs(), _where(batch, r))
        m.loss_packed_sum += float(ce.sum())
        m.targets_packed += n_t
        for r in range(B):
            m.rows += 1
            m.rows_multi_doc += len(spans[r]) >= 2
            outside = int(tmask[r].sum()) - sum(int(tmask[r, a:b].sum()) for a, b in spans[r])
            if outside and m.outside_targets is None:
                m.outside_targets = (_where(batch, r), outside)
            for q, (a, b) in enumerate(spans[r], start=1):
                w = _where(batch, r, q)
                ref_logits, ref_sum, ref_n = refs[r][q - 1]
                if m.nonfinite_ref_where is None and not bool(torch.isfinite(ref_logits).all()):
                    m.nonfinite_ref_where = w
                m.logit.add((logits[r, a:b] - ref_logits.to(logits.device)).abs().amax(-1), w)
                p_sum = float(ce[r, a:b].sum())
                p_n = int(tmask[r, a:b].sum())
                if p_n != ref_n and m.seg_count_bad is None:
                    m.seg_count_bad = (w, p_n, ref_n)
                # per target: each token's cross-entropy moves by at most 2x its logits' error
                m.seg_loss.add(torch.tensor([abs(p_sum - ref_sum) / max(ref_n, 1)]), w)
                m.loss_ref_sum += ref_sum
                m.targets_ref += ref_n
                if ref_n:
                    m.doc_means.append(ref_sum / ref_n)
        # isolation: change document 1 of each row holding two or more documents
        rows2 = [r for r in range(B) if len(spans[r]) >= 2]
        if not rows2:
            return
        ids2 = ids.clone()
        for r in rows2:
            a, b = spans[r][0]
            ids2[r, a:b] = runner.changed_ids(ids2[r, a:b])
        logits2 = runner.forward(runner.embed(ids2), {**batch, "input_ids": ids2},
                                 attend_factory)
        for r in rows2:
            a, b = spans[r][0]
            eff = float((logits2[r, a:b] - logits[r, a:b]).abs().max())
            if eff != eff or eff == float("inf"):
                m.iso_effect_nonfinite += 1
            elif eff < m.iso_effect_min:
                m.iso_effect_min, m.iso_effect_where = eff, _where(batch, r, 1)
            for q, (a, b) in enumerate(spans[r][1:], start=2):
                m.iso_other.add((logits2[r, a:b] - logits[r, a:b]).abs().amax(-1),
                                _where(batch, r, q))


def _finite_absmax(t) -> float:
    """The largest absolute finite value of tensor ``t`` (0.0 when it holds none)."""
    torch = require_torch()
    ok = t[torch.isfinite(t)]
    return float(ok.abs().max()) if ok.numel() else 0.0


def _run_around(pad_C, j: int) -> tuple[int, int]:
    """(a, b): the run of consecutive True of bool [C] ``pad_C`` holding index ``j``."""
    a, b = j, j + 1
    while a > 0 and bool(pad_C[a - 1]):
        a -= 1
    while b < pad_C.shape[0] and bool(pad_C[b]):
        b += 1
    return a, b


def _alone_finite(runner, ids_L) -> bool | None:
    """Whether ``runner``'s model on the tokens ``ids_L`` (int [L]) alone, as one document
    (positions 0..L-1), gives finite logits and input gradients (:meth:`alone_finite` of the
    runner); None when the runner cannot tell or raises."""
    fn = getattr(runner, "alone_finite", None)
    if fn is None:
        return None
    try:
        return bool(fn(ids_L))
    except Exception:  # noqa: BLE001 - a help for the message, never a new failure
        return None


def _at(w: dict) -> str:
    """Where ``w`` points, in words; a batch built in memory (no shard name) names its row."""
    shard = f"shard {w['shard']} " if w.get("shard") else ""
    return f"{shard}row {w.get('row')} segment {w.get('segment')}"


def nonfinite_cause(m: Measurements) -> str:
    """Where the NaN or inf values of ``m`` come from, in words: the model on a document alone
    (no packing involved), the padding alone (the model on the pad id's embedding; then
    ``--pad-id`` is named as the fix when no document alone gives them), or the packed rows
    (that document or padding alone is finite)."""
    parts = []
    pad_ids = ", ".join(str(i) for i in m.nonfinite_pad_ids) or "?"
    doc_w, doc_fin, doc_ids = m.doc_alone if m.doc_alone is not None else (None, None, ())
    n_pad, pad_fin = m.pad_alone if m.pad_alone is not None else (0, None)
    doc_bad = m.nonfinite_ref_where is not None or doc_fin is False
    if doc_bad:
        w = m.nonfinite_ref_where or doc_w
        shared = sorted(m.nonfinite_pad_folded & doc_ids) \
            if m.vocab and doc_fin is False else []
        parts.append(f"the model gives NaN or inf on a document run alone ({_at(w)}), no "
                     "packing involved: the model itself, at this size and seed"
                     + (f" (that document holds token id {shared[0]}, the padding's id, folded "
                        f"into the test model's {m.vocab}-token vocabulary)" if shared else ""))
    if m.nonfinite_pad:
        where = f"at {m.nonfinite_pad} padding positions (input id {pad_ids})"
        if pad_fin is False:
            beside = ("; the documents' tokens in those rows get them from it in the backward "
                      "pass (a NaN times the zero weight of a masked pair is NaN), though "
                      "each alone is finite" if m.nonfinite_real and not doc_bad else
                      ", never at a document's token" if not m.nonfinite_real else "")
            parts.append(
                f"{where}: that padding run alone ({n_pad} token{'s' if n_pad != 1 else ''}, "
                "positions from 0, no document) gives NaN or inf too, so they come from the "
                f"model on the pad id's embedding, not from packing{beside}"
                + ("" if doc_bad else "; repack with another --pad-id (a token id whose "
                   "embedding the model computes finitely)"))
        elif pad_fin:
            parts.append(f"{where}, though that padding run alone is finite: the packed rows "
                         "cause them (a padding token with no key to attend to?)")
        else:
            parts.append(f"{where}: from the model on the pad id's embedding or from the "
                         "packed rows")
    if m.nonfinite_real and not doc_bad and pad_fin is not False:
        parts.append("at documents' tokens of the packed rows, though "
                     + ("that document alone is finite" if doc_fin else
                        "each document's logits alone are finite")
                     + ": the packed rows cause them")
    return "; ".join(parts)


#: the figure of each check that measures a leak or fault (over the finite values)
_LEAK_FIGURE = {"logits_match": "max_abs_diff", "isolation": "max_change_other_docs",
                "grad_zero_padding": "max_grad_padding_inputs",
                "grad_zero_ignored": "max_grad_ignored_logits"}


def nonfinite_only(r: CheckResult) -> bool:
    """Whether failed check ``r`` failed on NaN or inf values alone (``nan_or_inf``), its
    finite figures within the tolerance: no leak, whatever the check."""
    if r.status != FAIL or not r.figures.get("nan_or_inf"):
        return False
    fig = _LEAK_FIGURE.get(r.check)
    return fig is None or r.figures.get(fig, 0.0) <= r.figures.get("tol", 0.0)


def _nonfinite_text(m: Measurements, what: str) -> str:
    """``<what> (NaN or inf, no measure of a leak): <cause>``."""
    cause = nonfinite_cause(m)
    return f"{what} hold NaN or inf, which says nothing of a leak" + (f": {cause}" if cause
                                                                       else "")


def _result(m: Measurements, check: str, status: str, figures=None, where=None, message="",
            required=True) -> CheckResult:
    figures = dict(figures or {})
    if status != SKIP:  # every model check ran on these rows: the verdict asks how many held two
        figures.setdefault("rows_multi_doc", m.rows_multi_doc)
    return CheckResult(m.backend, check, status, figures, where, message, required,
                       m.device, m.dtype)


def logits_match(m: Measurements) -> CheckResult:
    """Packed logits at every real token equal the per-document forward's, within ``m.tol``
    (over the finite ones; a NaN or inf in either fails, said as such)."""
    figs = {"max_abs_diff": m.logit.finite_max, "mean_abs_diff": m.logit.mean, "tol": m.tol,
            "rows": m.rows, "rows_multi_doc": m.rows_multi_doc}
    if m.logit.n == 0:
        return _result(m, "logits_match", FAIL, figs, None, "no real token was compared")
    differ = m.logit.finite_max > m.tol
    if m.logit.nonfinite:
        figs["nan_or_inf"] = m.logit.nonfinite
        msg = _nonfinite_text(m, f"the logits of {m.logit.nonfinite} real tokens (packed or "
                                 "alone)")
        if differ:
            msg += (f"; the finite ones differ from the per-document forward by "
                    f"{m.logit.finite_max:.3g} > {m.tol:.3g}")
        return _result(m, "logits_match", FAIL, figs,
                       m.logit.finite_where if differ else m.logit.nonfinite_where, msg)
    return _result(m, "logits_match", FAIL if differ else PASS, figs, m.logit.where,
                   f"packed logits differ from the per-document forward by {m.logit.max:.3g} > "
                   f"{m.tol:.3g}" if differ else "")


def isolation(m: Measurements) -> CheckResult:
    """Changing document 1 moves its own logits and leaves every other document's unchanged
    (over the finite ones; a NaN or inf in them fails, said as such)."""
    figs = {"max_change_other_docs": m.iso_other.finite_max,
            "min_change_changed_doc": m.iso_effect_min, "rows_multi_doc": m.rows_multi_doc,
            "tol": m.tol}
    if not m.rows_multi_doc:
        return _result(m, "isolation", SKIP, {"rows_multi_doc": 0}, None, NO_MULTI_DOC)
    leak = m.iso_other.finite_max > m.tol
    leak_msg = (f"changing document 1 moved another document's logits by "
                f"{m.iso_other.finite_max:.3g} (documents not kept apart: attention, "
                "convolution or recurrent state crosses a boundary)")
    bad = m.iso_other.nonfinite + m.iso_effect_nonfinite
    if bad:
        figs["nan_or_inf"] = bad
        msg = _nonfinite_text(m, "the logits compared when document 1 changes")
        return _result(m, "isolation", FAIL, figs,
                       m.iso_other.finite_where if leak else
                       m.iso_other.nonfinite_where or m.iso_effect_where,
                       f"{leak_msg}; {msg}" if leak else msg)
    if leak:
        return _result(m, "isolation", FAIL, figs, m.iso_other.where, leak_msg)
    if not m.iso_effect_min > m.tol:
        return _result(m, "isolation", FAIL, figs, m.iso_effect_where,
                       "changing document 1 did not change its own logits; the check has no "
                       "power")
    return _result(m, "isolation", PASS, figs)


def loss_denominator(m: Measurements) -> CheckResult:
    """Per segment the packed targets and loss equal the separate document's (the loss per
    target within ``4 * m.tol``: a token's cross-entropy moves by at most twice its logits'
    largest error, so a label on another token of the same count is caught however many
    targets the pooled mean dilutes it over); the token mean over effective targets equals the
    token-weighted per-document loss (B19). A NaN or inf loss fails, said as such."""
    import math

    import numpy as np

    p_mean = m.loss_packed_sum / m.targets_packed if m.targets_packed else 0.0
    r_mean = m.loss_ref_sum / m.targets_ref if m.targets_ref else 0.0
    tol = m.tol * max(1.0, abs(r_mean)) if math.isfinite(r_mean) else m.tol
    figs = {"packed_loss": p_mean, "per_doc_token_weighted": r_mean,
            "max_segment_loss_diff_per_target": m.seg_loss.finite_max,
            "mean_of_doc_means": float(np.mean(m.doc_means)) if m.doc_means else 0.0,
            "targets_packed": m.targets_packed, "targets_per_doc": m.targets_ref, "tol": tol}
    if m.seg_count_bad is not None:
        w, p_n, r_n = m.seg_count_bad
        return _result(m, "loss_denominator", FAIL, figs, w,
                       f"{p_n} targets in this segment, a separate document has {r_n} (a label "
                       "across a boundary?)")
    if m.seg_loss.nonfinite or not (math.isfinite(p_mean) and math.isfinite(r_mean)):
        figs["nan_or_inf"] = max(m.seg_loss.nonfinite, 1)
        return _result(m, "loss_denominator", FAIL, figs, m.seg_loss.nonfinite_where,
                       _nonfinite_text(m, "the packed or per-document losses"))
    if m.seg_loss.max > 4 * m.tol:
        # a token's cross-entropy moves by at most twice its logits' largest error: within that,
        # the packed logits (logits_match, and isolation where it failed) explain it, not the
        # labels
        iso = isolation(m).status
        which = {FAIL: "logits_match, isolation",
                 PASS: "logits_match; isolation passed: no document reads another"}.get(
                     iso, "logits_match")
        cause = ("follows from the packed logits, which differ from the per-document forward "
                 f"by up to {m.logit.max:.3g} ({which}); the labels and target "
                 "counts agree" if m.logit.max > m.tol
                 and m.seg_loss.max <= 2 * m.logit.max + 4 * m.tol
                 else "a label on another token?")
        return _result(m, "loss_denominator", FAIL, figs, m.seg_loss.where,
                       f"this segment's loss differs from its document's alone by "
                       f"{m.seg_loss.max:.3g} per target (> {4 * m.tol:.3g}) with as many "
                       f"targets: {cause}")
    if not m.targets_packed and not m.targets_ref:  # nothing to compare: 0 == 0 shows nothing
        return _result(m, "loss_denominator", SKIP, {"targets_packed": 0, "targets_per_doc": 0},
                       None, NO_TARGETS)
    if m.outside_targets is not None:  # the packed count is over because of that row
        w, n = m.outside_targets
        return _result(m, "loss_denominator", FAIL, figs, w,
                       f"packed loss {p_mean:.6g} over {m.targets_packed} targets != "
                       f"token-weighted per-document loss {r_mean:.6g} over {m.targets_ref}: "
                       f"this row holds {n} target{'s' if n > 1 else ''} outside its documents "
                       "(a label on padding?)")
    if m.targets_packed != m.targets_ref or abs(p_mean - r_mean) > tol:
        return _result(m, "loss_denominator", FAIL, figs, m.seg_loss.where,
                       f"packed loss {p_mean:.6g} over {m.targets_packed} targets != "
                       f"token-weighted per-document loss {r_mean:.6g} over {m.targets_ref}")
    return _result(m, "loss_denominator", PASS, figs)


def grad_zero_ignored(m: Measurements) -> CheckResult:
    """The loss gradient on logits of positions without a target is exactly 0 (a NaN or inf
    there fails, said as such)."""
    g = m.grad_ignored
    if not g.n:  # no row with a target (or, never seen, no position without one)
        return _result(m, "grad_zero_ignored", SKIP, {}, None,
                       NO_TARGETS if not m.rows_with_targets else NO_UNTARGETED)
    figs = {"max_grad_ignored_logits": g.finite_max, "rows_with_targets": m.rows_with_targets}
    fault = "non-zero gradient on the logits of a position without target"
    if g.nonfinite:
        figs["nan_or_inf"] = g.nonfinite
        msg = _nonfinite_text(m, "the loss gradients on the logits of positions without "
                                 "target")
        return _result(m, "grad_zero_ignored", FAIL, figs,
                       g.finite_where if g.finite_max else g.nonfinite_where,
                       f"{fault}; {msg}" if g.finite_max else msg)
    ok = g.max == 0.0
    return _result(m, "grad_zero_ignored", PASS if ok else FAIL, figs, None if ok else g.where,
                   "" if ok else fault)


#: why ``grad_zero_padding`` is skipped on rows without padding (required only when named)
NO_PADDING = "no padding in the rows run through the model"
#: why ``loss_denominator`` and the gradient checks are skipped when no row run holds a target
#: (required only when named, or when rows of the output hold targets)
NO_TARGETS = ("no target in the rows run through the model: no loss, so nothing to compare and "
              "no gradient to look at")
#: why ``grad_zero_padding`` is skipped when the padded rows run hold no target
NO_PADDED_TARGETS = ("no row run through the model holds both padding and a target: no loss "
                     "gradient could reach the padding")
#: why ``isolation`` is skipped when no row run holds two documents
NO_MULTI_DOC = "no row run through the model holds two documents"
#: why ``grad_zero_ignored`` is skipped when every position of the rows run holds a target
NO_UNTARGETED = "no position without a target in the rows run through the model"
#: the columns each "nothing to measure" skip above read (the stored segment_ids say where
#: padding is, the stored labels where the targets are, cu_seqlens and doc_ids where the
#: documents are): a row breaking one of them can hide what the check needs
#: (:func:`packtool.verify.checks._link_skips_to_column_faults`)
SKIP_COLUMNS = {
    NO_PADDING: ("segment_ids", "cu_seqlens", "cu_seqlens_unpadded", "doc_ids"),
    NO_TARGETS: ("labels", "num_targets"),
    NO_PADDED_TARGETS: ("labels", "num_targets", "segment_ids", "cu_seqlens",
                        "cu_seqlens_unpadded", "doc_ids"),
    NO_MULTI_DOC: ("doc_ids", "cu_seqlens", "cu_seqlens_unpadded", "segment_ids"),
    NO_UNTARGETED: ("labels", "num_targets"),
}


def grad_zero_padding(m: Measurements) -> CheckResult:
    """The gradient that reaches padding inputs through attention is exactly 0 (at most
    ``m.grad_pad_tol``, 0 but for chunked kernels), over its finite values; a NaN or inf there
    is no measure of attention (it fails, said as such, with where it comes from)."""
    if not m.backward:
        return _result(m, "grad_zero_padding", SKIP, {}, None, m.no_backward_reason,
                       required=False)
    if not m.grad_pad.n:  # nothing to look at: passing would say what was never seen
        if not m.rows_padded:
            return _result(m, "grad_zero_padding", SKIP, {}, None, NO_PADDING, required=False)
        return _result(m, "grad_zero_padding", SKIP, {}, None,
                       NO_TARGETS if not m.rows_with_targets else NO_PADDED_TARGETS)
    g = m.grad_pad
    leak = g.finite_max > m.grad_pad_tol
    figs = {"max_grad_padding_inputs": g.finite_max}
    if m.grad_pad_tol:
        figs["tol"] = m.grad_pad_tol
    leak_msg = "non-zero gradient at a padding input (a real token attends padding)"
    if g.nonfinite:
        figs["nan_or_inf"] = g.nonfinite
        msg = _nonfinite_text(m, f"{g.nonfinite} of the {g.n} gradient values at padding "
                                 "inputs") + (
            "; the finite ones are 0" if not leak and g.nonfinite < g.n else "")
        return _result(m, "grad_zero_padding", FAIL, figs,
                       g.finite_where if leak else g.nonfinite_where,
                       f"{leak_msg}; {msg}" if leak else msg)
    return _result(m, "grad_zero_padding", FAIL if leak else PASS, figs,
                   g.where if leak else None, leak_msg if leak else "")


def finite(m: Measurements) -> CheckResult:
    """No NaN or inf in logits or gradients, padding included; a failure says where they come
    from (:func:`nonfinite_cause`)."""
    ok = not m.nonfinite_rows
    cause = nonfinite_cause(m) if not ok else ""
    return _result(m, "finite", PASS if ok else FAIL, {"rows_with_nan_or_inf": m.nonfinite_rows},
                   m.nonfinite_where, "" if ok else "NaN or inf in logits or gradients"
                   + (f": {cause}" if cause else " (padding included)"))


CHECKS = {"logits_match": logits_match, "isolation": isolation,
          "loss_denominator": loss_denominator, "grad_zero_ignored": grad_zero_ignored,
          "grad_zero_padding": grad_zero_padding, "finite": finite}


def run_checks(m: Measurements, names=MODEL_CHECKS) -> dict[str, CheckResult]:
    """The named checks of one backend's measurements, by name, in :data:`MODEL_CHECKS` order."""
    out = {n: CHECKS[n](m) for n in MODEL_CHECKS if n in names}
    for r in out.values():
        if r.check == "logits_match":
            r.figures.update({k: v for k, v in m.extra.items() if k not in ("device", "dtype")})
    return out
