"""Same input and options give the same bytes (shards and manifest; the manifest has no
timestamp), whatever the worker count; ``--seed`` changes only the order of the rows."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from packtool.formats.manifest import read_manifest

from packcheck import hash_tree, invoke, read_output, write_docs

OPTIONS = ["--capacity", "32", "--rows-per-shard", "5"]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    rng = random.Random(4)
    d = tmp_path_factory.mktemp("det") / "in"
    for f in range(3):
        write_docs(d / f"part{f}.parquet",
                   [[rng.randrange(0, 70000) for _ in range(rng.choice([0, 1, 5, 17, 31, 32, 70]))]
                    for _ in range(30)])
    return d


def pack(src: Path, out: Path, *extra: str) -> dict[str, str]:
    res = invoke(["pack", "-q", *OPTIONS, *extra, src, out])
    assert res.exit_code == 0, res.output
    return hash_tree(out)


def test_same_input_same_bytes_across_runs_and_worker_counts(tmp_path, src):
    """Identical bytes for every file, across runs and --workers 1 vs 2."""
    a = pack(src, tmp_path / "a", "--workers", "1")
    b = pack(src, tmp_path / "b", "--workers", "1")
    c = pack(src, tmp_path / "c", "--workers", "2")
    assert len([k for k in a if k.startswith("part-")]) >= 3
    assert a == b == c
    manifest = read_manifest(tmp_path / "a")
    assert "workers" not in manifest.options and "output" not in manifest.options


@pytest.mark.parametrize("strategy", ["obfd", "ordered", "concat"])
def test_seed_changes_only_the_row_order(tmp_path, src, strategy):
    """Another --seed permutes the rows; the multiset of rows (every column) is the same."""
    pack(src, tmp_path / "s0", "--strategy", strategy, "--seed", "0")
    pack(src, tmp_path / "s1", "--strategy", strategy, "--seed", "1")
    pack(src, tmp_path / "ns", "--strategy", strategy, "--no-shuffle")
    rows0, m0 = read_output(tmp_path / "s0")
    rows1, m1 = read_output(tmp_path / "s1")
    rows_ns, _ = read_output(tmp_path / "ns")

    def key(r):
        return json.dumps(r, sort_keys=True)

    assert [key(r) for r in rows0] != [key(r) for r in rows1]
    assert Counter(map(key, rows0)) == Counter(map(key, rows1)) == Counter(map(key, rows_ns))
    assert m0.totals == m1.totals
    assert m0.options == {**m1.options, "seed": 0}
