"""INPUT in an object store (S3 through pyarrow.fs), against a local S3 server started by the
test suite (moto's server mode on 127.0.0.1): the same documents give the same bytes as from a
local directory, and discovery keeps its rules (``_temporary`` skipped, packed outputs refused).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import hash_tree, invoke, write_docs
from packtool.formats.manifest import MANIFEST_NAME, read_manifest, write_manifest_file
from packtool.formats.reader import discover, iter_token_batches
from packtool.formats.schema import packed_schema

DOCS_A = [[5, 6, 7], [1, 2], [9] * 6]
DOCS_B = [[3], [4, 4, 4, 4], [8, 9, 10, 11, 12]]


def _put(fs, key, docs):
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), key,
                   filesystem=fs)


def _shards(out):
    return {k: v for k, v in hash_tree(out).items() if k != MANIFEST_NAME}


def test_pack_from_s3_gives_the_same_bytes_as_local(tmp_path, s3):
    fs, bucket = s3
    _put(fs, f"{bucket}/corpus/a.parquet", DOCS_A)
    _put(fs, f"{bucket}/corpus/sub/b.parquet", DOCS_B)
    _put(fs, f"{bucket}/corpus/_temporary/0/a.parquet", DOCS_A)
    local = tmp_path / "local"
    write_docs(local / "a.parquet", DOCS_A)
    write_docs(local / "sub" / "b.parquet", DOCS_B)
    ref = tmp_path / "ref"
    assert invoke(["pack", "-q", "-c", 8, local, ref]).exit_code == 0
    out = tmp_path / "out"
    res = invoke(["pack", "-c", 8, f"s3://{bucket}/corpus", out])
    assert res.exit_code == 0, res.output
    assert _shards(out) == _shards(ref)
    assert "skipped 1" in res.output and f"s3://{bucket}/corpus/_temporary" in res.output
    manifest = read_manifest(out)
    assert [i["path"] for i in manifest["inputs"]] == [f"s3://{bucket}/corpus/a.parquet",
                                                       f"s3://{bucket}/corpus/sub/b.parquet"]


def test_s3_file_uri_and_windows(tmp_path, s3):
    """One object given by URI, cut into windows: still the local bytes."""
    fs, bucket = s3
    docs = [[i + 1] * (1 + i % 5) for i in range(30)]
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}),
                   f"{bucket}/one.parquet", filesystem=fs, row_group_size=7)
    local = tmp_path / "one.parquet"
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), local,
                   row_group_size=7)
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 8, "--window-docs", 10, local, ref]).exit_code == 0
    res = invoke(["pack", "-q", "-c", 8, "--window-docs", 10, f"s3://{bucket}/one.parquet", out])
    assert res.exit_code == 0, res.output
    assert _shards(out) == _shards(ref)


def test_folded_uri_is_read_as_the_uri(s3):
    """``Path("s3://b/k")`` becomes ``s3:/b/k``; the reader still goes to S3 and names the URI."""
    from pathlib import Path

    fs, bucket = s3
    _put(fs, f"{bucket}/a.parquet", DOCS_A)
    got = list(iter_token_batches(Path(f"s3://{bucket}/a.parquet"), "input_ids"))
    assert got[0].lengths.tolist() == [3, 2, 6]


def test_hugging_face_folder_and_arrow_in_s3(s3):
    fs, bucket = s3
    table = pa.table({"input_ids": pa.array(DOCS_A, pa.list_(pa.int32()))})
    with fs.open_output_stream(f"{bucket}/hf/data-00000-of-00001.arrow") as fh:
        with pa.ipc.new_stream(fh, table.schema) as w:
            w.write_table(table)
    for name, doc in (("state.json", {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}),
                      ("dataset_info.json", {})):
        with fs.open_output_stream(f"{bucket}/hf/{name}") as fh:
            fh.write(json.dumps(doc).encode())
    d = discover([f"s3://{bucket}/hf"])
    assert [f.path for f in d.files] == [f"s3://{bucket}/hf/data-00000-of-00001.arrow"]
    got = [tb.lengths.tolist() for tb in iter_token_batches(d.files[0].path, "input_ids")]
    assert got == [[3, 2, 6]]


@pytest.mark.parametrize("what", ["missing", "packed"])
def test_s3_input_errors_are_one_line(tmp_path, s3, what):
    fs, bucket = s3
    if what == "packed":
        _put(fs, f"{bucket}/p/part-00000.parquet", DOCS_A)
        local = tmp_path / "m"
        local.mkdir()
        mpath = write_manifest_file(local, {"packtool_version": "0", "outputs": []},
                                    packed_schema(8, "none"))
        with fs.open_output_stream(f"{bucket}/p/{MANIFEST_NAME}") as fh:
            fh.write(mpath.read_bytes())
    out = tmp_path / "out"
    res = invoke(["pack", "-q", f"s3://{bucket}/p", out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert f"s3://{bucket}/p" in res.output
    assert ("no such file" if what == "missing" else "is a packtool output") in res.output
    assert not out.exists()
