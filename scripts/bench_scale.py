"""Plan 10^8 and 10^9 documents in windows, and pack >= 2 B tokens end to end, on one machine.

Two commands:

``plan``
    For each length distribution (``web``, ``code``: those of ``scripts/bench_packer.py``, same
    seed and the same generator blocks, so the first N documents here are bench_packer's N),
    each corpus size (``--docs``, default 1e8 and 1e9) and each window size (``--windows``),
    a fresh subprocess streams the lengths window by window from the seeded generator (memory:
    one window plus a generator block of 65,536 lengths, whatever the corpus size), plans every
    window with :func:`packtool.core.packing.pack_lengths` (obfd, overflow split, C =
    ``--capacity``) and reports: generation and plan seconds, wall seconds, documents/s, peak
    RSS of the process, its growth over the imported baseline ("growth") and that growth per
    document of one window ("B/doc"), rows, extra rows over
    ceil(tokens / C) for the whole corpus and per window (sum, mean, max).

    ``global`` is one plan over every document (the lengths of the whole corpus in memory).
    It first runs on ``--pilot-docs`` documents to measure its memory per document, and runs at
    a size only if ``pilot bytes/document x size x 1.15`` fits in the available memory;
    otherwise the row says "skipped" with the estimate. The seed paper's figure is printed
    beside the table: OBFD planned 1 B documents in about 10,816 s (Ding et al. 2024, "Fewer
    Truncations Improve Language Modeling", arXiv 2404.10830).

``pack``
    Writes a synthetic tokenized corpus of about ``--tokens`` tokens (web-like lengths from the
    same stream, token ids uniform below 131,072, int32 lists, ``--docs-per-file`` documents per
    file in row groups of 10,000, zstd) into ``--work`` (default: a new folder under /tmp), then
    runs ``packtool pack --window-docs N`` under ``/usr/bin/time -v`` (peak RSS = "Maximum
    resident set size") and the Parquet floor, also under ``/usr/bin/time -v``: pyarrow reads
    the input token column of every file, then writes the very shards packtool wrote (same
    schema, row groups, encodings, zstd) from memory, loaded a batch of shards at a time
    (``--floor-batch-gib``) before each timed write so memory stays bounded. Prints both, their
    ratio, and the per-window extra rows from the manifest. The corpus and the outputs are
    deleted at the end unless ``--keep`` (a rerun with the same ``--work`` and options reuses a
    kept corpus; ``--corpus-only`` just writes it).

Run it niced on a shared machine; every figure of a comparison comes from the same run.

Usage::

    python scripts/bench_scale.py plan [--docs 1e8 1e9] [--windows 50000 250000 1000000 4000000]
        [--dists web code] [--capacity 2048] [--out bench_results]
    python scripts/bench_scale.py pack [--tokens 2e9] [--window-docs 250000] [--work DIR]

Each command writes ``bench_scale_<command>.json`` and ``.md`` into ``--out`` and prints its
table.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_packer import _machine, _reset_peak, _status_kb, length_block  # noqa: E402

PAPER_SECONDS_1B = 10_816  # OBFD, 1 B documents (arXiv 2404.10830)
VOCAB = 131_072
GLOBAL_MARGIN = 1.15  # the global plan runs where estimate x this fits the available memory
STREAM_BLOCK = 1 << 16  # lengths per generator call: 0.5 MiB of float64, small beside a window


# --------------------------------------------------------------------------- lengths


class LengthStream:
    """The documents of ``bench_packer.make_lengths(dist, n, capacity, seed)``, streamed.

    ``take(m)`` returns the next ``m`` lengths as int64[m]; memory is one generator block
    (``STREAM_BLOCK`` lengths) plus what is returned. numpy's ``Generator`` draws the same
    values whatever the size of each call, so this stream equals ``make_lengths``, which draws
    4 M at a time (checked by tests/test_bench_scale.py).
    """

    def __init__(self, dist: str, capacity: int, seed: int = 0):
        self.dist, self.capacity = dist, capacity
        self.rng = np.random.default_rng(seed)
        self.block = np.empty(0, dtype=np.int64)  # shape: (STREAM_BLOCK,)
        self.pos = 0

    def take(self, m: int) -> np.ndarray:
        """int64[m]: the next ``m`` document lengths in tokens (1..100,000 for web/code)."""
        out = np.empty(m, dtype=np.int64)  # shape: (m,)
        done = 0
        while done < m:
            if self.pos == self.block.size:
                self.block = length_block(self.rng, self.dist, STREAM_BLOCK,
                                          self.capacity).astype(np.int64)
                self.pos = 0
            k = min(m - done, self.block.size - self.pos)
            out[done:done + k] = self.block[self.pos:self.pos + k]
            done += k
            self.pos += k
        return out


def iter_windows(dist: str, docs: int, window: int, capacity: int, seed: int = 0):
    """Yield int64[window] lengths (tokens) of consecutive documents, ``docs`` in all.

    The last window is short when ``window`` does not divide ``docs``; ``window >= docs``
    yields one array of every document (the global plan's input).
    """
    stream = LengthStream(dist, capacity, seed)
    for lo in range(0, docs, window):
        yield stream.take(min(window, docs - lo))


# --------------------------------------------------------------------------- memory


def _available_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


# --------------------------------------------------------------------------- plan


def plan_case(dist: str, docs: int, window: int, capacity: int, seed: int = 0) -> dict:
    """Plan ``docs`` documents in windows of ``window`` (``window >= docs``: one global plan).

    Args:
        dist: ``web``, ``code`` or ``uniform`` (see ``bench_packer.length_block``).
        docs: documents in the corpus; window: documents per window; capacity: tokens per row.

    Returns:
        A JSON-ready dict: seconds (``gen_s`` generating lengths, ``plan_s`` in
        ``pack_lengths``, ``wall_s`` both), ``peak_rss`` / ``rss_growth`` in bytes (the peak
        mark is reset after the imports), ``bytes_per_doc`` (growth per document of one window),
        ``rows``, ``tokens``, ``bound_rows`` = ceil(tokens / capacity), ``extra_rows`` = rows -
        bound_rows, and per-window extra rows (sum, mean, max).

    Runs in the calling process; ``plan`` runs each case in a fresh one for a clean peak RSS.
    """
    from packtool.core.packing import pack_lengths

    pack_lengths(np.arange(1, 1000, dtype=np.int64), capacity)  # compile / load the cache
    gc.collect()  # no garbage of earlier work freed while this case is measured (inline runs)
    _reset_peak()
    base = _status_kb("VmHWM") * 1024  # the mark just reset: what the peak is compared with
    gen_s = plan_s = 0.0
    rows = tokens = n_windows = extra_sum = extra_max = 0
    wall = time.perf_counter()
    windows = iter_windows(dist, docs, min(window, docs), capacity, seed)
    while True:
        t = time.perf_counter()
        lengths = next(windows, None)  # shape: (window,)
        gen_s += time.perf_counter() - t
        if lengths is None:
            break
        t = time.perf_counter()
        plan = pack_lengths(lengths, capacity)
        plan_s += time.perf_counter() - t
        w_tokens = int(lengths.sum())  # overflow split keeps every token
        w_extra = plan.num_rows - -(-w_tokens // capacity)
        rows += plan.num_rows
        tokens += w_tokens
        n_windows += 1
        extra_sum += w_extra
        extra_max = max(extra_max, w_extra)
        del plan, lengths  # the next window must not overlap this one in memory
    wall = time.perf_counter() - wall
    peak = _status_kb("VmHWM") * 1024
    bound = -(-tokens // capacity)
    return {"dist": dist, "docs": docs, "window": "global" if window >= docs else window,
            "capacity": capacity, "windows": n_windows, "gen_s": gen_s, "plan_s": plan_s,
            "wall_s": wall, "docs_per_s_plan": docs / plan_s if plan_s else math.inf,
            "docs_per_s_wall": docs / wall if wall else math.inf, "peak_rss": peak,
            "rss_growth": peak - base, "bytes_per_doc": (peak - base) / min(window, docs),
            "rows": rows,
            "tokens": tokens, "bound_rows": bound, "extra_rows": rows - bound,
            "extra_in_windows": extra_sum, "extra_max_window": extra_max,
            "extra_mean_window": extra_sum / n_windows if n_windows else 0.0,
            "load": os.getloadavg()[0], "status": "ok"}


def _spawn_plan(dist, docs, window, capacity, seed, timeout, inline=False) -> dict:
    if inline:
        return plan_case(dist, docs, window, capacity, seed)
    cmd = [sys.executable, __file__, "_plan", json.dumps([dist, docs, window, capacity, seed])]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"dist": dist, "docs": docs, "window": window, "status": f"over {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"dist": dist, "docs": docs, "window": window, "status": f"failed ({tail[:100]})"}


PLAN_HEADER = (
    "| dist | docs | window | windows | plan s | wall s | M docs/s (plan) | M docs/s (wall) | "
    "peak RSS MiB | growth MiB | B/doc | rows | extra rows | extra % | per window: sum / mean "
    "/ max | paper s / wall s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _fmt_plan(r: dict) -> str:
    win = r["window"] if isinstance(r["window"], str) else f"{r['window']:,}"
    head = f"| {r['dist']} | {r['docs']:.0e} | {win} |"
    if r.get("status") != "ok":
        return head + f" {r['status']} |" + " |" * 13
    paper = PAPER_SECONDS_1B * r["docs"] / 1e9 / r["wall_s"]
    return (head + f" {r['windows']:,} | {r['plan_s']:.1f} | {r['wall_s']:.1f} |"
            f" {r['docs_per_s_plan'] / 1e6:.1f} | {r['docs_per_s_wall'] / 1e6:.1f} |"
            f" {r['peak_rss'] / 2**20:,.0f} | {r['rss_growth'] / 2**20:,.0f} |"
            f" {r['bytes_per_doc']:.1f} | {r['rows']:,} | {r['extra_rows']:,} |"
            f" {100 * r['extra_rows'] / r['rows']:.4f} | {r['extra_in_windows']:,} /"
            f" {r['extra_mean_window']:.2f} / {r['extra_max_window']:,} | {paper:,.0f}x |")


def cmd_plan(args) -> list[dict]:
    results, notes = [], []
    print(PLAN_HEADER, flush=True)

    def emit(r):
        results.append(r)
        print(_fmt_plan(r), flush=True)

    for dist in args.dists:
        pilot = None
        if args.pilot_docs:
            pilot = _spawn_plan(dist, args.pilot_docs, args.pilot_docs, args.capacity,
                                args.seed, args.timeout, args.inline)
            emit(pilot)
        for docs in args.docs:
            for window in args.windows:
                if window < docs:
                    emit(_spawn_plan(dist, docs, window, args.capacity, args.seed,
                                     args.timeout, args.inline))
            if docs == args.pilot_docs:
                continue
            bpd = pilot["bytes_per_doc"] if pilot and pilot.get("status") == "ok" else None
            need = bpd * docs * GLOBAL_MARGIN if bpd else None
            avail = _available_bytes()
            if need is not None and need > avail:
                msg = (f"skipped: needs about {need / 2**30:,.1f} GiB ({bpd:.0f} B/document "
                       f"x {docs:.0e} x {GLOBAL_MARGIN}), {avail / 2**30:.1f} GiB available")
                emit({"dist": dist, "docs": docs, "window": "global", "status": msg})
                notes.append(f"{dist} {docs:.0e} global: {msg}")
            else:
                emit(_spawn_plan(dist, docs, docs, args.capacity, args.seed, args.timeout,
                                 args.inline))
    paper = (f"Paper (Ding et al. 2024, arXiv 2404.10830): OBFD planned 1e9 documents in about "
             f"{PAPER_SECONDS_1B:,} s; 'paper s / wall s' scales that figure linearly to the "
             "row's document count.")
    print(paper)
    for n in notes:
        print("note:", n)
    _write(args.out, "plan", {"machine": _machine(), "capacity": args.capacity,
                              "results": results, "notes": notes},
           "\n".join([f"Machine: {_machine()}", "", PLAN_HEADER]
                     + [_fmt_plan(r) for r in results] + ["", paper]
                     + [f"- {n}" for n in notes]))
    return results


# --------------------------------------------------------------------------- pack


def make_corpus(folder: Path, tokens: int, docs_per_file: int, capacity: int,
                seed: int = 0) -> dict:
    """Write web-like documents until there are at least ``tokens`` tokens.

    Files ``input-NNNNN.parquet`` of ``docs_per_file`` documents, column ``input_ids`` as
    list<int32> (ids uniform in 0..VOCAB-1), row groups of 10,000, zstd. Returns ``docs``,
    ``tokens``, ``files`` and ``bytes`` (on disk).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    stream = LengthStream("web", capacity, seed)
    rng = np.random.default_rng([seed, 1])
    n_docs = n_tok = k = 0
    while n_tok < tokens:
        lengths = stream.take(docs_per_file)
        cum = np.cumsum(lengths)
        if n_tok + int(cum[-1]) > tokens:  # last file: stop at the target
            lengths = lengths[:int(np.searchsorted(cum, tokens - n_tok)) + 1]
        offsets = np.zeros(lengths.size + 1, dtype=np.int32)  # shape: (docs_in_file + 1,)
        np.cumsum(lengths, out=offsets[1:])
        values = rng.integers(0, VOCAB, int(offsets[-1]), dtype=np.int32)
        col = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(pa.table({"input_ids": col}), folder / f"input-{k:05d}.parquet",
                       row_group_size=10_000, compression="zstd")
        n_docs += lengths.size
        n_tok += values.size
        k += 1
        del values, col
    return {"docs": n_docs, "tokens": n_tok, "files": k,
            "bytes": sum(p.stat().st_size for p in folder.glob("*.parquet"))}


def floor_child(inp: str, packed: str, workers: int, batch_bytes: int, scratch: str) -> dict:
    """The Parquet floor: read every input token column, then write ``packed``'s shards.

    The shards are loaded a batch of about ``batch_bytes`` (in-memory bytes) at a time, outside
    the clock, then written into ``scratch`` by ``workers`` threads with packtool's schema,
    row groups and encodings, inside the clock (and deleted). Returns ``seconds`` (read +
    write), ``read_s``, ``write_s``, ``tokens`` read and ``shards`` written.
    """
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.formats.writer import column_encodings

    pa.set_cpu_count(workers)
    pa.set_io_thread_count(workers)
    t = time.perf_counter()
    n_tok = 0
    for p in sorted(Path(inp).glob("*.parquet")):
        col = pq.read_table(p, columns=["input_ids"]).column(0)
        n_tok += sum(len(c.values) for c in col.chunks)
        del col
    read_s = time.perf_counter() - t
    shards = sorted(Path(packed).glob("part-*.parquet"))
    out = Path(scratch)
    out.mkdir(parents=True, exist_ok=True)

    def write(item):
        k, groups = item
        schema = groups[0].schema
        with pq.ParquetWriter(out / f"floor-{k:05d}.parquet", schema, compression="zstd",
                              use_dictionary=False, column_encoding=column_encodings(schema),
                              write_statistics=False) as w:
            for g in groups:
                w.write_table(g, row_group_size=max(1, g.num_rows))
        (out / f"floor-{k:05d}.parquet").unlink()  # keep the disk use to one batch

    write_s = 0.0
    batch, size = [], 0
    with ThreadPoolExecutor(workers) as pool:
        for k, p in enumerate(shards + [None]):
            if p is not None:
                f = pq.ParquetFile(p)
                groups = [f.read_row_group(i) for i in range(f.num_row_groups)]
                batch.append((k, groups))
                size += sum(g.nbytes for g in groups)
            if batch and (p is None or size >= batch_bytes):
                t = time.perf_counter()
                list(pool.map(write, batch))
                write_s += time.perf_counter() - t
                batch, size = [], 0
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": read_s + write_s, "read_s": read_s, "write_s": write_s, "tokens": n_tok,
            "shards": len(shards)}


def _time_v(cmd: list[str]) -> tuple[float, int, subprocess.CompletedProcess]:
    """(wall seconds, peak RSS bytes from /usr/bin/time -v, the process) of ``cmd``."""
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed: {proc.stderr[-1500:]}")
    return wall, int(m.group(1)) * 1024, proc


def cmd_pack(args) -> dict:
    from packtool.formats.manifest import read_manifest

    need = args.tokens * 14  # input ~2.2 B/token + output ~4.6 B/token + spill, with margin
    work = Path(args.work or tempfile.mkdtemp(prefix="packtool-scale-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    if free < need:
        raise SystemExit(f"{work}: {free / 2**30:.0f} GiB free, about {need / 2**30:.0f} GiB "
                         "needed; pass a smaller --tokens or another --work")
    inp, out = work / "input", work / "packed"
    key = {"tokens": int(args.tokens), "docs_per_file": args.docs_per_file,
           "capacity": args.capacity, "seed": args.seed}
    done = work / "corpus.json"  # written last: a complete corpus of these options
    try:
        if done.is_file() and json.loads(done.read_text())["key"] == key:
            corpus = json.loads(done.read_text())["corpus"]
        else:
            done.unlink(missing_ok=True)
            shutil.rmtree(inp, ignore_errors=True)
            t = time.perf_counter()
            corpus = make_corpus(inp, int(args.tokens), args.docs_per_file, args.capacity,
                                 args.seed)
            corpus["make_s"] = time.perf_counter() - t
            done.write_text(json.dumps({"key": key, "corpus": corpus}))
        if args.corpus_only:
            print(f"corpus ready in {inp}: {corpus}")
            return corpus
        print(f"corpus: {corpus['docs']:,} documents, {corpus['tokens']:,} tokens, "
              f"{corpus['files']} files, {corpus['bytes'] / 2**30:.2f} GiB "
              f"({corpus['make_s']:.0f} s to make)", flush=True)
        workers = str(args.workers)
        pack_cmd = [sys.executable, "-m", "packtool", "pack", "--capacity", str(args.capacity),
                    "--window-docs", str(args.window_docs), "--workers", workers, "--json",
                    "--overwrite", str(inp), str(out)]
        load_before = os.getloadavg()[0]
        pack_s, pack_rss, proc = _time_v(pack_cmd)
        summary = json.loads(proc.stdout)
        manifest = read_manifest(out)
        extras = [w.extra_rows for w in manifest.windows]
        out_bytes = sum(p.stat().st_size for p in out.glob("part-*.parquet"))
        floor_cmd = [sys.executable, __file__, "_floor", json.dumps(
            [str(inp), str(out), args.workers, int(args.floor_batch_gib * 2**30),
             str(work / "floor")])]
        floor_proc_s, floor_rss, fproc = _time_v(floor_cmd)
        floor = json.loads([x for x in fproc.stdout.splitlines()
                            if x.startswith("RESULT ")][0][7:])
    finally:
        if not (args.keep or args.corpus_only):
            shutil.rmtree(work, ignore_errors=True)
    s = summary["stats"]
    res = {"corpus": corpus, "capacity": args.capacity, "window_docs": args.window_docs,
           "workers": args.workers, "pack_s": pack_s, "pack_peak_rss": pack_rss,
           "floor_s": floor["seconds"], "floor_read_s": floor["read_s"],
           "floor_write_s": floor["write_s"], "floor_process_s": floor_proc_s,
           "floor_peak_rss": floor_rss, "ratio": pack_s / floor["seconds"],
           "rows": s["rows"], "extra_rows": s["extra_rows"], "windows": len(extras),
           "extra_max_window": max(extras, default=0), "extra_in_windows": sum(extras),
           "out_bytes": out_bytes, "load_before": load_before, "load": os.getloadavg()[0],
           "summary": summary}
    lines = [
        f"corpus: {corpus['docs']:,} web-like documents, {corpus['tokens']:,} tokens, "
        f"{corpus['files']} files ({corpus['bytes'] / 2**30:.2f} GiB); C = {args.capacity}, "
        f"--window-docs {args.window_docs:,}, --workers {args.workers}",
        "",
        "| run | wall s | ratio to floor | M tokens/s | peak RSS MiB (time -v) |",
        "|---|---|---|---|---|",
        f"| Parquet floor (read {floor['read_s']:.0f} s + write {floor['write_s']:.0f} s; "
        f"{floor_proc_s:.0f} s with the untimed shard loads) | {floor['seconds']:.1f} | 1.00 | "
        f"{corpus['tokens'] / floor['seconds'] / 1e6:.1f} | {floor_rss / 2**20:,.0f} |",
        f"| packtool pack --window-docs {args.window_docs:,} | {pack_s:.1f} | "
        f"{pack_s / floor['seconds']:.2f} | {corpus['tokens'] / pack_s / 1e6:.1f} | "
        f"{pack_rss / 2**20:,.0f} |",
        "",
        f"rows {s['rows']:,} in {len(extras)} windows, output {out_bytes / 2**30:.2f} GiB "
        f"({out_bytes / corpus['tokens']:.3f} B/token); extra rows over ceil(tokens/C): total "
        f"{s['extra_rows']:,} ({100 * s['extra_rows'] / s['rows']:.4f} %), per window sum "
        f"{sum(extras):,}, max {max(extras, default=0)}; pack reported {summary['seconds']:.1f} s "
        f"inside the process; load average (1 min) {load_before:.1f} before the pack, "
        f"{res['load']:.1f} after the floor",
    ]
    print("\n".join(lines))
    _write(args.out, "pack", {"machine": _machine(), **res}, "\n".join(
        [f"Machine: {_machine()}", ""] + lines))
    return res


# --------------------------------------------------------------------------- common


def _write(out: str, name: str, data: dict, md: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"bench_scale_{name}.json").write_text(json.dumps(data, indent=1, default=str))
    (folder / f"bench_scale_{name}.md").write_text(md + "\n")
    print(f"wrote {folder / f'bench_scale_{name}.json'} and .md")


def _count(text: str) -> int:
    return int(float(text))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_plan":  # child of `plan`: one case
        print("RESULT " + json.dumps(plan_case(*json.loads(argv[1]))))
        return
    if argv and argv[0] == "_floor":  # child of `pack`: the Parquet floor
        print("RESULT " + json.dumps(floor_child(*json.loads(argv[1]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan lengths in windows (no tokens, no I/O)")
    p.add_argument("--docs", type=_count, nargs="+", default=[10**8, 10**9])
    p.add_argument("--windows", type=_count, nargs="+",
                   default=[50_000, 250_000, 1_000_000, 4_000_000])
    p.add_argument("--dists", nargs="+", default=["web", "code"],
                   choices=["web", "code", "uniform"])
    p.add_argument("--pilot-docs", type=_count, default=10**7,
                   help="global plan size that measures bytes/document (0: no global plans)")
    p.add_argument("--capacity", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=3600, help="seconds per case")
    p.add_argument("--out", default=str(ROOT / "bench_results"))
    p.add_argument("--inline", action="store_true",
                   help="run the cases in this process (fast; peak RSS then spans cases)")
    q = sub.add_parser("pack", help="end-to-end windowed pack against the Parquet floor")
    q.add_argument("--tokens", type=float, default=2e9)
    q.add_argument("--window-docs", type=_count, default=250_000)
    q.add_argument("--docs-per-file", type=_count, default=100_000)
    q.add_argument("--capacity", type=int, default=2048)
    q.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    q.add_argument("--floor-batch-gib", type=float, default=1.0,
                   help="output bytes (in memory) written per timed floor batch")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--work", default=None, help="scratch folder (default: new under /tmp)")
    q.add_argument("--keep", action="store_true",
                   help="keep the corpus (reused by a rerun with the same options) and outputs")
    q.add_argument("--corpus-only", action="store_true",
                   help="only write the corpus into --work (kept), to pack later")
    q.add_argument("--out", default=str(ROOT / "bench_results"))
    args = ap.parse_args(argv)
    if args.command == "plan":
        args.docs = sorted(args.docs)
        cmd_plan(args)
    else:
        cmd_pack(args)


if __name__ == "__main__":
    main()
