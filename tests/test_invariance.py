"""What does not change the packed output: the worker count and the shard size.

- ``--workers``: shards are laid out by a thread pool, but each shard depends only on the plan
  and its row ids, so the shard files are byte-identical for any worker count.
- ``--rows-per-shard``: it only cuts the same shuffled row sequence into different files, so the
  rows read back in manifest order are identical (the files themselves differ, as do the row
  groups inside them: ``rows_per_group`` counts from each shard's start).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from packtool.formats.manifest import read_manifest
from packtool.config import PackConfig
from packtool.pipeline import run_pack
from conftest import write_docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two small files of random documents (empties and documents over C included)."""
    rng = np.random.default_rng(11)
    folder = tmp_path_factory.mktemp("corpus")
    for k in range(2):
        lengths = np.clip(rng.lognormal(np.log(20), 1.0, 300).astype(int), 0, 200)
        docs = [rng.integers(0, 200_000, n).tolist() for n in lengths]
        write_docs(folder / f"part-{k}.parquet", docs, row_group_size=64)
    return folder


def _pack(corpus: Path, out: Path, **kw) -> dict:
    cfg = PackConfig(inputs=(str(corpus),), output=str(out), capacity=64, **kw)
    run_pack(cfg, progress=False)
    return read_manifest(out)


def _digests(out: Path, manifest: dict) -> list[str]:
    return [hashlib.sha256((out / e.file).read_bytes()).hexdigest()
            for e in manifest.shards]


def _rows(out: Path, manifest: dict) -> list[dict]:
    rows = []
    for e in manifest.shards:
        rows.extend(pq.read_table(out / e.file).to_pylist())
    return rows


@pytest.mark.parametrize("window_docs", [None, 150])
def test_shards_are_byte_identical_for_any_worker_count(corpus, tmp_path, window_docs):
    """workers=1 and workers=2 write the same files, byte for byte (also in windowed mode)."""
    kw = dict(rows_per_shard=40, rows_per_group=16, window_docs=window_docs)
    m1 = _pack(corpus, tmp_path / "w1", workers=1, **kw)
    m2 = _pack(corpus, tmp_path / "w2", workers=2, **kw)
    assert len(m1.shards) > 2
    assert _digests(tmp_path / "w1", m1) == _digests(tmp_path / "w2", m2)
    assert [e.sha256 for e in m1.shards] == [e.sha256 for e in m2.shards]
    assert m1.totals == m2.totals


@pytest.mark.parametrize("shuffle", [True, False])
def test_rows_are_identical_for_any_rows_per_shard(corpus, tmp_path, shuffle):
    """Cutting the output into shards of 7 or 1000 rows gives the same rows in the same order."""
    a = _pack(corpus, tmp_path / "a", workers=2, rows_per_shard=7, rows_per_group=3,
              shuffle=shuffle)
    b = _pack(corpus, tmp_path / "b", workers=1, rows_per_shard=1000, shuffle=shuffle)
    assert len(a.shards) > 1 and len(b.shards) == 1
    assert _rows(tmp_path / "a", a) == _rows(tmp_path / "b", b)
    assert a.totals == b.totals
