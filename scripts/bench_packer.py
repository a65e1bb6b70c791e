"""Benchmark the packing plan (split + sort + place) against the peers that are importable.

For each length distribution, document count N and capacity C, every method runs in a fresh
subprocess (clean peak-RSS figures) and reports seconds (best of ``--repeat``), documents/s,
rows, fill, extra rows over ceil(tokens / C) and the peak RSS growth during the timed call.
"first s" is the first call in a fresh process: it also pays the page faults of fresh memory,
which on a small VM cost as much as the plan itself; "best s" is the best of ``--repeat`` calls.

Distributions (fixed seed):

- ``web``: log-normal, median 300 tokens, sigma 1.17 (about 5 % of documents over 2048), tail
  clipped at 100 k tokens;
- ``code``: log-normal, median 1,700, sigma 1.2 (about 44 % over 2048), clipped at 100 k;
- ``uniform``: 1..C.

Methods: ``packtool`` (``pack_lengths``, obfd, overflow split: the timing includes splitting,
sorting and placing); ``twin`` (``reference_pack``, pure Python, small N only);
``lightbinpack`` (its C++ ``obfd``; it does not split, so it gets the already-split chunk
lengths as a Python list, and the split/list conversion is not timed); ``trl``
(``pack_dataset(strategy="bfd")`` on a ``datasets.Dataset``) and ``olmo-core`` are reported as
skipped when they are not importable.

Usage: ``python scripts/bench_packer.py [--quick] [--out bench_results]``; writes
``bench_packer.json`` and ``bench_packer.md`` into ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DISTS = ("web", "code", "uniform")
METHODS = ("packtool", "twin", "lightbinpack", "trl", "olmo-core")
TWIN_MAX_N = 2_000  # the twin scans every open bin per chunk: O(N * bins)
PEER_MAX_N = 10_000_000


LENGTH_BLOCK = 1 << 22  #: documents drawn per generator call


def length_block(rng: np.random.Generator, dist: str, m: int, capacity: int) -> np.ndarray:
    """float64 or int64[m]: the next ``m`` lengths of ``dist`` drawn from ``rng``."""
    if dist == "web":
        return np.clip(np.rint(rng.lognormal(np.log(300), 1.17, m)), 1, 100_000)
    if dist == "code":
        return np.clip(np.rint(rng.lognormal(np.log(1700), 1.2, m)), 1, 100_000)
    return rng.integers(1, capacity + 1, m)


def make_lengths(dist: str, n: int, capacity: int, seed: int = 0) -> np.ndarray:
    """int64[n] synthetic document lengths, generated in blocks (no float64[n] temporary).

    Document i's length depends only on (dist, seed, i): the blocks of ``LENGTH_BLOCK`` come
    from one generator in order, so ``scripts/bench_scale.py`` streams the same documents.
    """
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.int64)
    for lo in range(0, n, LENGTH_BLOCK):
        m = min(LENGTH_BLOCK, n - lo)
        out[lo:lo + m] = length_block(rng, dist, m, capacity)
    return out


def split_lengths(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Chunk lengths after ``--overflow split`` (what a packer without splitting is given)."""
    full = lengths // capacity
    rest = lengths % capacity
    return np.concatenate([np.full(int(full.sum()), capacity, dtype=np.int64), rest[rest > 0]])


def _reset_peak() -> int:
    """Reset the kernel's peak-RSS mark (Linux clear_refs 5); return the current RSS in bytes."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kb("VmRSS") * 1024


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _timed(fn, repeat: int):
    """(best seconds, first-call seconds, result, peak RSS growth in bytes) of ``repeat`` calls."""
    best, result, peak, first = float("inf"), None, 0, None
    for _ in range(repeat):
        result = None
        base = _reset_peak()
        t = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t
        best = min(best, dt)
        first = dt if first is None else first
        peak = max(peak, _status_kb("VmHWM") * 1024 - base)
    return best, first, result, peak


def run_case(method: str, dist: str, n: int, capacity: int, repeat: int) -> dict:
    """One measurement (runs inside the child process)."""
    lengths = make_lengths(dist, n, capacity)
    chunks = split_lengths(lengths, capacity)
    tokens = int(chunks.sum())
    row = {"method": method, "dist": dist, "n": n, "capacity": capacity}
    if method == "packtool":
        from packtool.core import pack_lengths

        pack_lengths(lengths[:1000], capacity)  # compile / load the cache outside the timing
        secs, first, plan, peak = _timed(lambda: pack_lengths(lengths, capacity), repeat)
        rows = plan.num_rows
    elif method == "twin":
        from packtool.core.reference import reference_pack

        as_list = lengths.tolist()
        secs, first, out, peak = _timed(lambda: reference_pack(as_list, capacity), 1)
        rows = len(out)
    elif method == "lightbinpack":
        import lightbinpack

        as_list = chunks.tolist()
        lightbinpack.obfd(as_list[:1000], capacity)
        secs, first, out, peak = _timed(lambda: lightbinpack.obfd(as_list, capacity), 1)
        rows = len(out)
    elif method == "trl":
        from datasets import Dataset
        from trl import pack_dataset

        ds = Dataset.from_dict({"input_ids": [[1] * int(x) for x in lengths]})
        secs, first, out, peak = _timed(
            lambda: pack_dataset(ds, seq_length=capacity, strategy="bfd"), 1)
        rows = len(out)
    else:  # olmo-core
        from olmo_core.data.utils import pack_documents_into_instances  # noqa: F401

        raise ImportError("olmo-core's packer takes token files, not lengths")
    lower = -(-tokens // capacity)
    row.update(seconds=secs, first_seconds=first,
               docs_per_s=n / secs if secs > 0 else float("inf"), rows=rows,
               fill=tokens / (rows * capacity) if rows else 0.0, extra_rows=rows - lower,
               peak_mib=peak / 2**20, status="ok")
    return row


def _child(args) -> None:
    method, dist, n, capacity, repeat = args.case.split(",")
    try:
        row = run_case(method, dist, int(n), int(capacity), int(repeat))
    except ImportError as exc:
        row = {"method": method, "dist": dist, "n": int(n), "capacity": int(capacity),
               "status": f"skipped ({exc.__class__.__name__}: {str(exc)[:60]})"}
    print("RESULT " + json.dumps(row))


def _spawn(method, dist, n, capacity, repeat, timeout) -> dict:
    cmd = [sys.executable, __file__, "--case", f"{method},{dist},{n},{capacity},{repeat}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"method": method, "dist": dist, "n": n, "capacity": capacity,
                "status": f"skipped (over {timeout} s)"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"method": method, "dist": dist, "n": n, "capacity": capacity,
            "status": f"failed ({tail[:80]})"}


def _machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, Python {platform.python_version()}"


def _fmt(row: dict) -> str:
    head = f"| {row['dist']} | {row['capacity']} | {row['n']:.0e} | {row['method']} |"
    if row.get("status") != "ok":
        return head + f" {row['status']} | | | | | | |"
    return (head + f" {row['seconds']:.3f} | {row['first_seconds']:.3f} |"
            f" {row['docs_per_s'] / 1e6:.2f} M | {row['rows']:,} |"
            f" {100 * row['fill']:.3f} % | {row['extra_rows']} | {row['peak_mib']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 1e5 and 1e6 only, one repeat")
    ap.add_argument("--out", default=str(ROOT / "bench_results"), help="output folder")
    ap.add_argument("--repeat", type=int, default=3, help="packtool timings: best of this many")
    ap.add_argument("--max-n", type=float, default=1e8, help="largest N to try")
    ap.add_argument("--peer-timeout", type=int, default=300, help="seconds per peer run")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        return _child(args)
    sizes = [100_000, 1_000_000] if args.quick else [100_000, 1_000_000, 10_000_000,
                                                      100_000_000]
    sizes = [n for n in sizes if n <= args.max_n]
    repeat = 1 if args.quick else args.repeat
    avail = _available_bytes()
    notes, results, unavailable = [], [], set()
    header = ("| dist | C | N | method | best s | first s | docs/s (best) | rows | fill | "
              "extra rows | peak MiB |\n|---|---|---|---|---|---|---|---|---|---|---|")
    print(header, flush=True)
    for dist in DISTS:
        for capacity in (2048, 8192):
            cases = [("twin", TWIN_MAX_N)] + [(m, n) for n in sizes for m in METHODS
                                              if m != "twin"]
            for method, n in cases:
                if method == "packtool" and n * 120 > avail:
                    notes.append(f"{dist} C={capacity} N={n:.0e}: skipped, needs about "
                                 f"{n * 120 / 2**30:.0f} GiB, {avail / 2**30:.0f} GiB available")
                    continue
                if method in ("lightbinpack", "trl") and n > PEER_MAX_N:
                    continue
                if method in unavailable:
                    continue  # reported as skipped once, at its first case
                if method == "twin":
                    row = _spawn("packtool", dist, n, capacity, repeat, args.peer_timeout)
                    results.append(row)
                    print(_fmt(row), flush=True)
                row = _spawn(method, dist, n, capacity, repeat, args.peer_timeout)
                if row["status"].startswith("skipped (") and "Error" in row["status"]:
                    unavailable.add(method)  # not importable: one skipped row is enough
                results.append(row)
                print(_fmt(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = _machine()
    (out / "bench_packer.json").write_text(json.dumps(
        {"machine": machine, "repeat": repeat, "results": results, "notes": notes}, indent=1))
    table = "\n".join([header] + [_fmt(r) for r in results])
    md = f"Machine: {machine}\n\n{table}\n" + "".join(f"\n- {n}" for n in notes)
    (out / "bench_packer.md").write_text(md + "\n")
    for n in notes:
        print("note:", n)
    print(f"machine: {machine}\nwrote {out / 'bench_packer.json'} and {out / 'bench_packer.md'}")


def _available_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


if __name__ == "__main__":
    main()
