"""The global document index (what ``doc_ids`` points at) follows each input format's own order.

A ``save_to_disk`` folder's rows are the files of its ``state.json`` in that list's order (what
``datasets.load_from_disk`` returns), whatever the file names; a plain folder's files are taken
in sorted relative-path order. Read in file-name order instead, ``doc_ids`` point at the wrong
rows of ``load_from_disk`` without any error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from packcheck import invoke, read_output, write_docs
from packtool.errors import InputError
from packtool.formats.reader import discover

DOCS = [[100 + 10 * i + j for j in range(1 + i % 4)] for i in range(12)]


def _write_stream(path, docs):
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})
    with pa.ipc.new_stream(str(path), table.schema) as w:
        w.write_table(table)


def _hf_folder(folder: Path, parts: dict, order: list) -> Path:
    """A ``save_to_disk`` folder: ``parts`` maps file name -> documents; ``state.json`` lists
    the files in ``order``."""
    folder.mkdir(parents=True)
    for name, docs in parts.items():
        _write_stream(folder / name, docs)
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    (folder / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": n} for n in order], "_split": None}))
    return folder


def _segments_match(rows, docs_in_order):
    """Every packed segment holds the tokens its doc_ids/doc_offsets name in ``docs_in_order``."""
    for r in rows:
        cu = r["cu_seqlens"]
        for k, (d, off) in enumerate(zip(r["doc_ids"], r["doc_offsets"])):
            got = r["input_ids"][cu[k]:cu[k + 1]]
            assert got == docs_in_order[d][off:off + len(got)], (d, got)


def test_save_to_disk_folder_follows_state_json_not_file_names(tmp_path):
    """state.json lists c, a, b: documents 0..3 are c's rows, as load_from_disk returns them."""
    parts = {"a.arrow": DOCS[0:4], "b.arrow": DOCS[4:8], "c.arrow": DOCS[8:12]}
    hf = _hf_folder(tmp_path / "in" / "hf", parts, ["c.arrow", "a.arrow", "b.arrow"])
    d = discover([hf])
    assert [f.rel for f in d.files] == ["c.arrow", "a.arrow", "b.arrow"]
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 8, "--no-shuffle", hf, out])
    assert res.exit_code == 0, res.output
    rows, _ = read_output(out)
    _segments_match(rows, DOCS[8:12] + DOCS[0:4] + DOCS[4:8])


def test_save_to_disk_folder_nested_in_a_folder_keeps_its_place_and_its_order(tmp_path):
    """Inside a larger INPUT the folder takes its place in the sorted relative-path order and
    keeps its own file order inside."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2]])
    _hf_folder(src / "m", {"x.arrow": [[3]], "y.arrow": [[4]]}, ["y.arrow", "x.arrow"])
    write_docs(src / "m.parquet", [[5]])  # sorts before m/ ('.' < '/')
    write_docs(src / "z.parquet", [[6]])
    assert [f.rel for f in discover([src]).files] == ["a.parquet", "m.parquet", "m/y.arrow",
                                                      "m/x.arrow", "z.parquet"]


def test_real_save_to_disk_folder_packs_in_load_from_disk_order(tmp_path):
    """A folder written by ``datasets`` whose shard files were renamed so that their names sort
    against ``state.json``: doc_ids index ``load_from_disk`` rows."""
    datasets = pytest.importorskip("datasets")
    hf = tmp_path / "hf"
    datasets.Dataset.from_dict({"input_ids": DOCS}).save_to_disk(str(hf), num_shards=3)
    state = json.loads((hf / "state.json").read_text())
    renamed = []
    for entry, new in zip(state["_data_files"], ["data-c.arrow", "data-b.arrow", "data-a.arrow"]):
        (hf / entry["filename"]).rename(hf / new)
        renamed.append({"filename": new})
    state["_data_files"] = renamed
    (hf / "state.json").write_text(json.dumps(state))
    loaded = [list(x) for x in datasets.load_from_disk(str(hf))["input_ids"]]
    assert loaded == DOCS
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 8, hf, out])
    assert res.exit_code == 0, res.output
    rows, _ = read_output(out)
    _segments_match(rows, loaded)


def test_save_to_disk_folder_with_an_indices_mapping_is_refused(tmp_path):
    """An older ``datasets`` saved a selection or shuffle as an indices file over the data:
    its rows are not the data files' order, so packing the files would misnumber every row."""
    hf = _hf_folder(tmp_path / "hf", {"dataset.arrow": DOCS}, ["dataset.arrow"])
    _write_stream(hf / "indices.arrow", [[0]])
    state = json.loads((hf / "state.json").read_text())
    state["_indices_data_files"] = [{"filename": "indices.arrow"}]
    (hf / "state.json").write_text(json.dumps(state))
    with pytest.raises(InputError, match=r"indices mapping.*flatten_indices"):
        discover([hf])


def test_save_to_disk_order_holds_in_an_object_store(s3, tmp_path):
    """The same rule for a folder listed through an object store."""
    fs, bucket = s3
    local = _hf_folder(tmp_path / "hf", {"a.arrow": [[1]], "b.arrow": [[2]]},
                       ["b.arrow", "a.arrow"])
    for p in local.iterdir():
        with fs.open_output_stream(f"{bucket}/hf/{p.name}") as fh:
            fh.write(p.read_bytes())
    d = discover([f"s3://{bucket}/hf"])
    assert [f.rel for f in d.files] == ["b.arrow", "a.arrow"]


def test_unpadded_numbers_in_file_names_are_reported(tmp_path):
    """part-10 sorts before part-2 as text: the order is kept (it is the documented rule, and
    what pyarrow.dataset reads), and discovery says so, naming the fix."""
    src = tmp_path / "in"
    for i in (1, 2, 10):
        write_docs(src / f"part-{i}.parquet", [[i]])
    d = discover([src])
    assert [f.rel for f in d.files] == ["part-1.parquet", "part-10.parquet", "part-2.parquet"]
    assert any("part-10.parquet" in n and "zero-pad" in n for n in d.notes)


def test_file_names_with_digits_of_other_scripts_are_read_not_a_crash(tmp_path):
    """File names holding '²' (a digit to str.isdigit that int() refuses) or Arabic-Indic
    digits: the folder is read in sorted order (the order note compares numbers), never an
    internal error."""
    d = tmp_path / "in"
    d.mkdir()
    names = ["a1²2.parquet", "a10.parquet", "a٣.parquet", "a2.parquet"]
    for i, name in enumerate(names):
        write_docs(d / name, DOCS[3 * i:3 * i + 3])
    res = invoke(["pack", "-q", "-c", "8", "--no-shuffle", "--strategy", "ordered", d,
                  tmp_path / "o"])
    assert res.exit_code == 0, res.output
    rows, _ = read_output(tmp_path / "o")
    got = [t for r in rows for t in r["input_ids"] if t]
    assert sorted(got) == sorted(t for d in DOCS[:12] for t in d)
    by_name = {name: DOCS[3 * i][0] for i, name in enumerate(names)}
    assert got[0] == by_name[sorted(names)[0]]
