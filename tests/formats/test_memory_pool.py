"""The CLI's Arrow memory pool: jemalloc unless the user chose one; the bytes never depend on it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from conftest import write_docs

from packtool.formats.memory import JEMALLOC_CONF

POOL = ("import os; from packtool.formats.memory import use_jemalloc; "
        "print(use_jemalloc(), os.environ.get('JE_ARROW_MALLOC_CONF'))")


def _has_jemalloc() -> bool:
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        return False
    return True


def _env(pool: str | None, conf: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("ARROW_DEFAULT_MEMORY_POOL", None)
    env.pop("JE_ARROW_MALLOC_CONF", None)
    if pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = pool
    if conf is not None:
        env["JE_ARROW_MALLOC_CONF"] = conf
    return env


def _pool(env: dict) -> list[str]:
    return subprocess.run([sys.executable, "-c", POOL], env=env, capture_output=True,
                          text=True, check=True).stdout.split()


@pytest.mark.skipif(not _has_jemalloc(), reason="pyarrow built without jemalloc")
def test_jemalloc_keeping_its_pages_becomes_the_default_pool():
    assert _pool(_env(None)) == ["jemalloc", JEMALLOC_CONF]


@pytest.mark.skipif(not _has_jemalloc(), reason="pyarrow built without jemalloc")
def test_the_users_jemalloc_options_win():
    assert _pool(_env(None, "dirty_decay_ms:0")) == ["jemalloc", "dirty_decay_ms:0"]


def test_a_pool_the_user_chose_is_kept():
    assert _pool(_env("system")) == ["system", "None"]


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
