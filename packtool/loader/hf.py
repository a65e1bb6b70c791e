"""Hugging Face ``transformers.Trainer`` glue: a data collator that keeps documents isolated.

Hugging Face causal LMs find document boundaries in a packed row from ``position_ids`` restarting
at 0 (those whose attention mask reads them: OPT, BLOOM, MPT, GPT-OSS and a few more never do,
``docs/architectures.md``), but only when no key/value cache is built and no ``attention_mask``
is given; with the default ``use_cache=True`` (train mode included) they fall back to one causal
mask over the row and documents attend to each other (B02, B29). Their ``flash_attention_2`` path reads the
boundaries from ``position_ids`` only for a batch of one row ([1, N]); for [B, C] with B > 1 it
runs plain causal attention over each row unless it is given ``cu_seq_lens_q``/``cu_seq_lens_k``
and ``max_length_q``/``max_length_k`` (then it flattens the batch and runs varlen attention).
:class:`HFCollator` therefore puts those four (over the batch's B * C tokens, padding tail
included) and ``use_cache=False`` in every batch, next to ``input_ids``, ``position_ids`` and
**unshifted**
``labels`` (the model shifts them, so shifted ones would be scored against the token two
places on, B05). ``Trainer``'s default ``remove_unused_columns=True`` filters the items
before the collator runs, never the batch it returns: every key of the batch reaches the
model's ``forward`` (the ``cu_seq_lens`` / ``max_length`` keywords through its
``**kwargs``; sdpa, eager and flex attention ignore them). That default drops every item key
the model's ``forward`` does not name (``segment_ids``, ``cu_seqlens``, ``labels_mode``, ...), so the
collator needs only those three: segments are recovered from ``position_ids`` restarting at 0.
The items' ``labels_convention`` key goes too, so the collator cannot read the convention from
the items: it takes them to be ``unshifted`` (the dataset default) and checks the values, so
shifted labels are refused, never shifted a second time. ``Trainer`` counts labels != -100 over
a step's batches (``num_items_in_batch``) and divides the summed loss by it once, which is the
effective-target denominator (B20).

Hybrid and linear-attention models (Mamba-2 / SSD, short convolutions: Bamba, Falcon-H1, Zamba2,
Nemotron-H, Qwen3-Next, ...) need more than positions: their convolution and recurrent state
carry one document into the next unless they get ``seq_idx`` (int32, each token's document
index), which :class:`HFCollator` adds to every batch; Hugging Face passes it to the mamba-ssm /
causal-conv1d kernels. Which models honour it where: ``docs/architectures.md``.

Whether a model keeps the documents apart is a property of the model (its architecture, its
attention implementation, a patched layer) and the collator together, which nothing at train
time checks by itself: :func:`check_isolation` runs the model on a small packed batch of the
collator's before training and refuses it when a document's logits differ from the document
run alone, and :class:`IsolationCheck` runs it when ``Trainer`` begins (``docs/training.md``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from packtool.loader.collate import (_cu, _deliver, _labels, _needs, _positions, _seq_idx,
                                     _structure, _tensor, collate, require_torch, rows_of)
from packtool.loader.wrappers import refuse_accelerate_wrapper

# and IsolationCheck, made on first access (module __getattr__)
__all__ = ["HFCollator", "check_isolation", "Isolation", "PROBE_DOCUMENTS", "PROBE_CAPACITY"]

log = logging.getLogger(__name__)

class HFCollator:
    """``data_collator`` for ``transformers.Trainer`` over packtool loader items.

    Args:
        flatten: False: [B, C] tensors; True: the flattened [1, B * C] form, the form
            ``DataCollatorWithFlattening`` gives (which has no padding; here each row's padding
            tail stays as a segment of its own, labels -100).
        flash_attn_kwargs: also return ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32 [D + 1]:
            the boundaries of the batch's D segments over its B * C tokens, the padding tail a
            segment of its own) and ``max_length_q``/``max_length_k`` (int, tokens), which
            Hugging Face's ``flash_attention_2`` path needs to keep documents apart in a [B, C]
            batch with B > 1 (from ``position_ids`` alone it does so for one row only); sdpa,
            eager and flex attention ignore them. ``Trainer`` passes them to the model's
            ``forward`` (its ``**kwargs``). False only for a model whose ``forward`` takes no
            such keywords; with ``flash_attention_2`` then use ``flatten=True``. Under
            ``torch.compile`` the int ``max_length`` recompiles per distinct value. Gated
            DeltaNet layers (Qwen3-Next, OLMo hybrid) hand ``cu_seq_lens_q`` to
            flash-linear-attention, which takes it for a batch of one row only: train those
            with ``flatten=True``.
        labels_mode: convention of the items' labels when they do not say (``Trainer``'s default
            ``remove_unused_columns`` drops every item key but ``input_ids``, ``position_ids``
            and ``labels`` before the collator runs); checked against the values. Build the
            dataset with ``labels="unshifted"`` (the default) and keep this default.
        seq_idx: add ``seq_idx`` (int32, [B, C] per row, or [1, B * C] over the batch with
            ``flatten``), the keyword Hugging Face hybrid models pass to their mamba-ssm and
            causal-conv1d kernels. Without those kernels (the CPU path) transformers refuses it
            with a ValueError rather than mixing documents, or a model ignores it: ``packtool
            verify --hf-config`` says which. False leaves it out.

    Call: ``collator(items)`` (or a :class:`~packtool.formats.packed.Rows`) -> dict with
    ``input_ids`` torch.int32, ``position_ids`` and ``labels`` torch.int64 [B, C] (or
    [1, B * C]), ``use_cache=False``, ``seq_idx`` torch.int32 of the same shape,
    ``cu_seq_lens_q``/``cu_seq_lens_k`` torch.int32 [D + 1] and ``max_length_q``/
    ``max_length_k`` int; labels in
    :attr:`labels_convention`, ``unshifted`` (converted from items that say they are shifted).
    No other key: ``Trainer`` hands every key to the model's ``forward``, so per-token
    ``token_source_ids`` come from :func:`~packtool.loader.collate.collate` /
    :func:`~packtool.loader.collate.collate_flat` in a loop of one's own.

    Raises:
        ValueError: empty batch or rows of different capacity; items without ``input_ids``
            and ``segment_ids`` or ``position_ids`` with ``labels`` (the padding tail could not
            be told from a document); items that do not say their convention and whose labels
            contradict ``labels_mode`` (when called).
        OverflowError: B * C does not fit int32 boundaries (when called).
    """

    #: the convention of the labels every batch holds (the model shifts them)
    labels_convention = "unshifted"

    def __init__(self, *, flatten: bool = False, flash_attn_kwargs: bool = True,
                 labels_mode: str = "unshifted", seq_idx: bool = True) -> None:
        if labels_mode not in ("unshifted", "shifted"):
            raise ValueError(f"labels_mode must be 'unshifted' or 'shifted', got {labels_mode!r}")
        self.labels_mode = labels_mode
        self.flatten = bool(flatten)
        self.flash_attn_kwargs = bool(flash_attn_kwargs)
        self.seq_idx = bool(seq_idx)

    def __repr__(self) -> str:
        """``HFCollator()`` with the options that differ from the defaults."""
        opts = [f"{k}={v!r}" for k, v, default in (
            ("flatten", self.flatten, False), ("flash_attn_kwargs", self.flash_attn_kwargs, True),
            ("labels_mode", self.labels_mode, "unshifted"), ("seq_idx", self.seq_idx, True))
            if v != default]
        return f"{type(self).__name__}({', '.join(opts)})"

    def needs_columns(self, columns) -> None:
        """Refuse item columns this collator cannot make a correct batch of.

        Raises:
            ValueError: ``input_ids`` missing, or both ``segment_ids`` and ``position_ids`` with
                ``labels`` (:func:`~packtool.loader.collate.check_item_columns`).
        """
        _needs(columns)

    def __call__(self, batch) -> dict:
        torch = require_torch()
        if self.flash_attn_kwargs:  # boundaries that accelerate's dispatching would cut
            refuse_accelerate_wrapper(depth=64)
        rows = rows_of(batch)
        _needs(set(rows.tokens) | set(rows.ragged))
        _structure(rows)
        cu_seqlens, max_seqlen = _cu(rows)  # checks the int32 range
        ids = rows.tokens["input_ids"]
        shape = (1, ids.size) if self.flatten else ids.shape
        labels = _labels(rows, want="unshifted", default_mode=self.labels_mode,
                         cu=cu_seqlens, caller="HFCollator")[0]
        out = {"input_ids": _tensor(torch, ids, torch.int32, shape),
               "position_ids": _tensor(torch, _positions(rows), torch.int64, shape),
               "labels": _tensor(torch, labels, torch.int64, shape),
               "use_cache": False}
        if self.seq_idx:
            out["seq_idx"] = torch.from_numpy(_seq_idx(cu_seqlens, ids.shape, self.flatten))
        if self.flash_attn_kwargs:
            cu = torch.from_numpy(cu_seqlens)
            out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max_seqlen,
                       max_length_k=max_seqlen)
        return _deliver(out)


# --- the check before training ----------------------------------------------------------------

#: the documents (tokens) of each of the probe's two rows, a padding tail after them
PROBE_DOCUMENTS = ((17, 6, 14), (19, 12, 9))
#: C of the probe's rows
PROBE_CAPACITY = 48


@dataclass(frozen=True)
class Isolation:
    """What :func:`check_isolation` measured on a model that keeps packed documents apart."""

    model: str  #: the model's class
    attn_implementation: str | None  #: its ``config._attn_implementation``
    collator: str  #: the data collator whose batch the model got
    device: str
    dtype: str
    documents: int  #: packed documents compared with their forward alone
    max_abs_diff: float  #: largest |packed - alone| logit over their tokens
    max_change_other_docs: float  #: largest logit change of a document when another changed
    tolerance: float  #: on both

    def __str__(self) -> str:
        return (f"documents kept apart: {self.model} (attn_implementation "
                f"{self.attn_implementation}, {self.dtype} on {self.device}) fed the batch "
                f"{self.collator} builds gives {self.documents} packed documents the "
                f"logits of each alone within {self.max_abs_diff:.3g} (tolerance "
                f"{self.tolerance:.3g}); changing one moved another by "
                f"{self.max_change_other_docs:.3g}")


def _probe_items(vocab: int, seed: int) -> tuple[list[dict], list[list[tuple[int, int]]]]:
    """The probe's two rows as loader items (the keys and dtypes of
    :class:`~packtool.loader.PackedDataset` items, unshifted labels) and each row's document
    spans [(a, b)]: :data:`PROBE_DOCUMENTS` of random ids below ``vocab``, then a padding tail
    of id 0."""
    from packtool.formats.packed import Block, structure_from_cu, unshifted_labels

    C, R = PROBE_CAPACITY, len(PROBE_DOCUMENTS)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (R, C)).astype(np.int32)  # shape: (R, C)
    cus = [np.cumsum((0,) + docs + (C - sum(docs),)) for docs in PROBE_DOCUMENTS]
    spans = [[(int(a), int(b)) for a, b in zip(cu[:-2], cu[1:-1])] for cu in cus]
    for r, cu in enumerate(cus):
        ids[r, cu[-2]:] = 0
    counts = np.array([len(d) for d in PROBE_DOCUMENTS])
    cu_vals = np.concatenate(cus).astype(np.int32)
    cu_offs = np.cumsum([0] + [cu.size for cu in cus]).astype(np.int64)
    seg, pos = structure_from_cu(cu_vals, cu_offs, counts, C, "check_isolation")
    labels = unshifted_labels(ids, seg)
    doc_offs = np.cumsum(np.append(0, counts)).astype(np.int64)
    block = Block(group=0, first=0, shard_row0=0, shard="", num_rows=R,
                  tokens={"input_ids": ids, "segment_ids": seg, "position_ids": pos,
                          "labels": labels},
                  ragged={"cu_seqlens": (cu_vals, cu_offs),
                          "doc_ids": (np.arange(counts.sum(), dtype=np.int64), doc_offs),
                          "doc_offsets": (np.zeros(counts.sum(), dtype=np.int64), doc_offs)},
                  scalars={"max_seqlen": np.array([np.diff(cu).max() for cu in cus]),
                           "num_targets": (labels != -100).sum(axis=1)})
    return [block.row(r) for r in range(R)], spans


def _name_of(collator) -> str:
    inner = getattr(collator, "data_collator", collator)  # Trainer's RemoveColumnsCollator
    if isinstance(inner, HFCollator):
        return repr(inner)
    return getattr(inner, "__name__", None) or type(inner).__name__


def _gaps(batch: dict, rows: dict, config, what: str) -> dict:
    """What the collator's ``batch`` lacks that a leaking layer needs, as
    :func:`~packtool.verify.hf_model.leak_message`'s ``attention_need`` / ``state_need``
    (``rows``: the :func:`~packtool.loader.collate.collate` batch of the same items)."""
    impl = getattr(config, "_attn_implementation", None) or ""
    torch = require_torch()
    ids, pos = batch["input_ids"], batch.get("position_ids")
    mask = batch.get("attention_mask")
    if torch.is_tensor(pos) and pos.ndim == 3 and pos.shape[0] == 4:
        pos = pos[0]  # a multimodal-RoPE model's text positions, before its three axes
    out = {}
    if not torch.is_tensor(pos) or pos.numel() != rows["position_ids"].numel() or not bool(
            (pos.reshape(rows["position_ids"].shape).cpu() == rows["position_ids"]).all()):
        out["attention_need"] = (f"position_ids restarting at 0 at each document, which the "
                                 f"batch of {what} does not hold: train with "
                                 "data_collator=HFCollator()")
    elif mask is not None and (not torch.is_tensor(mask) or mask.shape == ids.shape):
        # transformers finds the documents from position_ids only when no mask is given
        out["attention_need"] = (f"no attention_mask, which the batch of {what} holds: given "
                                 "one, transformers builds the mask from it alone and never "
                                 "looks for the documents in position_ids (an all-ones mask: "
                                 "one causal mask over the row); drop attention_mask from the "
                                 "batch: train with data_collator=HFCollator(), which leaves it "
                                 "out")
    elif mask is not None:
        out["attention_need"] = (f"an attention_mask that keeps each document to itself: the "
                                 f"batch of {what} holds one of shape {list(mask.shape)} that "
                                 "lets a document attend to another; make it block-diagonal "
                                 "by document, or drop it and train with "
                                 "data_collator=HFCollator(), whose position_ids keep them "
                                 "apart")
    elif batch.get("use_cache", getattr(config, "use_cache", False)):
        out["attention_need"] = (f"use_cache=False (with a key/value cache transformers builds "
                                 f"one causal mask over the row), which the batch of {what} "
                                 "does not hold: train with data_collator=HFCollator()")
    elif "flash" in impl and ids.ndim == 2 and ids.shape[0] > 1 and "cu_seq_lens_q" not in batch:
        out["attention_need"] = (f"cu_seq_lens_q/cu_seq_lens_k and max_length_q/max_length_k in "
                                 f"a batch of {ids.shape[0]} rows ({impl} reads the boundaries "
                                 "from position_ids for one row only), which the batch of "
                                 f"{what} does not hold: use HFCollator() or "
                                 "HFCollator(flatten=True)")
    if "seq_idx" not in batch:
        out["state_need"] = (f"seq_idx, which the batch of {what} does not hold, handed to the "
                             "causal-conv1d / mamba-ssm CUDA kernels: use HFCollator() on a GPU "
                             "with those kernels, or train this model on one document per row")
    return out


def check_isolation(model, collator=None, *, seed: int = 0) -> Isolation:
    """Check before training that ``model`` fed ``collator``'s batches keeps packed documents
    apart.

    Two packed rows of :data:`PROBE_CAPACITY` tokens (documents of :data:`PROBE_DOCUMENTS`
    tokens, random ids below the model's vocabulary drawn from ``seed``, then a padding tail of
    id 0), as loader items, go through ``collator``, and the model gets that batch as
    ``Trainer`` hands it (every key but ``labels``), in eval mode under ``torch.no_grad`` on
    its own device and dtype. Each document's logits must equal those of the same document run
    alone (its own forward, positions from 0), and changing document 1 of each row must move no
    other document's (the ``logits_match`` and ``isolation`` checks of ``packtool verify``,
    :mod:`packtool.verify.equivalence`, through
    :class:`~packtool.verify.runners.ModelRunner`). About ten forwards of at most 96 tokens; TF32
    is off while they run; every module's train/eval mode is restored afterwards, also on
    error.

    Tolerance on the logits: float32 ``1e-5 * max(1, max|logit|)`` on CPU, ``1e-4`` on a GPU;
    bfloat16 / float16 ``4 * eps * max(1, max|logit|)``, four units of the dtype's rounding at
    the largest logit; in every dtype at least twice the difference between the packed and the
    alone logits of the documents that open a row, which no other document precedes.

    Args:
        model: a Hugging Face causal LM (``model(input_ids=..., **batch)`` returns ``.logits``;
            its input embeddings give the vocabulary, device and dtype).
        collator: the data collator training uses, called on a list of loader items (default
            ``HFCollator()``; :class:`IsolationCheck` passes the trainer's).
        seed: seeds the token ids.

    Returns:
        :class:`Isolation`: the largest differences and the tolerance.

    Raises:
        VerifyError: one line: the documents leak (the model's class and attention
            implementation, the row and document that differ most from it alone and by how
            much, the layer where the leak starts and what fixes it); the logits differ though
            no document reads another (a position effect); the collator refuses the rows; or
            the model refuses a keyword of the batch, as training would at its first step
            (transformers' ValueError on ``seq_idx`` without the causal-conv1d / mamba-ssm
            kernels, on any CPU); the logits hold NaN or inf (no measure of a leak: where
            they come from is said, the model on a document or on the padding alone, or the
            packed rows).
        MissingDependencyError: torch is not installed.
    """
    torch = require_torch()
    from packtool.errors import VerifyError, exc_line
    from packtool.verify.equivalence import (Measurements, doc_refs, measure_batch,
                                             nonfinite_only, place_effect, run_checks)
    from packtool.verify.hf_model import REFUSAL_MARK, kernel_need, leak_message
    from packtool.verify.report import FAIL, PASS
    from packtool.verify.runners import ModelRunner, exact_float32

    collator = HFCollator() if collator is None else collator
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    what = _name_of(collator)
    items, spans = _probe_items(int(model.get_input_embeddings().num_embeddings), seed)
    try:
        batch = collator(items)
    except (ValueError, TypeError) as exc:
        raise VerifyError(f"check_isolation: the data collator {what} refuses packed rows: "
                          f"{exc_line(exc)}") from None
    rows = collate(items)  # the rows as the checks read them: segments, labels, provenance
    runner = ModelRunner(model, batch)
    who = (f"{type(model).__name__} (attn_implementation {impl}, {runner.dtype_name} on "
           f"{runner.device})")
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with exact_float32():
            docs = [[rows["input_ids"][r, a:b] for a, b in sp] for r, sp in enumerate(spans)]
            refs = doc_refs(runner, [d for row in docs for d in row], docs, 0, rows["labels"],
                            spans, False, False)
            try:
                runner.calibrate(rows["input_ids"], spans, refs)
            except ValueError as exc:
                if REFUSAL_MARK not in str(exc):
                    raise
                need = kernel_need(exc_line(exc), "train on a GPU, or train this model on one "
                                   "document per row (HFCollator(seq_idx=False) would run, "
                                   "mixing the documents in those layers)")
                raise VerifyError(f"check_isolation: {who} refuses the seq_idx of the "
                                  f"batch {what} builds, as training would at its first step: "
                                  f"this model needs {need}") from None
            except TypeError as exc:
                if "keyword" not in str(exc):
                    raise
                raise VerifyError(
                    f"check_isolation: {who} refuses a keyword of the batch {what} builds "
                    f"({exc_line(exc)}), as training would at its first step: "
                    "HFCollator(flash_attn_kwargs=False) leaves out cu_seq_lens_q/_k and "
                    "max_length_q/_k, HFCollator(seq_idx=False) seq_idx; then check "
                    "again") from None
            m = Measurements("hf", str(runner.device), runner.dtype_name, False,
                             runner.no_backward_reason)
            with torch.enable_grad():  # the loss figures' gradient (on a copy of the logits)
                measure_batch(m, runner, rows, spans, refs, shifted=False)
            res = run_checks(m, ("logits_match", "isolation"))
            lm, iso = res["logits_match"], res["isolation"]
            if lm.status == PASS and iso.status == PASS:
                return Isolation(type(model).__name__, impl, what, str(runner.device),
                                 runner.dtype_name, sum(len(sp) for sp in spans), m.logit.max,
                                 m.iso_other.max, m.tol)

            def doc(where) -> str:
                r, q = where["row"], where["segment"]
                a, b = spans[r][q - 1]
                return f"row {r}, document {q} (tokens {a}..{b - 1})"

            failed = [r for r in (lm, iso) if r.status == FAIL]
            if all(nonfinite_only(r) for r in failed):  # NaN or inf: no measure of a leak
                raise VerifyError(f"check_isolation: {who}, fed the batch {what} builds, "
                                  f"cannot be checked: {failed[0].message}")
            found = []
            if lm.status == FAIL:
                found.append(f"{doc(lm.where)} differs from that document run alone by "
                             f"{m.logit.max:.3g} (tolerance {m.tol:.3g})")
            # a leak moves a later document's layer outputs when document 1 changes, however
            # little (a weak one stays under a bfloat16 tolerance); a position effect does not
            located = runner.locate(rows, spans)
            if located is not None or m.iso_other.max > m.tol:
                if m.iso_other.max > 0:
                    found.append(f"changing document 1 of each row moved "
                                 f"{doc(m.iso_other.where)} by {m.iso_other.max:.3g}")
                held = " and ".join(k for k in ("position_ids", "cu_seq_lens_q/cu_seq_lens_k")
                                    if k.split("/")[0] in batch) or "neither"
                gaps = _gaps(batch, rows, config, what)
                if located is not None and "attention_need" not in gaps:
                    need = runner.mrope_need(rows, spans, f"the batch of {what} gives it")
                    if need is not None:  # positions right, in a form this model misreads
                        gaps["attention_need"] = need
                why = leak_message(config, located, None, fed=f"the batch of {what} held {held}",
                                   **gaps)
            elif lm.status == FAIL:
                found[-1] += ", though changing document 1 moves no other document"
                why = place_effect(runner.batch_position_effect())
            else:  # changing document 1 did not change its own logits
                why = f"{iso.message} (the model's logits do not follow its input_ids)"
            raise VerifyError(f"check_isolation: {who}, fed the batch {what} builds, "
                              f"does not compute each packed document as it computes it alone: "
                              + "".join(f"{f}: " for f in ["; ".join(found)] if f) + why)
    finally:
        for mod, mode in modes:
            mod.training = mode


def _isolation_check_class():
    """:class:`IsolationCheck`, made on first use (it subclasses ``transformers.TrainerCallback``,
    and ``import packtool.loader`` imports neither transformers nor torch)."""
    from transformers import TrainerCallback

    class IsolationCheck(TrainerCallback):
        """``transformers.Trainer`` callback: :func:`check_isolation` on the trainer's model and
        data collator when training begins, so that a model that would mix the documents of
        the packed rows stops ``trainer.train()`` with its ``VerifyError`` before the first
        step (``Trainer(..., callbacks=[IsolationCheck()])``). Each process checks its own
        copy of the model.

        Args:
            collator: the collator to check with; None: the one the trainer's train DataLoader
                calls (behind ``Trainer``'s column removal, as training calls it), else
                ``HFCollator()``.
            seed: seeds the token ids.

        Attributes:
            result: the last check's :class:`Isolation` (None before one ran), also logged
                (``packtool.loader.hf``, INFO).
        """

        def __init__(self, collator=None, *, seed: int = 0) -> None:
            self.collator, self.seed, self.result = collator, seed, None

        def on_train_begin(self, args, state, control, model=None, train_dataloader=None,
                           **kwargs):
            collator = self.collator or getattr(train_dataloader, "collate_fn", None)
            self.result = check_isolation(model, collator, seed=self.seed)
            log.info("%s", self.result)
            return control

    IsolationCheck.__module__ = __name__
    return IsolationCheck


def __getattr__(name: str):
    if name == "IsolationCheck":  # a transformers TrainerCallback: import it only now
        cls = globals()["IsolationCheck"] = _isolation_check_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
