"""The small seeded causal decoder verify runs, and the attention backends it can use.

Shape legend: B = rows, C = capacity (tokens per row), L = tokens of one document, H = heads,
D = head dim, E = model width, V = vocabulary of the test model, T = B * C flattened tokens.

The decoder is fp32, seeded, with several layers and heads. Positions enter twice, both driven by
``position_ids``: an absolute sinusoidal embedding added to the token embedding (a position that
was not reset at a document start changes the logits; RoPE alone would not show it, since it
only sees position differences) and rotary embeddings inside attention. Token ids are folded into
the model's vocabulary with ``id % V`` (real vocabularies reach 131k ids; the logits stay small).

With ``mixer_layers`` some layers are the hybrid mixer of :mod:`packtool.verify.hybrid` (a short
causal convolution and a gated linear recurrence) instead of attention: the ``hybrid`` and
``mamba`` backends run that model and hand the mixers the batch's ``seq_idx``.

Every attention backend has the signature ``attend(q_BHCD, k_BHCD, v_BHCD) -> out_BHCD`` and is
built from a collated batch (:func:`packtool.loader.collate`) with the mask helpers of
:mod:`packtool.verify.masks`, so what is verified is what training code calls.
"""

from __future__ import annotations

import math
import warnings

from packtool.verify import require_torch
from packtool.verify.masks import block_causal_mask, document_block_mask

__all__ = ["build_model", "reference_attend", "make_attend", "BACKEND_ATTENDS"]

#: backends of the packtool test model (``hf`` runs a Hugging Face model instead).
BACKEND_ATTENDS = ("sdpa", "flex", "varlen", "flash")


def build_model(*, vocab: int = 512, width: int = 64, heads: int = 4, layers: int = 3,
                seed: int = 0, mixer_layers: tuple = (), mixer_impl: str = "torch"):
    """The seeded fp32 test decoder (a ``torch.nn.Module``; eval mode, CPU).

    Args:
        vocab, width, heads, layers: V, E, H and the number of layers.
        seed: seeds the weights.
        mixer_layers: indices of the layers that are a hybrid mixer (convolution and gated
            linear recurrence, :func:`packtool.verify.hybrid.build_mixer`) instead of attention.
        mixer_impl: ``torch`` (plain, any device) or ``kernels`` (causal-conv1d and mamba-ssm,
            CUDA).
    """
    torch = require_torch()
    nn = torch.nn
    from packtool.verify.hybrid import MIXER_IMPLS, build_mixer

    if mixer_impl not in MIXER_IMPLS:
        raise ValueError(f"mixer_impl {mixer_impl!r}: choose one of {MIXER_IMPLS}")

    class Block(nn.Module):
        def __init__(self, mixer: bool):
            super().__init__()
            self.norm1 = nn.RMSNorm(width)
            self.mixer = build_mixer(width, heads) if mixer else None
            self.qkv = None if mixer else nn.Linear(width, 3 * width, bias=False)
            self.out = None if mixer else nn.Linear(width, width, bias=False)
            self.norm2 = nn.RMSNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))

    class TinyDecoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.vocab, self.width, self.heads = vocab, width, heads
            self.emb = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(Block(i in mixer_layers) for i in range(layers))
            self.mixer_impl = mixer_impl
            self.norm = nn.RMSNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def embed(self, input_ids_BC):
            """float [B, C, E] token embeddings of ``input_ids % V``."""
            return self.emb(input_ids_BC % self.vocab)

        def forward_embeds(self, h_BCE, position_ids_BC, attend, seq_idx_BC=None):
            """Logits float [B, C, V] from embeddings, positions and an attention function
            (and, for the mixer layers, each token's document index; None: one per row)."""
            B, C, E = h_BCE.shape
            H, D = self.heads, E // self.heads
            dt, dev = h_BCE.dtype, h_BCE.device
            # angles in fp32 whatever the model dtype: bf16 cannot hold positions over 256 exactly
            pos_BC1 = position_ids_BC.to(torch.float32)[..., None]
            freq_E2 = torch.exp(torch.arange(0, E, 2, device=dev, dtype=torch.float32)
                                * (-math.log(10000.0) / E))
            ang_BCE2 = pos_BC1 * freq_E2
            x_BCE = h_BCE + torch.cat([ang_BCE2.sin(), ang_BCE2.cos()], dim=-1).to(dt)
            inv_D2 = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=dev,
                                                       dtype=torch.float32) / D))
            rot_B1CD2 = (pos_BC1 * inv_D2)[:, None]
            cos_B1CD2, sin_B1CD2 = rot_B1CD2.cos().to(dt), rot_B1CD2.sin().to(dt)

            def rope(t_BHCD):
                a, b = t_BHCD[..., : D // 2], t_BHCD[..., D // 2:]
                return torch.cat([a * cos_B1CD2 - b * sin_B1CD2,
                                  a * sin_B1CD2 + b * cos_B1CD2], dim=-1)

            for blk in self.blocks:
                if blk.mixer is not None:
                    x_BCE = x_BCE + blk.mixer(blk.norm1(x_BCE), seq_idx_BC, self.mixer_impl)
                    x_BCE = x_BCE + blk.mlp(blk.norm2(x_BCE))
                    continue
                q, k, v = blk.qkv(blk.norm1(x_BCE)).view(B, C, 3, H, D).permute(2, 0, 3, 1, 4)
                o_BHCD = attend(rope(q), rope(k), v)
                x_BCE = x_BCE + blk.out(o_BHCD.transpose(1, 2).reshape(B, C, E))
                x_BCE = x_BCE + blk.mlp(blk.norm2(x_BCE))
            return self.head(self.norm(x_BCE))

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyDecoder()
    return model.eval()


def reference_attend(q_BHLD, k_BHLD, v_BHLD, *, query_block: int | None = 512):
    """Plain causal attention written out (softmax of masked scores): the per-document reference.

    Queries are taken ``query_block`` at a time; block [i0, i1) is scored against keys 0..i1-1
    only (the rest is masked by causality anyway), and only its last ``i1 - i0`` key columns need
    the causal mask. Memory is [B, H, query_block, L] scores at a time; the work is about half of
    the full L x L.

    Args:
        q_BHLD, k_BHLD, v_BHLD: float tensors [B, H, L, D] of B documents (right-padded to one
            length L: causality keeps the padding after a document out of its tokens' outputs).
        query_block: queries per step (None: all L at once).

    Returns:
        float tensor [B, H, L, D], dtype of ``v``.
    """
    torch = require_torch()
    L, D = q_BHLD.shape[-2], q_BHLD.shape[-1]
    step = L if not query_block else max(1, int(query_block))
    q_BHLD = q_BHLD * (1.0 / math.sqrt(D))
    outs = []
    for i0 in range(0, L, step):
        i1 = min(L, i0 + step)
        s_BHQK = q_BHLD[..., i0:i1, :] @ k_BHLD[..., :i1, :].transpose(-1, -2)
        above_QQ = torch.ones(i1 - i0, i1 - i0, dtype=torch.bool, device=q_BHLD.device).triu(1)
        s_BHQK[..., i0:i1].masked_fill_(above_QQ, float("-inf"))
        p_BHQK = torch.softmax(s_BHQK.float(), dim=-1).to(v_BHLD.dtype)
        outs.append(p_BHQK @ v_BHLD[..., :i1, :])
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _compiled_flex():
    """FlexAttention through ``torch.compile``, built once per process (one graph cache)."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        torch = require_torch()
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


_COMPILED_FLEX = None


def _sdpa_rows(q, k, v, seg_BC, i0: int, i1: int):
    """SDPA of queries i0..i1-1 with those rows of the block-diagonal causal mask."""
    torch = require_torch()
    C = seg_BC.shape[1]
    rows = torch.arange(i0, i1, device=seg_BC.device)
    mask_B1QC = ((seg_BC[:, i0:i1, None] == seg_BC[:, None, :])
                 & (torch.arange(C, device=seg_BC.device)[None, :] <= rows[:, None]))[:, None]
    return torch.nn.functional.scaled_dot_product_attention(q[..., i0:i1, :], k, v,
                                                            attn_mask=mask_B1QC)


def make_attend(backend: str, batch: dict, *, device="cpu", compile: bool = False,
                query_block: int | None = None):
    """The packed attention function of ``backend`` for a collated ``batch``.

    Args:
        backend: ``sdpa`` (boolean block-diagonal causal mask), ``flex`` (FlexAttention document
            block mask), ``varlen`` (``torch.nn.attention.varlen.varlen_attn``) or ``flash``
            (``flash_attn_varlen_func``); the last two take ``cu_seqlens`` (int32) and
            ``max_seqlen`` (Python int) from the batch.
        batch: output of :func:`~packtool.loader.collate`.
        device: where q/k/v live (``cu_seqlens`` and masks are moved there).
        compile: wrap FlexAttention in ``torch.compile`` (one compiled function per process).
        query_block: ``sdpa`` only: run SDPA on blocks of this many queries with the matching
            rows of the mask, each under activation checkpointing, so no [C, C] mask of a row is
            ever held (None: the full :func:`block_causal_mask`, as training code passes it).

    Returns:
        ``attend(q_BHCD, k_BHCD, v_BHCD) -> out_BHCD``.

    Raises:
        ValueError: unknown backend.
    """
    torch = require_torch()
    F = torch.nn.functional
    seg_BC = batch["segment_ids"].to(device)
    if backend == "sdpa":
        C = seg_BC.shape[1]
        if query_block and query_block < C:
            from torch.utils.checkpoint import checkpoint

            def attend_sdpa_blocks(q, k, v):
                return torch.cat([checkpoint(_sdpa_rows, q, k, v, seg_BC, i0,
                                             min(C, i0 + query_block), use_reentrant=False)
                                  for i0 in range(0, C, query_block)], dim=-2)

            return attend_sdpa_blocks
        mask_B1CC = block_causal_mask(seg_BC)
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask_B1CC)
    if backend == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        block_mask = document_block_mask(seg_BC)
        fn = _compiled_flex() if compile else flex_attention

        def attend_flex(q, k, v):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return fn(q, k, v, block_mask=block_mask)

        return attend_flex
    if backend in ("varlen", "flash"):
        cu_S1 = batch["cu_seqlens"].to(device)
        max_seqlen = batch["max_seqlen"]
        assert cu_S1.dtype == torch.int32 and type(max_seqlen) is int  # B06, B24

        def attend_varlen(q, k, v):
            B, H, C, D = q.shape
            flat = [t.transpose(1, 2).reshape(B * C, H, D) for t in (q, k, v)]  # [T, H, D]
            if backend == "flash":
                from flash_attn import flash_attn_varlen_func

                o_THD = flash_attn_varlen_func(*flat, cu_S1, cu_S1, max_seqlen, max_seqlen,
                                               causal=True)
            else:
                from torch.nn.attention.varlen import varlen_attn

                o_THD = varlen_attn(*flat, cu_S1, cu_S1, max_seqlen, max_seqlen,
                                    window_size=(-1, 0))
            return o_THD.reshape(B, C, H, D).transpose(1, 2)

        return attend_varlen
    raise ValueError(f"unknown attention backend {backend!r}")
