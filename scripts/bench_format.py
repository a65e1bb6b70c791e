"""Measure the packed format: bytes per token per column and encode time for each encoding,
random-row cost against a flat NumPy memmap, ``stats`` time on many rows, and peak RSS of
``pack`` at a large capacity. Figures are printed as ratios measured side by side in one run.

Usage::

    .venv/bin/python scripts/bench_format.py encodings [INPUT ...] [--capacity C]
    .venv/bin/python scripts/bench_format.py random-access [INPUT] [--capacity C]
    .venv/bin/python scripts/bench_format.py stats [--rows N]
    .venv/bin/python scripts/bench_format.py rss INPUT [--capacity C] [--workers N]

INPUT defaults to ``sample_data/``; ``scripts/make_corpus.py`` builds a 100 M-token real corpus.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packtool.config import PackConfig, rows_per_group_for  # noqa: E402
from packtool.core.layout import layout_rows  # noqa: E402
from packtool.core.packing import pack_lengths  # noqa: E402
from packtool.formats.packed import PackedOutput  # noqa: E402
from packtool.loader import PackedDataset  # noqa: E402
from packtool.formats.reader import discover_inputs, iter_token_batches  # noqa: E402
from packtool.formats.schema import packed_schema  # noqa: E402
from packtool.formats.writer import rows_to_table  # noqa: E402
from packtool.pipeline import run_pack  # noqa: E402


def _load(inputs):
    lens, toks = [], []
    for f in discover_inputs(inputs):
        for b in iter_token_batches(f.path, "input_ids"):
            lens.append(b.lengths)
            toks.append(np.asarray(b.tokens, dtype=np.int32))
    lengths = np.concatenate(lens)
    starts = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return lengths, np.concatenate(toks), starts


def cmd_encodings(args):
    """bytes/token of each column under each encoding and zstd level, on packed real ids."""
    lengths, tokens, starts = _load(args.inputs)
    C = args.capacity
    plan = pack_lengths(lengths, C)
    rows = np.random.default_rng(0).permutation(plan.num_rows)[:args.max_rows]
    packed = layout_rows(plan, rows, tokens, starts, labels="unshifted")
    table = rows_to_table(packed, packed_schema(C, "unshifted"))
    ntok = rows.size * C
    rpg = rows_per_group_for(args.row_group_mb, C, 3)
    print(f"# {int(lengths.sum()):,} tokens, {rows.size:,} rows of C={C}, {rpg} rows per group "
          f"({args.row_group_mb} MiB); bytes per packed token (C x rows), encode ms")
    options = [("PLAIN", "zstd", 1), ("PLAIN", "zstd", 3), ("PLAIN", "zstd", 9),
               ("DELTA_BINARY_PACKED", "zstd", 1), ("DELTA_BINARY_PACKED", "zstd", 3),
               ("BYTE_STREAM_SPLIT", "zstd", 3), ("DICTIONARY", "zstd", 3), ("PLAIN", "none", 0)]
    results = {}
    for name in table.column_names:
        leaf = name + (".list.element" if pa.types.is_list(table.schema.field(name).type)
                       or pa.types.is_fixed_size_list(table.schema.field(name).type) else "")
        t = table.select([name])
        for enc, comp, lvl in options:
            kw = dict(compression=comp, write_statistics=False, row_group_size=rpg)
            if lvl:
                kw["compression_level"] = lvl
            if enc == "DICTIONARY":
                kw["use_dictionary"] = True
            else:
                kw.update(use_dictionary=False, column_encoding={leaf: enc})
            best, size = float("inf"), 0
            for _ in range(args.repeat):
                buf = io.BytesIO()
                t0 = time.perf_counter()
                try:
                    pq.write_table(t, buf, **kw)
                except (pa.ArrowException, ValueError):
                    size = None
                    break
                best = min(best, time.perf_counter() - t0)
                size = buf.tell()
            if size is None:
                continue
            key = f"{enc} {comp}{lvl or ''}"
            results.setdefault(name, {})[key] = (size / ntok, best * 1e3)
            print(f"{name:13s} {key:26s} {size / ntok:8.4f} B/token {best * 1e3:8.1f} ms",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def cmd_random_access(args):
    """ms per random read_row (fresh reader) beside a flat NumPy memmap of the same columns."""
    C = args.capacity
    cols = ["input_ids", "segment_ids", "position_ids", "cu_seqlens", "max_seqlen",
            "num_targets", "doc_ids", "doc_offsets"]
    tok_cols = ["input_ids", "segment_ids", "position_ids"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-format-"))
    try:
        for mb in args.row_group_mb:
            out = tmp / f"out-{mb}"
            run_pack(PackConfig(inputs=tuple(args.inputs), output=str(out), capacity=C,
                                row_group_mb=mb, workers=2), progress=False)
            r = PackedOutput.open(out)
            n = r.num_rows
            size = sum(o.bytes for o in r.manifest.shards)
            mm = np.lib.format.open_memmap(tmp / "mm.npy", mode="w+", dtype=np.int32,
                                           shape=(n, len(tok_cols), C))
            for b in r.iter_blocks(tok_cols):
                mm[b.first:b.first + b.num_rows] = np.stack([b.tokens[c] for c in tok_cols], 1)
            mm.flush()
            del mm
            mm = np.load(tmp / "mm.npy", mmap_mode="r")
            idx = np.random.default_rng(0).integers(0, n, args.reads)
            t_pq, t_mm = [], []
            for _ in range(args.repeat):
                r = PackedDataset(out, columns=cols)
                t0 = time.perf_counter()
                for i in idx:
                    r[int(i)]
                t_pq.append((time.perf_counter() - t0) / idx.size)
                t0 = time.perf_counter()
                for i in idx:
                    np.array(mm[int(i)])
                t_mm.append((time.perf_counter() - t0) / idx.size)
            r = PackedDataset(out, columns=cols)  # rows in order, as a DataLoader without shuffle
            t0 = time.perf_counter()
            for i in range(n):
                r[i]
            t_seq = (time.perf_counter() - t0) / n
            rpg = rows_per_group_for(mb, C, 3)
            print(f"C={C} row-group {mb} MiB ({rpg} rows): {n:,} rows, {size / (n * C):.3f} B/token;"
                  f" random read_row {min(t_pq) * 1e3:.2f} ms (median of {args.repeat} "
                  f"{np.median(t_pq) * 1e3:.2f}), memmap {min(t_mm) * 1e3:.3f} ms; sequential "
                  f"read_row {t_seq * 1e3:.3f} ms/row ({1 / t_seq:,.0f} rows/s)", flush=True)
            del mm
            shutil.rmtree(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cmd_stats(args):
    """analyze_packed on a synthetic output of N rows: two documents and a padding tail per
    row (real structural columns; per-token columns zeros, which the recount does not read)."""
    import resource

    from packtool.analysis import analyze_packed
    from packtool.formats.manifest import (FORMAT_VERSION, LabelsInfo, Manifest, ShardEntry,
                                           publish_manifest)
    from packtool.formats.writer import write_shard
    from packtool.stats import PackStats

    C, n = args.capacity, args.rows
    tmp = Path(tempfile.mkdtemp(prefix="bench-stats-"))
    try:
        rng = np.random.default_rng(0)
        schema = packed_schema(C, "none")
        typ = {f.name: f.type for f in schema}
        outputs, doc, t0, targets, real, work = [], 0, time.perf_counter(), 0, 0, 0
        per_shard, per_group = 1_000_000, 65536
        for s in range(-(-n // per_shard)):
            m = min(per_shard, n - s * per_shard)
            tables = []
            for lo in range(0, m, per_group):
                g = min(per_group, m - lo)
                a = rng.integers(2, C // 2, g)
                b = rng.integers(C // 2 + 1, C, g)
                cu = np.stack([np.zeros(g, np.int64), a, b, np.full(g, C)], 1).reshape(-1)
                nt = (a - 1) + (b - a - 1)
                targets += int(nt.sum())
                real += int(b.sum())  # two documents: a and b - a tokens; b .. C is padding
                work += int((a * a + (b - a) * (b - a)).sum())
                ids = np.arange(doc, doc + 2 * g, dtype=np.int64)
                doc += 2 * g
                z = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(g * C, np.int32)),
                                                      type=typ["input_ids"])
                def lst(v, step, t):
                    off = pa.array(np.arange(0, v.size + 1, step, dtype=np.int32))
                    return pa.ListArray.from_arrays(off, pa.array(v)).cast(t)
                tables.append(pa.Table.from_arrays(
                    [z, z, z, lst(cu.astype(np.int32), 4, typ["cu_seqlens"]),
                     pa.array(np.maximum(a, b - a).astype(np.int32)), pa.array(nt.astype(np.int32)),
                     lst(ids, 2, typ["doc_ids"]), lst(np.zeros(2 * g, np.int64), 2, typ["doc_offsets"])],
                    schema=schema))
            name = f"part-{s:05d}.parquet"
            w = write_shard(tmp / name, schema, tables)
            outputs.append(ShardEntry(name, m, w.bytes, w.sha256, w.footer_sha256,
                                      ShardEntry.run_lengths(w.group_rows)))
        manifest = Manifest(format_version=FORMAT_VERSION, packtool_version="bench",
                            fingerprint="bench", capacity=C,
                            labels=LabelsInfo(False, "unshifted"), shards=tuple(outputs),
                            totals=PackStats(capacity=C, rows=n, segments=2 * n,
                                             effective_targets=targets, real_tokens=real,
                                             padding_tokens=n * C - real,
                                             attention_work=work))
        publish_manifest(tmp, manifest, schema)
        print(f"synthetic output: {n:,} rows, {2 * n:,} segments, C={C} "
              f"(written in {time.perf_counter() - t0:.0f} s)", flush=True)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        a = analyze_packed(tmp, check_hashes=False)
        dt = time.perf_counter() - t0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert not a.mismatches, a.mismatches
        print(f"analyze_packed: {dt:.1f} s ({n / dt / 1e6:.2f} M rows/s), no mismatches; "
              f"peak RSS of this process before {rss0 / 1024:.0f} MB, after {rss1 / 1024:.0f} MB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cmd_rss(args):
    """Peak RSS (MB) of ``packtool pack`` in a child process, from /usr/bin/time or getrusage."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-rss-"))
    try:
        code = ("import resource, sys; from packtool.cli import main; sys.argv = sys.argv[1:]\n"
                "try:\n    main()\nexcept SystemExit:\n    pass\n"
                "print('peak_rss_mb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
        cmd = [sys.executable, "-c", code, "packtool", "pack", "-q", "-c", str(args.capacity),
               "-j", str(args.workers), *args.inputs, str(tmp / "out")]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        print(res.stdout.strip(), res.stderr.strip()[-500:])
        print(f"pack -c {args.capacity} -j {args.workers}: {time.perf_counter() - t0:.1f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encodings")
    e.add_argument("inputs", nargs="*", default=[str(ROOT / "sample_data")])
    e.add_argument("--capacity", type=int, default=2048)
    e.add_argument("--row-group-mb", type=float, default=1.0)
    e.add_argument("--max-rows", type=int, default=20000)
    e.add_argument("--repeat", type=int, default=2)
    e.add_argument("--json")
    r = sub.add_parser("random-access")
    r.add_argument("inputs", nargs="*", default=[str(ROOT / "sample_data")])
    r.add_argument("--capacity", type=int, default=2048)
    r.add_argument("--row-group-mb", type=float, nargs="+", default=[0.25, 1.0, 4.0])
    r.add_argument("--reads", type=int, default=300)
    r.add_argument("--repeat", type=int, default=3)
    s = sub.add_parser("stats")
    s.add_argument("--rows", type=int, default=15_000_000)
    s.add_argument("--capacity", type=int, default=8)
    m = sub.add_parser("rss")
    m.add_argument("inputs", nargs="+")
    m.add_argument("--capacity", type=int, default=131072)
    m.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    {"encodings": cmd_encodings, "random-access": cmd_random_access, "stats": cmd_stats,
     "rss": cmd_rss}[args.cmd](args)


if __name__ == "__main__":
    main()
