"""Time ``packtool pack`` against the Parquet I/O floor on a synthetic tokenized corpus.

The corpus: web-like document lengths (log-normal, median 300, sigma 1.17, about 5 % over 2048,
clipped at 100 k), token ids uniform in 0..vocab-1 (int32 lists), ``--files`` Parquet files.
Two copies are made: the full corpus and its first half (same seed), so peak RSS at half and
full size can be compared.

Measurements, each in a fresh subprocess (clean peak RSS, read from ``VmHWM``):

- ``floor``: pyarrow reads the input token column (every file, all row groups) plus pyarrow
  writes, from memory, tables with exactly packtool's output schema, row count, row groups and
  per-column encodings (the packed output itself, loaded before the clock starts): the decode +
  encode cost any packer must pay. Run with 1 and with all threads.
- ``pack``: :func:`packtool.pipeline.run_pack` with ``workers`` = 1 and all cores.

Printed: seconds, ratio pack / floor, tokens/s, output bytes per token, peak RSS; and peak RSS
of ``pack`` (all workers) on the half corpus. ``--encodings`` also compares Parquet encodings
per column on one output shard (size and write time).

Usage: ``python scripts/bench_pipeline.py [--tokens 50e6] [--quick]``; writes
``bench_pipeline.json`` and ``bench_pipeline.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_corpus(folder: Path, tokens: int, vocab: int, files: int, seed: int = 0) -> dict:
    """Write ``files`` Parquet shards of about ``tokens`` tokens; return counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    per_file = tokens // files
    n_docs = n_tok = 0
    for k in range(files):
        lengths = np.clip(np.rint(rng.lognormal(np.log(300), 1.17, per_file // 300 + 64)), 1,
                          100_000).astype(np.int64)
        cut = int(np.searchsorted(np.cumsum(lengths), per_file)) + 1
        lengths = lengths[:cut]
        values = rng.integers(0, vocab, int(lengths.sum()), dtype=np.int32)
        offsets = np.zeros(lengths.size + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        col = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(pa.table({"input_ids": col}), folder / f"input-{k:03d}.parquet",
                       row_group_size=8192, compression="zstd")
        n_docs += lengths.size
        n_tok += values.size
    return {"docs": n_docs, "tokens": n_tok}


def _status() -> dict:
    """Fields of /proc/self/status in bytes (VmHWM, VmRSS, RssAnon, RssFile)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def _peak_rss() -> int:
    return _status().get("VmHWM", 0)


class _AnonPeak:
    """Samples RssAnon every 10 ms: the peak of private memory, without the page cache of
    memory-mapped files (the spill file's pages are file-backed and reclaimable)."""

    def __enter__(self):
        import threading

        self.peak, self._stop = 0, threading.Event()

        def loop():
            while not self._stop.wait(0.01):
                self.peak = max(self.peak, _status().get("RssAnon", 0))

        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def child_pack(inp: str, out: str, workers: int, capacity: int) -> dict:
    from packtool.config import PackConfig
    from packtool.pipeline import run_pack

    cfg = PackConfig(inputs=(inp,), output=out, capacity=capacity, workers=workers,
                     overwrite=True)
    with _AnonPeak() as anon:
        t = time.perf_counter()
        res = run_pack(cfg, progress=False)
        secs = time.perf_counter() - t
    out_bytes = sum(p.stat().st_size for p in Path(out).glob("part-*.parquet"))
    return {"seconds": secs, "peak_rss": _peak_rss(), "peak_anon": anon.peak,
            "out_bytes": out_bytes, "rows": res.stats.rows, "tokens": res.stats.real_tokens,
            "docs": res.stats.docs_in}


def child_floor(inp: str, packed: str, workers: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.formats.writer import column_encodings

    pa.set_cpu_count(workers)
    pa.set_io_thread_count(workers)
    shards = sorted(Path(packed).glob("part-*.parquet"))
    # what packtool writes, loaded first: tables with its schema, row groups and row count
    tables = []
    for p in shards:
        f = pq.ParquetFile(p)
        tables.append([f.read_row_group(i) for i in range(f.num_row_groups)])
    inputs = sorted(Path(inp).glob("*.parquet"))
    tmp = Path(tempfile.mkdtemp(dir=Path(packed).parent))

    def write(k):
        groups = tables[k]
        schema = groups[0].schema
        enc = column_encodings(schema)
        with pq.ParquetWriter(tmp / f"floor-{k:05d}.parquet", schema, compression="zstd",
                              use_dictionary=False, column_encoding=enc,
                              write_statistics=False) as w:
            for g in groups:
                w.write_table(g, row_group_size=max(1, g.num_rows))

    t = time.perf_counter()
    n_tok = 0
    for p in inputs:
        col = pq.read_table(p, columns=["input_ids"]).column(0)
        n_tok += sum(len(c.values) for c in col.chunks)
    t_read = time.perf_counter() - t
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(write, range(len(tables))))
    secs = time.perf_counter() - t
    shutil.rmtree(tmp)
    return {"seconds": secs, "read_seconds": t_read, "write_seconds": secs - t_read,
            "peak_rss": _peak_rss(), "tokens": n_tok}


def child_encodings(packed: str) -> dict:
    """Size and write time of one output shard under alternative per-column encodings."""
    import pyarrow.parquet as pq

    from packtool.formats.writer import column_encodings

    shard = sorted(Path(packed).glob("part-*.parquet"))[0]
    table = pq.read_table(shard)
    base = column_encodings(table.schema)

    def leaf(col):
        return f"{col}.list.element"

    variants = {"current": base, "all PLAIN": {}}
    for col in ("input_ids", "labels", "segment_ids", "position_ids", "cu_seqlens", "doc_ids",
                "doc_offsets"):
        if col not in table.schema.names:
            continue
        for e in ("PLAIN", "DELTA_BINARY_PACKED", "BYTE_STREAM_SPLIT"):
            enc = {k: v for k, v in base.items() if k != leaf(col)}
            if e != "PLAIN":
                enc[leaf(col)] = e
            if enc != base:
                variants[f"{col}={e}"] = enc
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, enc in variants.items():
            path = Path(d) / "x.parquet"
            t = time.perf_counter()
            try:
                pq.write_table(table, path, compression="zstd", use_dictionary=False,
                               column_encoding=enc, write_statistics=False,
                               row_group_size=1024)
            except Exception as exc:  # an encoding pyarrow refuses for this type
                out[name] = {"error": str(exc)[:80]}
                continue
            secs = time.perf_counter() - t
            md = pq.ParquetFile(path).metadata
            per_col = {}
            for rg in range(md.num_row_groups):
                for ci in range(md.num_columns):
                    c = md.row_group(rg).column(ci)
                    name_c = c.path_in_schema.split(".")[0]
                    per_col[name_c] = per_col.get(name_c, 0) + c.total_compressed_size
            out[name] = {"bytes": path.stat().st_size, "seconds": secs, "columns": per_col,
                         "encodings": list(md.row_group(0).column(0).encodings)}
    return out


def _spawn(*args) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(args)],
                          capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(proc.stderr[-2000:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=float, default=50e6, help="corpus size in tokens")
    ap.add_argument("--vocab", type=int, default=131_072)
    ap.add_argument("--files", type=int, default=8, help="input Parquet files (even)")
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="'all' workers")
    ap.add_argument("--quick", action="store_true", help="5 M tokens")
    ap.add_argument("--encodings", action="store_true", help="also compare column encodings")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--out", default=str(ROOT / "bench_results"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        fn = {"pack": child_pack, "floor": child_floor, "enc": child_encodings}[kind]
        print("RESULT " + json.dumps(fn(*rest)))
        return
    tokens = int(5e6 if args.quick else args.tokens)
    work = Path(args.work or tempfile.mkdtemp(prefix="packtool-bench-"))
    full, half = work / "full", work / "half"
    t = time.perf_counter()
    corpus = make_corpus(full, tokens, args.vocab, args.files)
    half.mkdir(parents=True, exist_ok=True)
    for p in sorted(full.glob("*.parquet"))[:args.files // 2]:
        shutil.copy(p, half / p.name)
    print(f"corpus: {corpus['docs']:,} documents, {corpus['tokens']:,} tokens, "
          f"{sum(p.stat().st_size for p in full.glob('*.parquet')) / 2**20:.0f} MiB "
          f"({time.perf_counter() - t:.1f} s to make)", flush=True)
    results = {"corpus": corpus, "capacity": args.capacity, "runs": []}
    lines = ["| run | workers | seconds | ratio to floor | tokens/s | out bytes/token | "
             "peak RSS MiB |", "|---|---|---|---|---|---|---|"]
    print(lines[0] + "\n" + lines[1], flush=True)
    for w in sorted({1, args.workers}):
        packed = work / f"out-w{w}"
        pack = _spawn("pack", str(full), str(packed), w, args.capacity)
        floor = _spawn("floor", str(full), str(packed), w)
        ratio = pack["seconds"] / floor["seconds"]
        for name, r in (("floor (read + write)", floor), ("packtool pack", pack)):
            row = (f"| {name} | {w} | {r['seconds']:.2f} | "
                   f"{ratio if name.startswith('packtool') else 1.0:.2f} | "
                   f"{corpus['tokens'] / r['seconds'] / 1e6:.1f} M | "
                   f"{pack['out_bytes'] / corpus['tokens']:.3f} | {r['peak_rss'] / 2**20:.0f} |")
            lines.append(row)
            print(row, flush=True)
        results["runs"].append({"workers": w, "pack": pack, "floor": floor, "ratio": ratio})
    w = args.workers
    half_pack = _spawn("pack", str(half), str(work / "out-half"), w, args.capacity)
    full_rss = [r for r in results["runs"] if r["workers"] == w][0]["pack"]["peak_rss"]
    results["rss_half"], results["rss_full"] = half_pack["peak_rss"], full_rss
    half_anon = half_pack["peak_anon"]
    full_anon = [r for r in results["runs"] if r["workers"] == w][0]["pack"]["peak_anon"]
    extra_docs = corpus["docs"] - half_pack["docs"]
    rss = (f"pack, workers={w}: peak RSS half corpus {half_pack['peak_rss'] / 2**20:.0f} MiB, "
           f"full {full_rss / 2**20:.0f} MiB; peak private (anonymous) RSS half "
           f"{half_anon / 2**20:.0f} MiB, full {full_anon / 2**20:.0f} MiB "
           f"(+{(full_anon - half_anon) / 2**20:.0f} MiB for +{extra_docs:,} documents, "
           f"{(full_anon - half_anon) / max(extra_docs, 1):.0f} B/document)")
    results["anon_half"], results["anon_full"] = half_anon, full_anon
    print(rss)
    if args.encodings:
        enc = _spawn("enc", str(work / f"out-w{w}"))
        results["encodings"] = enc
        cur = enc["current"]["bytes"]
        print("| encoding variant | shard bytes | vs current | write s |\n|---|---|---|---|")
        for name, e in enc.items():
            if "error" in e:
                print(f"| {name} | {e['error']} | | |")
            else:
                print(f"| {name} | {e['bytes']:,} | {e['bytes'] / cur - 1:+.1%} | "
                      f"{e['seconds']:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_pipeline.json").write_text(json.dumps(results, indent=1))
    (out / "bench_pipeline.md").write_text("\n".join(lines) + "\n\n" + rss + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
