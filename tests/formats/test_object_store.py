"""INPUT in an object store (S3 through pyarrow.fs), against a local S3 server started by the
test suite (moto's server mode on 127.0.0.1): the same documents give the same bytes as from a
local directory, and discovery keeps its rules (``_temporary`` skipped, packed outputs refused).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
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


def _remote_tree(fs, base):
    import hashlib

    out = {}
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as fh:
                out[info.path[len(base) + 1:]] = hashlib.sha256(fh.read()).hexdigest()
    return out


OPTS = ["-c", 8, "--rows-per-shard", 2, "--workers", 1]


def _corpus(fs, bucket, tmp_path):
    docs = [[i * 10 + k for k in range(1 + i % 6)] for i in range(30)]
    _put(fs, f"{bucket}/in/a.parquet", docs)
    local = write_docs(tmp_path / "local" / "a.parquet", docs)
    ref = tmp_path / "ref"
    assert invoke(["pack", "-q", *OPTS, local, ref]).exit_code == 0
    return ref


def test_pack_s3_to_s3_gives_the_same_bytes_as_local(tmp_path, s3, monkeypatch):
    fs, bucket = s3
    monkeypatch.setenv("PACKTOOL_STAGING_DIR", str(tmp_path / "stage"))
    ref = _corpus(fs, bucket, tmp_path)
    res = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/in", f"s3://{bucket}/out"])
    assert res.exit_code == 0, res.output
    remote = _remote_tree(fs, f"{bucket}/out")
    assert {k: v for k, v in remote.items() if k != MANIFEST_NAME} == _shards(ref)
    assert [k for k in remote if k.startswith(".")] == [MANIFEST_NAME]
    assert not any((tmp_path / "stage").iterdir()), "the staging directory is removed"
    # a packed output in S3 is refused as OUTPUT without --overwrite, and as INPUT
    again = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/in", f"s3://{bucket}/out"])
    assert again.exit_code == 1 and "not empty" in again.output
    back = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/out", tmp_path / "x"])
    assert back.exit_code == 1 and "packtool output" in back.output


@pytest.mark.parametrize("phase", ["write-shard:2", "upload:3"])
def test_killed_s3_pack_resumes_with_the_same_bytes(tmp_path, s3, phase):
    """SIGKILL while packing (staged) or while publishing: no manifest in S3; the rerun
    finishes with the bytes of an uninterrupted local pack, reusing what was done."""
    import os
    import signal
    import subprocess
    import sys

    fs, bucket = s3
    ref = _corpus(fs, bucket, tmp_path)
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT=phase,
               PACKTOOL_STAGING_DIR=str(tmp_path / "stage"))
    args = ["pack", "-q", *[str(a) for a in OPTS], f"s3://{bucket}/in", f"s3://{bucket}/out"]
    proc = subprocess.Popen([sys.executable, "-m", "packtool", *args], stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = proc.stderr.readline()
        assert f"test pause at {phase}" in line, line
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    remote = _remote_tree(fs, f"{bucket}/out")
    assert MANIFEST_NAME not in remote
    if phase.startswith("upload"):
        assert {"part-00000.parquet", "part-00002.parquet"} <= set(remote)
    env.pop("PACKTOOL_TEST_PAUSE_AT")
    res = subprocess.run([sys.executable, "-m", "packtool", *args[:1], "--json", *args[2:]],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    if phase.startswith("upload"):
        assert json.loads(res.stdout)["shards_reused"] == 3
    remote = _remote_tree(fs, f"{bucket}/out")
    assert {k: v for k, v in remote.items() if k != MANIFEST_NAME} == _shards(ref)
