"""Read throughput of packtool.loader beside the simplest alternatives, side by side in one run.

For each capacity C, packs INPUT (default ``sample_data/``) into a temporary directory, writes a
flat NumPy memmap of the same per-token columns (``input_ids``, ``segment_ids``,
``position_ids``; int32 [N, C] each), then measures rows/s:

- ``loader sequential``: ``PackedIterableDataset(shuffle=False)`` on one process;
- ``loader shuffled``: the training order (row groups shuffled, bounded shuffle window);
- ``loader random``: ``PackedDataset[i]`` at random ``i`` (one row-group decode per row);
- ``DataLoader w=0`` / ``w=2``: the shuffled dataset through ``torch.utils.data.DataLoader``
  with ``collate``, 0 and 2 worker processes;
- ``pyarrow row groups``: ``ParquetFile.read_row_group`` of every group to NumPy [R, C];
- ``memmap sequential`` / ``memmap random``: rows copied out of the memmap;
- ``per rank W``: rows/s of each simulated rank of W = 1, 2, 8 (each rank run alone, in turn,
  with 0 and 2 workers), the mean and the minimum over ranks.

Ratios to the memmap's sequential figure are printed next to each figure (the machine is shared:
compare ratios of one run, not absolute times across runs). ``--json FILE`` writes the figures.

Usage: python scripts/bench_loader.py [--input sample_data] [--capacity 2048 --capacity 8192]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOKEN_COLS = ("input_ids", "segment_ids", "position_ids")


def rate(fn) -> tuple[float, int]:
    """(rows/s, rows) of ``fn()``, which returns the number of rows it read."""
    t = time.perf_counter()
    n = fn()
    return n / max(time.perf_counter() - t, 1e-9), n


def bench_capacity(src: Path, C: int, work: Path, random_rows: int, seed: int) -> dict:
    import pyarrow.parquet as pq
    import torch

    from packtool.loader import PackedDataset, PackedIterableDataset, collate

    out = work / f"packed-{C}"
    subprocess.run([sys.executable, "-m", "packtool", "pack", "-q", "--overwrite",
                    "--capacity", str(C), str(src), str(out)], check=True)
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
        def run():
            d = PackedIterableDataset(out, rank=rank, world_size=world, columns=cols)
            dl = torch.utils.data.DataLoader(d, batch_size=8, collate_fn=collate,
                                             num_workers=workers)
            return sum(b["input_ids"].shape[0] for b in dl)
        return run

    def random_access():
        d = PackedDataset(out, columns=cols)
        for i in picks:
            d[int(i)]
        return len(picks)

    def arrow_groups():
        n = 0
        for name in ds.index.files:
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

    res = {"capacity": C, "rows": N, "row_groups": ds.index.num_row_groups}
    res["memmap sequential"] = rate(memmap(range(N)))[0]
    res["memmap random"] = rate(memmap(picks))[0]
    res["pyarrow row groups"] = rate(arrow_groups)[0]
    res["loader sequential"] = rate(loader(False))[0]
    res["loader shuffled"] = rate(loader(True))[0]
    res["loader random"] = rate(random_access)[0]
    res["DataLoader w=0"] = rate(dataloader(0))[0]
    res["DataLoader w=2"] = rate(dataloader(2))[0]
    for W in (1, 2, 8):
        for workers in (0, 2):
            per = [rate(dataloader(workers, r, W))[0] for r in range(W)]
            res[f"per rank W={W} w={workers} mean"] = float(np.mean(per))
            res[f"per rank W={W} w={workers} min"] = float(np.min(per))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", default="sample_data", help="tokenized Parquet input")
    ap.add_argument("--capacity", type=int, action="append", help="C (repeatable; "
                    "default 2048 and 8192)")
    ap.add_argument("--random-rows", type=int, default=200, help="rows read at random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        for C in args.capacity or [2048, 8192]:
            r = bench_capacity(Path(args.input), C, Path(tmp), args.random_rows, args.seed)
            results.append(r)
            base = r["memmap sequential"]
            print(f"\nC = {C}: {r['rows']} rows in {r['row_groups']} row groups")
            print(f"{'reader':<34}{'rows/s':>12}{'x memmap seq':>14}")
            for k, v in r.items():
                if k in ("capacity", "rows", "row_groups"):
                    continue
                print(f"{k:<34}{v:>12,.0f}{v / base:>14.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
