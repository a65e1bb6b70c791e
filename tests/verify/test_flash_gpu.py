"""flash_attn_varlen_func on a GPU: packed bf16 == per-document reference within the rule (B24)."""

from __future__ import annotations

import pytest

from packtool.verify import has_cuda, has_flash_attn

from packed_helpers import edit_rows, pack_docs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not has_cuda(), reason="no CUDA GPU"),
              pytest.mark.skipif(not has_flash_attn(), reason="flash-attn not installed")]

DOCS = [[11, 12, 13], [21, 22], [5, 6, 7, 8, 9, 10, 11], [70_000, 70_001], [1] * 20]


def test_flash_varlen_matches_per_document_reference(tmp_path):
    from packtool.verify.checks import run_verify

    out = pack_docs(tmp_path, DOCS, 16)
    rep = run_verify(out, rows=0, backends=["flash", "varlen"])
    assert rep.ok, rep.format_text()
    assert any(r.backend == "flash" and r.status == "pass" for r in rep.results)


def test_flash_fails_when_cu_seqlens_boundary_moves(tmp_path):
    from packtool.verify.checks import run_verify

    out = pack_docs(tmp_path, DOCS, 16)

    def edit(rows):
        i = next(i for i, r in enumerate(rows) if len(r["doc_ids"]) >= 2)
        rows[i]["cu_seqlens"][1] += 1
        return rows

    edit_rows(out, edit)
    rep = run_verify(out, rows=0, backends=["flash"])
    assert any(r.backend == "flash" and r.check == "logits_match" and r.status == "fail"
               for r in rep.results), rep.format_text()


def test_every_backend_on_cuda_runs_and_passes(tmp_path):
    """sdpa and compiled flex (forward and backward) on CUDA in fp32, varlen and flash in bf16:
    each runs every check on the GPU and passes."""
    from packtool.verify.checks import run_verify

    out = pack_docs(tmp_path, DOCS, 16)
    rep = run_verify(out, rows=0, backends=["sdpa", "flex", "varlen", "flash"], device="cuda",
                     compile=True)
    assert rep.ok, rep.format_text()
    for b in ("sdpa", "flex", "varlen", "flash"):
        lm = rep.get(b, "logits_match")
        assert lm.status == "pass" and lm.device == "cuda", rep.format_text()
        assert rep.get(b, "grad_zero_padding").status == "pass", rep.format_text()
    assert rep.get("flash", "logits_match").dtype == "bfloat16"
    assert rep.get("flex", "logits_match").figures["compiled"] is True


def test_b29_flash_without_varlen_fails(tmp_path):
    """B29 negative control: flash_attn_func over the whole row (causal, no cu_seqlens) lets
    document 2 see document 1; verify must fail at segment 2."""
    from flash_attn import flash_attn_func

    from packtool.verify.checks import run_verify

    out = pack_docs(tmp_path, [[5, 6, 7], [8, 9]], 5)

    def no_varlen(batch, dev):
        def attend(q, k, v):
            o = flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=True)
            return o.transpose(1, 2)
        return attend

    rep = run_verify(out, rows=0, backends=["flash"], attend_overrides={"flash": no_varlen})
    iso = rep.get("flash", "isolation")
    assert iso.status == "fail" and iso.where["segment"] == 2, rep.format_text()
    assert not rep.ok
