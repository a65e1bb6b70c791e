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
