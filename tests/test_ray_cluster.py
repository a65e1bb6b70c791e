"""A three-node Ray cluster on this machine (``scripts/ray_cluster.py``) whose nodes share nothing
but an S3 server (moto, 127.0.0.1): INPUT and OUTPUT are ``s3://`` prefixes, each node has its
own TMPDIR, and nothing is written to the driver's. Every fault runs on it: a worker SIGKILLed
while it writes a shard, the driver killed and the command rerun, a data error while another
task runs, a whole node killed. Each run ends byte-identical (shards and manifest read back from
the store, nothing else left under OUTPUT) to ``--engine local`` into a directory, or, for the
data error, with the one-line error, the held task cancelled and OUTPUT as before. An
undisturbed run into a directory shares the cluster start-up. At the end no process of the
cluster is left.

Without moto, INPUT and OUTPUT are directories and the faults run there. A short corpus keeps
the whole test near a minute on 2 idle cores (all faults also in a directory:
`python scripts/ray_cluster.py --output both`).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the cluster test needs Ray (pip install 'packtool[ray]')")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ray_cluster.py"


def _script():
    spec = importlib.util.spec_from_file_location("ray_cluster", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def s3_url(request):
    """The local S3 server's URL, or None (INPUT and OUTPUT then are directories)."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return None
    return request.getfixturevalue("s3_endpoint")


@pytest.mark.slow
def test_cluster_survives_every_fault(s3_url):
    mod = _script()
    # Ray's socket paths must stay short: not under pytest's long tmp_path
    root = Path(tempfile.mkdtemp(prefix="ptc-", dir="/tmp"))
    places = ["dir", "s3"] if s3_url else ["dir"]
    lines = []
    try:
        results = mod.run_all(root, faults=mod.FAULTS, docs=2400, files=4, window_docs=500,
                              rows_per_shard=48, s3=s3_url, places=places,
                              fault_places=places[-1:],
                              log=lines.append)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = "\n".join(mod._line(r) for r in results)
    names = [r.name for r in results]
    assert names == ["local engine", *(f"cluster, undisturbed, {p}" for p in places),
                     *(f"{f}, {places[-1]}" for f in mod.FAULTS), "driver TMPDIR",
                     "cluster stopped"], report
    assert all(r.ok for r in results), report


# --- a driver joining a cluster whose nodes see other files, or import another packtool -------

CLONE = Path(__file__).resolve().parents[1]


def _joined(root: Path, pythonpath: str):
    """A one-node cluster (a head of 2 CPUs) whose ``ray start`` ran in ``root/head`` (its
    workers' working directory) with ``PYTHONPATH=pythonpath``; the driver's directory is
    ``root/driver``."""
    mod = _script()
    (root / "head").mkdir(parents=True)
    (root / "driver").mkdir()
    return mod.Cluster(root / "ray", workers=0, head_cpus=2, cwd=root / "head",
                       env={"PYTHONPATH": pythonpath})


def _pack(cluster, cwd: Path, *args, engine: str = "ray"):
    """``packtool pack`` run by a driver in ``cwd`` (the source tree on its PYTHONPATH)."""
    import os
    import subprocess

    env = {**os.environ, **cluster.env, "PYTHONPATH": str(CLONE)}
    env.pop("RAY_ADDRESS", None)
    ray = ["--ray-address", cluster.address] if engine == "ray" else []
    return subprocess.run([sys.executable, "-m", "packtool", "pack", "-q", "--capacity", "64",
                           "--rows-per-shard", "8", "--window-docs", "60", "--engine", engine,
                           *ray, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _corpus(where: Path) -> None:
    from conftest import write_docs

    import numpy as np

    rng = np.random.default_rng(5)
    for f in range(3):
        write_docs(where / f"{f}.parquet",
                   [rng.integers(0, 1000, int(k)).tolist() for k in rng.integers(1, 90, 70)])


def test_a_joined_cluster_gets_absolute_paths_and_refuses_paths_its_nodes_do_not_see():
    """A driver joining a cluster handed relative INPUT and OUTPUT to the tasks, which resolved
    them in their own working directory (where ``ray start`` ran): the pack exited 0 with OUTPUT
    holding only the manifest, the shards left in the workers' directory. Tasks now get absolute
    paths (the same bytes as the local engine). A node that sees another OUTPUT at that path (a
    disk of its own, here ``/proc/self/cwd``: each process's working directory) is refused at
    its first task, with an --overwrite's old pack untouched; a node that does not see INPUT is
    named, not told the file was deleted."""
    from packcheck import hash_tree

    root = Path(tempfile.mkdtemp(prefix="ptj-", dir="/tmp"))
    try:
        with _joined(root, str(CLONE)) as cluster:
            head, driver = root / "head", root / "driver"
            _corpus(driver / "in")
            shutil.copytree(driver / "in", head / "in")  # same files, same mtimes
            assert _pack(cluster, driver, "in", "ref", engine="local").returncode == 0
            p = _pack(cluster, driver, "in", "out")
            assert p.returncode == 0, p.stderr[-3000:]
            assert hash_tree(driver / "out") == hash_tree(driver / "ref")
            assert not (head / "out").exists()

            # OUTPUT on each node's own disk: refused by the first task, old pack untouched
            before = hash_tree(driver / "ref")
            p = _pack(cluster, driver, "in", "/proc/self/cwd/ref", "--overwrite", "--seed", "9")
            assert p.returncode == 1, p.stderr[-3000:]
            err = p.stderr.strip()
            assert len(err.splitlines()) == 1, err
            assert err.startswith("Error: /proc/self/cwd/ref: the Ray worker on node "), err
            assert "does not see OUTPUT as the driver made it" in err, err
            assert err.endswith("with a joined Ray cluster OUTPUT must be on storage every node "
                                "sees at the same path (or a store URI)"), err
            assert hash_tree(driver / "ref") == before
            assert not (head / "ref").exists()

            # INPUT the nodes do not see
            shutil.rmtree(head / "in")
            p = _pack(cluster, driver, "/proc/self/cwd/in", "out2")
            assert p.returncode == 1, p.stderr[-3000:]
            err = p.stderr.strip()
            assert len(err.splitlines()) == 1, err
            assert err.startswith("Error: /proc/self/cwd/in/0.parquet: not found by the Ray "
                                  "worker on node "), err
            assert ("though the driver listed it: with a joined Ray cluster INPUT must be on "
                    "storage every node sees at the same path (or a store URI)") in err, err
            assert "is gone" not in err
            assert not (driver / "out2").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_workers_importing_another_packtool_are_refused_before_any_work():
    """Nodes started with another packtool on their PYTHONPATH gave Ray's many-line 'The remote
    function failed to import on the worker' dump, or ran other code. Every task now compares
    its packtool (version, and the sha256 of its source) with the driver's before any work: one
    line naming both; and one line when packtool cannot be imported there."""
    root = Path(tempfile.mkdtemp(prefix="ptv-", dir="/tmp"))
    alt = root / "alt"
    shutil.copytree(CLONE / "packtool", alt / "packtool",
                    ignore=shutil.ignore_patterns("__pycache__"))
    version = alt / "packtool" / "_version.py"
    source = version.read_text()
    try:
        with _joined(root, str(alt)) as cluster:
            driver = root / "driver"
            _corpus(driver / "in")
            cases = [
                ("0.0.9", source.replace('__version__ = "0.1.0"', '__version__ = "0.0.9"'),
                 f"imports packtool 0.0.9 from {alt / 'packtool'}, the driver packtool 0.1.0 "
                 f"from {CLONE / 'packtool'}; "),
                ("same version", source + "\n# another commit\n",
                 f"imports packtool 0.1.0 from {alt / 'packtool'} with other code than the "
                 f"driver's, from {CLONE / 'packtool'} (source sha256 "),
                ("no import", None,
                 "cannot import packtool (ImportError: a broken install), the driver runs "
                 f"packtool 0.1.0 from {CLONE / 'packtool'}; "),
            ]
            for name, text, said in cases:
                if text is None:
                    (alt / "packtool" / "__init__.py").write_text(
                        'raise ImportError("a broken install")\n')
                else:
                    version.write_text(text)
                p = _pack(cluster, driver, driver / "in", driver / f"out-{name}")
                assert p.returncode == 1, (name, p.stderr[-3000:])
                err = p.stderr.strip()
                assert len(err.splitlines()) == 1 and "failed to import" not in err, err
                assert err.startswith("Error: a Ray worker on node "), err
                assert said in err, (name, err)
                assert err.endswith("install the driver's packtool on every node of the "
                                    "cluster (one image, or the same commit), or start the "
                                    "nodes with a PYTHONPATH that holds it, then rerun"), err
                assert not (driver / f"out-{name}").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
