"""Measure ``packtool pack`` against the Parquet I/O floor, in CPU seconds, side by side.

The corpus: by default web-like document lengths (log-normal, median 300, sigma 1.17, about 5 %
over 2048, clipped at 100 k), token ids uniform in 0..vocab-1 (int32 lists), ``--files`` Parquet
files; or ``--input DIR``, an existing tokenized corpus (e.g. real ids from
``scripts/make_corpus.py``: real ids compress well, so packtool's own passes weigh more).

What is measured, each in a fresh subprocess, in rounds that alternate the runs (so the
machine's load hits them alike), best of ``--repeat`` rounds (fewest CPU seconds):

- ``floor``: pyarrow reads the input token column (every file, batch by batch) and writes
  tables with exactly packtool's output schema, row count, row groups, encodings and zstd
  level (the packed output itself, ``workers`` shards at a time loaded before their timed
  write and dropped after it, so the floor streams as a pack does), on 1 and on all threads:
  the decode + encode work any packer must do. CPU of the timed sections (every thread). Its
  Arrow memory pool is the one ``packtool pack`` uses (jemalloc: ``packtool/formats/memory.py``;
  ``--floor-pool default``: pyarrow's default, mimalloc on Linux).
- ``start-up``: ``packtool pack`` of a two-document input, whole process: the fixed cost of a
  run (interpreter, imports, loading the compiled kernels, OUTPUT's lock and manifest). Every
  ``packtool pack`` runs as installed, with the tree's bytecode cached (``PYTHONDONTWRITEBYTECODE``
  is dropped from its environment), not compiled from source in each run.
- ``pack``: ``packtool pack`` (the CLI, as users run it) with ``workers`` = 1 and all cores; with
  ``--window-docs N`` also with windows of N documents (all cores). CPU of the whole process;
  "without start-up" subtracts the round's start-up.

CPU seconds are user + system time of the process and all its threads (``getrusage`` of the
child), the steady figure on a shared machine; wall seconds and the load average (1 minute,
read before and after each round) are printed beside them. ``--busy K`` keeps K spinning
processes running during the measurements ("both cores busy"). Peak RSS comes from
``/usr/bin/time -v`` where it exists (file-backed pages included), and ``--scaling`` packs
1x, 2x and 4x ``--tokens`` and prints peak RSS against corpus size. ``--baseline TREE`` runs the
same packs with the packtool source tree TREE (``git archive <rev> packtool | tar -x -C TREE``)
in the same rounds. ``--encodings`` compares Parquet encodings per column on one shard.
``--resume`` measures instead a rerun after Ctrl-C late in the read (every read part kept but
the last) against a whole pack, alternating, best of ``--repeat``.

Usage: ``python scripts/bench_pipeline.py [--tokens 50e6 | --input DIR] [--repeat 5]
[--window-docs 20000] [--busy 2] [--baseline TREE] [--scaling | --resume]``; writes
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


def child_floor(inp: str, packed: str, workers: int, arrow_pool: str = "pack") -> dict:
    """The floor in this process, streaming like a pack, on ``workers`` threads: CPU (user +
    system of every thread of the process, ``getrusage``) and wall of the timed sections only.
    Read: every input file's token column, batch by batch, files spread over the threads.
    Write: ``workers`` output shards at a time are loaded (not timed), written in parallel
    (timed) and dropped, so the floor holds ``workers`` shards at a time. Arrow's memory pool:
    ``pack``, the one ``packtool pack`` uses (:func:`packtool.formats.memory.use_jemalloc`);
    ``default``, pyarrow's own default."""
    import resource
    from concurrent.futures import ThreadPoolExecutor

    if arrow_pool == "pack":  # before pyarrow is imported, as the CLI does
        from packtool.formats.memory import use_jemalloc

        use_jemalloc()
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.formats.writer import COMPRESSION, COMPRESSION_LEVEL, column_encodings

    pa.set_cpu_count(workers)
    pa.set_io_thread_count(workers)
    shards = sorted(Path(packed).glob("part-*.parquet"))
    inputs = sorted(Path(inp).rglob("*.parquet"))
    tmp = Path(tempfile.mkdtemp(dir=Path(packed).parent))

    def read(path):
        n = 0
        for batch in pq.ParquetFile(path).iter_batches(columns=["input_ids"],
                                                       use_threads=False):
            n += len(batch.column(0).values)
        return n

    def write(job):
        k, groups = job
        schema = groups[0].schema
        with pq.ParquetWriter(tmp / f"floor-{k:05d}.parquet", schema, compression=COMPRESSION,
                              compression_level=COMPRESSION_LEVEL, use_dictionary=False,
                              column_encoding=column_encodings(schema),
                              write_statistics=False, write_page_checksum=True) as w:
            for g in groups:
                w.write_table(g, row_group_size=max(1, g.num_rows))

    def load(k):
        f = pq.ParquetFile(shards[k])
        return k, [f.read_row_group(i) for i in range(f.num_row_groups)]

    def usage():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime, r.ru_stime, time.perf_counter()

    pool = ThreadPoolExecutor(workers)
    u0, s0, t0 = usage()
    n_tok = sum(pool.map(read, inputs))
    u1, s1, t1 = usage()
    user, sys_, wall = u1 - u0, s1 - s0, t1 - t0
    read_cpu = user + sys_
    for k in range(0, len(shards), workers):
        jobs = [load(j) for j in range(k, min(k + workers, len(shards)))]  # not timed
        ua, sa, ta = usage()
        list(pool.map(write, jobs))
        ub, sb, tb = usage()
        user, sys_, wall = user + ub - ua, sys_ + sb - sa, wall + tb - ta
        del jobs
    pool.shutdown()
    shutil.rmtree(tmp)
    return {"cpu": user + sys_, "user": user, "sys": sys_, "read_cpu": read_cpu,
            "write_cpu": user + sys_ - read_cpu, "seconds": wall, "tokens": n_tok,
            "pool": pa.default_memory_pool().backend_name}


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
    """Run ``--child args`` (this script) in a fresh process; returns its RESULT line plus
    ``process_cpu`` (the whole process) and ``maxrss``."""
    env = dict(os.environ)
    if tree:
        env[TREE_ENV] = tree
    res = _measure([sys.executable, __file__, "--child", json.dumps(args)], env)
    for line in res["stdout"].splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[7:])
            out.update(process_cpu=res["cpu"], maxrss=res["maxrss"])
            return out
    raise RuntimeError(res["stderr"][-2000:])


def _measure(cmd: list[str], env: dict) -> dict:
    """Run ``cmd``; its CPU seconds (user + sys of the process and every thread and child it
    waited for, from ``wait4``), wall seconds and peak RSS."""
    t = time.perf_counter()
    # run from a neutral directory: ``python -m`` puts the working directory first on the
    # path, ahead of PYTHONPATH, which would import this checkout instead of a --baseline tree
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True, cwd=tempfile.gettempdir())
    out, err = proc.stdout.read(), proc.stderr.read()  # small: JSON and a few lines
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {proc.returncode}: {err[-2000:]}")
    return {"cpu": ru.ru_utime + ru.ru_stime, "user": ru.ru_utime, "sys": ru.ru_stime,
            "seconds": wall, "maxrss": ru.ru_maxrss * 1024, "stdout": out, "stderr": err}


def _pack_cli(inp: str, out: str, workers: int, capacity: int, window_docs: int | None = None,
              tree: str | None = None, keep: bool = False) -> dict:
    """``packtool pack`` as users run it (the CLI, a fresh process), measured."""
    env = dict(os.environ)
    env["PYTHONPATH"] = tree or str(ROOT)
    # as installed: the tree's bytecode is cached (by the warm-up run) and loaded, not compiled
    # from source in every run (0.04 to 0.06 CPU-s of each start-up where the shell sets this)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, "-m", "packtool", "pack", "--json", "-c", str(capacity), "-j",
           str(workers), "--overwrite"]
    if window_docs:
        cmd += ["--window-docs", str(window_docs)]
    res = _measure(cmd + [inp, out], env)
    summary = json.loads(res.pop("stdout"))
    res.pop("stderr")
    res["out_bytes"] = sum(p.stat().st_size for p in Path(out).glob("part-*.parquet"))
    res["rows"] = summary["stats"]["rows"]
    res["tokens"] = summary["stats"]["real_tokens"]
    res["docs"] = summary["stats"]["docs_in"]
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return res


def _interrupted_pack(inp: str, out: str, workers: int, capacity: int, part: int) -> str:
    """``packtool pack`` stopped by Ctrl-C while it reads read part ``part`` (the test hook
    holds that part after its first record batch while the others finish): returns the
    interrupted line. Its CPU is not counted."""
    import signal

    env = dict(os.environ, PYTHONPATH=str(ROOT), PACKTOOL_TEST_PAUSE_AT=f"read:{part}")
    proc = subprocess.Popen([sys.executable, "-m", "packtool", "pack", "-q", "-c", str(capacity),
                             "-j", str(workers), "--overwrite", inp, out],
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())
    line = proc.stderr.readline()
    if "test pause" not in line:
        proc.kill()
        raise RuntimeError(f"no pause at read:{part}: {line}")
    time.sleep(2)  # the other read parts finish meanwhile
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    if proc.wait() != 130:
        raise RuntimeError(f"interrupted pack exited {proc.returncode}: {err[-500:]}")
    return err.strip().splitlines()[-1]


def resume(args, work: Path, full: Path) -> list[str]:
    """CPU of a rerun after Ctrl-C late in the read (all read parts but the last kept) against
    a whole pack, alternating, best of ``--repeat``."""
    sys.path.insert(0, str(ROOT))
    from packtool.formats.reader import discover_inputs
    from packtool.pipeline.read import plan_reads

    parts = len(plan_reads(discover_inputs([full]), "input_ids"))
    whole, rerun, loads, note = [], [], [], ""
    for k in range(args.repeat):
        loads.append(os.getloadavg()[0])
        for kind in (("whole", "rerun") if k % 2 == 0 else ("rerun", "whole")):
            out = work / f"resume-{kind}"
            if kind == "whole":
                whole.append(_pack_cli(str(full), str(out), args.workers, args.capacity))
            else:
                shutil.rmtree(out, ignore_errors=True)
                note = _interrupted_pack(str(full), str(out), args.workers, args.capacity,
                                         parts - 1)
                rerun.append(_pack_cli(str(full), str(out), args.workers, args.capacity))
        loads.append(os.getloadavg()[0])
    w, r = _best(whole), _best(rerun)
    lines = [f"Ctrl-C late in the read ({parts} read parts, the last one held), then the same "
             f"command again; {args.workers} workers, best of {args.repeat} (load average "
             f"{min(loads):.1f} to {max(loads):.1f}):", "",
             f"- interrupted: `{note}`",
             f"- whole pack {w['cpu']:.2f} CPU-s, rerun {r['cpu']:.2f} CPU-s: **{r['cpu'] / w['cpu']:.2f}x** "
             f"(per round: " + ", ".join(f"{b['cpu'] / a['cpu']:.2f}" for a, b in zip(whole, rerun))
             + ")"]
    print("\n".join(lines), flush=True)
    return lines


def _tiny_input(work: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tiny = work / "tiny" / "part-0.parquet"
    tiny.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3], [4, 5]], pa.list_(pa.int32()))}),
                   tiny)
    return tiny.parent


def scaling(args, work: Path, trees: dict) -> list[str]:
    """Peak RSS of pack on 1x, 2x, 4x the corpus, for each tree (and with windows)."""
    lines = ["| tree | window docs | tokens | documents | CPU s | wall s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for k in (1, 2, 4):
        folder = work / f"scale-{k}"
        corpus = make_corpus(folder, int(args.tokens) * k, args.vocab, args.files * k)
        for label, tree in trees.items():
            for wd in [None] + ([args.window_docs] if args.window_docs else []):
                r = _pack_cli(str(folder), str(work / "scale-out"), args.workers,
                              args.capacity, wd, tree)
                row = (f"| {label} | {wd or ''} | {corpus['tokens']:,} | {corpus['docs']:,} | "
                       f"{r['cpu']:.1f} | {r['seconds']:.1f} | {r['maxrss'] / 2**20:.0f} |")
                lines.append(row)
                print(row, flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    return lines


def _busy(k: int) -> list:
    """``k`` processes spinning on a core each (the "both cores busy" case)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def _best(runs: list[dict], key: str = "cpu") -> dict:
    return min(runs, key=lambda r: r[key])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=float, default=50e6, help="corpus size in tokens")
    ap.add_argument("--input", default=None, metavar="DIR",
                    help="an existing tokenized corpus instead of a synthetic one")
    ap.add_argument("--vocab", type=int, default=131_072)
    ap.add_argument("--files", type=int, default=8, help="input Parquet files")
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="'all' workers")
    ap.add_argument("--quick", action="store_true", help="5 M tokens")
    ap.add_argument("--encodings", action="store_true", help="also compare column encodings")
    ap.add_argument("--window-docs", type=int, default=None, metavar="N",
                    help="also pack with windows of N documents (all workers)")
    ap.add_argument("--baseline", default=None, metavar="TREE",
                    help="also run pack from this packtool source tree (before/after)")
    ap.add_argument("--repeat", type=int, default=3, metavar="K",
                    help="rounds; each run's best (fewest CPU seconds) is reported")
    ap.add_argument("--floor-pool", choices=("pack", "default"), default="pack",
                    help="Arrow memory pool of the floor: the one pack uses (jemalloc) or "
                         "pyarrow's default")
    ap.add_argument("--busy", type=int, default=0, metavar="K",
                    help="keep K spinning processes running while measuring")
    ap.add_argument("--scaling", action="store_true",
                    help="peak RSS on 1x, 2x, 4x --tokens (each tree)")
    ap.add_argument("--scaling-only", action="store_true", help="only the --scaling table")
    ap.add_argument("--resume", action="store_true",
                    help="only: CPU of a rerun after Ctrl-C late in the read, against a whole "
                         "pack")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--out", default=str(ROOT / "bench_results"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        fn = {"floor": child_floor, "enc": child_encodings}[kind]
        print("RESULT " + json.dumps(fn(*rest)))
        return
    tokens = int(5e6 if args.quick else args.tokens)
    work = Path(args.work or tempfile.mkdtemp(prefix="packtool-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {"this tree": None}
    if args.baseline:
        trees = {"baseline": str(Path(args.baseline).resolve()), "this tree": None}
    tiny = _tiny_input(work)
    for tree in trees.values():  # compile (or load) each tree's kernels outside the rounds
        _pack_cli(str(tiny), str(work / "warm-out"), 1, args.capacity, tree=tree)
    busy = _busy(args.busy)
    try:
        if args.scaling_only:
            lines = scaling(args, work, trees)
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "bench_pipeline_scaling.md").write_text("\n".join(lines) + "\n")
            return
        if args.resume:
            full = Path(args.input) if args.input else work / "full"
            if not args.input:
                make_corpus(full, tokens, args.vocab, args.files)
            lines = resume(args, work, full)
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "bench_pipeline_resume.md").write_text("\n".join(lines) + "\n")
            return
        _rounds(args, work, trees, tokens, tiny)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def _rounds(args, work: Path, trees: dict, tokens: int, tiny: Path) -> None:
    if args.input:
        full = Path(args.input)
        files = sorted(full.rglob("*.parquet"))
        import pyarrow.parquet as pq

        corpus = {"docs": sum(pq.ParquetFile(p).metadata.num_rows for p in files),
                  "tokens": None, "input": str(full)}
    else:
        full = work / "full"
        t = time.perf_counter()
        corpus = make_corpus(full, tokens, args.vocab, args.files)
        print(f"corpus: {corpus['docs']:,} documents, {corpus['tokens']:,} tokens, "
              f"{sum(p.stat().st_size for p in full.glob('*.parquet')) / 2**20:.0f} MiB "
              f"({time.perf_counter() - t:.1f} s to make)", flush=True)
    floor_src = work / "floor-src"
    ref = _pack_cli(str(full), str(floor_src), args.workers, args.capacity, keep=True)
    corpus["tokens"] = corpus["tokens"] or ref["tokens"]
    results = {"corpus": corpus, "capacity": args.capacity, "busy": args.busy, "rounds": []}
    configs = [(w, None) for w in sorted({1, args.workers})]
    if args.window_docs:
        configs.append((args.workers, args.window_docs))
    runs: list[tuple] = [("floor", None, w, None) for w in sorted({1, args.workers})]
    runs += [("start-up", label, 1, None) for label in trees]
    runs += [("pack", label, w, wd) for label in trees for w, wd in configs]
    got: dict = {r: [] for r in runs}
    loads = []
    for k in range(args.repeat):
        order = runs if k % 2 == 0 else runs[::-1]  # alternate, so the load hits all alike
        before = os.getloadavg()[0]
        this = {}
        for kind, label, w, wd in order:
            if kind == "floor":
                r = _spawn("floor", str(full), str(floor_src), w, args.floor_pool)
            elif kind == "start-up":
                r = _pack_cli(str(tiny), str(work / "tiny-out"), 1, args.capacity,
                              tree=trees[label])
            else:
                r = _pack_cli(str(full), str(work / "out"), w, args.capacity, wd, trees[label])
            got[(kind, label, w, wd)].append(r)
            this[(kind, label, w, wd)] = r
        loads += [before, os.getloadavg()[0]]
        ratios = {}
        for kind, label, w, wd in runs:
            if kind == "pack":
                net = this[(kind, label, w, wd)]["cpu"] - this[("start-up", label, 1, None)]["cpu"]
                ratios[f"{label}, {w} workers{f', windows {wd}' if wd else ''}"] = round(
                    net / this[("floor", None, w, None)]["cpu"], 3)
        results["rounds"].append({"load": [loads[-2], loads[-1]], "ratios": ratios})
        print(f"round {k + 1}: load {loads[-2]:.1f} -> {loads[-1]:.1f}; CPU ratios without "
              f"start-up: " + ", ".join(f"{n} {x:.2f}" for n, x in ratios.items()), flush=True)
    lines = [f"corpus: {corpus['docs']:,} documents, {corpus['tokens']:,} tokens"
             f"{' (' + corpus['input'] + ')' if args.input else ''}, C = {args.capacity}; "
             f"best of {args.repeat} rounds; load average {min(loads):.1f} to {max(loads):.1f}"
             f"{f'; {args.busy} spinning processes beside' if args.busy else ''}", "",
             "| run | workers | CPU s | user / sys (floor: read + write) | CPU ratio to floor | without start-up: "
             "best (median of rounds: each round) | wall s | tokens/s (wall) | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    starts = {label: _best(got[("start-up", label, 1, None)]) for label in trees}
    for kind, label, w, wd in runs:
        best = _best(got[(kind, label, w, wd)])
        if kind == "floor":
            name, ratio, net = f"floor (read + write; {best.get('pool', '?')})", "1.00", ""
        elif kind == "start-up":
            name, ratio, net = f"start-up ({label}, 2 documents)", "", ""
        else:
            floor = _best(got[("floor", None, w, None)])["cpu"]
            per = [r["cpu"] - s["cpu"] for r, s in zip(got[(kind, label, w, wd)],
                                                       got[("start-up", label, 1, None)])]
            per_ratio = [x / f["cpu"] for x, f in zip(per, got[("floor", None, w, None)])]
            name = f"pack, {label}" + (f", --window-docs {wd:,}" if wd else "")
            ratio = f"{best['cpu'] / floor:.2f}"
            net = (f"**{(best['cpu'] - starts[label]['cpu']) / floor:.2f}** (median "
                   f"{float(np.median(per_ratio)):.2f}: "
                   + ", ".join(f"{x:.2f}" for x in per_ratio) + ")")
        rss = best.get("maxrss", 0) / 2**20
        rate = "" if kind == "start-up" else f"{corpus['tokens'] / best['seconds'] / 1e6:.1f} M"
        split = (f"read {best['read_cpu']:.2f} + write {best['write_cpu']:.2f}"
                 if kind == "floor" else f"{best['user']:.2f} / {best['sys']:.2f}")
        lines.append(f"| {name} | {w} | {best['cpu']:.2f} | {split} | {ratio} | {net} | "
                     f"{best['seconds']:.2f} | {rate} | {rss:.0f} |")
    print("\n".join(lines), flush=True)
    results["table"] = lines
    results["runs"] = {" ".join(str(x) for x in r): got[r] for r in runs}
    if args.scaling:
        results["scaling"] = scaling(args, work, trees)
        lines += [""] + results["scaling"]
    if args.encodings:
        enc = _spawn("enc", str(floor_src))
        results["encodings"] = enc
        cur = enc["current"]["bytes"]
        print("| encoding variant | shard bytes | vs current | write s |\n|---|---|---|---|")
        for name, e in enc.items():
            if isinstance(e, dict) and "error" in e:
                print(f"| {name} | {e['error']} | | |")
            elif isinstance(e, dict) and "bytes" in e:
                print(f"| {name} | {e['bytes']:,} | {e['bytes'] / cur - 1:+.1%} | "
                      f"{e['seconds']:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_pipeline.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "bench_pipeline.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
