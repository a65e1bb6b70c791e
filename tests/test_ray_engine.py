"""``--engine ray``: the same bytes as the local windowed engine, on a 2-CPU local Ray."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from conftest import read_rows, write_docs  # noqa: E402
from packtool.formats.manifest import read_manifest
from packtool.config import PackConfig  # noqa: E402
from packtool.errors import PackingError  # noqa: E402
from packtool.pipeline import run_pack  # noqa: E402

C = 64


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance with 2 CPUs for the whole module (startup costs seconds)."""
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Five files, one with several row groups; returns (input dir, docs in global order)."""
    root = tmp_path_factory.mktemp("ray") / "in"
    rng = np.random.default_rng(1)
    docs = []
    for i, n in enumerate((60, 15, 120, 33, 8)):
        lengths = np.minimum(rng.lognormal(3.0, 1.1, n).astype(int), 250)
        fdocs = [rng.integers(0, 150_000, k).tolist() for k in lengths]
        write_docs(root / f"s{i}.parquet", fdocs, row_group_size=20)
        docs.extend(fdocs)
    return root, docs


def _cfg(inp, out, **kw):
    return PackConfig(inputs=(str(inp),), output=str(out), capacity=C, rows_per_shard=9,
                      window_docs=40, **kw)


def test_ray_output_is_byte_identical_to_local_engine(ray_local, corpus, tmp_path):
    """Same shards, same names, same manifest as --engine local with the same window."""
    inp, _ = corpus
    local = run_pack(_cfg(inp, tmp_path / "local", workers=1), progress=False)
    dist = run_pack(_cfg(inp, tmp_path / "ray", engine="ray"), progress=False)
    assert len(dist.manifest.windows) >= 5
    assert dist.manifest == local.manifest
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ray").iterdir())
    for n in names:
        assert (tmp_path / "local" / n).read_bytes() == (tmp_path / "ray" / n).read_bytes(), n


def test_ray_manifest_totals_match_windows_and_shards(ray_local, corpus, tmp_path):
    """Totals are the sum of the windows; rows and documents agree with the shards."""
    inp, docs = corpus
    res = run_pack(_cfg(inp, tmp_path / "out", engine="ray"), progress=False)
    m = read_manifest(tmp_path / "out")
    t = m.totals.to_dict()
    assert t == res.stats.to_dict()
    assert t["docs_in"] == len(docs) == sum(w.docs for w in m.windows)
    assert t["tokens_in"] == sum(map(len, docs))
    assert t["rows"] == sum(w.rows for w in m.windows) == len(read_rows(tmp_path / "out"))
    assert t["extra_rows"] >= sum(w.extra_rows for w in m.windows) >= 0


def test_ray_conserves_every_token(ray_local, corpus, tmp_path):
    """Every token lands once, at its global doc id and offset."""
    inp, docs = corpus
    run_pack(_cfg(inp, tmp_path / "out", engine="ray"), progress=False)
    rebuilt = [[] for _ in docs]
    pieces = []
    for row in read_rows(tmp_path / "out"):
        ids, seg = np.array(row["input_ids"]), np.array(row["segment_ids"])
        for k, (d, off) in enumerate(zip(row["doc_ids"], row["doc_offsets"])):
            pieces.append((d, off, ids[seg == k + 1].tolist()))
    for d, off, toks in sorted(pieces):
        assert off == len(rebuilt[d])
        rebuilt[d].extend(toks)
    assert rebuilt == docs


def test_ray_task_error_reaches_the_user_as_packtool_error(ray_local, tmp_path):
    """A bad document found inside a task is the same one-line error as locally."""
    write_docs(tmp_path / "in" / "a.parquet", [[1] * 5] * 50 + [[2] * (C + 3)],
               row_group_size=10)
    with pytest.raises(PackingError,
                       match=r"a\.parquet: row 50 \(0-based\): document 50 has 67 tokens"):
        run_pack(_cfg(tmp_path / "in", tmp_path / "out", engine="ray", overflow="error"),
                 progress=False)


def test_ray_tasks_open_files_found_under_a_credentialed_uri_with_its_credentials(ray_local):
    """Discovery names the files under ``s3://KEY:SECRET@bucket/...`` without the credentials;
    a task runs in another process, which must open them with the URI's credentials too, not
    the environment's (it used to: only the driver knew them)."""
    from packtool.engines.ray_engine import RayEngine
    from packtool.location import StoreURI

    query = "endpoint_override=127.0.0.1:9&scheme=http"
    StoreURI("s3", "AKID:S%2FCRET@creds-bkt/in", query)._credentialed_root()  # given by the user
    found = StoreURI("s3", "creds-bkt/in/a.parquet", query)  # as discovery names a file
    with RayEngine(workers=2) as engine:
        got = list(engine.map(found._credentialed_root, [()]))
        other = list(engine.map(StoreURI("s3", "other-bkt/a.parquet", query)._credentialed_root,
                                [()]))
    assert got == ["AKID:S%2FCRET@creds-bkt"]
    assert other == ["other-bkt"]


def test_ray_missing_gives_the_extra_to_install(monkeypatch):
    """Without Ray the error names the requirement of the ray extra (packtool itself is not on
    a package index, so not pip install 'packtool[ray]')."""
    import builtins

    from packtool.engines import ray_engine
    from packtool.errors import MissingDependencyError

    real = builtins.__import__

    def no_ray(name, *a, **kw):
        if name == "ray":
            raise ImportError("no ray")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(MissingDependencyError, match=r"pip install 'ray>=[\d.]+'"):
        ray_engine.import_ray()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the Linux sigaction")
def test_packtools_sigterm_handler_is_in_force_again_after_ray_shuts_down():
    """ray.shutdown() put the OS's default SIGTERM action back while Python still reported
    packtool's handler: a SIGTERM after the last shard killed the driver (status -15, OUTPUT
    locked, no message). The handler is installed again after the shutdown."""
    import subprocess

    code = textwrap.dedent("""
        import ctypes, signal
        from packtool.engines.ray_engine import RayEngine
        signal.signal(signal.SIGTERM, lambda *a: None)
        with RayEngine(workers=1):
            pass
        class Act(ctypes.Structure):
            _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                        ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]
        act = Act()
        ctypes.CDLL(None).sigaction(signal.SIGTERM, None, ctypes.byref(act))
        print("handler", act.handler not in (None, 0))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "handler True", p.stdout


_SIGTERM_IN_SHUTDOWN = """
import os, signal, sys
import ray
real = ray.shutdown

def shutdown(*args, **kwargs):  # a SIGTERM as the shutdown ends (the scheduler's)
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)

ray.shutdown = shutdown
sys.argv = ["packtool", *sys.argv[1:]]
from packtool.__main__ import main
main()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")
def test_sigterm_while_ray_shuts_down_stops_the_pack_cleanly(corpus, tmp_path):
    """SIGTERM during ray.shutdown() (the shards written, the manifest not yet): Ray's driver
    had set the OS's default SIGTERM action by then, so the driver died at once (status -15,
    OUTPUT locked, no message). Now it is handled as at any other moment: exit 143, one line
    saying what was kept, no lock; the same command (any engine) finishes the output."""
    import subprocess

    from packtool.formats.manifest import LOCK_NAME, MANIFEST_NAME

    inp, _ = corpus
    out, ref = tmp_path / "out", tmp_path / "ref"
    options = ["-c", C, "--rows-per-shard", 9, "--window-docs", 40, "--workers", 1]
    args = ["pack", "-q", *options, "--engine", "ray", inp, out]
    p = subprocess.run([sys.executable, "-c", _SIGTERM_IN_SHUTDOWN, *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 143, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: terminated (SIGTERM): {out} has no manifest; kept for the "
                           "rerun: "), p.stderr[-2000:]
    assert "finished shards" in last and "Traceback" not in p.stderr, p.stderr[-2000:]
    names = {q.name for q in out.iterdir()}
    assert LOCK_NAME not in names and MANIFEST_NAME not in names, names
    from packcheck import hash_tree, invoke

    assert invoke(["pack", "-q", *options, inp, out]).exit_code == 0
    assert invoke(["pack", "-q", *options, inp, ref]).exit_code == 0
    assert hash_tree(out) == hash_tree(ref)
