"""``packtool verify``: prove packed rows compute what separate documents compute.

Shape legend: B = rows in a batch, C = capacity, L = tokens of one document, V = model vocabulary.

For a sample of rows, three independent things are checked (the lecture's constraints):

* **attention isolation**: the packed forward of a seeded fp32 decoder (or a tiny random Hugging
  Face Llama) on each backend gives, at every real token, the logits of a forward pass on that
  document alone (positions 0..L-1, plain causal attention); changing one document's tokens
  leaves every other document's logits unchanged;
* **label masking**: labels follow the recorded convention and never pair the end of one document
  with the start of the next; gradients at ignored positions and at padding are exactly zero;
* **the denominator**: ``num_targets`` equals sum(len - 1); the packed token-mean loss (sum of
  per-target losses / number of targets) equals the token-weighted per-document loss (sum of sums /
  sum of counts), never a mean of per-document means (B19, B20).

The reference cuts documents with the stored ``cu_seqlens`` and builds its own positions; packed
backends use ``segment_ids`` (sdpa, flex), ``cu_seqlens`` (varlen, flash) or ``position_ids``
(hf), so a broken column on any side shows as a difference. fp32 backends pass when
``max|out - ref| <= 1e-5 * max(1, max|ref|)``; ``flash`` (bf16) when
``max|out - ref| <= 2 * max|eager_bf16 - ref| + 1e-3`` (the flash-attention test rule).
A backend that cannot run here is reported as skipped with the reason, never as passed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from packtool.errors import ConfigError, install_hint
from packtool.types import IGNORE_INDEX
from packtool.verify import (has_cuda, has_flash_attn, has_flex_attention, has_transformers,
                             require_torch)

log = logging.getLogger(__name__)

__all__ = ["ALL_BACKENDS", "DEFAULT_ROWS", "CheckResult", "VerifyReport", "run_verify",
           "select_rows", "check_row_contract"]

ALL_BACKENDS = ("sdpa", "flex", "varlen", "flash", "hf")
DEFAULT_ROWS = 8
FP32_RTOL = 1e-5
BF16_FLOOR = 1e-3
_HF_VOCAB = 512


@dataclass
class CheckResult:
    """One check on one backend: ``pass``, ``fail`` or ``skip``, with its figures."""

    backend: str  #: ``data`` for column checks, else the attention backend
    check: str  #: e.g. ``logits_match``, ``isolation``, ``loss_denominator``
    status: str  #: ``pass`` | ``fail`` | ``skip``
    figures: dict = field(default_factory=dict)  #: measured values and the tolerance used
    where: dict | None = None  #: ``shard``, ``row``, ``segment`` of the worst case / failure
    message: str = ""  #: why it failed or was skipped

    def line(self) -> str:
        figs = "  ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items())
        loc = ""
        if self.where:
            loc = "  at " + " ".join(f"{k}={v}" for k, v in self.where.items())
        msg = f"  ({self.message})" if self.message and self.status != "pass" else ""
        return f"{self.status.upper():4}  {self.backend:6} {self.check:22} {figs}{loc}{msg}"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


@dataclass
class VerifyReport:
    """Everything verify measured; ``ok`` when no check failed and at least one passed."""

    path: str
    rows: list  #: [(shard, row)] checked
    results: list = field(default_factory=list)  #: CheckResult, in run order

    @property
    def failures(self) -> list:
        return [r for r in self.results if r.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failures and any(r.status == "pass" for r in self.results)

    def to_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok,
                "rows": [{"shard": s, "row": r} for s, r in self.rows],
                "results": [asdict(r) for r in self.results]}

    def format_text(self) -> str:
        head = f"packtool verify {self.path}: {len(self.rows)} rows checked"
        lines = [head] + [r.line() for r in self.results]
        n = {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "skip")}
        lines.append(f"{'OK' if self.ok else 'FAILED'}: {n['pass']} passed, {n['fail']} failed, "
                     f"{n['skip']} skipped")
        return "\n".join(lines)

    def first_failure_message(self) -> str:
        f = self.failures[0]
        loc = ", ".join(f"{k} {v}" for k, v in (f.where or {}).items())
        return (f"verify failed: check {f.check} on backend {f.backend}"
                + (f" at {loc}" if loc else "") + f": {f.message}")


# ------------------------------------------------------------------------------------------------
# row selection and column (contract) checks: NumPy only


def select_rows(num_rows: int, n: int | None, seed: int) -> np.ndarray:
    """``n`` distinct row indices spread over ``0..num_rows-1``: one seeded pick per stratum.

    Returns:
        int64[min(n, num_rows)], sorted. ``n=None`` means :data:`DEFAULT_ROWS`; ``n <= 0`` all rows.
    """
    n = DEFAULT_ROWS if n is None else n
    if n <= 0 or n >= num_rows:
        return np.arange(num_rows, dtype=np.int64)
    rng = np.random.default_rng(seed)
    edges = np.linspace(0, num_rows, n + 1).astype(np.int64)  # shape: (n + 1,)
    return np.array([rng.integers(edges[i], edges[i + 1]) for i in range(n)], dtype=np.int64)


def check_row_contract(row: dict, labels_mode: str,
                       label_masked: bool = False) -> list[tuple[str, int | None, str]]:
    """Contract violations of one packed row as ``(check, segment or None, message)``.

    Checks ``cu_seqlens`` (starts at 0, strictly increasing, ends at C), ``segment_ids`` (1..k on
    the cu_seqlens spans, 0 on the padding tail), ``position_ids`` (0..len-1 on every span),
    ``max_seqlen``, ``doc_ids`` (k entries), labels (the recorded convention, nothing across a
    boundary, -100 on padding) and ``num_targets`` (= count(labels != -100) = sum(len - 1)).
    ``label_masked``: the pack read an input labels column, so a label may also be -100 where
    the convention gives a token (an input label -100); ``num_targets`` then counts the labels
    and is at most sum(len - 1).
    """
    out = []
    ids = np.asarray(row["input_ids"])
    seg = np.asarray(row["segment_ids"])
    pos = np.asarray(row["position_ids"])
    cu = np.asarray(row["cu_seqlens"]).astype(np.int64)
    C = ids.shape[0]
    if cu.size < 2 or cu[0] != 0 or cu[-1] != C or np.any(np.diff(cu) <= 0):
        return [("cu_seqlens", None, f"cu_seqlens {cu.tolist()[:8]}... must go 0 < ... < C={C} "
                 "strictly increasing")]
    real = int(np.count_nonzero(seg))
    k = len(row["doc_ids"])
    spans = list(zip(cu[:-1], cu[1:]))
    real_spans = [(a, b) for a, b in spans if a < real]
    if len(real_spans) != k or (k and real_spans[-1][1] != real):
        out.append(("cu_seqlens", None, f"cu_seqlens {cu.tolist()} does not cut the {real} real "
                    f"tokens into the {k} documents of doc_ids"))
    for q, (a, b) in enumerate(spans, start=1):
        want = q if a < real else 0
        if np.any(seg[a:b] != want):
            out.append(("segment_ids", q, f"segment_ids on tokens {a}..{b - 1} are "
                        f"{sorted(set(seg[a:b].tolist()))}, cu_seqlens says {want}"))
            break
    if np.any(seg[real:] != 0):
        out.append(("segment_ids", None, "non-zero segment id after the padding tail starts"))
    for q, (a, b) in enumerate(spans, start=1):
        if np.any(pos[a:b] != np.arange(b - a)):
            out.append(("position_ids", q, f"positions on tokens {a}..{b - 1} start "
                        f"{pos[a:min(b, a + 4)].tolist()}..., expected 0..{b - a - 1}"))
            break
    if int(row["max_seqlen"]) != int(np.diff(cu).max()):
        out.append(("max_seqlen", None, f"max_seqlen {row['max_seqlen']} != max segment "
                    f"{int(np.diff(cu).max())}"))
    lab = np.asarray(row["labels"])
    expected_targets = sum(max(0, min(b, real) - a - 1) for a, b in real_spans)
    if labels_mode != "none":
        want = np.full(C, IGNORE_INDEX, dtype=np.int64)
        for a, b in real_spans:
            b = min(b, real)
            if labels_mode == "shifted":
                want[a:b - 1] = ids[a + 1:b]
            else:
                want[a + 1:b] = ids[a + 1:b]
        # with input label masks a target may be -100 too, never the other way round
        bad = np.flatnonzero((lab != want) & ~(label_masked & (lab == IGNORE_INDEX)))
        if bad.size:
            j = int(bad[0])
            q = int(np.searchsorted(cu, j, side="right"))
            out.append(("labels", q, f"label at token {j} is {int(lab[j])}, the {labels_mode} "
                        f"convention gives {int(want[j])}"))
        counted = int(np.count_nonzero(lab != IGNORE_INDEX))
        if int(row["num_targets"]) != counted or counted > expected_targets or (
                counted != expected_targets and not label_masked):
            out.append(("num_targets", None, f"num_targets {row['num_targets']}, labels != -100: "
                        f"{counted}, sum(len - 1): {expected_targets}"))
    elif int(row["num_targets"]) != expected_targets:
        out.append(("num_targets", None, f"num_targets {row['num_targets']} != sum(len - 1) "
                    f"{expected_targets}"))
    return out


# ------------------------------------------------------------------------------------------------
# model runners


class _Runner:
    """One backend: embed, packed forward, per-document reference forward."""

    name: str
    backward = True  #: whether a backward pass can run (FlexAttention has none on CPU)
    no_backward_reason = ""

    def __init__(self, name, model, attend_factory, device, dtype, ref_model=None):
        self.name, self.model, self.attend_factory = name, model, attend_factory
        self.device, self.dtype = device, dtype
        self.ref_model = ref_model if ref_model is not None else model

    def embed(self, ids_BC):
        return self.model.embed(ids_BC.to(self.device)).to(self.dtype)

    def forward(self, h_BCE, pos_BC, batch):
        attend = self.attend_factory(batch, self.device)
        return self.model.forward_embeds(h_BCE, pos_BC.to(self.device), attend).float()

    def reference(self, tokens_L, model=None):
        torch = require_torch()
        from packtool.verify.model import reference_attend

        m = model if model is not None else self.ref_model
        ids = tokens_L[None].to(self.device)
        pos = torch.arange(tokens_L.shape[0], device=self.device)[None]
        return m.forward_embeds(m.embed(ids), pos, reference_attend)[0].float()


class _HFRunner(_Runner):
    """A tiny random ``LlamaForCausalLM`` fed the packed rows through ``position_ids``."""

    def __init__(self, seed, capacity):
        torch = require_torch()
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=_HF_VOCAB, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=max(2048, capacity), use_cache=False)
        cfg._attn_implementation = "sdpa"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(cfg).eval()
        super().__init__("hf", model, None, "cpu", torch.float32)

    def embed(self, ids_BC):
        return self.model.get_input_embeddings()(ids_BC % _HF_VOCAB)

    def forward(self, h_BCE, pos_BC, batch):
        # no attention_mask: transformers derives the document blocks from position_ids
        return self.model(inputs_embeds=h_BCE, position_ids=pos_BC, use_cache=False).logits

    def reference(self, tokens_L, model=None):
        return self.model(input_ids=(tokens_L % _HF_VOCAB)[None], use_cache=False).logits[0]


# ------------------------------------------------------------------------------------------------


class _Acc:
    """Running max with the location of the worst case."""

    def __init__(self):
        self.max, self.sum, self.n, self.where = 0.0, 0.0, 0, None

    def add(self, values, where):
        if values.numel() == 0:
            return
        m = float(values.max())
        if m != m:  # NaN
            m = float("inf")
        self.sum += float(values.sum())
        self.n += values.numel()
        if self.where is None or m > self.max:
            self.max, self.where = m, where

    @property
    def mean(self):
        return self.sum / self.n if self.n else 0.0


def _spans(cu, seg_row):
    """Real document spans [(a, b)] of one row, cut by cu_seqlens, ending at the real tokens."""
    real = int((seg_row != 0).sum())
    cu = [int(x) for x in cu]
    return [(a, min(b, real)) for a, b in zip(cu[:-1], cu[1:]) if a < real]


def _per_target_loss(logits_BCV, labels_BC, shifted: bool, vocab: int):
    """Per-position CE [B, C] (0 where ignored), target mask [B, C] and target position [B, C].

    Position j holds the loss of the target *token* j (unshifted: predicted from logits j-1).
    """
    torch = require_torch()
    F = torch.nn.functional
    B, C, V = logits_BCV.shape
    if shifted:
        pred, tgt = logits_BCV, labels_BC
    else:
        pred, tgt = logits_BCV[:, :-1], labels_BC[:, 1:]
    mask = tgt != IGNORE_INDEX
    tgt_v = torch.where(mask, tgt % vocab, torch.full_like(tgt, IGNORE_INDEX))
    ce = F.cross_entropy(pred.reshape(-1, V), tgt_v.reshape(-1), ignore_index=IGNORE_INDEX,
                         reduction="none").reshape(tgt.shape)
    if not shifted:  # re-index by target token j = 1..C-1
        z = torch.zeros((B, 1), dtype=ce.dtype, device=ce.device)
        ce = torch.cat([z, ce], dim=1)
        mask = torch.cat([torch.zeros((B, 1), dtype=torch.bool, device=mask.device), mask], 1)
    return ce, mask


def _run_backend(runner, batches, labels_mode, vocab, tol_fn, results):
    """Run all checks of one backend over the batches; append CheckResults."""
    torch = require_torch()
    shifted = labels_mode == "shifted"
    backward = runner.backward
    logit = _Acc()
    iso_other, iso_effect_min, iso_rows = _Acc(), float("inf"), 0
    iso_effect_where = None
    grad_ignored, grad_pad = _Acc(), _Acc()
    nonfinite, nonfinite_where = 0, None
    loss_p_sum = loss_r_sum = 0.0
    cnt_p = cnt_r = 0
    doc_means = []
    seg_loss = _Acc()
    seg_count_bad = None
    tol_logits = 0.0
    for batch, ref in batches:
        B, C = batch["input_ids"].shape
        ids = batch["input_ids"].to(runner.device)
        h = runner.embed(ids).detach().requires_grad_(backward)
        with torch.set_grad_enabled(backward):
            logits = runner.forward(h, batch["position_ids"], batch)
            if backward:
                logits.retain_grad()
            labels = batch["labels"].to(logits.device)
            ce, tmask = _per_target_loss(logits, labels, shifted, vocab)
            n_t = int(tmask.sum())
            loss = ce.sum() / max(n_t, 1)  # token mean over effective targets (B19)
        if backward:
            loss.backward()
        else:  # stand-ins so the checks below read the same: no gradient was measured
            h.grad = torch.zeros_like(h)
            logits.grad = torch.zeros_like(logits)
        tol = tol_fn(ref)
        tol_logits = max(tol_logits, tol)
        with torch.no_grad():
            bad = ~torch.isfinite(logits)
            bad_rows = bad.flatten(1).any(1) | (~torch.isfinite(h.grad)).flatten(1).any(1)
            if bool(bad_rows.any()):
                r = int(torch.nonzero(bad_rows)[0])
                nonfinite += int(bad_rows.sum())
                nonfinite_where = nonfinite_where or {"shard": batch["shard"][r],
                                                      "row": batch["row"][r]}
            # gradient at positions that carry no target, and at padding
            g = logits.grad.abs().amax(-1)  # [B, C]
            has_target = torch.zeros_like(tmask)
            if shifted:
                has_target = tmask
            else:
                has_target[:, :-1] = tmask[:, 1:]
            seg = batch["segment_ids"].to(logits.device)
            for r in range(B):
                w = {"shard": batch["shard"][r], "row": batch["row"][r]}
                grad_ignored.add(g[r][~has_target[r]], w)
                grad_pad.add(h.grad[r][seg[r] == 0].abs(), w)
            loss_p_sum += float(ce.sum())
            cnt_p += n_t
            for r in range(B):
                spans = ref["spans"][r]
                for q, (a, b) in enumerate(spans, start=1):
                    w = {"shard": batch["shard"][r], "row": batch["row"][r], "segment": q}
                    ref_logits, ref_sum, ref_n = ref["docs"][r][q - 1]
                    logit.add((logits[r, a:b] - ref_logits).abs().amax(-1), w)
                    # per-segment loss: targets at token positions a..b-1 (unshifted) or
                    # predicted from positions a..b-1 (shifted)
                    p_sum = float(ce[r, a:b].sum())
                    p_n = int(tmask[r, a:b].sum())
                    if p_n != ref_n and seg_count_bad is None:
                        seg_count_bad = (w, p_n, ref_n)
                    seg_loss.add(torch.tensor([abs(p_sum - ref_sum)]), w)
                    loss_r_sum += ref_sum
                    cnt_r += ref_n
                    if ref_n:
                        doc_means.append(ref_sum / ref_n)
        # isolation: change document 1 of each row with two or more documents
        rows2 = [r for r in range(B) if len(ref["spans"][r]) >= 2]
        if rows2:
            ids2 = batch["input_ids"].clone()
            for r in rows2:
                a, b = ref["spans"][r][0]
                ids2[r, a:b] = ids2[r, a:b] + 1
            with torch.no_grad():
                h2 = runner.embed(ids2.to(runner.device))
                logits2 = runner.forward(h2, batch["position_ids"], batch)
                base = logits.detach()
            for r in rows2:
                spans = ref["spans"][r]
                a, b = spans[0]
                eff = float((logits2[r, a:b] - base[r, a:b]).abs().max())
                if eff < iso_effect_min:
                    iso_effect_min = eff
                    iso_effect_where = {"shard": batch["shard"][r], "row": batch["row"][r],
                                        "segment": 1}
                for q, (a, b) in enumerate(spans[1:], start=2):
                    iso_other.add((logits2[r, a:b] - base[r, a:b]).abs().amax(-1),
                                  {"shard": batch["shard"][r], "row": batch["row"][r],
                                   "segment": q})
                iso_rows += 1
    name = runner.name
    ok = logit.max <= tol_logits
    results.append(CheckResult(name, "logits_match", "pass" if ok else "fail",
                               {"max_abs_diff": logit.max, "mean_abs_diff": logit.mean,
                                "tol": tol_logits}, logit.where,
                               "" if ok else f"packed logits differ from the per-document "
                               f"forward by {logit.max:.3g} > {tol_logits:.3g}"))
    if iso_rows:
        ok = iso_other.max <= tol_logits and iso_effect_min > tol_logits
        msg = ""
        if iso_other.max > tol_logits:
            msg = (f"changing document 1 moved another document's logits by "
                   f"{iso_other.max:.3g} (cross-document attention)")
        elif not ok:
            msg = "changing document 1 did not change its own logits; the check has no power"
        results.append(CheckResult(name, "isolation", "pass" if ok else "fail",
                                   {"max_change_other_docs": iso_other.max,
                                    "min_change_changed_doc": iso_effect_min,
                                    "rows": iso_rows, "tol": tol_logits},
                                   iso_other.where if iso_other.max > tol_logits
                                   else iso_effect_where, msg))
    else:
        results.append(CheckResult(name, "isolation", "skip", {}, None,
                                   "no sampled row holds two documents"))
    if labels_mode == "none":
        results.append(CheckResult(name, "loss_denominator", "skip", {}, None,
                                   "output packed with --labels none"))
    else:
        p_mean = loss_p_sum / cnt_p if cnt_p else 0.0
        r_mean = loss_r_sum / cnt_r if cnt_r else 0.0
        tol_loss = tol_logits * max(1.0, abs(r_mean))
        figs = {"packed_loss": p_mean, "per_doc_token_weighted": r_mean,
                "mean_of_doc_means": float(np.mean(doc_means)) if doc_means else 0.0,
                "targets_packed": cnt_p, "targets_per_doc": cnt_r, "tol": tol_loss}
        if seg_count_bad is not None:
            w, p_n, r_n = seg_count_bad
            results.append(CheckResult(name, "loss_denominator", "fail", figs, w,
                                       f"{p_n} targets in this segment, a separate document has "
                                       f"{r_n} (a label across a boundary?)"))
        elif abs(p_mean - r_mean) > tol_loss or cnt_p != cnt_r:
            results.append(CheckResult(name, "loss_denominator", "fail", figs, seg_loss.where,
                                       f"packed loss {p_mean:.6g} != token-weighted per-document "
                                       f"loss {r_mean:.6g}"))
        else:
            results.append(CheckResult(name, "loss_denominator", "pass", figs))
    ok = grad_ignored.max == 0.0 and grad_pad.max == 0.0
    if not backward:
        results.append(CheckResult(name, "grad_zero_ignored", "skip", {}, None,
                                   runner.no_backward_reason))
    else:
        results.append(CheckResult(name, "grad_zero_ignored", "pass" if ok else "fail",
                                   {"max_grad_ignored_logits": grad_ignored.max,
                                    "max_grad_padding_inputs": grad_pad.max},
                                   None if ok else (grad_ignored.where if grad_ignored.max
                                                    else grad_pad.where),
                                   "" if ok else "non-zero gradient at a position without target "
                                   "or at padding"))
    results.append(CheckResult(name, "finite", "pass" if not nonfinite else "fail",
                               {"rows_with_nan_or_inf": nonfinite}, nonfinite_where,
                               "" if not nonfinite else "NaN or inf in logits or gradients "
                               "(padding included)"))


def _reference(runner, batch, models=None):
    """Per-document reference logits and loss sums of a batch (cut by cu_seqlens)."""
    torch = require_torch()
    F = torch.nn.functional
    out = {"spans": [], "docs": []}
    C = batch["input_ids"].shape[1]
    cu_all = batch["cu_seqlens"].tolist()
    # recover per-row cu from the flattened one
    per_row = [[] for _ in range(batch["input_ids"].shape[0])]
    for x in cu_all[:-1]:
        per_row[x // C].append(x % C)
    for r, cu in enumerate(per_row):
        cu = cu + [C]
        spans = _spans(cu, batch["segment_ids"][r])
        docs = []
        with torch.no_grad():
            for a, b in spans:
                toks = batch["input_ids"][r, a:b].to(runner.device)
                lg = runner.reference(toks, models)
                # targets: tokens a+1..b-1; with input label masks, those whose label is kept
                keep = torch.ones(max(b - a - 1, 0), dtype=torch.bool, device=toks.device)
                if batch.get("label_masked") and b - a > 1:
                    lab = batch["labels"][r].to(toks.device)
                    keep = (lab[a:b - 1] if batch.get("labels_shifted") else lab[a + 1:b]) != \
                        IGNORE_INDEX
                if b - a > 1 and bool(keep.any()):
                    V = lg.shape[-1]
                    s = float(F.cross_entropy(lg[:-1][keep], toks[1:][keep] % V,
                                              reduction="sum"))
                else:
                    s = 0.0
                docs.append((lg, s, int(keep.sum())))
        out["spans"].append(spans)
        out["docs"].append(docs)
    return out


def run_verify(
    path: str | os.PathLike,
    *,
    rows: int | None = None,
    seed: int = 0,
    backends: Iterable[str] = ("sdpa", "flex", "varlen", "flash", "hf"),
    batch_size: int = 4,
    compile: bool = False,
    attend_overrides: dict[str, Callable] | None = None,
    scan_all: bool = True,
) -> VerifyReport:
    """Verify a packed output directory. See the module docstring for what is checked.

    Args:
        path: OUTPUT directory of ``packtool pack``.
        rows: rows to check (``None``: :data:`DEFAULT_ROWS` spread over all shards; ``0``: all).
        seed: seeds the row sample and the test models.
        backends: any of :data:`ALL_BACKENDS`.
        batch_size: rows per forward pass (B).
        compile: run FlexAttention through ``torch.compile``.
        attend_overrides: ``{backend: factory(batch, device) -> attend}`` replacing a backend's
            attention (used to prove that a broken mask makes verify fail).
        scan_all: run the column checks on every row (NumPy only, streaming by row group) and
            draw the model sample from rows holding two documents or more; False: column checks
            on the sampled rows only, sample drawn from all rows.

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is False when any check failed.

    Raises:
        ConfigError: unknown backend or batch_size < 1.
        ManifestError: the directory is not a complete packed output.
        MissingDependencyError: torch is missing.
    """
    torch = require_torch()
    from packtool.verify.loader import PackedDataset, collate
    from packtool.verify.model import build_model, make_attend

    backends = list(dict.fromkeys(backends))
    unknown = [b for b in backends if b not in ALL_BACKENDS]
    if unknown:
        raise ConfigError(f"unknown backend(s) {unknown}; choose from {', '.join(ALL_BACKENDS)}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    ds = PackedDataset(path)

    # an input labels column (SFT prompt masking) leaves some targets -100 on purpose
    label_masked = int(ds.reader.manifest.get("totals", {}).get("tokens_label_masked", 0)) > 0
    # column contract, backend independent: every row when scan_all (cheap, NumPy only), else
    # the sampled rows. The scan also counts documents per row for the model sample.
    by_check: dict[str, list] = {}
    segments_per_row = np.zeros(len(ds), dtype=np.int64)  # shape: (num_rows,)

    def contract(it):
        segments_per_row[it["index"]] = len(it["doc_ids"])
        for check, seg, msg in check_row_contract(it, ds.labels_mode, label_masked):
            by_check.setdefault(check, []).append(({"shard": it["shard"], "row": it["row"],
                                                    **({"segment": seg} if seg else {})}, msg))

    if scan_all:
        for it in ds.reader.iter_rows():
            if "labels" not in it:
                it["labels"] = np.full(ds.capacity, IGNORE_INDEX, dtype=np.int32)
            contract(it)
        # the model runs on rows that can show a boundary fault: those with two documents or
        # more (when there are any), spread over all shards
        multi = np.flatnonzero(segments_per_row >= 2)
        pool = multi if multi.size else np.arange(len(ds))
        idx = pool[select_rows(pool.size, rows, seed)]
        items = [ds[int(i)] for i in idx]
        scanned = len(ds)
    else:
        idx = select_rows(len(ds), rows, seed)
        items = [ds[int(i)] for i in idx]
        for it in items:
            contract(it)
        scanned = len(items)
    report = VerifyReport(str(path), [(it["shard"], it["row"]) for it in items])
    for check in ("cu_seqlens", "segment_ids", "position_ids", "max_seqlen", "labels",
                  "num_targets"):
        bad = by_check.get(check, [])
        report.results.append(CheckResult(
            "data", check, "fail" if bad else "pass",
            {"rows_checked": scanned, "rows_bad": len(bad)},
            bad[0][0] if bad else None, bad[0][1] if bad else ""))
    if not items:
        return report

    batches = [collate(items[i:i + batch_size]) for i in range(0, len(items), batch_size)]
    for b in batches:  # the per-document reference counts the same targets as the labels
        b["label_masked"], b["labels_shifted"] = label_masked, ds.labels_mode == "shifted"
    # what the loader hands to training: with --labels none it derives unshifted labels
    train_labels = "unshifted" if ds.labels_mode == "none" else ds.labels_mode
    model = build_model(seed=seed)
    overrides = attend_overrides or {}
    fp32_refs = None

    def fp32_tol(ref):
        m = max((float(d[0].abs().max()) for docs in ref["docs"] for d in docs), default=1.0)
        return FP32_RTOL * max(1.0, m)

    for name in backends:
        reason = _unavailable(name, ds.capacity)
        if reason:
            report.results.append(CheckResult(name, "all", "skip", {}, None, reason))
            continue
        try:
            if name == "hf":
                runner = _HFRunner(seed, ds.capacity)
                refs = [(b, _reference(runner, b)) for b in batches]
                _run_backend(runner, refs, train_labels, _HF_VOCAB, fp32_tol, report.results)
            elif name == "flash":
                _run_flash(model, batches, train_labels, overrides.get(name), report.results)
            else:
                factory = overrides.get(name) or (
                    lambda b, dev, _n=name: make_attend(_n, b, device=dev, compile=compile))
                runner = _Runner(name, model, factory, "cpu", torch.float32)
                if name == "flex":
                    runner.backward = False
                    runner.no_backward_reason = "FlexAttention has no backward pass on CPU"
                if fp32_refs is None:
                    fp32_refs = [(b, _reference(runner, b)) for b in batches]
                _run_backend(runner, fp32_refs, train_labels, model.vocab, fp32_tol,
                             report.results)
        except Exception as exc:  # a backend that cannot run here is a skip, with the reason
            if name == "varlen" and isinstance(exc, (NotImplementedError, RuntimeError)):
                report.results.append(CheckResult(name, "all", "skip", {}, None,
                                                  f"cannot run here: {str(exc).splitlines()[0]}"))
                continue
            raise
    return report


def _unavailable(name: str, capacity: int) -> str:
    """Why ``name`` cannot run on this machine, or ''."""
    import importlib.util

    if name == "flex" and not has_flex_attention():
        return "this torch has no torch.nn.attention.flex_attention"
    if name == "varlen":
        if importlib.util.find_spec("torch.nn.attention.varlen") is None:
            return "this torch has no torch.nn.attention.varlen"
        if not has_cuda():
            return "torch.nn.attention.varlen runs flash kernels on CUDA only; no GPU here"
    if name == "flash":
        if not has_cuda():
            return "no CUDA GPU"
        if not has_flash_attn():
            return f"flash-attn not installed ({install_hint('gpu')})"
    if name == "hf" and not has_transformers():
        return f"transformers not installed ({install_hint('hf')})"
    return ""


def _run_flash(model, batches, labels_mode, override, results):
    """flash_attn_varlen_func in bf16 on the GPU against the fp32 per-document reference."""
    torch = require_torch()
    import copy

    from packtool.verify.model import make_attend

    dev = "cuda"
    ref32 = copy.deepcopy(model).to(dev)
    m16 = copy.deepcopy(model).to(dev, torch.bfloat16)
    factory = override or (lambda b, d: make_attend("flash", b, device=d))
    runner = _Runner("flash", m16, factory, dev, torch.bfloat16, ref_model=ref32)
    refs = [(b, _reference(runner, b)) for b in batches]
    # eager bf16 per-document forwards: the error budget of bf16 itself
    eager_err = 0.0
    with torch.no_grad():
        for b, ref in refs:
            for r, spans in enumerate(ref["spans"]):
                for q, (a, e) in enumerate(spans):
                    lg16 = runner.reference(b["input_ids"][r, a:e].to(dev), m16)
                    eager_err = max(eager_err, float((lg16 - ref["docs"][r][q][0]).abs().max()))
    tol = 2 * eager_err + BF16_FLOOR
    _run_backend(runner, refs, labels_mode, model.vocab, lambda ref: tol, results)
    results[-5].figures["eager_bf16_max_abs_diff"] = eager_err
