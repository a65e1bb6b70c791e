"""A three-node Ray cluster on this machine (``scripts/ray_cluster.py``) and every fault on it:
a worker SIGKILLed while it writes a shard, the driver killed and the command rerun, a data
error while another task runs, a whole node killed. Each run ends byte-identical to the
undisturbed run (which equals ``--engine local``), or, for the data error, with the one-line
error, the held task cancelled and OUTPUT as before. At the end no process of the cluster is
left.

INPUT is read from the local S3 server (moto, 127.0.0.1) by every node when moto is installed,
else from a directory. A short corpus keeps the whole test near a minute on 2 cores.
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
    """The local S3 server's URL, or None (INPUT then comes from a directory)."""
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
    lines = []
    try:
        results = mod.run_all(root, faults=mod.FAULTS, docs=2400, files=4, window_docs=500,
                              rows_per_shard=48, s3=s3_url, log=lines.append)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = "\n".join(mod._line(r) for r in results)
    names = [r.name for r in results]
    assert names == ["local engine", "cluster, undisturbed", *mod.FAULTS, "cluster stopped"], report
    assert all(r.ok for r in results), report
