"""The Python API: ``packtool.pack_dataset`` on a Dataset, an IterableDataset, a Table and a list
gives the rows ``packtool pack`` writes for the same documents, and ``packtool.pack`` is the
CLI's pack as a function."""

from __future__ import annotations

import gc
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import packtool
from packcheck import invoke, read_output
from packtool.errors import ConfigError, InputError, OutputError, PackingError, SchemaError

datasets = pytest.importorskip("datasets")


def sft_docs(n=150, seed=0):
    """Documents with an SFT ``labels`` column (a -100 prompt) and a padded ``attention_mask``."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(n):
        k = int(rng.integers(0, 90))
        ids = rng.integers(3, 5000, size=k).tolist()
        prompt = int(rng.integers(0, k + 1))
        pad = int(rng.integers(0, 3))
        rows.append({"input_ids": ids + [0] * pad,
                     "labels": [-100] * prompt + ids[prompt:] + [-100] * pad,
                     "attention_mask": [1] * k + [0] * pad,
                     "text": f"doc {d}"})
    return rows


CASES = {
    "defaults": ({}, []),
    "eos, stored shifted labels, ordered, no shuffle": (
        dict(append_eos=2, labels="shifted", strategy="ordered", shuffle=False),
        ["--append-eos", "2", "--labels", "shifted", "--strategy", "ordered", "--no-shuffle"]),
    "windows, truncate, seed": (
        dict(window_docs=40, overflow="truncate", seed=3, prepend_bos=1),
        ["--window-docs", "40", "--overflow", "truncate", "--seed", "3", "--prepend-bos", "1"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pack_dataset_equals_the_cli_row_for_row(tmp_path, case):
    """Dataset, IterableDataset, Table and list give exactly the CLI's rows (masks applied)."""
    kw, flags = CASES[case]
    rows = sft_docs()
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "docs.parquet", row_group_size=37)
    res = invoke(["pack", "-q", "-c", 64, "--rows-per-shard", 7, *flags,
                  tmp_path / "docs.parquet", tmp_path / "cli"])
    assert res.exit_code == 0, res.output
    want, manifest = read_output(tmp_path / "cli")
    assert manifest.totals.tokens_attention_masked > 0
    assert manifest.totals.tokens_label_masked > 0

    ds = datasets.Dataset.from_list(rows)
    got_ds = packtool.pack_dataset(ds, 64, batch_rows=33, **kw)
    assert isinstance(got_ds, datasets.Dataset)
    assert got_ds.to_list() == want
    got_it = packtool.pack_dataset(ds.to_iterable_dataset(num_shards=3), 64, batch_rows=16, **kw)
    assert isinstance(got_it, datasets.IterableDataset)
    assert list(got_it) == want
    got_table = packtool.pack_dataset(table, 64, **kw)
    assert isinstance(got_table, pa.Table)
    assert got_table.to_pylist() == want
    assert got_table.schema == pq.read_schema(tmp_path / "cli" / "part-00000.parquet")
    got_list = packtool.pack_dataset(rows, 64, **kw)
    assert got_list == want
    if not kw:  # a plain list of token sequences: the tokens alone, no masks
        plain = [r["input_ids"] for r in rows]
        pq.write_table(pa.table({"input_ids": plain}), tmp_path / "plain.parquet")
        assert invoke(["pack", "-q", "-c", 64, tmp_path / "plain.parquet",
                       tmp_path / "plain"]).exit_code == 0
        assert packtool.pack_dataset(plain, 64) == read_output(tmp_path / "plain")[0]
        arrays = [np.asarray(d, dtype=np.int32) for d in plain]
        assert packtool.pack_dataset(arrays, 64) == read_output(tmp_path / "plain")[0]


def test_pack_dataset_takes_a_dataset_in_its_own_order(tmp_path):
    """select/shuffle indices are honoured: the rows are those of the reordered documents."""
    rows = sft_docs(60, seed=1)
    ds = datasets.Dataset.from_list(rows).shuffle(seed=4).select(range(0, 60, 2))
    got = packtool.pack_dataset(ds, 48, shuffle=False)
    want = packtool.pack_dataset([dict(r) for r in ds], 48, shuffle=False)
    assert got.to_list() == want
    assert {d for r in want for d in r["doc_ids"]} <= set(range(30))


def test_pack_dataset_dict_packs_each_split_and_holdout_gives_a_pair():
    rows = sft_docs(80, seed=2)
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:60]),
                               "test": datasets.Dataset.from_list(rows[60:])})
    out = packtool.pack_dataset(dd, 32)
    assert isinstance(out, datasets.DatasetDict) and set(out) == {"train", "test"}
    assert out["test"].to_list() == packtool.pack_dataset(rows[60:], 32)
    train, held = packtool.pack_dataset(rows, 32, holdout=0.25, seed=1)
    a = {d for r in train for d in r["doc_ids"]}
    b = {d for r in held for d in r["doc_ids"]}
    assert a and b and not a & b
    with pytest.raises(ConfigError):
        packtool.pack_dataset(dd, 32, holdout=0.1)


def test_pack_dataset_into_an_output_twice_finds_it_done_and_other_documents_refused(tmp_path):
    """The documents go through a new temporary file each call: the output's fingerprint is
    their content, so the same call again is a no-op on the finished output (a notebook cell
    run twice), while other documents or options are refused until ``overwrite=True``."""
    rows = sft_docs(50, seed=3)
    out, held = tmp_path / "out", tmp_path / "out-holdout"  # beside OUTPUT
    first = packtool.pack_dataset(rows, 32, output=out, holdout=0.2)
    files = {p: (p.stat().st_mtime_ns, p.read_bytes())
             for d in (out, held) for p in sorted(d.rglob("*")) if p.is_file()}
    again = packtool.pack_dataset([dict(r) for r in rows], 32, output=out, holdout=0.2)
    assert [r for r in again[0]] == first[0] and [r for r in again[1]] == first[1]
    assert {p: (p.stat().st_mtime_ns, p.read_bytes())
            for d in (out, held) for p in sorted(d.rglob("*")) if p.is_file()} == files
    with pytest.raises(packtool.errors.OutputError, match=r"other documents \(49 documents "
                                                          r"now, 50 in it\)"):
        packtool.pack_dataset(rows[:-1], 32, output=out, holdout=0.2)
    with pytest.raises(packtool.errors.OutputError, match="other options"):
        packtool.pack_dataset(rows, 32, output=out, holdout=0.2, seed=5)
    fresh = packtool.pack_dataset(rows[:-1], 32, output=out, holdout=0.2,
                                  overwrite=True)
    assert fresh == packtool.pack_dataset(rows[:-1], 32, holdout=0.2)


def test_iterable_result_keeps_its_rows_on_disk_until_released(tmp_path, monkeypatch):
    """The IterableDataset's packed output lives while any dataset derived from it does (in a
    temporary directory of this test's own: the system one is shared with other tests)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def ours():
        return {p for p in os.listdir(tmp_path) if p.startswith("packtool-")}

    it = packtool.pack_dataset(datasets.Dataset.from_list(sft_docs(40)).to_iterable_dataset(), 32)
    assert ours()
    derived = it.shuffle(seed=0, buffer_size=4)
    n = len(list(it))
    del it
    gc.collect()
    assert len(list(derived)) == n and ours()
    del derived
    gc.collect()
    assert ours() == set()


def _packed_stream(n=40, seed=0):
    return packtool.pack_dataset(
        datasets.Dataset.from_list(sft_docs(n, seed=seed)).to_iterable_dataset(), 128)


@pytest.mark.parametrize("derive", ["deepcopy", "copy", "pickle", "interleave", "concatenate"])
def test_iterable_result_copies_keep_the_rows_until_the_last_is_released(tmp_path, monkeypatch,
                                                                         derive):
    """Every copy of the IterableDataset (copy.deepcopy, copy.copy, a pickle round trip in the
    process) and every dataset derived from it (datasets' interleave_datasets and
    concatenate_datasets deep-copy their inputs) keeps its temporary output alive after the
    original is released, and the output is removed once the last of them is gone."""
    import copy
    import pickle
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def ours():
        return {p for p in os.listdir(tmp_path) if p.startswith("packtool-")}

    it = _packed_stream()
    want = list(it)
    if derive == "deepcopy":
        other = copy.deepcopy(it)
    elif derive == "copy":
        other = copy.copy(it)
    elif derive == "pickle":
        other = pickle.loads(pickle.dumps(it))
    elif derive == "interleave":
        other = datasets.interleave_datasets([it, _packed_stream(seed=1)],
                                             probabilities=[0.7, 0.3], seed=0)
    else:
        other = datasets.concatenate_datasets([it])
    del it
    gc.collect()
    got = list(other)
    if derive in ("interleave",):
        assert {tuple(r["input_ids"]) for r in want} & {tuple(r["input_ids"]) for r in got}
    else:
        assert got == want
    del other
    gc.collect()
    assert ours() == set()


def test_iterable_result_whose_temporary_output_is_gone_says_so(tmp_path, monkeypatch):
    """A temporary output removed under its dataset (by hand, a cleaner of /tmp) is named as
    pack_dataset's, with the fix (output=DIR), never as an OUTPUT of packtool pack to pass."""
    import shutil
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    it = _packed_stream()
    for p in os.listdir(tmp_path):
        shutil.rmtree(tmp_path / p)
    with pytest.raises(packtool.errors.ManifestError) as info:
        list(it)
    msg = str(info.value)
    assert "OUTPUT directory of packtool pack" not in msg and "\n" not in msg
    assert "temporary output of pack_dataset" in msg and "output=DIR" in msg


_LOADER_CALL = """
import gc, os, signal, sys
import datasets, packtool, torch
ctx, stop = sys.argv[1], sys.argv[2] == "stop"
docs = [{"input_ids": list(range(1, 2 + i % 20))} for i in range(300)]
it = packtool.pack_dataset(datasets.Dataset.from_list(docs).to_iterable_dataset(), 32,
                           rows_per_shard=16, row_group_mb=0.0001)
want = sorted(tuple(r["input_ids"]) for r in it)
def rows(ds):
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         multiprocessing_context=ctx)
    return sorted(tuple(int(x) for x in r["input_ids"]) for r in loader)
if stop:
    for r in torch.utils.data.DataLoader(it, batch_size=None, num_workers=2,
                                         multiprocessing_context=ctx):
        os.kill(os.getpid(), signal.SIGINT)
assert rows(it) == want
assert rows(it) == want  # the workers of the first epoch removed nothing
derived = it.shuffle(seed=0, buffer_size=4)
del it
gc.collect()
assert rows(derived) == want
print("ok")
"""


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
@pytest.mark.parametrize("stop", [False, True], ids=["released", "ctrl-c"])
def test_iterable_result_in_dataloader_workers_leaves_no_temporary_output(tmp_path, ctx, stop):
    """DataLoader workers (fork and spawn) read the IterableDataset's packed output, epoch after
    epoch, without removing it under the training process; when the process ends (released,
    or stopped by Ctrl-C while the workers read), no temporary output is left."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    env = {**os.environ, "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _LOADER_CALL, ctx, "stop" if stop else "run"],
                          env=env, capture_output=True, text=True, timeout=300)
    if stop:
        assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert [p for p in os.listdir(tmp_path) if p.startswith("packtool-")] == []


def test_pack_dataset_packs_ids_over_the_vocabulary_its_table_declares(tmp_path):
    """A table read from a shard that declares a vocabulary size in its schema metadata
    (``pq.read_table`` keeps it) is packed as ``pack`` packs the shard: the declaration bounds
    no id (a BOS/EOS above a BPE file's ranks is valid); one batch or several alike."""
    meta = {b"tokenizer_vocab_size": b"100"}
    table = pa.table({"input_ids": [[1, 2], [3, 99], [100, 4]]}).replace_schema_metadata(meta)
    for kw in ({}, {"batch_rows": 1}):
        rows = packtool.pack_dataset(table, 8, **kw)
        assert 100 in [i for r in rows["input_ids"].to_pylist() for i in r]


def test_pack_dataset_errors_name_the_row_and_the_fix(tmp_path):
    with pytest.raises(SchemaError, match=r"^documents: row 1 \(0-based\): negative token id -5"):
        packtool.pack_dataset([[1, 2], [3, -5]], 8)
    with pytest.raises(SchemaError, match="no column 'tokens'"):
        packtool.pack_dataset(pa.table({"input_ids": [[1, 2]]}), 8, column="tokens")
    with pytest.raises(InputError, match="not str"):
        packtool.pack_dataset("sample_data/", 8)
    with pytest.raises(InputError, match="empty"):
        packtool.pack_dataset([], 8)
    with pytest.raises(ConfigError, match="^capacity=1: "):
        packtool.pack_dataset([[1, 2]], 1)
    with pytest.raises(InputError, match="item 1 is of type int"):
        packtool.pack_dataset([[1, 2], 3], 8)
    leftovers = list(Path(tmp_path).iterdir())
    assert leftovers == []


def test_pack_is_the_cli_pack_as_a_function(tmp_path, sample_data):
    res = packtool.pack(sample_data, tmp_path / "api", capacity=1024, shuffle=False,
                        append_eos=2)
    cli = invoke(["pack", "--json", "-c", 1024, "--no-shuffle", "--append-eos", 2,
                  sample_data, tmp_path / "cli"])
    assert cli.exit_code == 0, cli.output
    said = json.loads(cli.stdout)
    assert res.stats.to_dict() == said["stats"]  # stderr: the split warning
    assert set(said) != {"stats"}  # to_dict() is its "stats" member, not all it prints
    for text in (packtool.pack.__doc__, (Path(__file__).parents[1] / "docs" /
                                         "python-and-text.md").read_text()):
        text = " ".join(text.split())
        assert "is what pack --json prints" not in text.replace("`", "")
        assert re.search(r"the ``?\"stats\"``? member of what ``?pack --json``? prints", text)
    assert read_output(tmp_path / "api")[0] == read_output(tmp_path / "cli")[0]
    again = packtool.pack([sample_data], tmp_path / "api", capacity=1024, shuffle=False,
                          append_eos=2)
    assert again.already_complete


@pytest.mark.parametrize("labels", ["none", "unshifted", "shifted"])
def test_pack_dataset_states_the_labels_convention_it_hands_out(labels):
    """The labels handed out are the stored ones, in the convention the Table's metadata names:
    unshifted (label i is token i or -100) unless labels='shifted' (label i is token i + 1 of
    the same document, or -100); an SFT labels column makes 'none' store unshifted labels."""
    table = pa.Table.from_pylist(sft_docs(40, seed=5))
    got = packtool.pack_dataset(table, 48, labels=labels)
    convention = got.schema.metadata[b"packtool.labels_convention"].decode()
    assert convention == ("shifted" if labels == "shifted" else "unshifted")
    for r in got.to_pylist():
        ids, seg, lab = r["input_ids"], r["segment_ids"], r["labels"]
        for i in range(48):
            if lab[i] == -100:
                continue
            if convention == "unshifted":
                assert lab[i] == ids[i] and i > 0 and seg[i - 1] == seg[i] != 0
            else:
                assert i + 1 < 48 and seg[i + 1] == seg[i] != 0 and lab[i] == ids[i + 1]


def test_pack_dataset_reads_a_loss_mask_column_as_the_cli_does(tmp_path):
    """--loss-mask-column: TRL's completion_mask by default, another column when named."""
    rows = [{"input_ids": d["input_ids"], "completion_mask": [int(x != -100) for x in d["labels"]],
             "my_mask": [int(x != -100) for x in d["labels"]]} for d in sft_docs(60, seed=6)]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table.select(["input_ids", "completion_mask"]), tmp_path / "trl.parquet")
    assert invoke(["pack", "-q", "-c", 48, tmp_path / "trl.parquet", tmp_path / "a"]
                  ).exit_code == 0
    want, manifest = read_output(tmp_path / "a")
    assert manifest.totals.tokens_label_masked > 0 and manifest.labels.stored
    got = packtool.pack_dataset(table.select(["input_ids", "completion_mask"]), 48)
    assert got.to_pylist() == want
    named = packtool.pack_dataset(table.select(["input_ids", "my_mask"]), 48,
                                  loss_mask_column="my_mask")
    assert named.to_pylist() == want
    off = packtool.pack_dataset(table.select(["input_ids", "completion_mask"]), 48,
                                loss_mask_column="none")
    assert "labels" not in off.column_names


@pytest.mark.parametrize("option", [{"min_fill": 1.0}, {"overflow": "drop"}])
def test_pack_dataset_of_no_rows_keeps_the_type_and_the_schema(option):
    """Every row left out (--min-fill 1) or every document dropped: an empty result of the
    type given, with the packed columns, for every input type (a Dataset of zero-chunk columns
    used to fail inside the datasets library)."""
    docs = [[1, 2], [3]] if "min_fill" in option else [[1] * 20, [2] * 30]
    ds = datasets.Dataset.from_dict({"input_ids": docs})
    out = packtool.pack_dataset(ds, 10, **option)
    assert isinstance(out, datasets.Dataset) and out.num_rows == 0
    assert {"input_ids", "segment_ids", "position_ids"} <= set(out.column_names)
    split = packtool.pack_dataset(datasets.DatasetDict({"train": ds}), 10, **option)
    assert split["train"].num_rows == 0
    table = packtool.pack_dataset(pa.table({"input_ids": docs}), 10, **option)
    assert table.num_rows == 0 and "input_ids" in table.column_names
    assert packtool.pack_dataset(docs, 10, **option) == []


#: Documents the CLI refuses, as the API gets them, and as a Parquet column of the same values.
REFUSED_DOCS = {
    "floats": ([[1.5, 2.0], [3.0]], pa.array([[1.5, 2.0], [3.0]], pa.list_(pa.float64()))),
    "integral floats": ([[1.0, 2.0]], pa.array([[1.0, 2.0]], pa.list_(pa.float64()))),
    "float arrays": ([np.array([1.7, 2.2]), np.array([3.9])],
                     pa.array([[1.7, 2.2], [3.9]], pa.list_(pa.float64()))),
    "float32 arrays": ([np.array([1, 2], dtype=np.float32)],
                       pa.array([[1, 2]], pa.list_(pa.float32()))),
    "object array of floats": ([np.array([1.5, 2], dtype=object)],
                               pa.array([[1.5, 2]], pa.list_(pa.float64()))),
    "bools": ([[True, False]], pa.array([[True, False]], pa.list_(pa.bool_()))),
    "bool arrays": ([np.array([True])], pa.array([[True]], pa.list_(pa.bool_()))),
    "strings": ([["1", "2"]], pa.array([["1", "2"]], pa.list_(pa.string()))),
    "nested lists": ([[[1, 2]], [[3]]], pa.array([[[1, 2]], [[3]]])),
    "a null id": ([[1, None]], pa.array([[1, None]], pa.list_(pa.int64()))),
    "a null document": ([[1, 2], None], pa.array([[1, 2], None], pa.list_(pa.int64()))),
    "an id beyond int32": ([[1, 2**31]], pa.array([[1, 2**31]], pa.list_(pa.int64()))),
    "an id beyond int64": ([np.array([1, 2**63], dtype=np.uint64)],
                           pa.array([[1, 2**63]], pa.list_(pa.uint64()))),
    "a negative id": ([[1, -1]], pa.array([[1, -1]], pa.list_(pa.int64()))),
    "dicts of floats": ([{"input_ids": [1.5]}], pa.array([[1.5]], pa.list_(pa.float64()))),
}


@pytest.mark.parametrize("case", list(REFUSED_DOCS))
def test_documents_the_cli_refuses_are_refused_by_the_api_with_the_same_message(tmp_path, case):
    """A list of floats (or bools, strings, nested lists...) goes through pack's own schema
    check, as a Parquet file of the same values does: never truncated to integer ids (a float
    list used to pack 1.7 as token 1)."""
    docs, column = REFUSED_DOCS[case]
    pq.write_table(pa.table({"input_ids": column}), tmp_path / "docs.parquet")
    res = invoke(["pack", "-q", "-c", 8, tmp_path / "docs.parquet", tmp_path / "out"])
    assert res.exit_code == 1, res.output
    with pytest.raises(SchemaError) as exc:
        packtool.pack_dataset(docs, 8)
    def same(msg):  # Parquet names a list's values 'element', pyarrow 'item'
        return re.sub(r"list<\w+: ", "list<", " ".join(msg.split()))

    assert str(exc.value).startswith("documents: row "), exc.value
    want = str(exc.value).replace("documents", str(tmp_path / "docs.parquet"), 1)
    if "(0-based)" not in res.output:  # a type is a whole column's in Parquet; the API names
        want = re.sub(r": row \d+ \(0-based\)", "", want, count=1)  # the row that shows it
    assert "--" not in want  # options named as keywords
    # the CLI's line up to its fix (a file's fix names commands and flags, the API's keywords)
    head = want.split("; ", 1)[0]
    assert same(head) in same(res.output), (want, res.output)
    with pytest.raises(SchemaError):
        packtool.pack_dataset(pa.table({"input_ids": column}), 8)


def test_ids_pyarrow_cannot_convert_are_a_schema_error_naming_the_row():
    with pytest.raises(SchemaError, match=r"^documents: row 1 \(0-based\): a token id does not "
                                          "fit int64"):
        packtool.pack_dataset([[1], [2**64]], 8)
    with pytest.raises(SchemaError, match=r"^documents: row 0 \(0-based\): .*'a'"):
        packtool.pack_dataset([np.array([1, "a"], dtype=object)], 8)
    with pytest.raises(SchemaError, match=r"^documents: row 0 \(0-based\): .*1-dimensional"):
        packtool.pack_dataset([np.zeros((2, 2), dtype=np.int32)], 8)
    assert packtool.pack_dataset([[], [np.int64(3)], np.array([4], np.int8)], 8, shuffle=False,
                                 overflow="split")[0]["input_ids"][:2] == [3, 4]


def _kind(annotation: str) -> str:
    for kind in ("bool", "PathLike", "int", "float", "str"):
        if kind in annotation:
            return kind
    raise AssertionError(f"no wrong values for {annotation!r}")


#: Values of the wrong type for an argument of each kind (an optional one takes None).
WRONG = {"int": ["8", 1.5, 8.0, 2.5, True, np.float64(8), [8]],
         "float": ["0.5", True, [0.5]],
         "bool": ["no", "", 0, 1, np.int64(1)],
         "str": [5, b"x", ["a"]],
         "PathLike": [5, b"x", ["a"]]}


def _temp_entries() -> set:
    """packtool's entries in the temporary directory (the test's own: see ``private_tmp``)."""
    import tempfile

    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("packtool")}


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A temporary directory of the test's own, so entries other processes make in the shared
    one meanwhile (the other test worker's packs among them) are not counted as left behind."""
    import tempfile

    d = tmp_path / "tmpdir"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


@pytest.mark.parametrize("func", ["pack", "pack_dataset"])
def test_every_argument_of_the_wrong_type_is_one_config_error_naming_it(tmp_path, func,
                                                                        private_tmp):
    """Every argument of pack and pack_dataset, every kind of wrong value: one ConfigError that
    names the argument, the value and its type, and nothing left behind (pad_id=1.5 used to pad
    with 1, shuffle='no' to shuffle, capacity='512' to fail in string formatting)."""
    import inspect

    fn = getattr(packtool, func)
    args = ([tmp_path / "none.parquet", tmp_path / "out"] if func == "pack" else [[[1, 2, 3]]])
    first = "inputs" if func == "pack" else "data"
    before = _temp_entries()
    checked = []
    for name, p in inspect.signature(fn).parameters.items():
        if name in (first, "output") and func == "pack":
            values = [5, [5]] if name == "inputs" else [5, None]
        elif name == first:
            continue
        else:
            kind = _kind(p.annotation)
            values = WRONG[kind] + ([] if "None" in p.annotation else [None])
        for value in values:
            kw = {name: value}
            call = ([value, args[1]] if name == "inputs" else
                    [args[0], value] if func == "pack" and name == "output" else args)
            if name in ("inputs", "output") and func == "pack":
                kw = {}
            with pytest.raises(ConfigError) as exc:
                fn(*call, **kw)
            msg = str(exc.value)
            # an item of the inputs list is named by its place in it
            named = f"{name}[0]={value[0]!r}" if name == "inputs" and isinstance(value, list) \
                else f"{name}={value!r}"
            assert msg.startswith(f"{named}: "), msg  # the keyword, not the flag
        checked.append(name)
    assert {"capacity", "pad_id", "append_eos", "prepend_bos", "seed", "window_docs", "workers",
            "shuffle", "progress", "min_fill", "holdout", "compression"} <= set(checked)
    if func == "pack_dataset":
        assert "batch_rows" in checked
    assert _temp_entries() <= before
    assert not (tmp_path / "out").exists()


def test_a_batch_size_below_one_is_refused_before_anything_is_written(tmp_path, private_tmp):
    """batch_rows=0 on a Dataset used to loop forever in its batch iterator (a temporary
    directory left behind), -1 to raise SystemError."""

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]})
    before = _temp_entries()
    for value in (-1, 0):
        with pytest.raises(ConfigError, match=rf"^batch_rows={value}: must be >= 1$"):
            packtool.pack_dataset(ds, 8, batch_rows=value, output=tmp_path / "out")
    assert _temp_entries() <= before
    assert not (tmp_path / "out").exists()


def test_numpy_integer_options_give_the_bytes_of_the_equal_python_ints(tmp_path):
    """capacity=np.int64(8) and the like are the equal ints (operator.index), recorded as plain
    ints: the output, manifest included, is byte for byte that of the Python-int call."""
    pq.write_table(pa.table({"input_ids": [[11, 12, 13], [21, 22], [5] * 10, [7]]}),
                   tmp_path / "docs.parquet")
    plain = dict(capacity=8, pad_id=3, append_eos=2, prepend_bos=1, seed=4, window_docs=2,
                 segment_multiple=2, rows_per_shard=1, workers=1, holdout=0.5)
    numpy = {k: np.float32(v) if isinstance(v, float) else np.int32(v) if k == "pad_id"
             else np.int64(v) for k, v in plain.items()}

    def files(**kw):
        out = tmp_path / "out"
        packtool.pack(tmp_path / "docs.parquet", out, overwrite=True, **kw)
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    want = files(**plain)
    assert files(**numpy) == want and len(want) > 2
    rows = packtool.pack_dataset([[11, 12, 13], [21, 22]], np.int64(8), pad_id=np.int32(3),
                                 seed=np.int64(4), window_docs=np.int64(1))
    assert rows == packtool.pack_dataset([[11, 12, 13], [21, 22]], 8, pad_id=3, seed=4,
                                         window_docs=1)


def test_pack_dataset_takes_a_2d_numpy_array_and_a_tuple_as_the_list_of_their_rows():
    """A 2-D NumPy array of ids (one document per row, pre-cut sequences) and a tuple of
    documents give the rows of the same documents as a list; a float array is refused as a
    list of floats is (never cut to integers), a 1-D array is named as one document."""
    rng = np.random.default_rng(5)
    arr = rng.integers(1, 30000, size=(37, 11), dtype=np.int32)
    want = packtool.pack_dataset([row.tolist() for row in arr], 16, seed=2)
    assert packtool.pack_dataset(arr, 16, seed=2) == want
    assert packtool.pack_dataset(tuple(row.tolist() for row in arr), 16, seed=2) == want
    assert sum(n for r in want for n in [r["num_targets"]]) == 37 * 10
    with pytest.raises(SchemaError):
        packtool.pack_dataset(arr.astype(np.float64), 16)
    with pytest.raises(InputError, match="2-D NumPy array.*not a 1-D array of int32; one document"):
        packtool.pack_dataset(arr[0], 16)


def test_a_streamed_result_has_a_shard_per_row_group_so_workers_read_in_parallel():
    """An IterableDataset result had one shard: DataLoader and Trainer workers beyond the first
    were stopped. One shard per row group: each worker reads a contiguous share, in order."""
    docs = [[d * 100 + p + 1 for p in range(1 + d % 7)] for d in range(200)]
    ds = datasets.Dataset.from_dict({"input_ids": docs}).to_iterable_dataset(num_shards=4)
    got = packtool.pack_dataset(ds, 16, row_group_mb=0.0004)
    rows = list(got)
    assert got.num_shards > 2
    halves = [list(got.shard(num_shards=2, index=k, contiguous=True)) for k in range(2)]
    assert halves[0] and halves[1] and halves[0] + halves[1] == rows


def test_messages_name_the_python_keywords_not_the_command_lines_flags(tmp_path):
    """Python callers were told to pass --overwrite, --column NAME or --batch-rows (no such
    flag exists); every option is now named as passed, the CLI's wording unchanged."""
    cases = [
        (dict(capacity=4, overflow="error"), PackingError,
         "document 0 has 12 tokens, longer than capacity=4; use "
         "overflow='split'|'truncate'|'drop' or a larger capacity"),
        (dict(capacity=8, segment_multiple=3), ConfigError,
         "segment_multiple=3: capacity=8 is not a multiple of it; every padded document and the "
         "padding tail must be multiples of N: use capacity=6 or 9"),
        (dict(capacity=8, pad_id=1.5), ConfigError, "pad_id=1.5: must be an integer, not float"),
        (dict(capacity=8, shuffle="no"), ConfigError, "shuffle='no': must be True or False"),
        (dict(capacity=8, progress="yes"), ConfigError, "progress='yes': must be True or False"),
        (dict(capacity=8, compression="gzip"), ConfigError, "compression='gzip'"),
    ]
    for kw, cls, want in cases:
        with pytest.raises(cls) as exc:
            packtool.pack_dataset([[1, 2, 3] * 4], **kw)
        assert want in str(exc.value), str(exc.value)
        assert "--" not in str(exc.value), str(exc.value)
    with pytest.raises(InputError, match=r"are empty; check the documents and column$"):
        packtool.pack_dataset([[]], 8)
    packtool.pack_dataset([[1, 2]], 4, output=tmp_path / "o")
    with pytest.raises(OutputError, match=r"; pass overwrite=True to replace it or choose "):
        packtool.pack_dataset([[1, 2, 3]], 4, output=tmp_path / "o")
    with pytest.raises(ConfigError, match=r"^inputs=5: must be a path or a list of paths"):
        packtool.pack(5, tmp_path / "p")
    # the command line keeps its flags
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"input_ids": [[1, 2, 3] * 4]}), tmp_path / "in" / "a.parquet")
    res = invoke(["pack", "-q", "-c", 4, "--overflow", "error", tmp_path / "in", tmp_path / "c"])
    assert "longer than --capacity 4; use --overflow split|truncate|drop" in res.output


@pytest.mark.parametrize("flags,words", [
    (["--append-eos", "9"], " (counting what --append-eos adds)"),
    (["--prepend-bos", "8", "--append-eos", "9"],
     " (counting what --prepend-bos and --append-eos add)"),
    ([], ""),
])
def test_a_document_over_c_only_with_its_bos_eos_says_so(tmp_path, flags, words):
    """--overflow error on a row of exactly C tokens that --append-eos / --prepend-bos push over
    C: pack, compare and pack_dataset name the length with the added tokens and say so (the
    message named 5 tokens for an input row of 4)."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"input_ids": [[1, 2], [1, 2, 3, 4]]}), tmp_path / "in" / "a.parquet")
    n = 4 + len(flags) // 2
    if not flags:
        pq.write_table(pa.table({"input_ids": [[1, 2], [1, 2, 3, 4, 5]]}),
                       tmp_path / "in" / "a.parquet")
        n = 5
    want = (f"a.parquet: row 1 (0-based): document 1 has {n} tokens{words}, longer than "
            "--capacity 4")
    for cmd in (["pack", "-q", "-c", 4, "--overflow", "error", *flags, tmp_path / "in",
                 tmp_path / "o"],
                ["compare", "-c", 4, "--overflow", "error", *flags, tmp_path / "in"]):
        res = invoke(cmd)
        assert res.exit_code == 1 and want in res.output, res.output
    kw = {"append_eos": 9} if "--append-eos" in flags else {}
    kw.update({"prepend_bos": 8} if "--prepend-bos" in flags else {})
    docs = pq.read_table(tmp_path / "in" / "a.parquet").column(0).to_pylist()
    with pytest.raises(PackingError) as exc:
        packtool.pack_dataset(docs, 4, overflow="error", **kw)
    words = words.replace("--append-eos", "append_eos").replace("--prepend-bos", "prepend_bos")
    assert f"document 1 has {n} tokens{words}, longer than capacity=4" in str(exc.value)


def test_the_notes_pack_prints_are_python_warnings(tmp_path, sample_data):
    """pack_dataset dropped the WARNING lines the CLI prints (75 % of the tokens cut went
    unsaid); pack and pack_dataset now issue each as a PackWarning, keywords named."""
    from packtool.errors import PackWarning

    with pytest.warns(PackWarning) as got:
        rows = packtool.pack_dataset([[1] * 50, [1, 2, 3], [4, 5, 6]], 8, min_fill=1.0,
                                     overflow="truncate")
    assert len(rows) == 1
    msgs = [str(w.message) for w in got]
    assert any(m.startswith("overflow='truncate' removed 75.0% of the tokens (42 of 56")
               for m in msgs), msgs
    assert any(m.startswith("min_fill=1 left out 1 planned row") for m in msgs), msgs
    assert all("--" not in m for m in msgs), msgs
    assert got[0].filename == __file__  # attributed to the caller's line
    with pytest.warns(PackWarning, match="^overflow='truncate' removed"):
        res = packtool.pack(sample_data, tmp_path / "p",
                            capacity=64, overflow="truncate")
    assert res.warnings and res.warnings[0].startswith("--overflow truncate removed")
    import datasets

    split = datasets.Dataset.from_dict({"input_ids": [[1] * 50, [1, 2, 3]]})
    for data in (datasets.DatasetDict({"train": split, "test": split}), split):
        with pytest.warns(PackWarning) as got:
            packtool.pack_dataset(data, 8, overflow="truncate")
        # the caller's line, also through pack_dataset's call per split of a DatasetDict
        assert {w.filename for w in got} == {__file__}, [w.filename for w in got]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pack that loses nothing and fills its rows: nothing
        packtool.pack_dataset([[1, 2, 3], [4, 5]], 8)
    with pytest.warns(PackWarning) as got:  # a row mostly padding: said with the keyword
        packtool.pack_dataset([[1, 2, 3]], 8)
    assert [str(w.message) for w in got] == [
        "padding is 62.5% of the rows' tokens (5 of 8 in 1 row of capacity=8): the documents "
        "fill rows of this size poorly; a smaller capacity wastes less (packtool compare shows "
        "the padding of each capacity before packing)"]


def test_paths_and_names_passed_are_never_reworded(tmp_path):
    """A folder named --overwrite, a column named 'a --pad-id 3': messages quote them as
    given (they became overwrite=True and 'a pad_id=3'); mask options read 'none' as None; a
    list value keeps its '='; pack_dataset is never told of holdout_output."""
    odd = tmp_path / "--overwrite"
    odd.mkdir()
    pq.write_table(pa.table({"ids": [[1, 2, 3]]}), odd / "a.parquet")
    with pytest.raises(SchemaError) as exc:
        packtool.pack(odd, tmp_path / "o", capacity=8)
    assert f"{odd / 'a.parquet'}: no column 'input_ids'" in str(exc.value), str(exc.value)
    assert "pass column='ids'" in str(exc.value)  # the one list-of-integers column
    with pytest.raises(SchemaError, match=r"no column 'a --pad-id 3'"):
        packtool.pack_dataset([{"x": [1, 2]}], 8, column="a --pad-id 3")
    with pytest.raises(SchemaError) as exc:
        packtool.pack_dataset([{"input_ids": [1, 2, 3], "attention_mask": [1, 2, 1]}], 8)
    assert "attention_mask_column=None" in str(exc.value), str(exc.value)
    with pytest.raises(ConfigError, match=r"^capacity=\[8, 9\]: must be an integer"):
        packtool.pack_dataset([[1, 2]], capacity=[8, 9])
    with pytest.raises(ConfigError) as exc:
        packtool.pack_dataset([[1, 2]], 8, attention_mask_column="input_ids")
    assert "(column='input_ids')" in str(exc.value), str(exc.value)
    held = tmp_path / "h-holdout"
    held.mkdir()
    (held / "y").write_text("mine")
    with pytest.raises(OutputError) as exc:
        packtool.pack_dataset([[1] * 4] * 40, 8, holdout=0.3, output=tmp_path / "h")
    assert f"{held} (the held-out output, named after OUTPUT {tmp_path / 'h'}): held-out " \
        "output holds 1 entry packtool did not write (y)" in str(exc.value), str(exc.value)
    assert "holdout_output" not in str(exc.value)


def test_a_dataset_dicts_error_names_its_split():
    bad = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]}),
                                "test": datasets.Dataset.from_dict(
                                    {"input_ids": [[1, 2, 3], [4, -5]]})})
    with pytest.raises(SchemaError, match=r"^split 'test': documents: row 1 \(0-based\): "
                                          "negative token id -5"):
        packtool.pack_dataset(bad, 8)


def _streamed(docs):
    def rows():
        for d in docs:
            yield {"input_ids": d}
    return datasets.IterableDataset.from_generator(rows)


@pytest.mark.parametrize("bad", [[3.0, 4.0], ["3", "4"], [True, False]])
@pytest.mark.parametrize("batch_rows", [1, 4])
def test_a_later_batch_of_other_typed_ids_is_refused_naming_its_row_never_cast(bad, batch_rows):
    """A streaming dataset types each batch apart: floats, strings or bools after a first batch
    of integers were cast to it (3.0 and "3" packed as token 3, True as 1). Refused, as the
    same documents in one list or one Parquet file are, naming the first such row."""
    docs = [[1, 2]] * 8 + [bad] * 4 + [[5]]
    with pytest.raises(SchemaError, match=r"^documents: row 8 \(0-based\): column 'input_ids' "
                                          r"has type list<item: \w+>, expected a list of "
                                          "integer token ids"):
        packtool.pack_dataset(_streamed(docs), 8, shuffle=False, batch_rows=batch_rows)
    with pytest.raises(SchemaError, match=r"^documents: row 8 \(0-based\)"):
        packtool.pack_dataset(docs, 8)
    mixed = [[1, 2]] * 8 + [bad, [5]]  # one streamed batch of two types
    with pytest.raises(SchemaError, match=r"^documents: row 8 \(0-based\): [^\n]*$"):
        packtool.pack_dataset(_streamed(mixed), 8, shuffle=False, batch_rows=batch_rows)


def test_batches_of_other_integer_widths_or_no_ids_keep_every_value(tmp_path):
    """A first batch of uint8 ids or of empty documents, then ids of 300 and 2**31 - 1: every
    value kept (the later batch was cast to the first one's type, or refused in a multi-line
    message naming no row); an id beyond int64 names its row."""
    from packtool.formats.inmemory import write_input

    later = pa.table({"input_ids": pa.array([[300, 2**31 - 1]], pa.list_(pa.int64()))})
    heads = [pa.table({"input_ids": pa.array([[1, 2], [3]], pa.list_(pa.uint8()))}),
             pa.table({"input_ids": pa.array([[], []], pa.list_(pa.null()))})]
    for k, head in enumerate(heads):
        rows, _ = write_input([head, later], tmp_path / f"{k}.arrow", "input_ids")
        got = pa.ipc.open_file(tmp_path / f"{k}.arrow").read_all().column("input_ids")
        assert rows == head.num_rows + 1
        assert got.to_pylist() == head.column("input_ids").to_pylist() + [[300, 2**31 - 1]]
    big = pa.table({"input_ids": pa.array([[1], [2**64 - 1]], pa.list_(pa.uint64()))})
    with pytest.raises(SchemaError, match=r"^documents: row 1 \(0-based\): token id "
                                          f"{2**64 - 1} does not fit int32"):
        write_input([big], tmp_path / "big.arrow", "input_ids")
    floats = pa.table({"input_ids": pa.array([[], [3.0]], pa.list_(pa.float64()))})
    with pytest.raises(SchemaError, match=r"^documents: row 3 \(0-based\): column 'input_ids' "
                                          "has type list<item: double>"):
        write_input([heads[0], floats], tmp_path / "f.arrow", "input_ids")
    rows = packtool.pack_dataset(_streamed([[], [], [5, 6], [7]]), 8, shuffle=False, batch_rows=2)
    assert list(rows)[0]["input_ids"][:3] == [5, 6, 7]


@pytest.mark.parametrize("bad", [[True, False], ["7", "8"], [[4]], [4.5], np.array([1.5])])
def test_a_whole_row_of_another_type_among_thousands_is_named(bad):
    """An all-bool or all-string row converts alone, and one float makes pyarrow type the whole
    list as floats: the message named no row in 5,000."""
    docs = [[1, 2, 3]] * 5000
    docs[4321] = bad
    with pytest.raises(SchemaError, match=r"^documents: row 4321 \(0-based\)"):
        packtool.pack_dataset(docs, 8)
    with pytest.raises(SchemaError, match=r"^documents: row 4321 \(0-based\)"):
        packtool.pack_dataset([{"input_ids": d} for d in docs], 8)


def _shapes(docs):
    """The documents in every shape pack_dataset takes, by name."""
    import pandas as pd

    shapes = {"list": lambda: docs, "dicts": lambda: [{"input_ids": d} for d in docs],
              "columns": lambda: {"input_ids": docs}, "Series": lambda: pd.Series(docs),
              "DataFrame": lambda: pd.DataFrame({"input_ids": docs}),
              "Table": lambda: pa.table({"input_ids": pa.array([list(d) for d in docs])}),
              "Dataset": lambda: datasets.Dataset.from_dict({"input_ids": [list(d)
                                                                           for d in docs]}),
              "IterableDataset": lambda: datasets.Dataset.from_dict(
                  {"input_ids": [list(d) for d in docs]}).to_iterable_dataset()}
    try:
        import polars as pl

        shapes["polars"] = lambda: pl.from_arrow(shapes["Table"]())
    except ImportError:
        pass
    return shapes


@pytest.mark.parametrize("shape", ["list", "dicts", "columns", "Series", "DataFrame", "Table",
                                   "Dataset", "IterableDataset", "polars"])
@pytest.mark.parametrize("bad", [np.array([1.5, 2.0]), [4.5], np.array([2.0])],
                         ids=["float-array", "float-list", "integral-float-array"])
def test_a_float_document_is_named_by_its_row_in_every_shape(shape, bad):
    """One float document among 1,000 NumPy integer arrays: a pandas DataFrame said row 0 (its
    object column converts as one list<double> column), a list, dict or Series row 737. Every
    shape names row 737; a column typed as a whole (a Table, a Dataset, polars) names the first
    row holding a value that is no integer, as a float with no fraction is not told apart there
    (every row of such a column is float)."""
    docs = [np.array([1, 2, 3]) for _ in range(1000)]
    docs[737] = bad
    shapes = _shapes(docs)
    if shape not in shapes:
        pytest.skip("polars is not installed")
    typed = shape in ("Table", "Dataset", "IterableDataset", "polars")
    row = 0 if typed and not any(float(x) % 1 for x in bad) else 737
    with pytest.raises(SchemaError, match=rf"^documents: row {row} \(0-based\): column "
                                          r"'input_ids' has type [^\n]*$"):
        packtool.pack_dataset(shapes[shape](), 8)


@pytest.mark.parametrize("column, values", [("labels", [0, 1]),
                                            ("attention_mask", ["a", "b"]),
                                            ("completion_mask", [1.0, 2.0])])
def test_a_default_mask_column_of_the_wrong_type_is_refused_as_the_cli_refuses_it(
        tmp_path, column, values):
    """A scalar ``labels`` column (class labels) or a string ``attention_mask`` was dropped in
    silence by the API while ``packtool pack`` refuses it under auto."""
    table = pa.table({"input_ids": [[1, 2, 3], [4, 5]], column: values})
    pq.write_table(table, tmp_path / "d.parquet")
    res = invoke(["pack", "-q", "-c", 8, tmp_path / "d.parquet", tmp_path / "out"])
    assert res.exit_code == 1 and f"column {column!r} has type" in res.output, res.output
    for data in (table, table.to_pylist(), datasets.Dataset(table)):
        with pytest.raises(SchemaError, match=f"column {column!r} has type"):
            packtool.pack_dataset(data, 8)
    option = {"labels": "labels_column", "attention_mask": "attention_mask_column",
              "completion_mask": "loss_mask_column"}[column]
    assert len(packtool.pack_dataset(table, 8, **{option: None})) == 1  # the fix it names


def test_the_output_fingerprint_is_the_documents_not_how_they_were_batched(tmp_path):
    """``output=`` finds its pack done for the same documents whatever ``batch_rows``, integer
    width or container (the digest was the temporary file's bytes, which change with them);
    other documents are refused."""
    from packtool.formats.manifest import MANIFEST_NAME

    docs = [[1, 2, 3], [4, 5], [], [6]]
    out = tmp_path / "out"
    first = packtool.pack_dataset(docs, 8, output=out)
    stamp = (out / MANIFEST_NAME).stat().st_mtime_ns
    same = [datasets.Dataset.from_dict({"input_ids": docs}),
            pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), docs]
    for data in same:
        for batch_rows in (1, 3):
            got = packtool.pack_dataset(data, 8, output=out, batch_rows=batch_rows)
            got = got if isinstance(got, list) else got.to_pylist() \
                if isinstance(got, pa.Table) else got.to_list()
            assert [r["input_ids"] for r in got] == [r["input_ids"] for r in first]
    got = packtool.pack_dataset(_streamed(docs), 8, output=out, batch_rows=3)
    assert [r["input_ids"] for r in got] == [r["input_ids"] for r in first]
    assert (out / MANIFEST_NAME).stat().st_mtime_ns == stamp  # found done, never rewritten
    with pytest.raises(OutputError, match="other documents"):
        packtool.pack_dataset([[1, 2, 3], [4, 5], [], [7]], 8, output=out)


#: Documents whose mask columns first appear after the first row (or batch) / go missing later.
LATE_COLUMNS = [{"input_ids": [1, 2, 3]},
                {"input_ids": [3, 4], "attention_mask": [0, 1], "labels": [-100, 4]}]
EARLY_COLUMNS = LATE_COLUMNS[::-1]


MASK_FEATURES = {k: datasets.Sequence(datasets.Value("int64"))
                 for k in ("input_ids", "attention_mask", "labels")}


def _gen_of(docs, features=None):
    def rows():
        yield from docs
    return datasets.IterableDataset.from_generator(
        rows, features=None if features is None else datasets.Features(features))


@pytest.mark.parametrize("docs", [LATE_COLUMNS, EARLY_COLUMNS], ids=["appears", "disappears"])
def test_a_column_some_documents_lack_is_null_there_never_dropped(tmp_path, docs):
    """A key missing from some documents is null in them, as in one Parquet file of those rows
    (the union of the keys): ``pack``'s null rule then refuses it naming the row. It was
    dropped in silence when the first dict (or batch) lacked it: the attention-mask 0 packed as
    a real token, the -100 prompt label ignored."""
    row = docs.index(LATE_COLUMNS[0])
    pq.write_table(pa.Table.from_pylist(docs, schema=pa.schema(
        [(k, pa.list_(pa.int64())) for k in ("input_ids", "attention_mask", "labels")])),
        tmp_path / "d.parquet")
    res = invoke(["pack", "-q", "-c", 8, tmp_path / "d.parquet", tmp_path / "cli"])
    assert res.exit_code == 1 and f"row {row} (0-based): 'labels' is null" in res.output
    want = rf"^documents: row {row} \(0-based\): 'labels' is null; fill it or pass " \
        r"labels_column=None$"
    for data, kw in ((docs, {}), (_gen_of(docs), {"batch_rows": 1}),
                     (_gen_of(docs), {"batch_rows": 2}),
                     (_gen_of(docs, MASK_FEATURES), {"batch_rows": 1}),
                     (_gen_of(docs, MASK_FEATURES), {"batch_rows": 2})):
        with pytest.raises(SchemaError, match=want):
            packtool.pack_dataset(data, 8, shuffle=False, **kw)
    for data, kw in ((docs, {}), (_gen_of(docs), {"batch_rows": 1})):
        with pytest.raises(SchemaError, match=rf"^documents: row {row} \(0-based\): "
                                              "'attention_mask' is null"):
            packtool.pack_dataset(data, 8, shuffle=False, labels_column=None, **kw)
        with pytest.raises(SchemaError, match=rf"^documents: row {row} \(0-based\): "
                                              "'labels' is null"):
            packtool.pack_dataset(data, 8, shuffle=False, labels_column="labels", **kw)
    # filled in, the same documents are packed with their masks, value for value
    full = [{"attention_mask": [1] * len(d["input_ids"]), "labels": d["input_ids"], **d}
            for d in docs]
    pq.write_table(pa.Table.from_pylist(full), tmp_path / "full.parquet")
    assert invoke(["pack", "-q", "-c", 8, "--no-shuffle", tmp_path / "full.parquet",
                   tmp_path / "full"]).exit_code == 0
    want_rows = read_output(tmp_path / "full")[0]
    assert packtool.pack_dataset(full, 8, shuffle=False) == want_rows
    assert list(packtool.pack_dataset(_gen_of(full), 8, shuffle=False, batch_rows=1)) \
        == want_rows
    assert list(packtool.pack_dataset(_gen_of(full, MASK_FEATURES), 8, shuffle=False,
                                      batch_rows=2)) == want_rows


def test_a_streamed_dataset_with_features_whose_later_rows_lack_a_key_names_that_row():
    """``datasets`` cannot make one Arrow batch of rows whose keys differ (with features
    declared): the rest of the stream is read as Python rows, numbered on, so the row lacking
    ``labels`` is named (the refusal named a batch and blamed the column types)."""
    full = {"input_ids": [1, 2], "attention_mask": [1, 1], "labels": [1, 2]}
    docs = [full, full, full, {"input_ids": [3]}, full]
    for batch_rows in (2, 3):
        with pytest.raises(SchemaError, match=r"^documents: row 3 \(0-based\): 'labels' is "
                                              "null"):
            packtool.pack_dataset(_gen_of(docs, MASK_FEATURES), 8, shuffle=False,
                                  batch_rows=batch_rows)
    reordered = [full, full, {"labels": [4, 5], "input_ids": [4, 5], "attention_mask": [1, 1]},
                 full]
    want = packtool.pack_dataset(reordered, 8, shuffle=False)
    assert list(packtool.pack_dataset(_gen_of(reordered, MASK_FEATURES), 8, shuffle=False,
                                      batch_rows=2)) == want


def test_a_later_batch_bringing_or_missing_a_column_is_written_as_one_table(tmp_path):
    """write_input takes the union of the batches' columns: a list column first seen in a later
    batch is null in the rows before it, a column a later batch lacks is null there, an
    all-null column of a first batch takes the type of a later one; nothing is dropped."""
    from packtool.formats.inmemory import write_input

    ints = pa.list_(pa.int64())
    batches = [pa.table({"input_ids": pa.array([[1], [2]], ints)}),
               pa.table({"input_ids": pa.array([[3]], ints), "tags": pa.array([[7]], ints),
                         "labels": pa.array([None], pa.null())}),
               pa.table({"input_ids": pa.array([[4]], ints),
                         "labels": pa.array([[4]], ints)})]
    rows, digest = write_input(batches, tmp_path / "u.arrow", "input_ids", named=["labels"],
                               fingerprint=True)
    got = pa.ipc.open_file(tmp_path / "u.arrow").read_all()
    assert rows == 4
    assert got.to_pydict() == {"input_ids": [[1], [2], [3], [4]],
                               "tags": [None, None, [7], None],
                               "labels": [None, None, None, [4]]}
    assert got.schema.field("labels").type == ints
    assert sorted(os.listdir(tmp_path)) == ["u.arrow"]  # no copy left beside it
    _, whole = write_input([got], tmp_path / "w.arrow", "input_ids", named=["labels"],
                           fingerprint=True)
    assert digest == whole  # the content, however it came in


def _plus(n, out=list):
    def transform(batch):
        return {"input_ids": [out([x + n for x in d]) for d in batch["input_ids"]]}
    return transform


def test_a_datasets_transform_is_applied_as_its_rows_read(monkeypatch):
    """A transform's values may be lists, NumPy arrays or tensors. ``with_transform`` / ``set_transform`` give the rows the caller reads; the stored,
    untransformed ids were packed (``with_format("arrow")`` drops the transform). A plain
    format (``numpy``, ``torch``) changes no value and keeps the Arrow batches."""
    try:
        import torch
    except ImportError:
        torch = None
    docs = [[1, 2, 3], [4, 5], [6]]
    ds = datasets.Dataset.from_dict({"input_ids": docs, "text": ["a", "b", "c"]})
    want = packtool.pack_dataset([[x + 100 for x in d] for d in docs], 8, shuffle=False)
    ordered = ds.select([0, 1, 2])
    ordered.set_transform(_plus(100))
    for data in (ds.with_transform(_plus(100)), ordered,
                 ds.with_transform(_plus(100, np.array)),
                 *([ds.with_transform(_plus(100, torch.tensor))] if torch else []),
                 datasets.DatasetDict({"train": ds.with_transform(_plus(100))})):
        for batch_rows in (1, 2):
            got = packtool.pack_dataset(data, 8, shuffle=False, batch_rows=batch_rows)
            got = got["train"] if isinstance(got, datasets.DatasetDict) else got
            assert got.to_list() == want
    sft = ds.with_transform(lambda b: {"input_ids": b["input_ids"],
                                       "labels": [[-100] + d[1:] for d in b["input_ids"]]})
    assert packtool.pack_dataset(sft, 8, shuffle=False).to_list() == packtool.pack_dataset(
        [{"input_ids": d, "labels": [-100] + d[1:]} for d in docs], 8, shuffle=False)
    with pytest.raises(SchemaError, match=r"^documents: row 1 \(0-based\): negative token id"):
        packtool.pack_dataset(ds.with_transform(
            lambda b: {"input_ids": [[-5] if d[0] == 4 else d for d in b["input_ids"]]}), 8,
            batch_rows=1)
    from packtool.formats import inmemory

    plain = packtool.pack_dataset(docs, 8, shuffle=False)
    monkeypatch.setattr(inmemory, "tables_from_dicts", None)  # a plain format: Arrow batches
    for fmt in ("numpy", "torch", "python"):
        assert packtool.pack_dataset(ds.with_format(fmt), 8, shuffle=False).to_list() == plain


def test_a_1d_numpy_object_array_of_documents_is_their_list():
    """A pandas column's ``to_numpy()`` (a 1-D object array of lists or arrays) is a sequence
    of documents: it was refused as one document, with advice ([array]) that fails too."""
    docs = [[1, 2, 3], [4, 5], [], [6]]
    want = packtool.pack_dataset(docs, 8, shuffle=False)
    lists = np.empty(len(docs), dtype=object)
    lists[:] = docs
    arrays = np.empty(len(docs), dtype=object)
    arrays[:] = [np.asarray(d, dtype=np.int64) for d in docs]
    dicts = np.array([{"input_ids": d} for d in docs], dtype=object)
    for arr in (lists, arrays, dicts):
        assert packtool.pack_dataset(arr, 8, shuffle=False) == want
    with pytest.raises(InputError, match="not a 1-D object array of int; one document"):
        packtool.pack_dataset(np.array([1, 2, 3], dtype=object), 8)
    with pytest.raises(InputError, match="not a 0-D one"):
        packtool.pack_dataset(np.array(5), 8)
    mixed = np.empty(2, dtype=object)
    mixed[:] = [[1, 2], "abc"]
    with pytest.raises(InputError, match="item 1 is of type str"):
        packtool.pack_dataset(mixed, 8)
    with pytest.raises(InputError, match="no documents"):
        packtool.pack_dataset(np.empty(0, dtype=object), 8)


def test_a_refused_output_names_the_option_changed_not_the_labels_it_implies(tmp_path):
    """Documents with a labels column store unshifted labels under ``labels="none"``: packed
    again with ``labels_column=None``, the refusal said ``labels: 'unshifted' -> 'none'``,
    an option the caller never changed. It names ``labels_column``; with the options alone
    the same, the labels stored follow from the inputs, and it says so."""
    docs = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4, 5]}]
    docs[1]["labels"] = [4, 5]
    out = tmp_path / "fp"
    packtool.pack_dataset(docs, 8, output=out)
    with pytest.raises(OutputError, match=r"other options \(labels_column auto -> none\);"):
        packtool.pack_dataset(docs, 8, output=out, labels_column=None)
    masked = [{"input_ids": [1, 2, 3], "completion_mask": [0, 1, 1]}]
    packtool.pack_dataset(masked, 8, output=tmp_path / "lm")
    with pytest.raises(OutputError, match=r"other options \(loss_mask_column auto -> none\);"):
        packtool.pack_dataset(masked, 8, output=tmp_path / "lm", loss_mask_column=None)
    plain = [{"input_ids": d["input_ids"]} for d in docs]
    with pytest.raises(OutputError, match=r"other options or inputs \(labels stored: "
                                          r"'unshifted' -> 'none': labels, or a labels column "
                                          "or loss mask read in one pack and not in the other"):
        packtool.pack_dataset(plain, 8, output=out)
    pq.write_table(pa.Table.from_pylist(docs), tmp_path / "d.parquet")  # the CLI alike
    assert invoke(["pack", "-q", "-c", 8, tmp_path / "d.parquet", tmp_path / "cli"]).exit_code == 0
    res = invoke(["pack", "-q", "-c", 8, "--labels-column", "none", tmp_path / "d.parquet",
                  tmp_path / "cli"])
    assert res.exit_code == 1 and "other options (--labels-column auto -> none);" \
        in res.output, res.output


def test_the_output_fingerprint_covers_the_columns_read_only(tmp_path):
    """A list column no option reads (``tags``) changed the fingerprint: the same documents
    were "a finished pack of other inputs". A column read (``labels``) still counts."""
    from packtool.formats.manifest import MANIFEST_NAME

    docs = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "tags": [7], "text": "a"},
            {"input_ids": [4, 5], "labels": [4, 5], "tags": [8, 9], "text": "b"}]
    out = tmp_path / "out"
    first = packtool.pack_dataset(docs, 8, output=out)
    stamp = (out / MANIFEST_NAME).stat().st_mtime_ns
    retagged = [{**d, "tags": [1, 2, 3, 4]} for d in docs]
    assert packtool.pack_dataset(retagged, 8, output=out) == first
    untagged = [{k: v for k, v in d.items() if k != "tags"} for d in docs]
    assert packtool.pack_dataset(untagged, 8, output=out) == first
    assert (out / MANIFEST_NAME).stat().st_mtime_ns == stamp  # found done, never rewritten
    relabelled = [{**d, "labels": [-100] * len(d["input_ids"])} for d in docs]
    with pytest.raises(OutputError, match="other documents"):
        packtool.pack_dataset(relabelled, 8, output=out)
    with pytest.raises(OutputError, match="other options"):  # tags read as a loss mask
        packtool.pack_dataset(docs, 8, output=out, loss_mask_column="tags")


def test_the_manifest_of_an_output_names_the_documents_not_a_deleted_temporary_file(tmp_path):
    """The manifest recorded the temporary input's path (``/tmp/packtool-XXXX/input/...``),
    removed after the call, so two identical calls' manifests differed; it names the
    in-memory documents, and ``stats`` reads the output as any other."""
    from packtool.formats.inmemory import INPUT_DESCRIPTION
    from packtool.formats.manifest import read_manifest

    docs = [[1, 2, 3], [4, 5], [6]]
    for out in ("a", "b"):
        packtool.pack_dataset(docs, 8, output=tmp_path / out)
    a, b = read_manifest(tmp_path / "a"), read_manifest(tmp_path / "b")
    assert a.to_dict() == b.to_dict()
    assert [(i.path, i.rows) for i in a.inputs] == [(INPUT_DESCRIPTION, 3)]
    packtool.pack_dataset(docs, 8, output=tmp_path / "c", holdout=0.5, seed=1)
    for out in ("c", "c-holdout"):
        assert [i.path for i in read_manifest(tmp_path / out).inputs] == [INPUT_DESCRIPTION]
    res = invoke(["stats", tmp_path / "a"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("option, column", [("labels_column", "labels"),
                                            ("loss_mask_column", "completion_mask")])
def test_a_mask_column_of_the_wrong_type_is_named_once(tmp_path, option, column):
    """The message said ``labels_column column 'labels' has type int64``: the column named
    twice over, in the CLI too (``--labels-column column 'labels'``)."""
    table = pa.table({"input_ids": [[1, 2, 3]], column: [3]})
    flag = "--" + option.replace("_", "-")
    kind = "integers" if option == "labels_column" else "integers or booleans"
    with pytest.raises(SchemaError, match=rf"^documents: column '{column}' has type int64, "
                                          rf"expected a list of {kind} for {option}; pass "
                                          rf"{option}=None to pack without it$"):
        packtool.pack_dataset(table, 8, **{option: column})
    pq.write_table(table, tmp_path / "d.parquet")
    res = invoke(["pack", "-q", "-c", 8, flag, column, tmp_path / "d.parquet", tmp_path / "o"])
    assert res.exit_code == 1 and "column column" not in res.output
    assert f"column '{column}' has type int64, expected a list of {kind} for {flag}; pass " \
        f"{flag} none to pack without it" in res.output, res.output


def test_a_datasets_format_columns_are_the_only_ones_read():
    """``set_format(columns=...)`` hides columns from the caller's rows; the packed rows are
    those of the rows as shown (a hidden SFT ``labels`` column was read and applied). Hiding
    the token column is refused naming the format."""
    docs = [[1, 2, 3], [4, 5]]
    ds = datasets.Dataset.from_dict({"input_ids": docs, "labels": [[-100, -100, 3], [-100, 5]]})
    plain = packtool.pack_dataset(docs, 8, shuffle=False)
    with_labels = packtool.pack_dataset(ds, 8, shuffle=False).to_list()
    assert with_labels != plain  # the labels column is read when shown
    for fmt in (None, "numpy", "arrow"):
        hidden = ds.with_format(fmt, columns=["input_ids"])
        assert packtool.pack_dataset(hidden, 8, shuffle=False).to_list() == plain
        shown = ds.with_format(fmt, columns=["input_ids"], output_all_columns=True)
        assert packtool.pack_dataset(shown, 8, shuffle=False).to_list() == with_labels
    with pytest.raises(InputError, match=r"format hides its column 'input_ids'.*reset_format"):
        packtool.pack_dataset(ds.with_format(None, columns=["labels"]), 8)


def test_pandas_frames_and_series_are_packed_as_their_rows():
    """A DataFrame (its columns, not its index) packs as the Arrow table of its columns and
    comes back as a DataFrame; a Series of documents as the list of its values."""
    pd = pytest.importorskip("pandas")
    docs = [[1, 2, 3], [4, 5], [], [6]]
    frame = pd.DataFrame({"input_ids": docs, "labels": [[-100, 2, 3], [4, 5], [], [6]],
                          "text": list("abcd")}, index=[7, 3, 9, 1])
    want = packtool.pack_dataset([{"input_ids": d, "labels": lab}
                                  for d, lab in zip(docs, frame["labels"])], 8, shuffle=False)
    got = packtool.pack_dataset(frame, 8, shuffle=False)
    assert isinstance(got, pd.DataFrame) and list(got.columns) == list(want[0])
    assert [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in row.items()}
            for row in got.to_dict("records")] == want
    assert packtool.pack_dataset(frame["input_ids"], 8, shuffle=False) == \
        packtool.pack_dataset(docs, 8, shuffle=False)
    with pytest.raises(SchemaError, match="row 1"):
        packtool.pack_dataset(pd.DataFrame({"input_ids": [[1], [-2]]}), 8)


def test_pack_dataset_and_pack_take_file_uris_of_localhost_and_refuse_other_hosts(tmp_path,
                                                                                  monkeypatch):
    """``output="file://localhost/ABS"`` packed into ``/ABS`` and then failed reading it back
    (``Path`` folded the URI to ``file:/localhost/ABS``: "no such directory"); it now returns
    the rows of the plain path. A ``file:`` URI of another host is a LocationError before any
    document is read or anything written (it was a pack into ``/HOST/...``)."""
    from packtool.errors import LocationError

    monkeypatch.chdir(tmp_path)
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]
    plain = packtool.pack_dataset(docs, 4, output=tmp_path / "plain")
    via_uri = packtool.pack_dataset(docs, 4, output=f"file://localhost{tmp_path}/uri")
    assert via_uri == plain and (tmp_path / "uri" / ".packtool-manifest.parquet").is_file()
    for call in (lambda: packtool.pack_dataset(docs, 4, output="file://otherhost/uri"),
                 lambda: packtool.pack(tmp_path / "plain", "file://otherhost/uri", capacity=4)):
        with pytest.raises(LocationError, match=r"^file://otherhost/uri: names the host "
                                                r"'otherhost', and a file: URI names a file"):
            call()
    assert sorted(os.listdir(tmp_path)) == ["plain", "uri"]
    assert not os.path.exists("/otherhost")


def test_attention_mask_zeros_between_ones_are_refused_in_every_kind_of_dataset(tmp_path):
    """Two padded examples laid end to end in one row: the zeros between them are not padding
    (padding sits at a row's ends), and removing them joined the examples into one document.
    A list, a Dataset, an IterableDataset, a Table and a DataFrame refuse the row alike,
    naming it and the tokens, with the fix in Python keywords; padding at the ends packs."""
    pd = pytest.importorskip("pandas")
    rows = [{"input_ids": [0, 0, 3, 4], "attention_mask": [0, 0, 1, 1]},
            {"input_ids": [101, 5, 6, 102, 0, 0, 101, 7, 8, 102],
             "attention_mask": [1, 1, 1, 1, 0, 0, 1, 1, 1, 1]}]
    table = pa.Table.from_pylist(rows)
    kinds = {"list": rows, "Dataset": datasets.Dataset.from_list(rows),
             "IterableDataset": datasets.Dataset.from_list(rows).to_iterable_dataset(),
             "Table": table, "DataFrame": pd.DataFrame(rows)}
    for kind, data in kinds.items():
        with pytest.raises(SchemaError) as exc:
            packtool.pack_dataset(data, capacity=16)
        msg = str(exc.value)
        assert "\n" not in msg, kind
        assert ("row 1 (0-based): 'attention_mask' is 0 on tokens 4..5 (0-based) of its 10, "
                "between tokens it marks 1") in msg, (kind, msg)
        assert "split the examples into one row each" in msg, (kind, msg)
        assert "attention_mask_column=None and remove the tokens yourself" in msg, (kind, msg)
    src = tmp_path / "in.parquet"
    pq.write_table(table, src)
    with pytest.raises(SchemaError, match=r"in\.parquet: row 1 \(0-based\): 'attention_mask' "
                                          r"is 0 on tokens 4\.\.5"):
        packtool.pack(src, tmp_path / "out", capacity=16)
    assert not (tmp_path / "out").exists()
    got = packtool.pack_dataset(rows[:1], capacity=16)
    assert [r["input_ids"][:2] for r in got] == [[3, 4]]
    assert packtool.pack_dataset(rows, capacity=16, attention_mask_column=None, shuffle=False,
                                 strategy="concat")[0]["input_ids"][:14] == [
        0, 0, 3, 4, 101, 5, 6, 102, 0, 0, 101, 7, 8, 102]


MIXED_INTEGER_DTYPES = [(np.uint32, np.int64), (np.uint32, np.int32), (np.int8, np.uint16),
                        (np.uint64, np.int8), (np.int16, np.uint32), (np.uint8, np.int64),
                        (np.int32, np.int64), (np.uint16, np.uint8)]


@pytest.mark.parametrize("first,second", MIXED_INTEGER_DTYPES)
def test_numpy_integer_arrays_of_any_mix_of_dtypes_are_one_integer_column(first, second):
    """pyarrow mixes int32 with int64 but refuses uint32 beside int64 (or int8 beside uint16);
    pack_dataset refused those with 'give one sequence of integer token ids', which is what was
    given. Any mix of integer dtypes now packs as the same documents given as lists do, in a
    list, a Series, a DataFrame and in dicts (mask columns alike), and their range is checked
    as for any input, naming the document."""
    pd = pytest.importorskip("pandas")
    docs = [np.array([1, 2], first), np.array([3], second), np.array([4, 5, 6], first)]
    masks = [np.array([1, 1], second), np.array([1], first), np.array([0, 1, 1], second)]
    lists = [d.tolist() for d in docs]
    want = packtool.pack_dataset(lists, capacity=8, shuffle=False)
    dicts = [{"input_ids": d, "attention_mask": m} for d, m in zip(docs, masks)]
    want_masked = packtool.pack_dataset(
        [{"input_ids": d.tolist(), "attention_mask": m.tolist()} for d, m in zip(docs, masks)],
        capacity=8, shuffle=False)
    assert packtool.pack_dataset(docs, capacity=8, shuffle=False) == want
    assert packtool.pack_dataset(pd.Series(docs), capacity=8, shuffle=False) == want
    assert packtool.pack_dataset(dicts, capacity=8, shuffle=False) == want_masked
    frame = packtool.pack_dataset(pd.DataFrame({"input_ids": docs}), capacity=8, shuffle=False)
    assert [r.tolist() for r in frame["input_ids"]] == [r["input_ids"] for r in want]
    # scalars of several dtypes inside lists, too
    scalars = [[first(1), second(2)], [second(3)], [first(4), first(5), second(6)]]
    assert packtool.pack_dataset(scalars, capacity=8, shuffle=False) == \
        packtool.pack_dataset([[1, 2], [3], [4, 5, 6]], capacity=8, shuffle=False)


@pytest.mark.parametrize("bad,message", [
    (np.array([-3], np.int8), "negative token id -3"),
    (np.array([2**31], np.uint32), "token id 2147483648 does not fit int32"),
    (np.array([2**64 - 1], np.uint64), "token id 18446744073709551615 does not fit int32")])
def test_mixed_integer_dtypes_are_range_checked_naming_the_document(bad, message):
    for good in (np.array([1, 2], np.int64), np.array([1, 2], np.uint16),
                 [np.int16(1), np.int64(2)]):
        for docs, row in (([good, bad], 1), ([bad, good], 0)):
            with pytest.raises(SchemaError) as exc:
                packtool.pack_dataset(docs, capacity=8)
            assert str(exc.value).startswith(f"documents: row {row} (0-based): {message}"), \
                str(exc.value)


def test_a_column_of_two_kinds_of_values_is_named_never_asking_for_what_was_given():
    """A bool mask beside an integer mask (pyarrow mixes no NumPy bool with integers): the
    message names the column and both rows' kinds, not 'give one sequence of integer token
    ids' (every document is one)."""
    docs = [{"input_ids": [1, 2], "attention_mask": np.array([1, 1], np.int8)},
            {"input_ids": [3], "attention_mask": np.array([True])}]
    with pytest.raises(SchemaError) as exc:
        packtool.pack_dataset(docs, capacity=8)
    msg = str(exc.value)
    assert msg.startswith("documents: row 1 (0-based): column 'attention_mask' holds a NumPy "
                          "bool array, row 0 (0-based) a NumPy int8 array"), msg
    assert "give one sequence" not in msg and "\n" not in msg


def test_documents_given_to_pack_are_refused_in_one_line_naming_pack_dataset(tmp_path):
    """packtool.pack(Dataset / DataFrame / Table / token lists, OUT) printed the whole object
    over several lines (``inputs Dataset({ features: ... }): must be a list of paths``) or named
    an inner token list as if it were the argument (``inputs=[1, 2, 3]: must be a path``),
    without a word of pack_dataset. Each is now one line naming the argument (an item of the
    list by its place), the type with its package, and pack_dataset; no output is made."""
    pd = pytest.importorskip("pandas")
    docs = [[1, 2, 3], [4, 5]]
    out = tmp_path / "o"
    cases = {"datasets.Dataset": datasets.Dataset.from_dict({"input_ids": docs}),
             "pandas.DataFrame": pd.DataFrame({"input_ids": docs}),
             "pyarrow.Table": pa.table({"input_ids": docs}), "dict": {"input_ids": docs}}
    for name, data in cases.items():
        with pytest.raises(ConfigError) as exc:
            packtool.pack(data, out, capacity=8)
        msg = str(exc.value)
        assert "\n" not in msg and len(msg) < 300, msg
        assert msg.startswith("inputs=") and f"not {name}; " in msg, msg
        assert msg.endswith("are packed with packtool.pack_dataset(data, capacity=...)"), msg
    for data, at, got in (([[1, 2, 3]], 0, "[1, 2, 3]"), ((str(tmp_path), [4, 5]), 1, "[4, 5]"),
                          ([pa.table({"input_ids": docs})], 0, "<pyarrow.Table>")):
        with pytest.raises(ConfigError) as exc:
            packtool.pack(data, out, capacity=8)
        msg = str(exc.value)
        assert msg.startswith(f"inputs[{at}]={got}: must be a path (a file, directory or URI)"
                              f", not "), msg
        assert "token lists" in msg and "packtool.pack_dataset(" in msg and "\n" not in msg
    assert not out.exists()


def test_an_option_given_a_large_object_is_shown_by_its_type_in_one_line(tmp_path):
    """A wrong value whose printed form spans lines or runs long (a DataFrame, a long list) was
    quoted whole in the message; it is now shown by its type, the message one line."""
    pd = pytest.importorskip("pandas")
    for kw, shown in ((dict(output=pd.DataFrame({"a": range(50)})), "output=<pandas.DataFrame>"),
                      (dict(column=list(range(100))), "column=<list of 100 items>"),
                      (dict(column=np.arange(100)), "column=<numpy.ndarray>")):
        with pytest.raises(ConfigError) as exc:
            packtool.pack_dataset([[1, 2]], 8, **kw)
        msg = str(exc.value)
        assert msg.startswith(f"{shown}: must be ") and "\n" not in msg, msg


def test_pack_dataset_takes_a_dict_of_columns_as_a_tokenizer_returns_it():
    """tokenizer(list_of_texts) returns a BatchEncoding (a dict of column -> one list per
    document): pack_dataset refused it with no hint. A mapping of columns is now packed as the
    list of its rows would be (masks applied), returned as a dict of columns; a mapping with no
    token column, of columns of different lengths, or holding one document's ids (tokenizer of
    one string) is refused in one line saying what to pass."""
    docs = [[5, 6, 7], [8], [9, 10, 11, 12]]
    masks = [[1, 1, 0], [1], [1, 1, 1, 1]]
    cols = {"input_ids": docs, "attention_mask": masks}
    want = packtool.pack_dataset([{"input_ids": d, "attention_mask": m}
                                  for d, m in zip(docs, masks)], 8, shuffle=False)
    got = packtool.pack_dataset(cols, 8, shuffle=False, batch_rows=2)
    assert isinstance(got, dict) and got == {k: [r[k] for r in want] for k in want[0]}
    assert 7 not in sum(got["input_ids"], [])  # the masked 7 was removed
    assert sorted(t for r in got["input_ids"] for t in r if t) == [5, 6, 8, 9, 10, 11, 12]
    arrays = {k: np.array([(v + [0] * 4)[:4] for v in cols[k]]) for k in cols}  # padded
    assert packtool.pack_dataset(arrays, 8, shuffle=False) == got
    transformers = pytest.importorskip("transformers")
    assert packtool.pack_dataset(transformers.BatchEncoding(cols), 8, shuffle=False) == got
    for bad, words in (({"ids": docs}, "has no column 'input_ids' (columns: ['ids']); pass "
                        "column=NAME"),
                       ({}, "no documents: the dict of columns is empty"),
                       ({"input_ids": docs, "x": [1]}, "columns of different lengths "
                        "('input_ids' 3, 'x' 1)"),
                       ({"input_ids": [5, 6, 7]}, "holds ids, one document (tokenizer(text) "
                        "of one string); pass a list of documents"),
                       ({"train": datasets.Dataset.from_dict({"input_ids": docs}),
                         "test": pa.table({"input_ids": docs})},
                        "a dict of 2 datasets (['train', 'test']) is no dict of columns; pack "
                        "each one, or wrap them in datasets.DatasetDict")):
        with pytest.raises(InputError) as exc:
            packtool.pack_dataset(bad, 8)
        assert words in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_pack_dataset_takes_a_polars_dataframe_and_names_unknown_types_with_their_package():
    """pack_dataset(polars.DataFrame) said ``... a pandas DataFrame ..., not DataFrame``. An
    object whose to_arrow() gives a table (polars) is now packed and handed back as a polars
    DataFrame; one whose to_arrow() gives no table (a polars Series), or a type of no known
    kind, is refused in one line naming its package and the conversion."""
    pl = pytest.importorskip("polars")
    docs = [[1, 2, 3], [4, 5], [6]]
    want = packtool.pack_dataset(pa.table({"input_ids": docs}), 8, shuffle=False)
    got = packtool.pack_dataset(pl.DataFrame({"input_ids": docs}), 8, shuffle=False)
    assert isinstance(got, pl.DataFrame)
    assert got["input_ids"].to_list() == want.column("input_ids").to_pylist()
    with pytest.raises(InputError) as exc:
        packtool.pack_dataset(pl.Series("input_ids", docs), 8)
    msg = str(exc.value)
    assert msg.startswith("pack_dataset takes a table of documents; polars.Series.to_arrow() "
                          "gives pyarrow.") and ".to_list()" in msg, msg

    class Frame:  # a column type of no library packtool knows
        def to_list(self):
            return docs
    with pytest.raises(InputError) as exc:
        packtool.pack_dataset(Frame(), 8)
    msg = str(exc.value)
    assert f"not {__name__.split('.')[0]}.Frame; a column of documents: pass its .to_list()" \
        in msg and "\n" not in msg, msg


_STOPPED_CALL = """
import sys
import packtool
kw = {"output": sys.argv[1]} if len(sys.argv) > 1 else {}
try:
    packtool.pack_dataset([[1, 2, 3, 4]] * 40, 8, rows_per_shard=4, workers=1, **kw)
except KeyboardInterrupt as exc:
    print(f"stopped: {exc}", flush=True)
"""


@pytest.mark.parametrize("keep", [False, True])
def test_a_stopped_pack_dataset_promises_a_resume_only_of_an_output_it_keeps(tmp_path, keep):
    """Ctrl-C during pack_dataset without output= said ``/tmp/packtool-xxxx/packed has no
    manifest; kept for the rerun: ...`` while the call removed that temporary directory on its
    way out. The message now says the temporary output was removed and how to keep one
    (output=); with output= it still says what that output keeps, and the same call resumes."""
    import signal
    import subprocess
    import sys
    import threading

    temp = tmp_path / "temp"
    temp.mkdir()
    out = tmp_path / "kept"
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT="write-shard:1", TMPDIR=str(temp),
               PYTHONPATH=os.pathsep.join([str(Path(packtool.__file__).parents[1]),
                                           os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _STOPPED_CALL] + ([str(out)] if keep else []),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        line = proc.stderr.readline()
        assert "test pause at write-shard:1" in line, line + proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        said, err = proc.communicate()
    finally:
        watchdog.cancel()
        proc.kill()
    assert said.startswith("stopped: "), said + err
    if keep:
        assert f"{out} has no manifest; kept for the rerun: " in said, said
        env.pop("PACKTOOL_TEST_PAUSE_AT")
        again = subprocess.run([sys.executable, "-c", _STOPPED_CALL, str(out)], env=env,
                               capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and not again.stdout, again.stdout + again.stderr
        assert read_output(out)[1].num_rows == 20
    else:
        assert said.strip() == ("stopped: pack_dataset was stopped; its temporary output was "
                                "removed, so nothing is kept to resume from: pass output=DIR to "
                                "keep a stopped pack's work, and the same call again resumes it")
        assert "kept for the rerun" not in said
    assert not [p for p in temp.iterdir() if p.name.startswith("packtool")]


def test_a_failed_pack_dataset_promises_to_finish_only_an_output_it_keeps(tmp_path,
                                                                          monkeypatch):
    """Out of memory while writing shards said ``the finished shards are kept (2): rerun the
    same command to finish`` also without output=, whose temporary output the call removes. The
    message now says it was removed and to pass output=; with output= it says the same call
    finishes it, and it does."""
    from packtool.errors import OutOfMemoryError
    from packtool.pipeline import write as write_mod

    original = write_mod.write_shard
    calls = []

    def third_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise MemoryError
        return original(*args, **kwargs)

    monkeypatch.setattr(write_mod, "write_shard", third_fails)
    docs = [[1, 2, 3, 4]] * 40
    with pytest.raises(OutOfMemoryError) as exc:
        packtool.pack_dataset(docs, 8, rows_per_shard=4, workers=1)
    msg = str(exc.value)
    assert msg.endswith("; the temporary output was removed, so nothing is kept: pass "
                        "output=DIR to keep the finished shards, and the same call again "
                        "finishes it"), msg
    assert "rerun" not in msg and "are kept" not in msg, msg
    calls.clear()
    with pytest.raises(OutOfMemoryError) as exc:
        packtool.pack_dataset(docs, 8, rows_per_shard=4, workers=1, output=tmp_path / "o")
    assert str(exc.value).endswith("the finished shards are kept (2): call pack_dataset again "
                                   "with the same documents, options and output to finish")
    monkeypatch.undo()
    assert len(packtool.pack_dataset(docs, 8, rows_per_shard=4, workers=1,
                                     output=tmp_path / "o")) == 20


def test_a_document_pyarrow_cannot_convert_is_told_in_one_line():
    """A document that is an object printed over many lines (a DataFrame where a list of ids
    belongs) was refused with pyarrow's ``Could not convert <the whole printed frame> with
    type DataFrame: ...``, the message running over 30 lines, or cut to its first line
    (``Could not convert      a``). It is now one line naming the value's type."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": range(30)})
    for data in ([{"input_ids": frame}], [{"input_ids": [1, 2], "labels": frame}],
                 pd.DataFrame({"input_ids": [frame, frame]})):
        with pytest.raises(SchemaError) as exc:
            packtool.pack_dataset(data, 8)
        msg = str(exc.value)
        assert "\n" not in msg and "Could not convert a value of type DataFrame: did not " \
            "recognize Python value type" in msg, msg


def test_tensors_are_documents_in_every_shape():
    """{"input_ids": [tensor, ...]} packed while a list of tensors ("item 0 is of type Tensor")
    and [{"input_ids": tensor}] (pyarrow's "did not recognize Python value type") were refused:
    1-D integer tensors are documents wherever NumPy arrays are (a list, dicts, a dict of
    columns, a pandas Series or DataFrame column, a 2-D tensor as a 2-D array), of any mix of
    integer dtypes, packed as the same lists; a float tensor is refused naming its row."""
    import pandas as pd

    torch = pytest.importorskip("torch")
    docs = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    want = packtool.pack_dataset(docs, 8, shuffle=False)
    tensors = [torch.tensor(d, dtype=torch.int32 if i % 2 else torch.int64)
               for i, d in enumerate(docs)]
    shapes = {"list": tensors, "tuple": tuple(tensors),
              "dicts": [{"input_ids": t} for t in tensors],
              "columns": {"input_ids": tensors},
              "Series": pd.Series(tensors, dtype=object),
              "DataFrame": pd.DataFrame({"input_ids": pd.Series(tensors, dtype=object)})}
    for name, data in shapes.items():
        got = packtool.pack_dataset(data, 8, shuffle=False)
        if name == "columns":
            got = [dict(zip(got, v)) for v in zip(*got.values())]
        elif name == "DataFrame":
            got = pa.Table.from_pandas(got, preserve_index=False).to_pylist()
        assert [r["input_ids"] for r in got] == [r["input_ids"] for r in want], name
    square = [[1, 2], [3, 4]]
    assert packtool.pack_dataset(torch.tensor(square), 8, shuffle=False) == \
        packtool.pack_dataset(np.array(square), 8, shuffle=False)
    bad = list(tensors)
    bad[2] = torch.tensor([1.5])
    for data in (bad, [{"input_ids": t} for t in bad], {"input_ids": bad}, pd.Series(bad),
                 pd.DataFrame({"input_ids": pd.Series(bad, dtype=object)})):
        with pytest.raises(SchemaError, match=r"^documents: row 2 \(0-based\): [^\n]*$"):
            packtool.pack_dataset(data, 8)


def test_empty_inputs_are_refused_alike_and_said_so(tmp_path):
    """An empty DatasetDict came back as an empty DatasetDict while every other empty input is
    refused; an empty Table or DataFrame said ``no documents (empty shards)``, words for the
    CLI's files: each says the input holds no rows (or no split)."""
    import pandas as pd

    empty = [pa.table({"input_ids": pa.array([], pa.list_(pa.int64()))}),
             pd.DataFrame({"input_ids": []}), datasets.Dataset.from_dict({"input_ids": []})]
    for data in empty:
        with pytest.raises(InputError, match=r"^no documents: the data holds no rows$"):
            packtool.pack_dataset(data, 8)
    for dd in (datasets.DatasetDict({}), datasets.IterableDatasetDict({})):
        with pytest.raises(InputError, match=r"^no documents: the \w+ holds no split$"):
            packtool.pack_dataset(dd, 8)


def test_a_generator_is_refused_with_the_conversions_that_fit():
    for gen in ((d for d in [[1, 2]]), iter([[1, 2]])):
        with pytest.raises(InputError) as info:
            packtool.pack_dataset(gen, 8)
        msg = str(info.value)
        assert "list(" in msg and "Dataset.from_generator" in msg and "\n" not in msg, msg


def test_a_dataset_dict_with_output_is_refused_as_documented():
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [[1, 2]]})})
    with pytest.raises(ConfigError, match="^output: a DatasetDict"):
        packtool.pack_dataset(dd, 8, output="somewhere")
    doc = packtool.pack_dataset.__doc__
    raises = doc[doc.index("Raises:"):]
    assert "DatasetDict" in raises and "output" in raises[:raises.index("LocationError")]


def test_other_documents_into_a_finished_output_name_the_counts(tmp_path):
    out = tmp_path / "out"
    packtool.pack_dataset([[1, 2, 3], [4, 5]], 8, output=out)
    with pytest.raises(OutputError, match=r"other documents \(the same number, 2, with other "
                                          r"content; or another packtool version\); pass "
                                          r"overwrite=True"):
        packtool.pack_dataset([[1, 2, 3], [4, 6]], 8, output=out)
    with pytest.raises(OutputError, match=r"other documents \(3 documents now, 2 in it\)"):
        packtool.pack_dataset([[1, 2, 3], [4, 5], [7]], 8, output=out)


def _scalar_token_inputs():
    """One integer per document in every shape pack_dataset takes, with its Arrow type."""
    import pandas as pd

    return {
        "table": (pa.table({"input_ids": [5, 6]}), "int64"),
        "dataset": (datasets.Dataset.from_dict({"input_ids": [5, 6]}), "int32"),  # its choice
        "DataFrame": (pd.DataFrame({"input_ids": [5, 6]}), "int64"),
        "dicts": ([{"input_ids": 5}], "int64"),
        "uint8": (pa.table({"input_ids": pa.array([5, 6], pa.uint8())}), "uint8"),
        "uint64": (pa.table({"input_ids": pa.array([5, 6], pa.uint64())}), "uint64"),
        "uint64 beyond int64": (pa.table({"input_ids": pa.array([5, 2**63 + 1],
                                                               pa.uint64())}), "uint64"),
        "numpy uint8 dicts": ([{"input_ids": np.uint8(5)}], "uint8"),
    }


@pytest.mark.parametrize("case", ["table", "dataset", "DataFrame", "dicts", "uint8", "uint64",
                                  "uint64 beyond int64", "numpy uint8 dicts"])
def test_a_token_column_of_one_integer_per_document_is_refused_as_the_cli_refuses_it(
        tmp_path, case):
    """A column of one integer per document was cast to a list of ids, the cast failed, and the
    failure was told as ``token id None does not fit int32``: it is the type the CLI names for
    the same Parquet file, with the API's fix (column=NAME)."""
    data, typ = _scalar_token_inputs()[case]
    with pytest.raises(SchemaError) as exc:
        packtool.pack_dataset(data, 8)
    msg = str(exc.value)
    assert msg.startswith(f"documents: row 0 (0-based): column 'input_ids' has type {typ}, "
                          "expected a list of integer token ids"), msg
    assert "None" not in msg and "does not fit" not in msg and "tokenize" not in msg, msg
    assert msg.endswith("pass column=NAME") and "--" not in msg and "\n" not in msg, msg
    pq.write_table(pa.table({"input_ids": pa.array([5, 6], typ)}), tmp_path / "d.parquet")
    res = invoke(["pack", "-q", "-c", 8, tmp_path / "d.parquet", tmp_path / "out"])
    assert res.exit_code == 1 and f"has type {typ}, expected" in res.output, res.output
    assert " ".join(res.output.split()).endswith("pass --column NAME"), res.output


def _no_token_list_inputs():
    """Token columns of no list of integers, each with what its fix says (and never says)."""
    nested = [[[1, 2]], [[3]]]
    return {
        "nested lists": (pa.table({"input_ids": nested}), "flatten", "tokenize"),
        "nested list dicts": ([{"input_ids": d} for d in nested], "flatten", "tokenize"),
        "bool": (pa.table({"input_ids": [True, False]}), "column=NAME", "tokenize"),
        "struct": (pa.table({"input_ids": [{"a": 1}, {"a": 2}]}), "column=NAME", "tokenize"),
        "binary": (pa.table({"input_ids": [b"a", b"b"]}), "column=NAME", "tokenize"),
        "decimal": (pa.table({"input_ids": pa.array([1, 2], pa.decimal128(5, 0))}),
                    "column=NAME", "tokenize"),
        "float": (pa.table({"input_ids": [1.5, 2.0]}), "column=NAME", "tokenize"),
        "2-D bool array": (np.array([[True, False]]), "column=NAME", "tokenize"),
        "2-D string array": (np.array([["a", "b"]]), "column=NAME", "tokenize"),
        "text": (pa.table({"input_ids": ["a b", "c"]}), "tokenize", "column=NAME"),
        "nested beside ids": (pa.table({"input_ids": nested, "ids": [[1], [2]]}),
                              "pass column='ids'", "tokenize"),
        "bool beside ids": (pa.table({"input_ids": [True, False], "ids": [[1], [2]]}),
                            "pass column='ids'", "tokenize"),
    }


@pytest.mark.parametrize("case", list(_no_token_list_inputs()))
def test_a_token_column_of_no_list_of_integers_gets_the_fix_for_its_type(case):
    """Every such column was told ``holds no token ids and these documents has no list of
    integers: tokenize its text first``: bad grammar, and tokenize fits text alone. Text is
    tokenized, nested lists flattened, and any other type names the column to pass (the lists
    of integers there are, if any)."""
    data, says, never = _no_token_list_inputs()[case]
    with pytest.raises(SchemaError) as exc:
        packtool.pack_dataset(data, 8)
    msg = str(exc.value)
    assert says in msg and never not in msg, msg
    assert "documents has" not in msg and "this file" not in msg and "--" not in msg, msg
    assert "\n" not in msg, msg


def test_dir_of_packtool_lists_each_name_once():
    """A name loaded on first use (pack, PackStats) was listed twice by dir(packtool) after."""
    packtool.pack, packtool.PackStats  # noqa: B018  (loaded: now in the module's globals)
    names = dir(packtool)
    assert len(names) == len(set(names)) and names == sorted(names)
    assert set(packtool.__all__) <= set(names)


def test_pack_into_an_output_of_in_memory_documents_names_them_as_such(tmp_path, sample_data):
    """The output of pack_dataset(output=) records its documents by a placeholder, which a
    refusal showed as a file in the current directory (``1 file removed:
    /cwd/<in-memory documents: packtool.pack_dataset>``); the CLI and the API name them as the
    documents they are."""
    out = tmp_path / "out"
    packtool.pack_dataset([[1, 2, 3], [4, 5]], 8, output=out)
    with pytest.raises(OutputError) as exc:
        packtool.pack(sample_data, out, capacity=8)
    res = invoke(["pack", "-q", "-c", 8, sample_data, out])
    assert res.exit_code != 0
    for msg in (str(exc.value), " ".join(res.output.split())):
        assert "; 1 input removed: the in-memory documents of packtool.pack_dataset)" in msg, msg
        assert "<in-memory" not in msg, msg


def test_arrays_and_frames_pack_dataset_does_not_take_are_told_what_to_pass():
    """A 1-D object array of ids was told ``takes ... a 1-D object array of documents, not a
    1-D one``; a pyarrow.ChunkedArray and a polars.LazyFrame were refused with no conversion."""
    with pytest.raises(InputError) as exc:
        packtool.pack_dataset(np.array([1, 2, 3], dtype=object), 8)
    msg = str(exc.value)
    assert "not a 1-D one" not in msg and "1-D object array of int" in msg, msg
    assert "one document of ids is [array]" in msg, msg
    with pytest.raises(InputError) as exc:
        packtool.pack_dataset(np.array([1, 2, 3]), 8)
    assert "1-D array of int64" in str(exc.value) and "[array]" in str(exc.value), exc.value
    with pytest.raises(InputError) as exc:
        packtool.pack_dataset(pa.chunked_array([[[1, 2]], [[3]]]), 8)
    msg = str(exc.value)
    assert "not pyarrow.ChunkedArray" in msg and "pyarrow.table({'input_ids': it})" in msg, msg
    assert ".combine_chunks()" in msg, msg
    with pytest.raises(InputError) as exc:
        packtool.pack_dataset(pa.chunked_array([[[1, 2]]]), 8, column="ids")
    assert "pyarrow.table({'ids': it})" in str(exc.value), exc.value
    pl = pytest.importorskip("polars")
    with pytest.raises(InputError) as exc:
        packtool.pack_dataset(pl.DataFrame({"input_ids": [[1, 2]]}).lazy(), 8)
    msg = str(exc.value)
    assert "not polars.LazyFrame" in msg and "pass its .collect()" in msg, msg


def _missing_token_column_inputs():
    """Documents without ``input_ids``, each with the fix pack names for the same file."""
    import pandas as pd

    return {
        "DataFrame": (pd.DataFrame({"tokens": [[1, 2], [3]]}), "tokens",
                      "pass column='tokens'", "pass --column tokens"),
        "table": (pa.table({"tokens": [[1, 2], [3]], "text": ["a", "b"]}), "tokens, text",
                  "pass column='tokens'", "pass --column tokens"),
        "dicts": ([{"tokens": [1, 2], "labels": [-100, 2]}], "tokens, labels",
                  "pass column='tokens'", "pass --column tokens"),
        "two candidates": (pd.DataFrame({"ids": [[1]], "tokens": [[2]]}), "ids, tokens",
                           "pass column=NAME", "pass --column NAME"),
        "text": (pd.DataFrame({"body": ["a b"]}), "body",
                 "it holds text ('body'), not token ids: tokenize it first",
                 "it holds text ('body'), not token ids: text is tokenized first"),
    }


@pytest.mark.parametrize("case", list(_missing_token_column_inputs()))
def test_documents_without_the_token_column_are_told_the_fix_the_cli_names(tmp_path, case):
    """pack_dataset of documents without ``input_ids`` said only "pass column=NAME" where pack
    of the same file names the one list of integers there (``pass --column tokens``), or that
    the file holds text: the same fix now, as the API's keyword."""
    data, avail, api, cli = _missing_token_column_inputs()[case]
    with pytest.raises(SchemaError) as exc:
        packtool.pack_dataset(data, 8)
    msg = str(exc.value)
    assert msg.startswith(f"documents: no column 'input_ids'; available columns: {avail}; "), msg
    assert api in msg and "--" not in msg and "\n" not in msg, msg
    table = data if isinstance(data, pa.Table) else (
        pa.Table.from_pylist(data) if isinstance(data, list) else pa.Table.from_pandas(data))
    pq.write_table(table, tmp_path / "d.parquet")
    res = invoke(["pack", "-q", "-c", 8, tmp_path / "d.parquet", tmp_path / "out"])
    assert res.exit_code == 1 and cli in " ".join(res.output.split()), res.output
