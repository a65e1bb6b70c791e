"""INPUT in an object store (S3 through pyarrow.fs), against a local S3 server started by the
test suite (moto's server mode on 127.0.0.1): the same documents give the same bytes as from a
local directory, and discovery keeps its rules (``_temporary`` skipped, packed outputs refused).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from packcheck import (DENIED_TEXT, DOWN_TEXT, faulty_store, hash_store_tree, hash_tree, invoke,
                       one_store_line,
                       write_docs)
from packtool.formats.manifest import (IN_PROGRESS_NAME, LOCK_NAME, MANIFEST_NAME, TMP_DIR_NAME,
                                       LabelsInfo, Manifest, is_pending_name, manifest_bytes,
                                       publish_manifest, read_manifest)
from packtool.formats.reader import discover, iter_token_batches
from packtool.output import SCRATCH_FINGERPRINT
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
    assert [i.path for i in manifest.inputs] == [f"s3://{bucket}/corpus/a.parquet",
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
        m = Manifest(format_version=3, packtool_version="0", fingerprint="f", capacity=8,
                     labels=LabelsInfo(False, "unshifted"))
        with fs.open_output_stream(f"{bucket}/p/{MANIFEST_NAME}") as fh:
            fh.write(manifest_bytes(m, packed_schema(8, "none")))
    out = tmp_path / "out"
    res = invoke(["pack", "-q", f"s3://{bucket}/p", out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert f"s3://{bucket}/p" in res.output
    assert ("nothing under this prefix" if what == "missing"
            else "is a packtool output") in res.output
    assert not out.exists()


OPTS = ["-c", 8, "--rows-per-shard", 2, "--workers", 1]


def _corpus(fs, bucket, tmp_path):
    docs = [[i * 10 + k for k in range(1 + i % 6)] for i in range(30)]
    _put(fs, f"{bucket}/in/a.parquet", docs)
    local = write_docs(tmp_path / "local" / "a.parquet", docs)
    ref = tmp_path / "ref"
    assert invoke(["pack", "-q", *OPTS, local, ref]).exit_code == 0
    return ref


def _node_temp(tmp_path, monkeypatch):
    """The process's temporary directory (where tasks write before uploading), made empty."""
    import tempfile

    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(node))
    return node


def test_pack_s3_to_s3_gives_the_same_bytes_as_local(tmp_path, s3, monkeypatch):
    fs, bucket = s3
    node = _node_temp(tmp_path, monkeypatch)
    ref = _corpus(fs, bucket, tmp_path)
    res = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/in", f"s3://{bucket}/out"])
    assert res.exit_code == 0, res.output
    remote = hash_store_tree(fs, f"{bucket}/out")
    assert {k: v for k, v in remote.items() if k != MANIFEST_NAME} == _shards(ref)
    assert [k for k in remote if k.startswith(".")] == [MANIFEST_NAME], "scratch, lock removed"
    assert not any(node.iterdir()), "the local files written before each upload are removed"
    m = read_manifest(f"s3://{bucket}/out")
    assert [o.file for o in m.shards] == sorted(_shards(ref))
    # the same command again: the finished pack is kept (a no-op), as in a directory
    again = invoke(["pack", *OPTS, f"s3://{bucket}/in", f"s3://{bucket}/out"])
    assert again.exit_code == 0 and "already holds this pack" in again.output, again.output
    assert hash_store_tree(fs, f"{bucket}/out") == remote
    # other options: refused without --overwrite; a packed output is refused as INPUT
    other = invoke(["pack", "-q", *OPTS[:-2], "--workers", 2, "--seed", 3,
                    f"s3://{bucket}/in", f"s3://{bucket}/out"])
    assert other.exit_code == 1 and "holds a finished pack of other options (" in other.output \
        and "--seed 0 -> 3" in other.output, other.output
    back = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/out", tmp_path / "x"])
    assert back.exit_code == 1 and "packtool output" in back.output


def test_s3_output_refuses_foreign_objects_and_a_held_lock(tmp_path, s3, monkeypatch):
    import socket

    fs, bucket = s3
    _node_temp(tmp_path, monkeypatch)
    _corpus(fs, bucket, tmp_path)
    with fs.open_output_stream(f"{bucket}/o1/notes.txt") as fh:
        fh.write(b"x")
    res = invoke(["pack", "-q", *OPTS, "--overwrite", f"s3://{bucket}/in", f"s3://{bucket}/o1"])
    assert res.exit_code == 1 and "packtool did not write (notes.txt)" in res.output, res.output
    with fs.open_output_stream(f"{bucket}/o2/{LOCK_NAME}") as fh:  # a live run of this host
        fh.write(json.dumps({"run": "r1", "host": socket.gethostname(),
                             "pid": os.getpid()}).encode())
    res = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/in", f"s3://{bucket}/o2"])
    # a lock naming no kind (nor a marker beside it) claims neither a pack nor a tokenize
    assert res.exit_code == 1 and "another packtool run (run r1" in res.output, res.output
    assert "--overwrite" not in res.output  # a live run of this host: never to be overwritten
    # --overwrite beside a live run of this host ran anyway: two packs wrote the same shards
    res = invoke(["pack", "-q", *OPTS, "--overwrite", f"s3://{bucket}/in", f"s3://{bucket}/o2"])
    assert res.exit_code == 1 and "another packtool run (run r1" in res.output, res.output
    assert set(hash_store_tree(fs, f"{bucket}/o2")) == {LOCK_NAME}
    for kind, said in (("tokenized", "tokenize run"), ("packed", "pack")):  # what it records
        with fs.open_output_stream(f"{bucket}/o2/{LOCK_NAME}") as fh:
            fh.write(json.dumps({"run": "r1", "host": socket.gethostname(), "pid": os.getpid(),
                                 "kind": kind}).encode())
        res = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/in", f"s3://{bucket}/o2"])
        assert res.exit_code == 1 and f"another packtool {said} (run r1" in res.output, res.output
    from packtool.errors import OutputError
    from packtool.formats import object_store as store

    mine = store.take_lock(f"s3://{bucket}/o4", overwrite=False, kind="tokenized")
    assert mine["kind"] == "tokenized"  # a tokenize's lock says so to the run it refuses
    with pytest.raises(OutputError, match="another packtool tokenize run "):
        store.take_lock(f"s3://{bucket}/o4", overwrite=False)
    store.release_lock(f"s3://{bucket}/o4", mine)
    with fs.open_output_stream(f"{bucket}/o3/{LOCK_NAME}") as fh:  # another host's: unknowable
        fh.write(json.dumps({"run": "r2", "host": "elsewhere", "pid": 1}).encode())
    res = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/in", f"s3://{bucket}/o3"])
    assert res.exit_code == 1 and "pass --overwrite if it was killed" in res.output, res.output
    res = invoke(["pack", "-q", *OPTS, "--overwrite", f"s3://{bucket}/in", f"s3://{bucket}/o3"])
    assert res.exit_code == 0, res.output


def test_an_upgrades_lock_in_a_store_names_the_upgrade(tmp_path, s3, monkeypatch):
    """The lock object an upgrade takes records its command: a second upgrade, and a pack,
    are told another packtool upgrade holds OUTPUT (its lock said it was a pack)."""
    from packtool.errors import OutputError
    from packtool.output import holding_lock

    fs, bucket = s3
    _node_temp(tmp_path, monkeypatch)
    _corpus(fs, bucket, tmp_path)
    out = f"s3://{bucket}/out"
    assert invoke(["pack", "-q", *OPTS, f"s3://{bucket}/in", out]).exit_code == 0
    with holding_lock(out, "upgrade"):
        with pytest.raises(OutputError) as told:
            with holding_lock(out, "upgrade"):
                pass
        said = str(told.value)
        assert said.startswith(f"{out}: another packtool upgrade (run ") and \
            said.endswith("then rerun packtool upgrade"), said
        res = invoke(["pack", "-q", *OPTS, "--overwrite", f"s3://{bucket}/in", out])
        assert res.exit_code == 1 and "another packtool upgrade (run " in res.output, res.output
    assert LOCK_NAME not in hash_store_tree(fs, f"{bucket}/out")


@pytest.mark.parametrize("phase, sig", [("write-shard:2", "SIGKILL"), ("write-shard:3", "SIGINT")])
def test_interrupted_s3_pack_resumes_with_the_same_bytes(tmp_path, s3, phase, sig):
    """SIGKILL (no cleanup: the scratch windows stay in the store and are reused) or Ctrl-C
    (cleanup: the scratch keeps only its fingerprint, the finished read part and the finished
    window, the marker lists
    the finished shards, the rerun reuses both) while shards are written straight to S3: no
    manifest; the rerun ends with the local bytes."""
    import signal
    import subprocess
    import sys

    fs, bucket = s3
    out = f"out-{sig}"  # one bucket per test name, which both cases share
    ref = _corpus(fs, bucket, tmp_path)
    node = tmp_path / "node"
    node.mkdir()
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT=phase, TMPDIR=str(node))
    args = ["pack", "-q", *[str(a) for a in OPTS], f"s3://{bucket}/in", f"s3://{bucket}/{out}"]
    proc = subprocess.Popen([sys.executable, "-m", "packtool", *args], stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = proc.stderr.readline()
        assert f"test pause at {phase}" in line, line
        os.kill(proc.pid, getattr(signal, sig))
        proc.wait(timeout=60)
    finally:
        proc.kill()
    remote = hash_store_tree(fs, f"{bucket}/{out}")
    assert MANIFEST_NAME not in remote and IN_PROGRESS_NAME in remote
    # the finished shards wait under names no Parquet reader of the prefix takes as rows
    assert not [k for k in remote if k.endswith(".parquet")], sorted(remote)
    assert [k for k in remote if is_pending_name(k)], sorted(remote)
    scratch = sorted(k for k in remote if k.startswith(TMP_DIR_NAME + "/"))
    if sig == "SIGINT":
        assert proc.returncode == 130
        assert LOCK_NAME not in remote, sorted(remote)
        window = [k for k in scratch if k.startswith(f"{TMP_DIR_NAME}/window-00000/")]
        part = [k for k in scratch if k.startswith(f"{TMP_DIR_NAME}/read-00000/")]
        assert f"{TMP_DIR_NAME}/window-00000/done.json" in window, scratch
        assert f"{TMP_DIR_NAME}/read-00000/done.json" in part, scratch
        assert sorted(set(scratch) - set(window) - set(part)) == [
            f"{TMP_DIR_NAME}/{SCRATCH_FINGERPRINT}"], scratch
        assert not any(node.iterdir())
    else:
        assert f"{TMP_DIR_NAME}/window-00000/done.json" in scratch, scratch
    env.pop("PACKTOOL_TEST_PAUSE_AT")
    res = subprocess.run([sys.executable, "-m", "packtool", *args[:1], "--json", *args[2:]],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    if sig == "SIGINT":
        assert report["shards_reused"] == 3 and report["windows_reused"] == 1, report
        assert report["parts_reused"] == 1, report
    else:
        assert report["windows_reused"] == 1, report
    remote = hash_store_tree(fs, f"{bucket}/{out}")
    assert {k: v for k, v in remote.items() if k != MANIFEST_NAME} == _shards(ref)
    assert [k for k in remote if k.startswith(".")] == [MANIFEST_NAME]


@pytest.mark.parametrize("client", ["boto3", "pyarrow"])
def test_a_store_object_is_moved_by_a_copy_inside_the_store(s3, monkeypatch, client):
    """A store has no rename: the commit gives a shard its final key by a copy inside the store
    (boto3's managed copy, else pyarrow's move), the pending object then deleted."""
    from packtool.location import Location, StoreURI

    fs, bucket = s3
    if client == "pyarrow":
        monkeypatch.setattr(StoreURI, "s3_client", lambda self: None)
    src = Location.parse(f"s3://{bucket}/m/.part-00000.parquet.pending")
    src.publish_bytes(b"PAR1 shard bytes")
    dest = Location.parse(f"s3://{bucket}/m/part-00000.parquet")
    src.move_to(dest)
    assert dest.read_bytes() == b"PAR1 shard bytes" and src.size() is None
    assert sorted(Location.parse(f"s3://{bucket}/m").listdir()) == ["part-00000.parquet"]
    with pytest.raises(OSError):
        src.move_to(dest)  # not there any more


def test_manifest_bytes_equal_the_manifest_file(tmp_path):
    """A store's manifest (one PUT of these bytes) is the file a directory gets."""
    from packtool.formats.manifest import FORMAT_VERSION, ShardEntry

    m = Manifest(format_version=FORMAT_VERSION, packtool_version="0", fingerprint="f", capacity=8,
                 labels=LabelsInfo(False, "unshifted"),
                 shards=(ShardEntry("part-00000.parquet", 2, 10, "0" * 64, "1" * 64, ((2, 1),)),))
    schema = packed_schema(8, "none")
    publish_manifest(tmp_path, m, schema)
    assert manifest_bytes(m, schema) == (tmp_path / MANIFEST_NAME).read_bytes()
    assert read_manifest(tmp_path) == m


@pytest.mark.parametrize("hole", [0, 100, 1 << 20])
def test_read_ranges_gives_the_bytes_of_each_range_in_order(s3, monkeypatch, hole):
    """Unsorted, overlapping, empty and far-apart ranges, coalesced or not: the same bytes as
    slicing the object."""
    import numpy as np

    from packtool.formats import object_store as store

    fs, bucket = s3
    data = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    with fs.open_output_stream(f"{bucket}/blob") as fh:
        fh.write(data)
    monkeypatch.setattr(store, "HOLE_LIMIT", hole)
    monkeypatch.setattr(store, "SPAN_LIMIT", 50_000)
    rng = np.random.default_rng(1)
    offsets = rng.integers(0, 290_000, 200).tolist() + [5, 5, 299_990, 0]
    sizes = rng.integers(0, 10_000, 200).tolist() + [10, 0, 10, 1]
    sizes = [min(n, len(data) - o) for n, o in zip(sizes, offsets)]
    got = store.read_ranges(f"s3://{bucket}/blob", sizes, offsets)
    assert got == b"".join(data[o:o + n] for n, o in zip(sizes, offsets))
    with pytest.raises(OSError, match="short read"):
        store.read_ranges(f"s3://{bucket}/blob", [20], [299_990])


def test_read_session_serves_forward_reads_from_one_open_object(s3, monkeypatch):
    """Inside a read session: the same bytes as without one, each object opened once, one GET
    per READ_AHEAD bytes of forward reads, and no more than the budget held."""
    import numpy as np

    from packtool.formats import object_store as store

    fs, bucket = s3
    data = np.random.default_rng(2).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    for name in ("a", "b"):
        with fs.open_output_stream(f"{bucket}/{name}") as fh:
            fh.write(data)
    monkeypatch.setattr(store, "READ_AHEAD", 50_000)
    opened, gets = [], []

    class Counted:
        def __init__(self, fh):
            self.fh = fh

        def read_at(self, n, off):
            gets.append(off)
            return self.fh.read_at(n, off)

        def size(self):
            return self.fh.size()

        def close(self):
            self.fh.close()

    with store.read_session(budget=120_000) as session:
        first_open = session.file

        def file(uri):
            if uri not in session.files:
                opened.append(uri)
                session.files[uri] = Counted(first_open(uri))
            return session.files[uri]

        session.file = file
        for lo in range(0, 200_000, 10_000):  # forward reads of two objects, interleaved
            for name in ("a", "b"):
                got = store.read_ranges(f"s3://{bucket}/{name}", [3000, 10], [lo, lo + 5000])
                assert got == data[lo:lo + 3000] + data[lo + 5000:lo + 5010]
        assert session.held <= 120_000
    assert sorted(opened) == [f"s3://{bucket}/a", f"s3://{bucket}/b"]
    assert len(gets) == 2 * 4  # 200,000 bytes, 50,000 per GET, for each object
    assert store.read_ranges(f"s3://{bucket}/a", [7], [199_990]) == data[199_990:199_997]


@pytest.mark.parametrize("other_thread", [False, True])
def test_ctrl_c_while_a_small_object_is_written_leaves_it_whole(s3, monkeypatch, other_thread):
    """Ctrl-C arriving between opening a marker/manifest object and writing it: the object is
    put whole, then the KeyboardInterrupt comes (a stream closed by the exception would have
    published an empty object). With another thread alive (a pack has its worker pool) the
    kernel may hand a SIGINT the main thread blocks to that thread, so holding it must not
    depend on the main thread's signal mask."""
    import signal
    import threading
    import time

    from packtool.location import Location, StoreURI

    fs, bucket = s3
    real_filesystem = StoreURI.filesystem

    class Interrupting:
        def __init__(self, fs):
            self.fs = fs

        def open_output_stream(self, path, **kw):
            stream = self.fs.open_output_stream(path, **kw)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C right after the open
            time.sleep(0.2)  # where the interrupt would land if it were not held
            return stream

    def interrupting(self):
        got, path = real_filesystem(self)
        return Interrupting(got), path

    monkeypatch.setattr(StoreURI, "filesystem", interrupting)
    done = threading.Event()
    other = threading.Thread(target=done.wait)
    if other_thread:
        other.start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            Location.parse(f"s3://{bucket}/marker.json").publish_bytes(b'{"whole": true}')
    finally:
        signal.signal(signal.SIGINT, previous)
        done.set()
        if other_thread:
            other.join()
    with fs.open_input_stream(f"{bucket}/marker.json") as fh:
        assert fh.read() == b'{"whole": true}'


def test_compare_reads_an_s3_input_like_a_local_one(tmp_path, s3):
    """``compare INPUT`` takes every INPUT pack takes, a URI included."""
    fs, bucket = s3
    _put(fs, f"{bucket}/corpus/a.parquet", DOCS_A)
    _put(fs, f"{bucket}/corpus/sub/b.parquet", DOCS_B)
    write_docs(tmp_path / "local" / "a.parquet", DOCS_A)
    write_docs(tmp_path / "local" / "sub" / "b.parquet", DOCS_B)
    ref = invoke(["compare", tmp_path / "local", "-c", 8, "--json"])
    assert ref.exit_code == 0, ref.output
    res = invoke(["compare", f"s3://{bucket}/corpus", "-c", 8, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == json.loads(ref.output)
    missing = invoke(["compare", f"s3://{bucket}/nothing", "-c", 8])
    assert missing.exit_code == 1
    assert missing.output.strip().splitlines() == [
        f"Error: s3://{bucket}/nothing: nothing under this prefix of bucket '{bucket}'; check "
        "the INPUT path"]


def test_an_unreachable_store_gets_one_line_naming_the_endpoint_fix(tmp_path, monkeypatch):
    """A store URI whose endpoint has no server: one line naming the URI, saying the store
    cannot be reached and what to check, exit 1 (not pyarrow's curl code alone)."""
    import socket

    from packcheck import invoke

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, nothing listens once closed
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    uri = f"s3://corpus/packed/?endpoint_override=127.0.0.1:{port}&scheme=http"
    res = invoke(["stats", uri])
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the store" in lines[0], lines
    assert f"127.0.0.1:{port}" in lines[0] and "endpoint_override" in lines[0]


def test_a_misspelt_uri_option_is_named_once_with_its_fix(tmp_path):
    """A URI option pyarrow does not know (``endpoint_overide``): stats, pack and the loader
    said the URI and "check the URI and the credentials" twice, in a line wrapped in another;
    now one line each: the URI, pyarrow's words naming the option, and to check the
    options' spelling."""
    from packcheck import invoke

    uri = "s3://corpus/packed/?endpoint_overide=127.0.0.1:9&scheme=http"
    shown = "s3://corpus/packed?endpoint_overide=127.0.0.1:9&scheme=http"
    want = (f"{shown}: cannot open this location (Unexpected query parameter in S3 URI: "
            "'endpoint_overide'); check the spelling of the URI's options (docs/reading.md "
            "lists them)")
    for args in (["stats", uri], ["pack", "-c", 8, uri, tmp_path / "out"]):
        res = invoke(args)
        assert res.exit_code == 1, res.output
        assert res.output.strip().splitlines() == [f"Error: {want}"], res.output
    pytest.importorskip("torch")
    from packtool.errors import InputError
    from packtool.loader import PackedDataset

    with pytest.raises(InputError) as err:
        PackedDataset(uri)
    assert str(err.value) == want


@pytest.fixture(scope="module")
def s3_checking_credentials():
    """A second local S3 server that checks credentials (moto's INITIAL_NO_AUTH_ACTION_COUNT=0):
    the keys of the test are unknown to it, so every request is refused as S3 refuses bad keys.
    Yields the query of a URI that points at it."""
    import sys

    pytest.importorskip("moto.server")
    sys.path.insert(0, str(os.path.join(os.path.dirname(__file__), "..", "..", "scripts")))
    from local_s3 import local_s3

    with local_s3(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as url:
        yield f"?endpoint_override={url.removeprefix('http://')}&scheme=http"


def test_refused_credentials_get_pack_s_one_line_from_every_reader(tmp_path, monkeypatch,
                                                                   s3_checking_credentials):
    """Keys the store refuses: stats, verify, export and the loader say what pack says of the
    same URI (one line naming it, the store's refusal and the credentials to check), and the
    loader raises packtool's error, not a bare OSError."""
    from packtool.errors import InputError
    from packtool.formats.packed import PackedOutput

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unknown")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    uri = f"s3://corpus/packed{s3_checking_credentials}"
    pack = invoke(["pack", "-q", "-c", 8, uri, tmp_path / "out"])
    assert pack.exit_code == 1
    [want] = pack.output.strip().splitlines()
    assert want.startswith(f"Error: {uri}: ") and "refused the credentials" in want, want
    assert "AWS_ACCESS_KEY_ID" in want and "'corpus'" in want
    for args in (["stats", uri], ["verify", uri], ["export", "--to", "nemo", uri,
                                                    tmp_path / "nemo"]):
        res = invoke(args)
        assert res.exit_code == 1, (args, res.output)
        assert res.output.strip().splitlines() == [want], args
    assert not (tmp_path / "nemo").exists()
    with pytest.raises(InputError) as err:
        PackedOutput.open(uri)
    assert f"Error: {err.value}" == want
    write_docs(tmp_path / "in" / "a.parquet", DOCS_A)
    res = invoke(["pack", "-q", "-c", 8, tmp_path / "in",
                  f"s3://corpus/new{s3_checking_credentials}"])
    assert res.exit_code == 1 and "refused the credentials" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_missing_bucket_or_prefix_is_named_by_every_reader(tmp_path, s3):
    """A bucket that does not exist is named as such by pack (INPUT and OUTPUT) and by the
    readers of packed outputs; an empty prefix of a bucket that exists is told apart."""
    _, bucket = s3
    write_docs(tmp_path / "in" / "a.parquet", DOCS_A)
    nob = f"s3://{bucket}-none/packed"
    for args in (["stats", nob], ["verify", nob], ["pack", "-q", "-c", 8, nob, tmp_path / "o"],
                 ["compare", "-c", 8, nob],
                 ["pack", "-q", "-c", 8, tmp_path / "in", nob]):
        res = invoke(args)
        assert res.exit_code == 1, (args, res.output)
        [line] = res.output.strip().splitlines()
        assert line.startswith(f"Error: {nob}: no bucket '{bucket}-none' in this store"), line
        assert line.count("check") == 1, line  # one fix: the bucket name and the endpoint
    res = invoke(["stats", f"s3://{bucket}/nothing"])
    assert res.output.strip().splitlines() == [
        f"Error: s3://{bucket}/nothing: nothing under this prefix of bucket '{bucket}'; pass the "
        "OUTPUT directory of packtool pack"]


def test_a_store_output_with_query_options_stages_under_plain_names(tmp_path, s3, s3_endpoint,
                                                                    monkeypatch):
    """OUTPUT as a URI with store options in its query (``?endpoint_override=...``): each task's
    local staging directory is named after its unit alone (``window-00000``, ``read-00000``,
    the shard), never with the query in it (it was ``packtool-<hex>-window-00000?endpoint_
    override=...``); the output is the local one."""
    from urllib.parse import urlparse

    from packtool.location import StoreURI

    fs, bucket = s3
    _node_temp(tmp_path, monkeypatch)
    ref = _corpus(fs, bucket, tmp_path)
    real, names = StoreURI.stage, []

    def stage(self, name):
        names.append(name)
        return real(self, name)

    monkeypatch.setattr(StoreURI, "stage", stage)
    host = urlparse(s3_endpoint).netloc
    out = f"s3://{bucket}/out?endpoint_override={host}&scheme=http"
    res = invoke(["pack", "-q", *OPTS, f"s3://{bucket}/in", out])
    assert res.exit_code == 0, res.output
    assert {"read-00000", "window-00000", "part-00000.parquet"} <= set(names), names
    assert all("?" not in n and "/" not in n for n in names), names
    remote = hash_store_tree(fs, f"{bucket}/out")
    assert {k: v for k, v in remote.items() if k != MANIFEST_NAME} == _shards(ref)


# -- local staging of a store OUTPUT: never left behind by a killed pack ----------------------------

STAGE_DOCS = [[i * 7 % 97 + 1 for _ in range(1 + i % 9)] for i in range(60)]
STAGE_OPTS = ["-c", 16, "--rows-per-shard", 8, "--workers", 1]


def _stages(node):
    return sorted(p.name for p in node.iterdir() if p.name.startswith("packtool-"))


def _plant(node, name, record=None, age_days=0.0):
    """A staging directory ``node/packtool-<32 hex>-name`` holding one spill file, with the
    holder record ``record`` (None: none, as a packtool before records wrote), ``age_days``
    old."""
    import time
    import uuid

    from packtool.location import STAGE_HOLDER

    work = node / f"packtool-{uuid.uuid4().hex}-{name}"
    work.mkdir()
    (work / "tokens.int32").write_bytes(b"\0" * 64)
    if record is not None:
        (work / STAGE_HOLDER).write_text(json.dumps(record))
    then = time.time() - age_days * 86400
    for p in (*work.iterdir(), work):
        os.utime(p, (then, then))
    return work.name


def test_a_killed_store_packs_local_stages_are_removed_by_the_next_run(tmp_path, s3,
                                                                        monkeypatch):
    """A store pack SIGKILLed leaves its tasks' staging directories (its spills, a shard) in its
    TMPDIR; the next pack on this host removes them, as it does those of a process of this host
    that is gone (its pid free or reused, or this host rebooted since). Stages of a live pack
    (paused, or this very process), of another host (whose processes cannot be asked), stages
    without a holder record touched within the last days, and other files are kept."""
    import socket

    from packcheck import paused_pack
    from packtool.formats.holders import holder

    fs, bucket = s3
    src = write_docs(tmp_path / "in" / "a.parquet", STAGE_DOCS)
    node = _node_temp(tmp_path, monkeypatch)
    monkeypatch.setenv("TMPDIR", str(node))  # the paused packs' too
    me = holder()
    keep = {_plant(node, "read-00001", me),  # this process: live
            _plant(node, "read-00002", {**me, "host": "elsewhere", "pid": 1}),
            _plant(node, "read-00003", None, age_days=1)}  # no record, recent
    gone = {_plant(node, "read-00004", {**me, "started": str(int(me["started"]) + 99)}),
            _plant(node, "read-00005", {**me, "boot_id": "an-earlier-boot"}),
            _plant(node, "read-00006", None, age_days=30)}  # no record, long untouched
    others = {"packtool-notes", "packtool-abc_12xy"}  # not a stage's name: never touched
    for name in others:
        (node / name).mkdir()
    assert socket.gethostname() == me["host"]
    opts = [str(o) for o in STAGE_OPTS]
    with paused_pack(src, f"s3://{bucket}/killed", "write-shard:1", opts):
        live = set(_stages(node)) - keep - gone - others
        assert any(n.endswith("-part-00001.parquet") for n in live), live
        res = invoke(["pack", "-q", *STAGE_OPTS, src, f"s3://{bucket}/beside"])
        assert res.exit_code == 0, res.output
        assert set(_stages(node)) == keep | live | others  # the live pack's stages kept
    assert set(_stages(node)) == keep | live | others  # killed: left in TMPDIR
    res = invoke(["pack", "-q", *STAGE_OPTS, src, f"s3://{bucket}/killed"])
    assert res.exit_code == 0, res.output
    assert set(_stages(node)) == keep | others


def test_a_stopped_store_pack_removes_its_local_stages(tmp_path, s3, monkeypatch):
    """SIGTERM (as Ctrl-C) while a store pack reads (while it writes:
    test_interrupted_s3_pack_resumes_with_the_same_bytes): its tasks' staging directories in
    TMPDIR, a read part's spills among them, are gone when it exits (a store keeps no progress
    on a task's own disk); so after bad input."""
    import signal

    from packcheck import paused_pack

    fs, bucket = s3
    src = write_docs(tmp_path / "in" / "a.parquet", STAGE_DOCS)
    node = _node_temp(tmp_path, monkeypatch)
    monkeypatch.setenv("TMPDIR", str(node))
    opts = [str(o) for o in STAGE_OPTS]
    with paused_pack(src, f"s3://{bucket}/out", "read:0", opts, stop=signal.SIGTERM):
        assert any(n.endswith("-read-00000") for n in _stages(node)), _stages(node)
    assert _stages(node) == []
    bad = write_docs(tmp_path / "bad" / "a.parquet", [*STAGE_DOCS, [1, -5, 2]])
    res = invoke(["pack", "-q", *STAGE_OPTS, bad, f"s3://{bucket}/bad"])
    assert res.exit_code == 1 and "negative" in res.output, res.output
    assert _stages(node) == []


def test_a_task_s_first_stage_sweeps_its_node_and_its_record_is_never_uploaded(tmp_path, s3,
                                                                               monkeypatch):
    """A task on a node where no pack starts (a Ray worker) sweeps that node's TMPDIR at its
    process's first stage, once; the holder record in each stage stays local: the files
    published are the unit's alone."""
    import shutil
    import subprocess
    import sys

    from packtool.formats.holders import holder
    from packtool.location import STAGE_HOLDER, Location

    fs, bucket = s3
    node = _node_temp(tmp_path, monkeypatch)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = {**holder(), "pid": int(ended.stdout)}  # a process of this host that ended
    first = _plant(node, "window-00000", dead)
    out = Location.parse(f"s3://{bucket}/out/.packtool-tmp/window-00001")
    work = out.stage("window-00001")
    assert _stages(node) == [work.name], first  # swept
    assert json.loads((work / STAGE_HOLDER).read_text())["pid"] == os.getpid()
    again = _plant(node, "window-00002", dead)
    (work / "segments.int64").write_bytes(b"\1" * 16)
    (work / "done.json").write_text("{}")
    second = out.parent.stage("part-00000.parquet")
    assert _stages(node) == sorted([work.name, again, second.name])  # once per process
    out.publish_dir(work, "done.json")
    put = fs.get_file_info(pafs.FileSelector(f"{bucket}/out/.packtool-tmp/window-00001"))
    assert sorted(i.base_name for i in put) == ["done.json", "segments.int64"]
    assert not work.exists()
    shutil.rmtree(second)


@pytest.mark.parametrize("text", [DENIED_TEXT, DOWN_TEXT], ids=["denied", "down"])
@pytest.mark.parametrize("fault", ["head", "footer", "body"])
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_store_failing_to_read_an_input_is_named_not_the_file(tmp_path, s3, monkeypatch,
                                                                fault, text, fmt):
    """An object the store lists but will not let be read (HEAD or GET refused: 403), or a
    server gone while pack or compare reads it: the one line every command gives for that
    store fault, naming the object and what to check; never "empty", "damaged" or
    "truncated" (the object is fine), and nothing written."""
    fs, bucket = s3
    bucket = f"{bucket}/{fmt}-{fault}-{'down' if text == DOWN_TEXT else 'denied'}"  # one each
    table = pa.table({"input_ids": pa.array([[i + 1] * (1 + i % 7) for i in range(200)],
                                            pa.list_(pa.int32()))})
    if fmt == "parquet":
        pq.write_table(table, f"{bucket}/corpus/a.parquet", filesystem=fs, row_group_size=50)
    else:
        with fs.open_output_stream(f"{bucket}/corpus/a.arrow") as fh:
            with pa.ipc.new_file(fh, table.schema) as w:
                w.write_table(table)
    if fmt == "arrow" and fault == "body":
        pytest.skip("an Arrow file is read whole with its end: no later read to fail")
    faulty_store(monkeypatch, fault, text)
    uri = f"s3://{bucket}/corpus/a.{fmt}"
    out = tmp_path / "out"
    one_store_line(invoke(["pack", "-c", 16, f"s3://{bucket}/corpus", out]), uri, text)
    assert not out.exists()
    one_store_line(invoke(["compare", "-c", 16, f"s3://{bucket}/corpus"]), uri, text)


@pytest.mark.parametrize("text", [DENIED_TEXT, DOWN_TEXT], ids=["denied", "down"])
@pytest.mark.parametrize("fault", ["head", "footer", "body"])
def test_a_store_failing_to_read_a_packed_shard_is_named_not_the_shard(tmp_path, s3,
                                                                       monkeypatch, fault, text):
    """The shards of a packed output in a store, read by stats and the loader while the store
    refuses them or has gone (the sha256, the footer, a row group): the store's one line
    naming the shard, not a damaged shard to pack again."""
    from packtool.errors import InputError
    from packtool.formats.packed import PackedOutput

    fs, bucket = s3
    bucket = f"{bucket}/{fault}-{'down' if text == DOWN_TEXT else 'denied'}"  # one each
    docs = [[i + 1] * (1 + i % 7) for i in range(200)]
    write_docs(tmp_path / "in" / "a.parquet", docs)
    assert invoke(["pack", "-q", "-c", 16, tmp_path / "in", tmp_path / "out"]).exit_code == 0
    pafs.copy_files(str(tmp_path / "out"), f"{bucket}/packed", destination_filesystem=fs)
    uri = f"s3://{bucket}/packed"
    shard = f"{uri}/{read_manifest(tmp_path / 'out').shards[0].file}"
    faulty_store(monkeypatch, fault, text)
    one_store_line(invoke(["stats", uri]), shard, text)
    with pytest.raises(InputError) as err:
        PackedOutput.open(uri, integrity="footer").decode(0, ["input_ids"])
    one_store_line(type("R", (), {"exit_code": 1, "output": f"Error: {err.value}\n"}), shard,
                   text)


def test_a_store_commit_of_many_shards_prints_no_connection_pool_warning(s3, tmp_path):
    """The commit copies the shards inside the store several at once; more at once than the S3
    client's connection pool holds (10) printed urllib3's "Connection pool is full, discarding
    connection" WARNING lines, even under -q, that look like packtool's own."""
    fs, bucket = s3
    src = write_docs(tmp_path / "in" / "a.parquet", [[i % 97 + 1] * (i % 5 + 1)
                                                     for i in range(400)])
    res = subprocess.run([sys.executable, "-m", "packtool", "pack", "-q", "-c", "8",
                          "--rows-per-shard", "4", src, f"s3://{bucket}/many"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert res.returncode == 0, res.stderr
    assert len(read_manifest(f"s3://{bucket}/many").shards) > 30
    assert "Connection pool is full" not in res.stderr, res.stderr


def test_a_store_uri_with_dot_or_empty_segments_is_refused_before_any_work(tmp_path, s3):
    """``pack IN s3://b/./tr`` beside a finished ``s3://b/tr``, without --overwrite, exited 0:
    pyarrow's S3 client wrote ``tr/...`` (it drops ``./`` and resolves ``../`` in a key) while
    packtool listed ``./tr/`` and found nothing, so the finished output's manifest was replaced
    and no shard promoted (stats: "size ... the manifest says ..."); into a new prefix
    (``./dot2``, ``q/../dd``) a manifest without shards, exit 0. ``s3://b//dbl/`` did all the
    work, then failed at the commit (written as ``dbl/...``, copied as ``/dbl/...``) on every
    rerun. Such a URI is now refused in one line naming its plain spelling, exit 1, before
    anything is read or written, by every command and Python entry point taking a store URI;
    a trailing ``/`` is no segment and stays accepted."""
    import packtool
    from packtool.errors import LocationError
    from packtool.formats.packed import PackedOutput
    from packtool.loader import PackedDataset

    fs, bucket = s3
    _put(fs, f"{bucket}/in/a.parquet", DOCS_A + DOCS_B)
    src, tr = f"s3://{bucket}/in", f"s3://{bucket}/tr"
    assert invoke(["pack", "-q", "-c", 8, src, tr]).exit_code == 0
    before = hash_store_tree(fs, bucket)
    why = ("which pyarrow's store client drops or resolves on some calls and not on others, so "
           "packtool would write and find different objects; write it as ")
    for given, shown, plain, holds in (
            (f"s3://{bucket}/./tr", f"s3://{bucket}/./tr", tr, "'.'"),
            (f"s3://{bucket}/./dot2", f"s3://{bucket}/./dot2", f"s3://{bucket}/dot2", "'.'"),
            (f"s3://{bucket}/q/../dd", f"s3://{bucket}/q/../dd", f"s3://{bucket}/dd", "'..'"),
            (f"s3://{bucket}//dbl/", f"s3://{bucket}//dbl", f"s3://{bucket}/dbl", "'//'"),
            (f"s3://{bucket}/tr/./", f"s3://{bucket}/tr/.", tr, "'.'")):
        want = f"Error: {shown}: the key holds {holds}, {why}{plain}"
        held = f"s3://{bucket}/tr-h"
        for args in (["pack", "-c", 4, src, given], ["pack", "-c", 4, given, tmp_path / "o"],
                     ["pack", "-c", 4, "--holdout", 0.5, "--holdout-output", given, src,
                      f"s3://{bucket}/new"],
                     ["pack", "-c", 4, "--overwrite", "--holdout", 0.5, src, held,
                      "--holdout-output", given],
                     ["tokenize", "--tokenizer", tmp_path / "t.json", src, given],
                     ["tokenize", "--tokenizer", tmp_path / "t.json", given, tmp_path / "o"],
                     ["compare", "-c", 4, given], ["stats", given], ["verify", given],
                     ["export", "--to", "nemo", given, tmp_path / "nemo"], ["upgrade", given],
                     ["stats", tr, "--plot", f"{shown}/s.png"]):
            res = invoke(args)
            line = (f"Error: {shown}/s.png: the key holds {holds}, {why}{plain}/s.png"
                    if "--plot" in args else want)
            assert res.exit_code == 1, (args, res.output)
            assert res.output.strip().splitlines() == [line], (args, res.output)
        for call in (lambda: packtool.pack([src], given, capacity=4),
                     lambda: packtool.pack([given], tmp_path / "o", capacity=4),
                     lambda: PackedDataset(given), lambda: PackedOutput.open(given),
                     lambda: read_manifest(given)):
            with pytest.raises(LocationError) as err:
                call()
            assert f"Error: {err.value}" == want
        assert hash_store_tree(fs, bucket) == before, given
    assert not (tmp_path / "o").exists() and not (tmp_path / "nemo").exists()
    for spelt in (f"{tr}/", f"{tr}///", f"s3:/{bucket}/tr"):  # no segment: read as tr
        res = invoke(["stats", spelt])
        assert res.exit_code == 0, (spelt, res.output)
    again = invoke(["pack", "-c", 8, src, f"{tr}/"])
    assert again.exit_code == 0 and "already holds this pack" in again.output, again.output
    assert hash_store_tree(fs, bucket) == before
