"""Throughput of ``packtool tokenize`` beside the floor: a plain ``encode_batch`` loop over the same
texts already in memory, with the same tokenizer, in CPU seconds (user + sys of the process and
its threads) and as ratios, rounds alternated side by side.

The text is made offline from the running interpreter: its standard library sources and pydoc
topics (the text of ``sample_data/``), repeated ``--copies`` times, one document per file or
topic, written as JSON Lines and as Parquet. Tokenizers:

- ``tokenizers``: a byte-level BPE of ``--vocab`` tokens trained here on that text (a real
  ``tokenizer.json``; training is not timed); floor: ``Tokenizer.encode_batch_fast`` in batches
  of 1024 (``encode_batch`` where the version has no fast one);
- ``tekken`` (with ``--tekken PATH``, the ``mistral-common`` wheel or its ``tekken_*.json``):
  floor: ``tiktoken`` ``encode_ordinary_batch`` in batches of 1024.

The floor runs in a child process that reads the texts from Parquet and loads the tokenizer
(both untimed in "loop", counted in "process"), then encodes. Also printed: the CPU seconds of ``packtool pack`` on the tokenized output, which bounds what a
one-pass ``pack --tokenizer`` could save (the write and the re-read of the tokenized shards).

Usage::

    python scripts/bench_tokenize.py                       # tokenizers only
    python scripts/bench_tokenize.py --tekken mistral_common-1.12.0-py3-none-any.whl --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def corpus_texts() -> list[str]:
    """The standard library's sources (no test folders) and the pydoc topics, in order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part.startswith("test") or part in ("site-packages", "idle_test")
               for part in rel[:-1]):
            continue
        texts.append(p.read_text(encoding="utf-8", errors="replace"))
    from pydoc_data.topics import topics

    texts += [topics[k] for k in sorted(topics)]
    return texts


def train_tokenizer(texts: list[str], vocab: int, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(path))


def tekken_json(src: Path, dest: Path) -> Path:
    if src.suffix != ".whl":
        return src
    with zipfile.ZipFile(src) as z:
        name = sorted(n for n in z.namelist() if n.endswith("/tekken_240911.json"))[0]
        dest.write_bytes(z.read(name))
    return dest


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def floor(kind: str, tokenizer: str, parquet: str) -> None:
    """Run in a child: texts into memory (untimed), then the timed encode loop; prints JSON."""
    import pyarrow.parquet as pq

    texts = pq.read_table(parquet).column("text").to_pylist()
    if kind == "tokenizers":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tokenizer)
        tok.encode_special_tokens = True  # as packtool tokenize: special-token text is text
        fn = getattr(tok, "encode_batch_fast", tok.encode_batch)

        def encode(b):
            return fn(b, add_special_tokens=False)
    else:
        from packtool.text.tokenizer import load_tokenizer

        enc = load_tokenizer(tokenizer)._encode  # the tiktoken call itself, nothing around it

        def encode(b):
            return enc(b)
    c0, t0 = cpu(), time.perf_counter()
    n = 0
    for lo in range(0, len(texts), 1024):
        out = encode(texts[lo:lo + 1024])
        n += sum(len(e.ids) if hasattr(e, "ids") else len(e) for e in out)
    print(json.dumps({"cpu": cpu() - c0, "wall": time.perf_counter() - t0, "tokens": n}))


def child_cpu(cmd: list[str]) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                                                                   "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall,
            res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=2, help="Times the text is repeated.")
    ap.add_argument("--vocab", type=int, default=32000, help="Trained BPE vocabulary size.")
    ap.add_argument("--tekken", default=None, help="mistral-common wheel or tekken JSON.")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--floor", nargs=3, metavar=("KIND", "TOKENIZER", "PARQUET"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor:
        floor(*args.floor)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as tmp:
        tmp = Path(tmp)
        texts = corpus_texts()
        (tmp / "text").mkdir()
        pq.write_table(pa.table({"text": texts * args.copies}), tmp / "text" / "docs.parquet")
        with open(tmp / "docs.jsonl", "w", encoding="utf-8") as f:
            for t in texts * args.copies:
                f.write(json.dumps({"text": t}) + "\n")
        mb = sum(len(t.encode()) for t in texts) * args.copies / 1e6
        print(f"text: {len(texts) * args.copies:,} documents, {mb:.1f} MB; "
              f"{os.cpu_count()} cores; Python {sys.version.split()[0]}")
        tokenizers = [("tokenizers", tmp / "tokenizer.json")]
        train_tokenizer(texts, args.vocab, tmp / "tokenizer.json")
        if args.tekken:
            tokenizers.append(("tekken", tekken_json(Path(args.tekken), tmp / "tekken.json")))
        py = sys.executable
        for kind, tok in tokenizers:
            for fmt, src in (("jsonl", tmp / "docs.jsonl"), ("parquet", tmp / "text")):
                ratios = []
                for r in range(args.rounds):
                    f_cpu, f_wall, out = child_cpu([py, __file__, "--floor", kind, str(tok),
                                                    str(tmp / "text" / "docs.parquet")])
                    tokens = json.loads(out)["tokens"]
                    f_cpu_loop = json.loads(out)["cpu"]
                    t_cpu, t_wall, _ = child_cpu([py, "-m", "packtool", "tokenize", "-q",
                                                  "--overwrite", "--tokenizer", str(tok), str(src),
                                                  str(tmp / "tok")])
                    p_cpu, p_wall, _ = child_cpu([py, "-m", "packtool", "pack", "-q",
                                                  "--overwrite", "-c", "2048", str(tmp / "tok"),
                                                  str(tmp / "packed")])
                    ratios.append((t_cpu / f_cpu_loop, t_cpu / f_cpu))
                    print(f"{kind:10s} {fmt:7s} round {r}: {tokens / 1e6:.2f} M tokens; floor "
                          f"encode loop {f_cpu_loop:.2f} CPU s ({f_wall:.2f} s wall with its "
                          f"read, {f_cpu:.2f} CPU s whole process); packtool tokenize "
                          f"{t_cpu:.2f} CPU s ({t_wall:.2f} s wall) = {t_cpu / f_cpu_loop:.2f}x "
                          f"the loop, {tokens / t_cpu / 1e6:.2f} M tokens per CPU s; then pack "
                          f"{p_cpu:.2f} CPU s ({p_wall:.2f} s wall)")
                print(f"{kind:10s} {fmt:7s} tokenize / floor loop, per round: "
                      + ", ".join(f"{a:.2f}" for a, _ in ratios)
                      + "; tokenize / floor process (read, tokenizer load, loop): "
                      + ", ".join(f"{b:.2f}" for _, b in ratios))


if __name__ == "__main__":
    main()
