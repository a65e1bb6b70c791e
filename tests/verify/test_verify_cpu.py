"""packtool verify passes on good output and fails on each deliberately broken one (B02, B29)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from packtool.cli import cli  # noqa: E402
from packtool.verify.checks import check_row_contract, run_verify  # noqa: E402

from packcheck import no_padding_block  # noqa: E402
from packed_helpers import edit_rows, pack_docs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RNG = np.random.default_rng(0)
# several documents per row, ids above 65535 (16-bit bugs show), one document over C (split)
DOCS = [list(map(int, RNG.integers(0, 131_000, n))) for n in [9, 5, 7, 3, 12, 4, 6, 2, 40, 8, 1]]
C = 16


def _failed(report, backend, check):
    return [r for r in report.results
            if r.backend == backend and r.check == check and r.status == "fail"]


@pytest.fixture
def good(tmp_path):
    return pack_docs(tmp_path, DOCS, C)


def test_verify_passes_on_good_output_with_sdpa_flex_and_hf(good):
    """By default every backend that can run here runs and passes; GPU-only backends are listed
    as skipped (not required), never as passed."""
    rep = run_verify(good, rows=0)
    assert rep.ok, rep.format_text()
    ran = {(r.backend, r.check) for r in rep.results if r.status == "pass"}
    for b in ("sdpa", "flex", "hf"):
        assert (b, "logits_match") in ran and (b, "isolation") in ran
        assert (b, "loss_denominator") in ran
    if not torch.cuda.is_available():
        skipped = {r.backend for r in rep.results if r.status == "skip" and r.check == "all"
                   and not r.required}
        assert {"flash", "varlen"} <= skipped
    lm = next(r for r in rep.results if r.backend == "sdpa" and r.check == "logits_match")
    assert lm.figures["max_abs_diff"] <= 1e-5


def test_b02_b29_plain_causal_mask_fails_and_names_segment_2(tmp_path):
    """A plain causal mask (no document blocks) lets B see A: verify must fail at segment 2."""
    out = pack_docs(tmp_path, [[5, 6, 7], [8, 9]], 5)
    F = torch.nn.functional
    plain = {"sdpa": lambda b, dev: (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True))}
    rep = run_verify(out, rows=0, backends=["sdpa"], attend_overrides=plain)
    assert not rep.ok
    iso = _failed(rep, "sdpa", "isolation")
    assert iso and iso[0].where["segment"] == 2 and iso[0].where["row"] == 0
    assert _failed(rep, "sdpa", "logits_match")[0].where["segment"] == 2
    good = run_verify(out, rows=0, backends=["sdpa"])
    assert good.ok, good.format_text()


def _row_with_two_docs(rows):
    return next(i for i, r in enumerate(rows) if len(r["doc_ids"]) >= 2)


def test_positions_not_reset_fail(good):
    """B01: one running position counter over the row shows in the logits of every backend."""
    def edit(rows):
        i = _row_with_two_docs(rows)
        rows[i]["position_ids"] = list(range(C))
        return rows

    edit_rows(good, edit)
    rep = run_verify(good, rows=0, backends=["sdpa", "hf"])
    assert _failed(rep, "data", "position_ids")
    assert _failed(rep, "sdpa", "logits_match")
    assert _failed(rep, "hf", "logits_match")  # transformers finds documents from position_ids


def test_cu_seqlens_boundary_moved_fails(good):
    """A boundary moved by one token in cu_seqlens disagrees with segment_ids and the model."""
    def edit(rows):
        i = _row_with_two_docs(rows)
        rows[i]["cu_seqlens"][1] += 1
        return rows

    edit_rows(good, edit)
    rep = run_verify(good, rows=0, backends=["sdpa"])
    assert _failed(rep, "data", "segment_ids") or _failed(rep, "data", "cu_seqlens")
    assert _failed(rep, "sdpa", "logits_match")


def test_label_crossing_a_boundary_fails(tmp_path):
    """B03: the first token of document 2 as a target of document 1's last token must fail."""
    good = pack_docs(tmp_path, DOCS, C, "--labels", "unshifted")  # a stored labels column
    def edit(rows):
        i = _row_with_two_docs(rows)
        j = rows[i]["cu_seqlens"][1]
        rows[i]["labels"][j] = rows[i]["input_ids"][j]
        rows[i]["num_targets"] += 1  # keep the count self-consistent: only the label is wrong
        return rows

    edit_rows(good, edit)
    rep = run_verify(good, rows=0, backends=["sdpa"])
    lab = _failed(rep, "data", "labels")
    assert lab and lab[0].where["segment"] == 2
    den = _failed(rep, "sdpa", "loss_denominator")
    assert den and den[0].where["segment"] == 2


def test_segment_ids_merged_fails(good):
    """Two documents under one segment id attend to each other: verify must fail."""
    def edit(rows):
        i = _row_with_two_docs(rows)
        rows[i]["segment_ids"] = [1 if s == 2 else s for s in rows[i]["segment_ids"]]
        return rows

    edit_rows(good, edit)
    rep = run_verify(good, rows=0, backends=["sdpa", "flex"])
    assert _failed(rep, "data", "segment_ids")
    assert _failed(rep, "sdpa", "logits_match") and _failed(rep, "sdpa", "isolation")
    assert _failed(rep, "flex", "logits_match")


def test_cli_verify_exit_codes_and_json(good):
    """exit 0 and a JSON report on good output; exit 1 naming shard, row, segment and check."""
    r = CliRunner().invoke(cli, ["verify", str(good), "--backend", "sdpa", "--json",
                                 "--rows", "3"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["ok"] is True

    def edit(rows):
        i = _row_with_two_docs(rows)
        rows[i]["segment_ids"] = [1 if s == 2 else s for s in rows[i]["segment_ids"]]
        return rows

    edit_rows(good, edit)
    r = CliRunner().invoke(cli, ["verify", str(good), "--backend", "sdpa", "--rows", "0"])
    assert r.exit_code == 1
    last = r.output.strip().splitlines()[-1]
    for word in ("part-00000.parquet", "row", "segment", "segment_ids"):
        assert word in last, last


def test_b05_shifted_labels_checked_against_their_own_convention(tmp_path):
    """Shifted output passes; the same labels read as unshifted fail (a double shift)."""
    out = pack_docs(tmp_path, [[11, 12, 13, 14], [21, 22]], 8, "--labels", "shifted")
    rep = run_verify(out, rows=0, backends=["sdpa"])
    assert rep.ok, rep.format_text()
    row = {"input_ids": [11, 12, 13, 14], "segment_ids": [1, 1, 1, 1],
           "position_ids": [0, 1, 2, 3], "cu_seqlens": [0, 4], "max_seqlen": 4,
           "num_targets": 3, "doc_ids": [0], "labels": [12, 13, 14, -100]}
    assert check_row_contract(row, "shifted") == []
    assert [c for c, _, _ in check_row_contract(row, "unshifted")] == ["labels"]


def test_verify_cli_passes_on_packed_sample_data(tmp_path, sample_data):
    """The real sample output, through the CLI as CI users run it: sdpa, flex and hf agree with
    per-document forwards (hf skips, reported, when transformers is missing)."""
    from click.testing import CliRunner

    from packtool.cli import cli

    out = tmp_path / "packed"
    res = CliRunner().invoke(cli, ["pack", "-q", "--capacity", "2048", str(sample_data), str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["verify", str(out), "--rows", "2", "--backend", "sdpa",
                                   "--backend", "flex", "--backend", "hf", "--json",
                                   "--no-compile"])
    assert res.exit_code == 0, res.output
    import json

    report = json.loads(res.output)
    assert report["ok"] is True
    ran = {(r["backend"], r["status"]) for r in report["results"]}
    assert ("sdpa", "pass") in ran and ("flex", "pass") in ran
    assert not any(r["status"] == "fail" for r in report["results"])


def _many_single_doc_rows_plus_packed_ones():
    """Mostly rows holding one document (long documents) and a few rows holding several."""
    rng = np.random.default_rng(5)
    return ([list(map(int, rng.integers(1, 1000, C))) for _ in range(30)]
            + [list(map(int, rng.integers(1, 1000, n))) for n in (5, 4, 3, 2, 2)])


def test_one_broken_row_among_many_is_found_by_the_scan(tmp_path):
    """A sample of 2 rows would likely miss the one broken row: the column scan covers every
    row, and the model sample is drawn from rows that hold two documents or more."""
    out = pack_docs(tmp_path, _many_single_doc_rows_plus_packed_ones(), C)

    def edit(rows):
        i = max(range(len(rows)), key=lambda k: len(rows[k]["doc_ids"]))
        rows[i]["position_ids"] = list(range(C))
        return rows

    edit_rows(out, edit)
    rep = run_verify(out, rows=2, backends=["sdpa"])
    assert _failed(rep, "data", "position_ids")
    assert _failed(rep, "sdpa", "logits_match")  # the sample holds the multi-document rows
    sampled = run_verify(out, rows=2, backends=["sdpa"], scan_all=False, seed=1)
    data_checked = {r.figures["rows_checked"] for r in sampled.results if r.backend == "data"}
    # the 2 sampled rows, plus one row holding two documents when neither of them does
    assert data_checked == {len(sampled.rows)} and len(sampled.rows) in (2, 3)


def test_isolation_is_checked_even_when_most_rows_hold_one_document(tmp_path):
    out = pack_docs(tmp_path, _many_single_doc_rows_plus_packed_ones(), C)
    rep = run_verify(out, rows=2, backends=["sdpa"])
    iso = next(r for r in rep.results if r.backend == "sdpa" and r.check == "isolation")
    assert iso.status == "pass", rep.format_text()


def test_b32_compiled_flex_matches_and_does_not_recompile_for_other_segment_counts(tmp_path):
    """B32: shard A holds one row of segments [3, 2] (cu [0,3,5,8]), shard B one row of
    [2, 1, 1, 1] (cu [0,2,3,4,5,8]); compiled FlexAttention matches the per-document reference on
    both, and the second shape of segments compiles no new graph (the mask is data, not shape)."""
    from torch._dynamo.utils import counters

    a = pack_docs(tmp_path, [[1, 2, 3], [4, 5]], 8, name="a")
    b = pack_docs(tmp_path, [[1, 2], [3], [4], [5]], 8, name="b")
    from packtool.formats.packed import PackedOutput

    assert PackedOutput.open(a).read_row(0)["cu_seqlens"].tolist() == [0, 3, 5, 8]
    assert PackedOutput.open(b).read_row(0)["cu_seqlens"].tolist() == [0, 2, 3, 4, 5, 8]
    ra = run_verify(a, rows=0, backends=["flex"], compile=True)
    assert ra.ok, ra.format_text()
    graphs = counters["stats"]["unique_graphs"]
    rb = run_verify(b, rows=0, backends=["flex"], compile=True)
    assert rb.ok, rb.format_text()
    assert counters["stats"]["unique_graphs"] - graphs <= 1


# rows of 48 tokens holding about six short documents each, the last row with a padding tail
WDOCS = [list(map(int, np.random.default_rng(7).integers(0, 131_000, n)))
         for n in [7, 5, 9, 3, 12, 4, 6, 8, 10, 5, 11, 6, 3, 9, 7, 4, 8, 5]]
CW, WINDOW = 48, 16


@pytest.mark.parametrize("control", ["plain_causal", "positions", "cu_moved", "label_cross",
                                     "merged", "padding_no_key"])
def test_every_broken_output_control_is_caught_on_row_windows(tmp_path, control):
    """The model checks run on windows of 16 of each row's 48 tokens (from a document's start,
    across boundaries, and into the padding tail): each broken output the whole-row tests
    build still fails a model check, located by the row's own segment number; the good
    output passes."""
    extra = ["--labels", "unshifted"] if control == "label_cross" else []
    out = pack_docs(tmp_path, WDOCS, CW, *extra)
    good = run_verify(out, rows=0, backends=["sdpa"], row_window=WINDOW)
    assert good.ok, good.format_text()
    assert any(f"windows of {WINDOW} of their {CW} tokens" in n for n in good.notes), good.notes
    F = torch.nn.functional
    overrides = {}
    if control == "plain_causal":
        overrides = {"sdpa": lambda b, dev: (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True))}
    elif control == "padding_no_key":
        overrides = {"sdpa": no_padding_block}
    else:
        def edit(rows):
            r = rows[0]
            if control == "positions":
                r["position_ids"] = list(range(CW))
            elif control == "cu_moved":
                r["cu_seqlens"][1] += 1
            elif control == "label_cross":
                j = r["cu_seqlens"][1]
                r["labels"][j] = r["input_ids"][j]
                r["num_targets"] += 1
            else:
                r["segment_ids"] = [1 if s == 2 else s for s in r["segment_ids"]]
            return rows

        edit_rows(out, edit)
    rep = run_verify(out, rows=0, backends=["sdpa"], row_window=WINDOW,
                     attend_overrides=overrides)
    assert not rep.ok
    check = {"plain_causal": "isolation", "positions": "logits_match",
             "cu_moved": "logits_match", "label_cross": "loss_denominator",
             "merged": "isolation", "padding_no_key": "finite"}[control]
    bad = _failed(rep, "sdpa", check)
    assert bad, rep.format_text()
    if control in ("plain_causal", "label_cross", "merged"):  # the row's own segment 2
        assert bad[0].where["segment"] == 2, bad[0].where
    if not overrides:  # the one row edited (a broken mask breaks every row it reaches)
        assert bad[0].where["row"] == 0, bad[0].where


def test_row_windows_start_at_a_document_and_keep_the_rows_columns(tmp_path):
    """A window begins at a document's first token, ends inside the row, holds the stored
    boundaries inside it, and a row with padding gets a second window into its padding."""
    from packtool.loader import PackedDataset
    from packtool.verify.checks import row_windows

    out = pack_docs(tmp_path, WDOCS, CW)
    ds = PackedDataset(out)
    items = [ds[i] for i in range(len(ds))]
    padded = [it for it in items if int(np.count_nonzero(it["segment_ids"])) < CW]
    assert padded
    for it in items:
        ws = row_windows(it, WINDOW)
        seg = np.asarray(it["segment_ids"])
        real = int(np.count_nonzero(seg))
        assert len(ws) == (2 if real < CW and not any(w["window"][1] > real for w in ws[:1])
                           else 1)
        for w in ws:
            a, b = w["window"]
            assert b - a == WINDOW and (a == 0 or seg[a] != seg[a - 1])
            assert np.asarray(w["position_ids"])[0] == 0
            assert np.array_equal(w["input_ids"], np.asarray(it["input_ids"])[a:b])
            cu = np.asarray(w["cu_seqlens"])
            assert cu[0] == 0 and cu[-1] == WINDOW and (np.diff(cu) > 0).all()
            inner = np.asarray(it["cu_seqlens"])
            assert set((cu[1:-1] + a).tolist()) == set(inner[(inner > a) & (inner < b)].tolist())
            assert w["segment_base"] == int(seg[a]) - 1 or seg[a] == 0
        if real < CW:
            assert any(w["window"][1] > real for w in ws)  # the padding boundary is checked


def test_b02_negative_control_from_the_command_line(tmp_path, monkeypatch):
    """verify --negative-control runs sdpa on the same rows with a plain causal mask and shows
    it caught at segment 2 of the row A=[5,6,7], B=[8,9] (exit 0); --json carries it; a
    control the checks let through (here: a plain mask that is in fact the block mask) exits 1
    saying verify could not have caught a leak there."""
    out = pack_docs(tmp_path, [[5, 6, 7], [8, 9]], 5)
    r = CliRunner().invoke(cli, ["verify", str(out), "--backend", "sdpa", "--rows", "0",
                                 "--negative-control", "--no-progress"])
    assert r.exit_code == 0, r.output
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("CONTROL sdpa") and "caught as it must be" in line
    assert "row=0 segment=2" in line, line
    r = CliRunner().invoke(cli, ["verify", str(out), "--backend", "sdpa", "--rows", "0",
                                 "--negative-control", "--json"])
    assert r.exit_code == 0, r.output
    control = json.loads(r.stdout)["negative_control"]
    assert control["caught"] and control["where"]["segment"] == 2
    assert control["figures"]["max_abs_diff"] > 1e-3

    F = torch.nn.functional
    monkeypatch.setattr(F, "scaled_dot_product_attention", _sdpa_ignoring_is_causal(F))
    r = CliRunner().invoke(cli, ["verify", str(out), "--backend", "sdpa", "--rows", "0",
                                 "--negative-control", "--no-progress"])
    assert r.exit_code == 1
    assert "NOT caught" in r.output and "could not have caught a leak" in r.output


def test_the_negative_control_on_one_document_per_row_is_not_applicable(tmp_path):
    """No row holds two documents (documents of at least C / 2 tokens): the control had
    exited 1 telling to "verify more rows (--rows 0)", which --rows 0 already was and no row
    count could change. The CONTROL line now says it is not applicable, --json has
    applicable false, and the exit is the report's (0)."""
    out = pack_docs(tmp_path, [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]], 6)
    r = CliRunner().invoke(cli, ["verify", str(out), "--backend", "sdpa", "--rows", "0",
                                 "--row-window", "0", "--negative-control", "--no-progress"])
    assert r.exit_code == 0, r.output
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("CONTROL sdpa") and "not applicable" in line, line
    assert "--rows 0" not in r.output
    r = CliRunner().invoke(cli, ["verify", str(out), "--backend", "sdpa", "--rows", "0",
                                 "--negative-control", "--json"])
    assert r.exit_code == 0, r.output
    control = json.loads(r.stdout)["negative_control"]
    assert control["applicable"] is False and control["caught"] is False


def _sdpa_ignoring_is_causal(F):
    """SDPA that applies a given mask as usual, and for is_causal=True the block-diagonal
    causal mask of the one row of the test (documents of 3 and 2 tokens): a control that
    cannot fail."""
    real = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, is_causal=False, **kw):
        if not is_causal:
            return real(q, k, v, attn_mask=attn_mask, **kw)
        seg = torch.tensor([1, 1, 1, 2, 2])[: q.shape[-2]]
        pos = torch.arange(q.shape[-2])
        mask = (seg[:, None] == seg[None, :]) & (pos[:, None] >= pos[None, :])
        return real(q, k, v, attn_mask=mask, **kw)
    return sdpa


@pytest.mark.parametrize("seed, opts", [(0, []), (1, ["--rows", "2"]), (3, ["--no-scan"]),
                                        (2, ["--no-scan", "--rows", "3", "--row-window", "6"]),
                                        (3, ["--row-window", "4"])])
def test_the_negative_control_runs_on_the_rows_the_model_checks_ran(tmp_path, seed, opts):
    """--negative-control said it ran "on the same sampled rows" but sampled its own (as
    --no-scan does): 9 rows, 2 of them multi-document, against the main run's 8 multi-document
    rows. It runs on exactly the rows (and row windows) the model checks ran."""
    rng = np.random.default_rng(seed)  # rows of one 16-token document among packed ones
    docs = [list(map(int, rng.integers(1, 1000, n)))
            for n in rng.choice([16, 16, 16, 3, 5, 7], 60)]
    out = pack_docs(tmp_path, docs, 16, "--labels", "unshifted")
    r = CliRunner().invoke(cli, ["verify", str(out), "--backend", "sdpa", "--seed", str(seed),
                                 "--negative-control", "--json", *opts])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    control = rep["negative_control"]
    assert control["rows"] == rep["rows"], (control["rows"], rep["rows"])
    assert control["windows"] == rep["windows"]
    assert control["caught"], control
