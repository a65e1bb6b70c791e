"""The real kernels on a GPU: causal-conv1d and mamba-ssm given packtool's seq_idx, and flash-attn
varlen on a context-parallel (--segment-multiple) output. Skipped without CUDA or the kernels;
``scripts/gpu_check.sh`` runs these and fails when any of them is skipped."""

from __future__ import annotations

import numpy as np
import pytest

from packtool.verify import has_cuda, has_flash_attn
from packtool.verify.hybrid import has_mamba_kernels

from packed_helpers import pack_docs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_cuda(), reason="no CUDA GPU")]
needs_kernels = pytest.mark.skipif(not has_mamba_kernels(),
                                   reason="causal-conv1d / mamba-ssm not installed")

RNG = np.random.default_rng(3)
DOCS = [list(map(int, RNG.integers(0, 131_000, n))) for n in [90, 13, 200, 7, 64, 150, 31, 400]]


@pytest.fixture
def packed(tmp_path):
    return pack_docs(tmp_path, DOCS, 512)


def _seq_idx(out):
    import torch

    from packtool.loader import PackedDataset, collate

    ds = PackedDataset(out)
    batch = collate([ds[i] for i in range(min(4, len(ds)))])
    return batch["seq_idx"].cuda(), batch, torch


@needs_kernels
def test_kernels_with_packtool_seq_idx_equal_the_plain_reference(packed):
    """causal_conv1d_fn and mamba_chunk_scan_combined given the collate's seq_idx compute what
    the reference computes (1e-4 relative, float32); without it they mix documents."""
    from packtool.verify.hybrid import (causal_conv_kernel, causal_conv_reference, ssd_kernel,
                                        ssd_reference)

    seq, _, torch = _seq_idx(packed)
    g = torch.Generator(device="cuda").manual_seed(0)
    B, T = seq.shape
    H, P, N, D = 4, 16, 16, 96
    x = torch.randn(B, T, D, device="cuda", generator=g)
    w = torch.randn(D, 4, device="cuda", generator=g)
    b = torch.randn(D, device="cuda", generator=g)
    ref = causal_conv_reference(x, w, b, seq)
    got = causal_conv_kernel(x, w, b, seq)
    assert (got - ref).abs().max() <= 1e-4 * max(1.0, float(ref.abs().max()))
    assert (causal_conv_kernel(x, w, b, None) - ref).abs().max() > 1e-2
    xs = torch.randn(B, T, H, P, device="cuda", generator=g)
    dt = torch.rand(B, T, H, device="cuda", generator=g) * 0.3 + 0.05
    A = -torch.linspace(1.0, 4.0, H, device="cuda")
    Bm, Cm = (torch.randn(B, T, N, device="cuda", generator=g) for _ in range(2))
    Dk = torch.ones(H, device="cuda")
    ref = ssd_reference(xs, dt, A, Bm, Cm, Dk, seq)
    got = ssd_kernel(xs, dt, A, Bm, Cm, Dk, seq)
    assert (got - ref).abs().max() <= 1e-4 * max(1.0, float(ref.abs().max()))
    assert (ssd_kernel(xs, dt, A, Bm, Cm, Dk, None) - ref).abs().max() > 1e-2


@needs_kernels
def test_mamba_backend_passes_and_fails_without_seq_idx(packed, monkeypatch):
    """verify --backend mamba on CUDA: every check passes; a collate without seq_idx fails."""
    from packcheck import withhold_seq_idx
    from packtool.verify.checks import run_verify

    rep = run_verify(packed, rows=0, backends=["mamba", "hybrid"], device="cuda")
    assert rep.ok, rep.format_text()
    assert rep.get("mamba", "logits_match").figures["mixers"] == "kernels"
    withhold_seq_idx(monkeypatch)
    rep = run_verify(packed, rows=0, backends=["mamba"], device="cuda")
    assert rep.get("mamba", "isolation").status == "fail", rep.format_text()


@pytest.mark.skipif(not has_flash_attn(), reason="flash-attn not installed")
def test_flash_varlen_on_a_context_parallel_output(tmp_path):
    """flash_attn_varlen_func and torch varlen take the padded cu_seqlens of a --segment-multiple
    output (padding inside rows): every check passes."""
    from packtool.verify.checks import run_verify

    out = pack_docs(tmp_path, DOCS, 512, "--segment-multiple", "8")
    rep = run_verify(out, rows=0, backends=["flash", "varlen", "sdpa", "hybrid"], device="cuda")
    assert rep.ok, rep.format_text()
    assert rep.get("flash", "isolation").status == "pass"
