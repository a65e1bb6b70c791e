"""Reports that cannot mislead: absolute units across strategies, log scales where ranges are
wide, titles that say what is compared, JSON without float noise, a bounded --per-bin listing
that stays aligned, integer progress counts."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import write_docs
from packtool import analysis
from packtool.analysis import analyze_packed, compare_strategies, least_waste
from packtool.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def sample_lengths():
    return analysis.input_lengths([ROOT / "sample_data"])


def _floats(obj):
    if isinstance(obj, float):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _floats(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _floats(v)


def test_compare_figures_are_absolute_and_comparable(sample_lengths):
    """ordered and obfd lay out the same segments, so their attention work in token^2 is equal
    (the old per-strategy percentage made ordered look cheaper); rows and padding differ."""
    res = {r["strategy"]: r for r in compare_strategies(sample_lengths, 2048)}
    o, b = res["ordered"], res["obfd"]
    assert o["attention_work"] == b["attention_work"]
    assert o["attention_work_vs_least"] == b["attention_work_vs_least"]
    assert o["rows"] > b["rows"] and o["padding_tokens"] > b["padding_tokens"]
    for r in res.values():
        assert r["tokens_processed"] == r["rows"] * 2048
        # split keeps every token, so padding is what the rows hold beyond the input
        assert r["padding_tokens"] == r["tokens_processed"] - int(sample_lengths.sum())
        assert r["attention_work_full_rows"] == r["rows"] * 2048**2
    text = analysis.format_compare(list(res.values()), 2048, sample_lengths.size,
                                   int(sample_lengths.sum()))
    assert "%" not in text.splitlines()[1].replace("padding %", "")  # no relative columns
    assert "least waste: obfd" in text
    assert "concat pads less" in text and "cuts 153 documents" in text


def test_least_waste_prefers_no_cut_documents_then_padding():
    rows = [{"strategy": "a", "padding_tokens": 1, "rows": 5, "docs_cut_below_capacity": 3},
            {"strategy": "b", "padding_tokens": 50, "rows": 6, "docs_cut_below_capacity": 0},
            {"strategy": "c", "padding_tokens": 9, "rows": 5, "docs_cut_below_capacity": 0}]
    assert least_waste(rows)["strategy"] == "c"
    for r in rows:
        r["docs_cut_below_capacity"] = 1
    assert least_waste(rows)["strategy"] == "a"


def test_json_has_no_float_noise(tmp_path, sample_lengths):
    """Histogram edges print as 0.3, not 0.30000000000000004; ratios are rounded; counts are
    integers."""
    write_docs(tmp_path / "in" / "a.parquet", [[1] * n for n in (3, 7, 2, 9, 4, 4, 1, 6)])
    assert run("pack", "-q", "-c", 10, tmp_path / "in", tmp_path / "out").exit_code == 0
    res = run("stats", tmp_path / "out", "--json", "--per-bin")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["fill_histogram"]["edges"] == [i / 10 for i in range(11)]
    assert "0.30000000000000004" not in res.output
    for v in d["fill_quantiles"].values():
        assert v == round(v, 6)
    assert all(isinstance(b["targets"], int) for b in d["per_bin"])
    res = run("compare", tmp_path / "in", "-c", 10, "--json")
    for x in _floats(json.loads(res.output)):
        assert x == round(x, 6), x
    for r in compare_strategies(sample_lengths, 2048):
        for x in _floats(r):
            assert x == round(x, 6), x


def test_stats_json_of_an_unchanged_output_is_the_same_on_every_run(tmp_path, monkeypatch):
    """CI diffs ``stats --json``: two runs on the same output print the same bytes, however long
    the sha256 took (a clock that runs ever faster makes every interval differ); the text still
    says how long it took."""
    import itertools
    import time

    out = _packed_many_rows(tmp_path)
    ticks = itertools.accumulate(itertools.count(1), lambda t, k: t + 0.001 * k * k)
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    first, second = (run("stats", out, "--json", "--per-bin") for _ in range(2))
    assert first.exit_code == second.exit_code == 0, first.output
    assert first.output == second.output
    assert "seconds" not in first.output
    assert json.loads(first.output)["integrity"]["shards_hashed"] > 1
    assert " s; --no-hash skips it)" in run("stats", out).output


def _float_paths(obj, path=()):
    """(key path, value) of every float in a JSON value."""
    if isinstance(obj, float):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _float_paths(v, path + (k,))
    elif isinstance(obj, list):
        for v in obj:
            yield from _float_paths(v, path)


def test_every_ratio_of_every_json_report_is_rounded_by_one_rule(tmp_path):
    """stats (its figures and the manifest's totals), pack and compare round every ratio to
    RATIO_DECIMALS, a percentage to 2 fewer; counts stay exact integers. Lengths at C = 7 and
    a source column give ratios of endless decimals (fill 34 / 35)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.stats import RATIO_DECIMALS, PackStats

    docs = [[1] * n for n in (3, 5, 2, 6, 4, 1, 7, 2, 4)]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())),
                             "src": [f"s{i % 3}" for i in range(len(docs))]}),
                   tmp_path / "in" / "a.parquet")
    res = run("pack", "-q", "-c", 7, "--source-column", "src", "--json", tmp_path / "in",
              tmp_path / "out")
    assert res.exit_code == 0, res.output
    packed = json.loads(res.output)
    stats = json.loads(run("stats", tmp_path / "out", "--json").output)
    compared = json.loads(run("compare", tmp_path / "in", "-c", 7, "--json").output)
    s = analyze_packed(tmp_path / "out").stats
    assert round(s.fill, 9) != round(s.fill, RATIO_DECIMALS)  # a ratio that needs rounding
    assert stats["stats"]["fill"] == round(s.fill, RATIO_DECIMALS)
    assert stats["stats"]["targets_per_token"] == round(s.targets_per_token, RATIO_DECIMALS)
    counts = set(PackStats.__dataclass_fields__) | {"rows", "padding_tokens", "real_tokens"}
    for report in (packed, stats, compared):
        floats = list(_float_paths(report))
        assert floats
        for path, x in floats:
            if path[-1] == "seconds":  # pack --json reports its run's time
                assert path == ("seconds",)
                continue
            assert path[-1] not in counts, path
            keep = RATIO_DECIMALS - 2 if path[-1].endswith("_pct") else RATIO_DECIMALS
            assert x == round(x, keep), (path, x)
    for totals in (stats["stats"], stats["manifest_totals"], packed["stats"]):
        assert all(isinstance(totals[k], int) for k in PackStats.__dataclass_fields__)
    assert stats["per_source"] and all(isinstance(v, int) for p in stats["per_source"]
                                       for k, v in p.items() if k != "source")


def _packed_many_rows(tmp_path):
    write_docs(tmp_path / "in" / "a.parquet", [[1] * (3 + i % 5) for i in range(40)])
    args = ["pack", "-q", "-c", 8, "--no-shuffle", "--rows-per-shard", 7]
    assert run(*args, tmp_path / "in", tmp_path / "out").exit_code == 0
    return tmp_path / "out"


def test_per_bin_limit_lists_the_first_rows_and_totals_every_row(tmp_path):
    out = _packed_many_rows(tmp_path)
    full = analyze_packed(out, per_bin=True)
    total = full.stats.effective_targets
    assert sum(b["targets"] for b in full.per_bin) == total
    res = run("stats", out, "--per-bin", "--per-bin-limit", 3, "--json")
    d = json.loads(res.output)
    assert [b["row"] for b in d["per_bin"]] == [0, 1, 2]
    assert d["per_bin"] == full.per_bin[:3]
    assert d["targets_total"] == total and d["per_bin_rows_listed"] == 3
    res = run("stats", out, "--per-bin", "--per-bin-limit", 3)
    assert f"first 3 of {full.stats.rows} rows" in res.output
    assert f"total targets {total:,}" in res.output
    d = json.loads(run("stats", out, "--per-bin", "--per-bin-limit", 0, "--json").output)
    assert len(d["per_bin"]) == full.stats.rows
    default = json.loads(run("stats", out, "--per-bin", "--json").output)
    assert len(default["per_bin"]) == min(full.stats.rows, 50)


def test_per_bin_columns_stay_aligned_whatever_the_shard_names(tmp_path):
    """Columns line up under their header for shard names of any length (a fixed width once
    broke on longer names)."""
    a = analyze_packed(_packed_many_rows(tmp_path), per_bin=True)
    for i, b in enumerate(a.per_bin):  # names longer than the old fixed width, and shorter
        b["shard"] = "part-00000-00000.parquet" if i % 2 else "p.parquet"
    lines = analysis.format_packed(a).splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("shard"))
    rows = [line for line in lines[head + 1:] if ".parquet" in line]
    assert len(rows) == len(a.per_bin)
    # the end of the "targets" column is at the same place on the header and every row
    end = lines[head].index("targets") + len("targets")
    for line in rows:
        assert line[end - 1].isdigit() and line[end] == " ", line


def _capture_figure(monkeypatch):
    figs = []

    def keep(plt, fig, out):
        figs.append(fig)

    monkeypatch.setattr(analysis, "_save", keep)
    return figs


def test_compare_plot_uses_log_scales_and_says_what_it_compares(monkeypatch, sample_lengths):
    pytest.importorskip("matplotlib")
    figs = _capture_figure(monkeypatch)
    analysis.plot_compare(sample_lengths, 2048, "unused.png")
    (fig,) = figs
    axes = {ax.get_title(): ax for ax in fig.axes}
    lengths = next(ax for t, ax in axes.items() if "document lengths" in t)
    padding = next(ax for t, ax in axes.items() if "padding" in t)
    fill = next(ax for t, ax in axes.items() if "fill" in t)
    assert lengths.get_xscale() == "log"  # 1 .. 16k tokens
    assert padding.get_yscale() in ("log", "symlog")  # 317 .. 426,301 tokens
    assert fill.get_yscale() == "log"
    assert [t.get_text() for t in padding.get_xticklabels()] == ["concat", "ordered", "obfd"]
    assert "least waste: obfd" in fig._suptitle.get_text()
    assert "capacity 2,048" in fig._suptitle.get_text()
    labels = " ".join(t.get_text() for t in padding.texts)
    assert "426,301" in labels and "2,365" in labels


def test_compare_plot_shows_the_options_of_the_table(monkeypatch):
    """--window-docs and --min-fill change the table; the plot draws the same runs (each
    strategy windowed beside the strategies, in its colour, the rows under --min-fill left
    out), not a default dry run."""
    pytest.importorskip("matplotlib")
    lengths = np.random.default_rng(3).integers(1, 300, 2_000)
    opts = dict(window_docs=300, min_fill=0.9)
    rows = analysis.compare_strategies(lengths, 256, **opts)
    figs = _capture_figure(monkeypatch)
    analysis.plot_compare(lengths, 256, "unused.png", **opts)
    (fig,) = figs
    axes = {ax.get_title(): ax for ax in fig.axes}
    padding = next(ax for t, ax in axes.items() if "padding" in t)
    fill = next(ax for t, ax in axes.items() if "fill" in t)
    assert [t.get_text() for t in padding.get_xticklabels()] == [r["strategy"] for r in rows]
    assert "obfd, windows of 300" in [t.get_text() for t in padding.get_xticklabels()]
    assert "concat, windows of 300" in [t.get_text() for t in padding.get_xticklabels()]
    colour = {r["strategy"]: b.get_facecolor() for r, b in zip(rows, padding.patches)}
    assert all(colour[f"{s}, windows of 300"] == colour[s] for s in ("concat", "ordered", "obfd"))
    assert [round(b.get_height()) for b in padding.patches] == [r["padding_tokens"] for r in rows]
    assert len(fill.patches) == len(rows)  # one fill curve a run
    assert [lg.get_text() for lg in fill.get_legend().get_texts()] == \
        [f"{r['strategy']} ({r['rows']:,} rows)" for r in rows]
    assert all(r["rows_dropped"] > 0 for r in rows if r["strategy"] == "concat")


def test_packed_plot_uses_log_scales(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    out = _packed_many_rows(tmp_path)
    figs = _capture_figure(monkeypatch)
    analysis.plot_packed(analyze_packed(out), "unused.png")
    (fig,) = figs
    fill, seg = fig.axes
    assert fill.get_yscale() == "log" and seg.get_xscale() == "log"
    assert "capacity" in " ".join(t.get_text() for t in seg.get_legend().get_texts())


def test_plot_that_cannot_be_written_is_one_line_exit_1(tmp_path, monkeypatch):
    """A plot is rendered in memory and published whole (temporary name, rename): a path that
    cannot be written is one line, exit 1, and leaves no partial image or temporary file."""
    pytest.importorskip("matplotlib")
    import os

    real = os.replace

    def refuse(src, dst):
        if str(dst).endswith("f.png"):
            raise PermissionError(13, "Permission denied")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", refuse)
    out = _packed_many_rows(tmp_path)
    plots = tmp_path / "plots"
    plots.mkdir()
    res = run("stats", out, "--plot", plots / "f.png")
    assert res.exit_code == 1 and "cannot write the plot (Permission denied)" in res.output
    assert "Traceback" not in res.output
    assert list(plots.iterdir()) == []
    monkeypatch.undo()
    assert run("stats", out, "--plot", plots / "f.png").exit_code == 0
    assert (plots / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_counts_are_integers(monkeypatch):
    """A shard bar reads 3/33, never 3.00/33.0; an open-ended document count may abbreviate."""
    from packtool.pipeline import _progress

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with _progress(33, "write", "shard", True) as bar:
        bar.update(3)
        bar.refresh()
    text = err.getvalue()
    assert "3/33" in text and "3.00" not in text and "33.0" not in text
    err.truncate(0)
    with _progress(None, "read", "doc", True) as bar:
        bar.update(812)
        bar.refresh()
    assert "812 doc" in err.getvalue()


def test_sample_figures_in_readme_name_the_least_wasteful(sample_lengths):
    """The README's table marks the strategy the verdict names (bold), so a reader sees it."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- begin: compare -->", 1)[1].split("<!-- end: compare -->", 1)[0]
    best = least_waste(compare_strategies(sample_lengths, 2048))["strategy"]
    assert f"| **{best}** |" in block and f"Least waste: **{best}**" in block


def test_plot_of_an_output_of_no_rows_is_drawn_without_warnings(tmp_path):
    """Every row left out (--min-fill 1): the plot is written, no log-scale warning (a log axis
    of no counts), exit 0."""
    import warnings

    pytest.importorskip("matplotlib")
    from packcheck import invoke, write_docs

    src = write_docs(tmp_path / "in.parquet", [[1, 2]])
    assert invoke(["pack", "-q", "-c", 4, "--min-fill", 1, src, tmp_path / "o"]).exit_code == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = invoke(["stats", tmp_path / "o", "--plot", tmp_path / "p.png"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("docs,flags", [
    ([list(range(1, 40))], ["-c", 16, "--overflow", "drop"]),  # no strategy writes a row
    ([[1, 2]], ["-c", 4, "--min-fill", 1]),  # every row under --min-fill
    ([list(range(1, 40)), [1, 2]], ["-c", 16, "--overflow", "drop"]),
    ([[5]], ["-c", 4]),  # one segment of one token
    ([[1, 2, 3, 4]] * 5, ["-c", 4]),  # every value equal: full rows, one length
    ([list(range(1, 40))], ["-c", 16, "--overflow", "truncate"]),
])
def test_every_plot_is_drawn_without_library_warnings(tmp_path, docs, flags):
    """compare --plot (alone, with --window-docs) and stats --plot of the same input: drawn,
    exit 0, no warning from matplotlib (a log axis of no positive count warned, with a source
    line); a panel with nothing to count says so on a linear axis from 0."""
    import warnings

    pytest.importorskip("matplotlib")
    from packcheck import invoke

    src = write_docs(tmp_path / "in.parquet", docs)
    assert invoke(["pack", "-q", *flags, src, tmp_path / "o"]).exit_code == 0
    runs = {"c.png": ["compare", *flags, src], "w.png": ["compare", *flags, "--window-docs", 1, src],
            "s.png": ["stats", tmp_path / "o"]}
    for png, cmd in runs.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = invoke([*cmd, "--plot", tmp_path / png])
        assert res.exit_code == 0, res.output
        assert [str(w.message) for w in caught] == [], cmd
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_plot_of_no_rows_says_so_on_a_linear_axis(monkeypatch):
    pytest.importorskip("matplotlib")
    figs = _capture_figure(monkeypatch)
    analysis.plot_compare(np.array([39]), 16, "unused.png", overflow="drop")
    (fig,) = figs
    fill = next(ax for ax in fig.axes if "fill" in ax.get_title())
    assert fill.get_title() == "rows per fill level: no strategy writes a row"
    assert fill.get_yscale() == "linear" and fill.get_ylim() == (0, 1)
    assert "no strategy writes a row" in fig._suptitle.get_text()


def test_compare_plot_of_empty_documents_names_no_log_axis(monkeypatch):
    """Documents of length 0 only: the lengths panel is drawn on a linear axis, so its label
    says nothing of a log scale, and its title says why it is empty."""
    pytest.importorskip("matplotlib")
    figs = _capture_figure(monkeypatch)
    analysis.plot_compare(np.array([0, 0]), 16, "unused.png")
    (fig,) = figs
    lengths = next(ax for ax in fig.axes if "document lengths" in ax.get_title())
    assert lengths.get_xscale() == "linear"
    assert "log" not in lengths.get_xlabel()
    assert lengths.get_title() == "input: document lengths: every document is empty"


@pytest.mark.parametrize("docs,flags,why", [
    ([[3]], ["--min-fill", "1"], "--min-fill 1 left out 1 planned row"),
    ([[3, 4, 5, 6, 7]], ["--overflow", "drop"], "--overflow drop"),
])
def test_per_bin_of_an_output_of_0_rows_reports_its_zeros_and_why(tmp_path, docs, flags, why):
    """An output of 0 rows: --per-bin still reports the listing (empty) and targets_total 0, in
    JSON and text (the keys were missing: a trainer reading targets_total got a KeyError), and
    stats warns why it is empty, in pack's words."""
    write_docs(tmp_path / "in" / "a.parquet", docs)
    res = run("pack", "-q", "-c", 4, *flags, tmp_path / "in", tmp_path / "out")
    assert res.exit_code == 0, res.output
    res = run("stats", "--per-bin", "--json", tmp_path / "out")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["per_bin"] == [] and d["targets_total"] == 0 and d["per_bin_rows_listed"] == 0
    assert any(why in w for w in d["warnings"]), d["warnings"]
    res = run("stats", "--per-bin", tmp_path / "out")
    assert "total targets 0 over 0 rows" in res.stdout
    assert f"WARNING: {why}" in res.stderr or any(
        line.startswith("WARNING:") and why in line for line in res.stderr.splitlines())
