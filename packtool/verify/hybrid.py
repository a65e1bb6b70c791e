"""The reference hybrid block: a short causal convolution and a gated linear recurrence, written
plainly in torch and reset at every document start.

Shape legend: B = rows, T = tokens per row, E = model width, D = convolution channels, K =
convolution width, H = heads, P = head dim, N = state size.

Why attention checks are not enough: in a hybrid or linear-attention model (Mamba-2 / SSD layers,
gated DeltaNet, short convolutions beside attention: Bamba, Falcon-H1, Jamba, Zamba2, Nemotron-H,
Qwen3-Next, ...) an end-of-document token is no boundary. The convolution window reaches K - 1
tokens back and the recurrent state carries everything before, so document 2 of a packed row
computes on document 1 unless the layer is told where documents start. The kernels take that
as ``seq_idx`` (int32 [B, T], the document index of each token:
``causal_conv1d_fn(x, weight, bias, seq_idx=...)`` and
``mamba_chunk_scan_combined(..., seq_idx=...)``), which packtool's collates hand out
(:func:`packtool.loader.collate.batch_seq_idx`).

The block (Mamba-2's mixer with one group, expand 1):

    z, xBC, dt = in_proj(x)                          # E -> E, E + 2N, H
    xBC = silu(causal_conv(xBC))                     # depthwise, width K, reset at documents
    x, B, C = split(xBC)                             # E = H * P, N, N
    h_t = exp(dt_t * A) * h_{t-1} + dt_t * x_t B_t^T # per head; h = 0 at every document start
    y_t = h_t C_t + D * x_t
    out = out_proj(y * silu(z))

(Dao and Gu 2024, "Transformers are SSMs", arXiv 2405.21060, Sec. 7: the SSD layer; the decay
exp(dt * A) is the gate of a gated linear recurrence.) ``impl="torch"`` computes it here on any
device: the convolution as K shifted copies with the other documents' terms zeroed
(:func:`causal_conv_reference`), the recurrence chunk by chunk, a document's state dropped where
the next one starts (:func:`ssd_reference`), which equals the token-by-token recurrence
(:func:`ssd_recurrence`, the slow twin the tests compare it with) and, unlike it,
back-propagates in well under a second at C = 2048. ``impl="kernels"`` calls causal-conv1d and mamba-ssm on
CUDA with the same weights and seq_idx, so ``verify --backend mamba`` checks the kernels training
uses.
"""

from __future__ import annotations

import importlib.util

from packtool.verify import require_torch

__all__ = ["causal_conv_reference", "ssd_reference", "ssd_recurrence", "causal_conv_kernel",
           "ssd_kernel", "build_mixer", "has_mamba_kernels", "MIXER_IMPLS"]

#: how the mixer is computed: plain torch, or the causal-conv1d and mamba-ssm CUDA kernels
MIXER_IMPLS = ("torch", "kernels")
#: chunk length of ``mamba_chunk_scan_combined`` (any value gives the same result)
SSD_CHUNK = 64


def has_mamba_kernels() -> bool:
    """True when ``causal_conv1d_fn`` and ``mamba_chunk_scan_combined`` can be imported."""
    if importlib.util.find_spec("causal_conv1d") is None or \
            importlib.util.find_spec("mamba_ssm") is None:
        return False
    try:
        from causal_conv1d import causal_conv1d_fn  # noqa: F401
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined  # noqa: F401
    except Exception:  # a broken build (ABI mismatch) counts as missing
        return False
    return True


def _same_document(seq_idx_BT, shift: int):
    """bool [B, T]: token t and token t - shift exist and lie in one document (all of them
    when ``seq_idx`` is None: one document per row)."""
    torch = require_torch()
    B, T = seq_idx_BT.shape
    same = torch.zeros((B, T), dtype=torch.bool, device=seq_idx_BT.device)
    if shift < T:
        same[:, shift:] = seq_idx_BT[:, shift:] == seq_idx_BT[:, :T - shift]
    return same


def causal_conv_reference(x_BTD, weight_DK, bias_D, seq_idx_BT=None):
    """Depthwise causal convolution that never reaches into another document.

    ``y[t] = bias + sum_j weight[:, K - 1 - j] * x[t - j]``, j = 0..K-1, over the j with
    ``t - j >= 0`` and ``seq_idx[t - j] == seq_idx[t]`` (causal-conv1d's weight layout).

    Args:
        x_BTD: float [B, T, D]; weight_DK: [D, K]; bias_D: [D] or None.
        seq_idx_BT: int [B, T] document index, or None (each row one document).

    Returns:
        float [B, T, D].
    """
    torch = require_torch()
    B, T, D = x_BTD.shape
    K = weight_DK.shape[1]
    y = torch.zeros_like(x_BTD) if bias_D is None else bias_D.expand(B, T, D).clone()
    for j in range(K):
        if j >= T:
            break
        shifted = torch.zeros_like(x_BTD)
        shifted[:, j:] = x_BTD[:, :T - j]
        if seq_idx_BT is not None and j:
            shifted = shifted * _same_document(seq_idx_BT, j)[..., None].to(x_BTD.dtype)
        y = y + shifted * weight_DK[:, K - 1 - j]
    return y


def ssd_reference(x_BTHP, dt_BTH, A_H, B_BTN, C_BTN, D_H, seq_idx_BT=None, *,
                  chunk: int = 64):
    """The gated linear recurrence reset at document starts, computed chunk by chunk.

    The same outputs as :func:`ssd_recurrence`, in SSD's chunked form (Dao and Gu 2024, Sec. 6):
    inside a chunk of Q tokens, ``y_i = sum_{j <= i, same document} (C_i . B_j) exp(s_i - s_j)
    dt_j x_j`` (s_i = the sum of dt * A over i's document up to i inside the chunk, float64);
    between chunks, the state of
    the chunk's last document is passed on, and dropped where a new document starts. Work is
    O(T * Q) instead of a loop of T steps, so a backward pass at C = 2048 takes well under a
    second. Documents must be contiguous runs of ``seq_idx`` (as packtool's always are).

    Args: as :func:`ssd_recurrence`; chunk: Q (any value gives the same result).

    Returns:
        float [B, T, H, P].
    """
    torch = require_torch()
    F = torch.nn.functional
    Bsz, T, H, P = x_BTHP.shape
    N = B_BTN.shape[-1]
    dt_type = x_BTHP.dtype
    doc_BT = (torch.zeros((Bsz, T), dtype=torch.int64, device=x_BTHP.device)
              if seq_idx_BT is None else seq_idx_BT.to(torch.int64))
    pad = (-T) % chunk  # padded steps inject nothing (dt = 0) and come after every token
    if pad:
        x_BTHP = F.pad(x_BTHP, (0, 0, 0, 0, 0, pad))
        dt_BTH = F.pad(dt_BTH, (0, 0, 0, pad))
        B_BTN, C_BTN = F.pad(B_BTN, (0, 0, 0, pad)), F.pad(C_BTN, (0, 0, 0, pad))
        doc_BT = torch.cat([doc_BT, doc_BT[:, -1:].expand(Bsz, pad)], dim=1)
    nc, Q = (T + pad) // chunk, chunk
    x_BcQHP = x_BTHP.reshape(Bsz, nc, Q, H, P)
    dt_BcQH = dt_BTH.reshape(Bsz, nc, Q, H)
    b_BcQN, c_BcQN = B_BTN.reshape(Bsz, nc, Q, N), C_BTN.reshape(Bsz, nc, Q, N)
    doc_BcQ = doc_BT.reshape(Bsz, nc, Q)
    # 1. inside each chunk: pairs j <= i of one document. s_i sums dt * A over the tokens of
    # i's document up to i (a product with the same-document mask, not a cumsum over the chunk:
    # no gradient, not even a rounding residue, reaches another document's tokens)
    causal_QQ = torch.ones(Q, Q, dtype=torch.bool, device=x_BTHP.device).tril()
    same_BcQQ = (doc_BcQ[..., :, None] == doc_BcQ[..., None, :]) & causal_QQ
    s_BcQH = torch.einsum("bcik,bckh->bcih", same_BcQQ.double(),
                          dt_BcQH.double() * A_H.double())
    decay_BcQQH = (s_BcQH[:, :, :, None] - s_BcQH[:, :, None]).masked_fill(
        ~same_BcQQ[..., None], float("-inf"))
    w_BcQQH = (torch.exp(decay_BcQQH).to(dt_type)
               * torch.einsum("bcin,bcjn->bcij", c_BcQN, b_BcQN)[..., None]
               * dt_BcQH[:, :, None])
    y_BcQHP = torch.einsum("bcijh,bcjhp->bcihp", w_BcQQH, x_BcQHP)
    # 2. each chunk's contribution to the state of its last document, at the chunk's end
    in_last_BcQ = doc_BcQ == doc_BcQ[:, :, -1:]
    # tokens of earlier documents masked before exp: their sums are no decay of the last
    # document's, and a strong decay over one of them would overflow to inf (inf * 0 = NaN)
    gap_BcQH = (s_BcQH[:, :, -1:] - s_BcQH).masked_fill(~in_last_BcQ[..., None], float("-inf"))
    to_end_BcQH = torch.exp(gap_BcQH).to(dt_type) * dt_BcQH
    local_BcHPN = torch.einsum("bcjh,bcjhp,bcjn->bchpn", to_end_BcQH, x_BcQHP, b_BcQN)
    # 3. states between chunks: carried on while the document goes on, else dropped
    through_BcH = torch.exp(s_BcQH[:, :, -1]).to(dt_type)
    state_BHPN = x_BTHP.new_zeros((Bsz, H, P, N))
    entering = []
    for c in range(nc):
        entering.append(state_BHPN)
        goes_on_B = (doc_BcQ[:, c, -1] == doc_BcQ[:, c - 1, -1]) if c else \
            torch.zeros(Bsz, dtype=torch.bool, device=x_BTHP.device)
        carry_BH = through_BcH[:, c] * goes_on_B[:, None].to(dt_type)
        state_BHPN = local_BcHPN[:, c] + carry_BH[:, :, None, None] * state_BHPN
    enter_BcHPN = torch.stack(entering, dim=1)
    # 4. what the entering state gives the tokens of the document it belongs to
    prev_Bc = torch.cat([torch.full((Bsz, 1), -1, dtype=doc_BcQ.dtype, device=doc_BcQ.device),
                         doc_BcQ[:, :-1, -1]], dim=1)
    from_prev_BcQH = (torch.exp(s_BcQH).to(dt_type)
                      * (doc_BcQ == prev_Bc[:, :, None])[..., None])
    y_BcQHP = y_BcQHP + (torch.einsum("bcin,bchpn->bcihp", c_BcQN, enter_BcHPN)
                         * from_prev_BcQH[..., None])
    y_BTHP = y_BcQHP.reshape(Bsz, nc * Q, H, P)[:, :T]
    return y_BTHP + D_H[:, None] * x_BTHP[:, :T]


def ssd_recurrence(x_BTHP, dt_BTH, A_H, B_BTN, C_BTN, D_H, seq_idx_BT=None):
    """The gated linear recurrence, one token at a time, its state zeroed at document starts
    (slow: the twin :func:`ssd_reference` is compared with).

    ``h_t = exp(dt_t * A) h_{t-1} + dt_t x_t B_t^T`` (h [B, H, P, N]), ``y_t = h_t C_t + D x_t``;
    ``h_{t-1}`` is taken as 0 where ``seq_idx[t] != seq_idx[t - 1]``.

    Args:
        x_BTHP: float [B, T, H, P]; dt_BTH: > 0, [B, T, H]; A_H: < 0, [H];
        B_BTN, C_BTN: [B, T, N] (one group); D_H: [H].
        seq_idx_BT: int [B, T], or None.

    Returns:
        float [B, T, H, P].
    """
    torch = require_torch()
    Bsz, T, H, P = x_BTHP.shape
    N = B_BTN.shape[-1]
    keep_BT = None if seq_idx_BT is None else _same_document(seq_idx_BT, 1).to(x_BTHP.dtype)
    h_BHPN = x_BTHP.new_zeros((Bsz, H, P, N))
    ys = []
    for t in range(T):
        decay_BH = torch.exp(dt_BTH[:, t] * A_H)
        if keep_BT is not None:
            decay_BH = decay_BH * keep_BT[:, t, None]  # a new document starts from h = 0
        inject_BHPN = (dt_BTH[:, t, :, None, None] * x_BTHP[:, t, :, :, None]
                       * B_BTN[:, t, None, None, :])
        h_BHPN = decay_BH[:, :, None, None] * h_BHPN + inject_BHPN
        ys.append((h_BHPN * C_BTN[:, t, None, None, :]).sum(-1) + D_H[:, None] * x_BTHP[:, t])
    return torch.stack(ys, dim=1)


def causal_conv_kernel(x_BTD, weight_DK, bias_D, seq_idx_BT=None):
    """:func:`causal_conv_reference` through ``causal_conv1d_fn`` (CUDA; channel-last input,
    the layout its ``seq_idx`` path takes)."""
    from causal_conv1d import causal_conv1d_fn

    seq = None if seq_idx_BT is None else seq_idx_BT.to(dtype=require_torch().int32).contiguous()
    y_BDT = causal_conv1d_fn(x_BTD.contiguous().transpose(1, 2), weight_DK, bias_D,
                             seq_idx=seq, activation=None)
    return y_BDT.transpose(1, 2)


def ssd_kernel(x_BTHP, dt_BTH, A_H, B_BTN, C_BTN, D_H, seq_idx_BT=None):
    """:func:`ssd_reference` through mamba-ssm's ``mamba_chunk_scan_combined`` (CUDA)."""
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    seq = None if seq_idx_BT is None else seq_idx_BT.to(dtype=require_torch().int32).contiguous()
    return mamba_chunk_scan_combined(x_BTHP.contiguous(), dt_BTH.contiguous(), A_H,
                                     B_BTN[:, :, None].contiguous(),
                                     C_BTN[:, :, None].contiguous(), SSD_CHUNK, D=D_H,
                                     seq_idx=seq)


def build_mixer(width: int, heads: int, *, state: int = 16, conv_width: int = 4):
    """One mixer (the block of the module docstring) as a ``torch.nn.Module``.

    Call: ``mixer(x_BTE, seq_idx_BT=None, impl="torch") -> float [B, T, E]``.
    """
    torch = require_torch()
    nn = torch.nn
    F = torch.nn.functional
    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")

    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads, self.state = heads, state
            self.conv_dim = width + 2 * state
            self.in_proj = nn.Linear(width, width + self.conv_dim + heads, bias=False)
            self.conv_weight = nn.Parameter(torch.randn(self.conv_dim, conv_width)
                                            / conv_width ** 0.5)
            self.conv_bias = nn.Parameter(0.1 * torch.randn(self.conv_dim))
            self.dt_bias = nn.Parameter(torch.rand(heads) - 2.0)  # softplus ~ 0.1 .. 0.3
            self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, heads)))
            self.D = nn.Parameter(torch.ones(heads))
            self.out_proj = nn.Linear(width, width, bias=False)

        def forward(self, x_BTE, seq_idx_BT=None, impl: str = "torch"):
            if impl not in MIXER_IMPLS:
                raise ValueError(f"mixer impl {impl!r}: choose one of {MIXER_IMPLS}")
            Bsz, T, E = x_BTE.shape
            conv, ssd = ((causal_conv_reference, ssd_reference) if impl == "torch"
                         else (causal_conv_kernel, ssd_kernel))
            z_BTE, xbc_BTD, dt_BTH = self.in_proj(x_BTE).split(
                [E, self.conv_dim, self.heads], dim=-1)
            xbc_BTD = F.silu(conv(xbc_BTD, self.conv_weight, self.conv_bias, seq_idx_BT))
            x_BTE, b_BTN, c_BTN = xbc_BTD.split([E, self.state, self.state], dim=-1)
            dt_BTH = F.softplus(dt_BTH + self.dt_bias)
            y_BTHP = ssd(x_BTE.reshape(Bsz, T, self.heads, E // self.heads), dt_BTH,
                         -torch.exp(self.A_log), b_BTN, c_BTN, self.D, seq_idx_BT)
            return self.out_proj(y_BTHP.reshape(Bsz, T, E) * F.silu(z_BTE))

    return Mixer()
