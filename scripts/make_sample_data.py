"""Build the small tokenized sample corpus in ``sample_data/``.

The corpus is made offline and deterministically from text that ships with the
running Python interpreter:

* the standard library's own ``*.py`` sources (CPython's ``Lib/``), one document per
  file, in sorted relative-path order, skipping test folders and ``site-packages``;
* the prose help topics in ``pydoc_data.topics.topics``, one document per topic,
  sorted by topic name.

Every document is tokenized with Mistral's Tekken tokenizer (``tekken_240911.json``
from the ``mistral-common`` wheel), loaded directly with ``tiktoken``. Token ids are
real Tekken ids: the inner BPE rank plus the number of reserved special tokens, so
they run above 65,535. No BOS/EOS tokens are added.

The documents are written as a few zstd-compressed Parquet shards
(``part-00000.parquet``, ...) with the columns ``input_ids`` (``list<int32>``) and
``source`` (``string``), together with a ``README.md`` describing provenance and
statistics and a copy of CPython's ``LICENSE``. Running the script twice with the
same interpreter, tokenizer file and pyarrow version gives byte-identical files.

Usage::

    .venv/bin/python scripts/make_sample_data.py                 # pip-downloads mistral-common
    .venv/bin/python scripts/make_sample_data.py --tekken PATH   # a tekken json or a .whl
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tiktoken

#: Name of the tokenizer file inside the ``mistral-common`` wheel.
TEKKEN_FILE = "tekken_240911.json"
#: ``mistral-common`` release the tokenizer file is downloaded from by default.
MISTRAL_COMMON_VERSION = "1.13.1"
#: SHA-256 of ``tekken_240911.json`` as shipped in mistral-common 1.13.1.
TEKKEN_SHA256 = "1948e2d48b0e7377f1bb5f1210f1ae5f984934e75713fc07e2452729b8365316"

#: Documents longer than this many tokens are cut at a line break to fit.
MAX_DOC_TOKENS = 16384
#: Stdlib files left out: ``pydoc_data/topics.py`` repeats the pydoc topics verbatim.
EXCLUDED_FILES = frozenset({"pydoc_data/topics.py"})
#: Number of Parquet shards written.
NUM_SHARDS = 3
#: Rows per Parquet row group.
ROW_GROUP_ROWS = 128
#: zstd level used for the shards.
ZSTD_LEVEL = 19

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "sample_data"

SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
        pa.field("source", pa.string(), nullable=False),
    ]
)


@dataclass
class Tekken:
    """A Tekken tokenizer loaded into ``tiktoken``, plus where it came from."""

    encoding: tiktoken.Encoding
    num_special_tokens: int
    vocab_size: int
    json_sha256: str
    origin: str
    mistral_common_version: str | None

    def encode(self, text: str) -> np.ndarray:
        """Tokenize ``text`` (no special tokens) and return Tekken ids as int32."""
        ranks = self.encoding.encode_ordinary(text)
        return np.asarray(ranks, dtype=np.int64).astype(np.int32) + np.int32(self.num_special_tokens)

    def decode_bytes(self, ids: np.ndarray) -> bytes:
        """Turn Tekken ids (all non-special) back into the UTF-8 bytes they encode."""
        return self.encoding.decode_bytes((ids.astype(np.int64) - self.num_special_tokens).tolist())


@dataclass
class Document:
    """One tokenized document of the sample corpus."""

    source: str
    ids: np.ndarray
    truncated: bool


def download_wheel(dest: Path, version: str) -> Path:
    """Fetch the ``mistral-common`` wheel (without dependencies) into ``dest`` via pip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           f"mistral-common=={version}", "-d", str(dest)]
    print("running:", " ".join(cmd))
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("mistral_common-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one mistral_common wheel in {dest}, found {wheels}")
    return wheels[0]


def read_tekken_source(path: Path) -> tuple[bytes, str, str | None]:
    """Read the Tekken json from a ``.json`` file or from inside a ``mistral-common`` wheel.

    Returns the raw json bytes, a description of where they came from and the
    ``mistral-common`` version (``None`` when read from a bare json file).
    """
    if path.suffix != ".whl":
        return path.read_bytes(), str(path), None
    with zipfile.ZipFile(path) as zf:
        names = sorted(n for n in zf.namelist() if n.endswith("/" + TEKKEN_FILE))
        if len(names) != 1:
            raise SystemExit(f"{path}: expected one {TEKKEN_FILE} in the wheel, found {names}")
        version = None
        for name in sorted(zf.namelist()):
            if name.endswith(".dist-info/METADATA"):
                for line in zf.read(name).decode("utf-8").splitlines():
                    if line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                        break
        return zf.read(names[0]), f"{path.name}:{names[0]}", version


def load_tekken(raw: bytes, origin: str, version: str | None) -> Tekken:
    """Build a ``tiktoken`` encoding from Tekken json bytes, as mistral-common does.

    The json's ``config`` gives the pre-tokenization ``pattern``, the total
    ``default_vocab_size`` and ``default_num_special_tokens``. Special tokens occupy
    ids ``0 .. num_special_tokens - 1``; the BPE vocabulary uses the first
    ``default_vocab_size - num_special_tokens`` entries of ``vocab`` and a BPE rank
    ``r`` is the Tekken id ``r + num_special_tokens``.
    """
    data = json.loads(raw)
    config = data["config"]
    num_special = int(config["default_num_special_tokens"])
    vocab_size = int(config["default_vocab_size"])
    inner = vocab_size - num_special
    vocab = data["vocab"]
    if len(vocab) < inner:
        raise SystemExit(f"{origin}: vocab has {len(vocab)} entries, need {inner}")
    ranks: dict[bytes, int] = {}
    for i, tok in enumerate(vocab[:inner]):
        if tok["rank"] != i:
            raise SystemExit(f"{origin}: vocab entry {i} has rank {tok['rank']}")
        ranks[base64.b64decode(tok["token_bytes"])] = i
    if len(ranks) != inner:
        raise SystemExit(f"{origin}: duplicate token bytes in the first {inner} vocab entries")
    encoding = tiktoken.Encoding(name=Path(TEKKEN_FILE).stem, pat_str=config["pattern"],
                                 mergeable_ranks=ranks, special_tokens={})
    return Tekken(encoding, num_special, vocab_size, hashlib.sha256(raw).hexdigest(), origin, version)


def get_tekken(tekken_arg: str | None, version: str) -> Tekken:
    """Load Tekken from ``--tekken`` or, when not given, from a freshly downloaded wheel."""
    if tekken_arg:
        raw, origin, found_version = read_tekken_source(Path(tekken_arg))
        if found_version is None and hashlib.sha256(raw).hexdigest() == TEKKEN_SHA256:
            found_version = MISTRAL_COMMON_VERSION  # a bare json, identified by its hash
        return load_tekken(raw, origin, found_version)
    with tempfile.TemporaryDirectory(prefix="mistral-common-") as tmp:
        wheel = download_wheel(Path(tmp), version)
        raw, origin, found_version = read_tekken_source(wheel)
    return load_tekken(raw, origin, found_version)


def stdlib_root() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_excluded_dir(name: str) -> bool:
    """True for folders whose files are not taken (tests and third-party packages)."""
    return name.startswith("test") or name in {"idle_test", "site-packages", "__pycache__"}


def stdlib_files(root: Path) -> list[str]:
    """Relative POSIX paths of the stdlib ``*.py`` files to use, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not is_excluded_dir(d))
        rel_dir = Path(dirpath).relative_to(root)
        for fn in filenames:
            if fn.endswith(".py"):
                rel = (rel_dir / fn).as_posix()
                if rel not in EXCLUDED_FILES:
                    found.append(rel)
    return sorted(found)


def tokenize_capped(tok: Tekken, text: str) -> tuple[np.ndarray, bool]:
    """Tokenize ``text``; if it exceeds ``MAX_DOC_TOKENS``, keep whole lines that fit.

    The text is cut after the last newline inside the first ``MAX_DOC_TOKENS``
    tokens and tokenized again, so a capped document is a real prefix of the file.
    Returns the ids and whether the text was cut.
    """
    ids = tok.encode(text)
    if len(ids) <= MAX_DOC_TOKENS:
        if tok.decode_bytes(ids) != text.encode("utf-8"):
            raise AssertionError("tokenizer round trip failed")
        return ids, False
    head = tok.decode_bytes(ids[:MAX_DOC_TOKENS])
    cut = head.rfind(b"\n")
    if cut <= 0:
        raise AssertionError("no line break to cut a long document at")
    prefix = head[: cut + 1].decode("utf-8")
    ids = tok.encode(prefix)
    if len(ids) > MAX_DOC_TOKENS:
        raise AssertionError("cut document still over the cap")
    return ids, True


def collect_documents(tok: Tekken) -> list[Document]:
    """Tokenize the stdlib sources, then the pydoc topics, in their fixed order."""
    from pydoc_data.topics import topics

    root = stdlib_root()
    docs = []
    for rel in stdlib_files(root):
        text = (root / rel).read_bytes().decode("utf-8", errors="replace")
        ids, cut = tokenize_capped(tok, text)
        docs.append(Document(f"stdlib:{rel}", ids, cut))
    for key in sorted(topics):
        ids, cut = tokenize_capped(tok, topics[key])
        docs.append(Document(f"pydoc:{key}", ids, cut))
    return docs


def to_table(docs: list[Document]) -> pa.Table:
    """Arrow table with the explicit sample schema for ``docs``."""
    lengths = np.array([len(d.ids) for d in docs], dtype=np.int64)
    offsets = np.zeros(len(docs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([d.ids for d in docs]) if docs else np.zeros(0, np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.int32()),
                                   type=SCHEMA.field("input_ids").type)
    sources = pa.array([d.source for d in docs], pa.string())
    return pa.Table.from_arrays([ids, sources], schema=SCHEMA)


def write_shards(docs: list[Document], out: Path, tok: Tekken) -> list[Path]:
    """Write ``docs`` as ``NUM_SHARDS`` contiguous, equally sized shards in ``out``."""
    for old in sorted(out.glob("part-*.parquet")):
        old.unlink()
    meta = {
        b"tokenizer": TEKKEN_FILE.encode(),
        b"tokenizer_vocab_size": str(tok.vocab_size).encode(),
        b"tokenizer_num_special_tokens": str(tok.num_special_tokens).encode(),
    }
    paths = []
    bounds = np.linspace(0, len(docs), NUM_SHARDS + 1).round().astype(int)
    for i in range(NUM_SHARDS):
        table = to_table(docs[bounds[i]:bounds[i + 1]]).replace_schema_metadata(meta)
        path = out / f"part-{i:05d}.parquet"
        pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression="zstd",
                       compression_level=ZSTD_LEVEL)
        paths.append(path)
    return paths


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify_shards(paths: list[Path], docs: list[Document]) -> None:
    """Read the shards back with pyarrow and check they hold exactly ``docs``."""
    i = 0
    for path in paths:
        pf = pq.ParquetFile(path)
        if not pf.schema_arrow.equals(SCHEMA):
            raise AssertionError(f"{path}: schema {pf.schema_arrow}")
        for rg in range(pf.num_row_groups):
            t = pf.read_row_group(rg)
            for ids, src in zip(t.column("input_ids").to_pylist(), t.column("source").to_pylist()):
                if src != docs[i].source or ids != docs[i].ids.tolist():
                    raise AssertionError(f"{path}: row group {rg} differs at document {i}")
                i += 1
    if i != len(docs):
        raise AssertionError(f"read back {i} documents, wrote {len(docs)}")


def find_cpython_license() -> Path:
    """Locate CPython's LICENSE file next to the running interpreter's stdlib."""
    candidates = [stdlib_root() / "LICENSE.txt", stdlib_root() / "LICENSE",
                  Path(sys.base_prefix) / "LICENSE.txt", Path(sys.base_prefix) / "LICENSE"]
    for c in candidates:
        if c.is_file():
            return c
    raise SystemExit(f"CPython LICENSE not found; looked at {[str(c) for c in candidates]}")


def length_stats(docs: list[Document]) -> dict[str, int | float]:
    """Summary statistics of the documents' token lengths."""
    lens = np.array([len(d.ids) for d in docs], dtype=np.int64)
    return {
        "docs": len(docs),
        "tokens": int(lens.sum()),
        "min": int(lens.min()),
        "p10": float(np.percentile(lens, 10)),
        "median": float(np.median(lens)),
        "mean": float(lens.mean()),
        "p90": float(np.percentile(lens, 90)),
        "max": int(lens.max()),
        "empty": int((lens == 0).sum()),
        "le_512": int((lens <= 512).sum()),
        "gt_2048": int((lens > 2048).sum()),
        "gt_8192": int((lens > 8192).sum()),
        "gt_10000": int((lens > 10000).sum()),
        "truncated": sum(d.truncated for d in docs),
    }


def render_readme(docs: list[Document], paths: list[Path], tok: Tekken, stats: dict,
                  max_id: int, min_id: int) -> str:
    """Markdown description of the sample corpus: provenance, schema, stats, licences."""
    n_std = sum(d.source.startswith("stdlib:") for d in docs)
    n_pydoc = len(docs) - n_std
    mc = tok.mistral_common_version or "unknown (read from a bare json file)"
    lines = [
        "# Sample data",
        "",
        "A small tokenized corpus for tests, examples and benchmarks of `packtool`.",
        "Each row is one document; the shards are what `packtool` takes as input.",
        "",
        "## Regenerate",
        "",
        "```",
        ".venv/bin/python scripts/make_sample_data.py",
        "# or, with the tokenizer already on disk (json, or the mistral-common .whl):",
        ".venv/bin/python scripts/make_sample_data.py --tekken PATH",
        "```",
        "",
        f"Without `--tekken` the script runs `pip download --no-deps mistral-common=={MISTRAL_COMMON_VERSION}`",
        "into a temporary folder and reads the tokenizer from the wheel. The output is",
        "byte-identical between runs with the same Python, tokenizer file and pyarrow.",
        "",
        "## Text",
        "",
        f"From the Python that built it: `{sys.version}`",
        f"(`sys.version_info` {tuple(sys.version_info)[:3]}).",
        "",
        f"- {n_std} documents: CPython's standard library sources (`Lib/**/*.py`), one document",
        "  per file, in sorted relative-path order, read as UTF-8 (`errors=\"replace\"`).",
        "  Skipped: any folder whose name starts with `test` (`test/`, `tests/`, `lib2to3/tests/`,",
        "  ...), `idlelib/idle_test/`, `site-packages/`, and `pydoc_data/topics.py` (it repeats the",
        "  pydoc topics below). Empty files (e.g. some `__init__.py`) are kept as empty documents.",
        f"- {n_pydoc} documents: the prose help topics in `pydoc_data.topics.topics`, one per",
        "  topic, sorted by topic name.",
        f"- Documents over {MAX_DOC_TOKENS} tokens are cut after the last line break that keeps",
        f"  them within {MAX_DOC_TOKENS} tokens ({stats['truncated']} documents).",
        "",
        "`source` names the origin: `stdlib:<path relative to Lib/>` or `pydoc:<topic>`.",
        "",
        "## Tokenizer",
        "",
        f"Mistral Tekken, `{TEKKEN_FILE}` from the `mistral-common` wheel, version {mc}",
        f"(sha256 of the json: `{tok.json_sha256}`).",
        "It is loaded with `tiktoken` directly: the json's `config.pattern` is the",
        "pre-tokenization regex and the BPE ranks are the first",
        "`default_vocab_size - default_num_special_tokens` ="
        f" {tok.vocab_size} - {tok.num_special_tokens} = {tok.vocab_size - tok.num_special_tokens}",
        "entries of `vocab`. Ids are real Tekken ids: ids"
        f" 0..{tok.num_special_tokens - 1} are reserved for special tokens",
        f"and BPE rank `r` is id `r + {tok.num_special_tokens}`, so the vocabulary size is"
        f" {tok.vocab_size}.",
        "Text is encoded with `encode_ordinary`; no BOS/EOS or other special tokens are added.",
        f"Ids in the data range from {min_id} to {max_id} (above 65,535, so they do not fit uint16).",
        "",
        "## Files and schema",
        "",
        f"Zstd-compressed Parquet (level {ZSTD_LEVEL}), row groups of {ROW_GROUP_ROWS} rows.",
        "Schema:",
        "",
        "```",
        str(pq.read_schema(paths[0]).remove_metadata()),
        "```",
        "",
        "The schema metadata records the tokenizer file name, vocabulary size and number of",
        "special tokens.",
        "",
        "| file | rows | row groups | tokens | bytes | sha256 |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for path in paths:
        pf = pq.ParquetFile(path)
        n_tok = sum(len(v) for v in pf.read(columns=["input_ids"]).column(0).to_pylist())
        lines.append(f"| `{path.name}` | {pf.metadata.num_rows} | {pf.num_row_groups} | {n_tok} "
                     f"| {path.stat().st_size} | `{sha256_file(path)}` |")
    lines += [
        "",
        "## Statistics",
        "",
        f"- documents: {stats['docs']}, tokens: {stats['tokens']}",
        f"- tokens per document: min {stats['min']}, 10th percentile {stats['p10']:.0f},",
        f"  median {stats['median']:.0f}, mean {stats['mean']:.0f}, 90th percentile {stats['p90']:.0f},",
        f"  max {stats['max']}",
        f"- empty documents: {stats['empty']}; at most 512 tokens: {stats['le_512']};",
        f"  over 2048 tokens: {stats['gt_2048']}; over 8192: {stats['gt_8192']};"
        f" over 10,000: {stats['gt_10000']}",
        "",
        "## Licences",
        "",
        "The text is from CPython and is covered by the Python Software Foundation License",
        "(PSF License Agreement and the other terms in CPython's LICENSE file); a copy of the",
        "LICENSE file of the interpreter that built this data is in `LICENSE` next to this file.",
        f"The tokenizer file `{TEKKEN_FILE}` is part of `mistral-common`, licensed under the",
        "Apache License 2.0; it is not included here, only the token ids it produced.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: build, verify and describe ``sample_data/``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tekken", metavar="PATH",
                    help=f"{TEKKEN_FILE}, or a mistral-common .whl containing it "
                         "(default: pip download the wheel into a temporary folder)")
    ap.add_argument("--mistral-common-version", default=MISTRAL_COMMON_VERSION,
                    help="mistral-common version to download when --tekken is not given "
                         "(default: %(default)s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="output folder (default: %(default)s)")
    args = ap.parse_args(argv)

    tok = get_tekken(args.tekken, args.mistral_common_version)
    print(f"tokenizer: {tok.origin} (mistral-common {tok.mistral_common_version}), "
          f"sha256 {tok.json_sha256}, vocab {tok.vocab_size}, "
          f"{tok.num_special_tokens} special ids")
    if tok.json_sha256 != TEKKEN_SHA256:
        print(f"warning: tokenizer json differs from the one in mistral-common "
              f"{MISTRAL_COMMON_VERSION} (sha256 {TEKKEN_SHA256})")
    print(f"text: Python {sys.version.split()[0]} stdlib at {stdlib_root()} and pydoc_data topics")

    docs = collect_documents(tok)
    flat = np.concatenate([d.ids for d in docs])
    max_id, min_id = int(flat.max()), int(flat.min())
    assert max_id > 65535, f"max token id {max_id} should exceed 65535"
    assert min_id >= tok.num_special_tokens, f"min token id {min_id} is a special id"
    assert max_id < tok.vocab_size, f"max token id {max_id} outside the vocabulary"

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    paths = write_shards(docs, out, tok)
    verify_shards(paths, docs)
    shutil.copyfile(find_cpython_license(), out / "LICENSE")
    stats = length_stats(docs)
    (out / "README.md").write_text(render_readme(docs, paths, tok, stats, max_id, min_id),
                                   encoding="utf-8")

    print(f"documents: {stats['docs']}, tokens: {stats['tokens']}, ids {min_id}..{max_id}")
    print(f"lengths: min {stats['min']}, median {stats['median']:.0f}, max {stats['max']}, "
          f">2048: {stats['gt_2048']}, >10000: {stats['gt_10000']}, cut: {stats['truncated']}")
    for path in paths:
        print(f"wrote {path} ({path.stat().st_size} bytes, sha256 {sha256_file(path)})")
    print(f"wrote {out / 'README.md'} and {out / 'LICENSE'}")


if __name__ == "__main__":
    main()
