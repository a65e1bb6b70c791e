"""Read throughput of packtool.loader beside the simplest alternatives, side by side in one run.

For each capacity C, packs INPUT (default: ``sample_data/``'s real Tekken ids, its documents
repeated ``--repeat`` times, shuffled) into a temporary directory with row groups of about
``--group-mb`` MiB per per-token column (``rows_per_group = group_mb * 2**20 // (4 * C)``), writes
a flat NumPy memmap of the same per-token columns (``input_ids``, ``segment_ids``,
``position_ids``; int32 [N, C] each), then measures rows/s (each figure the best of
``--trials`` runs):

- ``loader sequential``: ``PackedIterableDataset(shuffle=False)`` on one process;
- ``loader shuffled``: the training order (row groups shuffled, bounded shuffle window);
- ``loader random``: ``PackedDataset[i]`` at random ``i`` (one row-group decode per row);
- ``DataLoader w=0`` / ``w=2``: the shuffled dataset through ``torch.utils.data.DataLoader``
  with ``collate`` (batch 8), 0 and 2 worker processes, counted from the first batch on (worker
  start-up, paid once per epoch, is left out);
- ``pyarrow row groups``: ``ParquetFile.read_row_group`` of every group to NumPy [R, C];
- ``memmap sequential`` / ``memmap random``: rows copied out of the memmap;
- ``per rank W``: rows/s of each simulated rank of W = 1, 2, 8 (each rank run alone, in turn,
  with 0 and 2 workers), the mean and the minimum over ranks.

Ratios to the memmap's sequential figure are printed next to each figure (the machine is shared:
compare ratios of one run, not absolute times across runs). ``--json FILE`` writes the figures.

``--store`` measures instead the same output read from an S3-compatible server started on
127.0.0.1 (moto, the ``dev`` extra), beside the local directory, in rows per second and rows per
CPU-second of the reading process (user + sys of all its threads; the server's own CPU is the
store's, not the reader's): ``local``, ``s3 cold`` (no cache: every row group fetched with
ranged reads), ``s3 cache fill`` (first pass with an empty cache: whole shards downloaded) and
``s3 warm`` (the cache already holds them: a restart). Each figure is one pass of the shuffled
training order (``PackedIterableDataset``, all columns an item carries), best of ``--trials``.

Usage: python scripts/bench_loader.py [--input sample_data] [--capacity 2048 --capacity 8192]
       python scripts/bench_loader.py --store --capacity 8192 --repeat 11   # >= 30 M tokens
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOKEN_COLS = ("input_ids", "segment_ids", "position_ids")


TRIALS = 2


def rate(fn) -> float:
    """Best rows/s of ``TRIALS`` calls of ``fn()``, which returns the rows it read, or
    (rows, seconds) when it times itself."""
    best = 0.0
    for _ in range(TRIALS):
        t = time.perf_counter()
        r = fn()
        n, dt = r if isinstance(r, tuple) else (r, time.perf_counter() - t)
        best = max(best, n / max(dt, 1e-9))
    return best


def make_input(src: Path, work: Path, repeat: int, seed: int) -> Path:
    """``src``'s documents (real token ids) ``repeat`` times, shuffled, as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f, columns=["input_ids"]) for f in sorted(src.rglob("*.parquet"))]
    docs = pa.concat_tables([t.cast(pa.schema([("input_ids", pa.list_(pa.int32()))]))
                             for t in tables]).column("input_ids").combine_chunks()
    order = np.random.default_rng(seed).permutation(np.tile(np.arange(len(docs)), repeat))
    d = work / "input"
    d.mkdir()
    pq.write_table(pa.table({"input_ids": docs.take(pa.array(order))}), d / "docs.parquet")
    return d


def bench_capacity(src: Path, C: int, work: Path, random_rows: int, seed: int,
                   group_mb: float) -> dict:
    import pyarrow.parquet as pq
    import torch

    from packtool.config import PackConfig
    from packtool.loader import PackedDataset, PackedIterableDataset, collate
    from packtool.pipeline import run_pack

    out = work / f"packed-{C}"
    rows_per_group = max(1, int(group_mb * 2**20) // (4 * C))
    run_pack(PackConfig(inputs=(str(src),), output=str(out), capacity=C,
                        rows_per_group=rows_per_group, overwrite=True), progress=False)
    ds = PackedDataset(out)
    N = len(ds)
    mm = {}
    for c in TOKEN_COLS:  # the flat memmap alternative: int32 [N, C] per column
        arr = np.lib.format.open_memmap(work / f"{c}-{C}.npy", mode="w+", dtype=np.int32,
                                        shape=(N, C))
        for i, it in enumerate(PackedIterableDataset(out, rank=0, world_size=1, shuffle=False,
                                                     columns=list(TOKEN_COLS))):
            arr[i] = it[c]
        arr.flush()
        del arr
        mm[c] = np.load(work / f"{c}-{C}.npy", mmap_mode="r")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, N, min(random_rows, N))
    cols = list(TOKEN_COLS) + ["labels", "cu_seqlens"]

    def loader(shuffle, **kw):
        return lambda: sum(1 for _ in PackedIterableDataset(out, rank=0, world_size=1,
                                                            shuffle=shuffle, columns=cols, **kw))

    def dataloader(workers, rank=0, world=1):
        def run():  # rows and seconds from the first batch on
            d = PackedIterableDataset(out, rank=rank, world_size=world, columns=cols)
            dl = iter(torch.utils.data.DataLoader(d, batch_size=8, collate_fn=collate,
                                                  num_workers=workers))
            next(dl)
            t, n = time.perf_counter(), 0
            for b in dl:
                n += b["input_ids"].shape[0]
            return n, time.perf_counter() - t
        return run

    def random_access():
        d = PackedDataset(out, columns=cols)
        for i in picks:
            d[int(i)]
        return len(picks)

    def arrow_groups():
        n = 0
        for name in ds.output.shards:
            f = pq.ParquetFile(out / name)
            for g in range(f.num_row_groups):
                t = f.read_row_group(g, columns=list(TOKEN_COLS))
                for c in TOKEN_COLS:
                    col = t.column(c).combine_chunks()
                    col.flatten().to_numpy().reshape(len(col), C)
                n += t.num_rows
        return n

    def memmap(order):
        def run():
            for i in order:
                for c in TOKEN_COLS:
                    np.array(mm[c][int(i)])
            return len(order)
        return run

    res = {"capacity": C, "rows": N, "row_groups": ds.output.num_row_groups,
           "rows_per_group": rows_per_group}
    res["memmap sequential"] = rate(memmap(range(N)))
    res["memmap random"] = rate(memmap(picks))
    res["pyarrow row groups"] = rate(arrow_groups)
    res["loader sequential"] = rate(loader(False))
    res["loader shuffled"] = rate(loader(True))
    res["loader random"] = rate(random_access)
    res["DataLoader w=0"] = rate(dataloader(0))
    res["DataLoader w=2"] = rate(dataloader(2))
    for W in (1, 2, 8):
        for workers in (0, 2):
            per = [rate(dataloader(workers, r, W)) for r in range(W)]
            res[f"per rank W={W} w={workers} mean"] = float(np.mean(per))
            res[f"per rank W={W} w={workers} min"] = float(np.min(per))
    return res


def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench_store(src: Path, C: int, work: Path, group_mb: float, seed: int) -> dict:
    """rows/s and rows/CPU-s of one training pass: local, S3 cold, S3 cache fill, S3 warm."""
    import os
    import shutil

    import pyarrow.fs as pafs

    from packtool.config import PackConfig
    from packtool.formats.manifest import read_manifest
    from packtool.loader import PackedIterableDataset
    from packtool.pipeline import run_pack

    out = work / f"packed-{C}"
    rows_per_group = max(1, int(group_mb * 2**20) // (4 * C))
    run_pack(PackConfig(inputs=(str(src),), output=str(out), capacity=C,
                        rows_per_group=rows_per_group, overwrite=True), progress=False)
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
            for _ in range(TRIALS):
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", default="sample_data", help="tokenized Parquet input")
    ap.add_argument("--capacity", type=int, action="append", help="C (repeatable; "
                    "default 2048 and 8192)")
    ap.add_argument("--repeat", type=int, default=4, help="times the input documents repeat")
    ap.add_argument("--group-mb", type=float, default=2.0,
                    help="MiB per per-token column in one row group")
    ap.add_argument("--trials", type=int, default=2, help="runs per figure (best kept)")
    ap.add_argument("--random-rows", type=int, default=200, help="rows read at random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--store", action="store_true",
                    help="read the output from a local S3 server: cold, cache fill, warm")
    args = ap.parse_args(argv)
    global TRIALS
    TRIALS = args.trials
    results = []
    if args.store:
        with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
            src = make_input(Path(args.input), Path(tmp), args.repeat, args.seed)
            for C in args.capacity or [8192]:
                r = bench_store(src, C, Path(tmp), args.group_mb, args.seed)
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
        for C in args.capacity or [2048, 8192]:
            r = bench_capacity(src, C, Path(tmp), args.random_rows, args.seed, args.group_mb)
            results.append(r)
            base = r["memmap sequential"]
            print(f"\nC = {C}: {r['rows']} rows in {r['row_groups']} row groups of "
                  f"{r['rows_per_group']} rows")
            print(f"{'reader':<34}{'rows/s':>12}{'x memmap seq':>14}")
            for k, v in r.items():
                if k in ("capacity", "rows", "row_groups", "rows_per_group"):
                    continue
                print(f"{k:<34}{v:>12,.0f}{v / base:>14.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
