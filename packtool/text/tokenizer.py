"""Tokenizers loaded from local files only (never a download), behind one small interface.

Three kinds of file, recognised by content:

- a Hugging Face ``tokenizers`` JSON (``tokenizer.json``: a ``"model"`` object), loaded with
  ``tokenizers.Tokenizer.from_file``; texts are encoded on ``threads`` threads of packtool's
  own, each encoding its share of a batch serially (``encode_batch_fast`` where the version has
  it: no offsets). The library's Rayon pool is not used: it takes every core whatever it is
  asked, and is sized once per process (``RAYON_NUM_THREADS`` read when it first starts), so
  ``TOKENIZERS_PARALLELISM`` is ``false`` while packtool encodes a batch and the caller's value
  (or none) is put back after it;
- a Mistral Tekken JSON (``tekken_*.json`` of the ``mistral-common`` wheel: ``"config"`` and a
  ``"vocab"`` list of base64 ``token_bytes``), read into ``tiktoken``: the BPE ranks are the first
  ``default_vocab_size - default_num_special_tokens`` entries of ``vocab``, the pre-tokenisation
  regex is ``config.pattern``, and an id is the rank plus ``default_num_special_tokens`` (the
  special tokens take ids 0 ..);
- a ``tiktoken`` BPE file (one ``base64-token rank`` pair per line: ``cl100k_base.tiktoken``,
  Llama 3's ``tokenizer.model``), read into ``tiktoken`` with the pre-tokenisation regex and
  special tokens of the ``tiktoken`` encoding of the file's name (``o200k_base``, ``cl100k_base``,
  ``p50k_base``, ``r50k_base``: taken from ``tiktoken_ext.openai_public`` with the ranks of the
  given file, so nothing is fetched), or with ``pattern`` for any other BPE file.

Every kind encodes plain text: special-token strings in the text are encoded as text, never as
control tokens. BOS/EOS are added by id, outside the tokenizer (:mod:`packtool.text.run`).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packtool.errors import (ConfigError, InputError, MissingDependencyError, exc_line,
                             first_line,
                             install_hint)

__all__ = ["Tokenizer", "load_tokenizer", "TIKTOKEN_ENCODINGS"]

#: tiktoken encodings whose regex and special tokens a ``.tiktoken`` file of that name gets.
TIKTOKEN_ENCODINGS = ("o200k_base", "cl100k_base", "p50k_base", "r50k_base")


def _require(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{module} is not installed; packtool tokenize needs it: "
                                     + install_hint("tokenize")) from None


@dataclass
class Tokenizer:
    """A loaded tokenizer: ``encode(texts)`` gives the documents' ids back to back.

    Attributes:
        kind: ``tokenizers``, ``tekken`` or ``tiktoken``.
        path: the file it was loaded from.
        sha256: hex sha256 of that file (recorded in the output's manifest and fingerprint).
        vocab_size: ids are in 0 .. vocab_size - 1 (the largest id of the file + 1, gaps
            included; a BPE file read with ``--tokenizer-pattern``: its ranks only, the special
            tokens above them being unknown, :attr:`recorded_vocab_size`).
        specials: special token string -> id (for ``--append-eos </s>`` and friends).
        specials_known: False for a BPE file read with ``--tokenizer-pattern``: its special
            tokens live above its ranks (Llama 3's ``<|end_of_text|>`` is 128001 over 128,000
            ranks) and the file does not list them, so any id an int32 holds is accepted.
    """

    kind: str
    path: str
    sha256: str
    vocab_size: int
    specials: dict = field(default_factory=dict)
    _encode: object = None  #: list[str] -> list[list[int]]
    _offset: int = 0  #: added to every id the encoder returns (Tekken)
    version: str = ""  #: the library's version (recorded: it can change the ids)
    specials_known: bool = True

    @property
    def recorded_vocab_size(self) -> int | None:
        """The vocabulary size a tokenize output's manifest records (``ids 0 .. size - 1``
        holds every id the model takes): :attr:`vocab_size`, None for a file whose special
        tokens are not known (:attr:`specials_known`: they sit above its ranks, how far the
        file does not say, so no id of the model's is known to lie outside a size)."""
        return self.vocab_size if self.specials_known else None

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode a batch of documents.

        Returns:
            (lengths int64[docs], ids int32[sum(lengths)]).
        """
        out = self._encode(texts)
        lengths = np.fromiter((len(x) for x in out), dtype=np.int64, count=len(out))
        # C-level iteration (about 30 ns a token), no per-document array
        ids = np.fromiter(itertools.chain.from_iterable(out), dtype=np.int64,
                          count=int(lengths.sum()))
        if self._offset:
            ids += self._offset
        return lengths, ids.astype(np.int32)

    def token_id(self, value: str | int, option: str = "--append-eos") -> int:
        """An id given as a number or as a special token string (``</s>``, ``<|endoftext|>``).

        Args:
            value: the id, or the special token's exact string.
            option: the option that gave it, for messages (``--append-eos``, ``--prepend-bos``).

        Raises:
            ConfigError: not a number, not a special token of this tokenizer, or an id outside
                its vocabulary (0 .. ``vocab_size`` - 1: a larger id fails at the model's
                embedding lookup; 0 .. 2**31 - 1 when the file lists no special tokens).
        """
        if isinstance(value, int) or _INTEGER.fullmatch(str(value)):
            i = int(value)
        elif value in self.specials:
            i = int(self.specials[value])
        else:
            if not self.specials:
                raise ConfigError(f"{option} {value!r}: {self.path} names no special tokens; "
                                  f"give the token's id instead{_NO_SPECIALS[self.kind]}")
            names = ", ".join(sorted(self.specials)[:8])
            raise ConfigError(f"{option} {value!r} is not a special token of {self.path} (it has: "
                              f"{names}{', ...' if len(self.specials) > 8 else ''}); give the "
                              "token's id or its exact string")
        if not self.specials_known and 0 <= i < 2**31:
            return i  # a special token above the ranks the file does not name
        if not 0 <= i < self.vocab_size:
            raise ConfigError(f"{option} {value}: id {i} is outside the vocabulary of "
                              f"{Path(self.path).name} ({self.vocab_size:,} ids: 0.."
                              f"{self.vocab_size - 1}); give an id of this tokenizer")
        return i


#: Where the id of a special token is found, by the kind of a file that names none.
_NO_SPECIALS = {
    "tekken": " (Mistral's Tekken files: <s> is 1, </s> is 2)",
    "tiktoken": (" (a BPE file lists its ranks only, the special tokens sit above them: the "
                 "model's config.json names bos_token_id and eos_token_id)"),
    "tokenizers": " (the model's config.json names bos_token_id and eos_token_id)",
}

#: an id on the command line: ASCII digits only (str.isdigit also takes '²', which int refuses)
_INTEGER = re.compile(r"-?[0-9]+")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _hf(path: Path, digest: str, add_special_tokens: bool, threads: int) -> Tokenizer:
    tokenizers = _require("tokenizers")
    try:
        tok = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises plain Exception for a bad file
        raise InputError(f"{path}: not a readable tokenizers JSON ({first_line(exc)}); give a "
                         "tokenizer.json saved by the Hugging Face tokenizers library") from None
    # special-token strings written in a document ("</s>" in a page about tokenizers) are text:
    # encoded as the tokens of those characters, never as the control ids
    tok.encode_special_tokens = True
    # a tokenizer.json may carry the padding and truncation its model was trained with: each
    # document is encoded whole and alone (padding would add pad ids to the shorter documents of a
    # batch, truncation cut long ones in silence; packing handles both lengths)
    tok.no_padding()
    tok.no_truncation()
    fast = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    # the library's Rayon pool takes every core, whatever -j says, once it starts (and
    # RAYON_NUM_THREADS counts only before that, once per process): it is off while a batch is
    # encoded (the library reads TOKENIZERS_PARALLELISM at each call; the caller's value is put
    # back after it), each call below encoding serially with the GIL released, on the threads
    # of packtool's own pool
    pool = ThreadPoolExecutor(threads, "packtool-encode") if threads > 1 else None

    def part(texts):
        return [e.ids for e in fast(texts, add_special_tokens=add_special_tokens)]

    def encode(texts):
        before = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            if pool is None or len(texts) < 2:
                out = part(texts)
            else:  # a few parts a thread: documents of unequal length still share the work
                step = -(-len(texts) // (threads * 4))
                out = [ids for ids_of in pool.map(part, [texts[i:i + step]
                                                         for i in range(0, len(texts), step)])
                       for ids in ids_of]
        finally:
            if before is None:
                del os.environ["TOKENIZERS_PARALLELISM"]
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = before
        if add_special_tokens:  # an empty text stays empty: no [BOS, EOS] document of nothing
            out = [ids if t else [] for t, ids in zip(texts, out)]
        return out

    specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
    # ids 0 .. the largest id + 1: a vocabulary may skip ids (a WordLevel {"[UNK]": 0,
    # "world": 7} holds 2 entries and id 7), so its entry count is not its size
    size = max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    return Tokenizer("tokenizers", str(path), digest, size,
                     specials, encode, 0, tokenizers.__version__)


def _tiktoken_encoder(tiktoken, name: str, pattern: str, ranks: dict, specials: dict,
                      threads: int, source: str | None = None):
    """A tiktoken encoding and its batch encoder. ``source``: the file the pattern came from
    (None: ``--tokenizer-pattern``), named when the pattern is not a valid regex.

    Raises:
        ConfigError, InputError: ``pattern`` is not a valid regex (of the option, of the file).
    """
    try:
        enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens=specials)
    except ValueError as exc:  # the regex engine's parse error
        cause = first_line(exc)
        if source is None:
            raise ConfigError(f"--tokenizer-pattern {pattern!r}: not a valid regex ({cause}); "
                              "give the tokenizer's pre-tokenisation regex") from None
        raise InputError(f"{source}: its pattern is not a valid regex ({cause}); give a "
                         "tokenizer file as its library wrote it") from None

    def encode(texts):
        return enc.encode_ordinary_batch(texts, num_threads=threads)

    return enc, encode


def _tekken(path: Path, data: dict, digest: str, threads: int) -> Tokenizer:
    tiktoken = _require("tiktoken")
    try:
        cfg = data["config"]
        n_special = int(cfg["default_num_special_tokens"])
        inner = int(cfg["default_vocab_size"]) - n_special
        ranks = {base64.b64decode(t["token_bytes"]): i for i, t in enumerate(data["vocab"][:inner])}
        pattern = cfg["pattern"]
        specials = {t["token_str"]: int(t["rank"]) for t in data.get("special_tokens", [])}
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: not a readable Tekken tokenizer ({exc_line(exc)});"
                         " give the tekken_*.json of mistral-common") from None
    if len(ranks) != inner:
        raise InputError(f"{path}: {len(ranks)} distinct BPE tokens, config says {inner}")
    _, encode = _tiktoken_encoder(tiktoken, path.stem, pattern, ranks, {}, threads, str(path))
    return Tokenizer("tekken", str(path), digest, inner + n_special, specials, encode, n_special,
                     tiktoken.__version__ if hasattr(tiktoken, "__version__") else "")


def _bpe_ranks(path: Path) -> dict:
    ranks = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError:
                raise InputError(f"{path}: line {n}: not a 'base64-token rank' pair; give a "
                                 "tiktoken BPE file, a tokenizer.json or a Tekken JSON") from None
    if not ranks:
        raise InputError(f"{path}: no BPE ranks; give a tiktoken BPE file")
    return ranks


def _tiktoken_file(path: Path, digest: str, pattern: str | None, threads: int) -> Tokenizer:
    tiktoken = _require("tiktoken")
    ranks = _bpe_ranks(path)
    name = path.name.split(".")[0]
    specials: dict = {}
    source = None  # --tokenizer-pattern, named in a regex error
    if pattern is None:
        source = str(path)
        if name not in TIKTOKEN_ENCODINGS:
            raise ConfigError(f"{path}: a BPE file whose name is none of "
                              f"{', '.join(TIKTOKEN_ENCODINGS)}; pass --tokenizer-pattern REGEX "
                              "(its pre-tokenisation regex)")
        import tiktoken_ext.openai_public as public

        real = public.load_tiktoken_bpe
        public.load_tiktoken_bpe = lambda *a, **k: ranks  # the given file, never a download
        try:
            spec = public.ENCODING_CONSTRUCTORS[name]()
        finally:
            public.load_tiktoken_bpe = real
        pattern, specials = spec["pat_str"], dict(spec["special_tokens"])
    _, encode = _tiktoken_encoder(tiktoken, name, pattern, ranks, specials, threads, source)
    size = max([*ranks.values(), *specials.values()]) + 1
    return Tokenizer("tiktoken", str(path), digest, size, specials, encode, 0,
                     getattr(tiktoken, "__version__", ""), specials_known=source is not None)


#: the tokenizer file a folder given as ``--tokenizer`` is read from, as Hugging Face's
#: ``from_pretrained`` (``tokenizer.json``) and mistral-common (``tekken.json``) look for it
FOLDER_FILES = ("tokenizer.json", "tekken.json")
#: JSON saved beside a tokenizer that configures it (or the model) but is not the tokenizer
CONFIG_NAMES = ("tokenizer_config.json", "config.json", "special_tokens_map.json",
                "generation_config.json")


def _beside(path: Path) -> str:
    """The tokenizer file to give instead of ``path`` (a config saved beside it): the one of
    :data:`FOLDER_FILES` in its folder, else words saying where it is."""
    found = [path.parent / n for n in FOLDER_FILES if (path.parent / n).is_file()]
    if len(found) == 1:
        return f"the {found[0].name} beside it: --tokenizer {found[0]}"
    return ("the tokenizer.json saved with it (beside it in the model's folder; or a Tekken "
            "JSON or a tiktoken BPE file)")


def _file_in_folder(folder: Path) -> Path:
    """The tokenizer file of a folder given as ``--tokenizer``: the one of
    :data:`FOLDER_FILES` it holds.

    Raises:
        InputError: the folder holds none of them (the message names the files there that
            look like a tokenizer, if any) or more than one.
    """
    found = [n for n in FOLDER_FILES if (folder / n).is_file()]
    if len(found) == 1:
        return folder / found[0]
    if found:
        raise InputError(f"{folder}: is a folder holding both {' and '.join(found)}; give one "
                         f"of them: --tokenizer {folder / found[0]}")
    try:
        names = sorted(e.name for e in folder.iterdir() if e.is_file())
    except OSError:
        names = []
    like = [n for n in names if n.endswith((".tiktoken", ".model")) or
            (n.endswith(".json") and n.startswith(("tokenizer", "tekken")) and
             n not in CONFIG_NAMES)]
    there = f"; it holds {', '.join(like)}: give that file" if like else ""
    raise InputError(f"{folder}: is a folder with no {' or '.join(FOLDER_FILES)}{there}; give "
                     "the tokenizer file itself (a tokenizer.json, a Tekken JSON or a tiktoken "
                     "BPE file)")


def load_tokenizer(path: str | os.PathLike, *, pattern: str | None = None,
                   add_special_tokens: bool = False, threads: int | None = None) -> Tokenizer:
    """Load a tokenizer from a local file (kinds in the module docstring).

    Args:
        path: ``tokenizer.json``, a Tekken JSON, or a tiktoken BPE file; or a folder holding
            exactly one of :data:`FOLDER_FILES` (a model's folder), which is read.
        pattern: pre-tokenisation regex of a tiktoken BPE file not named after a tiktoken
            encoding.
        add_special_tokens: ``tokenizers`` only: run the tokenizer's post-processor (the BOS
            or EOS its template adds).
        threads: encoding threads, for every kind (``tokenizers``: packtool's threads, the
            library's own pool turned off); default: all cores.

    Raises:
        InputError: the file is missing or not one of the three kinds (the message says which
            it was read as, and a config saved beside a tokenizer, :data:`CONFIG_NAMES`, that
            it is one); a folder holds none or both of :data:`FOLDER_FILES`.
        ConfigError: a BPE file without a known name or ``pattern``; ``add_special_tokens`` or
            ``pattern`` with a kind that has no use for it; ``pattern`` not a valid regex.
        MissingDependencyError: ``tokenizers`` or ``tiktoken`` is not installed.
    """
    from packtool.location import Location

    where = Location.parse(path)  # a file: URI names a local path (LocationError if no path)
    if not where.is_local:
        raise ConfigError(f"--tokenizer {where.display}: a tokenizer is read from a local file; "
                          "download it first")
    p = where.path
    if p.is_dir():
        p = _file_in_folder(p)
    if not p.is_file():
        raise InputError(f"{p}: no such tokenizer file (packtool downloads nothing, so a "
                         "model name such as gpt2 is not looked up); give the path of a local "
                         "tokenizer.json, Tekken JSON or tiktoken BPE file (e.g. the "
                         "tokenizer.json of a downloaded model folder)")
    threads = threads or os.cpu_count() or 1
    digest = _sha256(p)
    with open(p, "rb") as f:  # JSON may begin with a byte-order mark and white space
        head = f.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()[:1]
    if head == b"{":
        try:
            data = json.loads(p.read_bytes())
        except ValueError as exc:
            raise InputError(f"{p}: not valid JSON ({first_line(exc)}); give a tokenizer.json, "
                             "a Tekken JSON or a tiktoken BPE file") from None
        if pattern is not None:
            raise ConfigError("--tokenizer-pattern applies to tiktoken BPE files only")
        if isinstance(data, dict) and "model" in data:
            return _hf(p, digest, add_special_tokens, threads)
        if isinstance(data, dict) and "config" in data and "vocab" in data:
            if add_special_tokens:
                raise ConfigError("--add-special-tokens applies to tokenizers JSON files only; "
                                  "add BOS/EOS with --prepend-bos/--append-eos")
            return _tekken(p, data, digest, threads)
        if p.name in CONFIG_NAMES:
            raise InputError(f"{p}: is the tokenizer's config (or the model's), not the "
                             f"tokenizer; give {_beside(p)}")
        raise InputError(f"{p}: JSON that is neither a tokenizers JSON (no \"model\") nor a "
                         "Tekken JSON (no \"config\" and \"vocab\"); give a tokenizer.json, a "
                         "Tekken JSON or a tiktoken BPE file")
    if add_special_tokens:
        raise ConfigError("--add-special-tokens applies to tokenizers JSON files only; add "
                          "BOS/EOS with --prepend-bos/--append-eos")
    return _tiktoken_file(p, digest, pattern, threads)
