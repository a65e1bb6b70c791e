"""README.md and docs/ say only what is true: every command they show runs against this CLI
(options exist, values parse, repository files exist), `make` targets and pip extras exist,
generated figures match a fresh run, and quoted error messages match what packtool prints."""

from __future__ import annotations

import glob
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest

from packtool.cli import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "sample_data" / "README.md"]
SHELL_BUILTINS = {"cd", ".", "source", "git", "export"}


def shell_commands(md: Path) -> list[tuple[int, list[str]]]:
    """(line number, argv) of every command in the ```bash blocks of ``md``, comments dropped,
    ``a && b`` split into two."""
    out, in_block = [], False
    for n, line in enumerate(md.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_block = not in_block and line.strip() in ("```bash", "```sh", "```shell")
            continue
        if not in_block:
            continue
        argv = shlex.split(line, comments=True)
        while argv:
            cut = argv.index("&&") if "&&" in argv else len(argv)
            out.append((n, argv[:cut]))
            argv = argv[cut + 1:]
    return out


def inline_packtool(md: Path) -> list[tuple[int, list[str]]]:
    """(line number, argv) of every `packtool ...` code span in the prose of ``md``."""
    out = []
    for n, line in enumerate(md.read_text().splitlines(), 1):
        for span in re.findall(r"`(packtool [^`]*)`", line):
            out.append((n, shlex.split(span)))
    return out


def _placeholder(token: str) -> bool:
    """INPUT, OUTPUT..., C, N, FILE.png, CMD, URL, ...: stands for a value the user picks."""
    return token in ("...", "…") or bool(re.fullmatch(r"[A-Z][A-Z_]*(\.\.\.|\.[a-z]+)?", token))


def _check_path(value: str, where: str) -> None:
    """A path into the repository (its first part is a top-level entry of the checkout) must
    exist; other paths (in/, out/, /shared/...) are the user's."""
    first = Path(value).parts[0] if Path(value).parts else ""
    if not value.startswith("/") and (ROOT / first).exists() and first not in ("out",):
        assert glob.glob(str(ROOT / value)), f"{where}: {value} does not exist in the checkout"


def check_packtool(argv: list[str], where: str, *, partial: bool = False) -> None:
    """Walk ``packtool ARGS`` the way click would: every option exists on its command, every
    value parses (placeholders aside), positional arguments are enough, paths into the
    repository exist. ``partial``: a mention in prose, which may leave arguments out."""
    assert argv[0] == "packtool", where
    args = argv[1:]
    group_opts = {o for p in cli.params for o in (*p.opts, *p.secondary_opts)}
    group_opts |= {"-h", "--help"}
    while args and args[0].startswith("-"):
        assert args[0] in group_opts, f"{where}: packtool has no option {args[0]}"
        args = args[1:]
    if not args:
        return
    if _placeholder(args[0]):  # `packtool --debug CMD ...`
        return
    assert args[0] in cli.commands, f"{where}: packtool has no command {args[0]!r}"
    cmd = cli.commands[args[0]]
    opts = {o: p for p in cmd.params if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)}
    positional, rest = [], args[1:]
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok.startswith("-") and len(tok) > 1 and not _placeholder(tok):
            name, eq, value = tok.partition("=")
            if name in ("-h", "--help"):
                i += 1
                continue
            assert name in opts, f"{where}: packtool {args[0]} has no option {name}"
            p = opts[name]
            if not (p.is_flag or p.count):
                if not eq:
                    i += 1
                    assert i < len(rest), f"{where}: {name} needs a value"
                    value = rest[i]
                if not _placeholder(value):
                    if isinstance(p.type, click.Path):
                        _check_path(value, where)
                    elif p.callback is None:
                        try:
                            p.type.convert(value, p, None)
                        except click.BadParameter as exc:
                            raise AssertionError(f"{where}: {name} {value}: {exc}") from None
        else:
            positional.append(tok)
        i += 1
    for value in positional:
        if not _placeholder(value):
            _check_path(value, where)
    if not partial:
        # an argument's metavar names what it takes: "INPUT... OUTPUT" is at least two paths
        need = sum(max(a.nargs, len((a.metavar or "X").split())) for a in cmd.params
                   if isinstance(a, click.Argument) and a.required)
        assert len(positional) >= need, f"{where}: packtool {args[0]} needs {need} argument(s)"


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def _extras() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(meta["project"]["optional-dependencies"])


def check_pip(argv: list[str], where: str) -> None:
    """``pip install`` of packtool: from a checkout (``.``/``'.[x]'``) or ``packtool[x] @ URL``,
    with extras that exist; never ``packtool`` from a package index (it is not published)."""
    assert argv[:2] == ["pip", "install"], where
    for req in argv[2:]:
        if req.startswith("-") or req.startswith("http"):
            continue
        m = re.fullmatch(r"(\.|packtool)(?:\[([\w,-]+)\])?(\s*@\s*git\+\S+)?", req)
        if m is None:
            assert not req.startswith("packtool"), f"{where}: {req!r}"
            continue  # another package (torch from its index)
        if m.group(1) == "packtool":
            assert m.group(3), f"{where}: {req!r} installs from an index; packtool is not on one"
        for extra in (m.group(2) or "").split(","):
            assert not extra or extra in _extras(), f"{where}: no extra [{extra}]"


def check_command(argv: list[str], where: str) -> None:
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):  # VAR=value before a command
        argv = argv[1:]
    if not argv:  # VAR=value alone: a shell variable
        return
    if argv[0] == "packtool":
        check_packtool(argv, where)
    elif argv[0] == "make":
        targets = [a for a in argv[1:] if "=" not in a]
        for t in targets:
            assert t in _makefile_targets(), f"{where}: the Makefile has no target {t}"
    elif argv[0] == "pip":
        check_pip(argv, where)
    elif argv[0] in SHELL_BUILTINS or argv[:3] == ["python3", "-m", "venv"]:
        pass
    elif argv[0] == "torchrun":  # torchrun [OPTIONS] SCRIPT: the script is in the checkout
        assert (ROOT / argv[-1]).is_file(), f"{where}: {argv[-1]} does not exist"
    elif argv[0] == "moto_server":  # the local S3 server: the dev extra installs it
        assert "moto[server]" in (ROOT / "pyproject.toml").read_text(), where
    elif argv[0] in ("python", "python3") and argv[1] == "-c":
        compile(argv[2], where, "exec")  # the one-liner is Python
    elif argv[0] in ("python", "python3", ".venv/bin/python"):
        script = ROOT / argv[1]
        assert script.is_file(), f"{where}: {argv[1]} does not exist"
        text = script.read_text()
        for opt in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
            assert f'"{opt}"' in text, f"{where}: {argv[1]} has no option {opt}"
    else:
        raise AssertionError(f"{where}: no rule checks `{argv[0]}` commands; add one here")


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shell_command_in_the_docs_is_valid(md):
    commands = shell_commands(md)
    for n, argv in commands:
        check_command(argv, f"{md.name}:{n}")
    for n, argv in inline_packtool(md):
        check_packtool(argv, f"{md.name}:{n}", partial=True)


def test_the_checker_catches_what_it_should():
    """The checks above fail on a wrong option, a bad value, a missing file, too few arguments
    or an install from a package index."""
    bad = [(check_packtool, ["packtool", "pack", "--capcity", "2048", "in/", "out/"]),
           (check_packtool, ["packtool", "pack", "--strategy", "bfd", "in/", "out/"]),
           (check_packtool, ["packtool", "stats", "sample_data/no-such.parquet"]),
           (check_packtool, ["packtool", "pack", "in/"]),
           (check_packtool, ["packtool", "statistics", "out/"]),
           (check_pip, ["pip", "install", "packtool[verify]"]),
           (check_pip, ["pip", "install", ".[no-such-extra]"]),
           (check_command, ["make", "no-such-target"])]
    for fn, argv in bad:
        with pytest.raises(AssertionError):
            fn(argv, "case")


def test_readme_says_what_make_demo_runs():
    """The README quotes the commands of the Makefile's demo recipe."""
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    quoted = re.findall(r"`(packtool [^`]*)`", (ROOT / "README.md").read_text().split(
        "## Install")[0])
    ran = [line.split("$(BIN)/", 1)[1] for line in recipe.splitlines()
           if "$(BIN)/packtool" in line]
    assert ran and quoted == ran, (quoted, ran)


def test_readme_compare_table_matches_a_fresh_run():
    """README's 'What packing buys' block is what scripts/readme_figures.py computes now."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_figures.py"),
                           "--check"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr + "\nrun: make docs"


def test_readme_verify_figures_name_every_cpu_backend():
    """The verify figures block exists and names the backends CI runs (make docs VERIFY=1
    regenerates the numbers)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- begin: verify -->", 1)[1].split("<!-- end: verify -->", 1)[0]
    for backend in ("sdpa", "flex", "hf", "hybrid"):
        assert re.search(rf"{backend} \d\.\d+e-\d\d", block), block


# ---- docs/robustness.md: each quoted message is what packtool prints ---------------------------

def _doc_messages() -> list[str]:
    text = (ROOT / "docs" / "robustness.md").read_text()
    table = text.split("| Input | Message says |", 1)[1].split("\n\n", 1)[0]
    return [m for row in table.splitlines()[2:] for m in re.findall(r"`([^`]+)`",
                                                                   row.rsplit("|", 2)[1])]


def _pattern(msg: str) -> re.Pattern:
    """The quoted message with its placeholders (N, V, D, L, C, <file>, ...) as wildcards."""
    parts = re.split(r"(<file>|\.\.\.|\b[NVDLC]\b)", msg)
    return re.compile("".join(".+?" if i % 2 else re.escape(p) for i, p in enumerate(parts)))


def test_robustness_doc_quotes_the_messages_packtool_prints(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from conftest import write_docs

    good = write_docs(tmp_path / "good" / "a.parquet", [[1, 2, 3], [4, 5]])
    (tmp_path / "nopq").mkdir()
    (tmp_path / "zero.parquet").write_bytes(b"")
    (tmp_path / "text.parquet").write_text("not parquet")
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "nocol.parquet")
    pq.write_table(pa.table({"input_ids": ["a"]}), tmp_path / "str.parquet")
    write_docs(tmp_path / "nulldoc.parquet", [[1], None])
    write_docs(tmp_path / "nulltok.parquet", [[1, None]])
    write_docs(tmp_path / "neg.parquet", [[1, -1]])
    write_docs(tmp_path / "big.parquet", [[2**31]])
    write_docs(tmp_path / "empty.parquet", [[]])
    pq.write_table(pa.table({"input_ids": [[1, 2]], "attention_mask": [[0, 0]]}),
                   tmp_path / "masked.parquet")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    write_docs(tmp_path / "mixed" / "a.parquet", [[1, 2]])
    (tmp_path / "mixed" / "docs.jsonl").write_text("{}\n")
    ids = pa.array([[1, 2]], pa.list_(pa.int32()))
    pq.write_table(pa.Table.from_arrays([ids, ids], names=["input_ids", "input_ids"]),
                   tmp_path / "dup.parquet")
    # input faults of their own kinds: written as the tests of tests/test_bad_input.py and
    # tests/formats/ write them
    (tmp_path / "latin1").mkdir()
    with open(bytes(tmp_path / "latin1") + b"/caf\xe9.parquet", "wb") as f:
        f.write(good.read_bytes())
    (tmp_path / "z.parquet.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(16))
    (tmp_path / "gz.parquet").write_bytes(b"\x1f\x8b" + bytes(16))
    table = pa.table({"input_ids": ids})
    with pa.ipc.new_file(tmp_path / "ipc.parquet", table.schema) as w:
        w.write_table(table)
    pq.write_table(table, tmp_path / "pq.arrow")
    pq.write_table(table.append_column("position_ids", pa.array([[0, 1]])),
                   tmp_path / "pos.parquet")
    resaved = pq.read_table(good)
    for name, values in (("segment_ids", [[1, 1, 1], [1, 1]]), ("cu_seqlens", [[0, 3], [0, 2]]),
                         ("doc_ids", [[0], [1]]), ("doc_offsets", [[0], [0]])):
        resaved = resaved.append_column(name, pa.array(values))
    pq.write_table(resaved, tmp_path / "resaved.parquet")
    with pa.ipc.new_stream(tmp_path / "cut.arrows", table.schema) as w:
        w.write_table(table)
    whole = (tmp_path / "cut.arrows").read_bytes()
    (tmp_path / "cut.arrows").write_bytes(whole[:-8])
    (tmp_path / "joined.arrows").write_bytes(whole + whole)
    long_docs = pa.array([list(range(1, 301))] * 40, pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": long_docs}), tmp_path / "crc.parquet",
                   write_page_checksum=True, compression="none", use_dictionary=False)
    raw = bytearray((tmp_path / "crc.parquet").read_bytes())
    col = pq.ParquetFile(tmp_path / "crc.parquet").metadata.row_group(0).column(0)
    mid = col.data_page_offset + col.total_compressed_size // 2
    raw[mid:mid + 16] = bytes(16)
    (tmp_path / "crc.parquet").write_bytes(bytes(raw))
    (tmp_path / "locked").mkdir()
    write_docs(tmp_path / "dir" / "year=2024" / "a.parquet", [[1, 2]])  # given as a pattern
    write_docs(tmp_path / "twoname" / "a.parquet", [[1, 2]])
    write_docs(tmp_path / "twoname" / "b.parquet", [[3]], column="tokens")
    pq.write_table(pa.table({"ids": ids, "more": ids}), tmp_path / "twolists.parquet")
    (tmp_path / "lfs.parquet").write_text("version https://git-lfs.github.com/spec/v1\n")
    pq.write_table(table, tmp_path / "x.pq")
    write_docs(tmp_path / "under" / "_data" / "a.parquet", [[1, 2]])
    from packcheck import damaged_shard

    damaged_shard(tmp_path / "flip.parquet", 6_311_564)
    damaged_shard(tmp_path / "flipneg.parquet", -3000)

    def pack(*args):
        return [*args[:-1], "-q", args[-1]]

    cases = [pack(tmp_path / "missing", tmp_path / "o"), pack(tmp_path / "nopq", tmp_path / "o"),
             pack(tmp_path / "zero.parquet", tmp_path / "o"),
             pack(tmp_path / "text.parquet", tmp_path / "o"),
             pack(tmp_path / "nocol.parquet", tmp_path / "o"),
             pack(tmp_path / "str.parquet", tmp_path / "o"),
             pack(tmp_path / "nulldoc.parquet", tmp_path / "o"),
             pack(tmp_path / "nulltok.parquet", tmp_path / "o"),
             pack(tmp_path / "neg.parquet", tmp_path / "o"),
             pack(tmp_path / "big.parquet", tmp_path / "o"),
             pack(tmp_path / "empty.parquet", tmp_path / "o"),
             pack(tmp_path / "masked.parquet", tmp_path / "o"),
             ["--capacity", "1", *pack(good, tmp_path / "o")],
             ["--pad-id", "-1", *pack(good, tmp_path / "o")],
             ["--capacity", "2", "--overflow", "error", *pack(good, tmp_path / "o")],
             pack(good.parent, good.parent / "sub"),
             pack(good, tmp_path / "afile"),
             pack(good, tmp_path / "afile" / "o"),
             pack(good, tmp_path / "full"),
             pack(tmp_path / "mixed", tmp_path / "o"),
             pack(tmp_path / "dup.parquet", tmp_path / "o"),
             pack(tmp_path / "latin1", tmp_path / "o"),
             pack(tmp_path / "z.parquet.zst", tmp_path / "o"),
             pack(tmp_path / "gz.parquet", tmp_path / "o"),
             pack(tmp_path / "ipc.parquet", tmp_path / "o"),
             pack(tmp_path / "pq.arrow", tmp_path / "o"),
             pack(tmp_path / "pos.parquet", tmp_path / "o"),
             pack(tmp_path / "resaved.parquet", tmp_path / "o"),
             pack(tmp_path / "cut.arrows", tmp_path / "o"),
             pack(tmp_path / "joined.arrows", tmp_path / "o"),
             pack(tmp_path / "crc.parquet", tmp_path / "o"),
             pack("dir/year=2024/*", tmp_path / "o"),  # relative: the working directory below
             pack("*.parquet", tmp_path / "o"),  # a pattern with no folder before it
             pack(good, "file://example.com/p"), pack(good, "file:out"),
             pack(good, "s3://b/./out"),
             ["--source-column", "input_ids", *pack(good, tmp_path / "o")],
             ["--labels-column", "input_ids", *pack(good, tmp_path / "o")],
             pack(tmp_path / "twoname", tmp_path / "o"),
             pack(tmp_path / "twolists.parquet", tmp_path / "o"),
             pack(tmp_path / "lfs.parquet", tmp_path / "o"),
             pack(tmp_path / "x.pq", tmp_path / "o"),
             pack(tmp_path / "under", tmp_path / "o"),
             pack(tmp_path / "flip.parquet", tmp_path / "o"),
             pack(tmp_path / "flipneg.parquet", tmp_path / "o")]
    monkeypatch.chdir(tmp_path)
    from click.testing import CliRunner

    printed = []
    for args in cases:
        res = CliRunner().invoke(cli, ["pack", *map(str, args)])
        assert res.exit_code in (1, 2), (args, res.output)
        printed.append(res.output.strip())
    res = CliRunner().invoke(cli, ["stats", "pk*"])  # a pattern given as a packed OUTPUT
    assert res.exit_code == 1, res.output
    printed.append(res.output.strip())
    # what packtool prints for a folder it may not list (root reads any file: the listing
    # raises here as it raises for a user; tests/test_bad_input.py checks it for real)
    import pyarrow.fs as pafs

    import packtool.formats.filesystem as filesystem

    class Denied:
        def __init__(self, fs):
            self.fs = fs

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def get_file_info(self, what):
            if isinstance(what, pafs.FileSelector) and what.base_dir.endswith("locked"):
                raise PermissionError(13, "Permission denied")
            return self.fs.get_file_info(what)

    real = filesystem.local_filesystem
    monkeypatch.setattr(filesystem, "local_filesystem", lambda p: (Denied(real(p)[0]), real(p)[1]))
    res = CliRunner().invoke(cli, ["pack", "-q", str(tmp_path / "locked"), str(tmp_path / "o")])
    monkeypatch.undo()
    printed.append(res.output.strip())
    for msg in _doc_messages():
        pat = _pattern(msg)
        assert any(pat.search(p) for p in printed), f"docs/robustness.md quotes {msg!r}, " \
            f"which packtool does not print:\n" + "\n".join(printed)


# ---- docs/output.md: the doc_offsets example is what pack writes --------------------------------

DOC_OFFSETS_EXAMPLE = (
    "Example of `doc_offsets`: the input row `input_ids [0,0,5,6,7,8,9]`, `attention_mask\n"
    "[0,0,1,1,1,1,1]` packed with `--prepend-bos 1` at C = 4 is the document `[1,5,6,7,8,9]` (the\n"
    "mask's 0s removed, the BOS added), split into the segments `[1,5,6,7]` with `doc_offsets` 0 and\n"
    "`[8,9]` with `doc_offsets` 4: token 8 is token 4 of the document as packed (token 5 of the input\n"
    "row).")


@pytest.mark.parametrize("more", [[], ["--segment-multiple", "2"]])
def test_output_doc_offsets_example_is_what_pack_writes(tmp_path, more):
    """docs/output.md says what doc_offsets counts (tokens of the document as packed: the
    attention mask's 0s removed, an added BOS counted, no --segment-multiple padding) with an
    example; packing that example writes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from click.testing import CliRunner
    from conftest import read_rows

    assert DOC_OFFSETS_EXAMPLE in (ROOT / "docs" / "output.md").read_text()
    pq.write_table(pa.table({"input_ids": [[0, 0, 5, 6, 7, 8, 9]],
                             "attention_mask": [[0, 0, 1, 1, 1, 1, 1]]}), tmp_path / "a.parquet")
    res = CliRunner().invoke(cli, ["pack", "-q", "-c", "4", "--prepend-bos", "1", *more,
                                   str(tmp_path / "a.parquet"), str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    pieces = sorted((r["doc_offsets"][0], [t for t, s in zip(r["input_ids"], r["segment_ids"])
                                           if s]) for r in read_rows(tmp_path / "out"))
    assert pieces == [(0, [1, 5, 6, 7]), (4, [8, 9])]


def test_usage_options_table_lists_every_pack_option():
    """The README calls docs/usage.md's table every option; --column and --segment-multiple
    were missing from it."""
    from packtool.cli import pack

    doc = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    table = doc[doc.index("| option | default | meaning |"):]
    table = table[:table.index("\n\n")]
    missing = [o for p in pack.params for o in (*p.opts, *p.secondary_opts)
               if o.startswith("--") and f"`{o}" not in table and f" {o}" not in table
               and o not in ("--help",)]
    assert not missing, missing


@pytest.mark.parametrize("command", ["pack", "compare"])
def test_usage_says_what_pack_and_compare_do_with_a_column_of_floats(tmp_path, command):
    """docs/usage.md said of --column that "a list of floats is cast to integers first", but
    pack and compare refuse a list<double> column, telling how to cast it: the row says that,
    in the words of the message."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    src = tmp_path / "f.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1.0, 2.0], [3.0]],
                                                   pa.list_(pa.float64()))}), src)
    args = ([command, str(src), str(tmp_path / "o")] if command == "pack"
            else [command, str(src)]) + ["-c", "4"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1 and "token ids are integers: cast the column first" in res.output
    doc = (ROOT / "docs" / "usage.md").read_text()
    row = next(ln for ln in doc.splitlines() if ln.startswith("| `--column NAME` |"))
    assert "cast to integers first" not in row
    assert "is refused" in row and "token ids are integers: cast the column first" in row


def _json_keys(d, skip=(), names=None) -> set:
    """Every key of a JSON report, at any depth (a key of ``skip`` is kept, its value's keys,
    which are data, not names, left out; ``mismatches``' keys are field names, its entries'
    keys are kept)."""
    names = set() if names is None else names
    if isinstance(d, dict):
        for k, v in d.items():
            names.add(k)
            if k in skip:
                continue
            if k == "mismatches":
                for entry in v.values():
                    _json_keys(entry, skip, names)
            else:
                _json_keys(v, skip, names)
    elif isinstance(d, list):
        for v in d:
            _json_keys(v, skip, names)
    return names


def test_stats_doc_describes_every_key_of_stats_and_compare_json(tmp_path):
    """docs/stats.md left keys of ``stats --json`` (``documents``, ``fill_histogram``,
    ``integrity``, ``per_bin_rows_listed``...) and ``compare --json`` (``tokens_processed``,
    ``input_masks``...) undescribed: every key either report prints, at any depth, is named
    there (in backticks), with the options that add keys (``--per-bin``, ``--source-column``,
    ``--window-docs``) and a recount that disagrees with the manifest."""
    import json

    from click.testing import CliRunner

    out = tmp_path / "o"
    run = CliRunner().invoke(cli, ["pack", "-q", "-c", "2048", "--source-column", "source",
                                   str(ROOT / "sample_data"), str(out)])
    assert run.exit_code == 0, run.output
    got = CliRunner().invoke(cli, ["stats", "--json", "--per-bin", "--per-bin-limit", "2",
                                   str(out)])
    assert got.exit_code == 0, got.output
    keys = _json_keys(json.loads(got.stdout))
    got = CliRunner().invoke(cli, ["compare", "--json", "-c", "2048", "--window-docs", "100",
                                   str(ROOT / "sample_data")])
    assert got.exit_code == 0, got.output
    keys |= _json_keys(json.loads(got.stdout), skip=("input_columns_unused",))
    # a recount that disagrees with the manifest: its entry's keys
    from packtool.analysis import analyze_packed

    a = analyze_packed(out, check_hashes=False)
    a.mismatches["rows"] = (1, 2)
    a.mismatch_where["rows"] = "part-00000.parquet row 0"
    keys |= _json_keys(a.to_dict())
    doc = (ROOT / "docs" / "stats.md").read_text()
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", doc))
    assert not sorted(keys - named), sorted(keys - named)
    for key in ("documents", "fill_histogram", "integrity", "full_attention_work",
                "per_bin_rows_listed", "segment_targets", "tokens_processed",
                "attention_work_full_rows", "documents_over_capacity", "input_masks",
                "least_waste"):
        assert key in keys, key  # the keys found missing are those of the reports
