"""One exit-status rule for every command: 0 ok, 1 data/IO (bad or missing input, a failed check),
2 usage (a command line that cannot run), 130 interrupted; every error is one ``Error:`` line
and no traceback unless ``--debug`` is given."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from packtool.cli import cli
from packtool.errors import ConfigError, EXIT_DATA, EXIT_INTERRUPTED, EXIT_USAGE, InputError

from conftest import write_docs


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_error(res, code: int, *words: str, one_line: bool = True):
    """Exit ``code``; exactly one ``Error:`` line holding ``words``; no traceback. Errors of
    packtool's own are that one line alone; click's parser errors also print the usage line."""
    assert res.exit_code == code, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, res.output
    if one_line:
        assert res.output.strip() == errors[0], res.output
    for w in words:
        assert w in errors[0], (w, errors[0])


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A small packed output: 3 documents at C = 8 (2 rows)."""
    root = tmp_path_factory.mktemp("packed")
    write_docs(root / "in" / "a.parquet", [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10]])
    res = run("pack", "-q", "-c", 8, "--no-shuffle", root / "in", root / "out")
    assert res.exit_code == 0, res.output
    return root


# ---- usage errors: exit 2 --------------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["pack", "--capacity", 1], ["--capacity 1"]),
    (["pack", "--rows-per-shard", 0], ["--rows-per-shard 0"]),
    (["pack", "--workers", 0], ["--workers 0"]),
    (["pack", "--pad-id", -1], ["--pad-id -1"]),
    (["pack", "--append-eos", 2**31], ["--append-eos"]),
    (["pack", "--row-group-mb", "inf"], ["--row-group-mb inf"]),
])
def test_pack_bad_option_values_exit_2_in_one_line(packed, tmp_path, args, words):
    """Every out-of-range option value is a usage error, whichever layer checks it."""
    res = run(*args, packed / "in", tmp_path / "o")
    assert_error(res, EXIT_USAGE, *words)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ["pack", "--window-docs", 0, "IN", "OUT"],
    ["pack", "--strategy", "nope", "IN", "OUT"],
    ["pack", "--no-such-option", "IN", "OUT"],
    ["pack", "IN"],
    ["stats"],
    ["stats", "IN", "--overflow", "nope"],
    ["compare", "IN"],
    ["compare", "IN", "-c", 8, "--overflow", "nope"],
    ["verify"],
    ["verify", "OUT", "--backend", "nope"],
    ["nope"],
])
def test_malformed_command_lines_exit_2(packed, args):
    """click's parser errors: exit 2, one Error line after the usage line, for every command."""
    args = [packed / "in" if a == "IN" else packed / "out" if a == "OUT" else a for a in args]
    assert_error(run(*args), EXIT_USAGE, one_line=False)


@pytest.mark.parametrize("args,words", [
    (["stats", "OUT", "--per-bin-limit", 3], ["--per-bin-limit applies with --per-bin"]),
    (["stats", "OUT", "--capacity", 8], ["--capacity", "packtool compare", "--capacity 8"]),
    (["stats", "IN", "-c", 2048], ["packtool compare", "in --capacity 2048"]),
    (["stats", "OUT", "--column", "x"], ["--column", "packtool compare"]),
    (["stats", "OUT", "OUT"], ["one packed OUTPUT"]),
    (["compare", "IN", "-c", 1], ["--capacity 1"]),
    (["compare", "IN", "-c", 8, "--labels-column", "input_ids"], ["token column"]),
])
def test_stats_and_compare_option_combinations_that_do_not_apply_exit_2(packed, args, words):
    args = [packed / "in" if a == "IN" else packed / "out" if a == "OUT" else a for a in args]
    assert_error(run(*args), EXIT_USAGE, *words)


@pytest.mark.parametrize("args,words", [
    (["stats", "IN", "--compare"], ["--compare needs --capacity C"]),
    (["stats", "IN", "-c", 8, "--compare", "--per-bin"], ["--per-bin", "dry run"]),
])
def test_deprecated_stats_compare_keeps_its_checks(packed, args, words):
    args = [packed / "in" if a == "IN" else packed / "out" if a == "OUT" else a for a in args]
    res = run(*args)
    assert_error(res, EXIT_USAGE, *words, one_line=False)
    assert "deprecated" in res.output and "packtool compare" in res.output


@pytest.mark.parametrize("args,words", [
    (["--rows", -1], ["--rows", "-1"]),
    (["--max-memory", "inf"], ["--max-memory", "inf"]),
    (["--max-memory", "1e400"], ["--max-memory"]),
    (["--max-memory", 0], ["--max-memory", "64 MiB"]),
])
def test_verify_bad_option_values_exit_2_before_any_work(packed, args, words):
    """An out-of-range verify option is a usage error (exit 2) given before the column scan,
    never an internal error nor a run over every row."""
    res = run("verify", *args, packed / "out")
    assert_error(res, EXIT_USAGE, *words, one_line=False)
    assert "checking" not in res.output and "PASS" not in res.output, res.output


@pytest.mark.parametrize("name,words", [
    ("x.txt", [".png", "image format"]),
    ("x", [".png"]),
    ("no/such/dir/x.png", ["does not exist"]),
    (".", ["is a directory"]),
])
@pytest.mark.parametrize("compare", [False, True])
def test_plot_bad_suffix_or_path_is_a_one_line_usage_error(packed, tmp_path, name, words,
                                                           compare):
    """--plot is checked before any work: no traceback, no file named like the argument."""
    target = tmp_path / name if name != "." else tmp_path
    args = ["compare", packed / "in", "-c", 8] if compare else ["stats", packed / "out"]
    res = run(*args, "--plot", target)
    assert_error(res, EXIT_USAGE, "--plot", *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("compare", [False, True])
def test_a_plot_directory_that_cannot_be_written_is_refused_before_any_work(packed, tmp_path,
                                                                           compare):
    """--plot into a directory that cannot be written: the whole report (sha256 of every shard
    included) used to run first, then 'cannot write the plot'; refused up front now."""
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        if os.access(ro, os.W_OK) and os.geteuid() == 0:  # root writes anywhere: /proc then
            target = "/proc/stats.png"
        else:
            target = ro / "stats.png"
        args = ["compare", packed / "in", "-c", 8] if compare else ["stats", packed / "out"]
        res = run(*args, "--plot", target)
        assert_error(res, EXIT_USAGE, "--plot", "cannot write in")
        assert "rows" not in res.output and "sha256" not in res.output
    finally:
        os.chmod(ro, 0o755)


def test_plot_suffix_picks_the_image_format(packed, tmp_path):
    pytest.importorskip("matplotlib")
    for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")):
        out = tmp_path / f"fig{suffix}"
        res = run("stats", packed / "out", "--plot", out)
        assert res.exit_code == 0, res.output
        assert out.read_bytes().startswith(magic)


# ---- missing input: exit 1 in every command ---------------------------------------------------

@pytest.mark.parametrize("args", [
    ["pack", "MISSING", "OUTDIR"],
    ["stats", "MISSING"],
    ["compare", "MISSING", "-c", 8],
    ["verify", "MISSING"],
])
def test_missing_input_exits_1_in_every_command(tmp_path, args):
    missing = tmp_path / "no-such-dir"
    args = [missing if a == "MISSING" else tmp_path / "o" if a == "OUTDIR" else a for a in args]
    assert_error(run(*args), EXIT_DATA, str(missing), "no such file or directory")


# ---- data errors: exit 1 ----------------------------------------------------------------------

def test_data_errors_exit_1_in_every_command(packed, tmp_path):
    write_docs(tmp_path / "neg" / "a.parquet", [[1, 2], [3, -5]])
    assert_error(run("pack", "-q", tmp_path / "neg", tmp_path / "o"), EXIT_DATA,
                 "row 1 (0-based)", "negative")
    assert_error(run("compare", tmp_path / "neg", "-c", 8), EXIT_DATA, "negative")
    # raw input given where a packed output is expected, and the other way round
    assert_error(run("stats", packed / "in"), EXIT_DATA, "tokenized input",
                 "packtool compare")
    assert_error(run("compare", packed / "out", "-c", 8), EXIT_DATA, "is a packed output",
                 "packtool stats")
    assert_error(run("verify", packed / "in"), EXIT_DATA, "tokenized input", "packtool pack")
    assert_error(run("verify", packed / "in" / "a.parquet"), EXIT_DATA, "is tokenized input",
                     "packtool pack --capacity C")


def test_stats_recount_mismatch_exits_1(packed, tmp_path):
    """A shard changed after packing (its last row removed): the recount disagrees, exit 1."""
    import shutil

    sys.path.insert(0, str(Path(__file__).parent / "verify"))
    from packed_helpers import edit_rows

    out = tmp_path / "out"
    shutil.copytree(packed / "out", out)
    edit_rows(out, lambda rows: rows[:-1])
    res = run("stats", out)
    assert res.exit_code == EXIT_DATA and "Traceback" not in res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("Error:") and "differs from the manifest" in last


# ---- interrupted: exit 130; unexpected failures: one line, traceback with --debug -------------

def test_ctrl_c_exits_130_in_every_command(packed, tmp_path, monkeypatch):
    import packtool.analysis
    import packtool.pipeline
    import packtool.verify.checks

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(packtool.pipeline, "run_pack", interrupt)
    monkeypatch.setattr(packtool.analysis, "analyze_packed", interrupt)
    monkeypatch.setattr(packtool.analysis, "input_lengths", interrupt)
    monkeypatch.setattr(packtool.analysis, "input_documents", interrupt)
    monkeypatch.setattr(packtool.verify.checks, "run_verify", interrupt)
    # stopped before it entered OUTPUT: nothing of it is kept, so nothing to resume
    assert_error(run("pack", "-q", packed / "in", tmp_path / "o"), EXIT_INTERRUPTED,
                 "interrupted", "nothing was kept", "a rerun starts from the beginning")
    assert_error(run("stats", packed / "out"), EXIT_INTERRUPTED, "interrupted")
    assert_error(run("compare", packed / "in", "-c", 8), EXIT_INTERRUPTED, "interrupted")
    assert_error(run("verify", packed / "out"), EXIT_INTERRUPTED, "interrupted")


@pytest.mark.parametrize("exc,code,words", [
    (ValueError("boom"), EXIT_DATA, ["internal error", "ValueError: boom", "--debug"]),
    (PermissionError(13, "Permission denied", "/x/y"), EXIT_DATA,
     ["/x/y: permission denied: fix its permissions"]),
    (InputError("bad input"), EXIT_DATA, ["bad input"]),
    (ConfigError("--x 1: bad"), EXIT_USAGE, ["--x 1: bad"]),
])
def test_any_failure_is_one_line_and_debug_shows_the_traceback(packed, monkeypatch, exc, code,
                                                               words):
    import packtool.analysis

    def fail(*a, **k):
        raise exc

    monkeypatch.setattr(packtool.analysis, "analyze_packed", fail)
    assert_error(run("stats", packed / "out"), code, *words)
    res = run("--debug", "stats", packed / "out")
    assert res.exception is exc


def test_success_exits_0(packed):
    for args in (["stats", packed / "out"], ["compare", packed / "in", "-c", 8],
                 ["stats", packed / "in", "-c", 8, "--compare"],
                 ["stats", packed / "out", "--per-bin", "--json"]):
        res = run(*args)
        assert res.exit_code == 0, res.output
