"""Messages a new user meets: each names what happened and the command that fits, before any
long work, and a lossy setting is never silent."""

from __future__ import annotations

import sys

import pytest

from packcheck import invoke, write_docs


@pytest.fixture
def raw(tmp_path):
    return write_docs(tmp_path / "data" / "a.parquet", [[1, 2, 3], [4, 5]]).parent


@pytest.mark.parametrize("command", ["verify", "stats", "upgrade"])
def test_raw_input_given_as_output_names_the_right_command(raw, command):
    """Raw tokenized input is no interrupted pack: no 'rerun packtool pack to finish it'
    (upgrade said "not a complete packtool output (an interrupted pack ...; raw tokenized data
    ...)", both cases at once; it names the one found, as stats and verify do, and no upgrade
    after the pack, which writes this version's manifest)."""
    res = invoke([command, raw])
    assert res.exit_code == 1, res.output
    assert "finish it" not in res.output
    assert "tokenized input" in res.output and "a.parquet" in res.output
    fix = "packtool compare" if command == "stats" else "packtool pack --capacity C"
    assert fix in res.output and str(raw) in res.output
    if command == "upgrade":
        assert res.output.rstrip().endswith(f"for it run: packtool pack --capacity C {raw} "
                                            "OUTPUT"), res.output


@pytest.mark.parametrize("command", ["verify", "stats", "upgrade"])
def test_empty_folder_given_as_output_says_it_is_empty(tmp_path, command):
    empty = tmp_path / "nothing"
    empty.mkdir()
    res = invoke([command, empty])
    assert res.exit_code == 1, res.output
    assert "empty directory" in res.output and "finish it" not in res.output
    assert "packtool pack" in res.output


@pytest.mark.parametrize("command", ["verify", "upgrade"])
def test_interrupted_pack_given_to_verify_still_says_rerun(tmp_path, raw, command):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / ".packtool-in-progress.json").write_text("{}")
    res = invoke([command, tmp_path / "half"])
    assert res.exit_code == 1 and "interrupted pack" in res.output
    assert "rerun the same packtool pack" in res.output
    assert "raw tokenized data" not in res.output


@pytest.mark.parametrize("command", ["verify", "stats", "export --to nemo", "upgrade"])
def test_packed_shards_without_their_manifest_say_pack_again(tmp_path, raw, command):
    """A packed output whose manifest was deleted: not "tokenized input, run compare" (which
    sends the user back, since compare and pack refuse packed shards), but pack again."""
    out = tmp_path / "out"
    assert invoke(["pack", "-c", 8, raw, out]).exit_code == 0
    (out / ".packtool-manifest.parquet").unlink()
    args = command.split() + [out] + ([tmp_path / "nemo"] if command.startswith("export") else [])
    res = invoke(args)
    assert res.exit_code == 1, res.output
    assert "packed shards" in res.output and "tokenized input" not in res.output
    assert "--overwrite" in res.output and "compare" not in res.output
    assert invoke(["compare", out, "-c", 8]).exit_code == 1  # the loop this breaks
    assert invoke(["pack", "-q", "-c", 8, "--overwrite", raw, out]).exit_code == 0


def test_stats_of_an_output_being_written_says_wait_not_rerun(tmp_path):
    """While a pack holds OUTPUT's lock, stats says a pack is writing it (a rerun would be
    refused by that lock); once the lock is free the same directory is an interrupted pack."""
    import subprocess
    import textwrap

    half = tmp_path / "half"
    half.mkdir()
    (half / ".packtool-in-progress.json").write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from filelock import FileLock
        lock = FileLock({str(half / ".packtool.lock")!r})
        lock.acquire()
        print("held", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        res = invoke(["stats", half])
        assert res.exit_code == 1 and "is writing it now" in res.output, res.output
        assert "rerun" not in res.output
    finally:
        holder.communicate("", timeout=30)
    res = invoke(["stats", half])
    assert res.exit_code == 1 and "interrupted pack" in res.output, res.output


def test_stats_with_a_capacity_on_raw_input_points_to_compare(raw):
    """`packtool stats data/ -c 2048` (no --compare): the command to run, in full."""
    res = invoke(["stats", raw, "-c", 2048])
    assert res.exit_code == 2, res.output
    assert f"packtool compare {raw} --capacity 2048" in res.output


def test_split_of_most_documents_warns_like_truncate_and_drop(tmp_path):
    """--overflow split that cuts most documents is as loud as truncate or drop over 1 %: one
    WARNING line on stderr in pack, and the same line once in compare, naming the strategies
    whose pack prints it (ordered and obfd; concat's stream splits nothing, so its pack would
    not warn)."""
    docs = [[i + 1] * (10 + i % 5) for i in range(20)]  # every document longer than C = 8
    src = write_docs(tmp_path / "in" / "a.parquet", docs)
    res = invoke(["pack", "--capacity", 8, src, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    warn = [ln for ln in res.stderr.splitlines() if ln.startswith("WARNING:")]
    assert len(warn) == 1 and "--overflow split" in warn[0] and "100.0%" in warn[0], res.stderr
    assert "20 of 20" in warn[0] and "--capacity" in warn[0]
    res = invoke(["compare", "--capacity", 8, src])
    assert res.stderr.splitlines() == [warn[0].replace("WARNING: ", "WARNING: ordered; obfd: ",
                                                       1)]
    quiet = write_docs(tmp_path / "in2" / "a.parquet", [[1] * 3] * 19 + [[2] * 12])
    res = invoke(["pack", "--capacity", 8, quiet, tmp_path / "out2"])
    assert res.exit_code == 0 and "WARNING" not in res.stderr, res.stderr


def test_verify_without_torch_says_so_before_the_scan_and_offers_data_only(tmp_path,
                                                                           monkeypatch, raw):
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 4, raw, out]).exit_code == 0
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, find_spec says no
    res = invoke(["verify", out])
    assert res.exit_code == 1, res.output
    assert "torch is not installed" in res.output and "--data-only" in res.output
    assert "checking the column contract" not in res.output, "said after the scan"
    res = invoke(["verify", out, "--data-only"])
    assert res.exit_code == 0, res.output


def test_text_given_to_pack_points_to_tokenize(tmp_path, raw):
    """A JSON Lines file of text given to pack was told to convert it to Parquet, which only led
    to the next refusal (a text column is not token ids): it names packtool tokenize now, as a
    file, inside a folder of Parquet, and as a folder of text alone; other files keep the
    conversion advice."""
    text = tmp_path / "t.jsonl"
    text.write_text('{"text": "hello"}\n')
    (tmp_path / "t.csv").write_text("x\n")
    (raw / "more.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "a.jsonl").write_text('{"text": "hi"}\n')
    for given in (text, raw, tmp_path / "only"):
        res = invoke(["pack", "-q", "-c", 8, given, tmp_path / "out"])
        assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
        assert "text is tokenized first: packtool tokenize --tokenizer FILE INPUT TOKENIZED, " \
               "then pack TOKENIZED" in res.output, res.output
    res = invoke(["pack", "-q", "-c", 8, tmp_path / "t.csv", tmp_path / "out"])
    assert "convert it to tokenized Parquet first" in res.output, res.output
    assert "packtool tokenize" not in res.output, res.output


@pytest.mark.parametrize("command", ["stats", "verify", "upgrade"])
def test_one_file_given_as_output_says_what_it_is(tmp_path, raw, command):
    """A single file was 'not a directory': a shard or the manifest of an output names its
    directory, tokenized input the command that fits it."""
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 8, raw, out]).exit_code == 0
    extra = ["--data-only"] if command == "verify" else []
    for f, what in ((out / "part-00000.parquet", "one shard"),
                    (out / ".packtool-manifest.parquet", "the manifest")):
        res = invoke([command, *extra, f])
        assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
        assert f"{f}: is {what} of a packed output; give its directory: packtool {command} " \
               f"{out}" in res.output
    res = invoke([command, *extra, raw / "a.parquet"])
    assert res.exit_code == 1 and "is tokenized input, not a packed output" in res.output
    fix = "packtool compare" if command == "stats" else "packtool pack --capacity C"
    assert fix in res.output


def test_suggested_commands_quote_the_path_for_the_shell(tmp_path):
    """A command a message suggests can be pasted as printed: a path with a space or an ``&``
    (a store URI's ``?endpoint_override=...&scheme=http``) is one shell word (it was printed
    bare, and the shell cut it)."""
    import shlex

    raw = tmp_path / "my tok&co"
    write_docs(raw / "a.parquet", [[1, 2, 3]])
    for command, suggested in (("stats", ["packtool", "compare", str(raw), "--capacity", "C"]),
                               ("verify", ["packtool", "pack", "--capacity", "C", str(raw),
                                           "OUTPUT,"])):
        res = invoke([command, raw])
        assert res.exit_code == 1, res.output
        words = shlex.split(res.output.split("for it run: ", 1)[1])
        assert words[:len(suggested)] == suggested, res.output


def test_export_hints_name_dest_too(tmp_path):
    """The export commands that messages suggest carry DEST (pasted, they failed with "Missing
    argument 'DEST'")."""
    import shlex

    raw = tmp_path / "raw"
    write_docs(raw / "a.parquet", [[1, 2, 3], [4, 5]])
    res = invoke(["export", "--to", "nemo", raw, tmp_path / "x"])
    assert res.exit_code == 1 and res.output.rstrip().endswith(
        "then packtool export --to nemo OUTPUT DEST"), res.output
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 8, raw, out]).exit_code == 0
    res = invoke(["export", "--to", "nemo", out / "part-00000.parquet", tmp_path / "x"])
    said = shlex.split(res.output.split("give its directory: ", 1)[1])
    assert res.exit_code == 1 and said == ["packtool", "export", "--to", "nemo", str(out),
                                           "DEST"], res.output


@pytest.mark.parametrize("holdout", [False, True])
def test_quiet_prints_nothing_for_an_output_already_complete(tmp_path, holdout):
    """``pack -q`` of a finished output: exit 0 and not a word, on stdout or stderr (it printed
    "already holds this pack ... nothing to do"); without -q the line stays."""
    src = write_docs(tmp_path / "in" / "a.parquet", [[i + 1] * (1 + i % 7) for i in range(60)])
    args = ["pack", "-c", 16, *(["--holdout", 0.2] if holdout else []), src, tmp_path / "out"]
    assert invoke([*args[:1], "-q", *args[1:]]).exit_code == 0
    res = invoke([*args[:1], "-q", *args[1:]])
    assert res.exit_code == 0 and res.output == "", res.output
    res = invoke(args)
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output


def _token_shards(folder, columns=("tokens",)):
    """Raw tokenized input without input_ids: shards written out of natural order (shard-2
    first), each with ``columns`` of token ids and an attention mask (int lists too)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    for k in (2, 0, 1, 10):
        docs = [[k + 1] * (1 + i % 5) for i in range(6)]
        table = {c: pa.array(docs, pa.list_(pa.int32())) for c in columns}
        table["attention_mask"] = pa.array([[1] * len(d) for d in docs], pa.list_(pa.int8()))
        pq.write_table(pa.table({"text": ["t"] * len(docs), **table}),
                       folder / f"shard-{k}.parquet")
    return folder


def _run_suggestion(output: str, tmp_path, fill=()) -> None:
    """Run every packtool command a message suggests after "run: ", as printed, with C, OUTPUT
    and ``fill``'s placeholders given values; each must succeed."""
    import shlex

    said = output.split("run: ", 1)[1].strip()
    for placeholder, value in (("OUTPUT", str(tmp_path / "packed")), *fill):
        said = said.replace(placeholder, value)
    for c in said.split(", then "):
        words = shlex.split(c.split(" (")[0])
        if words[:2] == ["packtool", "verify"]:
            continue  # the packed output is checked below; verify itself is tested elsewhere
        assert words[0] == "packtool", said
        words = ["8" if w == "C" else w for w in words[1:]]
        res = invoke(words)
        assert res.exit_code == 0, f"{c}: {res.output}"


@pytest.mark.parametrize("command", ["stats", "verify"])
@pytest.mark.parametrize("one_file", [False, True])
def test_suggested_command_for_raw_input_runs_as_printed(tmp_path, command, one_file):
    """Raw input whose token column is not input_ids: the command suggested carries --column
    of its one obvious token column (it failed with "no column 'input_ids'"), and a folder is
    named by its first file in natural order (shard-0, not whichever the listing gave)."""
    raw = _token_shards(tmp_path / "my data")
    given = raw / "shard-1.parquet" if one_file else raw
    res = invoke([command, given])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "--column tokens" in res.output
    if not one_file:
        assert "(shard-0.parquet)" in res.output, res.output
    _run_suggestion(res.output, tmp_path)
    if command == "verify":
        assert (tmp_path / "packed" / ".packtool-manifest.parquet").exists()


def test_suggested_command_names_the_candidates_when_it_cannot_tell(tmp_path):
    """Two columns of token ids: --column NAME, naming both; either then runs as printed."""
    raw = _token_shards(tmp_path / "raw", columns=("ids", "tokens"))
    res = invoke(["stats", raw])
    assert res.exit_code == 1, res.output
    assert "packtool compare" in res.output and "--column NAME" in res.output
    assert "one of ids, tokens" in res.output
    _run_suggestion(res.output, tmp_path, fill=(("NAME", "ids"),))


def test_text_input_given_to_stats_says_tokenize_it_first(tmp_path):
    """Data files with no list of integers are no tokenized input: tokenize them first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "text").mkdir()
    pq.write_table(pa.table({"text": ["a b", "c"]}), tmp_path / "text" / "a.parquet")
    for command in ("stats", "verify"):
        res = invoke([command, tmp_path / "text"])
        assert res.exit_code == 1, res.output
        assert "no column of token ids" in res.output and "tokenized input" not in res.output
        assert res.output.count("a.parquet") == 1, res.output  # the file is named once
        assert "run: packtool tokenize --tokenizer FILE" in res.output


def test_dry_run_option_given_to_stats_carries_into_compare(tmp_path):
    """stats with compare's options on raw input: the compare suggested carries them, and the
    --column the input needs; pasted, it runs."""
    raw = _token_shards(tmp_path / "raw")
    res = invoke(["stats", raw, "--capacity", 8, "--append-eos", 9, "--overflow", "truncate"])
    assert res.exit_code == 2, res.output
    said = res.output.split("run: ", 1)[1]
    assert "--capacity 8 --column tokens --overflow truncate --append-eos 9" in said, said
    _run_suggestion(res.output, tmp_path)


def test_missing_token_column_names_the_obvious_one(tmp_path):
    raw = _token_shards(tmp_path / "raw")
    res = invoke(["compare", raw, "-c", 8])
    assert res.exit_code != 0 and res.output.rstrip().endswith("pass --column tokens"), res.output
    two = _token_shards(tmp_path / "two", columns=("ids", "tokens"))
    res = invoke(["compare", two, "-c", 8])
    assert res.exit_code != 0 and res.output.rstrip().endswith("pass --column NAME"), res.output


def test_a_library_message_opening_with_a_newline_is_quoted_by_its_first_written_line():
    """transformers' ImportError for a missing backend opens with a newline: the one-line
    messages quoted ``(ImportError: )``. Every quote of a library's error takes its first
    non-empty line (one owner: packtool.errors.first_line / exc_line)."""
    from packtool.errors import exc_line, first_line
    from packtool.verify.hf_model import _build_error

    exc = ImportError("\nTimmWrapperModel requires the timm library but it was not found.\n"
                      "pip install timm\n")
    assert first_line(exc) == "TimmWrapperModel requires the timm library but it was not found."
    assert exc_line(exc) == f"ImportError: {first_line(exc)}"
    assert first_line(ValueError("")) == "ValueError" and exc_line(ValueError()) == "ValueError"
    assert first_line(OSError("  \n"), "no memory left") == "no memory left"
    msg = str(_build_error("gemma3n", exc))
    assert "(ImportError: TimmWrapperModel requires the timm library" in msg and "\n" not in msg
