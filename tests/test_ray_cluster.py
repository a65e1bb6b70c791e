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
