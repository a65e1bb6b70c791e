"""The far-token probe of the ``hf`` backend on row windows (``place_probe``): a user's model whose
output follows a token's index in the row (Falcon with ``alibi=True`` and 8 heads, exact below
index 256 only) passes on windows, whose tokens sit below the window's length, what whole rows
fail. The probe places its document where the output's own documents sit, never farther, and
runs only where the windows did not already reach; what it could not run, and what isolation
said, is worded from what happened."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from packtool.cli import cli  # noqa: E402
from packtool.verify.checks import run_verify  # noqa: E402

from packed_helpers import pack_docs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _falcon(tmp_path: Path) -> Path:
    """Falcon with alibi=True and 8 heads: exact below index 256 (slopes 2^-1 .. 2^-8 in its
    bfloat16 bias), not past it (16 heads or more: at no index)."""
    cfg = tmp_path / "falcon"
    transformers.AutoConfig.for_model("falcon", alibi=True, num_attention_heads=8,
                                      hidden_size=512).save_pretrained(cfg)
    return cfg


def _docs(lengths, k0=0):
    return [[(11 * t + k) % 300 + 5 for t in range(n)] for k, n in enumerate(lengths, k0)]


def test_one_document_per_row_is_never_probed(tmp_path):
    """Rows of one document each: no document starts past token 0, so training on them is
    exact whatever the model does with a token's index. The probe had put a document at token
    448 of a made-up row and failed logits_match; the output now passes, saying why nothing
    was probed."""
    out = pack_docs(tmp_path, _docs([300, 350, 400, 480, 512, 310]), 512)
    rep = run_verify(out, rows=0, hf_config=_falcon(tmp_path), row_window=64)
    assert rep.multi_doc_rows is False
    lm = rep.get("hf", "logits_match")
    assert lm.status == "pass" and rep.ok, rep.format_text()
    assert "far_tokens_max_abs_diff" not in lm.figures, lm.figures
    assert "no row holds two documents" in lm.figures["far_tokens"], lm.figures


def test_documents_that_stay_inside_the_windows_are_not_probed(tmp_path):
    """Every row's later documents end before token 64, which the windows of 64 tokens already
    measured (whole rows pass too): the probe of a document at token 448 had failed it."""
    out = pack_docs(tmp_path, _docs([30, 20]), 512)
    cfg = _falcon(tmp_path)
    assert run_verify(out, rows=0, hf_config=cfg, row_window=0).ok
    rep = run_verify(out, rows=0, hf_config=cfg, row_window=64)
    lm = rep.get("hf", "logits_match")
    assert lm.status == "pass" and rep.ok, rep.format_text()
    assert lm.figures["far_start"] == 30 and "far_tokens_max_abs_diff" not in lm.figures
    assert "within the windows" in lm.figures["far_tokens"], lm.figures


def test_the_probe_starts_no_farther_than_the_outputs_farthest_document(tmp_path):
    """Rows of a 20-token document then one of 492: no document starts past token 20, but the
    later ones reach token 511, which whole rows fail on. The probe puts its document at token
    20 (not 448), reaching token 511, fails as whole rows do, and says the start it used."""
    out = pack_docs(tmp_path, [d for k in range(4) for d in _docs([20, 492], 2 * k)], 512,
                    "--strategy", "ordered")
    cfg = _falcon(tmp_path)
    assert not run_verify(out, rows=0, hf_config=cfg, row_window=0).ok
    rep = run_verify(out, rows=0, hf_config=cfg, row_window=64)
    lm = rep.get("hf", "logits_match")
    assert lm.status == "fail" and not rep.ok, rep.format_text()
    assert lm.figures["far_start"] == 20 and lm.figures["far_tokens_start"] == 20, lm.figures
    assert "starting at token 20" in lm.message, lm.message


def test_the_message_says_what_isolation_did(tmp_path):
    """With isolation left out (--check logits_match) the failure had said "(isolation
    passed)"; it now says isolation was not run, so a leak is not ruled out."""
    docs = [[(11 * t + k) % 300 + 5 for t in range(n)] for k in range(6) for n in (200, 37, 120)]
    out = pack_docs(tmp_path, docs, 512)
    rep = run_verify(out, rows=0, hf_config=_falcon(tmp_path), row_window=64,
                     checks=["logits_match"])
    lm = rep.get("hf", "logits_match")
    assert lm.status == "fail", rep.format_text()
    assert "isolation passed" not in lm.message, lm.message
    assert "isolation was not run" in lm.message, lm.message


def test_a_probe_row_over_the_memory_budget_is_a_warning_naming_max_memory(tmp_path):
    """A probe row of C = 4096 tokens does not fit 64 MiB, windows of 64 tokens do: the run had
    said OK with a figure alone, its hint naming --row-window 0. The text report now warns that
    the far tokens were not probed and names --max-memory, with the size it needs."""
    cfg = tmp_path / "llama"
    transformers.AutoConfig.for_model("llama").save_pretrained(cfg)
    out = pack_docs(tmp_path, _docs([3000, 1096, 2000, 2096]), 4096)
    res = CliRunner().invoke(cli, ["verify", str(out), "--hf-config", str(cfg), "--rows", "0",
                                   "--row-window", "64", "--max-memory", "64M", "--no-progress"])
    assert res.exit_code == 0, res.output
    warn = [ln for ln in res.output.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "--max-memory" in warn[0], res.output
    assert "--row-window 0" not in warn[0] and "4096 tokens" in warn[0], warn


@pytest.mark.parametrize("extra, want", [((), (20, 50)), (("--segment-multiple", "8"), (24, 54))])
def test_where_later_documents_lie_is_read_from_cu_seqlens(tmp_path, extra, want):
    """Rows of a 20-token document then a 30-token one: the later document starts at token 20
    and ends before 50; with --segment-multiple 8 the first span is padded to 24 and the real
    tokens of the second end before 54. The column scan and a read of cu_seqlens alone (--no-scan)
    agree; an output of one document per row gives (0, 0)."""
    from packtool.formats.packed import PackedOutput
    from packtool.verify.checks import _later_documents
    from packtool.verify.contract import scan_contract

    out = pack_docs(tmp_path, [d for k in range(3) for d in _docs([20, 30], 2 * k)], 64,
                    "--strategy", "ordered", *extra)
    reader = PackedOutput.open(out)
    scan = scan_contract(reader, "unshifted")
    assert (scan.far_start, scan.far_end) == want == _later_documents(reader)
    one = pack_docs(tmp_path, _docs([40, 50, 64]), 64, name="one")
    assert _later_documents(PackedOutput.open(one)) == (0, 0)
