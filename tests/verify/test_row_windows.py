"""Row windows (``verify --row-window``) with every CPU backend, the hybrid one included, and on
``--segment-multiple`` outputs: a window starts at a document's first token, so the convolution
and recurrence reset by ``seq_idx`` start where the per-document reference starts; its
``cu_seqlens_unpadded`` are the real lengths of its spans; the good output passes and a broken
one still fails, named by the row's own segment numbers."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packcheck import withhold_seq_idx  # noqa: E402
from packtool.verify.checks import _spans, row_windows, run_verify  # noqa: E402
from packtool.verify.report import PASS  # noqa: E402

from packed_helpers import edit_rows, pack_docs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RNG = np.random.default_rng(23)
# short documents of every remainder mod 4, a long one, rows of 48 tokens
DOCS = [list(map(int, RNG.integers(0, 131_000, n)))
        for n in [7, 5, 9, 3, 12, 4, 6, 8, 10, 5, 11, 6, 3, 9, 1, 30, 7, 4, 8, 5, 2]]
CW, WINDOW = 48, 16


def _failed(report, backend, check):
    return [r for r in report.results
            if r.backend == backend and r.check == check and r.status == "fail"]


def _items(out):
    from packtool.formats.packed import PackedOutput
    from packtool.loader import PackedDataset

    reader = PackedOutput.open(out)
    ds = PackedDataset(reader, labels=reader.labels.convention, structure="stored")
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("multiple", [1, 4])
def test_windows_of_a_padded_row_hold_the_real_lengths_of_their_spans(tmp_path, multiple):
    """Every window starts at a document's span (or, to reach the padding at the row's end,
    inside its last documents: that document then counts as the window's first), its spans cut
    by cu_seqlens_unpadded cover exactly the tokens of a document (segment id != 0) inside the
    window, the document lists name the documents whose spans overlap it, and a padded row has
    a window holding padding (the padding window at 30..46 of a row padded from 47 held none)."""
    extra = ["--segment-multiple", str(multiple)] if multiple > 1 else []
    out = pack_docs(tmp_path, DOCS, CW, *extra)
    items = _items(out)
    for it in items:
        whole = _spans(it)
        starts = [a for a, _ in whole]
        wins = row_windows(it, WINDOW)
        if (np.asarray(it["segment_ids"]) == 0).any():
            assert any((np.asarray(w["segment_ids"]) == 0).any() for w in wins), it["row"]
        for w in wins:
            a, b = w["window"]
            q0 = int(np.searchsorted(starts, a, side="right")) - 1  # the document holding a
            assert b - a == WINDOW and (a in starts or a > CW - 2 * WINDOW)
            cu = np.asarray(w["cu_seqlens"])
            assert cu[0] == 0 and cu[-1] == WINDOW and (np.diff(cu) > 0).all()
            if multiple > 1:
                assert len(w["cu_seqlens_unpadded"]) == len(cu)
                assert "source_ids" not in w
            seg = np.asarray(w["segment_ids"])
            got = np.zeros(WINDOW, dtype=bool)
            for s, e in _spans(w):
                assert e > s and (seg[s:e] != 0).all()
                got[s:e] = True
            assert np.array_equal(got, seg != 0), (it["row"], w["window"])
            firsts = [d for d, (s, _) in zip(it["doc_ids"], whole) if a <= s < b]
            assert list(w["doc_ids"]) == ([] if a in starts else [it["doc_ids"][q0]]) + firsts
            assert w["segment_base"] == q0


@pytest.mark.parametrize("multiple", [1, 4])
def test_hybrid_and_attention_backends_pass_on_windows_and_catch_a_withheld_seq_idx(
        tmp_path, monkeypatch, multiple):
    """sdpa, hybrid (and hf when transformers is there) pass every check on windows of 16 of
    48 tokens; with seq_idx withheld from the batches the hybrid mixers carry one document's
    state into the next inside a window: isolation fails at the row's segment 2 or later,
    while sdpa, which cannot see it, passes."""
    extra = ["--segment-multiple", str(multiple)] if multiple > 1 else []
    out = pack_docs(tmp_path, DOCS, CW, "--labels", "unshifted", *extra)
    backends = ["sdpa", "hybrid"]
    from packtool.verify import has_transformers

    if has_transformers():
        backends.append("hf")
    rep = run_verify(out, rows=0, backends=backends, row_window=WINDOW)
    assert rep.ok, rep.format_text()
    assert any(f"windows of {WINDOW} of their {CW} tokens" in n for n in rep.notes), rep.notes
    for b in backends:
        assert rep.get(b, "logits_match").figures["rows_multi_doc"] >= 1
        assert rep.get(b, "grad_zero_padding").status == "pass", rep.format_text()
    withhold_seq_idx(monkeypatch)
    rep = run_verify(out, rows=0, backends=["hybrid", "sdpa"], row_window=WINDOW)
    iso = _failed(rep, "hybrid", "isolation")
    assert iso and iso[0].where["segment"] >= 2, rep.format_text()
    assert "tokens" in iso[0].where  # the window's place in the row
    assert rep.get("sdpa", "isolation").status == "pass"


def test_padding_inside_a_span_made_a_target_fails_on_windows(tmp_path):
    """--segment-multiple 4: the padding after a document given a label is a loss the
    per-document reference does not have: the loss denominator fails on the window holding it,
    for the attention and the hybrid backends."""
    docs = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [16, 17]] * 3
    out = pack_docs(tmp_path, docs, 48, "--segment-multiple", "4", "--labels", "unshifted",
                    "--strategy", "ordered")

    def pad_target(rows):
        r = rows[0]
        j = r["cu_seqlens_unpadded"][1]  # first padding slot after document 1
        assert r["segment_ids"][j] == 0
        r["labels"][j] = r["input_ids"][j]
        r["num_targets"] += 1
        return rows

    edit_rows(out, pad_target)
    rep = run_verify(out, rows=0, backends=["sdpa", "hybrid"], row_window=16)
    assert rep.get("data", "labels").status == "fail", rep.format_text()
    for b in ("sdpa", "hybrid"):
        bad = _failed(rep, b, "loss_denominator")
        assert bad and bad[0].where["row"] == 0, rep.format_text()


# rows of 48 where a long document comes before the boundaries (packed in order)
LONG_FIRST = {1: [40, 6, 30, 18, 20, 20, 5], 4: [37, 5, 30, 14, 18, 18, 5]}


def _long_first(tmp_path, multiple, *extra):
    docs = [list(map(int, RNG.integers(0, 131_000, n))) for n in LONG_FIRST[multiple]]
    more = ["--segment-multiple", str(multiple)] if multiple > 1 else []
    return pack_docs(tmp_path, docs, CW, "--strategy", "ordered", *more, *extra)


@pytest.mark.parametrize("multiple", [1, 4])
def test_a_window_enters_a_long_document_to_hold_the_boundary_after_it(tmp_path, multiple):
    """When a long document comes before a row's boundaries, the window starts inside it
    (from a real token) rather than at its start, so it still holds a boundary; the part of it
    in the window is a document of its own: positions from 0, no target at its first token,
    its offset moved to the window's first token, its real length in cu_seqlens_unpadded."""
    out = _long_first(tmp_path, multiple, "--labels", "unshifted")
    mids = 0
    for it in _items(out):
        whole = _spans(it)
        starts = [s for s, _ in whole]
        for w in row_windows(it, WINDOW):
            a, _ = w["window"]
            spans = _spans(w)
            seg = np.asarray(w["segment_ids"])
            assert len(spans) >= 2 or (seg == 0).any(), (it["row"], w["window"])  # a boundary
            q0 = w["segment_base"]
            s0, e0 = whole[q0]
            assert s0 <= a < e0  # from a real token of the row's document q0 + 1
            first = spans[0]
            pos = np.asarray(w["position_ids"])
            assert pos[first[0]:first[1]].tolist() == list(range(first[1] - first[0]))
            assert first[1] - first[0] == min(e0, a + WINDOW) - a
            assert w["doc_offsets"][0] == it["doc_offsets"][q0] + (a - s0)
            if a > s0:
                mids += 1
                assert a not in starts and w["labels"][0] == -100
    assert mids >= 2


@pytest.mark.parametrize("multiple", [1, 4])
def test_windows_inside_a_document_pass_and_still_catch_leaks(tmp_path, monkeypatch, multiple):
    """Every backend passes on windows that start inside a long document, each window holding
    two documents; a mask without document boundaries and a batch without seq_idx fail."""
    out = _long_first(tmp_path, multiple)
    backends = ["sdpa", "hybrid"]
    from packtool.verify import has_transformers

    if has_transformers():
        backends.append("hf")
    rep = run_verify(out, rows=0, backends=backends, row_window=WINDOW)
    assert rep.ok, rep.format_text()
    for b in backends:
        figs = rep.get(b, "logits_match").figures
        assert figs["rows_multi_doc"] == figs["rows"] >= 3, figs
    F = torch.nn.functional
    plain = {"sdpa": lambda b, dev: (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True))}
    rep = run_verify(out, rows=0, backends=["sdpa"], row_window=WINDOW, attend_overrides=plain)
    assert _failed(rep, "sdpa", "isolation"), rep.format_text()
    withhold_seq_idx(monkeypatch)
    rep = run_verify(out, rows=0, backends=["hybrid"], row_window=WINDOW)
    assert _failed(rep, "hybrid", "isolation"), rep.format_text()


@pytest.mark.parametrize("window", [3, 5, 8, 16])
def test_a_window_holds_a_boundary_between_documents_whenever_the_row_has_one(tmp_path,
                                                                              window):
    """Rows of long documents then one short last document (then padding): the window holds
    the boundary into that last document (it started at it, holding only its boundary into
    the padding, and verify failed a good output, 'no row holds two documents'). Over rows of
    every shape, some window of each row with two documents holds a boundary between them."""
    rng = np.random.default_rng(window)
    C = 4 * window
    pairs = []  # in input order, next-fit: a row of one long document, one short, padding
    for _ in range(12):
        for n in (rng.integers(2 * window, 3 * window), rng.integers(1, window)):
            pairs.append(list(map(int, rng.integers(1, 1000, n))))
    mixed = [list(map(int, rng.integers(1, 1000, n))) for n in rng.integers(1, 3 * window, 60)]
    outs = [pack_docs(tmp_path, pairs, C, "--strategy", "ordered", name="pairs"),
            pack_docs(tmp_path, mixed, C, name="mixed")]
    checked = 0
    for out in outs:
        for it in _items(out):
            starts = [a for a, _ in _spans(it)]
            if len(starts) < 2:
                continue
            windows = [w["window"] for w in row_windows(it, window)]
            assert any(a < s < b for s in starts[1:] for a, b in windows), (starts, windows)
            checked += 1
    assert checked > 15


def test_verify_passes_a_row_whose_short_document_is_last(tmp_path):
    """[[11, 12, 13], [21, 22]] at C = 6, --row-window 3: a good output passes (it exited 1,
    isolation 'did not run')."""
    from packcheck import invoke

    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 6)
    res = invoke(["verify", "--backend", "sdpa", "--row-window", "3", out])
    assert res.exit_code == 0, res.output
    assert "PASS  sdpa[cpu]    isolation" in res.output, res.output


def test_windows_too_small_for_a_boundary_ask_for_a_larger_window(tmp_path):
    """--segment-multiple 2 and --row-window 2: no window of two tokens reaches from a real token
    across a span's padding into the next document; verify fails asking for a larger
    --row-window (it told the user to run another backend or --data-only), and passes with 4."""
    from packcheck import invoke

    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 6, "--segment-multiple", "2")
    res = invoke(["verify", "--backend", "sdpa", "--row-window", "2", out])
    assert res.exit_code == 1, res.output
    assert "pass a larger --row-window (0: whole rows)" in res.output.splitlines()[-1]
    assert "--data-only" not in res.output
    res = invoke(["verify", "--backend", "sdpa", "--row-window", "4", out])
    assert res.exit_code == 0, res.output


def _sft_output(tmp_path, capacity=64, docs=None):
    """SFT-style input: ``docs`` ``[(tokens, target positions)]`` (default: documents of 20..26
    tokens with targets only at tokens 3 and 4) in an input labels column, -100 elsewhere,
    packed in order into rows of ``capacity`` tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from packcheck import invoke

    rng = np.random.default_rng(0)
    if docs is None:
        docs = [(int(rng.integers(20, 27)), (3, 4)) for _ in range(12)]
    ids, labs = [], []
    for n, where in docs:
        t = rng.integers(1, 500, n).tolist()
        ids.append(t)
        labs.append([t[i] if i in where else -100 for i in range(n)])
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"input_ids": ids, "labels": labs}), src / "a.parquet")
    res = invoke(["pack", "-q", "--no-shuffle", "-c", str(capacity), str(src),
                  str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    return tmp_path / "out"


def test_grad_zero_padding_that_no_window_can_measure_is_not_a_failure(tmp_path):
    """Targets only near each document's start, 16 or more tokens before the padding: no window
    of 16 tokens holds both padding and a target, so grad_zero_padding cannot measure anything.
    verify failed a correct output ("check grad_zero_padding on backend sdpa did not run"); the
    skip is now not required, named with --check it fails saying which --row-window measures it,
    and with that window a window holding both is run and the check passes."""
    from packcheck import invoke

    out = _sft_output(tmp_path)
    res = invoke(["verify", "--backend", "sdpa", "--row-window", "16", str(out)])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if " grad_zero_padding " in ln)
    assert line.startswith("SKIP") and line.endswith("[not required]"), line
    assert "no window of --row-window 16 tokens holds both padding and a target" in line, line
    for name in ("loss_denominator", "grad_zero_ignored"):
        assert any(ln.startswith("PASS") and f" {name} " in ln
                   for ln in res.output.splitlines()), res.output
    res = invoke(["verify", "--backend", "sdpa", "--row-window", "16", "--check",
                  "grad_zero_padding", str(out)])
    assert res.exit_code == 1, res.output
    closest = int(res.output.split("pass --row-window ")[1].split()[0])
    assert 16 < closest < 64, res.output
    rep = run_verify(out, backends=["sdpa"], row_window=closest)
    pad = rep.get("sdpa", "grad_zero_padding")
    assert pad.status == PASS and rep.ok, rep.format_text()
    rep = run_verify(out, backends=["sdpa"], row_window=closest, scan_all=False)
    assert rep.ok, rep.format_text()


def test_a_row_whose_targets_no_window_reached_gets_a_window_holding_one(tmp_path):
    """A 5-token document without targets, then a 40-token one with targets only at its tokens
    30 and 31, C = 64, --row-window 8: the window across the boundary and the one into the
    padding held no target, so the loss checks measured nothing and the verdict failed on a
    correct output. A window holding a target is now run and they pass."""
    out = _sft_output(tmp_path, docs=[(5, ()), (40, (30, 31))])
    rep = run_verify(out, backends=["sdpa"], row_window=8)
    assert rep.ok, rep.format_text()
    den = rep.get("sdpa", "loss_denominator")
    assert den.status == PASS and den.figures["targets_packed"] >= 1, rep.format_text()
    assert rep.get("sdpa", "grad_zero_ignored").status == PASS, rep.format_text()
