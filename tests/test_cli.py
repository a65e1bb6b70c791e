"""The CLI through click's test runner: help, usage errors (exit 2), errors (exit 1, one line)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from packtool import __version__
from packtool.cli import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_help_lists_commands_and_pack_options():
    res = run("--help")
    assert res.exit_code == 0 and "pack" in res.output
    res = run("pack", "--help")
    assert res.exit_code == 0
    for opt in ("--capacity", "--strategy", "--overflow", "--labels", "--pad-id", "--append-eos",
                "--seed", "--no-shuffle", "--rows-per-shard", "--workers", "--overwrite"):
        assert opt in res.output


def test_help_command_and_bare_packtool_print_help_and_exit_0():
    """``packtool help`` was "No such command 'help'." (exit 2) and bare ``packtool`` printed
    the help with exit 2: ``packtool help [COMMAND]`` prints the help of packtool or of
    COMMAND and bare ``packtool`` the help, exit 0; an unknown COMMAND is click's usage
    error."""
    whole = run("--help")
    for args in ((), ("help",)):
        res = run(*args)
        assert res.exit_code == 0, res.output
        assert res.output == whole.output, res.output
    for command in ("pack", "verify", "help"):
        res = run("help", command)
        assert res.exit_code == 0, res.output
        assert res.output == run(command, "--help").output, res.output
    res = run("help", "pakc")
    assert res.exit_code == 2 and "No such command 'pakc'" in res.output, res.output


def test_verify_help_names_every_check_it_accepts():
    """--check took schema, input_ids, padding, doc_offsets and totals; its help left them out."""
    import re

    from packtool.verify.checks import ALL_CHECKS

    res = run("verify", "--help")
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    at = text.index("--check NAME")
    listed = set(re.findall(r"\b[a-z_]+\b", text[at:text.index("[default: all]", at)]))
    assert set(ALL_CHECKS) <= listed, sorted(set(ALL_CHECKS) - listed)


def test_version():
    res = run("--version")
    assert res.exit_code == 0 and __version__ in res.output


def test_unknown_strategy_is_a_usage_error(docs_dir, tmp_path):
    res = run("pack", docs_dir([[1]]), tmp_path / "o", "--strategy", "nope")
    assert res.exit_code == 2


def test_missing_output_is_a_usage_error(docs_dir):
    res = run("pack", docs_dir([[1]]))
    assert res.exit_code == 2 and "OUTPUT" in res.output


def test_capacity_below_two_is_refused_in_one_line(docs_dir, tmp_path):
    """A bad option value is a usage error (exit 2), in one line naming the option."""
    res = run("pack", docs_dir([[1]]), tmp_path / "o", "--capacity", "1")
    assert res.exit_code == 2
    assert "--capacity 1" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_row_window_of_one_token_is_a_usage_error(docs_dir, tmp_path):
    """verify --row-window 1 was accepted (the range allowed 0 up), then failed saying no
    attention check ran on a row of two documents: a window needs 2 tokens. One line, exit 2,
    before any work, from the CLI and from run_verify alike; 0 (whole rows) and 2 still run."""
    import pytest

    from packtool.errors import ConfigError
    from packtool.verify.checks import run_verify

    out = tmp_path / "o"
    assert run("pack", "-q", "-c", 4, docs_dir([[1, 2], [3, 4, 5], [6]]), out).exit_code == 0
    for bad in ("1", "-1"):
        res = run("verify", "--data-only", "--row-window", bad, out)
        assert res.exit_code == 2, res.output
        assert f"--row-window {bad}: a window holds 2 tokens or more (0: whole rows)" \
            in res.output and len(res.output.strip().splitlines()) == 1, res.output
        with pytest.raises(ConfigError, match="0 \\(whole rows\\) or >= 2 tokens"):
            run_verify(out, data_only=True, row_window=int(bad))
    for good in ("0", "2"):
        res = run("verify", "--data-only", "--row-window", good, out)
        assert res.exit_code == 0, res.output
    text = " ".join(run("verify", "--help").output.split())
    assert "2 or more, or 0 for whole rows" in text
    # the exit rule names its exception: no row of two documents, no isolation to require
    assert ("an output of one document per row has no such row: isolation is skipped there, "
            "not required") in text


def test_debug_shows_the_exception(docs_dir, tmp_path):
    res = run("--debug", "pack", docs_dir([[1]]), tmp_path / "o", "--capacity", "1")
    assert res.exit_code == 1 and type(res.exception).__name__ == "ConfigError"


def test_module_entry_point_runs():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "packtool", "--version"], capture_output=True,
                         text=True, check=True)
    assert __version__ in out.stdout


def test_file_uris_are_the_local_paths(tmp_path, monkeypatch):
    """``file:///abs/path`` for INPUT and OUTPUT (and for ``compare``) means the local
    path: the same bytes, nothing written under a ``file:`` folder of the working directory."""
    from packcheck import hash_tree, invoke, write_docs

    monkeypatch.chdir(tmp_path)
    write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]])
    ref = invoke(["pack", "-q", "-c", 4, tmp_path / "in", tmp_path / "ref"])
    assert ref.exit_code == 0, ref.output
    res = invoke(["pack", "-q", "-c", 4, f"file://{tmp_path}/in", f"file://{tmp_path}/out"])
    assert res.exit_code == 0, res.output
    assert hash_tree(tmp_path / "out") == hash_tree(tmp_path / "ref")
    assert not (tmp_path / "file:").exists()
    local = invoke(["compare", tmp_path / "in", "-c", 4, "--json"])
    uri = invoke(["compare", f"file://{tmp_path}/in", "-c", 4, "--json"])
    assert uri.exit_code == 0 and uri.output == local.output, uri.output


def test_file_uris_are_percent_decoded_as_rfc_8089_and_pyarrow_read_them(tmp_path):
    """``Path.as_uri()`` of a folder with a space names that folder, and ``a%41.parquet`` names
    ``aA.parquet`` (not a file called ``a%41.parquet``), as ``pyarrow.fs`` reads the URI."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from packcheck import invoke, write_docs

    from packtool.location import Location

    write_docs(tmp_path / "my data" / "aA.parquet", [[1, 2, 3]])
    write_docs(tmp_path / "my data" / "a%41.parquet", [[7, 7, 7, 7, 7]])
    for uri in [(tmp_path / "my data").as_uri(), (tmp_path / "my data").as_uri() + "/a%41.parquet",
                f"file:{tmp_path}/my%20data/a%41.parquet?x=1#y"]:
        assert str(Location.parse(uri)) == pafs.FileSystem.from_uri(uri)[1]
    res = invoke(["pack", "-q", "-c", 8, (tmp_path / "my data").as_uri() + "/a%41.parquet",
                  tmp_path / "out"])
    assert res.exit_code == 0, res.output
    assert pq.read_table(tmp_path / "out").column("input_ids").to_pylist() == [
        [1, 2, 3, 0, 0, 0, 0, 0]]


def test_a_file_uri_names_localhost_or_is_refused_never_a_path_at_the_root(tmp_path,
                                                                          monkeypatch):
    """``file://localhost/p`` was read as the POSIX path ``//localhost/p``: pack wrote OUTPUT
    under ``/localhost/...`` (exit 0), ``file://HOST/p`` under ``/HOST/p`` and ``file://out``
    into ``/out`` at the filesystem root; as INPUT it was "no such file". RFC 8089: localhost
    (any case) is this machine, so it names ``/p``; any other host, and ``file:out`` (no
    absolute path: it was a folder literally named ``file:out``), is refused in one line
    naming the fix, exit 1 (as a URI that cannot be opened), nothing written anywhere, by
    every command that takes a location."""
    import shutil
    import uuid
    from pathlib import Path

    from packcheck import hash_tree, invoke, write_docs

    monkeypatch.chdir(tmp_path)
    write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]])
    assert invoke(["pack", "-q", "-c", 4, tmp_path / "in", "ref"]).exit_code == 0
    res = invoke(["pack", "-c", 4, f"file://localhost{tmp_path}/in",
                  f"file://LocalHost{tmp_path}/LH"])
    assert res.exit_code == 0, res.output
    assert hash_tree(tmp_path / "LH") == hash_tree(tmp_path / "ref")
    assert f"-> {tmp_path}/LH\n" in res.output, res.output
    local = invoke(["compare", "in", "-c", 4, "--json"])
    uri = invoke(["compare", f"file://localhost{tmp_path}/in", "-c", 4, "--json"])
    assert uri.exit_code == 0 and uri.output == local.output, uri.output
    stats = invoke(["stats", f"file://localhost{tmp_path}/LH"])
    assert stats.exit_code == 0 and f"packed output {tmp_path}/LH " in stats.output

    host = f"packtool-test-{uuid.uuid4().hex[:12]}"  # what a mis-read would create at the root
    made = [Path("/") / host, tmp_path / f"file:{host}", tmp_path / "file:"]
    pack_out, ref = f"file://{host}/p", f"file://{host}{tmp_path}/in"
    try:
        for args, shown in (
                (["pack", "-c", 4, "in", pack_out], pack_out),
                (["pack", "-c", 4, "in", f"file://{host}"], f"file://{host}"),
                (["pack", "-c", 4, ref, "out"], ref),
                (["tokenize", "--tokenizer", "t.json", "in", pack_out], pack_out),
                (["compare", ref, "-c", 4], ref),
                (["stats", f"file://{host}{tmp_path}/ref"], f"file://{host}{tmp_path}/ref"),
                (["verify", f"file://{host}{tmp_path}/ref"], f"file://{host}{tmp_path}/ref"),
                (["export", "--to", "nemo", "ref", pack_out], pack_out),
                (["stats", "ref", "--plot", f"file://{host}/p.png"], f"file://{host}/p.png")):
            res = invoke(args)
            assert res.exit_code == 1, (args, res.output)
            assert res.output.strip().splitlines() == [
                f"Error: {shown}: names the host '{host}', and a file: URI names a file of this "
                "machine (its host empty or localhost, no user); write file:///ABS/PATH (or "
                "file://localhost/ABS/PATH), or a plain path"
                + (f" such as {host}" if shown == f"file://{host}" else "")], (args, res.output)
        for given in ("file:out", "file:", "file://", "file://localhost"):
            res = invoke(["pack", "-c", 4, "in", given])
            assert res.exit_code == 1, res.output
            fix = " such as out" if given == "file:out" else ""
            assert res.output.strip().splitlines() == [
                f"Error: {given}: not a file: URI (one names an absolute path: "
                f"file:///ABS/PATH); write file:///ABS/PATH, or a plain path{fix}"], res.output
        res = invoke(["pack", "-c", 4, "file:in", "out"])
        assert res.exit_code == 1 and "Error: file:in: not a file: URI" in res.output
        assert not any(p.exists() for p in made) and not (tmp_path / "out").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["LH", "in", "ref"]
    finally:
        if made[0].exists():  # only without the fix: what it wrote at the root
            shutil.rmtree(made[0])


def test_location_parse_reads_file_uris_as_pyarrow_and_rfc_8089_do(tmp_path):
    """Every ``file:`` URI pyarrow reads names the path pyarrow names; ``localhost`` (RFC 8089:
    this machine) is no host; every other host, and a URI without an absolute path, is a
    :class:`LocationError` (an InputError and an OutputError); an empty path too (it was an
    internal error)."""
    import pyarrow.fs as pafs
    import pytest

    from packtool.errors import InputError, LocationError, OutputError
    from packtool.location import Location

    for uri in ("file:///p/a", "file:/p/a", "file:////p", "file:///", "file:///a%20b?x#y"):
        assert str(Location.parse(uri)) == pafs.FileSystem.from_uri(uri)[1], uri
    for uri in ("file://localhost/p/a", "FILE://LOCALHOST/p/a", "file://%6Cocalhost/p/a"):
        assert str(Location.parse(uri)) == "/p/a", uri
    for bad in ("file://example.com/p", "file://t3relout", "file://u:secret@localhost/p",
                "file://localhost:80/p", "file:t21/x", "file:", "file://", "file://localhost",
                "file://localhost?x=1", "file:%2Fp", ""):
        with pytest.raises(LocationError) as got:
            Location.parse(bad)
        assert isinstance(got.value, InputError) and isinstance(got.value, OutputError)
        assert "\n" not in str(got.value) and "secret" not in str(got.value)
    (tmp_path / "file:x").mkdir()  # a folder of that name: reached by any other spelling
    assert Location.parse(tmp_path / "file:x").is_dir()


_FIX = ("which pyarrow's store client drops or resolves on some calls and not on others, so "
        "packtool would write and find different objects")


@pytest.mark.parametrize("given, shown, fix", [
    ("s3://pkd/./tr", "s3://pkd/./tr", "s3://pkd/tr"),
    ("s3://pkd/q/../dd", "s3://pkd/q/../dd", "s3://pkd/dd"),
    ("s3://pkd//dbl/", "s3://pkd//dbl", "s3://pkd/dbl"),
    ("s3://pkd/out/.", "s3://pkd/out/.", "s3://pkd/out"),
    ("s3://pkd/./", "s3://pkd/.", "s3://pkd"),
    ("s3:/pkd/a/./b", "s3://pkd/a/./b", "s3://pkd/a/b"),  # as pathlib folds it
    ("gs://b/x//y/../z", "gs://b/x//y/../z", "gs://b/x/z"),
    ("s3://pkd/a//b?endpoint_override=h:9&secret_key=S3CRET&scheme=http",
     "s3://pkd/a//b?endpoint_override=h:9&scheme=http",
     "s3://pkd/a/b?endpoint_override=h:9&scheme=http"),
    ("s3://AKIA:S3CRET@pkd/./x", "s3://pkd/./x", "s3://pkd/x"),
    ("s3://pkd/..", "s3://pkd/..", None), ("s3://pkd/a/../..", "s3://pkd/a/../..", None),
    ("s3://./x", "s3://./x", None), ("s3://../pkd/x", "s3://../pkd/x", None)])
def test_a_store_key_with_dot_or_empty_segments_is_refused_naming_its_plain_spelling(
        given, shown, fix):
    """``s3://pkd/./tr`` was written as ``tr/...`` (pyarrow's S3 client drops ``./`` and
    resolves ``../`` when it writes) but listed as ``./tr/``: pack found no output there and
    replaced the manifest of a finished one (exit 0, shards of two packs mixed); ``s3://pkd//x``
    was written as ``x/...`` and copied as ``/x/...`` (a failure no rerun finished). A store
    key with a ``.``, ``..`` or empty segment is refused by :meth:`Location.parse`, in one line
    naming the plain spelling to write (none when ``..`` climbs to the bucket or the bucket is
    ``.``), secrets left out."""
    from packtool.errors import InputError, LocationError, OutputError
    from packtool.location import Location

    with pytest.raises(LocationError) as got:
        Location.parse(given)
    assert isinstance(got.value, InputError) and isinstance(got.value, OutputError)
    text = str(got.value)
    assert "\n" not in text and "S3CRET" not in text and "AKIA" not in text, text
    what = text.split(": ", 1)[1].split(", which")[0]
    assert text.startswith(f"{shown}: the key holds "), text
    assert set(what.removeprefix("the key holds ").split(" and ")) <= {"'.'", "'..'", "'//'"}
    if fix is not None:
        assert text.endswith(f", {_FIX}; write it as {fix}"), text
        assert Location.parse(fix).display == fix  # the spelling named is accepted
    else:
        assert text.endswith(f", {_FIX}; the bucket comes first: write SCHEME://BUCKET/KEY "
                             "without '.', '..' or empty segments"), text


def test_store_keys_keep_trailing_slashes_and_names_that_are_not_dot_segments(tmp_path,
                                                                            monkeypatch):
    """A trailing ``/`` (or ``///``) after a store key is no segment: accepted as today, as are
    names that only begin with dots (``.j``, ``..x``, ``...``) and a ``./`` in the query. Local
    paths keep ``.`` and ``..`` (a real filesystem resolves them the same for every call). A
    URI of no bucket (``s3://``) is refused (it was read as the bucket of the first file
    asked for, ``s3://.packtool-manifest.parquet``)."""
    from packtool.errors import LocationError
    from packtool.location import Location

    for given in ("s3://", "s3:///", "gs://?endpoint_override=h:9"):
        with pytest.raises(LocationError, match=r"^[a-z0-9]+://(\?\S+)?: names no bucket; "
                                                r"write (s3|gs)://BUCKET/KEY$"):
            Location.parse(given)
    for given, key in (("s3://pkd/out/", "pkd/out"), ("s3://pkd/out///", "pkd/out"),
                       ("s3://pkd", "pkd"), ("s3://pkd/", "pkd"), ("s3:///pkd/out", "pkd/out"),
                       ("s3://pkd/i/.j/..x/...", "pkd/i/.j/..x/..."),
                       ("s3://pkd/o?endpoint_override=./h//x", "pkd/o")):
        assert Location.parse(given).key == key, given
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    for given in ("./a/../a/./b", "a//b", "../" + tmp_path.name + "/a/b",
                  f"file://{tmp_path}/a/../a/./b"):
        loc = Location.parse(given)
        assert loc.is_local and loc.is_dir(), given
        assert loc.path.resolve() == (tmp_path / "a" / "b").resolve(), given


# -- a mistyped last INPUT taken as OUTPUT; messages that name the fix -------------------------


def test_missing_output_named_like_an_input_file_is_refused(docs_dir, tmp_path, monkeypatch):
    """pack a.parquet b.parquet with b mistyped packed a alone into a new folder b.parquet."""
    src = docs_dir([[1, 2, 3]])
    monkeypatch.chdir(src)
    for args in (("pack", "a.parquet", "part-0001.parquet"),
                 ("pack", "a.parquet", "o", "--holdout", "0.5", "--holdout-output",
                  "held.parquet"),
                 ("tokenize", "--tokenizer", "tok.json", "a.parquet", "b.jsonl.gz"),
                 ("pack", "a.parquet", "x.arrow")):
        res = run(*args)
        assert res.exit_code == 2, (args, res.output)
        line = res.output.strip().splitlines()[-1]
        name = args[-1]
        assert name in line and "mistyped INPUT" in line and f"{name}/" in line, line
    assert sorted(p.name for p in src.iterdir()) == ["a.parquet"]
    res = run("pack", "a.parquet", "part-0001.parquet/", "-q")  # the slash: a folder, as asked
    assert res.exit_code == 0, res.output
    assert (src / "part-0001.parquet" / ".packtool-manifest.parquet").exists() or any(
        (src / "part-0001.parquet").iterdir())
    res = run("pack", "a.parquet", "part-0001.parquet", "-q")  # exists now: fine
    assert res.exit_code == 0, res.output


def test_export_dest_named_like_an_input_file_is_refused(docs_dir, tmp_path):
    src = docs_dir([[1, 2, 3], [4, 5]])
    out = tmp_path / "o"
    assert run("pack", src, out, "-c", "4", "-q").exit_code == 0
    res = run("export", out, tmp_path / "nemo.parquet", "--to", "nemo")
    assert res.exit_code == 2 and "mistyped" in res.output and "nemo.parquet/" in res.output
    assert not (tmp_path / "nemo.parquet").exists()


def test_float_and_string_token_columns_name_the_fix(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": pa.array([[1.0, 2.0]], pa.list_(pa.float64())),
                             "ids": [[1, 2]], "source": ["a"]}), tmp_path / "f.parquet")
    pq.write_table(pa.table({"text": ["hello"]}), tmp_path / "t.parquet")
    res = run("pack", tmp_path / "f.parquet", tmp_path / "o")
    assert res.exit_code == 1 and "cast" in res.output and "tokenize the text" not in res.output
    res = run("pack", tmp_path / "f.parquet", tmp_path / "o", "--column", "source")
    assert res.exit_code == 1 and "--column ids" in res.output, res.output
    assert "tokenize" not in res.output
    res = run("pack", tmp_path / "t.parquet", tmp_path / "o", "--column", "text")
    assert res.exit_code == 1 and "packtool tokenize --tokenizer FILE" in res.output, res.output


def test_rerun_refusal_names_what_changed(docs_dir, tmp_path):
    import os
    import time

    src = docs_dir([[1, 2, 3], [4, 5]])
    out = tmp_path / "o"
    assert run("pack", src, out, "-c", "4", "-q").exit_code == 0
    res = run("pack", src, out, "-c", "4", "--rows-per-shard", "100", "-q")
    assert res.exit_code == 1 and "--rows-per-shard 8192 -> 100" in res.output, res.output
    f = src / "a.parquet"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, time.time_ns() + 10**9))  # touched after the pack
    res = run("pack", src, out, "-c", "4", "-q")
    assert res.exit_code == 1 and "mtime" in res.output and "a.parquet" in res.output, res.output
    docs_dir([[7, 8]], name="b.parquet")
    res = run("pack", src, out, "-c", "4", "-q")
    assert res.exit_code == 1 and "added" in res.output and "b.parquet" in res.output, res.output


def test_counts_agree_with_their_nouns(docs_dir, tmp_path):
    src = docs_dir([[1, 2, 3, 4, 5, 6]])
    res = run("pack", src, tmp_path / "o", "-c", "4", "--overflow", "truncate", "-q")
    assert "1 documents" not in res.output and "1 document over" in res.output, res.output
    res = run("export", tmp_path / "o", tmp_path / "n", "--to", "nemo")
    assert res.exit_code == 0 and "exported 1 row " in res.output, res.output


def test_append_eos_token_string_and_named_tokenizer_say_what_to_pass(docs_dir, tmp_path):
    src = docs_dir([[1, 2, 3]])
    res = run("pack", src, tmp_path / "o", "--append-eos", "</s>")
    assert res.exit_code == 2 and "packtool tokenize" in res.output, res.output
    res = run("tokenize", "--tokenizer", "gpt2", src, tmp_path / "t")
    assert res.exit_code != 0 and "download" in res.output and "tokenizer.json" in res.output


def test_mostly_padding_warns(docs_dir, tmp_path):
    src = docs_dir([[1] * 300, [2] * 200])
    res = run("pack", src, tmp_path / "o", "-c", "4096", "-q")
    assert res.exit_code == 0 and "WARNING" in res.output and "padding" in res.output, res.output


def test_stats_suggestion_on_raw_input_with_other_files_runs(docs_dir, tmp_path):
    src = docs_dir([[1, 2, 3], [4, 5]])
    (src / "data.csv").write_text("a,b\n")
    res = run("stats", src)
    assert res.exit_code == 1
    import shlex

    cmd = res.output.split("run: ", 1)[1].strip().split(" (NAME")[0]
    args = shlex.split(cmd.replace("--capacity C", "--capacity 8"))
    assert args[0] == "packtool"
    again = run(*args[1:])
    assert again.exit_code == 0, (cmd, again.output)
    # verify's suggestion (pack, then verify): its pack runs as printed too
    res = run("verify", src)
    assert res.exit_code == 1
    cmd = res.output.split("run: ", 1)[1].strip().split(", then ")[0]
    out = tmp_path / "packed"
    args = shlex.split(cmd.replace("--capacity C", "--capacity 8").replace("OUTPUT", str(out)))
    again = run(*args[1:])
    assert again.exit_code == 0, (cmd, again.output)
    (src / "data.csv").unlink()  # nothing to skip: the option is not suggested
    assert "--skip-unsupported" not in run("stats", src).output


@pytest.mark.parametrize("query,seconds", [("", 20), ("?retry_limit_seconds=5", 5)])
def test_a_gcs_location_stops_retrying_soon_unless_told_otherwise(query, seconds):
    """pyarrow's GCS client retries for 15 minutes by default, so a gs:// URI without
    credentials (or a typo of a bucket on a machine without them) waited 15 minutes with no
    message: a gs:// location retries for 20 s unless its URI gives retry_limit_seconds."""
    import datetime

    pytest.importorskip("pyarrow._gcsfs")
    from packtool.location import Location

    fs, _ = Location.parse(f"gs://some-bucket/x{query}").filesystem()
    assert fs.__reduce__()[1][0]["retry_time_limit"] == datetime.timedelta(seconds=seconds)


def test_a_gcs_location_without_credentials_is_told_to_set_them_not_to_check_an_endpoint():
    """A gs:// call on a machine without Google credentials fails with the client's network
    error (it asks a metadata server it cannot resolve), which was worded as S3's: check
    endpoint_override or AWS_ENDPOINT_URL. It now names the credentials and how to set them;
    an unreachable store of another scheme is not told about AWS_ENDPOINT_URL either."""
    from packtool.location import Location

    text = ("google::cloud::Status(UNAVAILABLE: Retry policy exhausted, with a last message of "
            "Could not create a OAuth2 access token to authenticate the request. The underlying "
            "error message was: PerformWork() - CURL error [6]=Could not resolve hostname)")
    told = str(Location.parse("gs://some-bucket/x").store_error(OSError(text)))
    assert "no Google credentials" in told and "GOOGLE_APPLICATION_CREDENTIALS" in told, told
    assert "AWS" not in told and "\n" not in told
    down = str(Location.parse("hdfs://host:1/x").store_error(OSError("Couldn't connect")))
    assert "cannot reach the store" in down and "AWS_ENDPOINT_URL" not in down, down
    s3 = str(Location.parse("s3://bkt/x").store_error(OSError("Couldn't connect")))
    assert "AWS_ENDPOINT_URL" in s3, s3
