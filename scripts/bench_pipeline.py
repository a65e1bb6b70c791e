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
- ``pack``: :func:`packtool.pipeline.run_pack` with ``workers`` = 1 and all cores; with
  ``--window-docs N`` also with windows of N documents (all cores).
- ``--baseline TREE``: the same ``pack`` runs with the packtool source tree TREE (e.g. the
  previous commit, ``git archive <rev> packtool | tar -x -C TREE``), side by side in the same
  run, so "before" and "after" ratios to the floor share the machine's load.

Every ``pack`` child runs under ``/usr/bin/time -v`` when it exists: its "Maximum resident set
size" (file-backed pages of memory maps included, what a container's memory accounting sees) is
reported beside the private (anonymous) peak sampled inside.

Printed: seconds, ratio pack / floor (median over ``--repeat`` rounds, and each round's
ratio, so two trees can be compared round by round), tokens/s, output bytes per token, peak
RSS; and peak RSS of ``pack`` (all workers) on the half corpus. ``--scaling`` packs corpora
of 1x, 2x and 4x ``--tokens`` and prints peak RSS against corpus size (for each tree).
``--encodings`` also compares Parquet encodings per column on one output shard (size and write
time).

Usage: ``python scripts/bench_pipeline.py [--tokens 50e6] [--quick] [--window-docs 20000]
[--baseline TREE] [--scaling]``; writes ``bench_pipeline.json`` and ``bench_pipeline.md`` into
``--out``.
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
#: source tree of the packtool measured by a child (``--baseline`` sets another one)
TREE_ENV = "PACKTOOL_BENCH_TREE"
sys.path.insert(0, os.environ.get(TREE_ENV, str(ROOT)))
TIME = "/usr/bin/time"


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


def child_pack(inp: str, out: str, workers: int, capacity: int,
               window_docs: int | None = None) -> dict:
    from packtool.config import PackConfig
    from packtool.pipeline import run_pack

    cfg = PackConfig(inputs=(inp,), output=out, capacity=capacity, workers=workers,
                     overwrite=True, window_docs=window_docs)
    with _AnonPeak() as anon:
        t = time.perf_counter()
        res = run_pack(cfg, progress=False)
        secs = time.perf_counter() - t
    shutil.rmtree(out, ignore_errors=True)  # the shards are not needed again
    out_bytes = res.manifest and sum(o.bytes for o in res.manifest.shards)
    return {"seconds": secs, "peak_rss": _peak_rss(), "peak_anon": anon.peak,
            "out_bytes": out_bytes, "rows": res.stats.rows, "tokens": res.stats.real_tokens,
            "docs": res.stats.docs_in}


def child_pack_keep(inp: str, out: str, workers: int, capacity: int) -> dict:
    """A pack whose shards stay (the floor rewrites them); not timed."""
    from packtool.config import PackConfig
    from packtool.pipeline import run_pack

    run_pack(PackConfig(inputs=(inp,), output=out, capacity=capacity, workers=workers,
                        overwrite=True), progress=False)
    return {}


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


def _spawn(*args, tree: str | None = None) -> dict:
    """Run ``--child args`` in a fresh process (with ``tree`` as packtool's source when given),
    under ``/usr/bin/time -v`` when it exists; its maximum RSS lands in ``time_maxrss``."""
    env = dict(os.environ)
    if tree:
        env[TREE_ENV] = tree
    cmd = [sys.executable, __file__, "--child", json.dumps(args)]
    timed = os.path.exists(TIME)
    proc = subprocess.run(([TIME, "-v"] if timed else []) + cmd, capture_output=True, text=True,
                          env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            for err in proc.stderr.splitlines():
                if "Maximum resident set size" in err:
                    res["time_maxrss"] = int(err.rsplit(":", 1)[1]) * 1024
            return res
    raise RuntimeError(proc.stderr[-2000:])


def _median(runs: list[dict]) -> dict:
    """The run with the median seconds (the others' seconds kept in ``all_seconds``)."""
    runs = sorted(runs, key=lambda r: r["seconds"])
    return {**runs[len(runs) // 2], "all_seconds": [r["seconds"] for r in runs]}


def _warm(tree: str | None, work: Path) -> None:
    """Compile (or load) the tree's kernels once, outside any measurement."""
    tiny = work / "warm-in"
    if not tiny.exists():
        make_corpus(tiny, 200_000, 1000, 1)
    _spawn("pack", str(tiny), str(work / "warm-out"), 1, 2048, tree=tree)


def scaling(args, work: Path, trees: dict) -> list[str]:
    """Peak RSS (time -v and private) of pack on 1x, 2x, 4x the corpus, for each tree."""
    lines = ["| tree | tokens | documents | seconds | max RSS (time -v) MiB | private peak MiB |",
             "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for k in (1, 2, 4):
        folder = work / f"scale-{k}"
        corpus = make_corpus(folder, int(args.tokens) * k, args.vocab, args.files * k)
        for label, tree in trees.items():
            r = _spawn("pack", str(folder), str(work / "scale-out"), args.workers,
                       args.capacity, tree=tree)
            row = (f"| {label} | {corpus['tokens']:,} | {corpus['docs']:,} | {r['seconds']:.1f}"
                   f" | {r.get('time_maxrss', r['peak_rss']) / 2**20:.0f} | "
                   f"{r['peak_anon'] / 2**20:.0f} |")
            lines.append(row)
            print(row, flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=float, default=50e6, help="corpus size in tokens")
    ap.add_argument("--vocab", type=int, default=131_072)
    ap.add_argument("--files", type=int, default=8, help="input Parquet files (even)")
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="'all' workers")
    ap.add_argument("--quick", action="store_true", help="5 M tokens")
    ap.add_argument("--encodings", action="store_true", help="also compare column encodings")
    ap.add_argument("--window-docs", type=int, default=None, metavar="N",
                    help="also pack with windows of N documents (all workers)")
    ap.add_argument("--baseline", default=None, metavar="TREE",
                    help="also run pack from this packtool source tree (before/after)")
    ap.add_argument("--repeat", type=int, default=1, metavar="K",
                    help="run the floor and each pack K times, trees interleaved; report medians")
    ap.add_argument("--scaling", action="store_true",
                    help="peak RSS on 1x, 2x, 4x --tokens (each tree)")
    ap.add_argument("--scaling-only", action="store_true", help="only the --scaling table")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--out", default=str(ROOT / "bench_results"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        fn = {"pack": child_pack, "pack-keep": child_pack_keep, "floor": child_floor,
              "enc": child_encodings}[kind]
        print("RESULT " + json.dumps(fn(*rest)))
        return
    tokens = int(5e6 if args.quick else args.tokens)
    work = Path(args.work or tempfile.mkdtemp(prefix="packtool-bench-"))
    if args.scaling_only:
        trees = {"this tree": None}
        if args.baseline:
            trees = {"baseline": str(Path(args.baseline).resolve()), "this tree": None}
        work.mkdir(parents=True, exist_ok=True)
        for tree in trees.values():
            _warm(tree, work)
        lines = scaling(args, work, trees)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_pipeline_scaling.md").write_text("\n".join(lines) + "\n")
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        return
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
    trees = {"this tree": None}
    if args.baseline:
        trees = {"baseline": str(Path(args.baseline).resolve()), "this tree": None}
    for tree in trees.values():
        _warm(tree, work)
    lines = ["| run | workers | seconds | ratio to floor | tokens/s | out bytes/token | "
             "max RSS (time -v) MiB |", "|---|---|---|---|---|---|---|"]
    print(lines[0] + "\n" + lines[1], flush=True)
    configs = [(w, None) for w in sorted({1, args.workers})]
    if args.window_docs:
        configs.append((args.workers, args.window_docs))
    for w, wd in configs:
        floor_dir = work / f"floor-w{w}"
        if not floor_dir.exists():  # the floor writes what an unwindowed pack writes
            child_out = work / "floor-src"
            _spawn("pack-keep", str(full), str(child_out), w, args.capacity)
            child_out.rename(floor_dir)
        packs: dict = {label: [] for label in trees}
        floors = []
        for _ in range(args.repeat):  # interleaved, so the machine's load hits all alike
            floors.append(_spawn("floor", str(full), str(floor_dir), w))
            for label, tree in trees.items():
                packs[label].append(_spawn("pack", str(full), str(work / "out"), w,
                                           args.capacity, wd, tree=tree))
        floor = _median(floors)
        row = (f"| floor (read + write) | {w} | {floor['seconds']:.2f} | 1.00 | "
               f"{corpus['tokens'] / floor['seconds'] / 1e6:.1f} M | | "
               f"{floor.get('time_maxrss', floor['peak_rss']) / 2**20:.0f} |")
        lines.append(row)
        print(row, flush=True)
        for label in trees:
            pack = _median(packs[label])
            ratios = [p["seconds"] / f["seconds"] for p, f in zip(packs[label], floors)]
            ratio = float(np.median(ratios))
            name = f"pack, {label}" + (f", --window-docs {wd:,}" if wd else "")
            row = (f"| {name} | {w} | {pack['seconds']:.2f} | {ratio:.2f} "
                   f"({', '.join(f'{x:.1f}' for x in pack['all_seconds'])} s) | "
                   f"{corpus['tokens'] / pack['seconds'] / 1e6:.1f} M | "
                   f"{pack['out_bytes'] / corpus['tokens']:.3f} | "
                   f"{pack.get('time_maxrss', pack['peak_rss']) / 2**20:.0f} |")
            lines.append(row)
            print(row, flush=True)
            results["runs"].append({"workers": w, "window_docs": wd, "tree": label,
                                    "pack": pack, "floor": floor, "ratio": ratio,
                                    "ratios": ratios})
            print(f"  per-repeat ratios ({label}): "
                  + ", ".join(f"{x:.2f}" for x in ratios), flush=True)
    w = args.workers
    half_pack = _spawn("pack", str(half), str(work / "out-half"), w, args.capacity)
    mine = [r for r in results["runs"] if r["workers"] == w and r["tree"] == "this tree"
            and not r["window_docs"]][0]["pack"]
    full_rss = mine.get("time_maxrss", mine["peak_rss"])
    results["rss_half"] = half_pack.get("time_maxrss", half_pack["peak_rss"])
    results["rss_full"] = full_rss
    half_anon = half_pack["peak_anon"]
    full_anon = mine["peak_anon"]
    extra_docs = corpus["docs"] - half_pack["docs"]
    rss = (f"pack, workers={w}: peak RSS half corpus {results['rss_half'] / 2**20:.0f} MiB, "
           f"full {full_rss / 2**20:.0f} MiB; peak private (anonymous) RSS half "
           f"{half_anon / 2**20:.0f} MiB, full {full_anon / 2**20:.0f} MiB "
           f"(+{(full_anon - half_anon) / 2**20:.0f} MiB for +{extra_docs:,} documents, "
           f"{(full_anon - half_anon) / max(extra_docs, 1):.0f} B/document)")
    results["anon_half"], results["anon_full"] = half_anon, full_anon
    print(rss)
    if args.scaling:
        results["scaling"] = scaling(args, work, trees)
        rss += "\n\n" + "\n".join(results["scaling"])
    if args.encodings:
        enc = _spawn("enc", str(work / f"floor-w{w}"))
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
