"""A packed output in an object store (S3 on a local server, moto on 127.0.0.1) is read where it
lies: stats, verify and both datasets give what the local copy gives, the training example runs
from the URI, the endpoint may sit in the URI, and the local shard cache is bounded, reused
across restarts and shared by ranks and DataLoader workers without a partial read. Store
housekeeping: no unfinished multipart upload and no zero-byte folder object is left under
OUTPUT, and a lock whose process id was reused does not block a rerun.
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

from packcheck import invoke, read_output, write_docs

ROOT = Path(__file__).resolve().parents[2]
DOCS = [[(11 * i + k) % 251 + 1 for k in range(1 + (i * 7) % 29)] for i in range(120)]
PACK = ["pack", "-q", "-c", 32, "--rows-per-shard", 15, "--row-group-mb", 0.0004]


@pytest.fixture
def both(tmp_path, s3):
    """The same documents packed into a directory and into the store (same bytes)."""
    fs, bucket = s3
    src = write_docs(tmp_path / "in" / "a.parquet", DOCS)
    local = tmp_path / "local"
    assert invoke([*PACK, src, local]).exit_code == 0
    uri = f"s3://{bucket}/packed"
    res = invoke([*PACK, src, uri])
    assert res.exit_code == 0, res.output
    return local, uri, fs, bucket


def _keys(bucket):
    import boto3

    c = boto3.client("s3")
    return {o["Key"]: o["Size"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", [])}


def _items(ds):
    return [(it["index"], it["input_ids"].tolist(), it["labels"].tolist(),
             it["cu_seqlens"].tolist()) for it in ds]


def test_stats_verify_and_the_datasets_read_an_s3_output_like_the_local_copy(both):
    torch = pytest.importorskip("torch")  # noqa: F841
    from packtool.loader import PackedDataset, PackedIterableDataset

    local, uri, _, bucket = both
    for cmd in (["stats", "--json"], ["verify", "--data-only", "--json"]):
        a, b = invoke([*cmd, local]), invoke([*cmd, uri])
        assert a.exit_code == b.exit_code == 0, b.output
        ja, jb = json.loads(a.output), json.loads(b.output)
        ja.pop("path"), jb.pop("path")
        assert ja == jb
    la, lb = PackedDataset(local), PackedDataset(uri)
    assert len(la) == len(lb) > 20
    assert _items(la[i] for i in range(len(la))) == _items(lb[i] for i in range(len(lb)))
    ia = PackedIterableDataset(local, rank=1, world_size=2, seed=3)
    ib = PackedIterableDataset(uri, rank=1, world_size=2, seed=3)
    assert _items(ia) == _items(ib)
    assert not [k for k in _keys(bucket) if k.endswith("/")], "no zero-byte folder object"


def test_the_training_example_runs_from_s3(both):
    pytest.importorskip("transformers")
    _, uri, _, _ = both
    env = {**os.environ, "PACKED": uri}
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py")], env=env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("per target on this rank") == 2
    # the workers are shut down by the loop, not killed at exit ("DataLoader worker ... killed
    # by signal: Terminated" in an atexit callback)
    assert "Exception ignored" not in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_the_endpoint_may_be_given_in_the_uri(tmp_path, s3, s3_endpoint, monkeypatch):
    """With no AWS_ENDPOINT_URL in the environment, INPUT and OUTPUT carry the endpoint in
    their query: discovery, every file read, the shards written, stats and the loader all go
    through it (a file reopened without it would go to the public AWS host)."""
    fs, bucket = s3
    pq.write_table(pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))}),
                   f"{bucket}/corpus/a.parquet", filesystem=fs)
    pq.write_table(pa.table({"input_ids": pa.array(DOCS[:7], pa.list_(pa.int32()))}),
                   f"{bucket}/corpus/sub/b.parquet", filesystem=fs)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    host = s3_endpoint.split("://", 1)[1]
    opts = f"endpoint_override={host}&scheme=http"
    out = f"s3://{bucket}/out?{opts}"
    res = invoke([*PACK, f"s3://{bucket}/corpus/?{opts}", out])
    assert res.exit_code == 0, res.output
    from packtool.formats.manifest import read_manifest
    from packtool.loader import PackedDataset

    m = read_manifest(out)
    assert [i.path for i in m.inputs] == [f"s3://{bucket}/corpus/a.parquet?{opts}",
                                          f"s3://{bucket}/corpus/sub/b.parquet?{opts}"]
    assert m.totals.docs_in == len(DOCS) + 7
    assert invoke(["stats", out]).exit_code == 0
    assert len(PackedDataset(out)) == m.num_rows
    # the same pack with the endpoint in the environment instead: the same inputs, so it is
    # already done (the options in the URIs made another fingerprint: the whole pack again)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    res = invoke([*PACK, "--json", f"s3://{bucket}/corpus/", f"s3://{bucket}/out"])
    assert res.exit_code == 0 and json.loads(res.stdout)["already_complete"], res.output
    assert read_manifest(out).fingerprint == m.fingerprint


def test_secret_uri_options_never_reach_the_manifest(tmp_path, s3, s3_endpoint, monkeypatch):
    fs, bucket = s3
    pq.write_table(pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))}),
                   f"{bucket}/c/a.parquet", filesystem=fs)
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    host = s3_endpoint.split("://", 1)[1]
    uri = f"s3://testing:testing@{bucket}/c?endpoint_override={host}&scheme=http"
    out = tmp_path / "out"
    res = invoke([*PACK, uri, out])
    assert res.exit_code == 0, res.output
    text = (out / ".packtool-manifest.parquet").read_bytes()
    assert b"testing" not in text and b"endpoint_override" in text


def test_credentials_before_the_bucket_read_a_store_input(tmp_path, s3, s3_endpoint,
                                                         monkeypatch):
    """s3://KEY:SECRET@bucket/prefix as INPUT: discovery names each file without the
    credentials, and reading them then went without them (access denied, told as 'is empty (0
    bytes)'); the files are read with the URI's credentials, for pack and compare alike."""
    fs, bucket = s3
    pq.write_table(pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))}),
                   f"{bucket}/c/a.parquet", filesystem=fs)
    local = tmp_path / "in"
    local.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))}),
                   local / "a.parquet")
    assert invoke([*PACK, local, tmp_path / "ref"]).exit_code == 0
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    host = s3_endpoint.split("://", 1)[1]
    uri = f"s3://testing:testing@{bucket}/c?endpoint_override={host}&scheme=http"
    res = invoke([*PACK, uri, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    assert "testing:testing" not in res.output
    ref, got = read_output(tmp_path / "ref")[0], read_output(tmp_path / "out")[0]
    assert got == ref
    res = invoke(["compare", uri, "-c", 32])
    assert res.exit_code == 0 and "testing:testing" not in res.output, res.output


def test_a_file_found_under_a_credentialed_uri_is_reopened_with_its_credentials(s3_endpoint):
    """Discovery names the files it finds without KEY:SECRET@ (messages never print them);
    reopening one by that name used the environment's credentials instead of the URI's (a
    store that requires them refused the read). Same bucket and options: the same client."""
    from packtool.location import Location

    host = s3_endpoint.split("://", 1)[1]
    opts = f"endpoint_override={host}&scheme=http"
    given = Location.parse(f"s3://AKIAX:s3cr3t@credbucket/c?{opts}")
    found = Location.parse(f"s3://credbucket/c/a.parquet?{opts}")
    assert found.display == f"s3://credbucket/c/a.parquet?{opts}"
    fs_given, _ = given.filesystem()
    fs_found, path = found.filesystem()
    assert fs_found is fs_given and path == "credbucket/c/a.parquet"
    other = Location.parse("s3://otherbucket/x?" + opts)  # another bucket: its own client
    assert other.filesystem()[0] is not fs_given
    pytest.importorskip("boto3")  # the S3 API calls (deletes, unfinished uploads) too
    assert found.s3_client() is given.s3_client()
    creds = found.s3_client()._request_signer._credentials
    assert (creds.access_key, creds.secret_key) == ("AKIAX", "s3cr3t")


def test_credentials_before_the_bucket_write_a_store_output_and_are_never_printed(
        tmp_path, s3, s3_endpoint, monkeypatch):
    """s3://KEY:SECRET@bucket/...: the S3 API calls (unfinished uploads, deletes) name the
    bucket without the credentials and use them (packing into the store failed on every run,
    leaving its lock), and no message prints the secret."""
    import boto3

    fs, bucket = s3
    pq.write_table(pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))}),
                   f"{bucket}/c/a.parquet", filesystem=fs)
    keys = boto3.client("s3")
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    host = s3_endpoint.split("://", 1)[1]
    opts = f"endpoint_override={host}&scheme=http"
    out = f"s3://testing:testing@{bucket}/out?{opts}"
    res = invoke([*PACK, f"s3://testing:testing@{bucket}/c?{opts}", out])
    assert res.exit_code == 0, res.output
    listed = {o["Key"] for o in keys.list_objects_v2(Bucket=bucket)["Contents"]}
    assert "out/.packtool-manifest.parquet" in listed
    assert not any(".lock" in k or "tmp" in k for k in listed), listed
    assert invoke(["stats", out]).exit_code == 0
    res = invoke(["stats", f"s3://testing:testing@{bucket}/nothing?{opts}"])
    assert res.exit_code == 1 and f"prefix of bucket '{bucket}'" in res.output
    assert "testing:testing" not in res.output
    # the summary lines (written, already there, held out; JSON too) printed the URI as given
    src = f"s3://testing:testing@{bucket}/c?{opts}"
    for args in ([src, f"s3://testing:testing@{bucket}/o2?{opts}"],
                 [src, f"s3://testing:testing@{bucket}/o2?{opts}"],
                 ["--holdout", "0.3", src, f"s3://testing:testing@{bucket}/o3?{opts}"],
                 ["--json", "--holdout", "0.3", src, f"s3://testing:testing@{bucket}/o4?{opts}"]):
        res = invoke(["pack", "-c", 16, *args])
        assert res.exit_code == 0, res.output
        assert "testing:testing" not in res.output and f"{bucket}/o" in res.output, res.output
    # the pair in the store names each other (no credentials written), and a repack of its
    # OUTPUT without --holdout makes the held-out output stale, said by pack and by stats
    held = f"s3://testing:testing@{bucket}/o3-holdout?{opts}"
    res = invoke(["stats", held])
    assert res.exit_code == 0 and "stale" not in res.output, res.output
    from packtool.formats.manifest import read_manifest

    assert "testing:testing" not in json.dumps(read_manifest(held).holdout_pair.to_dict())
    res = invoke(["pack", "-q", "-c", 16, "--overwrite", src,
                  f"s3://testing:testing@{bucket}/o3?{opts}"])
    assert res.exit_code == 0 and f"{bucket}/o3-holdout?{opts}: stale held-out output" in res.output, \
        res.output
    res = invoke(["stats", held])
    assert res.exit_code == 0 and f"{bucket}/o3-holdout?{opts}: stale held-out output" in res.output, \
        res.output
    assert "testing:testing" not in res.output


# -- the local cache ------------------------------------------------------------------------------

def test_the_cache_is_bounded_by_its_cap_and_reused_after_a_restart(both, tmp_path, monkeypatch):
    from packtool.formats.cache import ShardCache
    from packtool.formats.manifest import read_manifest
    from packtool.loader import PackedDataset

    local, uri, _, _ = both
    shards = read_manifest(uri).shards
    cap = sum(sorted(s.bytes for s in shards)[-2:])  # room for the two largest shards
    downloads = []
    real = ShardCache._download
    monkeypatch.setattr(ShardCache, "_download",
                        lambda self, src, part, sha, size: downloads.append(sha)
                        or real(self, src, part, sha, size))
    cache = tmp_path / "cache"
    ds = PackedDataset(uri, cache_dir=cache, cache_limit=cap, max_open_files=1,
                       cached_row_groups=1)
    ref = PackedDataset(local)
    peak = 0
    for i in range(len(ds)):
        assert ds[i]["input_ids"].tolist() == ref[i]["input_ids"].tolist()
        peak = max(peak, ShardCache(cache, cap).used_bytes())
    assert 0 < peak <= cap
    assert len(downloads) == len(shards)  # each shard once, read in order
    files = sorted(p.name for p in cache.iterdir() if p.suffix == ".parquet")
    assert files and all(n[:-8] in {s.sha256 for s in shards} for n in files)
    # a restart with the same cache: the cached shards are not downloaded again
    kept = set(n[:-8] for n in files)
    downloads.clear()
    again = PackedDataset(uri, cache_dir=cache, cache_limit=cap)
    for i in range(len(again) - 1, -1, -1):
        again[i]
    assert not kept & set(downloads)
    assert ShardCache(cache, cap).used_bytes() <= cap


def test_a_cached_copy_that_differs_from_the_manifest_is_refused(both, tmp_path):
    """A shard changed in the store after packing is refused on download (sha256), never
    cached or served."""
    from packtool.errors import ManifestError
    from packtool.loader import PackedDataset

    _, uri, fs, bucket = both
    key = f"{bucket}/packed/part-00001.parquet"
    with fs.open_input_stream(key) as f:
        data = bytearray(f.read())
    data[len(data) // 3] ^= 0xFF
    with fs.open_output_stream(key) as f:
        f.write(bytes(data))
    from packtool.formats.manifest import read_manifest

    bad = read_manifest(uri).shards[1].sha256
    cache = tmp_path / "cache"
    ds = PackedDataset(uri, cache_dir=cache, cache_limit="1G")
    with pytest.raises(ManifestError, match="part-00001.parquet: sha256 differs"):
        for i in range(len(ds)):
            ds[i]
    names = [p.name for p in cache.iterdir()]
    assert f"{bad}.parquet" not in names and not [n for n in names if n.endswith(".part")]


def test_a_cached_copy_damaged_on_the_local_disk_is_fetched_again(both, tmp_path):
    """Bit rot in a cached shard (same size, one byte of a data page flipped): a restart
    reading through the cache gets the rows of the local copy (the copy is fetched again from
    the store when its page checksum fails), not an error blaming the store's good shard."""
    import hashlib

    from packtool.formats.manifest import read_manifest
    from packtool.loader import PackedDataset

    local, uri, _, _ = both
    cache = tmp_path / "cache"
    ds = PackedDataset(uri, cache_dir=cache, cache_limit="1G")
    want = [ds[i]["input_ids"].tolist() for i in range(len(ds))]
    assert want == [PackedDataset(local)[i]["input_ids"].tolist() for i in range(len(ds))]
    entry = read_manifest(uri).shards[1]
    copy = cache / f"{entry.sha256}.parquet"
    data = bytearray(copy.read_bytes())
    data[100] ^= 0xFF  # inside the first column chunk's data page
    copy.write_bytes(bytes(data))
    footer_entry = read_manifest(uri).shards[2]
    other = cache / f"{footer_entry.sha256}.parquet"
    data = bytearray(other.read_bytes())
    data[-20] ^= 0xFF  # inside its footer: the footer's sha256 no longer matches
    other.write_bytes(bytes(data))
    again = PackedDataset(uri, cache_dir=cache, cache_limit="1G")
    assert [again[i]["input_ids"].tolist() for i in range(len(again))] == want
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == entry.sha256
    assert hashlib.sha256(other.read_bytes()).hexdigest() == footer_entry.sha256


def test_a_cached_copy_evicted_by_another_process_before_it_is_opened_is_no_missing_shard(
        both, tmp_path, monkeypatch):
    """Another process sharing the cache evicts a copy between the fetch that found it and its
    open: the reader fetches it again (or, evicted every time, reads the store), and never
    names the store's intact shard missing."""
    from packtool.errors import ManifestError
    from packtool.formats.cache import ShardCache
    from packtool.loader import PackedDataset

    local, uri, fs, bucket = both
    cache = tmp_path / "cache"
    want = PackedDataset(local)[0]["input_ids"].tolist()
    assert PackedDataset(uri, cache_dir=cache, cache_limit="1M")[0]["input_ids"].tolist() == want
    real, evicted = ShardCache.fetch, []

    def fetch(self, *args):
        path = real(self, *args)
        if path is not None and len(evicted) < limit:
            evicted.append(path)
            os.unlink(path)  # another process's eviction, after fetch found the copy
        return path

    monkeypatch.setattr(ShardCache, "fetch", fetch)
    for limit in (1, 10 ** 6):  # once (fetched again), every time (read from the store)
        evicted.clear()
        again = PackedDataset(uri, cache_dir=cache, cache_limit="1M")
        assert again[0]["input_ids"].tolist() == want
        assert len(evicted) == 1 if limit == 1 else len(evicted) > 1
        assert evicted[0].exists() == (limit == 1)  # the first case's copy is downloaded again
    # a shard gone from the store itself (after the open) is still named missing
    monkeypatch.setattr(ShardCache, "fetch", real)
    ds = PackedDataset(uri, cache_dir=cache, cache_limit="1M")
    fs.delete_file(f"{bucket}/packed/part-00000.parquet")
    with pytest.raises(ManifestError, match="part-00000.parquet: missing"):
        ds[0]


RANK_SCRIPT = """
import json, sys
from torch.utils.data import DataLoader
from packtool.loader import PackedIterableDataset
uri, cache, rank, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ds = PackedIterableDataset(uri, rank=rank, world_size=2, seed=1, cache_dir=cache,
                           cache_limit=cap)
rows = []
for b in DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"):
    rows.append([b["index"], b["input_ids"].tolist()])
print(json.dumps(rows))
"""


def test_two_ranks_with_two_workers_share_one_cache(both, tmp_path):
    """2 ranks x 2 DataLoader workers, started at once on one cache directory: every process
    gets exactly the rows the local copy gives it, and the cache holds whole files only."""
    pytest.importorskip("torch")
    from packtool.formats.cache import ShardCache
    from packtool.formats.manifest import read_manifest
    from packtool.loader import PackedIterableDataset

    local, uri, _, _ = both
    shards = read_manifest(uri).shards
    cap = sum(s.bytes for s in shards)
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, uri, str(cache), str(r),
                               str(cap)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se[-2000:]
    seen = []
    for r, (so, _) in enumerate(outs):
        got = sorted(json.loads(so.strip().splitlines()[-1]))
        want = sorted([it["index"], it["input_ids"].tolist()] for it in
                      PackedIterableDataset(local, rank=r, world_size=2, seed=1))
        assert got == want
        seen += [i for i, _ in got]
    assert sorted(set(seen)) == list(range(read_manifest(local).num_rows))
    names = {p.name for p in cache.iterdir()}
    assert not [n for n in names if n.endswith(".part")]
    cached = ShardCache(cache, cap)
    assert {f"{s.sha256}.parquet" for s in shards} <= names and cached.used_bytes() <= cap
    import hashlib

    for s in shards:
        assert hashlib.sha256(cached.path_for(s.sha256).read_bytes()).hexdigest() == s.sha256


# -- store housekeeping ------------------------------------------------------------------------------

def test_a_rerun_aborts_the_uploads_a_killed_writer_left(tmp_path, s3):
    """A process killed while it uploads leaves an unfinished multipart upload (not listed,
    still stored and billed); the next run into that OUTPUT aborts it."""
    import boto3

    fs, bucket = s3
    c = boto3.client("s3")
    up = c.create_multipart_upload(Bucket=bucket, Key="out/part-00000.parquet")
    c.upload_part(Bucket=bucket, Key="out/part-00000.parquet", UploadId=up["UploadId"],
                  PartNumber=1, Body=b"x" * (5 << 20))
    elsewhere = c.create_multipart_upload(Bucket=bucket, Key="other/file")
    assert len(c.list_multipart_uploads(Bucket=bucket).get("Uploads", [])) == 2
    src = write_docs(tmp_path / "in" / "a.parquet", DOCS)
    res = invoke([*PACK, src, f"s3://{bucket}/out"])
    assert res.exit_code == 0, res.output
    left = c.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["UploadId"] for u in left] == [elsewhere["UploadId"]]  # only OUTPUT's


def test_a_lock_whose_pid_now_belongs_to_another_process_does_not_block(tmp_path, s3):
    """The lock object names a process on this host by pid and start time: a pid reused by
    another live process (here this test's own) is not the holder, so the rerun proceeds; a
    lock whose holder is still running still refuses."""
    import socket

    from packtool.formats import object_store as store

    fs, bucket = s3
    src = write_docs(tmp_path / "in" / "a.parquet", DOCS)
    me = store.holder()
    stale = {**me, "run": "killed-run", "started": str(int(me["started"] or 0) + 12345)}
    with fs.open_output_stream(f"{bucket}/out/.packtool.lock") as f:
        f.write(json.dumps(stale).encode())
    res = invoke([*PACK, src, f"s3://{bucket}/out"])
    assert res.exit_code == 0, res.output
    live = {**me, "run": "live-run"}
    assert not store.holder_is_gone(live) and store.holder_is_gone(stale)
    assert socket.gethostname() == me["host"]
    with fs.open_output_stream(f"{bucket}/out2/.packtool.lock") as f:
        f.write(json.dumps(live).encode())
    res = invoke([*PACK, src, f"s3://{bucket}/out2"])
    assert res.exit_code == 1 and "live-run" in res.output


def test_a_store_prefix_that_is_not_a_packed_output_is_named_as_a_local_one_is(both, tmp_path):
    """stats and verify on a prefix without a manifest say what it holds, as for a local
    directory: tokenized input (with the command for it), packed shards whose manifest is gone,
    an interrupted pack."""
    local, uri, fs, bucket = both
    src = tmp_path / "in" / "a.parquet"
    fs.create_dir(f"{bucket}/raw")
    with fs.open_output_stream(f"{bucket}/raw/a.parquet") as f:
        f.write(src.read_bytes())
    raw = f"s3://{bucket}/raw"
    for cmd, hint in (("stats", f"packtool compare {raw} --capacity C"),
                      ("verify", f"packtool pack --capacity C {raw} OUTPUT")):
        res = invoke([cmd, raw])
        assert res.exit_code == 1
        assert f"{raw}: holds tokenized input (a.parquet), not a packed output" in res.output
        assert hint in res.output
    fs.delete_file(f"{bucket}/packed/.packtool-manifest.parquet")
    res = invoke(["stats", uri])
    assert res.exit_code == 1 and "holds packed shards (part-00000.parquet) but no" in res.output
    with fs.open_output_stream(f"{bucket}/packed/.packtool-in-progress.json") as f:
        f.write(b"{}")
    res = invoke(["verify", uri])
    assert res.exit_code == 1 and f"{uri}: an interrupted pack" in res.output


def _refusals(uri, tmp_path) -> dict:
    """What every reader of a packed output says of ``uri``: stats, verify, export, the
    manifest reader, PackedOutput.open and (with torch) both datasets; one line each."""
    from packtool.errors import ManifestError
    from packtool.formats.manifest import read_manifest
    from packtool.formats.packed import PackedOutput

    said = {}
    for cmd in (["stats"], ["verify", "--data-only"],
                ["export", "--to", "nemo", uri, tmp_path / "exported"]):
        res = invoke([*cmd, uri] if len(cmd) < 3 else cmd)
        assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
        said[cmd[0]] = res.output
    readers = {"read_manifest": read_manifest, "PackedOutput.open": PackedOutput.open}
    try:
        import torch  # noqa: F401
        from packtool.loader import PackedDataset, PackedIterableDataset

        readers.update(PackedDataset=PackedDataset, PackedIterableDataset=PackedIterableDataset)
    except ImportError:
        pass
    for name, read in readers.items():
        with pytest.raises(ManifestError) as err:
            read(uri)
        said[name] = str(err.value)
    return said


def test_a_store_output_a_pack_is_writing_is_never_called_interrupted(tmp_path, s3):
    """A pack writing a store prefix (held at each phase) is named as one by every reader
    (its lock object names a live process of this host), never as an interrupted pack to
    rerun; killed, it is an interrupted pack; a lock object of another host, which cannot be
    asked, is a pack writing it now or interrupted: wait, or rerun it to finish it."""
    from packcheck import paused_pack

    fs, bucket = s3
    src = write_docs(tmp_path / "in" / "a.parquet", DOCS)
    for phase in ("read:0", "write-shard:1", "manifest"):
        uri = f"s3://{bucket}/live-{phase.replace(':', '-')}"
        with paused_pack(src, uri, phase, PACK[2:]):
            for reader, line in _refusals(uri, tmp_path).items():
                assert f"{uri}: a packtool pack is writing it now (its lock object " \
                       ".packtool.lock names run" in line, (phase, reader, line)
                assert "of this host, which is running" in line, (phase, reader, line)
                assert "interrupted" not in line, (phase, reader, line)
        if phase == "read:0":
            continue  # killed before its marker: no pack output is there yet
        for reader, line in _refusals(uri, tmp_path).items():  # killed: its lock left behind
            assert f"{uri}: " in line and "interrupted pack" in line, (reader, line)
            assert "is writing it now" not in line, (reader, line)
    fs.delete_file(f"{bucket}/live-manifest/.packtool.lock")
    with fs.open_output_stream(f"{bucket}/live-manifest/.packtool.lock") as f:
        f.write(json.dumps({"run": "r7", "host": "elsewhere", "pid": 7,
                            "kind": "packed"}).encode())
    uri = f"s3://{bucket}/live-manifest"
    for reader, line in _refusals(uri, tmp_path).items():
        assert f"{uri}: a packtool pack is writing it now or was interrupted (its lock object " \
               ".packtool.lock names run r7 on host elsewhere (pid 7), which cannot be asked " \
               "from here), so it has no complete .packtool-manifest.parquet yet; wait for " \
               "that pack to end, or, if it was stopped, rerun the same packtool pack to " \
               "finish it; then " in line, (reader, line)


def test_a_store_output_open_while_pack_overwrite_rewrites_it_says_so(both, tmp_path):
    """A reader opened on a store output that ``pack --overwrite`` of other options then
    rewrites: until that pack commits the old output is whole and read as before; once the
    commit removed it (done here by hand, the pack held), a shard gone while that pack writes
    is a pack writing it now (open it again once it ends), as for a local directory; a hash
    check likewise; once the pack is killed, a pack that was interrupted there."""
    from packcheck import paused_pack

    from packtool.errors import ManifestError
    from packtool.formats.manifest import check_shards, read_manifest
    from packtool.formats.packed import PackedOutput

    _, uri, _, _ = both
    src = tmp_path / "in" / "a.parquet"
    reader, opened = PackedOutput.open(uri), read_manifest(uri)
    from packtool.formats.manifest import MANIFEST_NAME
    from packtool.location import Location

    with paused_pack(src, uri, "manifest", [*PACK[2:], "--overwrite", "--seed", "5"]):
        reader.decode(reader.num_row_groups - 1, ["input_ids"])
        check_shards(uri, opened, hashes=True)
        assert read_manifest(uri) == opened
        Location.parse(uri).join(MANIFEST_NAME).delete()  # as the commit does, then shards
        Location.parse(uri).join(opened.shards[-1].file).delete()
        for group in (reader.num_row_groups - 1,):  # the last shard gone
            with pytest.raises(ManifestError, match="a packtool pack is writing it now .*of "
                                                    "this host, which is running.*open it "
                                                    r"again \(a new dataset"):
                reader.decode(group, ["input_ids"])
        with pytest.raises(ManifestError, match="is writing it now"):
            check_shards(uri, opened, hashes=True)
    with pytest.raises(ManifestError, match="packed again since it was opened, by a packtool "
                                            "pack that was interrupted .*rerun that pack"):
        reader.decode(reader.num_row_groups - 1, ["input_ids"])


def test_a_store_shard_rewritten_under_an_open_reader_is_no_damaged_shard(both, tmp_path):
    """A reader that already read a row group of a store shard, then ``pack --overwrite`` of
    other options rewrote the output to its end: the next row group of that shard is read by
    ranges of the new object (its footer was the old one's), so pyarrow fails to decode it.
    That is the output packed again (open it again), as when a shard's size or footer
    changed, never "the shard is damaged; rerun the same packtool pack"."""
    from packtool.errors import ManifestError
    from packtool.formats.packed import PackedOutput

    _, uri, _, _ = both
    src = tmp_path / "in" / "a.parquet"
    reader = PackedOutput.open(uri)
    groups = [g for g in range(reader.num_row_groups) if reader.rg_shard[g] == 0]
    assert len(groups) > 1
    reader.decode(groups[0], ["input_ids"])  # shard 0 open, its footer read
    res = invoke([*PACK, "--overwrite", "--seed", "9", src, uri])
    assert res.exit_code == 0, res.output
    with pytest.raises(ManifestError) as err:
        for g in groups[1:]:
            reader.decode(g, ["input_ids", "labels", "cu_seqlens"])
    line = str(err.value)
    assert "packed again since it was opened" in line and "open it again" in line, line
    assert "damaged" not in line, line


def test_a_store_object_given_as_output_says_it_is_one(both, tmp_path, s3_endpoint,
                                                       monkeypatch):
    """A shard, the manifest or a tokenized file named by its object URI where the output's
    prefix is wanted: the commands say what it is and give the prefix (as for a local file),
    the readers that it is an object, not a prefix, naming the prefix holding its manifest;
    never an interrupted pack. The endpoint given in the URI is kept in the prefix named."""
    from packtool.errors import ManifestError
    from packtool.formats.manifest import read_manifest

    local, _, fs, bucket = both
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    opts = f"endpoint_override={s3_endpoint.split('://', 1)[1]}&scheme=http"
    prefix = f"s3://{bucket}/packed?{opts}"
    for name, what in (("part-00000.parquet", "one shard"),
                       (".packtool-manifest.parquet", "the manifest")):
        uri = f"s3://{bucket}/packed/{name}?{opts}"
        said = _refusals(uri, tmp_path)
        for cmd, line in (("stats", f"stats '{prefix}'"), ("verify", f"verify '{prefix}'"),
                          ("export", f"export --to nemo '{prefix}' DEST")):
            assert f"{uri}: is {what} of a packed output; give its prefix: packtool " \
                   f"{line}" in said[cmd], said[cmd]
        for reader in set(said) - {"stats", "verify", "export"}:
            assert said[reader] == f"{uri}: is an object (a file), not a prefix; pass the " \
                f"OUTPUT prefix of packtool pack: {prefix}, which holds it and its " \
                ".packtool-manifest.parquet", (reader, said[reader])
    with fs.open_output_stream(f"{bucket}/raw/a.parquet") as f:
        f.write((tmp_path / "in" / "a.parquet").read_bytes())
    uri = f"s3://{bucket}/raw/a.parquet?{opts}"
    said = _refusals(uri, tmp_path)
    assert f"{uri}: is tokenized input, not a packed output; for it run: packtool pack " \
           "--capacity C" in said["verify"], said["verify"]
    assert said["read_manifest"] == f"{uri}: is an object (a file), not a prefix; pass the " \
        "OUTPUT prefix of packtool pack", said["read_manifest"]
    # a local file likewise names the directory holding its manifest
    shard = local / "part-00000.parquet"
    with pytest.raises(ManifestError) as err:
        read_manifest(shard)
    assert str(err.value) == f"{shard}: is a file, not a directory; pass the OUTPUT " \
        f"directory of packtool pack: {local}, which holds it and its .packtool-manifest.parquet"


def test_a_store_that_stops_answering_mid_read_is_no_damaged_shard(tmp_path, monkeypatch):
    """The store goes away after the output was opened: reading a row group of a shard already
    open, or opening another shard, is the one "cannot reach the store" line as an InputError
    (it was a ManifestError calling the shard damaged, or advice to raise ``ulimit -n``)."""
    pytest.importorskip("moto.server")
    sys.path.insert(0, str(ROOT / "scripts"))
    from local_s3 import local_s3

    from packtool.errors import InputError
    from packtool.formats.packed import PackedOutput

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    src = write_docs(tmp_path / "in" / "a.parquet", DOCS)
    with local_s3() as url:
        import boto3

        boto3.client("s3", endpoint_url=url).create_bucket(Bucket="gone")
        uri = f"s3://gone/out?endpoint_override={url.split('://', 1)[1]}&scheme=http"
        assert invoke([*PACK, src, uri]).exit_code == 0
        out = PackedOutput.open(uri)
        assert out.num_row_groups > 3 and len(out.shards) > 1
        out.decode(0, ["input_ids"])  # shard 0 open, its footer read
    for group in (1, -1):  # shard 0 again; the last shard, not yet opened
        with pytest.raises(InputError, match=r"s3://gone/out/part-0000\d\.parquet.*cannot "
                                             r"reach the store.*check the endpoint"):
            out.decode(group, ["input_ids"])


@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_repack_under_a_warm_cache(both, tmp_path, kind):
    """A reader of a warm cache (every shard's copy on the local disk) of an output that
    ``pack --overwrite`` of other content then replaces: the next shard it opens is refused
    (packed again, open it again), as without a cache, never served from the old copies."""
    torch = pytest.importorskip("torch")  # noqa: F841
    from packtool.errors import ManifestError
    from packtool.loader import PackedDataset, PackedIterableDataset

    _, uri, _, _ = both
    src = tmp_path / "in" / "a.parquet"
    cache = tmp_path / "cache"
    kw = dict(cache_dir=cache, cache_limit="20M", max_open_files=1)
    if kind == "iterable":
        make = lambda: PackedIterableDataset(uri, seed=0, **kw)  # noqa: E731
        rows = lambda ds: (it["input_ids"].tolist() for it in ds)  # noqa: E731
    else:
        make = lambda: PackedDataset(uri, cached_row_groups=1, **kw)  # noqa: E731
        rows = lambda ds: (ds[i]["input_ids"].tolist() for i in range(len(ds)))  # noqa: E731
    old = list(rows(make()))  # the cache is warm from here on
    reader = rows(make())
    head = [next(reader) for _ in range(10)]
    assert head == old[:10]
    res = invoke([*PACK, "--overwrite", "--seed", "9", src, uri])
    assert res.exit_code == 0, res.output
    with pytest.raises(ManifestError, match=r"packed again since it was opened .*open it again"):
        for _ in reader:
            pass
    new = list(rows(make()))  # a new dataset reads the new pack
    assert sorted(map(tuple, new)) != sorted(map(tuple, old)) or new != old


READ_ONE = """
import sys
from packtool.errors import ConfigError
from packtool.loader import PackedDataset, PackedIterableDataset
uri, cache, kind = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    if kind == "map":
        ds = PackedDataset(uri, cache_dir=cache, cache_limit="20M")
        ds[0]
    else:
        ds = PackedIterableDataset(uri, seed=0, cache_dir=cache, cache_limit="20M")
        next(iter(ds))
except ConfigError as exc:
    print("ConfigError:", exc)
"""


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_unwritable_cache_dir_is_one_line(both, tmp_path, kind):
    """An existing ``cache_dir`` its user may not write (a read-only mount alike): one line
    naming the directory and the fix when the dataset is built, as for one that cannot be
    created (it was filelock's bare ``OSError`` on the first item)."""
    from packcheck import run_without_root_powers

    _, uri, _, _ = both
    cache = tmp_path / "ro-cache"
    cache.mkdir()
    cache.chmod(0o555)
    try:
        proc = run_without_root_powers([sys.executable, "-c", READ_ONE, uri, cache, kind],
                                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        cache.chmod(0o755)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert proc.stdout.strip() == (f"ConfigError: cache directory {cache}: cannot be written "
                                   "(Permission denied); choose a writable directory"), proc.stdout
    assert not list(cache.iterdir())


def _in_the_way(tmp_path, case):
    """(cache_dir, what the message says of it) for a cache_dir that cannot be a directory."""
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    if case == "file":
        return f, f"cache directory {f}: is a file, not a directory; move the file away or " \
                  "give cache_dir another path"
    if case == "under a file":
        return f / "cache", f"cache directory {f / 'cache'}: {f} is a file, not a directory; " \
                            "move the file away or give cache_dir another path"
    link = tmp_path / "cache-link"
    if case == "link to a file":
        link.symlink_to(f)
        return link, f"cache directory {link}: is a link to the file {f}, not a directory; " \
                     "remove the link or give cache_dir another path"
    link.symlink_to(tmp_path / "gone")
    return link, f"cache directory {link}: is a link to {tmp_path / 'gone'}, which does not " \
                 "exist; create that directory or give cache_dir another path"


@pytest.mark.parametrize("case", ["file", "under a file", "link to a file", "dangling link"])
def test_a_cache_dir_that_is_a_file_says_so(tmp_path, case):
    """A cache_dir that is an existing file (or lies under one, or links to a file or to
    nothing) said only "cannot be created (File exists)" ("(Not a directory)" under a file),
    naming neither the file nor the fix; it names the file and the fix now, and leaves it."""
    from packtool.errors import ConfigError
    from packtool.formats.cache import ShardCache
    from packtool.loader import PackedDataset

    cache, says = _in_the_way(tmp_path, case)
    with pytest.raises(ConfigError) as err:
        ShardCache(cache, "1G")
    assert str(err.value) == says
    src = write_docs(tmp_path / "in" / "a.parquet", DOCS[:20])
    out = tmp_path / "packed"
    assert invoke([*PACK, src, out]).exit_code == 0
    with pytest.raises(ConfigError) as err:
        PackedDataset(out, cache_dir=cache, cache_limit="1G")
    assert str(err.value) == says
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "gone").exists()


def test_repack_of_one_source_under_cached_workers(both, tmp_path):
    """A mixture of two store outputs read through one warm cache by two DataLoader workers
    (each holds its own copy of the opened outputs): ``pack --overwrite`` of one of them with
    other content is refused in the worker that next opens one of its shards, as without a
    cache."""
    torch = pytest.importorskip("torch")
    from packtool.loader import PackedIterableDataset

    _, uri, _, bucket = both
    src = tmp_path / "in" / "a.parquet"
    other = f"s3://{bucket}/other"
    assert invoke([*PACK, "--seed", "3", src, other]).exit_code == 0
    kw = dict(seed=0, cache_dir=tmp_path / "cache", cache_limit="20M", max_open_files=1)
    sources = {"a": uri, "b": other}
    assert len(list(PackedIterableDataset(sources, **kw))) > 20  # the cache is warm
    loader = torch.utils.data.DataLoader(PackedIterableDataset(sources, **kw), batch_size=None,
                                         num_workers=2, prefetch_factor=1)
    it = iter(loader)
    for _ in range(4):
        next(it)
    assert invoke([*PACK, "--overwrite", "--seed", "9", src, other]).exit_code == 0
    with pytest.raises(Exception, match=r"packed again since it was opened .*open it again"):
        for _ in it:
            pass
