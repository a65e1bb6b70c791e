"""Token masks carried through ``pack`` end to end: padding removed, SFT prompts kept out of the
targets, BOS/EOS added once, and ``compare`` modelling the same options.

The expected rows are derived independently: documents after masking are packed with
``--no-shuffle`` and each row is checked with the plain-Python contract checker, then the
labels at prompt positions are checked to be -100 and ``num_targets`` to count what is left.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import IGNORE, check_output, invoke, read_output

# an SFT set: prompt tokens carry label -100, response tokens their own id; padded to 6
IDS = [[11, 12, 13, 14, 0, 0], [21, 22, 23, 24, 25, 26], [31, 32, 0, 0, 0, 0]]
MASK = [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]]
LABELS = [[-100, -100, 13, 14, -100, -100], [-100, -100, -100, 24, 25, 26], [-100, 32, -100,
                                                                               -100, -100, -100]]
REAL = [[11, 12, 13, 14], [21, 22, 23, 24, 25, 26], [31, 32]]
PROMPT = [{11, 12}, {21, 22, 23}, {31}]  # tokens that must never be targets


def _write(path, **cols):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({k: pa.array(v, pa.list_(pa.int32())) for k, v in cols.items()}),
                   path)
    return path


def _pack(src, out, *extra, capacity=8):
    res = invoke(["pack", "--no-shuffle", "--capacity", capacity, *extra, src, out])
    assert res.exit_code == 0, res.output
    return res.output, *read_output(out)


def test_attention_mask_zeros_are_removed_before_packing(tmp_path):
    src = _write(tmp_path / "in" / "a.parquet", input_ids=IDS, attention_mask=MASK)
    text, rows, manifest = _pack(src, tmp_path / "out")
    check_output(rows, REAL, 8, labels="none")
    assert manifest.totals.tokens_attention_masked == 6
    assert manifest.totals.tokens_in == 12
    assert "attention mask removed 6 tokens" in text


def test_attention_mask_column_none_keeps_every_token(tmp_path):
    src = _write(tmp_path / "in" / "a.parquet", input_ids=IDS, attention_mask=MASK)
    _, rows, manifest = _pack(src, tmp_path / "out", "--attention-mask-column", "none")
    check_output(rows, IDS, 8, labels="none")
    assert manifest.totals.tokens_attention_masked == 0


@pytest.mark.parametrize("labels,window", [(None, None), ("unshifted", None), ("shifted", None),
                                           (None, 2)])
def test_sft_prompt_labels_stay_ignored_after_packing(tmp_path, labels, window):
    """Prompt positions are -100 in the stored labels; num_targets counts only the responses
    (one plan, or windows of two documents)."""
    src = _write(tmp_path / "in" / "a.parquet", input_ids=IDS, attention_mask=MASK,
                 labels=LABELS)
    extra = () if labels is None else ("--labels", labels)
    if window:
        extra += ("--window-docs", window)
    _, rows, manifest = _pack(src, tmp_path / "out", *extra)
    mode = labels or "unshifted"
    assert all("labels" in r for r in rows), "labels carry real information: always stored"
    targets = 0
    for r in rows:
        ids, seg, lab = r["input_ids"], r["segment_ids"], r["labels"]
        for i, tok in enumerate(ids):
            if not seg[i]:
                assert lab[i] == IGNORE
                continue
            # the token this position is trained to predict, if any
            nxt = i + 1 < len(ids) and seg[i + 1] == seg[i]
            tgt = tok if mode == "unshifted" else (ids[i + 1] if nxt else None)
            first = i == 0 or seg[i - 1] != seg[i]
            if mode == "unshifted" and first:
                tgt = None
            doc = r["doc_ids"][seg[i] - 1]
            if tgt is None or tgt in PROMPT[doc]:
                assert lab[i] == IGNORE, (r, i)
            else:
                assert lab[i] == tgt, (r, i)
                targets += 1
        assert r["num_targets"] == sum(x != IGNORE for x in lab)
    # responses: 13,14 | 24,25,26 | 32
    assert targets == 6
    assert manifest.totals.effective_targets == 6
    assert manifest.totals.tokens_label_masked == 6
    res = invoke(["stats", str(tmp_path / "out"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["stats"]["effective_targets"] == 6


def test_row_groups_count_the_labels_an_input_labels_column_stores(tmp_path):
    """--row-group-mb budgets every stored per-token column: labels stored because the input
    has a labels column count as with --labels unshifted (the groups were a third too large:
    sized for three columns)."""
    from packtool.config import rows_per_group_for

    src = _write(tmp_path / "in" / "a.parquet", input_ids=IDS, labels=LABELS)
    got = {}
    for name, extra in (("auto", ()), ("flag", ("--labels", "unshifted"))):
        _, _, m = _pack(src, tmp_path / name, "--row-group-mb", "0.0003", *extra, capacity=8)
        assert m.labels.stored
        got[name] = m.options["rows_per_group"]
    assert got["auto"] == got["flag"] == rows_per_group_for(0.0003, 8, 4) == 2


def test_sft_split_document_keeps_prompt_masked_in_every_piece(tmp_path):
    ids = [list(range(100, 120))]
    labels = [[-100] * 12 + list(range(112, 120))]
    src = _write(tmp_path / "in" / "a.parquet", input_ids=ids, labels=labels)
    _, rows, manifest = _pack(src, tmp_path / "out", capacity=8)
    got = [x for r in rows for x in r["labels"] if x != IGNORE]
    # 112..119 are targets, except 112 and 116... no: only a segment's first token is lost
    firsts = {r["input_ids"][0] for r in rows}
    assert got == [t for t in range(112, 120) if t not in firsts]
    assert manifest.totals.effective_targets == len(got)


def test_eos_is_not_doubled_and_counted(tmp_path):
    src = _write(tmp_path / "in" / "a.parquet", input_ids=[[5, 6, 2], [7, 8], [9, 2]])
    text, rows, manifest = _pack(src, tmp_path / "out", "--append-eos", 2)
    check_output(rows, [[5, 6, 2], [7, 8, 2], [9, 2]], 8, labels="none")
    t = manifest.totals.to_dict()
    assert (t["docs_eos_added"], t["docs_eos_present"]) == (1, 2)
    assert "EOS added to 1 document (2 had it already)" in text


def test_bos_is_prepended_once(tmp_path):
    src = _write(tmp_path / "in" / "a.parquet", input_ids=[[1, 6], [7, 8], [1]])
    _, rows, manifest = _pack(src, tmp_path / "out", "--prepend-bos", 1, "--append-eos", 2)
    check_output(rows, [[1, 6, 2], [1, 7, 8, 2], [1, 2]], 8, labels="none")
    t = manifest.totals.to_dict()
    assert (t["docs_bos_added"], t["docs_bos_present"]) == (1, 2)


def test_compare_models_the_same_options_as_pack(tmp_path):
    """The dry run's obfd row equals the real pack's rows, padding and effective targets."""
    ids = [[i + 1] * (2 + i % 7) + [2] * (i % 2) for i in range(40)]
    mask = [[1] * (len(d) - 1) + [int(i % 3 != 0)] for i, d in enumerate(ids)]
    labels = [[-100] * min(2, len(d)) + d[2:] for d in ids]
    src = _write(tmp_path / "in" / "a.parquet", input_ids=ids, attention_mask=mask,
                 labels=labels)
    opts = ["--append-eos", 2, "--prepend-bos", 1]
    res = invoke(["compare", src, "--capacity", 16, "--json", *opts])
    assert res.exit_code == 0, res.output
    dry = {r["strategy"]: r for r in json.loads(res.output)["strategies"]}["obfd"]
    _, _, manifest = _pack(src, tmp_path / "out", *opts, capacity=16)
    t = manifest.totals.to_dict()
    assert (dry["rows"], dry["padding_tokens"], dry["effective_targets"]) == (
        t["rows"], t["padding_tokens"], t["effective_targets"])
    assert dry["effective_targets"] < t["real_tokens"] - t["segments"]  # the masks count


@pytest.mark.parametrize("labels", ["unshifted", "shifted"])
def test_verify_passes_on_sft_pack_and_counts_the_masked_targets(tmp_path, labels):
    """num_targets, the stored labels and verify's per-document loss agree on prompt masks."""
    pytest.importorskip("torch")
    ids = [[(7 * i + j) % 50 + 3 for j in range(5 + i % 9)] for i in range(24)]
    lab = [[-100] * (len(d) // 2) + d[len(d) // 2:] for d in ids]
    src = _write(tmp_path / "in" / "a.parquet", input_ids=ids, labels=lab)
    out = tmp_path / "out"
    _pack(src, out, "--labels", labels, capacity=16)
    res = invoke(["verify", out, "--backend", "sdpa", "--rows", 4, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    checks = {(c["backend"], c["check"]): c for c in report["results"]}
    assert checks[("data", "num_targets")]["status"] == "pass"
    assert checks[("data", "labels")]["status"] == "pass"
    den = checks[("sdpa", "loss_denominator")]
    assert den["status"] == "pass"
    assert den["figures"]["targets_packed"] == den["figures"]["targets_per_doc"]


def test_verify_still_fails_a_label_that_targets_a_prompt_free_position_wrongly(tmp_path):
    """Masked mode allows extra -100 only; a wrong token label still fails."""
    from packtool.verify.checks import check_row_contract

    row = {"input_ids": [5, 6, 7, 0], "segment_ids": [1, 1, 1, 0], "position_ids": [0, 1, 2, 0],
           "cu_seqlens": [0, 3, 4], "max_seqlen": 3, "doc_ids": [0],
           "labels": [-100, -100, 7, -100], "num_targets": 1}
    assert check_row_contract(row, "unshifted", label_masked=True) == []
    assert [c for c, _, _ in check_row_contract(row, "unshifted")] == ["labels", "num_targets"]
    row["labels"] = [-100, 9, 7, -100]
    row["num_targets"] = 2
    assert [c for c, _, _ in check_row_contract(row, "unshifted", label_masked=True)] == [
        "labels"]


@pytest.mark.parametrize("window", [None, 2])
def test_file_without_labels_next_to_sft_file_keeps_all_its_targets(tmp_path, window):
    """Flags are 1 for documents of a file without a labels column, whatever window they share."""
    _write(tmp_path / "in" / "a.parquet", input_ids=[[1, 2, 3], [4, 5]])
    _write(tmp_path / "in" / "b.parquet", input_ids=[[6, 7, 8, 9]], labels=[[-100, -100, 8, 9]])
    extra = () if window is None else ("--window-docs", window)
    _, rows, manifest = _pack(tmp_path / "in", tmp_path / "out", *extra)
    got = sorted(x for r in rows for x in r["labels"] if x != IGNORE)
    assert got == [2, 3, 5, 8, 9]
    assert manifest.totals.effective_targets == 5


@pytest.mark.parametrize("case", ["labels", "loss-mask", "one-token", "holdout"])
def test_an_output_without_effective_targets_warns_in_pack_stats_and_compare(tmp_path, case):
    """Every label -100 (input labels, loss masks, or one-token segments) leaves a token-mean
    loss a denominator of 0: pack, stats and compare each print one WARNING naming why, and
    --json lists it; an output with targets prints none."""
    ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    cols = {"input_ids": ids}
    extra, why = [], "every token read has input label -100 or loss mask 0"
    if case in ("labels", "holdout"):
        cols["labels"] = [[-100] * len(d) for d in ids]
    elif case == "loss-mask":
        cols["completion_mask"] = [[0] * len(d) for d in ids]
    else:
        cols = {"input_ids": [[d] for d in range(1, 9)]}
        why = "every segment holds one token"
    if case == "holdout":
        cols = {k: v * 4 for k, v in cols.items()}
        extra = ["--holdout", 0.3, "--holdout-output", tmp_path / "held"]
    src = _write(tmp_path / "in" / "a.parquet", **cols)
    res = invoke(["pack", "--capacity", 8, *extra, src, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    warned = [w for w in res.stderr.splitlines() if w.startswith("WARNING")]
    assert len(warned) == (2 if case == "holdout" else 1), res.stderr
    assert all("no effective targets" in w and why in w for w in warned), warned
    if case == "holdout":
        assert "held-out pack" in warned[1]
    for args in (["stats", tmp_path / "out"], ["compare", "-c", 8, src]):
        res = invoke(args)
        assert res.exit_code == 0, res.output
        warned = [w for w in res.stderr.splitlines() if w.startswith("WARNING")]
        assert len(warned) == 1 and "no effective targets" in warned[0] and why in warned[0]
        res = invoke([*args[:1], "--json", *args[1:]])
        assert "no effective targets" in json.loads(res.stdout)["warnings"][0]
    # the same documents with targets: no warning anywhere
    plain = _write(tmp_path / "plain" / "a.parquet", input_ids=ids)
    for args in (["pack", "-c", 8, plain, tmp_path / "o2"], ["stats", tmp_path / "o2"],
                 ["compare", "-c", 8, plain]):
        res = invoke(args)
        assert res.exit_code == 0 and "WARNING" not in res.stderr, res.output


#: padding at a row's ends: right, left, both, none, all of it (an empty document)
ENDS_IDS = [[11, 12, 13, 0, 0], [0, 0, 21, 22, 23], [0, 31, 32, 0], [41, 42], [0, 0]]
ENDS_MASK = [[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 1, 1, 0], [1, 1], [0, 0]]


def test_padding_at_either_end_of_a_row_is_removed(tmp_path):
    """Left padding, right padding and both are padding; a row of it alone is skipped."""
    src = _write(tmp_path / "in" / "a.parquet", input_ids=ENDS_IDS, attention_mask=ENDS_MASK)
    text, rows, manifest = _pack(src, tmp_path / "out")
    check_output(rows, [[11, 12, 13], [21, 22, 23], [31, 32], [41, 42], []], 8, labels="none")
    assert manifest.totals.tokens_attention_masked == 8
    assert "attention mask removed 8 tokens" in text


@pytest.mark.parametrize("mask,span", [([1, 1, 1, 1, 0, 0, 1, 1, 1, 1], "tokens 4..5"),
                                       ([0, 1, 0, 1, 1, 1, 1, 1, 1, 0], "token 2"),
                                       ([1, 0, 0, 0, 0, 0, 0, 0, 0, 1], "tokens 1..8")])
@pytest.mark.parametrize("command", ["pack", "compare", "stats --compare"])
def test_attention_mask_zeros_between_ones_are_refused_naming_the_row(tmp_path, mask, span,
                                                                       command):
    """Zeros between ones are not padding (padding sits at a row's ends): typically two padded
    examples laid end to end in one row. Removing them joined the examples into one document
    (the first one's last token trained to predict the next one's first, each attending to
    the other); the row is refused in one line naming the file, the row and the tokens, by
    pack and by the dry runs alike, and nothing is written."""
    ids = [101, 5, 6, 102, 0, 0, 101, 7, 8, 102]
    src = _write(tmp_path / "in" / "a.parquet", input_ids=ENDS_IDS + [ids],
                 attention_mask=ENDS_MASK + [mask])
    out = tmp_path / "out"
    args = {"pack": ["pack", "-q", "--capacity", 16, src, out],
            "compare": ["compare", src, "--capacity", 16],
            "stats --compare": ["stats", src, "--capacity", 16, "--compare"]}[command]
    res = invoke(args)
    assert res.exit_code == 1, res.output
    err = [line for line in res.stderr.splitlines() if line.startswith("Error")]
    assert len(err) == 1 and err[0] == res.stderr.splitlines()[-1], res.stderr
    assert f"a.parquet: row 5 (0-based): 'attention_mask' is 0 on {span} (0-based)" in err[0]
    assert "between tokens it marks 1" in err[0]
    assert "split the examples into one row each" in err[0]
    assert "--attention-mask-column none and remove the tokens yourself" in err[0]
    assert not out.exists()
    # the documented way out: the mask not read, every token packed as the row holds it
    _, rows, _ = _pack(src, out, "--attention-mask-column", "none", capacity=16)
    check_output(rows, ENDS_IDS + [ids], 16, labels="none")
