"""The CLI's Arrow memory pool: jemalloc unless the user chose one; the bytes never depend on it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from conftest import write_docs

POOL = "from packtool.formats.memory import use_jemalloc; print(use_jemalloc())"


def _has_jemalloc() -> bool:
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        return False
    return True


def _env(pool: str | None) -> dict:
    env = dict(os.environ)
    env.pop("ARROW_DEFAULT_MEMORY_POOL", None)
    if pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = pool
    return env


@pytest.mark.skipif(not _has_jemalloc(), reason="pyarrow built without jemalloc")
def test_jemalloc_becomes_the_default_pool():
    out = subprocess.run([sys.executable, "-c", POOL], env=_env(None), capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "jemalloc"


def test_a_pool_the_user_chose_is_kept():
    out = subprocess.run([sys.executable, "-c", POOL], env=_env("system"), capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "system"


def test_packed_bytes_do_not_depend_on_the_pool(tmp_path):
    docs = [[(7 * d + t) % 500 for t in range(1 + (37 * d) % 90)] for d in range(300)]
    write_docs(tmp_path / "in" / "a.parquet", docs, value_type=pa.int32())
    digests = {}
    for pool in (None, "system"):
        out = tmp_path / f"out-{pool}"
        subprocess.run([sys.executable, "-m", "packtool", "pack", "-q", "-c", "128", "-j", "2",
                        "--rows-per-shard", "40", str(tmp_path / "in"), str(out)],
                       env=_env(pool), check=True)
        digests[pool] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                         for p in sorted(out.glob("part-*.parquet"))}
    assert len(digests[None]) > 1
    assert digests[None] == digests["system"]
