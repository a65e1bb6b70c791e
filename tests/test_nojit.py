"""Whole packs with Numba's JIT disabled (``NUMBA_DISABLE_JIT=1``, ``make test-nojit``): every
kernel and every numba-only call (the spill's ``pread``) has a path that runs as plain Python,
and it writes the bytes the compiled pack writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(jit: bool) -> dict:
    env = dict(os.environ)
    env.pop("NUMBA_DISABLE_JIT", None)
    if not jit:
        env["NUMBA_DISABLE_JIT"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run(args, jit: bool) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=_env(jit), timeout=600)
    assert proc.returncode == 0, (jit, proc.stderr[-2000:])
    return proc


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def rich_input(tmp_path_factory) -> Path:
    """Documents with an attention mask (trailing 0s), input labels (-100s), a source column,
    and some longer than the capacities below (split or truncated)."""
    rng = np.random.default_rng(7)
    ids, mask, labels, src = [], [], [], []
    for i in range(60):
        n = int(rng.integers(1, 40))
        t = rng.integers(3, 1000, n).tolist()
        pad = int(rng.integers(0, 3)) if n > 3 else 0
        ids.append(t)
        mask.append([1] * (n - pad) + [0] * pad)
        labels.append([-100 if rng.random() < 0.3 else x for x in t])
        src.append(("web", "code", "math")[i % 3])
    path = tmp_path_factory.mktemp("nojit-in") / "docs.parquet"
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": mask, "labels": labels,
                             "src": src}), path, row_group_size=17)
    return path


CASES = {
    "defaults": ["-c", "16"],
    "labels-bos-eos-source": ["-c", "16", "--labels", "shifted", "--prepend-bos", "1",
                              "--append-eos", "2", "--source-column", "src"],
    "segment-multiple-ordered": ["-c", "16", "--segment-multiple", "4", "--labels", "unshifted",
                                 "--strategy", "ordered"],
    "truncate-windows-min-fill": ["-c", "8", "--overflow", "truncate", "--min-fill", "0.5",
                                  "--window-docs", "7"],
    "concat-holdout": ["-c", "16", "--strategy", "concat", "--holdout", "0.2", "--rows-per-shard",
                       "5"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pack_without_the_jit_writes_the_bytes_of_the_compiled_pack(tmp_path, rich_input, case):
    """``packtool pack`` under ``NUMBA_DISABLE_JIT=1`` exits 0 and writes every file (shards,
    manifest, held-out output) byte for byte as the compiled pack does."""
    outs = {}
    for jit in (True, False):
        out = tmp_path / ("jit" if jit else "nojit") / "out"
        out.parent.mkdir()
        _run(["-m", "packtool", "pack", "-q", *CASES[case], str(rich_input), str(out)], jit)
        outs[jit] = {name: _files(p) for name, p in
                     (("out", out), ("holdout", out.parent / "out-holdout")) if p.exists()}
    assert outs[True]["out"]
    assert outs[False] == outs[True]


_PACK_DATASET = """
import sys
import pyarrow.parquet as pq
from packtool.api import pack_dataset
table = pq.read_table(sys.argv[1])
docs = [dict(zip(table.column_names, r)) for r in zip(*(table[c].to_pylist()
                                                          for c in table.column_names))]
pack_dataset(docs, 12, labels="shifted", prepend_bos=1, source_column="src", output=sys.argv[2])
"""


def test_pack_dataset_without_the_jit_writes_the_bytes_of_the_compiled_one(tmp_path, rich_input):
    """``pack_dataset`` (a list of dicts, written to ``output``) under ``NUMBA_DISABLE_JIT=1``."""
    got = {}
    for jit in (True, False):
        out = tmp_path / ("jit" if jit else "nojit")
        _run(["-c", _PACK_DATASET, str(rich_input), str(out)], jit)
        got[jit] = _files(out)
    assert any(name.endswith(".parquet") for name in got[True])
    assert got[False] == got[True]


def test_python_pread_segments_reads_what_the_kernel_reads(tmp_path):
    """The Python twin of the spill's ``pread`` kernel: the same items in the same places, and
    the same first segment reported when a file is shorter than asked."""
    from packtool.pipeline.spill import _pread_segments, _pread_segments_python

    rng = np.random.default_rng(3)
    data = [rng.integers(-2**31, 2**31 - 1, n, dtype=np.int32) for n in (50, 7, 130)]
    paths = []
    for i, d in enumerate(data):
        paths.append(tmp_path / f"s{i}.int32")
        paths[-1].write_bytes(d.tobytes())
    fds = np.array([os.open(p, os.O_RDONLY) for p in paths], dtype=np.int32)
    try:
        which = rng.integers(0, 3, 40)
        sizes = np.array([d.size for d in data])[which]
        src = np.array([rng.integers(0, s) for s in sizes], dtype=np.int64)
        lens = np.array([rng.integers(0, s - a + 1) for s, a in zip(sizes, src)], dtype=np.int64)
        dest = np.zeros(lens.size, dtype=np.int64)
        np.cumsum(lens[:-1], out=dest[1:])
        expect = np.concatenate([data[w][a:a + n] for w, a, n in zip(which, src, lens)])
        for fn in (_pread_segments, _pread_segments_python):
            out = np.full(int(lens.sum()), -1, dtype=np.int32)
            assert fn(fds[which], src, lens, out, dest) == -1
            np.testing.assert_array_equal(out, expect)
        short = lens.copy()
        q = int(np.flatnonzero(lens > 0)[5])
        short[q] = sizes[q] - src[q] + 1  # one item past the end of its file
        for fn in (_pread_segments, _pread_segments_python):
            out = np.zeros(int(short.sum()) + 1, dtype=np.int32)
            d = np.zeros(short.size, dtype=np.int64)
            np.cumsum(short[:-1], out=d[1:])
            assert fn(fds[which], src, short, out, d) == q
    finally:
        for fd in fds:
            os.close(int(fd))
