"""CPU per row of ``DataLoader(PackedIterableDataset(batch_size=B), batch_size=None)`` with and
without workers, configurations alternated in separate processes, side by side in one run.

A packed output of ``--input`` (default ``sample_data/``, repeated ``--repeat`` times, shuffled)
at capacity ``--capacity`` is written once under ``--work``. Each configuration is a packtool
tree (its directory is put first on ``PYTHONPATH``, so an older checkout can be measured beside
this one), a worker count and optional environment variables; each round runs every
configuration once, in turn, in a fresh process. A run builds the DataLoader (persistent
workers), makes one warm-up pass, then whole passes until it has used ``--min-cpu`` CPU seconds:
user + system time of the training process and of its live workers (``psutil``), reported
apart, in microseconds per row. The load average is printed before each round: on a shared
machine compare within a round.

``--paired`` measures instead, in one process of this tree, three DataLoaders side by side:
0 workers, 2 workers, and 2 workers with the shared-memory ring turned off
(``--workers`` K instead of 2; ``PACKTOOL_LOADER_SHM=0`` for their workers: batches pickled by value, as before the ring),
persistent workers, one pass of each in turn, ``--passes`` times; each pass is charged the CPU of
the training process and of that DataLoader's own workers. Neighbouring passes see the same
load, so the ratios of each triple are the figures to read (medians and ranges printed).

Usage: python scripts/bench_transfer.py [--rounds 4] [--config LABEL=TREE:WORKERS[:VAR=VALUE]]...
       python scripts/bench_transfer.py --paired [--passes 20]
    default configurations: this tree with 0 and with 2 workers
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(args) -> None:
    """One measured run in this process (the tree to measure is first on ``sys.path``)."""
    import psutil
    import torch

    from packtool.loader import PackedIterableDataset

    sys.path.insert(1, str(ROOT / "scripts"))
    from bench_loader import live_children_cpu

    me = psutil.Process()

    def cpu():
        t = me.cpu_times()
        return t.user + t.system, live_children_cpu(me)

    ds = PackedIterableDataset(args.out, rank=0, world_size=1, batch_size=args.batch)
    kw = {"num_workers": args.workers, "persistent_workers": args.workers > 0}
    if args.workers and args.start_method:
        kw["multiprocessing_context"] = args.start_method
    loader = torch.utils.data.DataLoader(ds, batch_size=None, **kw)

    def one_pass():
        return sum(int(b["input_ids"].shape[0]) for b in loader)

    one_pass()  # warm-up: workers started, kernels loaded
    (o0, k0), t0, rows = cpu(), time.perf_counter(), 0
    while True:
        rows += one_pass()
        o1, k1 = cpu()
        if (o1 - o0) + (k1 - k0) >= args.min_cpu:
            break
    wall = time.perf_counter() - t0
    print(json.dumps({"rows": rows, "main_s": o1 - o0, "workers_s": k1 - k0, "wall_s": wall}))


def paired(args, out: Path) -> None:
    """Three DataLoaders in this process, passes alternated (module docstring)."""
    import psutil
    import torch

    from packtool.loader import PackedIterableDataset

    me = psutil.Process()
    loaders, workers = {}, {}
    K = args.workers or 2
    names = {"w": f"w{K}", "v": f"w{K} by value"}
    for label, k, env in (("w0", 0, None), (names["w"], K, None), (names["v"], K, "0")):
        before = {c.pid for c in me.children()}
        if env is not None:
            os.environ["PACKTOOL_LOADER_SHM"] = env
        ds = PackedIterableDataset(out, rank=0, world_size=1, batch_size=args.batch)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=k,
                                         persistent_workers=k > 0)
        sum(int(b["input_ids"].shape[0]) for b in dl)  # warm-up: workers made their rings
        os.environ.pop("PACKTOOL_LOADER_SHM", None)
        loaders[label] = dl
        workers[label] = [psutil.Process(p) for p in {c.pid for c in me.children()} - before]

    def cpu(label):
        t = me.cpu_times()
        total = t.user + t.system
        for w in workers[label]:
            wt = w.cpu_times()
            total += wt.user + wt.system
        return total

    us = {k: [] for k in loaders}
    print(f"load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for _ in range(args.passes):
        for label, dl in loaders.items():
            c = cpu(label)
            rows = sum(int(b["input_ids"].shape[0]) for b in dl)
            us[label].append(1e6 * (cpu(label) - c) / rows)
    print(f"after: load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")

    def line(name, xs):
        xs = sorted(xs)
        print(f"{name:<28} median {xs[len(xs) // 2]:7.2f}  range {xs[0]:7.2f} to {xs[-1]:7.2f}")

    print(f"CPU us per row over {args.passes} passes of {rows} rows each "
          f"(training process + that DataLoader's workers):")
    for label, xs in us.items():
        line(label, xs)
    print("ratios of neighbouring passes:")
    w, v = us[names["w"]], us[names["v"]]
    line(f"{names['w']} / w0", [a / b for a, b in zip(w, us["w0"])])
    line(f"{names['v']} / w0", [a / b for a, b in zip(v, us["w0"])])
    line(f"{names['w']} / {names['v']}", [a / b for a, b in zip(w, v)])


def make_output(args) -> Path:
    out = Path(args.work) / f"packed-{args.capacity}"
    if (out / "manifest.json").exists():
        return out
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_loader import make_input

    from packtool.config import PackConfig
    from packtool.pipeline import run_pack

    Path(args.work).mkdir(parents=True, exist_ok=True)
    src = make_input(Path(args.input), Path(args.work), args.repeat, 0)
    run_pack(PackConfig(inputs=(str(src),), output=str(out), capacity=args.capacity,
                        overwrite=True, workers=1), progress=False)
    return out


def parse_config(text: str) -> tuple[str, str, int, dict]:
    label, _, rest = text.partition("=")
    parts = rest.split(":")
    env = dict(p.split("=", 1) for p in parts[2:])
    return label, parts[0], int(parts[1]), env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", default=str(ROOT / "sample_data"))
    p.add_argument("--work", default="/tmp/packtool-bench-transfer")
    p.add_argument("--capacity", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--min-cpu", type=float, default=3.0)
    p.add_argument("--start-method", default=None)
    p.add_argument("--paired", action="store_true")
    p.add_argument("--passes", type=int, default=20)
    p.add_argument("--config", action="append", default=None,
                   help="LABEL=TREE:WORKERS[:VAR=VALUE...] (repeatable)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help="workers of --paired (default 2)")
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    out = make_output(args)
    if args.paired:
        paired(args, out)
        return 0
    configs = [parse_config(c) for c in (args.config or [f"w0={ROOT}:0", f"w2={ROOT}:2"])]
    results: dict = {c[0]: [] for c in configs}
    for r in range(args.rounds):
        print(f"round {r + 1}: load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}",
              flush=True)
        for label, tree, workers, env in configs:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--out", str(out),
                   "--workers", str(workers), "--batch", str(args.batch),
                   "--min-cpu", str(args.min_cpu)]
            if args.start_method:
                cmd += ["--start-method", args.start_method]
            e = dict(os.environ, PYTHONPATH=tree, **env)
            res = json.loads(subprocess.run(cmd, env=e, check=True, capture_output=True,
                                            text=True).stdout.strip().splitlines()[-1])
            us = 1e6 * (res["main_s"] + res["workers_s"]) / res["rows"]
            res["us_per_row"] = us
            results[label].append(res)
            print(f"  {label:<24} {us:8.1f} us/row  (training process "
                  f"{1e6 * res['main_s'] / res['rows']:6.1f}, workers "
                  f"{1e6 * res['workers_s'] / res['rows']:6.1f}; {res['rows']} rows, "
                  f"{res['rows'] / res['wall_s']:,.0f} rows/s)", flush=True)
    print(f"after: load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    base = configs[0][0]
    for label, *_ in configs:
        us = [x["us_per_row"] for x in results[label]]
        ratios = [a["us_per_row"] / b["us_per_row"]
                  for a, b in zip(results[label], results[base])]
        print(f"{label:<24} us/row {min(us):6.1f} to {max(us):6.1f}; / {base} per round: "
              + ", ".join(f"{x:.2f}" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
