"""verify cannot pass by accident: every requested backend and check runs or the exit is non-zero."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from packtool.cli import cli  # noqa: E402
from packtool.verify.checks import run_verify  # noqa: E402
from packtool.verify.equivalence import CHECKS, MODEL_CHECKS, Measurements, run_checks  # noqa: E402
from packtool.verify.report import FAIL, PASS, SKIP  # noqa: E402

from packcheck import no_padding_block  # noqa: E402
from packed_helpers import pack_docs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RNG = np.random.default_rng(3)
DOCS = [list(map(int, RNG.integers(1, 1000, n))) for n in [9, 5, 7, 3, 12, 4, 6, 2, 8]]


def _verify(*args):
    return CliRunner().invoke(cli, ["verify", *map(str, args)])


@pytest.fixture
def good(tmp_path):
    return pack_docs(tmp_path, DOCS, 16)


def test_gpu_only_backends_without_cuda_exit_non_zero_saying_no_attention_check_ran(good):
    """`--backend flash --backend varlen` on a CPU machine: both SKIP with a reason, exit 1, and
    the message says no attention check ran (it used to print OK and exit 0)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = _verify(good, "--backend", "flash", "--backend", "varlen")
    assert r.exit_code == 1, r.output
    assert "no attention check ran" in r.output
    for b in ("flash", "varlen"):
        assert any(ln.startswith("SKIP") and f" {b}" in ln and "CUDA" in ln
                   for ln in r.output.splitlines()), r.output
    assert "OK:" not in r.output


def test_a_requested_backend_that_cannot_run_fails_the_verdict_even_when_another_passes(good):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    rep = run_verify(good, rows=2, backends=["sdpa", "flash"])
    assert rep.get("sdpa", "logits_match").status == PASS
    assert not rep.ok
    assert any("flash" in p and "did not run" in p for p in rep.problems())


def test_default_backends_list_the_ones_that_cannot_run_as_not_required_skips(good):
    rep = run_verify(good, rows=2)
    assert rep.ok, rep.format_text()
    for b in ("sdpa", "flex", "varlen", "flash", "hf"):
        assert any(r.backend == b for r in rep.results), b  # every backend is named
    for r in rep.results:
        assert r.status in (PASS, SKIP) and (r.status == PASS or r.message), r.line()


def test_zero_row_output_is_nothing_to_verify(tmp_path):
    """Every document dropped (B11): 0 rows; verify says so and exits 1, also --data-only."""
    out = pack_docs(tmp_path, [[1, 2, 3, 4, 5, 6]], 4, "--overflow", "drop")
    for extra in ([], ["--data-only"]):
        r = _verify(out, *extra)
        assert r.exit_code == 1, r.output
        assert "nothing to verify" in r.output and "0 rows" in r.output


def _single_doc_rows_then_one_packed_row(tmp_path):
    rng = np.random.default_rng(1)
    docs = [list(map(int, rng.integers(1, 500, 16))) for _ in range(12)] + [[7, 8, 9], [3, 4]]
    return pack_docs(tmp_path, docs, 16)


def test_no_scan_finds_a_multi_document_row_when_the_sample_has_none(tmp_path):
    """--no-scan with a sample of one single-document row: verify reads doc_ids until it finds
    the one row holding two documents and runs isolation on it."""
    out = _single_doc_rows_then_one_packed_row(tmp_path)
    rep = run_verify(out, rows=1, backends=["sdpa"], scan_all=False, seed=0)
    iso = rep.get("sdpa", "isolation")
    assert iso.status == PASS and iso.figures["rows_multi_doc"] == 1, rep.format_text()
    assert rep.ok and any("added row" in n for n in rep.notes)


def test_an_output_of_one_document_per_row_passes_without_isolation(tmp_path):
    """No row of the output holds two documents (every document is C tokens): no boundary
    between documents exists, so isolation cannot run and is not required; the other model
    checks still must run (it used to fail, "no attention check ran on a row holding two or
    more documents", on every such output). Asked for by name, isolation must run."""
    rng = np.random.default_rng(2)
    out = pack_docs(tmp_path, [list(map(int, rng.integers(1, 500, 16))) for _ in range(5)], 16)
    for scan in ((), ("--no-scan",)):  # the sample holds none, then doc_ids of all rows
        r = _verify(out, *scan, "--backend", "sdpa", "--rows", "2")
        assert r.exit_code == 0, r.output
        assert "no row of the output holds two or more documents) [not required]" in r.output
    rep = run_verify(out, rows=2, backends=["sdpa"])
    assert rep.ok and rep.multi_doc_rows is False
    assert rep.get("sdpa", "logits_match").status == PASS
    assert rep.get("sdpa", "isolation").status == SKIP
    asked = run_verify(out, rows=2, backends=["sdpa"], checks=["isolation"])
    assert not asked.ok and any("isolation on backend sdpa did not run" in p
                                for p in asked.problems())
    skipped = _verify(out, "--backend", "flash")  # and a model check must still run
    assert skipped.exit_code == 1 and "no attention check ran" in skipped.output


def test_b22_one_document_and_padding_passes_verify_with_finite_outputs(tmp_path):
    """B22: docs [[5, 6, 7]], C = 5, pad_id 0: ``verify --backend sdpa`` (and flex) gives the
    padding rows a key (themselves), finite outputs and gradients, and passes."""
    out = pack_docs(tmp_path, [[5, 6, 7]], 5)
    for backend in ("sdpa", "flex"):
        r = _verify(out, "--backend", backend, "--json")
        assert r.exit_code == 0, r.output
        got = {x["check"]: x for x in json.loads(r.output[r.output.index("{"):])["results"]}
        assert got["finite"]["status"] == PASS
        assert got["finite"]["figures"]["rows_with_nan_or_inf"] == 0
        assert got["logits_match"]["status"] == PASS


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` run by this Python in a fresh process (its imports its own)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_data_only_passes_without_an_attention_check_and_runs_without_torch(good):
    """--data-only in a process where `import torch` fails: the column checks run and pass."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from packtool.cli import main\n"
            f"sys.argv = ['packtool', 'verify', {str(good)!r}, '--data-only']\n"
            "main()\n")
    p = _python(code)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS  data" in p.stdout and "OK:" in p.stdout
    assert "torch" not in p.stdout
    p2 = _python(code.replace(", '--data-only'", ""))
    assert p2.returncode == 1 and "pip install" in p2.stdout + p2.stderr


def test_data_only_with_progress_never_imports_torch(good):
    """With torch installed, --data-only's time estimate asked for a GPU and so imported torch
    (over a CPU-second), and the sha256 line counted that time as hashing."""
    p = _python("import sys\n"
                "from packtool.verify.checks import run_verify\n"
                f"rep = run_verify({str(good)!r}, data_only=True, progress=print)\n"
                "print('ok', rep.ok, 'torch' in sys.modules)\n")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "ok True False", p.stdout


def test_data_only_still_fails_a_broken_column(good):
    from packed_helpers import edit_rows

    def edit(rows):
        i = next(i for i, r in enumerate(rows) if len(r["doc_ids"]) >= 2)
        rows[i]["position_ids"] = list(range(16))
        return rows

    edit_rows(good, edit)
    r = _verify(good, "--data-only")
    assert r.exit_code == 1 and "position_ids" in r.output.splitlines()[-1]


def test_every_requested_check_is_reported_and_unknown_names_are_usage_errors(good):
    r = _verify(good, "--backend", "sdpa", "--check", "isolation", "--check", "labels", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert {(x["backend"], x["check"]) for x in rep["results"]} == {("sdpa", "isolation"),
                                                                    ("data", "labels")}
    assert _verify(good, "--check", "nonsense").exit_code == 2


def test_progress_line_per_backend_on_stderr(good):
    r = _verify(good, "--backend", "sdpa", "--backend", "hf", "--rows", "2")
    assert r.exit_code == 0, r.output
    for b in ("sdpa", "hf"):
        assert any(ln.startswith("verify:") and f" {b} " in ln for ln in r.stderr.splitlines()), \
            r.stderr
    assert "verify:" not in r.stdout


def test_verify_says_how_long_it_expects_to_take_before_it_starts(good, tmp_path):
    """The first progress line, before the shards' sha256 and the column scan, gives the
    expected time and its parts: the sha256 (unless --no-hash), the scan, the backends that
    will run on how many rows of how many tokens, torch's start-up, and the FlexAttention
    compile when one will happen."""
    import re

    r = _verify(good, "--backend", "sdpa", "--rows", "2", "--no-hash")
    first = r.stderr.splitlines()[0]
    assert re.match(r"verify: expecting about \d+ s on an idle machine \(column scan \d+ s; "
                    r"sdpa on 2 rows of 16 "
                    r"tokens \d+ s, torch start-up \d+ s\)$", first), r.stderr
    r = _verify(good, "--backend", "sdpa", "--rows", "2")
    first = r.stderr.splitlines()[0]
    assert re.match(r"verify: expecting about \d+ s on an idle machine \(sha256 of \d+ MiB "
                    r"\d+ s; column scan \d+ s; "
                    r"sdpa on 2 rows of 16 tokens \d+ s, torch start-up \d+ s\)$", first), r.stderr
    assert r.stderr.splitlines()[1].startswith("verify: sha256 of 1 shard checked"), r.stderr
    r = _verify(good, "--data-only", "--no-hash")
    assert r.stderr.splitlines()[0].startswith(
        "verify: expecting about 0 s on an idle machine (column scan"), \
        r.stderr
    from packtool.verify.checks import estimate_seconds

    big = estimate_seconds(20_000, 8192, 8, 8192, ["flex"], True, "cpu", None)
    small = estimate_seconds(20_000, 8192, 8, 1024, ["flex"], True, "cpu", None)
    assert "compile" in big["detail"] and "compile" not in small["detail"]
    assert big["total"] > 3 * small["total"]  # whole rows and the compile cost far more
    assert estimate_seconds(0, 8192, 0, 1024, [], False, "cpu", None)["total"] == 0


def test_named_checks_each_read_their_own_measurement():
    """Each check is a function of the measurements returning its result by name; a fault in
    one measurement fails exactly that check."""
    def clean():
        m = Measurements("sdpa", rows=2, rows_multi_doc=2, tol=1e-5)
        m.logit.add(torch.tensor([1e-7]), {"row": 0})
        m.iso_other.add(torch.tensor([0.0]), {"row": 0})
        m.iso_effect_min = 1.0
        m.grad_pad.add(torch.tensor([0.0]), {"row": 0})  # padding was seen, its gradient 0
        m.grad_ignored.add(torch.tensor([0.0]), {"row": 0})  # and a position without target
        m.rows_with_targets = m.rows_padded = 1
        m.loss_packed_sum = m.loss_ref_sum = 6.0
        m.targets_packed = m.targets_ref = 3
        return m

    assert {n: r.status for n, r in run_checks(clean()).items()} == dict.fromkeys(MODEL_CHECKS,
                                                                                  PASS)
    faults = {"logits_match": lambda m: m.logit.add(torch.tensor([1.0]), {"row": 1}),
              "isolation": lambda m: m.iso_other.add(torch.tensor([0.5]), {"row": 1}),
              "loss_denominator": lambda m: setattr(m, "targets_packed", 4),
              "grad_zero_ignored": lambda m: m.grad_ignored.add(torch.tensor([1e-3]), {}),
              "grad_zero_padding": lambda m: m.grad_pad.add(torch.tensor([1e-3]), {}),
              "finite": lambda m: setattr(m, "nonfinite_rows", 1)}
    assert set(faults) == set(CHECKS)
    for name, fault in faults.items():
        m = clean()
        fault(m)
        res = run_checks(m)
        assert [n for n, r in res.items() if r.status == FAIL] == [name], name
    # one label on another token, as many targets: the pooled mean barely moves, the segment's
    # loss per target does (a token's cross-entropy moves by at most 2x its logits' error)
    m = clean()
    m.seg_loss.add(torch.tensor([3e-5]), {"row": 0})  # within 4 * tol: rounding
    assert run_checks(m)["loss_denominator"].status == PASS
    m.seg_loss.add(torch.tensor([0.05]), {"row": 1, "segment": 2})
    res = run_checks(m)
    assert [n for n, r in res.items() if r.status == FAIL] == ["loss_denominator"]
    assert "another token" in res["loss_denominator"].message


def test_b22_padding_rows_fully_masked_give_nan_and_fail_verify(tmp_path):
    """B22 negative control: attention written out with a mask that leaves padding query rows
    with no key (softmax of a row of -inf is NaN); verify must fail (finite), while the real
    mask passes."""
    out = pack_docs(tmp_path, [[5, 6, 7], [8, 9, 10, 11]], 5)
    rep = run_verify(out, rows=0, backends=["sdpa"], attend_overrides={"sdpa": no_padding_block})
    assert rep.get("sdpa", "finite").status == FAIL and not rep.ok
    good = run_verify(out, rows=0, backends=["sdpa"])
    assert good.get("sdpa", "finite").status == PASS and good.ok


def _place_dependent(batch, dev):
    """Attention with the right block-causal mask whose output is scaled by the query's index
    in the sequence (as a bias taken from the token's index, not its position_ids, would):
    no document reads another, yet packed and per-document logits differ."""
    seg = batch["segment_ids"].to(dev)
    n = seg.shape[1]
    m = ((seg[:, :, None] == seg[:, None, :])
         & torch.ones(n, n, dtype=torch.bool, device=dev).tril())[:, None]

    def attend(q, k, v):
        s = (q @ k.transpose(-1, -2)).masked_fill(~m, float("-inf"))
        out = torch.softmax(s / q.shape[-1] ** 0.5, dim=-1) @ v
        idx = torch.arange(q.shape[-2], device=q.device, dtype=q.dtype)
        return out * (1 + 0.05 * idx)[:, None]

    return attend


def test_logits_that_differ_without_a_leak_are_not_called_a_leak(good):
    """logits_match fails while isolation passes (a model whose output depends on a token's
    index in the row: Falcon's ALiBi beyond 256 tokens): the message says no document reads
    another and names the index effect; it said "documents leak ... seq_idx"."""
    rep = run_verify(good, rows=0, backends=["sdpa"], attend_overrides={"sdpa": _place_dependent})
    lm, iso = rep.get("sdpa", "logits_match"), rep.get("sdpa", "isolation")
    assert lm.status == FAIL and iso.status == PASS and not rep.ok, rep.format_text()
    assert "no document reads another (isolation passed)" in lm.message, lm.message
    assert "leak" not in lm.message
    # the loss that follows from those logits names logits_match, and isolation as passed
    # (it named "logits_match, isolation" as the cause whatever isolation found)
    ld = rep.get("sdpa", "loss_denominator")
    assert ld.status == FAIL and "follows from the packed logits" in ld.message, ld.message
    assert "(logits_match; isolation passed: no document reads another)" in ld.message


def test_a_backend_that_raises_is_a_failure_not_a_skip(good):
    def broken(batch, dev):
        def attend(q, k, v):
            raise RuntimeError("kernel refused the mask")
        return attend

    rep = run_verify(good, rows=2, backends=["sdpa"], attend_overrides={"sdpa": broken})
    run = rep.get("sdpa", "run")
    assert run.status == FAIL and "kernel refused the mask" in run.message and not rep.ok


def test_a_failed_attention_check_is_not_also_reported_as_not_run(good):
    """Attention checks that FAILED on rows of two or more documents ran: the report names
    their failure and does not add "no attention check ran" (which it used to print after
    them); a run whose every model check is skipped still says it."""
    from packtool.verify.report import VerifyReport

    rep = run_verify(good, rows=2, backends=["sdpa"])
    assert rep.ok
    for r in rep.results:
        if r.check in ("logits_match", "isolation"):
            assert r.figures["rows_multi_doc"] >= 1
            r.status = FAIL
    probs = rep.problems()
    assert probs and all("no attention check ran" not in p for p in probs), probs
    assert any(p.startswith("check isolation failed on backend sdpa") for p in probs), probs
    bare = VerifyReport(rep.path, rep.rows, rep.num_rows, False,
                        [r for r in rep.results if r.backend == "data"])
    assert any("no attention check ran" in p for p in bare.problems())


@pytest.mark.parametrize("check", ["loss_denominator", "finite", "grad_zero_ignored",
                                   "grad_zero_padding"])
def test_one_model_check_asked_for_passes_when_it_ran_on_rows_of_two_documents(good, check):
    """--check loss_denominator (or finite, the gradient checks) alone printed PASS and then
    failed 'no attention check ran': only logits_match and isolation were counted."""
    r = _verify(good, "--backend", "sdpa", "--check", check, "--rows", "2")
    assert r.exit_code == 0, r.output
    assert f"PASS  sdpa[cpu]    {check}" in r.output and "no attention check ran" not in r.output


def test_column_checks_asked_for_beside_a_backend_need_no_model_run(good):
    """--check of column checks only runs no model: a named backend is listed as not run (it
    was left out without a word), and one that cannot run here is still a failure."""
    r = _verify(good, "--backend", "sdpa", "--check", "labels")
    assert r.exit_code == 0 and "every attention backend was skipped" not in r.output, r.output
    assert "SKIP  sdpa" in r.output and "not run: every check asked for (--check) is a column " \
        "check) [not required]" in r.output, r.output
    r = _verify(good, "--backend", "flash", "--check", "labels")
    assert r.exit_code == 1 and "backend flash did not run" in r.output, r.output


def test_a_verdict_needs_one_check_that_ran(good):
    """--check cu_seqlens_unpadded alone on an output packed without --segment-multiple: the
    check does not apply, nothing else ran, so nothing was verified (it exited 0, "OK: 0
    passed, 0 failed, 1 skipped")."""
    r = _verify(good, "--data-only", "--check", "cu_seqlens_unpadded")
    assert r.exit_code == 1 and "no check ran" in r.output, r.output
    r = _verify(good, "--data-only", "--check", "cu_seqlens_unpadded", "--check", "labels")
    assert r.exit_code == 0, r.output


def test_data_only_with_a_model_check_is_a_usage_error(good):
    """--data-only --check logits_match passed (exit 0) having checked nothing."""
    r = _verify(good, "--data-only", "--check", "logits_match")
    assert r.exit_code == 2 and "--check logits_match runs the model, and --data-only runs " \
        "none" in r.output, r.output
    from packtool.errors import ConfigError

    with pytest.raises(ConfigError, match="--data-only runs none"):
        run_verify(good, data_only=True, checks=["isolation"])
    assert run_verify(good, data_only=True, checks=["labels"]).ok


def test_a_model_failure_on_broken_rows_blames_the_data_not_the_model(good):
    """Positions not reset in one row: the hf backend's leak message told the user the model
    needs a kernel it lacks and to train one document per row. With a column check failed
    first, the model failure names the data and the repack instead."""
    from packed_helpers import edit_rows

    def edit(rows):
        i = next(i for i, r in enumerate(rows) if len(r["doc_ids"]) >= 2)
        rows[i]["position_ids"] = list(range(len(rows[i]["position_ids"])))
        return rows

    edit_rows(good, edit)
    rep = run_verify(good, backends=["hf", "sdpa"], rows=0)
    assert rep.get("data", "position_ids").status == FAIL
    for backend in ("hf", "sdpa"):
        r = rep.get(backend, "logits_match")
        assert r.status == FAIL, rep.format_text()
        assert "breaks the position_ids contract (see position_ids)" in r.message
        assert "rerun the same packtool pack" in r.message
        assert "train it on one document per row" not in r.message


def test_model_checks_alone_on_broken_rows_still_blame_the_data(good):
    """`--check logits_match --check isolation` on rows whose positions do not reset: no column
    check is in the report, and logits_match blamed the model ("depends on where a token sits
    in the row ... ALiBi; train it on one document per row"). The scan still checks every
    column: the failure names position_ids and the repack, and reports no column check."""
    from packed_helpers import edit_rows

    def edit(rows):
        i = next(i for i, r in enumerate(rows) if len(r["doc_ids"]) >= 2)
        rows[i]["position_ids"] = list(range(len(rows[i]["position_ids"])))
        return rows

    edit_rows(good, edit)
    rep = run_verify(good, backends=["sdpa"], rows=0, checks=["logits_match", "isolation"])
    assert not [r for r in rep.results if r.backend == "data"], rep.format_text()
    r = rep.get("sdpa", "logits_match")
    assert r.status == FAIL and not rep.ok, rep.format_text()
    assert "breaks the position_ids contract (see position_ids (a column check --check left " \
        "out) fails there: position at token" in r.message
    assert "rerun the same packtool pack" in r.message
    assert "train it on one document per row" not in r.message
    r = _verify(good, "--rows", "0", "--backend", "sdpa", "--check", "logits_match")
    assert r.exit_code == 1 and "position_ids (a column check --check left out)" in r.output
    assert "train it on one document per row" not in r.output and "documents leak" not in \
        r.output, r.output
    # a column check asked for that passes does not hide the one left out
    rep = run_verify(good, backends=["sdpa"], rows=0, checks=["logits_match", "labels"])
    assert rep.get("data", "labels").status == PASS
    assert "position_ids (a column check --check left out)" in \
        rep.get("sdpa", "logits_match").message


def test_model_checks_failing_on_a_row_with_a_label_fault_name_the_column_check(tmp_path):
    """A label on padding (num_targets raised with it): loss_denominator and grad_zero_padding
    blamed the model ("packed loss over 10 targets != 9", "a real token attends padding").
    On a row whose column checks failed, every failed model check says it follows from them:
    "row N breaks the labels, num_targets contract (see labels, num_targets)", and names a
    column check --check left out with its message."""
    from packed_helpers import edit_rows

    out = pack_docs(tmp_path, DOCS, 16, "--labels", "unshifted")
    hit = []

    def edit(rows):
        i = next(i for i, r in enumerate(rows)
                 if len(r["doc_ids"]) >= 2 and r["segment_ids"][-2] == 0)
        rows[i]["labels"][-1] = rows[i]["input_ids"][-1]  # the last padding token is a target
        rows[i]["num_targets"] += 1
        hit.append(i)
        return rows

    edit_rows(out, edit)
    rep = run_verify(out, backends=["sdpa"], rows=0)
    assert rep.get("data", "labels").status == FAIL and not rep.ok
    failed = [r for r in rep.results if r.backend == "sdpa" and r.status == FAIL]
    assert {r.check for r in failed} >= {"loss_denominator", "grad_zero_padding"}, \
        rep.format_text()
    for r in failed:
        assert r.where["row"] == hit[0]
        assert r.message.startswith(f"row {hit[0]} breaks the labels, num_targets contract "
                                    "(see labels; num_targets): "), r.message
        assert f"the {r.check} failure follows from that column fault" in r.message
    rep = run_verify(out, backends=["sdpa"], rows=0, checks=["loss_denominator"])
    r = rep.get("sdpa", "loss_denominator")
    assert r.status == FAIL and "labels (a column check --check left out) fails there: " \
        "label at token 15" in r.message, r.message


def test_grad_zero_padding_on_rows_without_padding_is_skipped_not_passed(tmp_path):
    """Every document exactly C tokens: no row has padding, so grad_zero_padding saw nothing.
    It printed PASS (and --check grad_zero_padding alone exited 0 having checked nothing); it
    is skipped, not required, and asked for by name it did not run."""
    rng = np.random.default_rng(4)
    out = pack_docs(tmp_path, [list(map(int, rng.integers(1, 500, 16))) for _ in range(6)], 16)
    rep = run_verify(out, rows=2, backends=["sdpa"])
    g = rep.get("sdpa", "grad_zero_padding")
    assert g.status == SKIP and not g.required and rep.ok, rep.format_text()
    r = _verify(out, "--backend", "sdpa", "--check", "grad_zero_padding")
    assert r.exit_code == 1 and "grad_zero_padding on backend sdpa did not run: no padding" \
        in r.output, r.output
    padded = pack_docs(tmp_path / "p", DOCS, 16)  # rows with padding: it runs and passes
    assert run_verify(padded, rows=2, backends=["sdpa"]).get(
        "sdpa", "grad_zero_padding").status == PASS


def _clean_measurements():
    m = Measurements("sdpa", rows=2, rows_multi_doc=2, tol=1e-5)
    m.logit.add(torch.tensor([1e-7]), {"row": 0})
    m.iso_other.add(torch.tensor([0.0]), {"row": 0})
    m.iso_effect_min = 1.0
    m.grad_pad.add(torch.tensor([0.0]), {"row": 0})
    m.grad_ignored.add(torch.tensor([0.0]), {"row": 0})
    m.rows_with_targets = m.rows_padded = 1
    m.loss_packed_sum = m.loss_ref_sum = 6.0
    m.targets_packed = m.targets_ref = 3
    return m


#: what each check said of a NaN or inf, read as a difference, a leak or a wrong label
_LEAK_WORDS = ("documents not kept apart", "a real token attends padding", "differ from the "
               "per-document forward by inf", "differ from the per-document forward by nan",
               "a label on another token", "non-zero gradient on the logits")


@pytest.mark.parametrize("name", ["logits_match", "isolation", "loss_denominator",
                                  "grad_zero_ignored", "grad_zero_padding"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_is_never_reported_as_a_leak(name, bad):
    """A NaN or inf among the values a check compares was read as a difference of inf:
    "changing document 1 moved another document's logits by inf (documents not kept apart)",
    "non-zero gradient at a padding input (a real token attends padding)". Each check now fails
    saying NaN or inf, counts them (nan_or_inf), keeps its leak figure over the finite values,
    and the driver does not look for a leak (nonfinite_only); a real leak beside them is still
    one."""
    from packtool.verify.equivalence import nonfinite_only

    put = {"logits_match": lambda m, v: m.logit.add(torch.tensor([1e-7, v]), {"row": 1}),
           "isolation": lambda m, v: m.iso_other.add(torch.tensor([0.0, v]), {"row": 1}),
           "loss_denominator": lambda m, v: m.seg_loss.add(torch.tensor([v]), {"row": 1}),
           "grad_zero_ignored": lambda m, v: m.grad_ignored.add(torch.tensor([0.0, v]), {}),
           "grad_zero_padding": lambda m, v: m.grad_pad.add(torch.tensor([0.0, v]), {})}
    m = _clean_measurements()
    put[name](m, bad)
    r = run_checks(m)[name]
    assert r.status == FAIL and r.figures["nan_or_inf"] == 1, r
    assert "NaN or inf" in r.message and "says nothing of a leak" in r.message, r.message
    assert not any(w in r.message for w in _LEAK_WORDS), r.message
    assert nonfinite_only(r), r
    if name in ("logits_match", "isolation", "grad_zero_padding"):
        m = _clean_measurements()  # a finite leak beside the NaN is still reported
        put[name](m, bad)
        put[name](m, 0.5)
        r = run_checks(m)[name]
        assert r.status == FAIL and not nonfinite_only(r), r
        assert any(w in r.message for w in _LEAK_WORDS[:2] + ("differ from the per-document "
                                                              "forward by 0.5",)), r.message


def test_an_infinite_reference_no_longer_widens_the_tolerance_to_infinity(good, monkeypatch):
    """The tolerance is scaled by the references' largest logit: one inf there made it inf, and
    verify passed whatever the packed rows computed. It is taken over the finite values now:
    logits_match fails, saying the model gives inf on a document alone."""
    from packtool.verify.runners import Runner

    plain = Runner.reference

    def infinite_first(self, docs, budget, *, model=None):
        out = plain(self, docs, budget, model=model)
        out[0] = out[0].clone()
        out[0][0, 0] = float("inf")
        return out

    monkeypatch.setattr(Runner, "reference", infinite_first)
    rep = run_verify(good, rows=0, backends=["sdpa"])
    lm = rep.get("sdpa", "logits_match")
    assert lm.status == FAIL and not rep.ok, rep.format_text()
    assert lm.figures["tol"] < 1 and lm.figures["nan_or_inf"] >= 1, lm.figures
    assert "the model gives NaN or inf on a document run alone" in lm.message, lm.message


def test_nan_from_a_mask_without_a_key_for_padding_is_put_down_to_the_packed_rows(tmp_path):
    """B22's broken mask (padding queries with no key) gives NaN: verify fails finite saying the
    packed rows cause it (that padding and that document alone are finite), never suggesting
    another --pad-id, and grad_zero_padding says NaN, not "a real token attends padding"."""
    out = pack_docs(tmp_path, [[5, 6, 7], [8, 9, 10, 11]], 5)
    rep = run_verify(out, rows=0, backends=["sdpa"], attend_overrides={"sdpa": no_padding_block})
    fin, pad = rep.get("sdpa", "finite"), rep.get("sdpa", "grad_zero_padding")
    assert fin.status == FAIL and pad.status == FAIL, rep.format_text()
    assert "though that padding run alone is finite: the packed rows cause them" in fin.message
    assert "--pad-id" not in fin.message, fin.message
    assert "a real token attends padding" not in pad.message and "NaN or inf" in pad.message


@pytest.mark.parametrize("scan_all", [True, False])
def test_padding_is_checked_when_only_single_document_rows_have_it(tmp_path, scan_all):
    """Rows of two 8-token documents fill C = 16; the one padded row holds a single 12-token
    document. Only rows holding two documents were sampled, so grad_zero_padding was skipped
    ("no padding in the rows run through the model") though the output has padding: one padded
    row is now added when no sampled row has padding (with or without --no-scan)."""
    rng = np.random.default_rng(5)
    docs = [list(map(int, rng.integers(1, 500, n))) for n in [8] * 16 + [12]]
    out = pack_docs(tmp_path, docs, 16)
    for seed in range(3):
        rep = run_verify(out, rows=2, seed=seed, backends=["sdpa"], scan_all=scan_all)
        pad = rep.get("sdpa", "grad_zero_padding")
        assert pad.status == PASS, rep.format_text()
        assert any("no sampled row has padding; added row" in n for n in rep.notes), rep.notes
        assert len(rep.rows) == 3 and rep.ok, rep.format_text()


def test_checks_with_nothing_to_measure_are_skipped_with_their_reason_never_passed():
    """No target in the rows run: no loss, so loss_denominator compared 0 with 0 and the
    gradient checks looked at gradients that are 0 whatever the masks; each passed. They are
    skipped now, saying why, as isolation is without a row holding two documents."""
    from packtool.verify.equivalence import NO_PADDED_TARGETS, NO_PADDING, NO_TARGETS

    m = Measurements("sdpa", rows=2, rows_multi_doc=1, tol=1e-5)
    m.logit.add(torch.tensor([1e-7]), {"row": 0})
    m.iso_other.add(torch.tensor([0.0]), {"row": 0})
    m.iso_effect_min = 1.0
    m.rows_padded = 1
    res = run_checks(m)
    for name in ("loss_denominator", "grad_zero_ignored", "grad_zero_padding"):
        assert res[name].status == SKIP and res[name].message == NO_TARGETS, res[name]
    assert res["loss_denominator"].figures == {"targets_packed": 0, "targets_per_doc": 0}
    assert {res[n].status for n in ("logits_match", "isolation", "finite")} == {PASS}
    m.rows_with_targets = 1  # targets, but not in the padded row
    m.targets_packed = m.targets_ref = 2
    m.loss_packed_sum = m.loss_ref_sum = 4.0
    m.grad_ignored.add(torch.tensor([0.0, 0.0]), {"row": 0})
    res = run_checks(m)
    assert res["grad_zero_padding"].message == NO_PADDED_TARGETS, res["grad_zero_padding"]
    assert res["loss_denominator"].status == res["grad_zero_ignored"].status == PASS
    assert res["grad_zero_ignored"].figures["rows_with_targets"] == 1
    m.rows_padded = 0
    assert run_checks(m)["grad_zero_padding"].message == NO_PADDING


def _one_multi_row_without_targets(tmp_path):
    """C = 2, labels shifted: [3, 4] and [6, 7] (one target each), [1, 2] (two one-token
    documents: the only row holding two documents has no target), [5, pad] (no target)."""
    return pack_docs(tmp_path, [[1], [2], [3, 4, 5], [6, 7]], 2, "--labels", "shifted")


@pytest.mark.parametrize("scan", [(), ("--no-scan",)])
def test_loss_checks_run_on_rows_holding_targets(tmp_path, scan):
    """The sample took the one row holding two documents and the padded row, neither with a
    target: loss_denominator passed with packed_loss=0 over targets_packed=0 and
    grad_zero_ignored passed, measuring nothing. A row holding a target is now added."""
    out = _one_multi_row_without_targets(tmp_path)
    r = _verify(out, *scan, "--backend", "sdpa", "--rows", "1", "--check", "loss_denominator",
                "--check", "grad_zero_ignored", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output[r.output.index("{"):])
    res = {x["check"]: x for x in rep["results"] if x["backend"] == "sdpa"}
    assert res["loss_denominator"]["status"] == PASS
    assert res["loss_denominator"]["figures"]["targets_packed"] >= 1, res
    assert res["grad_zero_ignored"]["status"] == PASS
    assert res["grad_zero_ignored"]["figures"]["rows_with_targets"] >= 1, res
    if not scan:  # the sample is drawn from the rows holding two documents: row 2
        assert any("no sampled row holds a target; added row" in n for n in rep["notes"]), rep
    # the padded row holds no target, nor does any other padded row: grad_zero_padding has
    # nothing to look at; skipped, not required, unless named
    full = run_verify(out, backends=["sdpa"], scan_all=not scan)
    pad = full.get("sdpa", "grad_zero_padding")
    assert pad.status == SKIP and not pad.required and full.ok, full.format_text()
    assert "no row of the output holds both padding and a target" in pad.message
    r = _verify(out, *scan, "--backend", "sdpa", "--check", "grad_zero_padding")
    assert r.exit_code == 1 and "check grad_zero_padding on backend sdpa did not run" in r.output


@pytest.mark.parametrize("scan", [(), ("--no-scan",)])
def test_an_output_without_targets_skips_the_loss_checks_and_fails_them_when_named(tmp_path,
                                                                                  scan):
    """Every document one token long: no row of the output holds a target. The loss and
    gradient checks are skipped, not required, saying so, and fail the verdict when named with
    --check, exactly as isolation does on an output of one document per row."""
    out = pack_docs(tmp_path, [[1], [2], [3], [4], [5]], 2, "--labels", "shifted")
    r = _verify(out, *scan, "--backend", "sdpa")
    assert r.exit_code == 0, r.output
    for name in ("loss_denominator", "grad_zero_ignored", "grad_zero_padding"):
        line = next(ln for ln in r.output.splitlines() if f" {name} " in ln)
        assert line.startswith("SKIP") and "no row of the output holds a target" in line, line
        assert line.endswith("[not required]"), line
    for name in ("loss_denominator", "grad_zero_ignored", "grad_zero_padding"):
        r = _verify(out, *scan, "--backend", "sdpa", "--check", name)
        assert r.exit_code == 1, r.output
        assert f"check {name} on backend sdpa did not run: no row of the output holds a " \
               "target" in r.output, r.output


def test_the_padding_column_check_is_skipped_on_rows_without_padding(tmp_path):
    """[11,12,13] and [21,22] fill C = 5: no token outside a document. The padding column check
    passed having compared nothing; it is skipped, not required, saying why, and fails the
    verdict when named with --check. With padding it runs and passes."""
    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 5)
    r = _verify(out, "--data-only")
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if " padding " in ln)
    assert line.startswith("SKIP") and "no padding in the rows checked" in line, line
    assert line.endswith("[not required]"), line
    r = _verify(out, "--data-only", "--check", "padding")
    assert r.exit_code == 1 and "check padding on backend data did not run" in r.output, r.output
    padded = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 6, name="padded")
    r = _verify(padded, "--data-only", "--check", "padding")
    assert r.exit_code == 0 and any(ln.startswith("PASS") and " padding " in ln
                                    for ln in r.output.splitlines()), r.output


def test_the_sample_takes_rows_with_targets_first_then_the_other_multi_document_rows(tmp_path):
    """C = 4: three rows of two 2-token documents (targets) and three of four 1-token documents
    (no target). --rows 4 runs the three rows with targets and one other, not fewer."""
    docs = [[10 + i, 20 + i] for i in range(6)] + [[30 + i] for i in range(12)]
    out = pack_docs(tmp_path, docs, 4, "--labels", "shifted")
    rep = run_verify(out, rows=4, backends=["sdpa"], checks=["loss_denominator"])
    assert rep.ok and len(rep.rows) == 4, rep.format_text()
    den = rep.get("sdpa", "loss_denominator")
    assert den.figures["targets_packed"] == 6, den.figures  # every target of the output


def _padding_given_segment_1(rows):
    for r in rows:
        e = r["cu_seqlens"][len(r["doc_ids"])]
        r["segment_ids"][e:] = [1] * (len(r["segment_ids"]) - e)
    return rows


def _labels_all_ignored(rows):
    for r in rows:
        r["labels"] = [-100] * len(r["labels"])
    return rows


def _one_doc_id_per_row(rows):
    for r in rows:
        r["doc_ids"] = r["doc_ids"][:1]
    return rows


@pytest.mark.parametrize("edit, docs, checks, columns, scan_all", [
    # the model finds padding by segment_ids == 0, the contract by cu_seqlens and doc_ids
    (_padding_given_segment_1, DOCS, ["grad_zero_padding"], ["segment_ids"], True),
    (_padding_given_segment_1, DOCS, ["grad_zero_padding"], ["segment_ids"], False),
    # the model finds targets in the stored labels
    (_labels_all_ignored, DOCS, ["loss_denominator", "grad_zero_ignored", "grad_zero_padding"],
     ["labels"], True),
    # the rows holding two documents are found by doc_ids (two 8-token documents per row)
    (_one_doc_id_per_row, [list(range(1, 9))] * 6, ["isolation", "grad_zero_padding"],
     ["doc_ids"], True),
])
def test_a_model_check_with_nothing_to_measure_in_broken_rows_names_the_broken_column(
        tmp_path, edit, docs, checks, columns, scan_all):
    """Padding given segment id 1 in every row, --check grad_zero_padding: the check was
    skipped, "no padding in the rows run through the model", and the verdict said no
    attention check ran though sdpa did, never naming segment_ids. A model check that finds
    nothing to measure (padding, a target, two documents) in rows whose columns break the
    contract on exactly that fails naming the column check at fault, with or without it in
    --check, and the backend is not called skipped."""
    from packed_helpers import edit_rows

    out = pack_docs(tmp_path, docs, 16, "--labels", "unshifted")
    edit_rows(out, edit)
    for asked in (checks, None):
        rep = run_verify(out, backends=["sdpa"], rows=0, checks=asked, scan_all=scan_all)
        text = rep.format_text()
        assert not rep.ok, text
        for name in checks:
            r = rep.get("sdpa", name)
            assert r.status == FAIL, text
            assert r.message.startswith(f"row {r.where['row']} breaks the "), r.message
            assert all(c in r.message.split(" contract")[0] for c in columns), r.message
            assert (f"{name} found nothing to measure (" in r.message
                    and "because of that column fault" in r.message
                    or f"the {name} failure follows from that column fault" in r.message), \
                r.message
            if asked is not None:
                assert f"{columns[0]} (a column check --check left out) fails there: " \
                    in r.message, r.message
        assert "every attention backend was skipped" not in text, text
        assert "no check ran" not in text, text


def test_verify_on_padding_given_segment_id_1_names_segment_ids_from_the_command_line(good):
    from packed_helpers import edit_rows

    edit_rows(good, _padding_given_segment_1)
    r = _verify(good, "--check", "grad_zero_padding", "--backend", "sdpa")
    assert r.exit_code == 1, r.output
    assert "has segment_id 1, must be 0" in r.output and "breaks the segment_ids" in r.output
    assert "did not run: no padding" not in r.output, r.output
    assert "every attention backend was skipped" not in r.output, r.output


def test_a_backend_that_ran_with_every_check_skipped_is_not_called_skipped(tmp_path):
    """--check grad_zero_padding on an output without padding: sdpa ran, the check had nothing
    to look at; the verdict said "every attention backend was skipped"."""
    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 5)
    rep = run_verify(out, backends=["sdpa"], checks=["grad_zero_padding"])
    assert not rep.ok
    text = rep.format_text()
    assert "every attention backend was skipped" not in text, text
    assert "sdpa ran" in text, text


@pytest.mark.parametrize("case", ["backend", "check", "nothing", "empty"])
def test_a_failed_verdict_with_no_check_failed_says_why_in_its_summary(good, tmp_path, case):
    """`--backend varlen` on CPU printed "FAILED: 12 passed, 0 failed, 1 skipped" and exited
    1: the summary line counts what made the verdict fail beside the failed checks."""
    if case == "backend":
        if torch.cuda.is_available():
            pytest.skip("a GPU is present")
        r, want = _verify(good, "--backend", "sdpa", "--backend", "varlen"), \
            "1 required backend unavailable"
    elif case == "check":
        out = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 5, name="full")
        r, want = _verify(out, "--backend", "sdpa", "--check", "grad_zero_padding"), \
            "1 required check not run"
    elif case == "nothing":
        r, want = _verify(good, "--data-only", "--check", "cu_seqlens_unpadded"), \
            "no check ran"
    else:
        out = pack_docs(tmp_path, [[1, 2]], 4, "--min-fill", "0.9", name="empty")
        r, want = _verify(out, "--backend", "sdpa"), "nothing to verify"
    assert r.exit_code == 1, r.output
    summary = next(ln for ln in r.output.splitlines() if ln.startswith("FAILED:"))
    assert want in summary, r.output
