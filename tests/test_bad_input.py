"""Bad input is refused with one line that names the file (and row), what is wrong and what to
do; exit 1 (2 for usage errors); no traceback unless ``--debug``; nothing half-written in OUTPUT.

Mixed integer types across shards (int8 in one, uint64 in another, ...) are accepted and widened:
every value is range-checked and then stored as int32, so the type of the source column does not
matter, only the values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import (check_output, damaged_shard, hash_tree, invoke, read_output,
                       write_docs, write_table_as)
from packtool.formats.manifest import MANIFEST_NAME, read_manifest
from packtool.errors import ManifestError
from packtool.formats.manifest import load_manifest


def refused(args, out: Path, *words, code: int = 1):
    """Run ``packtool ARGS``; assert the exit code, one ``Error:`` line holding ``words``, no
    traceback, and no OUTPUT left behind."""
    res = invoke(args)
    assert res.exit_code == code, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    text = res.output
    assert "Traceback" not in text
    error_lines = [line for line in text.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1, text
    if code == 1 or "Usage:" not in text:
        assert text.strip() == error_lines[0], "packtool's own errors are exactly one line"
    for w in words:
        assert w in error_lines[0], f"{w!r} not in {error_lines[0]!r}"
    assert not out.exists(), f"OUTPUT left behind: {sorted(os.listdir(out))}"
    return error_lines[0]


def pack_args(*inputs, out, capacity=4, extra=()):
    return ["pack", "-q", "--capacity", capacity, *extra, *inputs, out]


@pytest.fixture
def good(tmp_path):
    return write_docs(tmp_path / "good" / "a.parquet", [[1, 2, 3], [4, 5]])


def test_missing_input_path(tmp_path):
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "nope.parquet", out=out), out, "nope.parquet",
            "no such file", "check the INPUT")


def test_directory_without_parquet(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("hello")
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "in", out=out), out, "in", "no *.parquet")


def test_zero_byte_file(tmp_path):
    (tmp_path / "z.parquet").write_bytes(b"")
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "z.parquet", out=out), out, "z.parquet", "empty (0 bytes)",
            "regenerate")


def test_truncated_parquet(tmp_path, good):
    data = good.read_bytes()
    (tmp_path / "t.parquet").write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "t.parquet", out=out), out, "t.parquet",
            "not a readable Parquet file", "regenerate")


def test_text_file_named_parquet(tmp_path):
    (tmp_path / "x.parquet").write_text("input_ids\n1 2 3\n" * 20)
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "x.parquet", out=out), out, "x.parquet",
            "not a readable Parquet file")


def test_bad_file_after_a_good_one_writes_nothing(tmp_path, good):
    """The second file is broken: refused before OUTPUT is created."""
    (good.parent / "b.parquet").write_bytes(b"PAR1 not really")
    out = tmp_path / "out"
    refused(pack_args(good.parent, out=out), out, "b.parquet", "not a readable Parquet file")


def test_missing_token_column_lists_available_columns(tmp_path):
    pq.write_table(pa.table({"text": ["a"], "tokens": [[1, 2]]}), tmp_path / "c.parquet")
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "c.parquet", out=out), out, "c.parquet", "no column 'input_ids'",
            "available columns: text, tokens", "--column")


@pytest.mark.parametrize("array,typ", [
    (pa.array([["a", "b"]]), "type list<element: string>"),
    (pa.array([[1.0, 2.0]]), "type list<element: double>"),
    (pa.array([[[1, 2]]]), "type list<element: list<element: int64>>"),
    (pa.array(["some text"]), "type string"),
    (pa.array([1.5]), "type double"),
    (pa.array([7]), "type int64"),
], ids=["list-string", "list-float", "nested-list", "string", "float", "scalar-int"])
def test_non_integer_list_column(tmp_path, array, typ):
    pq.write_table(pa.table({"input_ids": array}), tmp_path / "s.parquet")
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "s.parquet", out=out), out, "s.parquet", "'input_ids'",
            typ, "expected a list of integer token ids")


def test_null_document(tmp_path):
    write_docs(tmp_path / "n.parquet", [[1, 2], [3], None])
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "n.parquet", out=out), out, "n.parquet", "row 2", "is null",
            "drop or fill")


def test_null_token_inside_a_document(tmp_path):
    write_docs(tmp_path / "n.parquet", [[1, 2], [3, None, 4]])
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "n.parquet", out=out), out, "n.parquet", "row 1",
            "token id is null")


def test_null_in_a_later_row_group_names_the_file_row(tmp_path):
    """Rows are counted from the start of the file, across row groups."""
    pq.write_table(pa.table({"input_ids": pa.array([[1]] * 5 + [None], pa.list_(pa.int32()))}),
                   tmp_path / "g.parquet", row_group_size=2)
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "g.parquet", out=out), out, "g.parquet", "row 5", "null")


def test_negative_id(tmp_path):
    write_docs(tmp_path / "neg.parquet", [[1, 2], [3, -5]])
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "neg.parquet", out=out), out, "neg.parquet", "row 1",
            "negative token id -5", ">= 0")


# ---- a shard damaged after it was written: its footer statistics and vocabulary catch it ---


@pytest.mark.parametrize("extra", [(), ("--workers", "2"), ("--window-docs", "2")])
def test_an_id_outside_its_row_groups_footer_statistics_is_refused(tmp_path, extra):
    """A damaged byte turns id 3000 into 6,311,564, outside 2000..3600, what the footer
    statistics of its row group record: the file was damaged after it was written; refused
    naming the file, row group and row, whatever the read path (one worker, several,
    windows)."""
    src = damaged_shard(tmp_path / "d.parquet", 6_311_564)
    out = tmp_path / "out"
    refused(pack_args(src, out=out, extra=extra), out, "d.parquet", "row group 1",
            "row 3 (0-based)", "token id 6311564", "outside 2000..3600", "footer statistics",
            "damaged", "re-download it) or regenerate it")


def test_a_damaged_byte_read_as_a_negative_id_says_the_file_is_damaged(tmp_path):
    src = damaged_shard(tmp_path / "d.parquet", -3000)
    out = tmp_path / "out"
    refused(pack_args(src, out=out), out, "d.parquet", "row group 1", "row 3 (0-based)",
            "negative token id -3000", "outside 2000..3600", "footer statistics", "damaged")


def test_a_damaged_shard_without_statistics_is_read_as_before(tmp_path):
    """No footer statistics: nothing to compare with, the ids are packed as read."""
    src = damaged_shard(tmp_path / "d.parquet", 6_311_564, statistics=False)
    out = tmp_path / "out"
    res = invoke(pack_args(src, out=out, capacity=8, extra=("--no-shuffle",)))
    assert res.exit_code == 0, res.output
    rows, _ = read_output(out)
    assert 6_311_564 in [i for r in rows for i in r["input_ids"]]


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_ids_at_or_over_a_declared_vocabulary_size_are_packed(tmp_path, fmt):
    """A shard whose schema metadata declares a vocabulary size (tokenizer_vocab_size, as
    sample_data's does) does not bound its ids: an id at or over it (a BOS/EOS added above a
    BPE file's ranks, a vocabulary whose ids skip numbers) and padding ids the attention mask
    removes are packed as read, and verify --data-only passes the output."""
    table = pa.table({"input_ids": pa.array([[1, 2], [3, 4095], [4096, 7], [5, 9999, 9999]],
                                            pa.list_(pa.int32())),
                      "attention_mask": pa.array([[1, 1], [1, 1], [1, 1], [1, 0, 0]],
                                                 pa.list_(pa.int8()))}
                     ).replace_schema_metadata({b"tokenizer_vocab_size": b"4096"})
    src = tmp_path / "in" / f"v.{fmt}"
    src.parent.mkdir()
    write_table_as(table, src, fmt)
    out = tmp_path / "out"
    res = invoke(pack_args(src, out=out, capacity=8, extra=("--no-shuffle",)))
    assert res.exit_code == 0, res.output
    ids = [i for r in read_output(out)[0] for i in r["input_ids"]]
    assert 4096 in ids and 9999 not in ids
    res = invoke(["verify", "--data-only", out])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("value,typ", [(2**31, pa.int64()), (2**31, pa.uint32()),
                                       (2**32 + 1, pa.uint64()), (2**64 - 1, pa.uint64())])
def test_id_above_int32(tmp_path, value, typ):
    write_docs(tmp_path / "big.parquet", [[1], [2], [value, 1]], typ)
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "big.parquet", out=out), out, "big.parquet", "row 2",
            f"token id {value}", "does not fit int32")


def test_mixed_integer_types_across_shards_are_widened(tmp_path):
    """Decision: accept and widen (every value is range-checked, then stored as int32)."""
    d = tmp_path / "in"
    write_docs(d / "a.parquet", [[1, 2, 127]], pa.int8())
    write_docs(d / "b.parquet", [[60000, 3]], pa.uint16())
    write_docs(d / "c.parquet", [[2**31 - 1]], pa.uint64())
    write_docs(d / "d.parquet", [[7, 8]], pa.int64())
    pq.write_table(pa.table({"input_ids": pa.array([[9]], pa.large_list(pa.int32()))}),
                   d / "e.parquet")
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--no-shuffle", "--capacity", 4, d, out])
    assert res.exit_code == 0, res.output
    rows, manifest = read_output(out)
    real = sorted(t for r in rows for t, s in zip(r["input_ids"], r["segment_ids"]) if s)
    assert real == sorted([1, 2, 127, 60000, 3, 2**31 - 1, 7, 8, 9])
    assert [i.rows for i in manifest.inputs] == [1, 1, 1, 1, 1]


def test_empty_shard_among_others_is_accepted(tmp_path):
    """A shard with no rows adds no documents; the document index continues across it."""
    d = tmp_path / "in"
    write_docs(d / "a.parquet", [[1, 2]])
    write_docs(d / "b.parquet", [])
    write_docs(d / "c.parquet", [[3, 4, 5]])
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--no-shuffle", "--capacity", 8, d, out])
    assert res.exit_code == 0, res.output
    rows, manifest = read_output(out)
    assert rows[0]["doc_ids"] == [1, 0]
    assert manifest.totals.docs_in == 2


def test_only_empty_shards(tmp_path):
    write_docs(tmp_path / "in" / "a.parquet", [])
    write_docs(tmp_path / "in" / "b.parquet", [])
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "in", out=out), out, "2 input files", "no tokens to pack",
            "no documents")


def test_all_documents_empty(tmp_path):
    write_docs(tmp_path / "e.parquet", [[], [], []])
    out = tmp_path / "out"
    refused(pack_args(tmp_path / "e.parquet", out=out), out, "e.parquet", "no tokens to pack",
            "all 3 documents", "--column")


@pytest.mark.parametrize("empty_doc", [False, True])
def test_all_documents_masked_are_said_masked_not_empty(tmp_path, empty_doc):
    """Documents whose tokens all have attention mask 0 (one empty beside them with
    ``empty_doc``): pack and compare refuse them as masked, with the counts and the mask's
    option, not as "all 3 documents ... are empty" (they hold tokens)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.cli import cli

    ids, mask = [[1, 2], [3, 4], [5, 6]], [[0, 0]] * 3
    if empty_doc:
        ids[1], mask[1] = [], []
    src = tmp_path / "in" / "m.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": mask}), src)
    out = tmp_path / "out"
    what = ("are masked or empty (1 empty; the 4 tokens of the other 2 all have attention mask 0)"
            if empty_doc else "are masked (their 6 tokens all have attention mask 0)")
    refused(pack_args(src, out=out), out, "m.parquet", "no tokens to pack",
            f"all 3 documents in column 'input_ids' {what}", "--attention-mask-column")
    from click.testing import CliRunner
    res = CliRunner().invoke(cli, ["compare", "-c", "4", str(src)])
    assert res.exit_code == 1 and f"all 3 documents in column 'input_ids' {what}" in res.output


def test_a_pack_refused_before_writing_leaves_no_folder_it_created(tmp_path):
    """OUTPUT x/y/z of a pack refused after entering it (an input of empty documents): no x/,
    x/y/ nor x/y/z/ is left (it used to remove z alone); under a folder that was there, that
    folder and what it held stay."""
    write_docs(tmp_path / "e.parquet", [[], []])
    out = tmp_path / "x" / "y" / "z"
    refused(pack_args(tmp_path / "e.parquet", out=out), out, "no tokens to pack")
    assert not (tmp_path / "x").exists()
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "mine.txt").write_text("x")
    out = tmp_path / "keep" / "y" / "z"
    refused(pack_args(tmp_path / "e.parquet", out=out), out, "no tokens to pack")
    assert [p.name for p in (tmp_path / "keep").iterdir()] == ["mine.txt"]


def test_make_dirs_says_what_it_made_and_remove_made_takes_away_only_that(tmp_path,
                                                                        monkeypatch):
    """make_dirs creates the missing folders and returns them outermost first; one that cannot
    be created leaves none of those made before it; remove_made stops at a folder that holds
    something else."""
    import errno
    from pathlib import Path

    from packtool.location import make_dirs, remove_made

    made = make_dirs(tmp_path / "a" / "b" / "c")
    assert made == (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c")
    assert make_dirs(tmp_path / "a" / "b") == ()
    (tmp_path / "a" / "b" / "other").write_text("x")
    remove_made(made)  # c goes; b holds a file of its own: b and a stay
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["other"]
    real = Path.mkdir

    def refuse_q(self, *a, **kw):
        if self.name == "q":
            raise OSError(errno.EACCES, "Permission denied", str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", refuse_q)
    with pytest.raises(OSError):
        make_dirs(tmp_path / "m" / "o" / "q" / "r")  # m and o are made, then q fails
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("capacity", [0, 1, -4, 10**12])
def test_bad_capacity(tmp_path, good, capacity):
    out = tmp_path / "out"
    refused(pack_args(good, out=out, capacity=capacity), out, f"--capacity {capacity}",
            "must be in 2..", code=2)


def test_capacity_not_a_number_is_a_usage_error(tmp_path, good):
    out = tmp_path / "out"
    refused(pack_args(good, out=out, capacity="big"), out, "--capacity", "not a valid integer",
            code=2)


def test_missing_output_is_a_usage_error(tmp_path, good):
    refused(["pack", good], tmp_path / "out", "INPUT", "OUTPUT", code=2)


@pytest.mark.parametrize("pad_id", [2**31, -(2**31) - 1, -1, -100])
def test_pad_id_outside_int32(tmp_path, good, pad_id):
    """Padding ids must be valid token ids: negative ones would index an embedding out of range."""
    out = tmp_path / "out"
    refused(pack_args(good, out=out, extra=("--pad-id", pad_id)), out, f"--pad-id {pad_id}",
            "int32", code=2)


def test_output_equal_to_input(tmp_path, good):
    before = hash_tree(good.parent)
    refused(pack_args(good.parent, out=good.parent), tmp_path / "absent", "overlaps INPUT",
            "outside the input")
    assert hash_tree(good.parent) == before


def test_output_inside_input(tmp_path, good):
    out = good.parent / "packed"
    refused(pack_args(good.parent, out=out), out, "overlaps INPUT")


def test_input_inside_output(tmp_path):
    src = write_docs(tmp_path / "out" / "in" / "a.parquet", [[1, 2]])
    before = hash_tree(tmp_path / "out")
    res = invoke(pack_args(src, out=tmp_path / "out"))
    assert res.exit_code == 1 and "overlaps INPUT" in res.output
    assert hash_tree(tmp_path / "out") == before


def test_output_is_an_existing_file(tmp_path, good):
    f = tmp_path / "out.txt"
    f.write_text("keep me")
    refused(pack_args(good, out=f), tmp_path / "absent", "out.txt", "is a file", "directory")
    assert f.read_text() == "keep me"


def test_unwritable_output(tmp_path, good):
    """OUTPUT under a regular file cannot be created (root ignores permission bits)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    out = blocker / "out"
    refused(pack_args(good, out=out), out, "cannot write", "writable OUTPUT")


def test_non_empty_output_is_kept_without_overwrite(tmp_path, good):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("data")
    res = invoke(pack_args(good, out=out))
    assert res.exit_code == 1 and "--overwrite" in res.output
    assert sorted(os.listdir(out)) == ["precious.txt"]


def test_bad_input_leaves_an_existing_output_dir_as_it_was(tmp_path):
    """A value error found while reading (after OUTPUT was prepared) removes what it made."""
    write_docs(tmp_path / "neg.parquet", [[1, -1]])
    out = tmp_path / "out"
    out.mkdir()
    res = invoke(pack_args(tmp_path / "neg.parquet", out=out))
    assert res.exit_code == 1 and "negative" in res.output
    assert os.listdir(out) == []


def test_debug_shows_the_traceback(tmp_path):
    write_docs(tmp_path / "neg.parquet", [[1, -1]])
    res = invoke(["--debug", *pack_args(tmp_path / "neg.parquet", out=tmp_path / "out")])
    assert res.exit_code != 0
    assert type(res.exception).__name__ == "SchemaError"


def test_real_process_prints_one_stderr_line(tmp_path):
    """Outside the test runner too: one line on stderr, exit 1, empty stdout."""
    write_docs(tmp_path / "neg.parquet", [[1, 2], [3, -5]])
    proc = subprocess.run([sys.executable, "-m", "packtool", "pack", "-q", "--capacity", "4",
                           str(tmp_path / "neg.parquet"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("Error: ")
    assert "row 1" in proc.stderr and "Traceback" not in proc.stderr


# ---- a damaged packed directory: the manifest's sizes and checksums catch it ---------------

@pytest.fixture
def packed(tmp_path):
    src = write_docs(tmp_path / "in" / "a.parquet", [[i + 1] * (i % 5 + 1) for i in range(40)])
    out = tmp_path / "packed"
    res = invoke(["pack", "-q", "--capacity", 8, "--rows-per-shard", 4, src, out])
    assert res.exit_code == 0, res.output
    assert len(load_manifest(out, check_hashes=True).shards) >= 3
    return out


def test_manifest_refuses_missing_shard(packed):
    (packed / "part-00001.parquet").unlink()
    with pytest.raises(ManifestError, match=r"part-00001\.parquet: shard listed .* missing"):
        load_manifest(packed)


def test_manifest_refuses_resized_shard(packed):
    with open(packed / "part-00000.parquet", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ManifestError, match=r"part-00000\.parquet: size .* modified"):
        load_manifest(packed)


def test_manifest_refuses_edited_shard_of_same_size(packed):
    p = packed / "part-00002.parquet"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    load_manifest(packed)  # the cheap check (sizes) cannot see it ...
    with pytest.raises(ManifestError, match=r"part-00002\.parquet: sha256 differs"):
        load_manifest(packed, check_hashes=True)  # ... the checksums do


def test_manifest_refuses_extra_shard(packed):
    (packed / "part-00099.parquet").write_bytes((packed / "part-00000.parquet").read_bytes())
    with pytest.raises(ManifestError, match=r"part-00099\.parquet: shard not listed"):
        load_manifest(packed)


@pytest.mark.parametrize("stray", [
    "backup.parquet",  # every reader of the folder reads it
    "old/part-00000.parquet",  # pyarrow, datasets, polars' and duckdb's folder scans
    "a/b/c/part-00000.parquet",
    ".backup.parquet",  # polars' and duckdb's *.parquet globs match hidden names
    "_old/part-00000.parquet",  # and '_' folders (datasets reads those too)
    "backup.pq",  # pyarrow.dataset and datasets read any file not hidden, Parquet by content
    "old/part-00000",
])
def test_a_parquet_file_the_manifest_does_not_list_is_refused_by_stats_and_verify(packed, stray):
    """A copy of a shard anywhere under OUTPUT that a third-party reader of the folder reads
    (pq.read_table(OUT) then returns duplicated rows): the integrity check every reader shares
    refuses it, in one line naming it and the fix, as stats and verify --data-only do."""
    target = packed / stray
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes((packed / "part-00000.parquet").read_bytes())
    with pytest.raises(ManifestError) as err:
        load_manifest(packed)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{target}: a Parquet file the manifest does not "
                                              "list"), msg
    assert msg.endswith(f"move it out of {packed}"), msg
    for args in (["stats", packed], ["verify", "--data-only", packed]):
        res = invoke(args)
        assert res.exit_code == 1 and f"{target}: a Parquet file the manifest" in res.output, (
            args, res.output)
    target.unlink()
    load_manifest(packed, check_hashes=True)


@pytest.mark.parametrize("other", ["README.md", "notes/run.log", ".cache/x.bin", "_logs/a.txt",
                                   ".old/part-00000"])
def test_files_no_reader_takes_as_rows_are_left_alone(packed, other):
    """Not Parquet, or Parquet under a hidden name without the .parquet suffix (which no reader
    of the folder reads): not refused."""
    target = packed / other
    target.parent.mkdir(parents=True, exist_ok=True)
    data = (packed / "part-00000.parquet").read_bytes() if "part" in other else b"text\n"
    target.write_bytes(data)
    load_manifest(packed, check_hashes=True)



def test_a_named_pipe_in_output_is_no_stray_and_never_blocks_the_check(packed):
    """A FIFO (or another file that is not a regular one) under OUTPUT: no reader takes it as
    rows, and the check, which reads the first bytes of the files it does not know, must not
    open it (the open waits for a writer forever: stats and verify hung, deaf to Ctrl-C). Run
    in a subprocess with a timeout so that a hang fails the test instead of the suite."""
    os.mkfifo(packed / "pipe")
    (packed / "sub").mkdir()
    os.mkfifo(packed / "sub" / "data")
    res = subprocess.run([sys.executable, "-m", "packtool", "verify", "--data-only", packed],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert res.returncode == 0, res.stderr

def test_manifest_refuses_directory_without_manifest(packed):
    (packed / MANIFEST_NAME).unlink()
    with pytest.raises(ManifestError, match="no .packtool-manifest.parquet"):
        load_manifest(packed)


def test_manifest_refuses_garbled_manifest(packed):
    (packed / MANIFEST_NAME).write_text(json.dumps({"format_version": 1})[:-3])
    with pytest.raises(ManifestError, match="unreadable manifest"):
        load_manifest(packed)


def test_same_file_given_twice_is_refused(tmp_path, good):
    """A file listed twice (directly and through its directory) would pack its documents twice."""
    out = tmp_path / "out"
    refused(pack_args(good.parent, good, out=out), out, "a.parquet", "given twice")


def test_workers_zero_is_refused(tmp_path, good):
    out = tmp_path / "out"
    refused(pack_args(good, out=out, extra=("--workers", 0)), out, "--workers 0", ">= 1", code=2)


def test_upper_case_parquet_suffix_is_found(tmp_path):
    src = tmp_path / "in"
    write_docs(src / "A.PARQUET", [[1, 2, 3]])
    out = tmp_path / "out"
    res = invoke(pack_args(src, out=out))
    assert res.exit_code == 0, res.output
    assert read_manifest(out).totals.tokens_in == 3


def _duplicated(path: Path, names: list[str]) -> Path:
    """A file whose columns are ``names`` (repeats allowed): list<int32> token-like columns,
    strings for a name starting with ``src``. Written as Parquet, Arrow IPC (file) or an Arrow
    IPC stream inside a ``save_to_disk`` folder, after ``path``'s suffix (a folder: none)."""
    ids = pa.array([[1, 2, 3], [4, 5]], pa.list_(pa.int32()))
    cols = [pa.array(["a", "b"]) if n.startswith("src") else ids for n in names]
    table = pa.Table.from_arrays(cols, names=names)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    elif path.suffix == ".arrow":
        import pyarrow.feather as feather

        feather.write_feather(table, path)
    else:  # what datasets' save_to_disk writes: IPC streams listed in state.json
        path.mkdir()
        with pa.ipc.new_stream(path / "data-00000-of-00001.arrow", table.schema) as w:
            w.write_table(table)
        (path / "dataset_info.json").write_text(json.dumps({"features": {}}))
        (path / "state.json").write_text(json.dumps(
            {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}))
    return path


@pytest.mark.parametrize("name", ["d.parquet", "d.arrow", "hf"])
@pytest.mark.parametrize("names,column,extra", [
    (["input_ids", "input_ids"], "input_ids", []),
    (["input_ids", "labels", "labels"], "labels", []),  # read under --labels-column auto
    (["input_ids", "attention_mask", "x", "attention_mask"], "attention_mask", []),
    (["input_ids", "completion_mask", "completion_mask", "completion_mask"], "completion_mask",
     []),
    (["input_ids", "src", "src"], "src", ["--source-column", "src"]),
], ids=["token", "labels", "attention-mask", "loss-mask", "source"])
def test_a_column_read_twice_is_refused_in_one_line(tmp_path, name, names, column, extra):
    """A column packtool reads that a file holds twice is ambiguous: ``pack`` and ``compare``
    refuse it in one line naming the file, the column and the fix, and write nothing (it was
    an internal KeyError)."""
    src = _duplicated(tmp_path / "in" / name, names)
    out = tmp_path / "out"
    times = names.count(column)
    shown = src / "data-00000-of-00001.arrow" if name == "hf" else src
    refused(pack_args(src, out=out, extra=extra), out,
            f"{shown}: column {column!r} appears {times} times; rename or drop one")
    if extra:  # --source-column is pack's alone
        return
    res = invoke(["compare", "-c", 4, src])
    assert res.exit_code == 1, res.output
    assert res.output.strip() == (f"Error: {shown}: column {column!r} appears {times} times; "
                                  "rename or drop one")


@pytest.mark.parametrize("name", ["d.parquet", "d.arrow", "hf"])
def test_a_duplicated_column_that_is_not_read_still_packs(tmp_path, name):
    """Duplicates packtool does not read are left alone: an unused column, or a mask column
    switched off."""
    src = _duplicated(tmp_path / "in" / name, ["input_ids", "other", "labels", "other",
                                               "labels"])
    res = invoke(pack_args(src, out=tmp_path / "out", extra=["--labels-column", "none"]))
    assert res.exit_code == 0, res.output
    rows, _ = read_output(tmp_path / "out")
    check_output(rows, [[1, 2, 3], [4, 5]], 4, labels="none")


def _latin1_name(folder: Path, name: bytes, data: bytes) -> bytes:
    """Write ``data`` under a file name that is not valid UTF-8; skip where the filesystem
    refuses such names."""
    folder.mkdir(parents=True, exist_ok=True)
    path = os.fsencode(folder) + b"/" + name
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError:
        pytest.skip("this filesystem takes UTF-8 names only")
    return path


def test_a_file_name_that_is_not_utf8_is_refused_naming_its_folder_and_bytes(tmp_path, good):
    """pyarrow names files in UTF-8 only: the Latin-1 name of a legacy tool was an internal
    error (UnicodeDecodeError); now one line names the folder, the name's bytes and the fix."""
    src = good.parent
    _latin1_name(src, b"caf\xe9.parquet", good.read_bytes())
    out = tmp_path / "out"
    refused(pack_args(src, out=out), out, f"{src}: holds a name that is not valid UTF-8",
            "b'caf\\xe9.parquet'", "rename it")
    path = os.fsdecode(os.fsencode(src) + b"/caf\xe9.parquet")
    refused(pack_args(path, out=out), out, "caf\\xe9.parquet", "not valid UTF-8", "rename it")


def test_a_hidden_name_that_is_not_utf8_is_skipped_like_any_hidden_entry(tmp_path, good):
    _latin1_name(good.parent, b".caf\xe9.parquet", good.read_bytes())
    _latin1_name(good.parent, b"notes-\xe9.md", b"text")
    res = invoke(["pack", "--capacity", 4, good.parent, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    assert "1 documentation: " in res.output and "notes-\\xe9.md" in res.output
    assert "1 hidden or '_'-prefixed: " in res.output and ".caf\\xe9.parquet" in res.output
    assert read_output(tmp_path / "out")[1].totals.docs_in == 2


def _run_without_root_powers(args):
    """``python -m packtool ARGS`` in a process that obeys permission bits
    (:func:`packcheck.run_without_root_powers`)."""
    from packcheck import run_without_root_powers

    return run_without_root_powers([sys.executable, "-m", "packtool", *args])


@pytest.mark.parametrize("what", ["file", "folder"])
def test_permission_denied_says_to_fix_the_permissions(tmp_path, good, what):
    """Not "remove or regenerate it" (the data is fine) and not pyarrow's own text."""
    locked = good.parent / ("b.parquet" if what == "file" else "sub")
    if what == "file":
        locked.write_bytes(good.read_bytes())
    else:
        write_docs(locked / "b.parquet", [[7, 8]])
    locked.chmod(0)
    try:
        proc = _run_without_root_powers(["pack", "-q", "--capacity", 4, good.parent,
                                         tmp_path / "out"])
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == (f"Error: {locked}: permission denied: fix its permissions "
                                   "(packtool must read it), or move it out of INPUT")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["stats"], ["verify", "--data-only"],
                                     ["export", "--to", "nemo"]])
def test_an_unreadable_packed_output_says_to_fix_the_permissions(tmp_path, good, command):
    """stats, verify and export of an OUTPUT its user may not read: one line naming the file and
    the fix, exit 1 (it was the bare 'Permission denied')."""
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "--capacity", 4, good.parent, out]).exit_code == 0
    args = [*command, out] + ([tmp_path / "dest"] if command[0] == "export" else [])
    out.chmod(0)
    try:
        proc = _run_without_root_powers(args)
    finally:
        out.chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and line.startswith(f"Error: {out}"), line
    assert "permission denied: fix its permissions" in line, line


def test_a_file_compressed_whole_is_told_to_be_decompressed(tmp_path, good):
    import gzip

    src = good.parent
    (src / "b.parquet.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(16))
    out = tmp_path / "out"
    refused(pack_args(src, out=out), out, "b.parquet.zst is compressed whole: decompress it")
    refused(pack_args(src / "b.parquet.zst", out=out), out, "b.parquet.zst: is compressed whole",
            "decompress it")
    (tmp_path / "c.parquet").write_bytes(gzip.compress(good.read_bytes()))
    refused(pack_args(tmp_path / "c.parquet", out=out), out,
            "c.parquet: is a gzip-compressed file, not Parquet; decompress it (gunzip)")
    res = invoke(["pack", "--skip-unsupported", "--capacity", 4, src, out])
    assert res.exit_code == 0 and "compressed whole, decompress it to read it: " in res.output


def test_a_file_of_the_other_format_is_told_to_be_renamed(tmp_path):
    table = pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32()))})
    with pa.ipc.new_file(tmp_path / "ipc.parquet", table.schema) as w:
        w.write_table(table)
    with pa.ipc.new_stream(tmp_path / "stream.parquet", table.schema) as w:
        w.write_table(table)
    pq.write_table(table, tmp_path / "pq.arrow")
    out = tmp_path / "out"
    for name in ("ipc.parquet", "stream.parquet"):
        refused(pack_args(tmp_path / name, out=out), out,
                f"{name}: is an Arrow IPC file named like a Parquet file; rename it to *.arrow")
    refused(pack_args(tmp_path / "pq.arrow", out=out), out,
            "pq.arrow: is a Parquet file named like an Arrow IPC file; rename it to *.parquet")


def test_a_quoted_glob_pattern_is_said_to_be_the_shells_to_expand(tmp_path, monkeypatch):
    """A quoted pattern as INPUT (``"dir/year=2024/*"``) said only "no such file or directory;
    check the INPUT path". packtool reads names as they are: the line now says so and the fix
    (unquoted for the shell, or the folder), for pack, compare and the commands taking an
    OUTPUT, and for a store prefix (no shell expands a URI) and the loader too. A name that
    exists with such characters is read, and a missing file under it is a plain missing file."""
    from packtool.loader import PackedDataset
    from packtool.location import Location

    monkeypatch.chdir(tmp_path)
    docs = [[1, 2, 3], [4, 5]]
    write_docs(tmp_path / "dir" / "year=2024" / "a.parquet", docs)
    note = "packtool does not expand patterns (*, ?, [...]): leave it unquoted for the shell to "
    for given, folder in (("dir/year=2024/*", "the folder dir/year=2024"),
                          ("dir/*/a.parquet", "the folder dir"),
                          ("dir/year=202[34]", "the folder dir"),
                          ("*.parquet", "the folder holding the files"),
                          (f"{tmp_path}/dir/year=2024/?.parquet",
                           f"the folder {tmp_path}/dir/year=2024")):
        refused(["pack", "-c", 4, given, "out"], tmp_path / "out",
                f"Error: {given}: no such file or directory; {note}expand, or pass {folder}")
    refused(["compare", "dir/*", "-c", 4], tmp_path / "out",
            f"Error: dir/*: no such file or directory; {note}expand, or pass the folder dir")
    refused(["compare", "*.parquet", "-c", 4], tmp_path / "out",
            f"Error: *.parquet: no such file or directory; {note}expand, or pass the folder "
            "holding the files")
    # an argument that is one packed OUTPUT: neither the shell's expansion (several names) nor
    # the folder holding the outputs (no manifest there) is one; the fix is one OUTPUT
    write_docs(tmp_path / "packs" / "keep.parquet", docs)
    for args in (["stats", "pk*"], ["verify", "pk*"], ["export", "--to", "nemo", "pk*", "d"],
                 ["upgrade", "pk*"], ["stats", "packs/pk*"], ["verify", "packs/pk[12]"]):
        given = next(a for a in args if "pk" in a)
        assert refused(args, tmp_path / "d") == (
            f"Error: {given}: no such file or directory; packtool does not expand patterns "
            "(*, ?, [...]); pass one OUTPUT directory of packtool pack")
    with pytest.raises(ManifestError, match=r"^out\*: no such directory; packtool does not "
                       r"expand patterns \(\*, \?, \[\.\.\.\]\); pass one OUTPUT directory "
                       r"of packtool pack$"):
        PackedDataset("out*")
    assert Location.parse("s3://b/pk*?endpoint_override=h:1").missing_fix(
        "check", packed_output=True) == ("packtool does not expand patterns (*, ?, [...]); pass "
                                         "the prefix of one OUTPUT of packtool pack")
    assert Location.parse("s3://b/dir/y=*/a?endpoint_override=h:1").missing_fix("check") == (
        "packtool does not expand patterns (*, ?, [...]), and no shell expands a URI: pass the "
        "prefix s3://b/dir?endpoint_override=h:1")
    # a name that exists with such characters is read as it is
    write_docs(tmp_path / "odd[1]" / "a*.parquet", docs)
    res = invoke(["pack", "-q", "-c", 4, "odd[1]/a*.parquet", "out"])
    assert res.exit_code == 0, res.output
    refused(["pack", "-c", 4, "odd[1]/b.parquet", "out2"], tmp_path / "out2",
            "Error: odd[1]/b.parquet: no such file or directory; check the INPUT path")


@pytest.mark.parametrize("option, holds, without", [
    ("--source-column", "each document's source (a string or integer per document)",
     "drop --source-column"),
    ("--attention-mask-column", "the attention mask (0 or 1 per token)",
     "pass --attention-mask-column none"),
    ("--labels-column", "the labels (-100 or the token itself, per token)",
     "pass --labels-column none"),
    ("--loss-mask-column", "the loss mask (1 on the tokens to learn, 0 elsewhere)",
     "pass --loss-mask-column none")])
def test_a_column_option_naming_the_token_column_says_the_fix(tmp_path, option, holds, without):
    """``--source-column input_ids`` (and each mask column option) said only "is the token
    column (--column input_ids)"; the line now names the fix: another column (what it holds),
    packing without it, or the real token column with --column. The reader's own check (a
    Python caller of resolve_mask_columns) lists the file's columns too."""
    import packtool
    from packtool.errors import ConfigError, SchemaError
    from packtool.formats.reader import resolve_mask_columns

    src = write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3], [4, 5]])
    fix = (f"is the token column (--column input_ids); name another column, the one holding "
           f"{holds}, or {without}; if input_ids is not the token column, give the token "
           "column with --column NAME")
    for command in (["pack", "-c", 4, option, "input_ids", src, tmp_path / "out"],
                    ["compare", "-c", 4, option, "input_ids", src]):
        if command[0] == "compare" and option == "--source-column":
            continue  # compare takes no --source-column
        refused(command, tmp_path / "out", f"Error: {option} 'input_ids': {fix}", code=2)
    keyword = option[2:].replace("-", "_")
    with pytest.raises(ConfigError, match=rf"^{keyword}='input_ids': is the token column "
                       r"\(column='input_ids'\); name another column, the one holding "):
        packtool.pack(src, tmp_path / "out", capacity=4, **{keyword: "input_ids"})
    if option != "--source-column":
        schema = pq.read_schema(src)
        with pytest.raises(SchemaError) as got:
            resolve_mask_columns(schema, src, "input_ids", **{keyword[:-len("_column")]:
                                                               "input_ids"})
        assert str(got.value) == (f"{src}: {option} 'input_ids' is the token column; "
                                  + fix.split("; ", 1)[1] + " (its columns: input_ids)")


def _run_cli(*args, timeout=120):
    """``python -m packtool ARGS`` in a subprocess with a timeout: a hang fails the test, not
    the suite."""
    return subprocess.run([sys.executable, "-m", "packtool", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
@pytest.mark.parametrize("command", [("pack", "-q", "--capacity", "4"), ("compare", "--capacity", "4")])
def test_a_named_pipe_given_as_input_is_refused_without_opening_it(tmp_path, command):
    """A FIFO as INPUT: opening it waits for a writer forever, deaf to Ctrl-C and SIGTERM (the
    open is in C). Every command that lists inputs refuses it in one line, before any open
    (tokenize: tests/test_tokenize.py)."""
    fifo = tmp_path / "f.parquet"
    os.mkfifo(fifo)
    out = [tmp_path / "out"] if command[0] != "compare" else []
    res = _run_cli(*command, fifo, *out)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.stderr
    assert f"{fifo}: not a regular file (a named pipe); pass a file" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/urandom"),
                    reason="no named pipes or /dev/urandom here")
def test_a_named_pipe_or_device_inside_input_is_listed_as_skipped(tmp_path, good):
    """A FIFO or a link to /dev/urandom named *.parquet inside an INPUT folder is never
    opened (it would hang or read forever) and is named among the entries not read."""
    os.mkfifo(good.parent / "f.parquet")
    os.symlink("/dev/urandom", good.parent / "u.parquet")
    from packtool.formats.reader import discover

    d = discover([good.parent])
    assert [f.path.name for f in d.files] == ["a.parquet"]
    assert f"{good.parent / 'f.parquet'} (not a regular file: a named pipe)" in d.skipped
    assert f"{good.parent / 'u.parquet'} (not a regular file: a character device)" in d.skipped
    res = _run_cli("pack", "--capacity", 4, good.parent, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert "not a regular file: a named pipe:" in res.stderr + res.stdout
    assert "not a regular file: a character device:" in res.stderr + res.stdout


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null here")
def test_a_device_given_as_input_is_refused():
    from packtool.errors import InputError
    from packtool.formats.reader import discover

    for text in (False, True):
        with pytest.raises(InputError, match=r"/dev/null: not a regular file \(a character "
                                             r"device\); pass a file"):
            discover(["/dev/null"], text=text)


@pytest.mark.parametrize("what", ["file", "folder"])
@pytest.mark.parametrize("command", ["pack", "compare", "tokenize"])
def test_an_unreadable_input_given_directly_is_one_line(tmp_path, good, monkeypatch, what,
                                                        command):
    """An INPUT file or folder packtool may not read (chmod 000), given as INPUT itself: the
    one line a file inside an INPUT folder gets (permission denied: fix its permissions ...),
    exit 1, not click's three-line usage error (exit 2). The permission is simulated (root
    reads everything)."""
    denied = good if what == "file" else good.parent
    real = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode, *a, **k: False if Path(p) == denied
                        else real(p, mode, *a, **k))
    out = tmp_path / "out"
    args = {"pack": ["pack", "-q", "--capacity", 4, denied, out],
            "compare": ["compare", "--capacity", 4, denied],
            "tokenize": ["tokenize", "-q", "--tokenizer", good, denied, out]}[command]
    if command == "tokenize":  # its tokenizer file is looked at first: a real one is not needed
        pytest.importorskip("tokenizers")
    line = refused(args, out, f"{denied}: permission denied: fix its permissions", code=1) \
        if command != "tokenize" else None
    if command == "tokenize":
        res = invoke(args)
        assert "is not readable" not in res.output and "Usage:" not in res.output, res.output
    else:
        assert "is not readable" not in line


def test_a_shard_of_empty_lists_typed_null_names_the_cast(tmp_path, good):
    """pyarrow infers list<null> for a column whose lists are all empty (a shard whose documents
    were all filtered away): the refusal said it 'holds lists of null values, not one list of
    token ids per document ... pass --column NAME', a fix that does not apply. It now says what
    the type means and gives the cast that makes the shard's documents empty ones, which the
    pack then skips."""
    bad = tmp_path / "in" / "b.parquet"
    bad.parent.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[], []])}), bad)
    assert pq.read_schema(bad).field("input_ids").type == pa.list_(pa.null())
    line = refused(pack_args(good, bad, out=tmp_path / "out"), tmp_path / "out", str(bad),
                   "Arrow infers when every list is empty", "cast(pa.list_(pa.int32()))")
    assert "--column" not in line
    # the fix the line gives works: the cast shard packs, its two documents skipped as empty
    t = pq.read_table(bad)
    t = t.set_column(t.schema.get_field_index("input_ids"), "input_ids",
                     t["input_ids"].cast(pa.list_(pa.int32())))
    pq.write_table(t, bad)
    res = invoke(pack_args(good, bad, out=tmp_path / "out"))
    assert res.exit_code == 0, res.output
    assert read_manifest(tmp_path / "out").totals.docs_empty == 2
