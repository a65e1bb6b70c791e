"""What pack, tokenize, stats and verify say of inputs a new user gives them: each message is
one line, names what was found and gives a fix that works when followed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import invoke, write_docs


def error_line(args, code: int = 1) -> str:
    """Run ``packtool ARGS``: it fails with ``code`` and exactly one line, ``Error: ...``."""
    res = invoke(args)
    assert res.exit_code == code, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    return lines[0]


def test_damaged_page_quotes_the_library_error_in_one_line(tmp_path):
    """A Parquet file whose footer is intact but whose pages were cut: pyarrow's error runs over
    several lines (``Couldn't deserialize thrift ...\\nDeserializing page header failed.``);
    the message quotes its first line only."""
    src = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[i, i + 1, i + 2] for i in range(2000)],
                                                   pa.list_(pa.int32()))}), src,
                   compression="none")
    data = src.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[:4] + data[400:])  # pages cut, footer whole
    line = error_line(["pack", "-q", "-c", 8, cut, tmp_path / "out"])
    assert "cut.parquet: row group 0 cannot be read" in line
    assert "thrift" in line and "regenerate it" in line
    assert not (tmp_path / "out").exists()


def tokens_table(docs, column="input_ids"):
    return pa.table({column: pa.array(docs, pa.list_(pa.int32()))})


@pytest.mark.parametrize("name", ["lfs.parquet", "lfs.arrow"])
def test_git_lfs_pointer_says_git_lfs_pull(tmp_path, name):
    """A clone without ``git lfs pull`` holds a small text pointer in place of each file."""
    src = tmp_path / name
    src.write_text("version https://git-lfs.github.com/spec/v1\n"
                   "oid sha256:" + "0" * 64 + "\nsize 12345\n")
    line = error_line(["pack", "-q", "-c", 8, src, tmp_path / "out"])
    assert f"{name}: is a Git LFS pointer, not the data" in line
    assert "git lfs pull" in line and "not a readable" not in line


@pytest.mark.parametrize("name", ["x.pq", "noext"])
def test_parquet_named_otherwise_says_rename_it(tmp_path, name):
    """A Parquet file named .pq (or nothing) was told to be converted to Parquet."""
    src = tmp_path / name
    pq.write_table(tokens_table([[1, 2, 3]]), src)
    line = error_line(["pack", "-q", "-c", 8, src, tmp_path / "out"])
    assert "is a Parquet file" in line and "rename it to *.parquet" in line
    assert "convert" not in line
    renamed = tmp_path / "renamed.parquet"
    src.rename(renamed)
    assert invoke(["pack", "-q", "-c", 8, renamed, tmp_path / "out"]).exit_code == 0


def test_parquet_named_otherwise_in_a_folder_is_named_refused_and_skipped(tmp_path):
    from packtool.formats.reader import discover

    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(tokens_table([[1, 2, 3]]), d / "a.parquet")
    pq.write_table(tokens_table([[4, 5]]), d / "b.pq")
    line = error_line(["pack", "-q", "-c", 8, d, tmp_path / "out"])
    assert "b.pq is a Parquet file" in line and "rename it to *.parquet" in line
    assert "convert them" not in line
    note = discover([d], skip_unsupported=True).skipped_note()
    assert "b.pq" in note and "rename it to *.parquet" in note, note


def test_data_only_under_an_underscore_folder_says_what_was_skipped(tmp_path):
    d = tmp_path / "under"
    (d / "_data").mkdir(parents=True)
    pq.write_table(tokens_table([[1, 2, 3]]), d / "_data" / "a.parquet")
    line = error_line(["pack", "-q", "-c", 8, d, tmp_path / "out"])
    assert f"skipped {d / '_data'}" in line and "Spark/Hadoop" in line, line
    assert invoke(["pack", "-q", "-c", 8, d / "_data", tmp_path / "out"]).exit_code == 0


def test_text_column_given_to_pack_names_tokenize(tmp_path):
    src = tmp_path / "text.parquet"
    pq.write_table(pa.table({"content": ["hello", "world"]}), src)
    line = error_line(["pack", "-q", "-c", 8, src, tmp_path / "out"])
    assert "holds text ('content'), not token ids" in line
    assert "packtool tokenize --tokenizer FILE --text-column content INPUT TOKENIZED" in line
    # beside a list of integers the file names that column, not tokenize
    pq.write_table(pa.table({"content": ["hello"], "ids": pa.array([[1, 2]])}), src)
    line = error_line(["pack", "-q", "-c", 8, src, tmp_path / "out"])
    assert "pass --column ids" in line and "tokenize" not in line, line


@pytest.mark.parametrize("column,says", [
    (pa.array([[[1, 2]], [[3]]]), "flatten"),
    (pa.array([7, 8]), "pass --column NAME"),
    (pa.array([True, False]), "pass --column NAME"),
    (pa.array([[True, False]]), "pass --column NAME"),
    (pa.array([{"a": 1}]), "pass --column NAME"),
    (pa.array([b"ab"]), "pass --column NAME"),
], ids=["nested-list", "int", "bool", "list-bool", "struct", "binary"])
def test_a_token_column_of_no_text_given_to_pack_is_not_told_to_tokenize(tmp_path, column, says):
    """Every token column of no list of integers was told to tokenize its text first: a nested
    list is flattened, and a column of another type names the column to pass."""
    src = tmp_path / "d.parquet"
    pq.write_table(pa.table({"input_ids": column}), src)
    line = error_line(["pack", "-q", "-c", 8, src, tmp_path / "out"])
    assert says in line and "tokenize" not in line and "file has" not in line, line


def _sft_file(path, **extra):
    """An SFT file: input_ids, attention_mask, labels (-100 on the prompt), and ``extra``."""
    ids = [[5, 6, 7, 8], [9, 10, 11]]
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": [[1] * 4, [1] * 3],
                             "labels": [[-100, -100, 7, 8], [-100, 10, 11]],
                             "completion_mask": [[0, 0, 1, 1], [0, 1, 1]], **extra}), path)
    return path


@pytest.mark.parametrize("column,option,holds", [
    ("labels", "--labels-column", "the labels"),
    ("attention_mask", "--attention-mask-column", "the attention mask"),
    ("completion_mask", "--loss-mask-column", "the loss mask"),
])
def test_a_labels_or_mask_column_given_as_the_token_column_is_named_as_such(tmp_path, column,
                                                                            option, holds):
    """``--column labels`` of an SFT file said only "negative token id -100"; ``--column
    attention_mask`` that a label "is neither -100 nor its token 1 ... pass --labels-column
    none" (the labels column blamed for the wrong --column); ``--column completion_mask``
    packed the loss mask as token ids. Each is refused naming what the column is (the one
    the mask option reads under auto) and the token column to pass; the option's ``none``
    lets such a column be the token column."""
    import packtool
    from packtool.errors import SchemaError

    src = _sft_file(tmp_path / "sft.parquet")
    for command in (["pack", "-q", "-c", 64, "--column", column, src, tmp_path / "out"],
                    ["compare", "-c", 64, "--column", column, src]):
        line = error_line(command)
        assert line.startswith(f"Error: {src}: --column {column!r} is the column read as "
                               f"{holds} ("), line
        assert line.endswith(f"under {option} auto, not the token ids; pass --column input_ids; "
                             f"if {column!r} does hold the token ids, pass {option} none"), line
        assert not (tmp_path / "out").exists()
    keyword = option[2:].replace("-", "_")
    with pytest.raises(SchemaError) as exc:
        packtool.pack_dataset(pq.read_table(src), 64, column=column)
    msg = str(exc.value)
    assert msg.startswith(f"documents: column={column!r} is the column read as {holds} ("), msg
    assert msg.endswith(f"under {keyword}='auto', not the token ids; pass column='input_ids'; "
                        f"if {column!r} does hold the token ids, pass {keyword}=None"), msg
    if column != "labels":  # told so, the column is packed as the token ids
        res = invoke(["pack", "-q", "-c", 64, "--column", column, option, "none",
                      "--labels-column", "none", src, tmp_path / "out"])
        assert res.exit_code == 0, res.output


@pytest.mark.parametrize("name,fix", [("lbl", "pass --column input_ids"),
                                      ("target_labels", "pass --column input_ids"),
                                      ("lbl", "pass --column NAME")],
                         ids=["-100", "named-labels", "no-candidate"])
def test_a_token_column_holding_minus_100_is_told_it_looks_like_labels(tmp_path, name, fix):
    """A token column holding -100 (labels of another name, or the labels column with
    --labels-column none) said only "negative token id -100; token ids must be >= 0": the line
    says -100 is the ignore index of labels and names the token column to pass."""
    import packtool
    from packtool.errors import SchemaError

    src = tmp_path / "d.parquet"
    labels = [[-100, -100, 7, 8], [-100, 10, 11]]
    cols = {name: labels} if fix.endswith("NAME") else {"input_ids": [[5, 6, 7, 8], [9, 10, 11]],
                                                         name: labels}
    pq.write_table(pa.table(cols), src)
    line = error_line(["pack", "-q", "-c", 64, "--column", name, src, tmp_path / "out"])
    assert line == (f"Error: {src}: row 0 (0-based): negative token id -100; token ids must be "
                    f">= 0; -100 is the ignore index of labels: {name!r} looks like a labels "
                    f"column, not the token ids; {fix}"), line
    with pytest.raises(SchemaError) as exc:
        packtool.pack_dataset(pa.table(cols), 64, column=name)
    assert str(exc.value).endswith(fix.replace("--column ", "column=").replace(
        "=input_ids", "='input_ids'")), str(exc.value)
    # the labels column itself, --labels-column none: the same line
    sft = _sft_file(tmp_path / "sft.parquet")
    line = error_line(["pack", "-q", "-c", 64, "--column", "labels", "--labels-column", "none",
                       sft, tmp_path / "out"])
    assert line.endswith("-100 is the ignore index of labels: 'labels' looks like a labels "
                         "column, not the token ids; pass --column input_ids"), line


def test_files_naming_the_token_column_differently_are_named(tmp_path):
    """The fix one file's refusal gave (--column tokens) failed on the other file."""
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(tokens_table([[1, 2, 3]]), d / "a.parquet")
    pq.write_table(tokens_table([[4, 5]], "tokens"), d / "b.parquet")
    pq.write_table(tokens_table([[6]], "tokens"), d / "c.parquet")
    for args in (["pack", "-q", "-c", 8, d, tmp_path / "out"],
                 ["pack", "-q", "-c", 8, "--column", "tokens", d, tmp_path / "out"],
                 ["compare", "-c", 8, d]):
        line = error_line(args)
        assert "name their token column differently" in line, line
        assert "a.parquet holds 'input_ids'" in line
        assert "b.parquet and 1 more hold 'tokens'" in line


def test_partition_key_in_paths_is_not_a_column(tmp_path):
    d = tmp_path / "hive"
    for lang, docs in (("en", [[1, 2]]), ("fr", [[3, 4, 5]])):
        (d / f"lang={lang}").mkdir(parents=True)
        pq.write_table(tokens_table(docs), d / f"lang={lang}" / "a.parquet")
    line = error_line(["pack", "-q", "-c", 8, "--source-column", "lang", d, tmp_path / "out"])
    assert "'lang' is a partition key in the folder names (lang=en/)" in line, line
    command = line.split('python -c "')[1].split('"')[0]
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", command], check=True, cwd=tmp_path)
    written = Path(str(d) + ".parquet")
    assert written.exists()
    res = invoke(["pack", "-q", "-c", 8, "--source-column", "lang", written, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    # a column missing from files whose paths hold no such key: no word of partitions
    line = error_line(["pack", "-q", "-c", 8, "--source-column", "src", d, tmp_path / "o2"])
    assert "partition key" not in line


@pytest.mark.parametrize("column", [pa.array([], pa.null()), pa.array([], pa.float64()),
                                    pa.array([], pa.string()),
                                    pa.array([], pa.list_(pa.float32()))],
                         ids=["null", "double", "string", "list of float"])
def test_zero_row_shard_of_any_type_is_an_empty_shard(tmp_path, column):
    """A file of no rows holds no documents whatever its token column's type (pandas writes
    an empty object column as null, pandas 3 ``pd.DataFrame({'input_ids': []})`` as double):
    an empty shard for pack, compare and stats --compare; a file of rows in that type is
    still refused."""
    from packtool.formats.manifest import read_manifest

    d = tmp_path / "in"
    write_docs(d / "a.parquet", [[1, 2], [3, 4, 5]])
    pq.write_table(pa.table({"input_ids": column}), d / "b.parquet")
    assert pq.read_schema(d / "b.parquet").field("input_ids").type == column.type
    write_docs(d / "c.parquet", [[6]])
    res = invoke(["pack", "-q", "--no-shuffle", "-c", 8, d, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    m = read_manifest(tmp_path / "out")
    assert m.totals.docs_in == 3 and [i.rows for i in m.inputs] == [2, 0, 1]
    for args in (["compare", "-c", 8, d], ["stats", "--capacity", 8, "--compare", d]):
        res = invoke(args)
        assert res.exit_code == 0, res.output
    rows = (pa.nulls(2) if pa.types.is_null(column.type) else
            pa.array([[1.5]], pa.list_(pa.float32())) if pa.types.is_list(column.type) else
            pa.array([1.5 if pa.types.is_floating(column.type) else "x"], column.type))
    pq.write_table(pa.table({"input_ids": rows}), d / "d.parquet")
    line = error_line(["pack", "-q", "-c", 8, d, tmp_path / "o2"])
    assert "d.parquet" in line and "input_ids" in line, line


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A small tokenizer.json trained here (no download)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hello world"] * 10, tokenizers.trainers.BpeTrainer(vocab_size=50))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_jsonl_of_token_ids_says_how_to_get_parquet(tmp_path, tokenizer_file):
    """JSON Lines of token lists were sent to tokenize, which then refused them; pack and
    tokenize both give the conversion to Parquet, and following it packs."""
    import subprocess
    import sys

    src = tmp_path / "tok.jsonl"
    src.write_text("".join(json.dumps({"input_ids": [1, 2, i + 3]}) + "\n" for i in range(5)))
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "t.jsonl").write_text(src.read_text())
    lines = [error_line(["pack", "-q", "-c", 8, given, tmp_path / "out"])
             for given in (src, tmp_path / "only")]
    lines += [error_line(["tokenize", "-q", "--tokenizer", tokenizer_file, *extra, src,
                          tmp_path / "tok"]) for extra in ([], ["--text-column", "input_ids"])]
    for line in lines[:2]:  # pack wants token ids: only their format is wrong
        assert ("holds token ids (key 'input_ids', a list of integers) as JSON Lines, and "
                "packtool pack reads them from Parquet or Arrow only: convert it") in line, line
        assert "already" not in line and "not text" not in line, line
    for line in lines[2:]:
        assert "holds token ids already (key 'input_ids'" in line, line
    for line in lines:
        assert "pyarrow.json" in line and "packtool tokenize --tokenizer" not in line, line
    command = lines[0].split('python -c "')[1].split('"')[0]
    subprocess.run([sys.executable, "-c", command], check=True, cwd=os.getcwd())
    assert (tmp_path / "tok.parquet").exists()
    res = invoke(["pack", "-q", "-c", 8, tmp_path / "tok.parquet", tmp_path / "out"])
    assert res.exit_code == 0, res.output


def test_tokenize_of_tokenized_parquet_says_pack_it(tmp_path, tokenizer_file):
    src = tmp_path / "ids.parquet"
    pq.write_table(tokens_table([[1, 2, 3]], "tokens"), src)
    line = error_line(["tokenize", "-q", "--tokenizer", tokenizer_file, src, tmp_path / "t"])
    assert "already tokenized (column 'tokens'" in line
    assert f"packtool pack --capacity C --column tokens {src} OUTPUT" in line
    assert "--text-column NAME" not in line
    # a file of ids and a string column (the text under another name, or only a source
    # name): it looks tokenized, pack it; --text-column NAME is offered second
    both = tmp_path / "both.parquet"
    for names in (["content", "input_ids"], ["input_ids", "source"]):
        pq.write_table(pa.table({n: pa.array([[1]]) if n == "input_ids" else pa.array(["hi"])
                                 for n in names}), both)
        line = error_line(["tokenize", "-q", "--tokenizer", tokenizer_file, both,
                           tmp_path / "t"])
        assert line.endswith(f"no column 'text'; available columns: {', '.join(names)}; it "
                             "looks already tokenized (column 'input_ids' holds lists of "
                             f"integer token ids): pack it with packtool pack --capacity C "
                             f"{both} OUTPUT, or pass --text-column NAME if its text is in "
                             "another column"), line


@pytest.mark.parametrize("command", ["stats", "verify", "export --to nemo"])
def test_folder_above_a_packed_output_names_the_output(tmp_path, command):
    """``pack IN o/par/run1`` then ``stats o/par`` said the manifest of o/par was removed and
    to pack again with --overwrite: o/par is no output, run1 is a complete one."""
    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5]])
    above = tmp_path / "o" / "par"
    assert invoke(["pack", "-q", "-c", 8, src, above / "run1"]).exit_code == 0
    extra = [tmp_path / "nemo"] if command.startswith("export") else []
    line = error_line(command.split() + [above] + extra)
    assert "run1/ is a packed output" in line, line
    assert f"run packtool {command} {above / 'run1'}" in line
    assert "--overwrite" not in line and "removed" not in line
    assert invoke(["pack", "-q", "-c", 8, src, above / "run2"]).exit_code == 0
    line = error_line(command.split() + [tmp_path / "o"] + extra)
    assert "holds the packed outputs par/run1/, par/run2/" in line, line


@pytest.mark.parametrize("command", ["stats", "verify"])
def test_folder_above_a_packed_output_and_other_data_names_the_output(tmp_path, command):
    """A folder holding a packed output par/run1 and other data (its NeMo export, a loose
    tokenized file) was said to hold tokenized input and pointed at compare of the folder;
    it names the packed output below, and the other data as no part of it."""
    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5]])
    q = tmp_path / "q"
    assert invoke(["pack", "-q", "-c", 8, src, q / "par" / "run1"]).exit_code == 0
    res = invoke(["export", "--to", "nemo", q / "par" / "run1", q / "nemo"])
    assert res.exit_code == 0, res.output
    exported = sorted(p.relative_to(q).as_posix() for p in (q / "nemo").rglob("*.parquet"))
    assert exported, list((q / "nemo").iterdir())
    line = error_line([command, q])
    assert f"par/run1/ is a packed output: run packtool {command} {q / 'par' / 'run1'}" in line, \
        line
    assert f"{exported[0]} beside it is no packed output" in line, line
    assert "compare" not in line and "tokenized input" not in line, line
    write_docs(q / "loose.parquet", [[7, 8]])
    line = error_line([command, q])
    assert "par/run1/ is a packed output" in line and "beside it" in line, line


def test_loader_given_the_folder_above_a_packed_output_names_it(tmp_path):
    from packtool.errors import ManifestError
    from packtool.loader import PackedDataset

    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5]])
    assert invoke(["pack", "-q", "-c", 8, src, tmp_path / "par" / "run1"]).exit_code == 0
    with pytest.raises(ManifestError, match="run1/ is a packed output: give .*par/run1$"):
        PackedDataset(tmp_path / "par")
    # loose shards of a pack whose manifest is gone, beside no output: pack again
    (tmp_path / "par" / "run1" / ".packtool-manifest.parquet").unlink()
    line = error_line(["stats", tmp_path / "par"])
    assert "--overwrite" in line and "is a packed output" not in line
