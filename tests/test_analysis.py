"""packtool stats: figures recounted from shards agree with an independent count and the manifest."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "verify"))
from packed_helpers import edit_rows, pack_docs  # noqa: E402

from packtool.analysis import analyze_packed, compare_strategies, input_lengths  # noqa: E402
from packtool.cli import cli  # noqa: E402
from packtool.formats.manifest import read_manifest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_b21_targets_are_sum_len_minus_one(tmp_path):
    """docs [[11,12,13],[21,22]] at C=8: 1 row, 5 real, 3 padding (0.375), 3 targets."""
    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22]], 8)
    s = analyze_packed(out).stats
    assert (s.rows, s.real_tokens, s.padding_tokens, s.effective_targets) == (1, 5, 3, 3)
    assert s.padding_fraction == 0.375


def test_b19_b20_per_bin_targets(tmp_path):
    """B19: one row A(4)+B(2) has segment targets [3,1]; B20: two bins give targets [3,1], 4."""
    one = analyze_packed(pack_docs(tmp_path, [[1, 2, 3, 4], [5, 6]], 6, name="one"),
                         per_bin=True)
    assert [b["segment_targets"] for b in one.per_bin] == [[3, 1]]
    two = analyze_packed(pack_docs(tmp_path, [[1, 2, 3, 4], [5, 6]], 4, name="two"),
                         per_bin=True)
    assert [b["targets"] for b in two.per_bin] == [3, 1]
    assert two.to_dict()["targets_total"] == 4
    # the token mean over the step is 16/4, not the mean of per-bin means (2 + 10) / 2
    losses = {0: [1.0, 2.0, 3.0], 1: [10.0]}
    total = sum(sum(v) for v in losses.values()) / two.to_dict()["targets_total"]
    assert total == 4.0


def test_b15_stats_after_last_row_removed(tmp_path):
    """Deleting the last row: stats report 2 rows, 8 tokens, no padding, fill 1.0 and flag it."""
    out = pack_docs(tmp_path, [[1, 1, 1, 1], [2, 2, 2, 2], [3]], 4)
    edit_rows(out, lambda rows: rows[:2])
    a = analyze_packed(out)
    s = a.stats
    assert (s.rows, s.real_tokens, s.padding_tokens, s.fill) == (2, 8, 0, 1.0)
    assert a.mismatches["rows"] == (2, 3)
    r = CliRunner().invoke(cli, ["stats", str(out)])
    assert r.exit_code == 1 and "rows" in r.output
    edit_rows(out, lambda rows: [])
    s = analyze_packed(out).stats
    assert (s.rows, s.real_tokens, s.padding_tokens, s.fill) == (0, 0, 0, 0.0)


def test_stats_equal_independent_recount_and_manifest(tmp_path):
    """On sample_data at C=512, every recounted figure equals a plain pyarrow count."""
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["pack", "-c", "512", "-q", "--rows-per-shard", "2000", "--labels", "unshifted",
                                 str(ROOT / "sample_data"), str(out)])
    assert r.exit_code == 0, r.output
    a = analyze_packed(out)
    assert a.mismatches == {}
    rows = [row for f in sorted(out.glob("part-*.parquet")) for row in
            pq.read_table(f).to_pylist()]
    seg_lens = [np.diff(r["cu_seqlens"])[:len(r["doc_ids"])] for r in rows]
    assert a.stats.rows == len(rows)
    assert a.stats.real_tokens == sum(sum(1 for s in r["segment_ids"] if s) for r in rows)
    assert a.stats.effective_targets == sum(sum(1 for x in r["labels"] if x != -100)
                                            for r in rows)
    assert a.stats.effective_targets == sum(int((l - 1).sum()) for l in seg_lens)
    assert a.stats.attention_work == sum(int((l * l).sum()) for l in seg_lens)
    m = read_manifest(out).totals
    for k in ("rows", "real_tokens", "padding_tokens", "effective_targets", "segments"):
        assert getattr(a.stats, k) == getattr(m, k), k


def test_compare_on_sample_data_concat_cuts_obfd_does_not():
    """The article's comparison on real data: concat cuts documents that fit; obfd cuts none."""
    lengths = input_lengths([ROOT / "sample_data"])
    res = {r["strategy"]: r for r in compare_strategies(lengths, 2048)}
    assert res["concat"]["docs_cut_below_capacity"] > 0
    assert res["obfd"]["docs_cut_below_capacity"] == 0
    assert res["ordered"]["docs_cut_below_capacity"] == 0
    assert res["obfd"]["extra_rows"] <= 5
    assert res["obfd"]["rows"] < res["ordered"]["rows"]
    real = int(lengths.sum())
    for r in res.values():
        assert r["effective_targets"] == real - r["segments"]


def test_cli_compare_json_and_plot(tmp_path):
    """compare --json lists the three strategies; --plot writes a PNG; the deprecated
    ``stats --compare`` prints the same, with a note on stderr."""
    png = tmp_path / "f.png"
    r = CliRunner().invoke(cli, ["compare", str(ROOT / "sample_data"), "--capacity", "2048",
                                 "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert [s["strategy"] for s in json.loads(r.stdout)["strategies"]] == \
        ["concat", "ordered", "obfd"]
    assert png.stat().st_size > 1000
    old = CliRunner().invoke(cli, ["stats", str(ROOT / "sample_data"), "--capacity", "2048",
                                   "--compare", "--json"])
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout) == json.loads(r.stdout)
    assert "deprecated" in old.stderr and "packtool compare" in old.stderr
    r = CliRunner().invoke(cli, ["compare", str(ROOT / "sample_data")])
    assert r.exit_code == 2


def test_stats_messages_point_to_the_right_use(tmp_path, sample_data):
    """stats on raw input points to compare; compare on a packed output points to stats;
    --capacity on a packed output is refused naming compare; --plot into a missing directory is
    one line, exit 2, before any work."""
    from click.testing import CliRunner

    from packtool.cli import cli

    def run(*args):
        return CliRunner().invoke(cli, ["stats", *map(str, args)])

    res = run(sample_data)
    assert res.exit_code == 1 and f"packtool compare {sample_data}" in res.output
    out = tmp_path / "packed"
    assert CliRunner().invoke(cli, ["pack", "-q", str(sample_data), str(out)]).exit_code == 0
    res = CliRunner().invoke(cli, ["compare", str(out), "--capacity", "1000"])
    assert res.exit_code == 1 and "is a packed output" in res.output
    res = run(out, "--capacity", 1000)
    assert res.exit_code == 2 and "packtool compare" in res.output
    res = run(out, "--plot", tmp_path / "no" / "such" / "dir" / "x.png")
    assert res.exit_code == 2 and "does not exist" in res.output
    assert "Traceback" not in res.output


def test_fill_quantiles_from_counts_equal_numpy_quantiles():
    """The recount keeps counts over 0..C, not one value per row; its quantiles are exact."""
    from packtool.analysis import _count_quantiles, _quantiles

    rng = np.random.default_rng(6)
    for C in (1, 7, 2048):
        counts = rng.integers(0, 5, C + 1) * (rng.random(C + 1) < 0.3)
        values = np.repeat(np.arange(C + 1) / C, counts)
        got, want = _count_quantiles(counts), _quantiles(values)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], abs=1e-12), (C, k)


def test_recount_documents_and_cut_documents_match_an_independent_count(tmp_path):
    """documents = distinct doc_ids, docs_cut = doc_ids in more than one segment (split and
    concat cuts), from the structural columns alone."""
    docs = [[1] * 9, [2] * 3, [3] * 5, [4] * 2, [5] * 11, [6]]
    for strategy in ("obfd", "concat"):
        out = pack_docs(tmp_path, docs, 4, "--strategy", strategy, name=strategy)
        a = analyze_packed(out)
        rows = [r for f in sorted(out.glob("part-*.parquet")) for r in pq.read_table(f).to_pylist()]
        ids = [d for r in rows for d in r["doc_ids"]]
        assert a.documents == len(set(ids)) == len(docs)
        assert a.stats.docs_cut == sum(1 for d in set(ids) if ids.count(d) > 1)
        assert a.mismatches == {}


def test_recount_flags_a_num_targets_column_that_disagrees_with_the_segments(tmp_path):
    """A row whose num_targets is not sum(len - 1) is reported, not hidden."""
    out = pack_docs(tmp_path, [[1, 2, 3], [4, 5]], 8)

    def edit(rows):
        rows[0]["num_targets"] += 1
        return rows

    edit_rows(out, edit)
    assert analyze_packed(out).mismatches["num_targets_rows_wrong"] == (1, 0)


def test_stats_names_the_first_shard_and_row_whose_num_targets_is_wrong(tmp_path):
    """``MISMATCH num_targets_rows_wrong: recounted 1, manifest 0`` named no row: the text,
    the JSON and the error now name how many rows, the first shard and row, and what it holds
    against what its segments give."""
    from packtool.analysis import format_packed

    out = pack_docs(tmp_path, [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16]], 8)

    def edit(rows):
        assert len(rows) >= 3
        rows[1]["num_targets"] -= 1
        rows[2]["num_targets"] += 2
        return rows

    edit_rows(out, edit)
    a = analyze_packed(out)
    assert a.mismatches["num_targets_rows_wrong"] == (2, 0)
    where = a.mismatch_where["num_targets_rows_wrong"]
    assert "part-00000.parquet row 1:" in where and "row 2" not in where
    line = next(ln for ln in format_packed(a).splitlines() if "num_targets_rows_wrong" in ln)
    assert "recounted 2" in line and "part-00000.parquet row 1: num_targets" in line
    assert a.to_dict()["mismatches"]["num_targets_rows_wrong"]["where"] == where
    run = CliRunner().invoke(cli, ["stats", str(out)])
    assert run.exit_code == 1 and "part-00000.parquet row 1" in run.output, run.output


def test_compare_shows_the_windowed_cost_that_pack_then_has(tmp_path):
    """``compare --window-docs N`` (and the deprecated ``stats --compare --window-docs N``)
    dry-runs the windows as ``pack --window-docs N`` deals them: the same rows, padding and
    segments as the pack (a windowing row beside the strategies, not competing with them).
    It windowed obfd alone, though ``pack --strategy concat --window-docs N`` (and ordered)
    writes other rows than the same pack without windows: each strategy has its windowed row."""
    from packtool.config import PackConfig
    from packtool.pipeline import run_pack

    r = CliRunner().invoke(cli, ["compare", str(ROOT / "sample_data"), "--capacity", "512",
                                 "--json", "--window-docs", "100"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["strategies"]
    old = CliRunner().invoke(cli, ["stats", str(ROOT / "sample_data"), "--capacity", "512",
                                   "--compare", "--json", "--window-docs", "100"])
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout)["strategies"] == rows
    assert [s["strategy"] for s in rows] == ["concat", "ordered", "obfd",
                                             "concat, windows of 100",
                                             "ordered, windows of 100",
                                             "obfd, windows of 100"]
    for i, strategy in enumerate(("concat", "ordered", "obfd")):
        win = rows[3 + i]
        assert win["window_docs"] == 100 and win["windows"] == 9
        res = run_pack(PackConfig(inputs=(str(ROOT / "sample_data"),),
                                  output=str(tmp_path / f"o_{strategy}"), capacity=512,
                                  strategy=strategy, window_docs=100), progress=False)
        s = res.stats
        assert (win["rows"], win["padding_tokens"], win["segments"], win["extra_rows"]) == \
            (s.rows, s.padding_tokens, s.segments, s.extra_rows), strategy
    assert rows[5]["rows"] >= rows[2]["rows"]
    # windows change concat's rows: the unwindowed row is not what the windowed pack writes
    assert rows[3]["rows"] != rows[0]["rows"]
    r = CliRunner().invoke(cli, ["stats", str(tmp_path / "o_obfd"), "--window-docs", "100"])
    assert r.exit_code == 2 and "--window-docs is an option of the dry run" in r.output
    # not compare of the packed output, which compare refuses: of the INPUT it was packed from
    assert "packtool compare INPUT --capacity C --window-docs 100 on the tokenized INPUT it was " \
        "packed from" in \
        r.output and str(tmp_path / "o_obfd") not in r.output.split("run:")[-1]


#: figures of a compare dict that are PackStats figures of the pack with the same options
_PACK_FIGURES = ("rows", "lower_bound_rows", "extra_rows", "padding_tokens", "segments",
                 "docs_split", "docs_truncated", "tokens_truncated", "docs_dropped",
                 "tokens_dropped", "effective_targets", "attention_work", "rows_dropped",
                 "tokens_under_min_fill", "segment_padding_tokens",
                 "rows_without_segment_padding")


def _compare_json(*args):
    r = CliRunner().invoke(cli, ["compare", "--json", *map(str, args)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _assert_compare_predicts_pack(got, src, out, capacity, overflow, min_fill, window_docs,
                                  strategies, segment_multiple=1):
    """Each named compare row equals the manifest totals and warnings of the real pack."""
    from packtool.config import PackConfig
    from packtool.pipeline import run_pack

    rows = {r["strategy"]: r for r in got["strategies"]}
    for strategy in strategies:  # "concat", ..., or "concat windows", ... ("windows": obfd's)
        base, windowed = (strategy.split()[0] if strategy != "windows" else "obfd",
                          strategy.endswith("windows"))
        row = rows[f"{base}, windows of {window_docs:,}" if windowed else base]
        res = run_pack(PackConfig(inputs=(str(src),), output=str(out / strategy),
                                  capacity=capacity, overflow=overflow, min_fill=min_fill,
                                  strategy=base, window_docs=window_docs if windowed else None,
                                  segment_multiple=segment_multiple),
                       progress=False)
        t = read_manifest(out / strategy).totals
        keys = _PACK_FIGURES
        case = (strategy, overflow, min_fill, segment_multiple)
        assert {k: row[k] for k in keys} == {k: getattr(t, k) for k in keys}, case
        assert row["warnings"] == res.warnings, case  # in the pack's words
        for w in res.warnings:  # printed once, naming the strategies whose pack says it
            # when not every one's does
            whose = [x["strategy"] for x in got["strategies"] if w in x["warnings"]]
            want = w if len(whose) == len(got["strategies"]) else f"{'; '.join(whose)}: {w}"
            assert row["strategy"] in whose and got["warnings"].count(want) == 1, case
        # the header's bound counts the tokens --overflow keeps (before --min-fill)
        kept = t.tokens_in - t.tokens_dropped + t.tokens_under_min_fill
        assert (got["tokens"], got["tokens_kept"]) == (t.tokens_in, kept), case
        assert got["lower_bound_rows"] == -(-kept // capacity), case
        if not min_fill:
            assert got["lower_bound_rows"] == t.lower_bound_rows, case
        # documents cut, recounted from the rows written: a document written in pieces (in
        # several segments, or one not holding all it would hold uncut), whatever the strategy
        # and whichever rows --min-fill left out
        assert (row["docs_cut"], row["docs_cut_below_capacity"]) == \
            _cut_in_output(src, out / strategy, capacity, overflow), case


def _cut_in_output(src, out, capacity, overflow) -> tuple:
    """(documents written cut, of them those of <= C tokens) in the packed OUTPUT ``out`` of
    the Parquet INPUT ``src``, counted with pyarrow: a document is cut when its segments are
    several or hold fewer tokens than it has (at most C after --overflow truncate)."""
    files = sorted(Path(src).rglob("*.parquet")) if Path(src).is_dir() else [Path(src)]
    lengths = [len(d) for f in files for d in pq.read_table(f, columns=["input_ids"])
               .column("input_ids").to_pylist()]
    pieces, tokens = {}, {}
    for f in sorted(Path(out).glob("part-*.parquet")):
        # the real ends (--segment-multiple pads each span: cu_seqlens holds the padded ones)
        cu = ("cu_seqlens_unpadded" if "cu_seqlens_unpadded" in pq.read_schema(f).names
              else "cu_seqlens")
        for r in pq.read_table(f, columns=["doc_ids", cu]).to_pylist():
            for d, n in zip(r["doc_ids"], np.diff(r[cu])):
                pieces[d] = pieces.get(d, 0) + 1
                tokens[d] = tokens.get(d, 0) + int(n)
    whole = {d: min(lengths[d], capacity) if overflow == "truncate" else lengths[d]
             for d in pieces}
    cut = [d for d in pieces if pieces[d] > 1 or tokens[d] < whole[d]]
    return len(cut), sum(1 for d in cut if lengths[d] <= capacity or overflow == "truncate")


def test_compare_counts_a_document_cut_by_concat_whose_tail_row_min_fill_left_out(tmp_path):
    """Documents of 50 and 60 tokens at C = 64, --min-fill 0.99: concat writes 14 tokens of
    the second in row 1 and leaves out its 46-token tail row. compare showed it not cut (its
    kept piece is one segment) and named concat least waste with "no document that fits in a
    row cut"; it is cut, as the rows pack writes with the same options show, and the verdict
    says so."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in.parquet", [list(range(1, 51)), list(range(1, 61))])
    got = _compare_json(src, "-c", 64, "--min-fill", 0.99)
    concat = got["strategies"][0]
    assert concat["strategy"] == "concat" and concat["rows_dropped"] == 1
    assert (concat["docs_cut"], concat["docs_cut_below_capacity"]) == (1, 1)
    _assert_compare_predicts_pack(got, src, tmp_path / "o", 64, "split", 0.99, None,
                                  ("concat", "ordered", "obfd"))
    text = CliRunner().invoke(cli, ["compare", "-c", "64", "--min-fill", "0.99", str(src)])
    assert text.exit_code == 0, text.output
    verdict = [ln for ln in text.stdout.splitlines() if ln.startswith("least waste")]
    assert verdict == ["least waste: concat (0 padding tokens, 46 tokens dropped, 1 document "
                       "that fits in a row cut)"]


def test_compare_predicts_the_pack_for_every_overflow_mode_and_min_fill(tmp_path):
    """``compare`` with --overflow split|truncate|drop, with and without --min-fill F, and
    --window-docs: every strategy's rows, padding, bound, truncated and dropped documents and
    tokens, targets and warnings equal the manifest and warnings of ``pack`` with the same
    options (sample_data, and random inputs of two files with empty and long documents); a
    row dropped by --min-fill counts its tokens in ``tokens_dropped`` in both, as pack does.
    The text shows the lost tokens beside the padding, and least waste counts them."""
    got = _compare_json(ROOT / "sample_data", "--capacity", 512, "--window-docs", 100,
                        "--min-fill", 1)
    assert all(x["rows_dropped"] > 0 for x in got["strategies"])
    _assert_compare_predicts_pack(got, ROOT / "sample_data", tmp_path / "s", 512, "split", 1.0,
                                  100, ("obfd", "windows"))
    assert any(w.startswith("obfd: --min-fill") for w in got["warnings"])
    text = CliRunner().invoke(cli, ["compare", str(ROOT / "sample_data"), "--capacity", "512",
                                    "--min-fill", "1"]).output
    assert "rows dropped" in text and "tokens dropped" in text
    plain = compare_strategies(np.array([5, 300, 700, 20]), 512)
    assert all(x["rows_dropped"] == x["tokens_under_min_fill"] == 0 for x in plain)

    from conftest import write_docs

    C, wd, case = 16, 7, 0
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        lengths = rng.choice([0, 3, 9, 15, 16, 17, 40], size=33) * (rng.random(33) < 0.9)
        src = tmp_path / f"in{seed}"
        for f, part in enumerate((lengths[:20], lengths[20:])):
            write_docs(src / f"{f}.parquet", [list(range(1, n + 1)) for n in part])
        for overflow in ("split", "truncate", "drop"):
            for min_fill in (0.0, 0.75):
                got = _compare_json(src, "-c", C, "--overflow", overflow, "--min-fill",
                                    min_fill, "--window-docs", wd)
                # every strategy once per input and mode, with its windowed plan, and obfd's
                # windowed plan every time
                base = ("concat", "ordered", "obfd")[case % 3]
                strategies = (base, "windows") + (() if base == "obfd" else
                                                  (f"{base} windows",))
                case += 1
                _assert_compare_predicts_pack(got, src, tmp_path / f"o{case}", C, overflow,
                                              min_fill, wd, strategies)


def test_compare_shows_what_overflow_truncate_and_drop_lose(tmp_path):
    """Documents of 5 and 6 tokens at C = 4: --overflow drop loses all 11 tokens, so no
    strategy writes a row and none is named least waste; --overflow truncate loses 3, shown
    in the table and the verdict; the WARNING is pack's line."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    pack = CliRunner().invoke(cli, ["pack", "-q", "-c", "4", "--overflow", "drop", str(src),
                                    str(tmp_path / "out")])
    assert pack.exit_code == 0, pack.output
    res = CliRunner().invoke(cli, ["compare", "-c", "4", "--overflow", "drop", str(src)])
    assert res.exit_code == 0, res.output
    head = res.stdout.splitlines()[0]
    assert "--overflow drop leaves out 2 documents longer than C (11 tokens)" in head
    assert "0 tokens kept, ceil(tokens kept/C) = 0 rows" in head
    assert "least waste" not in res.stdout
    assert "no strategy writes a row: 11 tokens lost to --overflow drop" in res.stdout
    warn = [ln for ln in pack.stderr.splitlines() if ln.startswith("WARNING:")]
    assert res.stderr.splitlines() == warn != []
    res = CliRunner().invoke(cli, ["compare", "-c", "4", "--overflow", "truncate", str(src)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert "cuts 2 documents longer than C to C (3 tokens lost): 8 tokens kept" in lines[0]
    assert lines[1].split()[6:10] == ["docs", "truncated", "tokens", "truncated"]
    assert lines[2].split()[:6] == ["concat", "2", "0", "0", "2", "3"]
    assert "least waste: concat (0 padding tokens, 3 tokens truncated" in res.stdout
    assert "WARNING: --overflow truncate removed 27.3% of the tokens (3 of 11" in res.stderr
    # --min-fill alone leaving out every row: no winner either, the loss named as its own
    from packtool.analysis import format_compare

    text = format_compare(compare_strategies(np.array([1, 2]), 4, min_fill=1.0), 4, 2, 3)
    assert "ceil(tokens/C) = 1 row\n" in text and "least waste" not in text
    assert "no strategy writes a row: 3 tokens lost to --min-fill;" in text


def test_compare_refuses_what_pack_refuses_in_pack_s_words(tmp_path):
    """An input with no tokens (a file of no rows, one of empty documents, two such files) and
    a document over C with --overflow error (the first in pack's order, with and without
    --window-docs): compare exits as pack does with pack's one-line message, file and row."""
    from conftest import write_docs

    empty = write_docs(tmp_path / "none" / "a.parquet", [])
    blank = write_docs(tmp_path / "blank" / "a.parquet", [[], []])
    write_docs(tmp_path / "two" / "a.parquet", [[]])
    write_docs(tmp_path / "two" / "b.parquet", [])
    long = tmp_path / "long"
    write_docs(long / "a.parquet", [[1] * 3, [2] * 4])
    write_docs(long / "b.parquet", [[3] * 2, [4] * 9, [5] * 1, [6] * 17, [7] * 2, [8] * 20])
    cases = [([empty], []), ([blank], []), ([tmp_path / "two"], []),
             ([long], ["--overflow", "error"]),
             ([long], ["--overflow", "error", "--window-docs", "2"])]
    for n, (inputs, opts) in enumerate(cases):
        args = ["-c", "8", *opts]
        pack = CliRunner().invoke(cli, ["pack", "-q", *map(str, args), *map(str, inputs),
                                        str(tmp_path / f"out{n}")])
        res = CliRunner().invoke(cli, ["compare", *map(str, args), *map(str, inputs)])
        assert pack.exit_code == res.exit_code == 1, (n, pack.output, res.output)
        assert res.output == pack.output, n
        assert res.output.count("\n") == 1 and ("no tokens to pack" in res.output
                                                or "(0-based)" in res.output), n


def test_stats_of_an_output_of_no_rows_says_there_is_nothing_to_hash(tmp_path):
    """Every document dropped (--overflow drop): stats says there are no shards to check, not
    that --no-hash was given (it was not), with and without --no-hash."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packcheck import invoke

    pq.write_table(pa.table({"input_ids": [[1, 2, 3, 4, 5, 6]]}), tmp_path / "long.parquet")
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 4, "--overflow", "drop", tmp_path / "long.parquet",
                   out]).exit_code == 0
    for extra in ([], ["--no-hash"]):
        res = invoke(["stats", *extra, out])
        assert res.exit_code == 0, res.output
        line = next(x for x in res.output.splitlines() if "integrity" in x)
        assert line.split() == ["integrity", "no", "shards", "to", "check", "(an", "output",
                                "of", "0", "rows)"], line


def test_after_truncate_every_document_fits_so_concat_does_not_compete():
    """--overflow truncate: concat cut the truncated 10-token document over two rows and was
    named least waste 'with no document that fits in a row cut' (lengths before truncation)."""
    from packtool.analysis import least_waste

    lengths = np.array([7, 10])
    res = compare_strategies(lengths, 8, overflow="truncate")
    by = {r["strategy"]: r for r in res}
    assert by["concat"]["docs_cut"] == 1 and by["concat"]["docs_cut_below_capacity"] == 1
    assert by["obfd"]["docs_cut_below_capacity"] == 0
    assert least_waste(res)["strategy"] != "concat"
    split = {r["strategy"]: r for r in compare_strategies(lengths, 8, overflow="split")}
    assert split["obfd"]["docs_cut"] == 1 and split["obfd"]["docs_cut_below_capacity"] == 0


def test_a_strategy_that_writes_no_row_is_never_least_waste():
    """--min-fill 1 on 3, 3, 3 at C = 4: ordered and obfd write nothing (every token lost) and
    ordered was named least waste; the one that writes rows is."""
    from packtool.analysis import least_waste

    res = compare_strategies(np.array([3, 3, 3]), 4, min_fill=1.0)
    assert {r["strategy"]: r["rows"] for r in res} == {"concat": 2, "ordered": 0, "obfd": 0}
    assert least_waste(res)["strategy"] == "concat"
    assert least_waste([r for r in res if r["rows"] == 0]) is None


def test_attention_work_vs_least_is_over_the_strategies_that_write_rows(tmp_path):
    """attention_work_vs_least divided by the least attention work of every strategy, 0 for
    one that writes no row, and put 1.0 for every ratio then: concat's 124 token^2 beside
    obfd's 40 read as the least. The least is now taken over the strategies that write rows,
    and a strategy that writes none has no ratio (null)."""
    res = {r["strategy"]: r for r in compare_strategies(np.array([7, 4, 5, 2, 6]), 8,
                                                        min_fill=1.0)}
    assert [(r["rows"], r["attention_work"]) for r in res.values()] == [(3, 124), (0, 0),
                                                                         (1, 40)]
    assert [r["attention_work_vs_least"] for r in res.values()] == [3.1, None, 1.0]
    from conftest import write_docs

    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    got = _compare_json(src, "-c", 4, "--min-fill", 1)
    assert [(r["rows"], r["attention_work_vs_least"]) for r in got["strategies"]] == \
        [(2, 1.0), (0, None), (0, None)]
    got = _compare_json(src, "-c", 2, "--overflow", "drop")  # no strategy writes a row
    assert [r["attention_work_vs_least"] for r in got["strategies"]] == [None] * 3


def test_compare_json_carries_the_mask_and_eos_counts_the_text_prints(tmp_path):
    """compare printed 'INPUT: input: attention mask removed ...' and its --json had none of
    those counts; both say them now, once."""
    src = tmp_path / "m.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2, 3, 4], [5, 6, 7]],
                             "attention_mask": [[1, 1, 1, 0], [1, 1, 1]],
                             "labels": [[-100, 2, 3, 4], [-100, -100, 7]]}), src)
    args = ["compare", str(src), "-c", "8", "--append-eos", "2"]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "  input: attention mask removed 1 token;" in text.output
    assert "INPUT: input:" not in text.output
    got = json.loads(CliRunner().invoke(cli, args + ["--json"]).stdout)["input_masks"]
    assert got == {"tokens_attention_masked": 1, "tokens_label_masked": 3, "docs_bos_added": 0,
                   "docs_bos_present": 0, "docs_eos_added": 2, "docs_eos_present": 0}


@pytest.mark.parametrize("ids, labels, whose", [
    # concat's rows [1 | 2] and [3,4] keep the target 4; ordered's and obfd's [1], [2,3] and
    # [4] keep none
    ([[1], [2, 3, 4]], [[-100], [-100, -100, 4]], ("ordered", "obfd")),
    # ordered's and obfd's piece [2,3] keeps the target 3; concat's rows [1 | 2], [3,4] and
    # [5] keep none
    ([[1], [2, 3, 4], [5]], [[-100], [-100, 3, -100], [-100]], ("concat",)),
])
def test_compare_warns_of_no_effective_targets_for_each_strategy_whose_pack_would(
        tmp_path, ids, labels, whose):
    """compare decided the no-effective-targets warning from obfd's row alone: it warned with
    no strategy named though concat kept a target, and said nothing when concat alone kept
    none. Each strategy's dict now carries the line its pack prints, and the text and --json
    name the strategies whose pack prints it, as every other warning."""
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), src)
    got = _compare_json(src, "-c", 2)
    _assert_compare_predicts_pack(got, src, tmp_path / "o", 2, "split", 0.0, None,
                                  ("concat", "ordered", "obfd"))
    warned = {r["strategy"] for r in got["strategies"]
              if any(w.startswith("no effective targets") for w in r["warnings"])}
    assert warned == set(whose)
    line = [w for w in got["warnings"] if "no effective targets" in w]
    assert len(line) == 1 and line[0].startswith("; ".join(whose) + ": no effective targets")
    text = CliRunner().invoke(cli, ["compare", str(src), "-c", "2"])
    assert text.exit_code == 0, text.output
    assert [w for w in text.stderr.splitlines() if "no effective targets" in w] == \
        [f"WARNING: {line[0]}"]


# --- what each line of stats, compare and the pack summary counts ----------------------------

_A = [list(range(1, n + 1)) for n in (1, 2048, 2049, 4096, 5000, 0, 3)]  # one empty document
_M = [[5, 6, 7, 8], [5, 6, 7, 8], [9]]


def _line(text: str, label: str) -> str:
    """The text of the stats line labelled ``label`` (after the label's column)."""
    found = [ln[28:] for ln in text.splitlines() if ln[2:28].rstrip() == label]
    assert len(found) == 1, (label, text)
    return found[0]


@pytest.mark.parametrize("docs, capacity, extra, dropped, under, summary", [
    # --min-fill 1 leaves out the row of [9]: 1 document of 1 token
    (_M, 4, ("--min-fill", "1"), "1 document, 1 token, in rows under --min-fill",
     "1 planned row left out, 1 token: 1 token of the 1 document dropped, 0 tokens of documents "
     "written in part", "packed 2 of 3 documents read (8 of 9 tokens) into 2 rows of 4 in 1 shard"),
    # the row left out holds the documents of 1 and 3 tokens whole and 905 tokens of a split one
    (_A, 2048, ("--min-fill", "0.5"), "2 documents, 4 tokens, in rows under --min-fill",
     "1 planned row left out, 909 tokens: 4 tokens of the 2 documents dropped, 905 tokens of "
     "documents written in part", "packed 4 of 7 documents read (12,288 of 13,197 tokens) into 6 rows"),
    # 4 documents over C dropped by --overflow drop, the 2 others in the row under --min-fill
    (_A, 7, ("--overflow", "drop", "--min-fill", "0.9"),
     "6 documents, 13,197 tokens: 4 documents (13,193 tokens) by --overflow drop, 2 documents "
     "(4 tokens) in rows under --min-fill",
     "1 planned row left out, 4 tokens: 4 tokens of the 2 documents dropped, 0 tokens of "
     "documents written in part", "packed 0 of 7 documents read (0 of 13,197 tokens) into 0 rows"),
    (_A, 7, ("--overflow", "drop"), "4 documents, 13,193 tokens", None,
     "packed 2 of 7 documents read (4 of 13,197 tokens) into 1 row of 7 in 1 shard"),
])
def test_the_dropped_line_counts_one_set_of_documents_and_their_tokens(
        tmp_path, docs, capacity, extra, dropped, under, summary):
    """stats printed "dropped 1 documents, 0 tokens (1 planned row(s) under --min-fill left
    out, 1 tokens)": the documents of every cause beside the tokens of --overflow drop's alone.
    The line's documents and tokens now describe the same documents, split by cause; the rows
    under --min-fill have their own line (their tokens: the documents dropped with them and
    the pieces of documents written in part). The pack summary said "packed 3 documents" when
    it wrote 2: it says how many of those read it wrote."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in" / "a.parquet", docs)
    res = CliRunner().invoke(cli, ["pack", "-c", str(capacity), "--no-shuffle", *extra,
                                   str(src.parent), str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert summary in res.stdout
    text = CliRunner().invoke(cli, ["stats", str(tmp_path / "o")])
    assert text.exit_code == 0, text.output
    assert _line(text.stdout, "dropped") == dropped
    if under is None:
        assert "under --min-fill" not in text.stdout.replace("the rows under --min-fill", "")
    else:
        assert _line(text.stdout, "rows under --min-fill") == under
        # every count names its unit (the tokens of the documents dropped read as documents)
        assert re.fullmatch(r"\d+ planned rows? left out, [\d,]+ tokens?: [\d,]+ tokens? of the "
                            r"[\d,]+ documents? dropped, [\d,]+ tokens? of documents written "
                            r"in part", under)
        assert f"; --min-fill {extra[-1]}: {under}" in res.stdout  # the pack's summary
    if extra == ("--overflow", "drop", "--min-fill", "0.9"):  # docs/stats.md's example
        lines = [ln for ln in text.stdout.splitlines()
                 if ln.startswith(("  dropped ", "  rows under --min-fill "))]
        assert "```\n" + "\n".join(lines) + "\n```" in (ROOT / "docs" / "stats.md").read_text()
    s = analyze_packed(tmp_path / "o").stats
    # the parts add up to every token not written
    assert (s.tokens_truncated + s.tokens_of_dropped_docs + s.doc_tokens_under_min_fill
            + s.tokens_under_min_fill - s.doc_tokens_under_min_fill) == s.tokens_dropped


def test_percentages_never_round_to_0_or_100_when_not_exact():
    """"--overflow drop removed 100.0% of the tokens (13,193 of 13,197)": one helper formats
    every percentage of the text, and shows >99.9% / <0.1% there."""
    from packtool.stats import PackStats, percent

    assert percent(13193, 13197) == ">99.9%"
    assert percent(1, 100000) == "<0.1%"
    assert percent(1, 100000, 3) == "0.001%"
    assert percent(1, 10**9, 3) == "<0.001%"
    assert (percent(0, 5), percent(5, 5), percent(0, 0)) == ("0.0%", "100.0%", "0.0%")
    assert percent(1, 3, 2) == "33.33%"
    s = PackStats(capacity=7, docs_in=7, docs_dropped=4, tokens_in=13197, tokens_dropped=13193)
    assert ">99.9% of the tokens (13,193 of 13,197" in s.overflow_warning("drop")


def test_fill_and_padding_near_full_do_not_print_100_percent(tmp_path):
    """A row of 4,095 real tokens of 4,096 is not 100.0% full, nor is its padding 0.000%."""
    out = pack_docs(tmp_path, [list(range(1, 4096))] + [[1] * 4096] * 999, 4096)
    text = CliRunner().invoke(cli, ["stats", str(out)]).stdout
    assert _line(text, "fill per row").startswith("min >99.9%  p10 100.0%")
    assert "(0.000%" not in _line(text, "padding tokens")


def test_split_and_cut_lines_say_what_each_counts_after_min_fill(tmp_path):
    """After --min-fill, "split 3 documents (+2 pieces)" sat beside "cut across segments 2":
    the split documents are the plan's with a piece written, and one of them kept a single
    piece. The lines say so, and the cut line gives compare's figure, which counts it."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in" / "a.parquet", _A)
    assert CliRunner().invoke(cli, ["pack", "-c", "2048", "--min-fill", "0.5", "-q",
                                    str(src.parent), str(tmp_path / "o")]).exit_code == 0
    text = CliRunner().invoke(cli, ["stats", str(tmp_path / "o")]).stdout
    assert _line(text, "split") == ("3 documents in the plan, a piece of each written (+2 "
                                    "pieces written beyond their first)")
    cut = _line(text, "cut across segments")
    assert cut.startswith("2 documents in more than one segment written")
    assert "compare's docs cut: 3" in cut
    obfd = _compare_json(src, "-c", 2048, "--min-fill", 0.5)["strategies"][2]
    assert obfd["strategy"] == "obfd" and obfd["docs_cut"] == 3


def test_concat_says_it_splits_no_document(tmp_path):
    """--strategy concat: "documents 6 in 12 segments" then "split 0 documents (+0 pieces)"."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in" / "a.parquet", _A)
    res = CliRunner().invoke(cli, ["pack", "-c", "2048", "--strategy", "concat", "--no-shuffle",
                                   str(src.parent), str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "split 0 (+0 pieces)" not in res.stdout and "split none (concat" in res.stdout
    text = CliRunner().invoke(cli, ["stats", str(tmp_path / "o")]).stdout
    assert _line(text, "split").startswith("none: --strategy concat cuts the stream at row "
                                           "ends, it splits no document")


def test_compare_header_says_how_many_documents_are_empty(tmp_path):
    from conftest import write_docs

    src = write_docs(tmp_path / "in.parquet", _A)
    got = _compare_json(src, "-c", 2048)
    assert (got["documents"], got["documents_empty"]) == (7, 1)
    text = CliRunner().invoke(cli, ["compare", "-c", "2048", str(src)]).stdout
    assert text.startswith("dry run: 7 documents, 1 of them empty, 13,197 tokens")


def test_least_waste_ties_go_to_more_targets_then_fewer_cuts():
    """[5]*100 and [6]*4000 at C = 2048: every strategy 3 rows and 2,044 padding; concat keeps
    4,096 targets, ordered and obfd 4,097, and concat was named for coming first."""
    from packtool.analysis import least_waste

    rows = compare_strategies(np.array([100, 4000]), 2048)
    assert {r["padding_tokens"] for r in rows} == {2044}
    assert [r["effective_targets"] for r in rows] == [4096, 4097, 4097]
    assert least_waste(rows)["strategy"] == "ordered"
    # equal targets and cuts: fewer segments, then the order given
    a = {"strategy": "a", "rows": 1, "padding_tokens": 0, "docs_cut_below_capacity": 0,
         "effective_targets": 5, "docs_cut": 1, "segments": 3}
    b = dict(a, strategy="b", segments=2)
    assert least_waste([a, b])["strategy"] == "b"
    assert least_waste([a, dict(a, strategy="c")])["strategy"] == "a"


@pytest.mark.parametrize("docs, args", [
    ([[5] * 100, [6] * 4000], ("-c", 2048)),  # the tie that goes to ordered's target
    ([list(range(1, 9))] * 3 + [[1, 2, 3]], ("-c", 8)),
    ([[1, 2, 3]] * 3, ("-c", 4, "--min-fill", 1)),  # concat alone writes rows
    ([[1, 2, 3]] * 3, ("-c", 2, "--overflow", "drop")),  # no strategy writes a row: null
    ([[1, 2, 3, 4, 5]] * 2, ("-c", 4, "--overflow", "truncate", "--window-docs", 1)),
])
def test_compare_json_names_the_strategy_the_text_names_least_waste(tmp_path, docs, args):
    """compare's text names the strategy that wastes least and its --json did not: its
    ``least_waste`` is that strategy, from the same function (null when the text names none);
    a windowing is never it."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in.parquet", docs)
    got = _compare_json(src, *args)
    verdict = [ln for ln in _verdict([src, *args]).splitlines()
               if ln.startswith(("least waste: ", "least padding: "))]
    named = verdict[0].split(": ", 1)[1].split(" (", 1)[0] if verdict else None
    assert got["least_waste"] == named
    assert named is None or named in ("concat", "ordered", "obfd")
    if docs[0] == [5] * 100:
        assert named == "ordered"


def test_stats_text_shows_masked_labels_and_added_eos(tmp_path):
    """stats printed "effective targets 2 (0.5000 per real token)" without the masks that
    explain it; the JSON had tokens_label_masked. Plurals come from one helper."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int64())),
                             "labels": pa.array([[-100, -100, 3]], pa.list_(pa.int64()))}),
                   src)
    res = CliRunner().invoke(cli, ["pack", "-c", "8", "--append-eos", "2", "-q",
                                   str(src.parent), str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    text = CliRunner().invoke(cli, ["stats", str(tmp_path / "o")]).stdout
    note = _line(text, "input")
    assert "kept 2 tokens out of the targets" in note and "EOS added to 1 document " in note
    assert "(s)" not in text and "1 documents" not in text and "1 tokens" not in text


def test_compare_attention_column_shows_small_figures_exactly(tmp_path):
    """"attention M token^2" printed 0 for inputs of a few thousand tokens."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in.parquet", _M)
    text = CliRunner().invoke(cli, ["compare", "-c", "4", str(src)]).stdout
    head = next(ln for ln in text.splitlines() if ln.startswith("strategy"))
    assert "attention token^2" in head
    obfd = next(ln for ln in text.splitlines() if ln.startswith("obfd"))
    assert obfd.split()[-1] == "33"  # 16 + 16 + 1


def test_a_manifest_that_did_not_count_the_min_fill_documents_apart_says_so(tmp_path):
    """A manifest written before docs_under_min_fill was recorded: its docs_dropped mixes
    --overflow drop's documents with those of the rows under --min-fill, and stats says that
    rather than give them all to one cause."""
    from packcheck import reseal
    from conftest import write_docs

    src = write_docs(tmp_path / "in" / "a.parquet", _A + [list(range(1, 8))])  # a full row
    assert CliRunner().invoke(cli, ["pack", "-c", "7", "--overflow", "drop", "--min-fill", "0.9",
                                    "-q", str(src.parent), str(tmp_path / "o")]).exit_code == 0
    reseal(tmp_path / "o", min_fill_docs_recorded=False)
    raw = read_manifest(tmp_path / "o")
    assert not raw.min_fill_docs_recorded and raw.totals.docs_under_min_fill == 0
    text = CliRunner().invoke(cli, ["stats", str(tmp_path / "o")]).stdout
    assert _line(text, "dropped") == (
        "6 documents (by --overflow drop and in the rows under --min-fill, not counted apart "
        "in this output's manifest); 13,193 tokens of them by --overflow drop")
    assert _line(text, "rows under --min-fill") == "1 planned row left out, 4 tokens"


#: a count formatted straight before a plural noun in an f-string ("{n:,} rows"): "1 rows"
#: when n is 1; such counts go through packtool.stats.plural
_COUNT_BEFORE_PLURAL = r"^\s+(?:more |extra |padding |real |planned )?" \
    r"(?:rows|documents|tokens|segments|pieces|shards|sources|windows|files|targets)\b"


def test_no_report_puts_a_count_before_a_plural_noun_outside_the_helper():
    """Every f-string of the stats, compare, pack and recount reports that prints a count
    before its noun takes the noun from ``plural``: none formats a value straight before
    "rows", "documents", "tokens", ... (compare printed "cuts 1 documents that fit in a row",
    "1 padding tokens")."""
    import ast
    import re

    pat = re.compile(_COUNT_BEFORE_PLURAL)
    found = []
    for name in ("stats.py", "analysis.py", "cli.py", "recount.py"):
        path = ROOT / "packtool" / name
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.JoinedStr):
                continue
            for v, after in zip(node.values, node.values[1:]):
                if (isinstance(v, ast.FormattedValue) and isinstance(after, ast.Constant)
                        and not isinstance(v.value, ast.Constant)  # a column's heading
                        and pat.match(after.value)):
                    found.append(f"{name}:{v.lineno}: {ast.unparse(v)}{after.value[:30]}")
    assert not found, "\n".join(found)


def _verdict(args):
    r = CliRunner().invoke(cli, ["compare", *map(str, args)])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_compare_and_stats_say_1_of_a_noun_in_the_singular(tmp_path):
    """The singular case of every count compare and stats print before a noun: the verdict's
    padding, truncated tokens and the documents a strategy that wastes less cuts; the header's
    tokens kept; stats' documents, segments, rows of --per-bin, the sources not listed; the
    segment padding line."""
    from conftest import write_docs

    from packtool.analysis import format_packed
    from packtool.stats import PackStats

    t1 = write_docs(tmp_path / "t1" / "a.parquet", [[1] * 3, [2] * 3, [3] * 2])
    text = _verdict(["-c", 4, t1.parent])
    assert "concat pads less (0) but cuts 1 document that fits in a row" in text, text
    t2 = write_docs(tmp_path / "t2" / "a.parquet", [[9] * 2048] * 99 + [[8] * 2047])
    text = _verdict(["-c", 2048, t2.parent])
    assert "least waste: concat (1 padding token, 0 rows over" in text, text
    t3 = write_docs(tmp_path / "t3" / "a.parquet", [[1] * 5, [2] * 3])
    text = _verdict(["-c", 4, "--overflow", "truncate", t3.parent])
    assert "(1 padding token, 1 token truncated, 0 rows over" in text, text
    t4 = write_docs(tmp_path / "t4" / "a.parquet", [[1], [2] * 5])
    text = _verdict(["-c", 4, "--overflow", "drop", t4.parent])
    assert "1 token kept, ceil(tokens kept/C) = 1 row" in text, text
    assert "1 tokens" not in text and "1 documents" not in text and "1 rows" not in text

    # stats: one document of one segment in one row, listed by --per-bin
    out = pack_docs(tmp_path, [[1, 2, 3]], 4, name="one")
    text = CliRunner().invoke(cli, ["stats", str(out), "--per-bin"]).stdout
    assert "1 in 1 segment (in: 1" in _line(text, "documents"), text
    assert "total targets 2 over 1 row" in text, text
    # the sources beyond --per-source-limit: 1 more source of 1 real token
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[1] * 3, [2]], pa.list_(pa.int32())),
                             "src": ["a", "b"]}), tmp_path / "src" / "a.parquet")
    assert CliRunner().invoke(cli, ["pack", "-q", "-c", "4", "--source-column", "src",
                                    str(tmp_path / "src"), str(tmp_path / "so")]).exit_code == 0
    text = format_packed(analyze_packed(tmp_path / "so"), per_source_limit=1)
    assert "... 1 more source, 1 real token " in text, text
    note = PackStats(capacity=4, rows=2, segment_padding_tokens=1,
                     rows_without_segment_padding=1).segment_padding_note(2)
    assert "1 token inside rows" in note and "(+1 row, +4 tokens per epoch)" in note, note


def test_plot_titles_say_1_of_a_noun_in_the_singular(tmp_path, monkeypatch):
    """The titles and legends of stats --plot and compare --plot take their nouns from the
    helper: 1 document, 1 token, 1 row, 1 padding token."""
    from packtool import analysis

    figures = []
    monkeypatch.setattr(analysis, "_save", lambda plt, fig, out: figures.append(fig))
    analysis.plot_compare(np.array([3]), 4, tmp_path / "c.png")
    analysis.plot_packed(analyze_packed(pack_docs(tmp_path, [[1, 2, 3]], 4)), tmp_path / "p.png")
    texts = [t.get_text() for f in figures for t in f.findobj()
             if hasattr(t, "get_text")]
    joined = "\n".join(texts)
    assert "1 document, 3 tokens" in joined and "(1 row)" in joined, joined
    assert "1 row of C = 4, 1 padding token" in joined, joined
    assert "1 rows" not in joined and "1 documents" not in joined, joined


def _keys(d, path=()):
    """Every key path of the dicts nested in ``d`` (lists of dicts: the keys of their items)."""
    out = set()
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        p = path + ((k if isinstance(d, dict) else "[]"),)
        if isinstance(d, dict):
            out.add(p)
        out |= _keys(v, p)
    return out


def test_stats_json_of_an_output_of_no_rows_has_the_keys_of_every_other(tmp_path):
    """stats --json on an output of 0 rows (every document dropped) gave "fill_quantiles": {};
    it carries the same keys as any output's, each 0 (a reader of ['p10'] does not fail)."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in" / "a.parquet", [[1] * 100, [2] * 70])
    for name, opts in (("z", ["--overflow", "drop"]), ("full", [])):
        r = CliRunner().invoke(cli, ["pack", "-q", "-c", "64", *opts, str(src.parent),
                                     str(tmp_path / name)])
        assert r.exit_code == 0, r.output
    got = {}
    for name in ("z", "full"):
        r = CliRunner().invoke(cli, ["stats", str(tmp_path / name), "--json"])
        assert r.exit_code == 0, r.output
        got[name] = json.loads(r.stdout)
    assert got["z"]["stats"]["rows"] == 0 and got["full"]["stats"]["rows"] > 0
    assert got["z"]["fill_quantiles"] == {k: 0.0 for k in ("min", "p10", "p50", "p90", "max")}
    assert _keys(got["z"]) == _keys(got["full"])


def test_compare_json_keys_are_the_same_whatever_the_options(tmp_path):
    """compare --json gave rows_dropped and tokens_under_min_fill only with --min-fill (and
    window_docs, windows only on the windowed row): every strategy's dict now has one key set,
    with and without each option, 0 (or null: no windows) when it does not apply."""
    from conftest import write_docs

    src = write_docs(tmp_path / "in" / "a.parquet", [[1] * n for n in (3, 9, 2, 17, 5, 8)])
    base = _compare_json(src, "-c", 8)
    keys = set(base["strategies"][0])
    assert {"rows_dropped", "tokens_under_min_fill", "window_docs", "windows"} <= keys
    assert base["strategies"][0]["rows_dropped"] == 0
    for opts in (["--min-fill", 0.5], ["--window-docs", 2], ["--overflow", "truncate"],
                 ["--overflow", "drop"], ["--segment-multiple", 4],
                 ["--min-fill", 1, "--window-docs", 3, "--segment-multiple", 2]):
        got = _compare_json(src, "-c", 8, *opts)
        assert set(got) == set(base), opts
        for row in got["strategies"]:
            assert set(row) == keys, (opts, row["strategy"], set(row) ^ keys)


def test_deprecated_stats_compare_takes_every_option_of_compare(tmp_path):
    """stats --capacity C --compare refused --min-fill (No such option) while it took
    --window-docs: the alias's options are now compare's own, the same names, types and
    defaults, and give the same report."""
    from packtool.cli import compare, stats

    theirs = {p.name: p for p in stats.params}
    for p in compare.params:
        if p.name in ("inputs", "as_json", "plot"):
            continue
        q = theirs.get(p.name)
        assert q is not None, p.name
        assert (q.opts, type(q.type), q.is_flag) == (p.opts, type(p.type), p.is_flag), p.name
        if p.name != "capacity":  # required by compare, needed with --compare by stats
            assert q.default == p.default, p.name
    args = ["--capacity", "512", "--json", "--min-fill", "0.5", "--segment-multiple", "8",
            "--window-docs", "100"]
    new = CliRunner().invoke(cli, ["compare", str(ROOT / "sample_data"), *args])
    old = CliRunner().invoke(cli, ["stats", str(ROOT / "sample_data"), "--compare", *args])
    assert new.exit_code == old.exit_code == 0, (new.output, old.output)
    assert json.loads(old.stdout) == json.loads(new.stdout)
    # on a packed output, the dry-run options say where they belong
    out = pack_docs(tmp_path, [[1, 2, 3]], 4)
    r = CliRunner().invoke(cli, ["stats", str(out), "--min-fill", "0.5"])
    assert r.exit_code == 2 and "--min-fill is an option of the dry run" in r.output, r.output


def test_compare_segment_multiple_predicts_the_pack(tmp_path):
    """compare --segment-multiple N dry-runs pack --segment-multiple N: every strategy's rows,
    padding (the segments' own included), rows without the padding, targets and the rest equal
    the pack's manifest, with --min-fill, --window-docs and each --overflow too."""
    from conftest import write_docs

    C, wd, case = 16, 7, 0
    for seed in (3, 4):
        rng = np.random.default_rng(seed)
        lengths = rng.choice([0, 1, 3, 5, 9, 15, 16, 17, 40], size=30) * (rng.random(30) < 0.9)
        src = tmp_path / f"in{seed}"
        write_docs(src / "a.parquet", [list(range(1, n + 1)) for n in lengths])
        for overflow in ("split", "truncate", "drop"):
            for multiple, min_fill in ((4, 0.0), (8, 0.5)):
                got = _compare_json(src, "-c", C, "--overflow", overflow, "--min-fill",
                                    min_fill, "--window-docs", wd, "--segment-multiple",
                                    multiple)
                assert got["segment_multiple"] == multiple
                strategies = (("concat", "ordered", "obfd")[case % 3], "windows")
                case += 1
                _assert_compare_predicts_pack(got, src, tmp_path / f"o{case}", C, overflow,
                                              min_fill, wd, strategies,
                                              segment_multiple=multiple)
    text = CliRunner().invoke(cli, ["compare", "-c", "16", "--segment-multiple", "8",
                                    str(tmp_path / "in3")]).stdout
    assert "--segment-multiple 8" in text.splitlines()[0], text
    bad = CliRunner().invoke(cli, ["compare", "-c", "16", "--segment-multiple", "5",
                                   str(tmp_path / "in3")])
    assert bad.exit_code != 0 and "multiple" in bad.output, bad.output


def test_compare_names_windowed_strategies_in_a_warning_so_they_split_back(tmp_path):
    """compare prefixed a warning some strategies' packs print with their names joined by ", ",
    and a windowed strategy's name holds a comma ("obfd, windows of 1,000"): "ordered, obfd,
    ordered, windows of 1,000, ..." could not be read back into names. The names are now
    separated by "; ", and the prefix splits back into exactly the strategies (and windowings)
    whose own lines hold the warning."""
    src = tmp_path / "in.parquet"
    # documents of 5 tokens at C = 4: every strategy but concat cuts each into pieces
    pq.write_table(pa.table({"input_ids": [list(range(1, 6))] * 1200}), src)
    got = _compare_json(src, "-c", 4, "--window-docs", 1000)
    names = [r["strategy"] for r in got["strategies"]]
    assert any("," in n for n in names)  # the windowed names hold commas
    checked = 0
    for line in got["warnings"]:
        whose = sorted(r["strategy"] for r in got["strategies"]
                       if any(line.endswith(w) for w in r["warnings"]))
        if len(whose) == len(names):
            continue  # every strategy's pack prints it: no prefix
        prefix = next(line[:-len(w) - 2] for r in got["strategies"] for w in r["warnings"]
                      if line.endswith(w) and line[:-len(w)].endswith(": "))
        assert sorted(prefix.split("; ")) == whose, line
        checked += 1
    assert checked >= 1, got["warnings"]
