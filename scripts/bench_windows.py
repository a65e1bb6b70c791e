"""Extra rows of windowed plans against one global plan, on corpora stored by source.

For each capacity C and window size N: the rows over ceil(tokens / C) of one global plan
(obfd), of windows of N contiguous documents (how windows were cut before), and of windows dealt
in blocks across the whole input (``pack --window-docs N``, :mod:`packtool.core.windows`),
beside the target: at most 1.5x the global plan's extra rows, or the global plan's plus 2 per
window when that is larger. Lengths only (dry runs, as ``packtool stats --compare``), so the
figures are exactly what ``pack`` would write.

Corpora:

- ``--input DIR``: a tokenized corpus, e.g. real ids built by ``scripts/make_corpus.py``, which
  stores documents by source (the stdlib, then each installed package, then /usr/share/doc);
- ``--synthetic``: six sources of sharply different lengths (log-normal, medians 60, 1,700,
  300, 6,000, 20 and 900 tokens), 280,000 documents stored source after source.

Usage: ``python scripts/bench_windows.py --input /tmp/corpus --synthetic [--capacity 2048 8192]
[--window-docs 5000 20000]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packtool.core.packing import pack_lengths  # noqa: E402
from packtool.core.windows import plan_windows  # noqa: E402

#: (median tokens, documents) of the synthetic sources, in storage order.
SOURCES = [(60, 60_000), (1700, 40_000), (300, 50_000), (6000, 10_000), (20, 80_000),
           (900, 40_000)]


def synthetic(capacity: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([np.clip(rng.lognormal(np.log(m), 0.5, n), 1, 4 * capacity)
                           .astype(np.int64) for m, n in SOURCES])


def extra_rows(lengths: np.ndarray, capacity: int) -> int:
    plan = pack_lengths(lengths, capacity)
    return plan.num_rows - (-(-int(plan.seg_len.sum()) // capacity))


def rows_of(lengths: np.ndarray, capacity: int) -> int:
    return pack_lengths(lengths, capacity).num_rows if lengths.size else 0


def row(name: str, lengths: np.ndarray, capacity: int, n: int) -> str:
    lb = -(-int(lengths.sum()) // capacity)
    glob = extra_rows(lengths, capacity)
    contiguous = sum(rows_of(lengths[a:a + n], capacity) for a in range(0, lengths.size, n)) - lb
    ws = plan_windows(lengths.size, n)
    dealt = sum(rows_of(lengths[ws.members(w)], capacity) for w in range(ws.count)) - lb
    target = max(1.5 * glob, glob + 2 * ws.count)
    return (f"| {name} | {lengths.size:,} | {int(lengths.sum()):,} | {capacity} | {n:,} | "
            f"{ws.count} | {glob:,} | {contiguous:,} | **{dealt:,}** | {target:,.0f} | "
            f"{'yes' if dealt <= target else 'NO'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", default=None, metavar="DIR", help="a tokenized corpus")
    ap.add_argument("--synthetic", action="store_true", help="the six-source synthetic corpus")
    ap.add_argument("--capacity", type=int, nargs="+", default=[2048])
    ap.add_argument("--window-docs", type=int, nargs="+", default=[5000, 20000])
    args = ap.parse_args()
    print("| corpus | documents | tokens | C | window | windows | extra rows, global plan | "
          "contiguous windows | dealt windows | target | met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    corpora = []
    if args.input:
        from packtool.analysis import input_lengths

        corpora.append((Path(args.input).name, lambda c: input_lengths([args.input])))
    if args.synthetic:
        corpora.append(("synthetic, 6 sources", synthetic))
    for name, make in corpora:
        for c in args.capacity:
            lengths = np.asarray(make(c), dtype=np.int64)
            for n in args.window_docs:
                print(row(name, lengths, c, n), flush=True)


if __name__ == "__main__":
    main()
