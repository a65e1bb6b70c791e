"""Local engine vs Ray engine on one synthetic corpus; extra rows from windowing.

Usage:
    python scripts/bench_ray.py [--docs 2000000] [--window-docs 1000000] [--workers N]
                                [--ray-address ADDRESS] [--workdir DIR]

1. Writes (once, then reuses) a synthetic tokenized corpus under ``--workdir``: web-like
   lengths (log-normal, median ~300 tokens, ~5 % over 2048, tail cut at 100 k), random ids below
   131,072, files of ``--docs-per-file`` documents in row groups of 10,000.
2. Packs it with ``--engine local`` and with ``--engine ray`` (the same ``--window-docs``, all
   ``--workers``), prints both times and checks that the shards are byte-identical (sha256 per
   shard from the manifests).
3. Prints the extra rows over ceil(tokens / C): per window (max and sum), in total, and for
   one global plan of the same lengths (what windowing costs), then the same figures for several
   window sizes on ``--lengths-docs`` web-like lengths (plan only, no I/O).

On a cluster, put ``--workdir`` on the shared filesystem and pass ``--ray-address``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.config import PackConfig
from packtool.core.packing import pack_lengths
from packtool.pipeline import run_pack

VOCAB = 131_072


def web_lengths(n: int, seed: int) -> np.ndarray:
    """int64[n] web-like document lengths: log-normal body, median ~300, heavy tail to 100 k."""
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(np.log(300), 1.15, n)
    return np.clip(lengths, 1, 100_000).astype(np.int64)


def make_corpus(root: Path, docs: int, docs_per_file: int, seed: int = 0) -> np.ndarray:
    """Write the corpus (unless ``root/DONE`` exists); return its lengths int64[docs]."""
    lengths = web_lengths(docs, seed)
    if (root / "DONE").is_file() and int((root / "DONE").read_text()) == docs:
        return lengths
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed + 1)
    for i, lo in enumerate(range(0, docs, docs_per_file)):
        part = lengths[lo:lo + docs_per_file]
        offsets = np.zeros(part.size + 1, dtype=np.int64)  # shape: (docs_in_file + 1,)
        np.cumsum(part, out=offsets[1:])
        values = rng.integers(0, VOCAB, int(offsets[-1]), dtype=np.int32)
        arr = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(pa.table({"input_ids": arr}), root / f"shard-{i:05d}.parquet",
                       row_group_size=10_000, compression="zstd")
    (root / "DONE").write_text(str(docs))
    return lengths


def extra_rows_for_windows(lengths: np.ndarray, capacity: int, window_docs: int) -> dict:
    """Plan-only figures of windows of exactly ``window_docs`` consecutive documents."""
    rows = per_window_max = per_window_sum = 0
    for lo in range(0, lengths.size, window_docs):
        p = pack_lengths(lengths[lo:lo + window_docs], capacity)
        extra = p.num_rows - -(-int(p.seg_len.sum()) // capacity)
        rows += p.num_rows
        per_window_max = max(per_window_max, extra)
        per_window_sum += extra
    bound = -(-int(lengths.sum()) // capacity)
    return {"windows": -(-lengths.size // window_docs), "rows": rows,
            "extra_total": rows - bound, "extra_in_windows": per_window_sum,
            "extra_max_window": per_window_max}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=2_000_000, help="documents in the corpus")
    ap.add_argument("--docs-per-file", type=int, default=100_000)
    ap.add_argument("--window-docs", type=int, default=250_000)
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ray-address", default=None, help="Ray cluster (default: local Ray)")
    ap.add_argument("--workdir", type=Path, default=Path("bench_out/ray"))
    ap.add_argument("--lengths-docs", type=int, default=10_000_000,
                    help="web-like lengths for the plan-only window table (0: skip)")
    args = ap.parse_args()

    t = time.perf_counter()
    lengths = make_corpus(args.workdir / "corpus", args.docs, args.docs_per_file)
    print(f"corpus: {args.docs:,} documents, {int(lengths.sum()):,} tokens "
          f"({time.perf_counter() - t:.1f} s to make or find)")
    results = {}
    for engine in ("local", "ray"):
        out = args.workdir / f"out-{engine}"
        cfg = PackConfig(inputs=(str(args.workdir / "corpus"),), output=str(out),
                         capacity=args.capacity, window_docs=args.window_docs, engine=engine,
                         workers=args.workers, overwrite=True,
                         ray_address=args.ray_address if engine == "ray" else None)
        t = time.perf_counter()
        res = run_pack(cfg, progress=False)
        sec = time.perf_counter() - t
        results[engine] = res
        s = res.stats
        ws = res.manifest.windows
        print(f"{engine:5s}: {sec:7.2f} s  {s.tokens_in / sec / 1e6:6.1f} M tokens/s  "
              f"{s.rows:,} rows in {len(ws)} windows, {len(res.manifest.shards)} shards")
    same = results["local"].manifest.shards == results["ray"].manifest.shards
    print(f"byte-identical shards (sha256 per shard): {same}")
    s = results["local"].stats
    ws = results["local"].manifest.windows
    glob = pack_lengths(lengths, args.capacity)
    glob_extra = glob.num_rows - s.lower_bound_rows
    print(f"extra rows over ceil(tokens/C) = {s.lower_bound_rows:,}: per window "
          f"{[w.extra_rows for w in ws]}, total {s.extra_rows} "
          f"({100 * s.extra_rows / s.lower_bound_rows:.4f} %); one global plan: {glob_extra}")
    if args.lengths_docs:
        big = web_lengths(args.lengths_docs, 7)
        print(f"\nplan only, {args.lengths_docs:,} web-like lengths, C = {args.capacity}:")
        print("| window docs | windows | rows | extra rows total | % of rows "
              "| max extra in a window |")
        print("|---|---|---|---|---|---|")
        for w in (10_000, 100_000, 250_000, 1_000_000, args.lengths_docs):
            f = extra_rows_for_windows(big, args.capacity, w)
            print(f"| {w:,} | {f['windows']:,} | {f['rows']:,} | {f['extra_total']:,} | "
                  f"{100 * f['extra_total'] / f['rows']:.4f} | {f['extra_max_window']} |")


if __name__ == "__main__":
    main()
