"""Verify on the user's own architecture: ``packtool verify OUTPUT --hf-config PATH``.

The ``hf`` backend then builds the architecture of that Hugging Face config instead of its tiny
Llama: the same model class and layer pattern (attention, Mamba / SSD, gated DeltaNet, short
convolutions, mixture of experts...), shrunk to a width of 64 with a 512-token vocabulary and
the fewest leading layers that hold every layer type, random weights. It is fed the packed rows
with the keywords packtool hands a Hugging Face model (:class:`packtool.loader.HFCollator`:
``position_ids``, ``seq_idx``, ``use_cache=False``, no ``attention_mask``) and compared with each
document run alone, by the usual checks. When documents leak, :func:`locate_leak` finds the
first layer whose output on document 2 moves when document 1 changes, and :func:`leak_message`
says what that layer needs.

What transformers does on CPU (5.x): attention layers find documents from the position resets;
Mamba-2 and convolution layers hand ``seq_idx`` to the causal-conv1d / mamba-ssm kernels only,
and without those kernels refuse it (ValueError "can't keep packed sequences apart"), so the
backend runs them without it and reports the leak; some layers ignore ``seq_idx`` altogether.
The table of which models do what is in ``docs/architectures.md``.

Nothing is downloaded: PATH is a local ``config.json`` (or its directory), or a model name that
is already in the transformers cache (``local_files_only``); configs that need remote code are
refused.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path

from packtool.errors import InputError, MissingDependencyError, exc_line, install_hint
from packtool.verify import require_torch

__all__ = ["load_hf_config", "refuse_remote_code", "shrink_config", "build_hf_model", "decoder_layers", "layer_kind",
           "locate_leak", "leak_message", "kernel_need", "batch_position_effect", "position_limit",
           "position_switch", "position_fault", "reads_mrope", "mrope_need", "REFUSAL_MARK",
           "HF_CONFIG_VOCAB", "MAX_TEST_PARAMS", "adds_alibi"]

#: vocabulary of the shrunk model (token ids are folded with ``% V``)
HF_CONFIG_VOCAB = 512
_WIDTH = 64
#: what transformers says when it refuses ``seq_idx`` / ``cu_seqlens`` without the kernels
REFUSAL_MARK = "packed sequences"

#: config fields set to small values when the config has them (None: removed, recomputed by
#: the config class from the others)
_SMALL = {
    "vocab_size": HF_CONFIG_VOCAB, "hidden_size": _WIDTH, "num_attention_heads": 4,
    "head_dim": 16, "n_group": 1, "topk_group": 1,
    "num_expert_group": 1,
    # Mamba-2 / SSD layers (Bamba, Falcon-H1, Granite hybrid, Nemotron-H, Zamba2, Mamba2)
    "mamba_n_heads": 4, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_chunk_size": 32,
    "mamba_num_heads": 4, "mamba_head_dim": 32, "ssm_state_size": 16, "n_groups": 1,
    "chunk_size": 32, "num_heads": 4, "state_size": 16, "time_step_rank": 8,
    "mamba_dt_rank": 8, "n_mamba_heads": 4, "mamba_ngroups": 1, "adapter_rank": 8,
    # gated DeltaNet and other linear attention (Qwen3-Next, OLMo hybrid, Kimi linear)
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_num_heads": 4, "linear_head_dim": 16,
    "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16, "qk_head_dim": 16,
    # recurrent and short-convolution blocks (RecurrentGemma, LFM2, MiniMax)
    "lru_width": _WIDTH, "block_multiple_of": 16, "block_size": 16,
    # the same sizes under older names (GPT-2, OPT, DBRX, T5...)
    "n_embd": _WIDTH, "d_model": _WIDTH, "word_embed_proj_dim": _WIDTH, "n_head": 4,
    "n_heads": 4, "d_kv": 16,
    # the width under xLSTM's name; the output layer's real rows (Inkling 2) and its
    # sliding-window attention's own head sizes
    "embedding_dim": _WIDTH, "unpadded_vocab_size": HF_CONFIG_VOCAB,
    "swa_num_attention_heads": 4, "swa_head_dim": 16,
}
#: feed-forward (intermediate) sizes under every name transformers gives them (Llama's
#: intermediate_size, Falcon's and DBRX's ffn_hidden_size, OPT's ffn_dim, T5's d_ff, GPT-2's
#: n_inner, Llama 4's intermediate_size_mlp, BART's decoder_ffn_dim...): 128, or 32 for an
#: expert's or a shared expert's (:func:`_ffn_size`)
_FFN_SIZE = re.compile(r"(?:^|_)(?:intermediate_size|intermediate_dim|ffn_dim|ffn_hidden_size|"
                       r"ffn_size|d_ff|n_inner|d_inner|feed_forward_size|feed_forward_hidden_size|"
                       r"mlp_hidden_size|mlp_dim)(?:_mlp)?$")
_FFN_SMALL, _EXPERT_FFN_SMALL = 128, 32
#: key/value head counts under every name transformers gives them (num_key_value_heads,
#: Falcon's num_kv_heads, DBRX's kv_n_heads, an indexer's indexer_kv_heads, per-layer lists...)
#: and the query-head fields each is paired with: the same prefix and suffix first
_KV_HEADS = re.compile(r"^(?P<pre>\w*?)(?:num_key_value_heads|num_key_value_attention_heads|"
                       r"num_kv_heads|n_kv_heads|kv_n_heads|kv_heads|n_head_kv|num_heads_kv)"
                       r"(?P<post>_per_layer)?$")
_QUERY_HEADS = ("num_attention_heads", "n_heads", "n_head", "num_heads", "attention_heads")
#: counts lowered to these values, never raised (0 shared experts stays none, a router that
#: picks 1 expert keeps 1; unset ones get the value); Gemma 3n / 4 per-layer input embeddings
_AT_MOST = {
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "num_experts_per_token": 2, "n_shared_experts": 1, "num_shared_experts": 1,
    "vocab_size_per_layer_input": HF_CONFIG_VOCAB, "hidden_size_per_layer_input": 16,
}
#: scales of the random weights raised to at least these values, never lowered: a leak through
#: a recurrence or a convolution shrinks with the third or fourth power of the weights' scale,
#: so a config's small ``initializer_range`` (Jamba or LFM2 at 0.002 to 0.005) gave the test
#: model a leak below the checks' tolerance (1e-5 of the largest logit); at 0.02, the scale most
#: configs give, the same leaks are 46x to 270x over it
_INIT_AT_LEAST = {
    "initializer_range": 0.02, "init_std": 0.02, "initializer_std": 0.02,
    "embedding_initializer_range": 0.02, "embed_init_std": 0.02, "initializer_factor": 1.0,
}
#: counts of trailing layers of their own kind (Gemma 3n's layers reusing earlier layers' keys
#: and values): one such layer is kept after the leading ones
_TRAILING_LAYER_COUNTS = ("num_kv_shared_layers",)
#: layer counts under other names than num_hidden_layers, cut to 2
_LAYER_COUNTS = ("n_layer", "n_layers", "num_layers")
#: the most parameters a shrunk model may have (a few MB; the sizes shrinking does not reach
#: would otherwise build a full-size model)
MAX_TEST_PARAMS = 20_000_000
#: fields a config class derives from the width; removed so that it derives them again
_DERIVED = ("attention_hidden_size", "attention_head_dim", "mamba_headdim", "kv_channels",
            "num_query_groups", "mamba_d_head", "mamba_d_ssm")
#: per-layer lists that name each layer's kind (GPT-Neo's attention_layers: its expanded
#: attention_types); every list of one entry a layer is cut with the layers
_LAYER_LISTS = ("layer_types", "layers_block_type", "block_types", "mlp_layer_types",
                "attention_layers")
#: lists of layer indices: the layers kept are kept, and the first of each kind with them
_LAYER_INDEX_LISTS = ("full_attn_idxs", "hybrid_layer_ids", "mlp_only_layers",
                      "attn_layer_indices", "moe_layers")
#: rotary fields with one entry per rotary frequency (head_dim x partial_rotary_factor / 2):
#: lists of that length (Phi-3 longrope), or sections summing to it (multimodal RoPE)
_ROPE_FACTOR_LISTS = ("short_factor", "long_factor")
_ROPE_SECTIONS = ("mrope_section",)
#: class-name words of the sub-modules that mix tokens (the places a leak can start)
_MIXER_WORDS = ("Attention", "Attn", "Mixer", "Mamba", "Conv", "DeltaNet", "Recurrent",
                "Lightning", "Linear", "SSM", "Rglru", "RGLRU")
_ATTENTION_ONLY = re.compile(r"(Attention|Attn)$")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MissingDependencyError("--hf-config needs transformers: "
                                     + install_hint("hf")) from None
    return transformers


def load_hf_config(spec: str):
    """The Hugging Face config ``spec`` names, without touching the network.

    Args:
        spec: a ``config.json`` file, a directory holding one, or a model name already in the
            transformers cache.

    Returns:
        A ``transformers.PretrainedConfig``.

    Raises:
        InputError: no such file, not a JSON config, an unknown ``model_type`` (or one that needs
            remote code), or a model name the cache does not hold.
        MissingDependencyError: transformers is not installed.
    """
    tf = _transformers()
    from transformers import AutoConfig

    p = Path(spec).expanduser()
    if p.is_file():
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{p}: not a JSON model config ({exc})") from None
        kind = d.get("model_type") if isinstance(d, dict) else None
        if isinstance(d, dict):
            refuse_remote_code(d, str(p))
        if kind not in tf.CONFIG_MAPPING:
            raise InputError(f"{p}: model_type {kind!r} is not one transformers "
                             f"{tf.__version__} knows (configs that need remote code are not "
                             "run); give the config of a model transformers implements")
        try:  # from_json_file decodes what to_json_file encodes (e.g. infinities)
            return tf.CONFIG_MAPPING[kind].from_json_file(str(p))
        except Exception as exc:  # noqa: BLE001 - config classes validate with their own errors
            # (huggingface_hub's StrictDataclassClassValidationError is a bare Exception)
            raise InputError(f"{p}: transformers refuses this {kind} config: "
                             f"{_one_line(exc)}") from None
    looks_local = p.exists() or spec.startswith((".", "/", "~")) or spec.endswith(".json")
    missing = f"{spec}: no such file or directory{_missing_part(p)}"
    if looks_local and not p.is_dir():
        raise InputError(f"{missing}; give a config.json, its directory, or a model name "
                         "already in the transformers cache")
    try:
        cfg = AutoConfig.from_pretrained(str(p) if p.is_dir() else spec, local_files_only=True,
                                         trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - OSError, ValueError, or a config's validation
        if not p.is_dir() and len(p.parts) > 1 and Path(p.parts[0]).is_dir():
            # cfg/nonexist beside a local cfg/: a mistyped path, not a model name
            raise InputError(f"{missing}, nor a model name in the transformers cache; give a "
                             "config.json, its directory, or a model name already in the "
                             "transformers cache") from None
        where = f"{p}: no usable config.json" if p.is_dir() else (
            f"{spec}: not in the transformers cache (packtool never downloads; fetch it first, "
            f"e.g. `hf download {spec} config.json`, or give a local config.json)")
        raise InputError(f"{where}: {_one_line(exc)}") from None
    refuse_remote_code(cfg.to_dict(), str(p / "config.json") if p.is_dir() else spec)
    return cfg


def _missing_part(p: Path) -> str:
    """`` (cfg/ has no nonexist)``: the deepest directory of ``p`` that exists and the first
    name missing in it, or '' when not even the first exists."""
    for parent in p.parents:
        if str(parent) not in ("", ".") and parent.is_dir():
            where = str(parent) if str(parent).endswith("/") else f"{parent}/"
            return f" ({where} has no {p.relative_to(parent).parts[0]})"
    return ""


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (a validator's reason is often on its second line), or its
    type's name when it has none."""
    return " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip()) or \
        type(exc).__name__


def refuse_remote_code(d: dict, where: str) -> None:
    """Refuse a config that names remote code (``auto_map``, here or in a nested sub-config).

    transformers would build its own class of that ``model_type`` instead of the model's code,
    so the verdict would be about another model.

    Args:
        d: the config as a dict (``config.json`` or ``PretrainedConfig.to_dict()``).
        where: the config's file or name, for the message.

    Raises:
        InputError: the config (or a sub-config) has a non-empty ``auto_map``.
    """
    found = _auto_map(d)
    if found is None:
        return
    path, amap = found
    code = sorted({str(v) if not isinstance(v, (list, tuple)) else str(v[0]) for v in
                   (amap.values() if isinstance(amap, dict) else [amap])})
    raise InputError(
        f"{where}: this config needs remote code ({path} names {', '.join(code)}); packtool "
        "runs only the classes transformers ships and would test transformers' own "
        f"{d.get('model_type')!r} class instead of yours; if you train that built-in class, "
        "give a copy of the config without auto_map")


def _auto_map(d, path: str = "auto_map"):
    """``(where, auto_map)`` of the first non-empty ``auto_map`` in ``d`` or its sub-configs."""
    if not isinstance(d, dict):
        return None
    if d.get("auto_map"):
        return path, d["auto_map"]
    for k, v in d.items():
        if isinstance(v, dict):
            sub = _auto_map(v, f"{k}.auto_map")
            if sub is not None:
                return sub
    return None


def _layer_types(cfg) -> list | None:
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if text is not cfg and text is not None:
        cfg = text
    for name in _LAYER_LISTS + ("hybrid_override_pattern",):
        v = getattr(cfg, name, None)
        if isinstance(v, (list, tuple, str)) and len(v) >= 1:
            return list(v)
    return None


def shrink_config(cfg):
    """A tiny copy of ``cfg``: the same model type and layer pattern, small everywhere else.

    Random weights at least at the usual scale (``initializer_range`` 0.02 or more:
    :data:`_INIT_AT_LEAST`), so that a leak shows over the checks' tolerance. Width 64, 4 heads
    of 16, feed-forward sizes 128 (32 an expert's; every name of
    :data:`_FFN_SIZE`), key/value heads that follow the query heads (:func:`_kv_count`: Falcon's
    ``num_kv_heads`` 8 of 128 become 2 of 4), vocabulary 512, at most 4 experts, small state and
    head sizes for SSM and linear-attention layers (MLA: rope and no-rope query heads of 8, a
    latent of 16); a model whose ALiBi slopes follow its number of heads (Falcon with
    ``alibi=True``, BLOOM, MPT) keeps its heads, of ``max(4, 64 // H)`` dimensions each;
    the layers are cut to the fewest leading ones (at least 2) that hold every layer type of the
    pattern, a first MoE layer after at most one leading dense one (``first_k_dense_replace``)
    and the first layer of each listed kind (``moe_layers``, ``full_attn_idxs``, a per-layer
    override...), and every per-layer field is cut with them (:func:`_cut_per_layer`); the
    per-frequency RoPE lists (longrope factors, ``mrope_section``, stated or left to the model
    class's default) follow the head size. Nested
    sub-configs (the ``text_config`` of Llama 4, Qwen3.5, Qwen3-VL, Gemma 3 or Mistral 3
    wrappers, their ``vision_config``...) are shrunk the same way. ``use_cache`` is off.

    Returns:
        A config of ``type(cfg)``.

    Raises:
        InputError: the config class refuses the small values (the message names the model
            type and the fields refused; give a config with them already small), or it needs
            remote code.
    """
    d = cfg.to_dict()
    refuse_remote_code(d, f"the {d.get('model_type')} config")
    _fill_rope_defaults(cfg, d)
    orig = copy.deepcopy(d)
    _shrink_sizes(d)
    cls = type(cfg)
    try:
        _cut_layers(d, cls.from_dict(d))
        small = cls.from_dict(d)
    except Exception as exc:  # noqa: BLE001 - whatever the config class validates with
        fields = _refused_fields(cls, orig, d, _one_line(exc))
        what = (f"{', '.join(fields)} of the shrunk config" if fields else
                "the shrunk config (packtool cannot tell which field)")
        raise InputError(f"could not shrink the {d.get('model_type')} config to a test size: "
                         f"its class refuses {what} ({type(exc).__name__}: {_one_line(exc)}); "
                         "give --hf-config a copy of the config with "
                         f"{'those fields' if fields else 'its sizes'} already small") from None
    small.use_cache = False
    for sub in _sub_configs(small).values():
        sub.use_cache = False
    return small


def _paths(d: dict, prefix: str = "") -> dict:
    """Every field of ``d`` and of its nested dicts by dotted path (``rope_parameters.short_factor``,
    ``text_config.hidden_size``), with its value."""
    out = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        out[path] = v
        if isinstance(v, dict):
            out.update(_paths(v, f"{path}."))
    return out


def _refused_fields(cls, orig: dict, small: dict, message: str) -> list[str]:
    """The fields of the shrunk config ``small`` that its class refused with ``message``.

    The fields the message names (a dotted path, or a field name with an underscore, the
    shallowest such field when several sub-configs have it), those packtool changed first;
    when it names none, the fields packtool changed whose original value alone makes the
    class accept the config.
    """
    before, after = _paths(orig), _paths(small)
    named: list[str] = []
    for tok in re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", message):
        tok = tok.removeprefix("config.").removeprefix("self.")
        if tok in after:
            hits = [tok]
        elif "_" in tok:
            hits = [p for p in after if p.rsplit(".", 1)[-1] == tok]
            hits = [p for p in hits if p.count(".") == min(h.count(".") for h in hits)]
        else:
            hits = []
        named += [h for h in hits if h not in named]
    named = [p for p in named if not any(q.startswith(p + ".") for q in named)]
    named.sort(key=lambda p: before.get(p) == after.get(p))  # changed first (stable)
    if named:
        return named[:4]
    tried = []
    for k, v in small.items():
        if k in orig and orig[k] != v:
            try:
                cls.from_dict({**small, k: orig[k]})
            except Exception:  # noqa: BLE001, S112 - refused all the same: not this field alone
                continue
            tried.append(k)
    return tried[:4]


def _sub_dicts(d: dict) -> dict:
    """The nested sub-configs of a config dict (``text_config``, ``vision_config``...)."""
    return {k: v for k, v in d.items() if isinstance(v, dict) and "model_type" in v}


def _sub_configs(cfg) -> dict:
    from transformers import PretrainedConfig

    return {k: v for k, v in vars(cfg).items() if isinstance(v, PretrainedConfig)}


def _shrink_sizes(d: dict, parent_heads: tuple | None = None) -> None:
    """Set the sizes of ``d`` and of its nested sub-configs to test values, in place.

    ``parent_heads``: ``(original, shrunk)`` query heads of the config ``d`` is part of, for a
    sub-config that holds key/value heads but not the query heads (DBRX's ``attn_config``).
    A model whose position bias follows its number of heads (:func:`adds_alibi`) keeps its heads,
    each of 4 or more dimensions (:func:`_keep_alibi_heads`).
    """
    orig = dict(d)
    for k in d:
        v = _small_value(k)
        if v is None and k in _SMALL:
            d[k] = None
        elif v is not None and _int_list(d[k]):  # one size a layer or a stage (Gemma 3n, Swin)
            d[k] = [v] * len(d[k])
        elif v is not None and (k in _SMALL or _size(d[k])):  # 0 or None: no such layer
            d[k] = v
    for k in [k for k in _SMALL if _SMALL[k] is None]:
        d.pop(k, None)
    for k, v in orig.items():  # num_attention_heads_per_layer...
        base = k.removesuffix("_per_layer")
        if base != k and _small_value(base) is not None and _int_list(v):
            d[k] = [_small_value(base)] * len(v)
    for k, v in _AT_MOST.items():
        if k in d:
            d[k] = min(d[k], v) if isinstance(d[k], int) and not isinstance(d[k], bool) else v
    for k, v in _INIT_AT_LEAST.items():
        if isinstance(d.get(k), (int, float)) and not isinstance(d[k], bool):
            d[k] = max(d[k], v)
    for k in _DERIVED:
        d.pop(k, None)
    if adds_alibi(orig):
        _keep_alibi_heads(d, orig)
    heads = _query_heads(orig, d) or parent_heads
    for name, before, after in _kv_pairs(orig, d, parent_heads):
        d[name] = (_kv_count(orig[name], before, after) if not _int_list(orig[name]) else
                   [_kv_count(k, _at(before, i), _at(after, i))
                    for i, k in enumerate(orig[name])])
    if orig.get("qk_rope_head_dim") is not None:  # MLA: the rope part is the head_dim
        if "head_dim" in d and orig.get("head_dim") == orig["qk_rope_head_dim"]:
            d["head_dim"] = d["qk_rope_head_dim"]
        if "qk_head_dim" in d:
            d["qk_head_dim"] = d.get("qk_nope_head_dim", 0) + d["qk_rope_head_dim"]
    if isinstance(orig.get("rotary_dim"), int):  # GPT-J, CodeGen: rotary part of each head
        head = _rotary_head(orig)
        small = _SMALL["hidden_size"] // _SMALL["num_attention_heads"]
        d["rotary_dim"] = max(2, min(small, orig["rotary_dim"] * small // head // 2 * 2)
                              if head else small)
    if isinstance(orig.get("first_k_dense_replace"), int) and orig["first_k_dense_replace"] > 0:
        d["first_k_dense_replace"] = 1  # one dense layer, then MoE
    expand = d.get("mamba_expand", d.get("expand", 2)) or 2
    inner = int(expand * _WIDTH)
    if "mamba_d_head" in orig:
        d["mamba_d_head"] = inner // d.get("mamba_n_heads", 4)
    if orig.get("mamba_d_ssm") is not None:
        d["mamba_d_ssm"] = inner
    if orig.get("model_type") == "mamba2":
        d["head_dim"] = inner // d["num_heads"]
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        v = d.get(k)
        if isinstance(v, int) and v >= HF_CONFIG_VOCAB:
            d[k] = HF_CONFIG_VOCAB - 1
        elif isinstance(v, list):
            d[k] = [min(x, HF_CONFIG_VOCAB - 1) for x in v]
    if isinstance(d.get("depth"), int) and d["depth"] > 2 and "patch_size" in d:
        d["depth"] = 2  # vision towers (Qwen-VL) count their blocks as depth
    if isinstance(d.get("embed_dim"), int) and d["embed_dim"] > _WIDTH and "patch_size" in d:
        d["embed_dim"] = _WIDTH  # and Qwen2-VL's names its width embed_dim
    _shrink_rope_lists(d, orig)
    for k, v in d.items():  # per-layer overrides (Gemma 4's per_layer_config): small too
        if _layer_keyed(v):
            for over in v.values():
                for name in list(over):
                    if _KV_HEADS.match(name) and d.get(name):
                        over[name] = d[name]
                    elif _small_value(name) is not None and isinstance(over[name], int):
                        over[name] = _small_value(name)
    for sub in _sub_dicts(d).values():
        _shrink_sizes(sub, heads)


def _size(v) -> bool:
    """Whether ``v`` is a positive int (a size; 0 or None says there is no such layer)."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _ffn_size(name: str) -> int | None:
    """The test size of the feed-forward (intermediate) size field ``name`` (:data:`_FFN_SIZE`):
    32 for an expert's or a shared expert's, 128 for the others; None when ``name`` is not one."""
    if not _FFN_SIZE.search(name):
        return None
    return _EXPERT_FFN_SMALL if re.search(r"moe|expert|shared", name) else _FFN_SMALL


def _small_value(name: str):
    """The test value of field ``name``: :data:`_SMALL`'s, else a feed-forward size's, else
    None."""
    v = _SMALL.get(name)
    return v if v is not None else _ffn_size(name)


def adds_alibi(d: dict) -> bool:
    """Whether the model of config dict ``d`` adds an ALiBi bias, whose slopes follow its number
    of heads: an ``alibi`` field that is set (Falcon; MPT's in its ``attn_config``), or, where
    the config has none, a modeling file that builds one always (BLOOM).

    Args:
        d: a config as a dict (``PretrainedConfig.to_dict()``), nested dicts included.

    Returns:
        True when the model adds an ALiBi bias; False otherwise, and for a model type this
        transformers does not know. Raises nothing.
    """
    parts = [d] + [v for v in d.values() if isinstance(v, dict) and not v.get("model_type")]
    said = [p["alibi"] for p in parts if "alibi" in p]
    if said:
        return any(bool(x) for x in said)
    return _builds_alibi(str(d.get("model_type") or ""))


@functools.lru_cache(maxsize=None)
def _builds_alibi(model_type: str) -> bool:
    """Whether transformers' modeling file of ``model_type`` builds an ALiBi bias."""
    import importlib.util

    try:
        from transformers import CONFIG_MAPPING

        module = CONFIG_MAPPING[model_type].__module__
        spec = importlib.util.find_spec(module.replace(".configuration_", ".modeling_"))
        text = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
    except (KeyError, ImportError, ValueError, OSError):
        return False
    return "build_alibi_tensor" in text or "build_mpt_alibi_tensor" in text


def _keep_alibi_heads(d: dict, orig: dict) -> None:
    """Give the shrunk ``d`` the query heads of ``orig``, in place, each of ``max(4, 64 // H)``
    dimensions (the width follows): ALiBi's slopes are taken from the number of heads (Falcon's
    and BLOOM's, 2^(-8 i / H) over the nearest power of two), and a model of 4 heads has other
    slopes than one of 32 or 71 (Falcon rounds the bias to bfloat16: exact with slopes that are
    powers of two, inexact with the others)."""
    for k in _QUERY_HEADS:
        if _size(orig.get(k)) and k in d:
            d[k] = orig[k]
    H = next((d[k] for k in _QUERY_HEADS if _size(d.get(k))), None)
    if H is None:
        return
    head = max(4, _WIDTH // H)
    for k, v in _SMALL.items():
        if v == _WIDTH and k in d:
            d[k] = H * head
    if "head_dim" in d:
        d["head_dim"] = head


def _query_heads(orig: dict, d: dict, name: str | None = None) -> tuple | None:
    """``(original, shrunk)`` query heads of config dicts ``orig`` / ``d``: the field paired
    with the key/value-head field ``name`` (same prefix and suffix: ``swa_num_attention_heads``
    for ``swa_num_key_value_heads``), else the config's own; None when it has none."""
    m = _KV_HEADS.match(name) if name else None
    pre, post = (m["pre"], m["post"] or "") if m else ("", "")
    tries = [pre + q + post for q in _QUERY_HEADS] + [pre + q for q in _QUERY_HEADS] + \
        list(_QUERY_HEADS)
    for q in tries:
        a, b = orig.get(q), d.get(q)
        if (_size(a) or _int_list(a)) and (_size(b) or _int_list(b)):
            return a, b
    return None


def _kv_pairs(orig: dict, d: dict | None = None, parent_heads: tuple | None = None):
    """``(field, key/value heads, query heads)`` of each key/value head count of ``orig``
    (:data:`_KV_HEADS`; ``d`` the shrunk dict, else ``orig`` itself), with the query heads it
    is paired with: before and after shrinking when ``d`` is given, else those of ``orig``."""
    for name, v in orig.items():
        if not _KV_HEADS.match(name) or not (_size(v) or _int_list(v)):
            continue
        pair = _query_heads(orig, d if d is not None else orig, name) or parent_heads
        if pair is None:
            continue
        if d is None:
            for i, k in enumerate(v if _int_list(v) else [v]):
                yield name, k, _at(pair[1], i)
        else:
            yield name, pair[0], pair[1]


def _at(v, i: int):
    """``v[i]`` of a per-layer list, or ``v`` itself."""
    return v[min(i, len(v) - 1)] if isinstance(v, (list, tuple)) else v


def _kv_count(kv: int, before: int, after: int) -> int:
    """Key/value heads for ``after`` query heads where the model had ``kv`` for ``before``: the
    heads unchanged keep them; as many as the query heads (or more, which no model takes) stay
    as many; one for all stays one; a group of query heads a key/value head stays grouped (the
    largest divisor of ``after`` at most ``kv`` and at most ``after // 2``: 8 of 128 -> 2 of 4)."""
    if not _size(kv) or not _size(before) or not _size(after) or after == before:
        return kv
    if kv >= before:
        return after
    if kv == 1:
        return 1
    return max(g for g in range(1, max(1, after // 2) + 1) if after % g == 0 and g <= kv)


def _int_list(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(
        isinstance(x, int) and not isinstance(x, bool) for x in v)


def _layer_keyed(v) -> bool:
    """Whether ``v`` is a dict of per-layer overrides keyed by layer index (``{5: {...}}``, or
    ``{"05": {...}}`` as JSON writes it)."""
    return isinstance(v, dict) and len(v) > 0 and all(
        (isinstance(k, int) or (isinstance(k, str) and k.isdigit())) and isinstance(x, dict)
        for k, x in v.items())


def _rotary_head(d: dict) -> int | None:
    """The head dimension the rotary frequencies are taken from: the rope part of an MLA head
    (``qk_rope_head_dim``), else ``head_dim``, else width / heads."""
    for k in ("qk_rope_head_dim", "head_dim"):
        if isinstance(d.get(k), int) and d[k] > 0:
            return d[k]
    hidden = next((d[k] for k in ("hidden_size", "n_embd", "d_model")
                   if isinstance(d.get(k), int)), None)
    heads = next((d[k] for k in ("num_attention_heads", "n_head", "n_heads")
                  if isinstance(d.get(k), int) and d[k] > 0), None)
    return hidden // heads if hidden and heads else None


def _shrink_rope_lists(d: dict, orig: dict) -> None:
    """Cut the per-frequency RoPE lists of ``d`` with its head dimension, in place: Phi-3's
    longrope ``short_factor`` / ``long_factor`` (one factor per rotary frequency, resampled
    evenly) and multimodal RoPE's ``mrope_section`` (sections summing to the frequencies,
    scaled in proportion). ``rope_parameters`` (or ``rope_scaling``) may be one dict or one per
    layer type."""
    old, new = _rotary_head(orig), _rotary_head(d)
    if not old or not new or old == new:
        return
    for key in ("rope_parameters", "rope_scaling"):
        rp = d.get(key)
        if not isinstance(rp, dict):
            continue
        params = [rp] + [v for v in rp.values() if isinstance(v, dict)]
        for p in params:
            for name in _ROPE_FACTOR_LISTS:
                v = p.get(name)
                if isinstance(v, list) and v:
                    n = max(1, len(v) * new // old)
                    p[name] = [v[i * len(v) // n] for i in range(n)]
            for name in _ROPE_SECTIONS:
                v = p.get(name)
                if _int_list(v) and sum(v) > 0:
                    p[name] = _scaled_sections(v, sum(v) * new // old)


#: a modeling file reading a RoPE section list with a built-in default when the config leaves
#: it out: ``config.rope_parameters.get("mrope_section", [16, 24, 24])`` (Qwen2-VL, Qwen2.5-VL)
_SECTION_DEFAULT = re.compile(r"\.get\(\s*[\"'](\w+)[\"']\s*,\s*\[([\d,\s]+)\]\s*\)")


@functools.lru_cache(maxsize=None)
def _class_rope_defaults(config_module: str) -> tuple:
    """``((name, sections), ...)``: the :data:`_ROPE_SECTIONS` lists the modeling file beside
    the config module ``config_module`` reads with a default of its own (the first default
    each name is read with); empty when it has none or cannot be found."""
    import importlib.util

    if ".configuration_" not in config_module:
        return ()
    try:
        spec = importlib.util.find_spec(config_module.replace(".configuration_", ".modeling_"))
        text = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
    except (ImportError, ValueError, OSError):
        return ()
    found: dict = {}
    for name, nums in _SECTION_DEFAULT.findall(text):
        if name in _ROPE_SECTIONS and name not in found:
            found[name] = [int(x) for x in nums.split(",") if x.strip()]
    return tuple(found.items())


def _fill_rope_defaults(cfg, d: dict) -> None:
    """Write into ``d`` (``cfg.to_dict()``), in place, the class default of each RoPE section
    list the text config leaves out (Qwen2.5-VL's ``mrope_section`` [16, 24, 24], which its
    rotary embedding takes when ``rope_parameters`` has none), so that it is scaled with the head
    size as a stated one is (:func:`_shrink_rope_lists`); the rotary embedding would otherwise
    split heads of 16 into sections summing to 64."""
    text = _text_config(cfg)
    path: list = []
    if text is not cfg:  # where the text config sits among the nested sub-configs
        def find(c, at):
            for k, sub in _sub_configs(c).items():
                if sub is text:
                    return at + [k]
                got = find(sub, at + [k])
                if got is not None:
                    return got
            return None
        path = find(cfg, [])
        if path is None:
            return
    td = d
    for k in path:
        td = td.get(k) if isinstance(td, dict) else None
    rp = td.get("rope_parameters") if isinstance(td, dict) else None
    defaults = _class_rope_defaults(type(text).__module__)
    if not defaults or not isinstance(rp, dict) or not rp:
        return
    nested = [v for v in rp.values() if isinstance(v, dict)]  # one dict a layer type
    for p in nested or [rp]:
        for name, sections in defaults:
            p.setdefault(name, list(sections))


def _scaled_sections(v: list, total: int) -> list:
    """``v`` scaled to sum to ``total``, each rounded down and the rest handed out by largest
    remainder (``[24, 20, 20]`` to 8: ``[3, 3, 2]``)."""
    exact = [x * total / sum(v) for x in v]
    out = [int(x) for x in exact]
    for i in sorted(range(len(v)), key=lambda i: out[i] - exact[i])[:total - sum(out)]:
        out[i] += 1
    return out


def _cut_layers(d: dict, small) -> None:
    """Cut the layers of ``d`` (and of its sub-configs) to the fewest leading ones that hold
    every layer type, read from ``small`` (the config built from ``d``), in place."""
    types = _layer_types(small)
    L = int(getattr(small, "num_hidden_layers", 0) or 0)
    n = None
    if types is not None and len(types) == L and L > 2:
        want = set(types)
        n = next(i for i in range(2, L + 1) if set(types[:i]) == want)
        if getattr(small, "model_type", None) == "zamba" and types.count("hybrid") >= 2:
            # Zamba ties its shared attention block across hybrid layers: keep two of them
            n = max(n, [i for i, t in enumerate(types) if t == "hybrid"][1] + 1)
    elif getattr(small, "attn_layer_offset", None) is not None and L > 2:
        n = max(2, int(small.attn_layer_offset) + 1)
    elif L > 2 and types is None:
        n = 2
    if n is not None:
        first_k = getattr(small, "first_k_dense_replace", None)
        if isinstance(first_k, int) and 0 < first_k < L:
            n = max(n, first_k + 1)
        for name in _LAYER_INDEX_LISTS:  # keep the first layer of each listed kind
            v = getattr(small, name, None)
            if name != "mlp_only_layers" and isinstance(v, (list, tuple)) and v:
                n = max(n, min(L, int(min(v)) + 1))
        for v in d.values():  # and the first layer a per-layer override names
            if _layer_keyed(v) and all(int(k) < L for k in v):
                n = max(n, min(int(k) for k in v) + 1)
        for name in _TRAILING_LAYER_COUNTS:
            if isinstance(d.get(name), int) and 0 < d[name] < L:
                n = min(L, n + 1)
                d[name] = 1
            elif isinstance(d.get(name), int) and d[name] == L:  # every layer of that kind
                d[name] = n
        _cut_per_layer(d, L, n)
        d["num_hidden_layers"] = n
    for name in _LAYER_COUNTS:
        if name in d and isinstance(d[name], int) and d[name] > 2:
            d[name] = n if n is not None and d[name] == L else 2
    subs = _sub_configs(small)
    for k, sub_d in _sub_dicts(d).items():
        if k in subs:
            _cut_layers(sub_d, subs[k])


def _cut_per_layer(d: dict, L: int, n: int) -> None:
    """Cut every per-layer field of ``d`` from ``L`` layers to the first ``n``, in place.

    Per-layer fields: a list of ``L`` entries (``layer_types``, ``no_rope_layers``, Gemma 3n's
    ``activation_sparsity_pattern``, ``kv_source_layers``, ...), the string
    ``hybrid_override_pattern``, a run-length pattern ``[[kinds, repeats], ...]`` that expands to
    ``L`` layers (GPT-Neo's ``attention_types``), a list of layer indices
    (:data:`_LAYER_INDEX_LISTS`) and overrides keyed by layer index (Gemma 4's
    ``per_layer_config``). A backbone's per-stage lists are left whole (its ``out_features``
    name the later stages).
    """
    backbone = "stage_names" in d
    for name, v in list(d.items()):
        if name.endswith(("_token_id", "_token_ids")) or (backbone and name not in _LAYER_LISTS):
            continue
        runs = _runs(v)
        if name in _LAYER_INDEX_LISTS:
            if isinstance(v, list):
                d[name] = [i for i in v if i < n]
        elif name == "hybrid_override_pattern" and isinstance(v, str):
            d[name] = v[:n]
        elif isinstance(v, (list, tuple)) and len(v) == L:
            d[name] = list(v[:n])
        elif runs is not None and len(runs) == L:
            d[name] = [[runs[:n], 1]]
        elif _layer_keyed(v) and all(int(k) < L for k in v):
            d[name] = {k: x for k, x in v.items() if int(k) < n}


def _runs(v) -> list | None:
    """The layers of a run-length pattern ``[[["global", "local"], 12]]`` (24 layers), or None
    when ``v`` is not one."""
    if not isinstance(v, (list, tuple)) or not v:
        return None
    out = []
    for item in v:
        if not (isinstance(item, (list, tuple)) and len(item) == 2
                and isinstance(item[0], (list, tuple)) and isinstance(item[1], int)):
            return None
        out.extend(list(item[0]) * item[1])
    return out


def build_hf_model(cfg, *, seed: int, device: str = "cpu"):
    """The causal LM of ``cfg`` with seeded random weights, float32, eval mode.

    SDPA attention where the model class has it (the implementation whose packed-sequence path
    Hugging Face derives from ``position_ids``), else eager (attention-free models). A wrapper
    config that has no causal LM of its own builds the causal LM of its ``text_config`` (Mistral 3,
    LLaVA), else its image-text model (Qwen3-VL), fed text only. The model is first laid out without memory (``meta`` device) and
    refused above :data:`MAX_TEST_PARAMS` parameters.

    The model is then checked to be causal (:func:`_refuse_non_causal`): a token whose logits
    move when a later token changes (BERT's ``BertLMHeadModel`` without ``is_decoder``, another
    encoder) reads what packed rows cannot keep apart, whatever the mask.

    Raises:
        InputError: transformers has no causal LM for this config, cannot build it, the model
            would be larger than :data:`MAX_TEST_PARAMS`, or its tokens read later ones; the
            message names the config.
    """
    torch = require_torch()

    kind = getattr(cfg, "model_type", type(cfg).__name__)
    with torch.device("meta"):
        try:
            layout = _from_config(cfg)
        except Exception as exc:  # noqa: BLE001  what transformers raises is its own
            if isinstance(exc, (KeyboardInterrupt, MemoryError)):
                raise
            raise _build_error(kind, exc) from None
    big = sorted(((p.numel(), n, tuple(p.shape)) for n, p in layout.named_parameters()),
                 reverse=True)
    total = sum(x for x, _, _ in big)
    del layout
    if total > MAX_TEST_PARAMS:
        raise InputError(
            f"the {kind} config shrunk to a test size would still build "
            f"{total / 1e6:.0f}M parameters (at most {MAX_TEST_PARAMS / 1e6:.0f}M; the largest, "
            f"{big[0][1]} {list(big[0][2])}, keeps a size packtool does not shrink); give "
            "--hf-config a copy of the config with that size made small")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = _from_config(cfg)
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, (KeyboardInterrupt, MemoryError)):
                raise
            raise _build_error(kind, exc) from None
    model = model.float().eval()
    _refuse_non_causal(model, kind, seed)
    return model.to(device)


def _refuse_non_causal(model, kind: str, seed: int, length: int = 16) -> None:
    """Raise :class:`InputError` when the logits of tokens 0 .. ``length`` - 2 of one sequence
    of random ids move (over ``1e-5 * max(1, max|logit|)``, float32 on the CPU) when its last
    token changes: the model reads later tokens, as an encoder does, so no packing keeps a
    document from its successors. Two forwards of ``length`` tokens; a model that cannot run
    this plain forward is left to the checks, which say why."""
    torch = require_torch()
    try:
        vocab = int(model.get_input_embeddings().num_embeddings)
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (1, length), generator=g)
        other = ids.clone()
        other[0, -1] = (ids[0, -1] + 1) % vocab
        with torch.no_grad():
            a, b = (model(input_ids=x, use_cache=False).logits[0, :-1].float()
                    for x in (ids, other))
    except Exception as exc:  # noqa: BLE001 - the checks run the model and say what fails
        if isinstance(exc, (KeyboardInterrupt, MemoryError)):
            raise
        return
    moved = float((a - b).abs().max())
    if moved > 1e-5 * max(1.0, float(a.abs().max())):
        raise InputError(
            f"the {kind} config builds a model whose tokens read later ones: the logits of "
            f"tokens 0..{length - 2} moved by {moved:.3g} when token {length - 1} changed (an "
            "encoder or bidirectional model, or one not configured as a decoder); packed rows "
            "are for causal LMs, where a token reads only earlier tokens of its document")


def _build_error(kind: str, exc: Exception) -> InputError:
    return InputError(f"transformers cannot build a causal LM from the {kind} config shrunk to a "
                      f"test size ({exc_line(exc)}); give --hf-config a config "
                      "transformers builds, already small")


def _from_config(cfg):
    """``AutoModelForCausalLM.from_config``: SDPA, else eager; a wrapper's text_config model
    when the wrapper has no causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    def build(auto, c):
        try:
            return auto.from_config(c, attn_implementation="sdpa")
        except ValueError as exc:
            if "attention implementation" not in str(exc) and "sdpa" not in str(exc):
                raise
            return auto.from_config(c, attn_implementation="eager")

    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    tries = [(AutoModelForCausalLM, cfg)]
    if text is not cfg:  # a wrapper: its text model, else the whole image-text model
        tries += [(AutoModelForCausalLM, text), (AutoModelForImageTextToText, cfg)]
    for i, (auto, c) in enumerate(tries):
        try:
            return build(auto, c)
        except ValueError as exc:
            if "Unrecognized configuration class" not in str(exc) or i == len(tries) - 1:
                raise


#: first words of the names of sub-models the text never goes through (a vision, audio or
#: video tower: Qwen2.5-VL's ``visual``, Gemma 3's ``vision_tower``...)
_TOWER_WORDS = ("vision", "visual", "audio", "image", "video", "speech")


def decoder_layers(model) -> list:
    """The decoder layers of the model's language model, in order.

    The longest ``ModuleList`` named ``layers``, ``h`` or ``blocks`` inside the module the text
    goes through: ``model.get_decoder()`` (a causal LM's base model, a wrapper's
    ``language_model`` or text model), else the whole model; never one inside a vision, audio
    or video tower (:data:`_TOWER_WORDS`), which a text-only forward does not run (Qwen2.5-VL's
    and Qwen3-VL's vision ``blocks`` are as many as the shrunk language model's layers, or more).

    Returns:
        A list of modules, empty when the model has no such list.
    """
    torch = require_torch()
    roots = [model]
    try:
        dec = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    except Exception:  # noqa: BLE001 - a model of its own kind with no decoder to name
        dec = None
    if isinstance(dec, torch.nn.Module) and dec is not model:
        roots.insert(0, dec)
    for root in roots:
        best = []
        for name, mod in root.named_modules():
            parts = name.split(".")
            if isinstance(mod, torch.nn.ModuleList) and parts[-1] in ("layers", "h", "blocks") \
                    and not any(p.startswith(_TOWER_WORDS) for p in parts) and len(mod) > len(best):
                best = list(mod)
        if best:
            return best
    return []


def _mixers(layer) -> list:
    """(name, module) of the layer's direct children that mix tokens."""
    return [(n, m) for n, m in layer.named_children()
            if any(w in type(m).__name__ for w in _MIXER_WORDS)
            and any(True for _ in m.parameters())]


def layer_kind(cfg, index: int, module) -> str:
    """``layer i (type, Class)``: the config's name for layer ``index`` and its class."""
    types = _layer_types(cfg)
    kind = str(types[index]) if types is not None and index < len(types) else None
    return f"layer {index} ({kind + ', ' if kind else ''}{type(module).__name__})"


def _first_tensor(out):
    torch = require_torch()
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def locate_leak(model, forward, ids_BC, spans_row: list, row: int, change):
    """Where document 1 first reaches document 2: the first layer (and its first mixing
    sub-module) whose output at the later documents' tokens moves when document 1 changes.

    Args:
        model: the Hugging Face model.
        forward: ``forward(ids_BC) -> logits``, the packed forward with packtool's keywords.
        ids_BC: int64 [B, C] token ids of one batch.
        spans_row: the real document spans [(a, b)] of row ``row`` (two or more).
        row: the row to change.
        change: ``change(ids) -> ids`` of the same shape, every token another id of the
            model (:meth:`packtool.verify.runners.Runner.changed_ids`).

    Returns:
        ``(layer index, layer module, sub-module name or None)``, or None when no layer output
        moves (the leak is not in the layers).
    """
    torch = require_torch()
    layers = decoder_layers(model)
    watched = []  # (layer index, sub-module name or None, module)
    for i, layer in enumerate(layers):
        watched.append((i, None, layer))
        watched.extend((i, n, m) for n, m in _mixers(layer))
    outs: dict = {}
    hooks = []
    for key, (i, n, m) in enumerate(watched):
        def hook(mod, args, out, key=key):
            t = _first_tensor(out)
            if t is not None and key not in outs.setdefault("_run", {}):
                outs["_run"][key] = t.detach().float().clone()
        hooks.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            outs["_run"] = {}
            forward(ids_BC)
            before = outs["_run"]
            changed = ids_BC.clone()
            a, b = spans_row[0]
            changed[row, a:b] = change(changed[row, a:b])
            outs["_run"] = {}
            forward(changed)
            after = outs["_run"]
    finally:
        for h in hooks:
            h.remove()
    later = torch.zeros(ids_BC.shape[1], dtype=torch.bool)
    for a, b in spans_row[1:]:
        later[a:b] = True
    for i, layer in enumerate(layers):
        keys = [k for k, (li, _, _) in enumerate(watched) if li == i]
        layer_key = keys[0]
        x0, x1 = before.get(layer_key), after.get(layer_key)
        if x0 is None or x1 is None or x0.shape[:2] != ids_BC.shape:
            continue
        tol = 1e-5 * max(1.0, float(x0[row].abs().max()))
        if float((x1[row][later.to(x1.device)] - x0[row][later.to(x0.device)]).abs().max()) <= tol:
            continue
        for k in keys[1:]:  # the first sub-module (in call order) whose output moved
            s0, s1 = before.get(k), after.get(k)
            if s0 is None or s1 is None or s0.shape[:2] != ids_BC.shape:
                continue
            t = 1e-5 * max(1.0, float(s0[row].abs().max()))
            if float((s1[row][later.to(s1.device)] - s0[row][later.to(s0.device)]).abs().max()) > t:
                return i, layer, watched[k][1]
        return i, layer, None
    return None


def reads_mrope(model) -> bool:
    """Whether ``model`` has a multimodal rotary embedding (an ``mrope_section`` of integer
    sections: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, ...), whose ``position_ids`` carry three axes."""
    return any(_int_list(getattr(m, "mrope_section", None)) for m in model.modules())


#: rows of ``position_ids`` a multimodal-RoPE model of transformers 5.x reads the text positions
#: from, before its three RoPE axes (temporal, height, width)
MROPE_ROWS = 4


def mrope_need(model, forward, ids_BC, spans_row: list, row: int, change, position_ids,
               fed: str) -> str | None:
    """What a multimodal-RoPE model that leaks fed ``position_ids`` of shape [B, C] needs, when
    the same per-document positions as [4, B, C] keep its documents apart; else None.

    Qwen2-VL and Qwen2.5-VL (transformers 5.x) read position_ids [B, C] as their three RoPE axes
    only and then build one causal mask over the row; they find packed documents only from the
    text positions, the first row of position_ids [4, B, C] (Qwen3-VL expands [B, C] so itself).
    This runs ``forward`` on the rows and on them with document 1 of ``row`` changed, both with
    the positions as [4, B, C], and compares the later documents' logits.

    Args:
        model: the Hugging Face model (only models with :func:`reads_mrope` are probed).
        forward: ``forward(ids, position_ids) -> logits`` [..., V] of the packed batch, the
            other keywords as the leaking run had them.
        ids_BC, spans_row, row, change: as :func:`locate_leak` takes them.
        position_ids: int64 [B, C] (or [1, B * C]) the leaking run had, restarting at 0 at
            each document.
        fed: who gave the model ``position_ids`` in their shape, for the message.

    Returns:
        One clause for :func:`leak_message`'s ``attention_need``, or None.
    """
    torch = require_torch()
    if position_ids is None or position_ids.ndim != 2 or not reads_mrope(model):
        return None
    rows = position_ids.expand(MROPE_ROWS, *position_ids.shape)
    changed = ids_BC.clone()
    a, b = spans_row[0]
    changed[row, a:b] = change(changed[row, a:b])
    try:
        with torch.no_grad():
            x0, x1 = (_first_tensor(forward(ids, rows)) for ids in (ids_BC, changed))
    except Exception:  # noqa: BLE001 - a model that does not take that form: no such need
        return None
    if x0 is None or x1 is None or x0.shape[:2] != ids_BC.shape:
        return None
    later = torch.zeros(ids_BC.shape[1], dtype=torch.bool, device=x0.device)
    for a, b in spans_row[1:]:
        later[a:b] = True
    tol = 1e-5 * max(1.0, float(x0[row].abs().max()))
    if float((x1[row][later].float() - x0[row][later].float()).abs().max()) > tol:
        return None
    shape = list(position_ids.shape)
    return (f"position_ids of shape {[MROPE_ROWS] + shape} (the text positions, then its three "
            f"multimodal RoPE axes): {fed} position_ids of shape {shape}, which it reads as its "
            "RoPE axes alone, and then it builds one causal mask over the row; fed the same "
            f"positions, restarting at 0 at each document, as {[MROPE_ROWS] + shape} it keeps "
            f"the documents apart: give it position_ids.expand({MROPE_ROWS}, "
            "*position_ids.shape) (text "
            "rows; a row with images needs each document's axes from the model's "
            "get_rope_index, after the text positions), or train it on one document per row")


#: config fields naming a model's position limit, first found first (GPT-2 and CTRL say
#: ``n_positions``, older GPT-2 configs ``n_ctx``; ``max_position_embeddings`` is also what
#: ``attribute_map`` aliases of those resolve to)
_POSITION_LIMITS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length",
                    "max_seq_len", "seq_length")


def _text_config(cfg):
    try:
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    except ValueError:  # several text configs (encoder-decoder audio models)
        text = cfg
    return cfg if text is None else text


def position_limit(cfg) -> tuple[str, int] | None:
    """``(field, value)``: the position limit ``cfg`` (its text config) names, under whichever
    name it uses (``max_position_embeddings``, ``n_positions``, ``n_ctx``...), or None."""
    text = _text_config(cfg)
    d = text.to_dict() if hasattr(text, "to_dict") else {}
    # the name the config itself writes first, then the aliases its class resolves
    for value_of in (d.get, lambda name: getattr(text, name, None)):
        for name in _POSITION_LIMITS:
            v = value_of(name)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return name, v
    return None


def position_switch(cfg) -> tuple[str, int, str] | None:
    """``(rope_type, threshold, field)`` of a rotary embedding whose frequencies follow the
    largest ``position_id`` of the batch (transformers 5.x): ``dynamic`` NTK scaling rescales
    them once it reaches ``max_position_embeddings``, ``longrope`` switches from the short to the
    long factors once it reaches ``original_max_position_embeddings``; None for every other
    rotary type (their frequencies are fixed by the config)."""
    text = _text_config(cfg)
    rp = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    if not isinstance(rp, dict):
        return None
    for p in [rp] + [v for v in rp.values() if isinstance(v, dict)]:
        kind = str(p.get("rope_type") or p.get("type") or "")
        if kind == "longrope":
            n = p.get("original_max_position_embeddings") or getattr(
                text, "original_max_position_embeddings", None)
            return kind, n, "original_max_position_embeddings"
        if "dynamic" in kind:
            return kind, getattr(text, "max_position_embeddings", None), \
                "max_position_embeddings"
    return None


def batch_position_effect(cfg) -> str | None:
    """Why ``cfg``'s logits follow the largest position of the batch, or None
    (:func:`position_switch`).

    Phi-3's ``longrope`` rotary embedding takes its long factors for every token of the batch
    once ``max(position_ids) + 1`` passes ``original_max_position_embeddings`` (transformers
    5.x), and ``dynamic`` NTK scaling recomputes the frequencies of the whole batch from it once
    it passes ``max_position_embeddings``; so a document packed beside a longer one, in its row
    or in another row of the batch, gets other frequencies than alone.
    """
    switch = position_switch(cfg)
    if switch is None:
        return None
    kind, n, field = switch
    if kind == "longrope":
        what = ("switch from the short to the long factors", "the long factors",
                "the short ones")
    else:
        what = ("are rescaled (NTK scaling by that position)", "frequencies rescaled for "
                "the longer one", "those of its own length (unscaled below the limit)")
    return (f"its rotary frequencies (rope_type {kind}) {what[0]} for the whole batch once its "
            f"largest position_id reaches {field} = {n}, so a document packed beside a "
            f"longer one (in its row or another row of the batch) gets {what[1]}, and alone "
            f"{what[2]}; pack with --capacity {n} or less, where no position reaches it")


def _position_raises(exc: BaseException) -> bool:
    """Whether ``exc`` is an index past a table's end (an embedding or a buffer indexed by
    position): IndexError on CPU, or a RuntimeError saying so."""
    text = str(exc)
    return isinstance(exc, IndexError) or (isinstance(exc, RuntimeError) and (
        "out of range" in text or "out of bounds" in text))


def position_fault(model, cfg, longest: int, row: int | None = None) -> str | None:
    """Why ``model`` cannot train on rows of ``row`` tokens whose longest ``cu_seqlens`` span
    is ``longest`` tokens, or None.

    Positions restart at 0 in each document (and in the padding tail), so the largest
    ``position_id`` training feeds is ``longest - 1``. When the config names a limit below
    ``longest`` (:func:`position_limit`; none named: always), the model is run on one token at
    position ``longest - 1`` (and at 0): a model with a table of learned or precomputed
    positions (GPT-2, OPT, GPT-J, CTRL...) raises an index error there, as training would;
    rotary embeddings compute any position and pass. The largest position it takes is then
    found (a bisection of one-token forwards) and named. When ``row`` passes the named limit,
    the model is run on one sequence of ``limit + 1`` tokens (two documents, positions
    restarting) after one of ``limit``: a model whose bias is built for at most that many
    tokens, whatever the positions (MPT's ALiBi), raises there, as it would on whole rows.

    Args:
        model: the Hugging Face model, on the CPU (an index past a table's end on a GPU is a
            device-side assert that ends the process's CUDA context).
        cfg: its config.
        longest: the output's longest span (its largest ``max_seqlen``).
        row: tokens of a row as training feeds it (C), or None (not checked).

    Returns:
        One line naming the limit, the longest span (or the row) and the fix, or None.
    """
    torch = require_torch()
    limit = position_limit(cfg)
    dev = model.get_input_embeddings().weight.device
    kind = getattr(cfg, "model_type", type(cfg).__name__)
    probe = []  # a copy, made on first use: what a forward leaves in the model (dynamic
    # RoPE's cached frequencies) stays out of the checks

    def run(positions: list[int]) -> BaseException | None:
        if not probe:
            probe.append(copy.deepcopy(model))
        ids = torch.ones((1, len(positions)), dtype=torch.long, device=dev)
        try:
            with torch.no_grad():
                probe[0](inputs_embeds=probe[0].get_input_embeddings()(ids),
                         position_ids=torch.tensor([positions], device=dev), use_cache=False)
        except Exception as exc:  # noqa: BLE001 - what transformers raises is its own
            if isinstance(exc, (KeyboardInterrupt, MemoryError)):
                raise
            return exc
        return None

    def takes(pos: int) -> bool | None:
        exc = run([pos])
        return True if exc is None else False if _position_raises(exc) else None

    if longest > 1 and (limit is None or longest > limit[1]) and takes(0) is True \
            and takes(longest - 1) is False:
        lo, hi = 0, longest - 1  # takes lo, not hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if takes(mid):
                lo = mid
            else:
                hi = mid
        has = (f"has {limit[0]} = {limit[1]} positions" if limit is not None and limit[1] == hi
               else f"takes positions 0..{lo} only"
               + (f" (its {limit[0]} is {limit[1]})" if limit is not None else ""))
        field = limit[0] if limit is not None else "a position limit"
        return (f"the {kind} model of --hf-config {has} (a table of learned or precomputed "
                f"positions), and the output's longest span is {longest} tokens (max_seqlen; "
                f"positions restart at 0 in each document and in the padding, so they reach "
                f"{longest - 1}): it raises an index error at position {hi}, as training on "
                f"these rows would; pack with --capacity {hi} or less (--overflow split then "
                f"cuts longer documents into pieces that fit), or train a model with {field} "
                f">= {longest}")
    if row is not None and limit is not None and row > limit[1] > 1:
        n = limit[1]

        def two_documents(k: int) -> list[int]:
            return list(range(k // 2)) + list(range(k - k // 2))

        if run(two_documents(n)) is None:
            exc = run(two_documents(n + 1))
            if exc is not None:
                return (f"the {kind} model of --hf-config takes sequences of at most "
                        f"{limit[0]} = {n} tokens, whatever their positions (on {n + 1} tokens, "
                        f"two documents, it raises {exc_line(exc)}), and the "
                        f"output's rows are {row} tokens, which training feeds it whole; pack "
                        f"with --capacity {n} or less, or train a model with {limit[0]} >= "
                        f"{row}")
    return None


#: who gave a model whose attention reads neither keyword both of them (``packtool verify``)
VERIFY_FED = "verify fed both, as HFCollator() does"


def kernel_need(refused: str, then: str = "rerun on a GPU with --device cuda") -> str:
    """What a layer needs whose ``seq_idx`` transformers refused here (``refused``: its
    message): the kernels its package names, and ``then``."""
    pkg = re.findall(r"without `([^`]+)`", refused)
    return (f"seq_idx with the {pkg[0] if pkg else 'kernel'} package's CUDA kernels "
            f"(transformers refused seq_idx here: \"{refused.strip()}\"); install them and {then}")


def leak_message(cfg, located, refused: str | None, *, fed: str = VERIFY_FED,
                 attention_need: str | None = None, state_need: str | None = None) -> str:
    """``documents leak in <layer>: this model needs <keyword / kernels / attention>``.

    Args:
        cfg: the (shrunk) config.
        located: :func:`locate_leak`'s result.
        refused: transformers' message when it refused ``seq_idx`` (no kernels here), or None.
        fed: who gave the model ``position_ids`` and ``cu_seq_lens_q``/``_k``, said when an
            attention that reads neither leaks.
        attention_need, state_need: what a leaking attention / a leaking convolution or
            recurrence needs, in place of the general wording (a caller that knows what its
            batch lacked).
    """
    if located is None:
        where = "the model (no decoder layer output moved: the leak is outside the layers)"
        sub_cls = ""
    else:
        i, layer, sub = located
        where = layer_kind(cfg, i, layer)
        sub_mod = dict(layer.named_children()).get(sub) if sub else None
        sub_cls = type(sub_mod).__name__ if sub_mod is not None else ""
        if sub_cls:
            where += f", in its {sub_cls}"
    attention = bool(sub_cls) and bool(_ATTENTION_ONLY.search(sub_cls)) and not any(
        w in sub_cls for w in ("Linear", "Lightning", "DeltaNet", "Rwkv", "RWKV"))
    if refused:
        need = kernel_need(refused)
    elif located is None:  # no layer to name, so no layer's need either
        need = ("what packtool cannot name outside the layers (an embedding, a bias or a head "
                "that reads the whole row): train it on one document per row")
    elif attention:  # it was given both, as HFCollator gives them, and still leaked
        need = attention_need or (
            "an attention mask that reads position_ids restarting at 0 or "
            f"cu_seq_lens_q/cu_seq_lens_k, and this attention reads neither ({fed}: "
            "transformers builds one causal mask over the row for this model); train it on one "
            "document per row, or give it a block-diagonal mask of your own")
    else:
        need = state_need or (
            "a kernel that resets this layer's state at document starts (seq_idx or "
            "cu_seqlens); this layer ignored seq_idx here: train it on one document per row "
            "until it takes one")
    return f"documents leak in {where}: this model needs {need}"
