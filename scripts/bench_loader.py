"""Rows per CPU-second of packtool.loader beside a flat NumPy memmap and LitData, side by side
in one run.

CPU is what a loaded machine (and a training node) pays: every figure is rows per CPU-second,
user + system time of this process and of every DataLoader worker it starts (``psutil``, the
workers read while alive), and rows per second of wall time beside it. The load average is
printed before and after: on a shared machine compare the ratios of one run, not absolute
figures across runs.

For each capacity C, ``--input`` (default ``sample_data/``: real Tekken ids) is repeated
``--repeat`` times, shuffled, and packed with the default row groups (``--row-group-mb``,
1 MiB of per-token data); the same rows are written as a flat memmap of ``input_ids``,
``segment_ids``, ``position_ids`` and ``labels`` (int32 [N, C] each: the memmap gets its labels
for free) and, when LitData is installed, with ``litdata.optimize`` (same four columns). Then:

- ``packtool sequential`` / ``shuffled``: ``PackedIterableDataset(batch_size=B)`` iterated in
  this process (``shuffle=False`` / the training order);
- ``packtool random``: ``PackedDataset[i]`` at random ``i`` (CPU milliseconds per row), on the
  default row groups and on ``--small-group-mb`` ones;
- ``memmap random``: the four columns of a random row copied out of the memmap;
- ``DataLoader w=K`` (K = 0 and 2), batch B: packtool batches
  (``DataLoader(PackedIterableDataset(batch_size=B), batch_size=None)``), the same from the
  same rows packed with ``--compression lz4`` (``packtool batches (lz4)``), packtool items
  collated (``DataLoader(PackedIterableDataset(), batch_size=B, collate_fn=collate)``), the
  memmap (a map-style dataset, shuffled sampler, items stacked into the same int32/int64
  tensors by a minimal collate, and collated by packtool's ``collate``: the same batch, so the
  reader is all that differs), and LitData (``StreamingDataset(shuffle=True)`` through
  ``StreamingDataLoader``, default collate). Workers are persistent: one warm-up pass, then a
  whole pass measured, so worker start-up is left out (printed apart).

Each figure runs whole passes until it has used ``--min-cpu`` CPU seconds (psutil's clock ticks
are 10 ms), the least CPU per row of ``--trials`` runs kept.

``--store`` measures instead the same output read from an S3-compatible server started on
127.0.0.1 (moto, the ``dev`` extra), beside the local directory, in rows per second and rows per
CPU-second of the reading process (user + sys of all its threads; the server's own CPU is the
store's, not the reader's): ``local``, ``s3 cold`` (no cache: every row group fetched with
ranged reads), ``s3 cache fill`` (first pass with an empty cache: whole shards downloaded) and
``s3 warm`` (the cache already holds them: a restart). Each figure is one pass of the shuffled
training order (``PackedIterableDataset``, all columns an item carries), best of ``--trials``.

Usage: python scripts/bench_loader.py [--capacity 8192] [--repeat 4] [--json FILE]
       python scripts/bench_loader.py --store --capacity 8192 --repeat 11   # >= 30 M tokens
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOKEN_COLS = ("input_ids", "segment_ids", "position_ids", "labels")


def live_children_cpu(me) -> float:
    """User + system seconds of the live children of psutil process ``me`` (DataLoader
    workers), those that end while they are read left out."""
    import psutil

    total = 0.0
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def cpu_seconds() -> float:
    """User + system seconds of this process, its live children and its reaped children."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    return t.user + t.system + t.children_user + t.children_system + live_children_cpu(me)


#: CPU seconds each figure runs for at least (whole passes, repeated): psutil's clock ticks are
#: 10 ms, so short runs would be noise
MIN_CPU_S = 2.0


def measure(one_pass, trials: int, setup=None) -> dict:
    """Least CPU per row of ``trials`` runs; a run repeats ``one_pass(state)`` (which returns the
    rows it read) until it has used :data:`MIN_CPU_S` CPU seconds. ``setup()`` builds the
    state once per run (a DataLoader: one warm-up pass is made before the clock starts, so
    persistent workers are started and warm; the start-up CPU is recorded)."""
    best = None
    for _ in range(trials):
        c0 = cpu_seconds()
        state = setup() if setup else None
        if setup:
            one_pass(state)  # warm-up
        startup = cpu_seconds() - c0
        rows, c, t = 0, cpu_seconds(), time.perf_counter()
        while cpu_seconds() - c < MIN_CPU_S:
            rows += one_pass(state)
        cpu, wall = cpu_seconds() - c, time.perf_counter() - t
        del state
        if best is None or cpu / rows < best["cpu"] / best["rows"]:
            best = {"rows": rows, "cpu": cpu, "wall": wall, "startup_cpu_s": startup}
    best["rows_per_cpu_s"] = best["rows"] / max(best["cpu"], 1e-9)
    best["rows_per_s"] = best["rows"] / max(best["wall"], 1e-9)
    best["cpu_ms_per_row"] = 1e3 * best["cpu"] / best["rows"]
    return best


def loader_pass(loader) -> int:
    return sum(int(b["input_ids"].shape[0]) for b in loader)


def make_input(src: Path, work: Path, repeat: int, seed: int) -> Path:
    """``src``'s documents (real token ids) ``repeat`` times, shuffled, as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f, columns=["input_ids"]) for f in sorted(src.rglob("*.parquet"))]
    docs = pa.concat_tables([t.cast(pa.schema([("input_ids", pa.list_(pa.int32()))]))
                             for t in tables]).column("input_ids").combine_chunks()
    order = np.random.default_rng(seed).permutation(np.tile(np.arange(len(docs)), repeat))
    d = work / "input"
    d.mkdir(exist_ok=True)
    pq.write_table(pa.table({"input_ids": docs.take(pa.array(order))}), d / "docs.parquet")
    return d


class MemmapRows:
    """The flat memmap baseline: a map-style dataset of the four token columns (int32 [N, C]
    each); an item is a dict of its four rows (copied out)."""

    def __init__(self, paths: dict) -> None:
        self.paths = paths
        self.mm = None

    def __len__(self) -> int:
        return int(np.load(self.paths["input_ids"], mmap_mode="r").shape[0])

    def __getitem__(self, i: int) -> dict:
        if self.mm is None:  # opened in the process that reads (workers open their own)
            self.mm = {c: np.load(p, mmap_mode="r") for c, p in self.paths.items()}
        item = {c: np.array(m[i]) for c, m in self.mm.items()}
        item["labels_convention"] = "unshifted"  # as packtool's items say
        return item

    def __getstate__(self) -> dict:
        return {"paths": self.paths, "mm": None}


def memmap_collate(items: list) -> dict:
    """The memmap's batch: the same tensors packtool's collate hands out (ids, positions and
    segments int32 [B, C], labels int64, cu_seqlens int32)."""
    import torch

    out = {c: torch.from_numpy(np.stack([it[c] for it in items])) for c in TOKEN_COLS}
    out["labels"] = torch.from_numpy(out["labels"].numpy().astype(np.int64))  # NumPy's cast
    seg = out["segment_ids"].numpy()
    starts = np.ones(seg.shape, dtype=bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    out["cu_seqlens"] = torch.from_numpy(np.append(np.flatnonzero(starts.ravel()),
                                                   seg.size).astype(np.int32))
    return out


def lit_collate(items: list) -> dict:
    import torch

    out = {c: torch.as_tensor(np.stack([np.asarray(it[c]) for it in items])) for c in TOKEN_COLS}
    out["labels"] = torch.from_numpy(out["labels"].numpy().astype(np.int64))
    return out


def write_litdata(mm_paths: dict, out: Path, N: int) -> bool:
    """The same rows in LitData's format (``litdata.optimize``); False when LitData is missing."""
    try:
        import litdata
    except ImportError:
        return False
    mm = {c: np.load(p, mmap_mode="r") for c, p in mm_paths.items()}

    def row(i):
        return {c: np.array(m[i]) for c, m in mm.items()}

    litdata.optimize(fn=row, inputs=list(range(N)), output_dir=str(out), chunk_bytes="16MB",
                     num_workers=1, verbose=False, start_method="fork")
    return True


def bench_capacity(src: Path, C: int, work: Path, args) -> dict:
    import torch

    from packtool.config import PackConfig
    from packtool.loader import PackedDataset, PackedIterableDataset, collate
    from packtool.pipeline import run_pack

    B = args.batch
    out = work / f"packed-{C}"
    run_pack(PackConfig(inputs=(str(src),), output=str(out), capacity=C,
                        row_group_mb=args.row_group_mb, overwrite=True, workers=1),
             progress=False)
    small = work / f"packed-{C}-small"
    run_pack(PackConfig(inputs=(str(src),), output=str(small), capacity=C,
                        row_group_mb=args.small_group_mb, overwrite=True, workers=1),
             progress=False)
    lz4 = work / f"packed-{C}-lz4"
    run_pack(PackConfig(inputs=(str(src),), output=str(lz4), capacity=C,
                        row_group_mb=args.row_group_mb, compression="lz4", overwrite=True,
                        workers=1), progress=False)
    ds = PackedDataset(out)
    N = len(ds)
    paths = {}
    for c in TOKEN_COLS:  # the flat memmap of the same rows
        paths[c] = str(work / f"{c}-{C}.npy")
        arr = np.lib.format.open_memmap(paths[c], mode="w+", dtype=np.int32, shape=(N, C))
        for i in range(N):
            arr[i] = ds[i][c]
        arr.flush()
        del arr
    lit = work / f"litdata-{C}"
    has_lit = write_litdata(paths, lit, N)
    rng = np.random.default_rng(args.seed)
    picks = rng.integers(0, N, min(args.random_rows, N))
    res = {"capacity": C, "rows": N, "batch": B,
           "row_groups": ds.output.num_row_groups,
           "rows_per_group": int(ds.output.rg_rows.max()),
           "small_rows_per_group": int(PackedDataset(small).output.rg_rows.max())}

    def packtool_direct(shuffle):
        def fn(_):
            d = PackedIterableDataset(out, rank=0, world_size=1, shuffle=shuffle, batch_size=B)
            return loader_pass(d)
        return fn

    def random_rows(path):
        def fn(_):
            d = PackedDataset(path, cached_row_groups=1)
            for i in picks:
                d[int(i)]
            return len(picks)
        return fn

    def memmap_random(_):
        m = MemmapRows(paths)
        for i in picks:
            m[int(i)]
        return len(picks)

    def loaders(w):
        pw = dict(num_workers=w, persistent_workers=w > 0)
        out_ = {
            "packtool batches": lambda: torch.utils.data.DataLoader(
                PackedIterableDataset(out, rank=0, world_size=1, batch_size=B),
                batch_size=None, **pw),
            "packtool batches (lz4)": lambda: torch.utils.data.DataLoader(
                PackedIterableDataset(lz4, rank=0, world_size=1, batch_size=B),
                batch_size=None, **pw),
            "packtool items + collate": lambda: torch.utils.data.DataLoader(
                PackedIterableDataset(out, rank=0, world_size=1), batch_size=B,
                collate_fn=collate, **pw),
            "memmap": lambda: torch.utils.data.DataLoader(
                MemmapRows(paths), batch_size=B, shuffle=True, collate_fn=memmap_collate, **pw),
            "memmap + packtool collate": lambda: torch.utils.data.DataLoader(
                MemmapRows(paths), batch_size=B, shuffle=True, collate_fn=collate, **pw),
        }
        if has_lit:
            import litdata

            out_["litdata"] = lambda: litdata.StreamingDataLoader(
                litdata.StreamingDataset(str(lit), shuffle=True), batch_size=B,
                collate_fn=lit_collate, **pw)
        return out_

    res["packtool sequential"] = measure(packtool_direct(False), args.trials)
    res["packtool shuffled"] = measure(packtool_direct(True), args.trials)
    res["packtool random (default groups)"] = measure(random_rows(out), args.trials)
    res["packtool random (small groups)"] = measure(random_rows(small), args.trials)
    res["memmap random"] = measure(memmap_random, args.trials)
    for w in (0, 2):
        for name, factory in loaders(w).items():
            res[f"DataLoader w={w}: {name}"] = measure(loader_pass, args.trials, factory)
    return res


def report(r: dict) -> None:
    print(f"\nC = {r['capacity']}: {r['rows']} rows, {r['row_groups']} row groups of "
          f"{r['rows_per_group']} rows (small groups: {r['small_rows_per_group']} rows), "
          f"batch {r['batch']}")
    print(f"{'reader':<48}{'rows/CPU-s':>12}{'CPU ms/row':>12}{'rows/s':>10}")
    for k, v in r.items():
        if isinstance(v, dict):
            print(f"{k:<48}{v['rows_per_cpu_s']:>12,.0f}{v['cpu_ms_per_row']:>12.3f}"
                  f"{v['rows_per_s']:>10,.0f}")
    for w in (0, 2):
        for base in ("memmap", "memmap + packtool collate"):
            mm = r.get(f"DataLoader w={w}: {base}")
            for name in ("packtool batches", "packtool batches (lz4)",
                         "packtool items + collate", "litdata"):
                v = r.get(f"DataLoader w={w}: {name}")
                if v and mm:
                    print(f"  w={w}: {name} / {base}, rows per CPU-s: "
                          f"{v['rows_per_cpu_s'] / mm['rows_per_cpu_s']:.2f}")
    for name in ("packtool batches", "packtool batches (lz4)", "packtool items + collate",
                 "memmap",
                 "memmap + packtool collate", "litdata"):
        a, b = r.get(f"DataLoader w=0: {name}"), r.get(f"DataLoader w=2: {name}")
        if a and b:
            print(f"  {name}: CPU per row with 2 workers / 0 workers = "
                  f"{b['cpu_ms_per_row'] / a['cpu_ms_per_row']:.2f}")


def _cpu() -> float:
    """User + system seconds of this process and its threads only (the S3 server of
    ``--store`` is a child process: its CPU is the store's, not the reader's)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench_store(src: Path, C: int, work: Path, row_group_mb: float, seed: int,
                trials: int) -> dict:
    """rows/s and rows/CPU-s of one training pass: local, S3 cold, S3 cache fill, S3 warm."""
    import shutil

    import pyarrow.fs as pafs

    from packtool.config import PackConfig
    from packtool.formats.manifest import read_manifest
    from packtool.loader import PackedIterableDataset
    from packtool.pipeline import run_pack

    out = work / f"packed-{C}"
    run_pack(PackConfig(inputs=(str(src),), output=str(out), capacity=C,
                        row_group_mb=row_group_mb, overwrite=True), progress=False)
    m = read_manifest(out)
    sys.path.insert(0, str(Path(__file__).parent))
    from local_s3 import local_s3

    with local_s3() as url:
        os.environ.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="bench",
                          AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                          AWS_EC2_METADATA_DISABLED="true")
        fs = pafs.S3FileSystem(endpoint_override=url, access_key="bench", secret_key="bench",
                               region="us-east-1", allow_bucket_creation=True)
        fs.create_dir("bench")
        pafs.copy_files(str(out), "bench/packed", destination_filesystem=fs)
        uri = "s3://bench/packed"

        def one_pass(where, **kw):
            def run():
                ds = PackedIterableDataset(where, rank=0, world_size=1, seed=seed, **kw)
                t, c = time.perf_counter(), _cpu()
                n = sum(1 for _ in ds)
                return n, time.perf_counter() - t, _cpu() - c
            return run

        def best(fn, fresh=None):
            wall = cpu = 0.0
            for _ in range(trials):
                if fresh:
                    fresh()
                n, dt, dc = fn()
                wall, cpu = max(wall, n / dt), max(cpu, n / max(dc, 1e-9))
            return {"rows/s": wall, "rows/CPU-s": cpu}

        cache = work / "cache"
        res = {"capacity": C, "rows": m.num_rows, "tokens": m.totals.real_tokens,
               "bytes": sum(s.bytes for s in m.shards), "shards": len(m.shards),
               "load": os.getloadavg()[0]}
        res["local"] = best(one_pass(out))
        res["s3 cold"] = best(one_pass(uri))
        res["s3 cache fill"] = best(one_pass(uri, cache_dir=cache, cache_limit="64G"),
                                    fresh=lambda: shutil.rmtree(cache, ignore_errors=True))
        res["s3 warm"] = best(one_pass(uri, cache_dir=cache, cache_limit="64G"))
        res["load after"] = os.getloadavg()[0]
        return res


def main(argv=None) -> int:
    global MIN_CPU_S
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", default="sample_data", help="tokenized Parquet input")
    ap.add_argument("--capacity", type=int, action="append",
                    help="C (repeatable; default 8192)")
    ap.add_argument("--repeat", type=int, default=4, help="times the input documents repeat")
    ap.add_argument("--row-group-mb", type=float, default=1.0,
                    help="pack's --row-group-mb for the measured output (default: pack's)")
    ap.add_argument("--small-group-mb", type=float, default=0.25,
                    help="--row-group-mb of the second output, for random access")
    ap.add_argument("--batch", type=int, default=8, help="rows per batch")
    ap.add_argument("--trials", type=int, default=2, help="runs per figure (least CPU kept)")
    ap.add_argument("--random-rows", type=int, default=300, help="rows read at random")
    ap.add_argument("--min-cpu", type=float, default=2.0,
                    help="CPU seconds each figure runs for at least")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--store", action="store_true",
                    help="read the output from a local S3 server: cold, cache fill, warm")
    args = ap.parse_args(argv)
    MIN_CPU_S = args.min_cpu
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs")
    results = []
    if args.store:
        with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
            src = make_input(Path(args.input), Path(tmp), args.repeat, args.seed)
            for C in args.capacity or [8192]:
                r = bench_store(src, C, Path(tmp), args.row_group_mb, args.seed, args.trials)
                results.append(r)
                base = r["local"]["rows/CPU-s"]
                print(f"\nC = {C}: {r['rows']:,} rows, {r['tokens'] / 1e6:.1f} M tokens, "
                      f"{r['bytes'] / 2**20:.0f} MiB in {r['shards']} shards; load "
                      f"{r['load']:.1f} -> {r['load after']:.1f}")
                print(f"{'reader':<16}{'rows/s':>10}{'rows/CPU-s':>12}{'CPU x local':>13}")
                for k in ("local", "s3 cold", "s3 cache fill", "s3 warm"):
                    v = r[k]
                    print(f"{k:<16}{v['rows/s']:>10,.0f}{v['rows/CPU-s']:>12,.0f}"
                          f"{base / v['rows/CPU-s']:>13.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        src = make_input(Path(args.input), Path(tmp), args.repeat, args.seed)
        for C in args.capacity or [8192]:
            r = bench_capacity(src, C, Path(tmp), args)
            results.append(r)
            report(r)
    print(f"\nload average after: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
