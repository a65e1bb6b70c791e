"""Build a real tokenized corpus of >= 100 M tokens offline, for measurements (never committed).

The text is what any Python machine already holds: the standard library's sources and the
source files and documentation of the installed packages (every ``site-packages`` and
``dist-packages`` directory of ``sys.path`` and of the system Pythons, plus ``/usr/share/doc``),
read in sorted path order, one document per file, without a length cap (long files are what
``--overflow split`` is for). Files are taken by extension (``.py .pyi .pyx .c .h .cc .cpp
.hpp .cu .cuh .rs .go .js .ts .md .rst .txt``), at most 2 MB each, and deduplicated by
content hash. Every document is tokenized with Mistral's Tekken tokenizer exactly as
``scripts/make_sample_data.py`` does (the ``mistral-common`` wheel read by ``tiktoken``; real
ids above 65,535).

Output: ``OUT/part-NNNNN.parquet``, zstd, column ``input_ids`` (``list<int32>``) and ``source``
(the path), about 20,000 documents per shard; ``OUT/_corpus.json`` lists the sources, documents,
tokens and length quantiles (a ``_`` name, which ``pack`` skips, so OUT packs as it is). Stops
after ``--tokens`` tokens.

Usage::

    .venv/bin/python scripts/make_corpus.py --out /tmp/corpus                # pip-downloads the wheel
    .venv/bin/python scripts/make_corpus.py --out /tmp/corpus --tekken PATH  # a tekken json or .whl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import site
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sample_data import MISTRAL_COMMON_VERSION, get_tekken  # noqa: E402

#: File extensions taken as documents (source code and prose).
EXTENSIONS = frozenset(".py .pyi .pyx .c .h .cc .cpp .hpp .cu .cuh .rs .go .js .ts .md .rst "
                       ".txt".split())
#: Files larger than this are skipped (generated tables, vendored bundles).
MAX_FILE_BYTES = 2 << 20
#: Documents per output shard.
DOCS_PER_SHARD = 20_000
SCHEMA = pa.schema([pa.field("input_ids", pa.list_(pa.field("item", pa.int32(), nullable=False)),
                             nullable=False),
                    pa.field("source", pa.string(), nullable=False)])


def source_roots() -> list[Path]:
    """Directories searched, in order: the stdlib, site/dist-packages, /usr/share/doc."""
    cands = [sysconfig.get_paths()["stdlib"], *site.getsitepackages(), site.getusersitepackages(),
             *sys.path]
    for base in ("/usr/lib", "/usr/local/lib"):
        if os.path.isdir(base):
            cands += sorted(str(p) for p in Path(base).glob("python3*/*-packages"))
    cands.append("/usr/share/doc")
    roots, seen = [], {Path(__file__).resolve().parent}  # not this script's own folder
    for c in cands:
        p = Path(c).resolve() if c else None
        if p is None or not p.is_dir() or p in seen or any(r in p.parents for r in roots):
            continue
        seen.add(p)
        roots.append(p)
    return roots


def iter_files(roots: list[Path]):
    """(root, path) of every candidate file, sorted within each root, roots in order."""
    seen_dirs = set()
    for root in roots:
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            real = os.path.realpath(dirpath)
            if real in seen_dirs:
                dirnames[:] = []
                continue
            seen_dirs.add(real)
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in filenames:
                if os.path.splitext(fn)[1] in EXTENSIONS:
                    found.append(os.path.join(dirpath, fn))
        for path in sorted(found):
            yield root, path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory (created)")
    ap.add_argument("--tokens", type=int, default=120_000_000, help="stop after this many tokens")
    ap.add_argument("--tekken", metavar="PATH", help="tekken json or mistral-common wheel")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    tok = get_tekken(args.tekken, MISTRAL_COMMON_VERSION)
    args.out.mkdir(parents=True, exist_ok=True)
    roots = source_roots()
    t0 = time.perf_counter()
    hashes, lengths, pending, shard, total = set(), [], [], 0, 0

    def flush():
        nonlocal pending, shard
        if not pending:
            return
        texts = [t for _, t in pending]
        ranks = tok.encoding.encode_ordinary_batch(texts, num_threads=args.threads)
        ids = [np.asarray(r, dtype=np.int64).astype(np.int32) + np.int32(tok.num_special_tokens)
               for r in ranks]
        lens = np.array([a.size for a in ids], dtype=np.int64)
        offsets = np.zeros(lens.size + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        col = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                       pa.array(np.concatenate(ids)),
                                       type=SCHEMA.field("input_ids").type)
        table = pa.Table.from_arrays([col, pa.array([s for s, _ in pending])], schema=SCHEMA)
        pq.write_table(table, args.out / f"part-{shard:05d}.parquet", compression="zstd",
                       row_group_size=4096)
        lengths.append(lens)
        print(f"shard {shard}: {lens.size:,} documents, {int(lens.sum()):,} tokens "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        shard += 1
        pending = []

    est = 0  # tokens pending, estimated at 3 bytes per token; only decides when to flush
    for root, path in iter_files(roots):
        try:
            if os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            raw = open(path, "rb").read()
        except OSError:
            continue
        h = hashlib.sha256(raw).digest()
        if h in hashes or not raw.strip():
            continue
        hashes.add(h)
        pending.append((path, raw.decode("utf-8", errors="replace")))
        est += len(raw) // 3
        if len(pending) == DOCS_PER_SHARD or total + est >= args.tokens:
            flush()
            total, est = int(sum(x.sum() for x in lengths)), 0
            if total >= args.tokens:
                break
    flush()
    lens = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    q = np.quantile(lens, [0.1, 0.5, 0.9, 0.99]).tolist() if lens.size else []
    info = {"roots": [str(r) for r in roots], "documents": int(lens.size),
            "tokens": int(lens.sum()), "length_quantiles_p10_p50_p90_p99": q,
            "tokenizer": {"origin": tok.origin, "sha256": tok.json_sha256,
                          "mistral_common": tok.mistral_common_version},
            "seconds": round(time.perf_counter() - t0, 1)}
    (args.out / "_corpus.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))
    if info["tokens"] < args.tokens:
        print(f"warning: only {info['tokens']:,} tokens found (asked {args.tokens:,})",
              file=sys.stderr)


if __name__ == "__main__":
    main()
