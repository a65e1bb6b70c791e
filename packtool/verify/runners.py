"""One runner per attention backend, each with an explicit device and dtype, under a memory budget.

Shape legend: B = rows in a batch, C = capacity, L = tokens of one document, V = model vocabulary,
E = model width, H = heads.

| backend  | attention call                                        | device            | dtype    |
|----------|-------------------------------------------------------|-------------------|----------|
| sdpa     | ``scaled_dot_product_attention`` + block-causal mask  | CUDA if present   | float32  |
| flex     | ``flex_attention`` + document ``BlockMask``, compiled | CUDA if present   | float32  |
| varlen   | ``torch.nn.attention.varlen.varlen_attn``, cu_seqlens | CUDA only         | bfloat16 |
| flash    | ``flash_attn_varlen_func``, cu_seqlens                | CUDA + flash-attn | bfloat16 |
| hf       | tiny random ``LlamaForCausalLM``, position_ids only   | as sdpa           | float32  |
| hybrid   | sdpa + convolution/recurrence mixers reset by seq_idx | as sdpa           | float32  |
| mamba    | hybrid with causal-conv1d + mamba-ssm kernels, seq_idx| CUDA + kernels    | float32  |

Every runner compares with per-document forwards of the same model in float32 on its own device
(right-padded batches of documents, written-out causal attention in query blocks; ``hf`` runs each
document alone, a batch of one, since a Hugging Face model may compute on the whole batch). Tolerance on
logits: float32 on CPU ``1e-5 * max(1, max|ref|)``; float32 on CUDA ``1e-4 * max(1, max|ref|)``
(kernels reorder sums; TF32 is switched off while verify runs); bfloat16 the flash-attention test
rule ``2 * max|eager_bf16 - ref| + 1e-3``, where eager_bf16 is the per-document reference forward
run in bfloat16.

Memory: :func:`memory_budget` gives the bytes verify may use for model passes (``--max-memory``,
else half of the available memory, at most 1 GiB). Each runner estimates its bytes per row at
capacity C (activations, and for sdpa/hf the C x C mask) and the batch size follows; SDPA switches
to query blocks under activation checkpointing when one row's mask would not fit, and a backend
that cannot fit one row is skipped with the figures.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from contextlib import contextmanager
from dataclasses import dataclass

from packtool.errors import exc_line, first_line, install_hint
from packtool.verify import (has_cuda, has_flash_attn, has_flex_attention, has_transformers,
                             require_torch)

log = logging.getLogger(__name__)

__all__ = ["ALL_BACKENDS", "MemoryBudget", "memory_budget", "parse_size", "unavailable",
           "make_runner", "Runner", "ModelRunner", "HF_VOCAB", "exact_float32"]

ALL_BACKENDS = ("sdpa", "flex", "varlen", "flash", "hf", "hybrid", "mamba")
#: layers of the hybrid test model that are mixers (the middle one is attention)
HYBRID_MIXER_LAYERS = (0, 2)
FP32_RTOL_CPU = 1e-5
FP32_RTOL_CUDA = 1e-4
BF16_FLOOR = 1e-3
#: units of a bfloat16 / float16 model's rounding at its largest logit that its packed logits may
#: differ by from its own per-document ones (:class:`ModelRunner`)
LOW_PRECISION_ULPS = 4
HF_VOCAB = 512
_GIB = 1 << 30
#: bytes per token of one row's forward + backward activations of the test decoder (measured
#: 2026 on torch 2.13 CPU: about 24 KB at E = 64, 3 layers, V = 512; rounded up)
_ACT_BYTES_PER_TOKEN = 32 << 10
#: bytes per C x C element of a dense mask pass (the bool mask, its intermediates and SDPA's
#: additive copy; measured about 5 at C = 16,384)
_MASK_BYTES_PER_PAIR = 6
#: copies of one layer's float32 attention scores [H, C, C] that a Hugging Face model's eager
#: attention keeps for the backward: the softmax's output, and the scores before it where the
#: model soft-caps them (tanh, as Gemma 2 does)
_EAGER_SAVED_PER_LAYER = 2
#: copies of [H, C, C] alive at once beside those: an operation's input and output in the
#: forward (scaling, soft-capping, the mask added, the softmax), the gradients in the backward.
#: Gemma 2 shrunk (2 layers, 4 heads) measured 2.5 forward only, 6 forward + backward at once
_EAGER_TRANSIENT = 3


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes verify may use for model passes, and where the figure came from."""

    bytes: int
    source: str

    def __str__(self) -> str:
        return f"{self.bytes / _GIB:.2f} GiB ({self.source})"


def parse_size(text: str) -> int:
    """Bytes of a size such as ``4G``, ``512M``, ``1.5GiB``, ``2000000``.

    Raises:
        ValueError: not a size.
    """
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(float(t))
    except (ValueError, OverflowError):  # OverflowError: inf, 1e400
        raise ValueError(f"{text!r} is not a size; use e.g. 4G, 512M or a number of bytes") \
            from None


def _available_bytes() -> tuple[int, str]:
    avail, src = None, ""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail, src = int(line.split()[1]) * 1024, "MemAvailable"
    except OSError:
        pass
    try:  # a container's own limit (cgroup v2)
        lim = open("/sys/fs/cgroup/memory.max").read().strip()
        cur = int(open("/sys/fs/cgroup/memory.current").read().strip())
        if lim != "max" and (avail is None or int(lim) - cur < avail):
            avail, src = int(lim) - cur, "cgroup memory.max - memory.current"
    except (OSError, ValueError):
        pass
    if avail is None:
        avail, src = 4 * _GIB, "no memory figure found; assumed 4 GiB"
    return max(avail, 0), src


def memory_budget(max_memory: int | None = None) -> MemoryBudget:
    """The memory budget of the model passes.

    Args:
        max_memory: bytes given by the user (``--max-memory``); None derives one: half of the
            available memory (``MemAvailable``, or a cgroup's limit minus its usage), at most
            1 GiB, at least 256 MiB.

    Returns:
        A :class:`MemoryBudget`.

    Raises:
        ValueError: ``max_memory`` below 64 MiB.
    """
    if max_memory is not None:
        if max_memory < 64 << 20:
            raise ValueError(f"--max-memory {max_memory} bytes is below 64 MiB")
        return MemoryBudget(int(max_memory), "--max-memory")
    avail, src = _available_bytes()
    b = int(min(max(avail // 2, 256 << 20), _GIB))
    return MemoryBudget(b, f"half of {src} {avail / _GIB:.1f} GiB, at most 1 GiB")


def unavailable(name: str, device: str) -> str:
    """Why backend ``name`` cannot run on ``device`` here, or ''."""
    if name == "flex" and not has_flex_attention():
        return "this torch has no torch.nn.attention.flex_attention"
    if name in ("varlen", "flash") or device == "cuda":
        if not has_cuda():
            what = {"varlen": "torch.nn.attention.varlen runs flash kernels on CUDA only",
                    "flash": "flash_attn_varlen_func runs on CUDA only"}.get(name, "--device cuda")
            return f"{what}; no CUDA GPU here"
    if name == "varlen" and importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return "this torch has no torch.nn.attention.varlen"
    if name == "flash" and not has_flash_attn():
        return f"flash-attn is not installed or cannot be imported ({install_hint('gpu')})"
    if name == "hf" and not has_transformers():
        return f"transformers is not installed ({install_hint('hf')})"
    if name == "mamba":
        from packtool.verify.hybrid import has_mamba_kernels

        if not has_cuda():
            return "causal-conv1d and mamba-ssm run on CUDA only; no CUDA GPU here"
        if not has_mamba_kernels():
            return ("causal-conv1d and mamba-ssm are not installed or cannot be imported "
                    "(install them from prebuilt wheels: scripts/gpu_check.sh)")
    return ""


class Runner:
    """One attention backend on the seeded test decoder.

    Attributes:
        name: backend name; device: ``cpu`` | ``cuda``; dtype: torch dtype of the packed pass.
        backward: whether a backward pass through attention runs (FlexAttention has none on CPU).
        compiled: FlexAttention through ``torch.compile``.
        query_block: SDPA query block (None: whole rows).
        per_row: run rows one at a time (compiled FlexAttention: one graph for every batch).
    """

    def __init__(self, name, base_model, device, dtype, *, compiled=False, query_block=None):
        torch = require_torch()
        self.name, self.device, self.dtype = name, device, dtype
        self.ref_model = base_model if device == "cpu" else copy.deepcopy(base_model).to(device)
        self.model = (self.ref_model if dtype == torch.float32
                      else copy.deepcopy(self.ref_model).to(dtype))
        self.vocab = base_model.vocab
        self.compiled, self.query_block = compiled, query_block
        self.backward = not (name == "flex" and device == "cpu")
        self.no_backward_reason = ("FlexAttention has no backward pass on CPU (torch raises "
                                   "NotImplementedError)" if not self.backward else "")
        self.per_row = name == "flex" and compiled
        self.eager_error = 0.0  #: bf16 only: max |per-document forward in dtype - fp32 ref|

    #: a token id of the model that folded ids never land on (the padding embedding of a
    #: Hugging Face model, all zero, or NaN downstream in some: Gemma 3n); None: every id
    reserved: int | None = None

    def fold(self, ids):
        """Token ids (int tensor, any shape) folded into the model's vocabulary of V ids:
        ``ids % V``, except that an id of V or more landing on :attr:`reserved` takes the next
        id, so a real token of a large vocabulary never becomes the test model's padding token
        (an id below V is kept as it is: the data holds that very token). Same shape and dtype.
        """
        torch = require_torch()
        v = ids % self.vocab
        if self.reserved is None:
            return v
        return torch.where((v == self.reserved) & (ids != self.reserved), (v + 1) % self.vocab, v)

    def changed_ids(self, ids):
        """``ids`` (int tensor) with every token replaced by another id of the model (the
        isolation check's changed document): the next id after :meth:`fold`, never
        :attr:`reserved`; already folded. Same shape and dtype."""
        torch = require_torch()
        c = (self.fold(ids) + 1) % self.vocab
        if self.reserved is None:
            return c
        return torch.where(c == self.reserved, (c + 1) % self.vocab, c)

    @property
    def ref_key(self):
        """Runners with the same key share their float32 per-document references."""
        return ("decoder", self.device)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> dict:
        d = {"device": self.device, "dtype": self.dtype_name}
        if self.name == "flex":
            d["compiled"] = self.compiled
        if self.query_block:
            d["query_block"] = self.query_block
        return d

    def embed(self, ids_BC):
        return self.model.embed(ids_BC.to(self.device)).to(self.dtype)

    def _attend(self, batch):
        from packtool.verify.model import make_attend

        return make_attend(self.name, batch, device=self.device, compile=self.compiled,
                           query_block=self.query_block)

    def forward(self, h_BCE, batch, attend_factory=None):
        """float32 logits [B, C, V] of the packed rows."""
        torch = require_torch()
        pos = batch["position_ids"].to(self.device)
        make = attend_factory or (lambda b, dev: self._attend(b))
        if self.per_row and h_BCE.shape[0] > 1:
            outs = []
            for r in range(h_BCE.shape[0]):
                sub = {**batch, "segment_ids": batch["segment_ids"][r:r + 1]}
                outs.append(self.model.forward_embeds(h_BCE[r:r + 1], pos[r:r + 1],
                                                      make(sub, self.device)))
            return torch.cat(outs).float()
        return self.model.forward_embeds(h_BCE, pos, make(batch, self.device)).float()

    def reference(self, docs, budget: int, *, model=None):
        """Per-document logits: list of float32 [L, V], one per document in ``docs``.

        Documents (1-D token tensors) are grouped by length into right-padded batches that fit
        ``budget`` bytes; attention is the written-out causal reference in query blocks.
        """
        torch = require_torch()
        from packtool.verify.model import reference_attend

        m = model if model is not None else self.ref_model
        out = [None] * len(docs)
        for group, qb in _doc_groups([int(d.shape[0]) for d in docs], budget, m.heads):
            Lmax = max(int(docs[i].shape[0]) for i in group)
            ids = torch.zeros((len(group), Lmax), dtype=torch.int64)
            for j, i in enumerate(group):
                ids[j, :docs[i].shape[0]] = docs[i]
            ids = ids.to(self.device)
            pos = torch.arange(Lmax, device=self.device)[None].expand(len(group), Lmax)
            h = m.embed(ids).to(next(m.parameters()).dtype)
            lg = m.forward_embeds(h, pos, lambda q, k, v: reference_attend(q, k, v,
                                                                           query_block=qb))
            for j, i in enumerate(group):
                out[i] = lg[j, :docs[i].shape[0]].float()
        return out

    def alone_finite(self, ids_L) -> bool:
        """Whether the float32 model on the tokens ``ids_L`` (int [L]) alone, one document at
        positions 0..L-1 with the written-out causal attention, gives finite logits and a
        finite gradient of their sum at its input embeddings."""
        torch = require_torch()
        from packtool.verify.model import reference_attend

        m = self.ref_model
        ids = ids_L.reshape(1, -1).to(self.device)
        pos = torch.arange(ids.shape[1], device=self.device)[None]
        with torch.enable_grad():
            h = m.embed(ids).detach().requires_grad_(True)
            lg = m.forward_embeds(h.clone(), pos, lambda q, k, v: reference_attend(q, k, v))
            lg.float().sum().backward()
        return bool(torch.isfinite(lg).all()) and bool(torch.isfinite(h.grad).all())

    def tolerance(self, ref_absmax: float) -> float:
        torch = require_torch()
        if self.dtype != torch.float32:
            return 2 * self.eager_error + BF16_FLOOR
        rtol = FP32_RTOL_CPU if self.device == "cpu" else FP32_RTOL_CUDA
        return rtol * max(1.0, ref_absmax)

    def row_bytes(self, capacity: int) -> int:
        """Estimated bytes of one row's packed forward + backward at capacity C."""
        act = capacity * _ACT_BYTES_PER_TOKEN
        if self.name == "sdpa":
            rows = self.query_block or capacity
            return act + _MASK_BYTES_PER_PAIR * rows * capacity
        if self.name == "flex" and not self.compiled:  # eager: dense scores per head
            return act + 4 * 4 * self.model.heads * capacity * capacity
        return act


def _doc_groups(lengths, budget: int, heads: int):
    """Yield (document indices, query block) groups for batched reference passes.

    Documents are sorted by length; a group grows while its padded tokens' activations plus one
    query block of scores (heads x query block x L floats, three copies) stay within ``budget``.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    i = 0
    while i < len(order):
        group = [order[i]]
        L = lengths[order[i]]
        j = i + 1
        while j < len(order):
            L2 = lengths[order[j]]
            if (len(group) + 1) * L2 * _ACT_BYTES_PER_TOKEN > budget // 2 or len(group) >= 64:
                break
            group.append(order[j])
            L = L2
            j += 1
        qb = max(16, min(512, int((budget // 4) // max(1, 12 * heads * L * len(group)))))
        yield group, qb
        i = j


class HybridRunner(Runner):
    """The test decoder with mixer layers (:mod:`packtool.verify.hybrid`) beside SDPA attention.

    The mixers get the batch's ``seq_idx`` (what :func:`packtool.loader.collate` hands out); a
    batch without it runs them as one sequence per row, which is what a training loop that does
    not pass ``seq_idx`` gets. ``hybrid`` computes the mixers in plain torch; ``mamba`` with the
    causal-conv1d and mamba-ssm kernels on CUDA, its per-document references through the same
    kernels.
    """

    def __init__(self, name: str, seed: int, device: str):
        torch = require_torch()
        from packtool.verify.model import build_model

        impl = "kernels" if name == "mamba" else "torch"
        base = build_model(seed=seed, mixer_layers=HYBRID_MIXER_LAYERS, mixer_impl=impl)
        super().__init__(name, base, device, torch.float32)
        self.backward = True
        self.no_backward_reason = ""
        # mamba-ssm's backward sums decays over whole 64-token chunks, documents mixed: the
        # other documents' terms cancel up to rounding, so their gradient is ~1e-20, not 0
        self.grad_pad_tol = 1e-9 if impl == "kernels" else 0.0

    @property
    def ref_key(self):
        return (self.name, self.device)

    def describe(self) -> dict:
        d = super().describe()
        d["mixers"] = self.model.mixer_impl
        return d

    def _attend(self, batch):
        from packtool.verify.model import make_attend

        return make_attend("sdpa", batch, device=self.device, query_block=self.query_block)

    def forward(self, h_BCE, batch, attend_factory=None):
        """float32 logits [B, C, V]; the mixers reset where ``batch["seq_idx"]`` changes."""
        make = attend_factory or (lambda b, dev: self._attend(b))
        seq = batch.get("seq_idx")
        seq = None if seq is None else seq.to(self.device)
        return self.model.forward_embeds(h_BCE, batch["position_ids"].to(self.device),
                                         make(batch, self.device), seq).float()

    def row_bytes(self, capacity: int) -> int:
        """SDPA's row (activations and mask) plus the mixers' chunked recurrence (float64 decays
        and float32 weights of 64 x 64 pairs per chunk and head)."""
        rows = self.query_block or capacity
        return (capacity * _ACT_BYTES_PER_TOKEN + _MASK_BYTES_PER_PAIR * rows * capacity
                + capacity * 64 * self.model.heads * 24)


def padding_token(model, vocab: int) -> int | None:
    """The padding token of a Hugging Face ``model`` (its input embedding's ``padding_idx``,
    else its config's ``pad_token_id``), when it is one of its ``vocab`` ids; else None."""
    pad = getattr(model.get_input_embeddings(), "padding_idx", None)
    if pad is None:
        cfg = getattr(model, "config", None)
        cfg = getattr(cfg, "get_text_config", lambda: cfg)() if cfg is not None else None
        pad = getattr(cfg, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) and 0 <= pad < vocab else None


def embeds_refused(model, fold) -> str | None:
    """Why a Hugging Face ``model`` refuses ``inputs_embeds`` where it takes ``input_ids``
    (CPM-Ant checks the ids' dtype, DeepSeek-V4 routes its experts by token id), in one line;
    None when it takes ``inputs_embeds``, or when it takes neither or calls its input embedding
    other than once a forward (then the checks run it on ``inputs_embeds`` and say what it
    raises). Probed on a copy (a forward may leave caches in the model), four tokens folded by
    ``fold``."""
    torch = require_torch()
    probe = copy.deepcopy(model)
    emb = probe.get_input_embeddings()
    ids = fold(torch.arange(3, 7, device=emb.weight.device)[None])
    try:
        with torch.no_grad():
            probe(inputs_embeds=emb(ids), use_cache=False)
        return None
    except Exception as exc:  # noqa: BLE001 - what transformers raises is its own
        if isinstance(exc, (KeyboardInterrupt, MemoryError)):
            raise
        why = exc_line(exc)
    calls = []
    handle = emb.register_forward_hook(lambda mod, args, out: calls.append(tuple(out.shape)))
    try:
        with torch.no_grad():
            probe(input_ids=ids, use_cache=False)
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, (KeyboardInterrupt, MemoryError)):
            raise
        return None
    finally:
        handle.remove()
    return why if len(calls) == 1 and calls[0][:2] == (1, 4) else None


class HFRunner(Runner):
    """A tiny random Hugging Face causal LM fed the packed rows as :class:`HFCollator` feeds
    them (``position_ids``, ``seq_idx``, ``use_cache=False``, no ``attention_mask``): a Llama by
    default, or the architecture of the user's config shrunk to a test size
    (:mod:`packtool.verify.hf_model`, ``verify --hf-config``).

    When transformers refuses ``seq_idx`` (hybrid layers without their CUDA kernels), the rows run
    without it, as a training loop that drops it would, and :attr:`refused` keeps the message.

    The model is fed ``inputs_embeds`` (the embeddings the gradient checks differentiate); a
    model that takes ``input_ids`` only (:attr:`ids_only`) is fed the ids, and its input
    embedding's output is replaced by those embeddings (:meth:`_run`), so it computes the same.
    """

    def __init__(self, seed: int, capacity: int, device: str, config=None,
                 longest: int | None = None, row: int | None = None):
        """Args: seed; capacity: C of the rows it runs (the tiny Llama's positions cover it);
        device; config: the user's Hugging Face config, run as given (shrunk in its sizes, not
        in its position limit or rotary scaling); longest: the output's longest span (its
        largest ``max_seqlen``), which :attr:`position_fault` holds the model's position limit
        against (None: not checked); row: C of the output's rows, held against the limit of
        a model that takes sequences of at most so many tokens (None: not checked)."""
        torch = require_torch()
        self.name, self.device, self.dtype = "hf", device, torch.float32
        self.refused: str | None = None  #: transformers' message when it refused seq_idx
        #: why the user's model cannot take the output's positions (one line), or None
        self.position_fault: str | None = None
        if config is None:
            from transformers import LlamaConfig, LlamaForCausalLM

            cfg = LlamaConfig(vocab_size=HF_VOCAB, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=max(2048, capacity), use_cache=False)
            cfg._attn_implementation = "sdpa"
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = LlamaForCausalLM(cfg).eval().to(device)
            self.config = None
        else:
            from packtool.verify.hf_model import build_hf_model, position_fault, shrink_config

            # the position limit and rotary scaling as given: the rows' positions are held
            # against them (position_fault), and a rotary scaling that follows the batch's
            # largest position shows as the place effect it is
            cfg = shrink_config(config)
            model = build_hf_model(cfg, seed=seed, device="cpu")  # probed on the CPU first
            if longest is not None:
                self.position_fault = position_fault(model, cfg, longest, row)
            model = model.to(device)
            self.config = cfg
        self.model = self.ref_model = model
        self.vocab = int(model.get_input_embeddings().num_embeddings)
        self.reserved = padding_token(model, self.vocab)
        #: why the model refuses ``inputs_embeds`` when it is fed ``input_ids`` instead
        #: (:func:`embeds_refused`), or None
        self.ids_only = embeds_refused(model, self.fold) if config is not None else None
        self.compiled, self.query_block = False, None
        self.backward, self.no_backward_reason, self.per_row = True, "", False
        self.eager_error = 0.0

    @property
    def ref_key(self):
        return ("hf", self.device)

    def describe(self) -> dict:
        d = {"device": self.device, "dtype": self.dtype_name}
        if self.config is not None:
            from packtool.verify.hf_model import decoder_layers, layer_kind

            d["model"] = f"{self.config.model_type}, " + "; ".join(
                layer_kind(self.config, i, m) for i, m in enumerate(decoder_layers(self.model)))
        if self.refused:
            d["seq_idx"] = ("refused by transformers here; run without it and the "
                            "cu_seq_lens keywords")
        if self.ids_only:
            d["fed"] = f"input_ids (inputs_embeds refused: {self.ids_only})"
        return d

    def embed(self, ids_BC):
        return self.model.get_input_embeddings()(self.fold(ids_BC.to(self.device)))

    def _run(self, h_BCE, ids_BC, **kwargs):
        """The model's output on the embeddings ``h_BCE`` of the token ids ``ids_BC``:
        ``inputs_embeds``, or, for a model that takes ``input_ids`` only, the ids with its input
        embedding's output replaced by ``h_BCE`` (a forward hook), so gradients reach it."""
        if self.ids_only is None:
            return self.model(inputs_embeds=h_BCE, **kwargs)
        handle = self.model.get_input_embeddings().register_forward_hook(
            lambda mod, args, out: h_BCE)
        try:
            return self.model(input_ids=self.fold(ids_BC.to(self.device)), **kwargs)
        finally:
            handle.remove()

    def _call(self, h_BCE, position_ids_BC, seq_idx_BC, flash=None, ids_BC=None):
        kwargs = {"position_ids": position_ids_BC, "use_cache": False}
        packed = {**(flash or {}), **({} if seq_idx_BC is None else {"seq_idx": seq_idx_BC})}
        if packed and self.refused is None:
            try:
                return self._run(h_BCE, ids_BC, **kwargs, **packed).logits.float()
            except ValueError as exc:
                # hybrid layers without their kernels refuse seq_idx and cu_seq_lens alike
                from packtool.verify.hf_model import REFUSAL_MARK

                if REFUSAL_MARK not in str(exc):
                    raise
                self.refused = first_line(exc)
        return self._run(h_BCE, ids_BC, **kwargs).logits.float()

    def forward(self, h_BCE, batch, attend_factory=None):
        """float32 logits [B, C, V] of the packed rows: ``h_BCE`` the embeddings of the
        batch's ``input_ids``."""
        # no attention_mask: transformers derives the document blocks from position_ids
        seq = batch.get("seq_idx")
        return self._call(h_BCE, batch["position_ids"].to(self.device),
                          None if seq is None else seq.to(self.device), self._flash(batch),
                          batch["input_ids"])

    def _flash(self, batch) -> dict:
        """The FlashAttention 2 keywords :class:`HFCollator` adds (over the batch's B * C
        tokens), so the model gets what training hands it."""
        cu = batch["cu_seqlens"].to(self.device)
        m = int(batch["max_seqlen"])
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": m, "max_length_k": m}

    def reference(self, docs, budget: int, *, model=None):
        """Per-document logits: list of float32 [L, V], each document run alone.

        One forward per document, a batch of one holding that document only (positions
        0..L-1, no padding): a Hugging Face model may compute on the whole batch it is given
        (Phi-3's long rotary factors and dynamic NTK scaling follow the batch's largest
        position), so a document batched beside a longer one would be compared with what it
        gets packed, not with what it gets alone.
        """
        out = []
        for doc in docs:
            ids_1L = doc.reshape(1, -1).long()
            # embeddings in, as in the packed pass (some models scale input_ids' embeddings)
            lg_1LV = self._run(self.embed(ids_1L), ids_1L, use_cache=False).logits
            out.append(lg_1LV[0].float())
        return out

    def alone_finite(self, ids_L) -> bool:
        """Whether the model on the tokens ``ids_L`` (int [L]) alone (a batch of one, no other
        keyword) gives finite logits and a finite gradient of their sum at its input
        embeddings."""
        torch = require_torch()
        with torch.enable_grad():
            ids_1L = ids_L.reshape(1, -1).long()
            h = self.embed(ids_1L).detach().requires_grad_(True)
            lg = self._run(h.clone(), ids_1L, use_cache=False).logits
            lg.float().sum().backward()
        return bool(torch.isfinite(lg).all()) and bool(torch.isfinite(h.grad).all())

    def batch_position_effect(self) -> str | None:
        """Why this model's logits follow the batch's largest position (Phi-3 longrope), or
        None (:func:`packtool.verify.hf_model.batch_position_effect`)."""
        from packtool.verify.hf_model import batch_position_effect

        return batch_position_effect(self.config if self.config is not None
                                     else self.model.config)

    def diagnose(self, batch, spans: list) -> str:
        """For a model that leaked: ``documents leak in <layer>: this model needs ...``, found by
        changing document 1 of a row holding two documents (:mod:`packtool.verify.hf_model`)."""
        from packtool.verify.hf_model import leak_message, locate_leak, mrope_need

        row = next(r for r, sp in enumerate(spans) if len(sp) >= 2)
        pos = batch["position_ids"].to(self.device)
        seq = batch.get("seq_idx")
        seq = None if seq is None else seq.to(self.device)

        flash = self._flash(batch)

        def forward(ids):
            return self._call(self.embed(ids), pos, seq, flash, ids)

        located = locate_leak(self.model, forward, batch["input_ids"], spans[row], row,
                              self.changed_ids)
        need = None
        if located is not None:  # a multimodal-RoPE model fed the positions in the wrong form
            need = mrope_need(self.model, lambda ids, p: self._call(self.embed(ids), p, seq,
                                                                    flash, ids),
                              batch["input_ids"], spans[row], row, self.changed_ids, pos,
                              "verify gave it, as HFCollator() does,")
        return leak_message(self.config if self.config is not None else self.model.config,
                            located, self.refused, attention_need=need)

    def row_bytes(self, capacity: int, backward: bool = True) -> int:
        """Estimated bytes of one row's packed forward (+ backward) at capacity C (tokens):
        the activations, the packed-sequence mask transformers builds (bool and float copies),
        and, for the attention implementation the model runs (:func:`attention_scores`),
        the per-head score matrices it holds: eager attention keeps float32 [H, C, C] scores
        per layer for the backward (:data:`_EAGER_SAVED_PER_LAYER`) beside those alive at once
        (:data:`_EAGER_TRANSIENT`); SDPA with an ALiBi bias (Falcon) adds it to a float mask of
        one [C, C] per head (and a copy). ``backward=False``: a forward without gradients (the
        far-token probe)."""
        pairs = capacity * capacity
        out = capacity * _ACT_BYTES_PER_TOKEN + 2 * _MASK_BYTES_PER_PAIR * pairs
        impl, heads, layers, alibi = attention_scores(self.model)
        if impl == "eager":
            copies = _EAGER_TRANSIENT + (_EAGER_SAVED_PER_LAYER * layers if backward else 0)
            out += 4 * heads * copies * pairs
        elif alibi:
            out += 4 * heads * 2 * pairs
        return out


def attention_scores(model) -> tuple[str, int, int, bool]:
    """What decides the attention memory of a Hugging Face ``model`` per C x C pair:
    ``(implementation, heads, layers, alibi)``: the attention implementation its language model
    runs (``eager``, ``sdpa``...; ``sdpa`` when the config does not say), the most query heads
    its config gives a layer, its decoder layers
    (:func:`~packtool.verify.hf_model.decoder_layers`, at least 1) and whether it adds an ALiBi
    bias (a config's ``alibi``, MPT's in its ``attn_config``, or a model that always builds one:
    BLOOM; :func:`~packtool.verify.hf_model.adds_alibi`)."""
    from packtool.verify.hf_model import adds_alibi, decoder_layers

    cfg = model.config
    text = cfg.get_text_config() if callable(getattr(cfg, "get_text_config", None)) else cfg
    impl = (getattr(text, "_attn_implementation", None)
            or getattr(cfg, "_attn_implementation", None) or "sdpa")
    heads = [getattr(text, k, None) for k in ("num_attention_heads", "n_head", "n_heads",
                                             "num_heads")]
    heads = max([h for h in heads if isinstance(h, int) and h > 0], default=4)
    layers = max(1, len(decoder_layers(model)))
    return str(impl), heads, layers, adds_alibi(text.to_dict())


class ModelRunner(HFRunner):
    """A Hugging Face model as it is given (the one being trained), fed the batch a data
    collator built of packed rows (:func:`packtool.loader.hf.check_isolation`).

    The packed pass hands the model every key of the collator's batch but ``labels``
    (``position_ids``, ``cu_seq_lens_q``/``_k``, ``max_length_q``/``_k``, ``seq_idx``,
    ``use_cache``...) and the token ids as ``input_ids``, in the batch's own shape ([B, C], or
    [1, B * C] flattened) and dtype; a document alone is the model's forward of its ids and
    nothing else (positions from 0, ``use_cache=False``). Forward only, under ``torch.no_grad``,
    on the device and in the dtype of the model's input embeddings; the caller sets eval mode.

    Tolerance on logits (:meth:`tolerance`): in float32 the rule of :class:`Runner`
    (``1e-5 * max(1, max|ref|)`` on CPU, ``1e-4`` on a GPU); in bfloat16 or float16
    :data:`LOW_PRECISION_ULPS` ``* eps * max(1, max|ref|)`` (``eps``: the dtype's machine
    epsilon); in every dtype at least twice :attr:`eager_error`, the largest difference between
    the packed and the alone logits of the documents that open one of the model's sequences
    (nothing precedes them, so what differs there is the rounding of the two forwards), which
    :meth:`calibrate` measures.
    """

    def __init__(self, model, batch: dict):
        torch = require_torch()
        emb = model.get_input_embeddings()
        ids = batch["input_ids"]
        self.name, self.model, self.ref_model, self.config = "hf", model, model, None
        self.device, self.dtype = emb.weight.device, emb.weight.dtype
        self.vocab = int(emb.num_embeddings)
        self.reserved = padding_token(model, self.vocab)
        self.ids_shape, self.ids_dtype = tuple(ids.shape), ids.dtype
        #: the collator's batch but its ids and labels, on the model's device
        self.kwargs = {k: v.to(self.device) if torch.is_tensor(v) else v
                       for k, v in batch.items() if k not in ("input_ids", "labels")}
        self.refused = None
        self.compiled, self.query_block, self.per_row = False, None, False
        self.backward, self.no_backward_reason = False, "forward only"
        self.eager_error = 0.0

    def describe(self) -> dict:
        return {"device": str(self.device), "dtype": self.dtype_name}

    def embed(self, ids_BC):
        """The token ids themselves (inside the vocabulary), on the model's device: the model
        embeds them."""
        return self.fold(ids_BC.to(self.device))

    def _model_ids(self, ids_BC):
        return ids_BC.to(self.device, self.ids_dtype).reshape(self.ids_shape)

    def _logits(self, out):
        return out.logits if hasattr(out, "logits") else out[0]

    def forward(self, ids_BC, batch=None, attend_factory=None):
        """float32 logits [B, C, V] of the packed rows ``ids_BC`` (int [B, C]) through the
        collator's batch."""
        torch = require_torch()
        B, C = ids_BC.shape
        with torch.no_grad():
            logits = self._logits(self.model(input_ids=self._model_ids(ids_BC), **self.kwargs))
        if logits.shape[:-1].numel() != B * C:
            raise ValueError(f"the model returned logits of shape {list(logits.shape)} for "
                             f"{B} x {C} tokens")
        return logits.reshape(B, C, -1).float()

    def reference(self, docs, budget: int = 0, *, model=None):
        """Per-document logits: float32 [L, V] of each 1-D token tensor of ``docs``, its own
        forward (a batch of one, ``input_ids`` and ``use_cache=False`` only)."""
        torch = require_torch()
        out = []
        with torch.no_grad():
            for doc in docs:
                ids_1L = self.fold(doc.reshape(1, -1).to(self.device).long())
                out.append(self._logits(self.model(input_ids=ids_1L, use_cache=False))[0]
                           .float())
        return out

    def alone_finite(self, ids_L) -> bool:
        """Whether the model's logits on the tokens ``ids_L`` (int [L]) alone are finite
        (forward only, as every pass of this runner)."""
        torch = require_torch()
        return bool(torch.isfinite(self.reference([ids_L])[0]).all())

    def calibrate(self, ids_BC, spans: list, refs: list) -> None:
        """Run the packed rows once and set :attr:`eager_error` from the documents that open
        one of the model's sequences (each row's first document in a [B, C] batch, the batch's
        first in a flattened one).

        Args:
            ids_BC: int [B, C] token ids; spans: per row, the documents' (a, b); refs: per
                row, per document, (float32 logits [L, V], ...) of each alone.

        Raises:
            What the model raises on the collator's batch (transformers' ValueError on
            ``seq_idx`` without its kernels).
        """
        packed = self.forward(self.embed(ids_BC))
        C, L = ids_BC.shape[1], self.ids_shape[-1]
        noise = 0.0
        for r, row in enumerate(spans):
            for (a, b), ref in zip(row, refs[r]):
                if (r * C + a) % L == 0:
                    d = float((packed[r, a:b] - ref[0].to(packed.device)).abs().max())
                    noise = max(noise, d) if d == d else noise
        self.eager_error = noise

    def tolerance(self, ref_absmax: float) -> float:
        torch = require_torch()
        scale = max(1.0, ref_absmax)
        fp = self.dtype if self.dtype.is_floating_point else torch.bfloat16
        if torch.finfo(fp).bits >= 32:
            rule = (FP32_RTOL_CPU if self.device.type == "cpu" else FP32_RTOL_CUDA) * scale
        else:
            rule = LOW_PRECISION_ULPS * torch.finfo(fp).eps * scale
        return max(rule, 2 * self.eager_error)

    def _probe_row(self, batch, spans: list):
        """``(ids as the model takes them, the documents (a, b) of the first row holding two
        where the model sees them, that row of the model's)``: [B, C] rows, or one flattened
        row."""
        ids_BC = batch["input_ids"]
        C, L = ids_BC.shape[1], self.ids_shape[-1]
        row = next(r for r, sp in enumerate(spans) if len(sp) >= 2)
        at = [((row * C + a) % L, (row * C + b - 1) % L + 1) for a, b in spans[row]]
        return self._model_ids(self.embed(ids_BC)), at, row * C // L

    def locate(self, batch, spans: list):
        """Where document 1 of the first row holding two documents first reaches the others
        (:func:`packtool.verify.hf_model.locate_leak`, fed the collator's batch): ``(layer
        index, layer, sub-module name or None)``, or None when no layer's output on them moves.

        Args:
            batch: the :func:`~packtool.loader.collate` batch of the rows (its ``input_ids``).
            spans: per row, the documents' (a, b).
        """
        from packtool.verify.hf_model import locate_leak

        ids, at, row = self._probe_row(batch, spans)
        return locate_leak(self.model, lambda ids: self.model(input_ids=ids, **self.kwargs),
                           ids, at, row, self.changed_ids)

    def mrope_need(self, batch, spans: list, fed: str) -> str | None:
        """What this model needs when it is a multimodal-RoPE model that keeps the documents
        apart fed the collator's ``position_ids`` as [4, B, C], not as they are
        (:func:`packtool.verify.hf_model.mrope_need`; ``batch``, ``spans`` as :meth:`locate`
        takes them, ``fed``: who gave the positions, for the message), or None."""
        from packtool.verify.hf_model import mrope_need

        ids, at, row = self._probe_row(batch, spans)

        def forward(ids, position_ids):
            return self._logits(self.model(input_ids=ids, **{**self.kwargs,
                                                             "position_ids": position_ids}))

        return mrope_need(self.model, forward, ids, at, row, self.changed_ids,
                          self.kwargs.get("position_ids"), fed)

    def diagnose(self, batch, spans: list, **wording) -> str:
        """``documents leak in <layer>: this model needs ...`` (:meth:`locate`, then
        :func:`~packtool.verify.hf_model.leak_message` with ``wording``)."""
        from packtool.verify.hf_model import leak_message

        return leak_message(self.model.config, self.locate(batch, spans), None, **wording)


@contextmanager
def exact_float32():
    """TF32 off for CUDA matmuls and cuDNN inside the block (their float32 kernels would round
    inputs to 10 mantissa bits, 1e-3 relative, over the float32 tolerances), as it was after."""
    torch = require_torch()
    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def make_runner(name: str, base_model, *, device: str, capacity: int, budget: MemoryBudget,
                seed: int, compile: bool | None, hf_config=None, longest: int | None = None,
                row: int | None = None):
    """Build the runner of backend ``name``.

    Args:
        name: one of :data:`ALL_BACKENDS`.
        base_model: the float32 test decoder on CPU (:func:`~packtool.verify.model.build_model`).
        device: ``cpu`` or ``cuda`` for sdpa, flex and hf; varlen and flash always use CUDA.
        capacity: C of the output.
        budget: bytes for one batch of model passes.
        seed: seeds the Hugging Face model.
        compile: FlexAttention through ``torch.compile``; None: compiled unless C is small
            enough that eager FlexAttention (dense scores) fits the budget on CPU, always on CUDA.
        hf_config: a Hugging Face config whose architecture the ``hf`` backend builds (shrunk)
            instead of its tiny Llama.
        longest, row: the output's longest span and C, held against ``hf_config``'s
            position limit (:attr:`HFRunner.position_fault`).

    Returns:
        ``(runner, reason)``: a runner, or None and why the backend cannot run within the budget.
    """
    torch = require_torch()
    if name == "hf":
        r = HFRunner(seed, capacity, device, hf_config, longest, row)
    elif name in ("hybrid", "mamba"):
        r = HybridRunner(name, seed, "cuda" if name == "mamba" else device)
        if r.row_bytes(capacity) > budget.bytes:  # SDPA in query blocks, as the sdpa runner
            spare = budget.bytes - (r.row_bytes(capacity) - _MASK_BYTES_PER_PAIR * capacity**2)
            qb = spare // (_MASK_BYTES_PER_PAIR * capacity)
            if qb >= 16:
                r.query_block = int(min(qb, capacity))
    elif name in ("varlen", "flash"):
        r = Runner(name, base_model, "cuda", torch.bfloat16)
    elif name == "flex":
        if compile is None:
            eager_bytes = 4 * 4 * base_model.heads * capacity * capacity
            compile = device == "cuda" or eager_bytes + capacity * _ACT_BYTES_PER_TOKEN > \
                budget.bytes or capacity >= 2048
        r = Runner(name, base_model, device, torch.float32, compiled=bool(compile))
    else:
        r = Runner(name, base_model, device, torch.float32)
        if r.row_bytes(capacity) > budget.bytes:
            spare = budget.bytes - capacity * _ACT_BYTES_PER_TOKEN
            qb = spare // (_MASK_BYTES_PER_PAIR * capacity)
            if qb < 16:
                return None, (f"one row at C={capacity} needs more than the memory budget "
                              f"{budget}; raise --max-memory")
            r.query_block = int(min(qb, capacity))
    if r.row_bytes(capacity) > budget.bytes:
        return None, (f"one row at C={capacity} needs about {r.row_bytes(capacity) / _GIB:.2f} "
                      f"GiB, over the memory budget {budget}; raise --max-memory")
    return r, ""
