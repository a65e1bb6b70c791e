"""The manifest: one typed record of a packtool output, written last; its presence means complete.

:class:`Manifest` (frozen) records the packtool version, the fingerprint of inputs and options,
the capacity, the labels fact (:class:`LabelsInfo`: stored or not, and the convention every reader
hands out), the options that decide the bytes, the input files (:class:`InputEntry`), every shard
(:class:`ShardEntry`: rows, row groups, bytes, sha256 of the file and of its Parquet footer), the
windows when the pack was windowed (:class:`WindowEntry`, and how documents were dealt to them:
:class:`Windowing`), the totals
(:class:`~packtool.stats.PackStats`) and, with ``pack --source-column``, the source table
(:attr:`Manifest.source_column` and :attr:`Manifest.source_values`, written as ``sources`` only
when set). Every consumer reads it as attributes, through
:func:`read_manifest`; the one reader of the shards (:mod:`packtool.formats.packed`) builds its
row-group index from it without opening a shard.

**Kinds.** :attr:`Manifest.kind` says what the shards hold: :data:`PACKED_KIND` (``packtool
pack``: packed rows, the default) or :data:`TOKENIZED_KIND` (``packtool tokenize``: one document
per row, ``input_ids`` only; no capacity and no labels fact, totals ``docs_in``, ``tokens_in`` and
the BOS/EOS counts). A tokenized output is ``pack`` input, never packed rows: every reader of
packed rows refuses it in one line (:func:`require_packed`). ``kind`` is written only when it is
not ``packed``, so a packed output's manifest is what it was before kinds existed.

**What tokenize did.** A pack of ``packtool tokenize`` outputs all made with one tokenizer
records what their manifests agree on, the tokenizer and the BOS/EOS ids tokenize added
(:attr:`Manifest.tokenized`, a :class:`Tokenization`; JSON ``tokenized``, written only when
set), so ``export --to nemo`` knows the EOS id, ``stats`` names the tokenizer and the loader
refuses to mix the ids of two tokenizers. It is an optional key added to version 4, not a new
version: every packtool reading version 4 takes the keys it knows from the manifest and ignores
the others (:meth:`Manifest.from_dict`; ``upgrade`` rewrites only versions 2 and 3, which never
hold it), so an older packtool reads such an output as before, without the record.

**Which held-out output pairs with which.** The two outputs of ``pack --holdout`` record
their pairing (:attr:`Manifest.holdout_pair`, a :class:`HoldoutPairing`; JSON
``holdout_pair``, written only when set): an id both carry and where the other one is. A
repack of OUTPUT that no longer writes the held-out output its previous manifest named warns
that this output is stale, and ``stats``, ``export`` and the loader warn when they read a
held-out output whose training output, read, no longer pairs with it (:func:`stale_holdout`;
one whose training output is not there to read is not called stale): its documents may then be
among the training rows. Like ``tokenized`` it is an optional key of
version 4, not a new version; outputs without it (packed before it was recorded) are read as
before, with no pairing asked of them.

**Format versions.** 4 (this one): the totals' ``tokens_dropped`` counts every token read and
not written, the tails ``--overflow truncate`` cut included (``tokens_truncated`` is that part;
:data:`packtool.stats.COUNTS_REVISION` 2); shards as version 3. 3: shards carry Parquet page
checksums, the manifest records each shard's row groups and footer sha256, the labels fact once
(``labels``; the shards' schema metadata says the same convention); ``tokens_dropped`` left the
truncated tails out. 2: no page checksums, no row groups or footer sha256 in the manifest,
labels recorded in several fields. Outputs of versions 2 and 3 stay readable as they are
(:meth:`Manifest.from_dict` takes them, their totals converted to this version's meaning:
``tokens_dropped`` += ``tokens_truncated``; for version 2 the reader then opens each shard's
footer to index it), and ``packtool upgrade OUT`` rewrites only their manifest as version 4
after checking every shard's sha256 (:func:`packtool.formats.upgrade.upgrade_manifest`), so
nobody repacks for a manifest change.

**A directory that is a dataset.** OUTPUT must open as it is, as a directory, in every common
Parquet reader. Measured with pyarrow 26, polars 2.1, duckdb 2.0 and datasets 5.2:

==================================  ==========  =======  ======  ============================
extra file beside the shards        pyarrow     polars   duckdb  ``load_dataset("parquet",
                                    dataset,                     data_dir=...)``
                                    read_table
==================================  ==========  =======  ======  ============================
``manifest.json``                   fails       fails    ok      fails
``_manifest.json``, ``_x/m.json``   skips       fails    ok      fails
``.manifest.json``, ``.x/m.json``   skips       fails    ok      skips
``_manifest.parquet`` (0 rows)      skips       0 rows   0 rows  fails (batch size 0)
``.packtool-manifest.parquet``      skips       0 rows   0 rows  skips
(0 rows, the shards' schema)
==================================  ==========  =======  ======  ============================

polars refuses any directory holding a file of another extension, hidden or not, so no JSON
name works for every reader. The manifest is therefore a hidden Parquet file with the shards'
schema and no rows, its JSON in the key-value metadata (:data:`MANIFEST_META_KEY`), the way
Parquet's own ``_common_metadata`` file carries a schema: pyarrow and datasets skip it (leading
``.``), polars and duckdb add zero rows.

While ``pack`` runs, OUTPUT also holds :data:`IN_PROGRESS_NAME` and :data:`TMP_DIR_NAME`
(removed when the manifest is written); an output with them is incomplete anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shlex
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Callable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from packtool.errors import (InputError, ManifestError, PacktoolError, exc_line, first_line,
                             raise_if_shortage, row_ref)
from packtool.location import Location, StoreError
from packtool.signals import result as task_result
from packtool.stats import PackStats

__all__ = ["REPACK_MISSING", "MANIFEST_NAME", "MANIFEST_META_KEY", "IN_PROGRESS_NAME",
           "TMP_DIR_NAME", "LOCK_NAME",
           "pack_running", "run_holding", "writing_error", "running_error", "a_file_error",
           "marker_kind", "packed_outputs_below", "nested_outputs_error", "OUTPUT_MARKS", "output_mark", "output_words", "enclosing_output",
           "nested_output", "output_around",
           "run_words",
           "SHARD_GLOB", "FORMAT_VERSION", "READABLE_VERSIONS", "Manifest", "ShardEntry",
           "InputEntry", "IN_MEMORY_INPUT", "input_display", "LabelsInfo", "WindowEntry",
           "Windowing", "TokenizerInfo", "Tokenization",
           "TOKENIZATION_FACTS", "PACKED_KIND", "TOKENIZED_KIND", "HoldoutPairing",
           "stale_holdout", "dropped_holdout",
           "KINDS",
           "require_packed", "older_version_note", "manifest_bytes", "publish_manifest",
           "read_manifest", "read_manifest_and_schema", "load_manifest", "check_shards",
           "sha256_of", "store_failure",
           "footer_sha256", "footer_of", "shard_entry_of", "shard_name",
           "is_shard_name", "PENDING_SUFFIX", "pending_name", "is_pending_name", "shard_files",
           "stray_data_files"]

#: How a manifest names the in-memory documents of ``packtool.pack_dataset`` among its inputs
#: (the temporary file they went through is gone once they are packed); not a path.
IN_MEMORY_INPUT = "<in-memory documents: packtool.pack_dataset>"


def input_display(path: str) -> str:
    """How a message names an input a manifest records (:attr:`InputEntry.path`): a path or URI
    as :func:`packtool.location.display` shows it; :data:`IN_MEMORY_INPUT` as the documents it
    stands for, never as a file."""
    if path == IN_MEMORY_INPUT:
        return "the in-memory documents of packtool.pack_dataset"
    return Location.parse(path).display


#: File name of the manifest inside OUTPUT (a zero-row Parquet file, see the module docstring).
MANIFEST_NAME = ".packtool-manifest.parquet"
#: Key-value metadata key of the manifest file holding the manifest JSON.
MANIFEST_META_KEY = b"packtool.manifest"
#: Marker of a pack in progress (its input fingerprint), removed when the manifest is written.
IN_PROGRESS_NAME = ".packtool-in-progress.json"
#: Scratch directory of a pack in progress (the token spill file, window markers).
TMP_DIR_NAME = ".packtool-tmp"
#: Lock file held by the one ``pack`` writing OUTPUT (removed when it ends).
LOCK_NAME = ".packtool.lock"
#: Glob of the output shards at OUTPUT's top level.
SHARD_GLOB = "part-*.parquet"
#: A finished shard waits under its pending name (:func:`pending_name`) until the manifest is
#: written: hidden (``pyarrow.dataset`` and ``datasets`` skip names starting with ``.``) and not
#: ending in ``.parquet`` (polars' and duckdb's ``*.parquet`` globs, which match hidden names
#: too), so no Parquet reader sees the rows of a pack not yet complete.
PENDING_SUFFIX = ".pending"
#: The version this packtool writes.
FORMAT_VERSION = 4
#: The versions this packtool reads (2, 3: see the module docstring).
READABLE_VERSIONS = (2, 3, 4)
#: The first version whose totals count the truncated tails in ``tokens_dropped``.
_DROPPED_COUNTS_TRUNCATED = 4
#: Bytes read from a file's end to find its Parquet footer in one request (most footers fit).
_TAIL_BYTES = 1 << 16
#: :attr:`Manifest.kind` of a ``packtool pack`` output: packed rows.
PACKED_KIND = "packed"
#: :attr:`Manifest.kind` of a ``packtool tokenize`` output: one document per row.
TOKENIZED_KIND = "tokenized"
#: Every kind a manifest may say.
KINDS = (PACKED_KIND, TOKENIZED_KIND)


def shard_name(index: int) -> str:
    """File name of output shard ``index`` (``part-00000.parquet``)."""
    return f"part-{index:05d}.parquet"


def is_shard_name(name: str) -> bool:
    """True for a name of the :data:`SHARD_GLOB` form."""
    return name.startswith("part-") and name.endswith(".parquet")


def pending_name(name: str) -> str:
    """Where finished shard ``name`` waits until the manifest is written
    (``.part-00000.parquet.pending``; :data:`PENDING_SUFFIX`)."""
    return f".{name}{PENDING_SUFFIX}"


def is_pending_name(name: str) -> bool:
    """True for the pending name of a shard (:func:`pending_name`)."""
    return (name.startswith(".") and name.endswith(PENDING_SUFFIX)
            and is_shard_name(name[1:-len(PENDING_SUFFIX)]))


def shard_files(found: Mapping) -> list[str]:
    """The finished shards in a listing of OUTPUT (name -> :class:`~packtool.location.Entry`),
    by their final names: those under it and those still pending (:func:`pending_name`)."""
    names = {n for n, e in found.items() if not e.is_dir and is_shard_name(n)}
    names |= {n[1:-len(PENDING_SUFFIX)] for n, e in found.items()
              if not e.is_dir and is_pending_name(n)}
    return sorted(names)


@dataclass(frozen=True)
class LabelsInfo:
    """The labels fact of an output, recorded once.

    Attributes:
        stored: True when the shards hold a ``labels`` column (``--labels unshifted|shifted``, or
            an input labels column was read); False: readers derive them from ``input_ids`` and
            ``segment_ids``.
        convention: what every reader hands out, stored or derived: ``unshifted`` (the model
            shifts; Hugging Face) or ``shifted`` (``labels[i]`` is the target of position i).
    """

    stored: bool
    convention: str

    def __post_init__(self) -> None:
        if self.convention not in ("unshifted", "shifted"):
            raise ValueError(f"labels convention {self.convention!r}: unshifted or shifted")


@dataclass(frozen=True)
class ShardEntry:
    """One shard of the output.

    Attributes:
        file: file name inside OUTPUT (``part-00000.parquet``).
        rows: rows in the shard.
        bytes: file size.
        sha256: hex sha256 of the whole file.
        footer_sha256: hex sha256 of its Parquet footer (metadata, its length and ``PAR1``);
            None for a version-2 output not upgraded.
        row_groups: ``((rows, count), ...)``: ``count`` row groups of ``rows`` rows each, in
            order (run-length form); empty for a version-2 output.
    """

    file: str
    rows: int
    bytes: int
    sha256: str
    footer_sha256: str | None = None
    row_groups: tuple = ()

    def group_rows(self) -> list[int]:
        """Rows of every row group, in order (expanded from :attr:`row_groups`)."""
        return [int(r) for r, n in self.row_groups for _ in range(int(n))]

    def to_dict(self) -> dict:
        return {"file": self.file, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256,
                "footer_sha256": self.footer_sha256,
                "row_groups": [list(rg) for rg in self.row_groups]}

    @staticmethod
    def run_lengths(group_rows) -> tuple:
        """``((rows, count), ...)`` of a list of row-group sizes."""
        out: list[list[int]] = []
        for r in group_rows:
            if out and out[-1][0] == int(r):
                out[-1][1] += 1
            else:
                out.append([int(r), 1])
        return tuple((r, n) for r, n in out)


@dataclass(frozen=True)
class InputEntry:
    """One input file: where it was read (a path or a URI without secrets), rows, bytes."""

    path: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class WindowEntry:
    """One window of a windowed pack (``--window-docs``): its documents and what it cost.

    Documents are dealt to windows in blocks across the whole input (:class:`Windowing`), so a
    window is not one run of documents: ``first_doc`` and ``inputs`` (where a contiguous window
    of an older pack came from) are None and empty for the windows this packtool writes, and
    kept when a manifest of that older form is read.
    """

    index: int
    docs: int
    tokens: int
    real_tokens: int
    rows: int
    lower_bound_rows: int
    extra_rows: int
    first_doc: int | None = None  #: an older pack's contiguous window: its first document
    inputs: tuple = ()  #: an older pack's ``({"path", "first_row", "docs"}, ...)``

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("first_doc", "inputs")}
        if self.first_doc is not None:  # the older form, written back as it was read
            d["first_doc"] = self.first_doc
            d["inputs"] = [dict(i) for i in self.inputs]
        return d

    @classmethod
    def from_dict(cls, w: dict) -> "WindowEntry":
        """Both forms: with ``first_doc`` and ``inputs`` (contiguous windows) or without."""
        return cls(int(w["index"]), int(w["docs"]), int(w["tokens"]), int(w["real_tokens"]),
                   int(w["rows"]), int(w["lower_bound_rows"]), int(w["extra_rows"]),
                   None if w.get("first_doc") is None else int(w["first_doc"]),
                   tuple(dict(i) for i in w.get("inputs") or ()))


@dataclass(frozen=True)
class Windowing:
    """How a windowed pack dealt its documents to windows: block ``j`` (global documents
    ``j * block_docs .. (j + 1) * block_docs - 1``) went to window ``j mod windows``
    (:mod:`packtool.core.windows`)."""

    windows: int
    block_docs: int

    #: the rule in words, written beside the numbers
    RULE = ("block j (documents j*block_docs .. (j+1)*block_docs-1) is in window j mod windows")

    def window_of(self, doc: int) -> int:
        """The window that planned global document ``doc``."""
        return (int(doc) // self.block_docs) % self.windows

    def to_dict(self) -> dict:
        return {"windows": self.windows, "block_docs": self.block_docs, "rule": self.RULE}

    @classmethod
    def from_dict(cls, d: dict) -> "Windowing":
        return cls(int(d["windows"]), int(d["block_docs"]))


#: The ids a :class:`Tokenization` records beside its tokenizer, each when the inputs agree.
TOKENIZATION_FACTS = ("append_eos", "prepend_bos")


@dataclass(frozen=True)
class TokenizerInfo:
    """The tokenizer a ``packtool tokenize`` output was made with, as its manifest records it
    (``options.tokenizer``).

    Attributes:
        kind: ``tokenizers``, ``tekken`` or ``tiktoken``.
        sha256: hex sha256 of the tokenizer file: with ``kind``, what says two outputs' ids
            mean the same tokens (:meth:`same_ids`).
        file: the file's name (no directory); None when the agreeing inputs named it otherwise.
        vocab_size: ids are in 0 .. vocab_size - 1; None when not recorded.
        library_version: the version of the library that encoded; None when not recorded (or
            the agreeing inputs were encoded by different versions).
        special_tokens_in_text: how a special-token string in a text was encoded (``text``);
            None when not recorded (a tokenize of before it was).
    """

    kind: str
    sha256: str
    file: str | None = None
    vocab_size: int | None = None
    library_version: str | None = None
    special_tokens_in_text: str | None = None

    def same_ids(self, other: "TokenizerInfo") -> bool:
        """True when ``other`` is the same tokenizer file read the same way (kind and sha256):
        an id means the same token in both."""
        return (self.kind, self.sha256) == (other.kind, other.sha256)

    def describe(self) -> str:
        """``tokenizer.json (tokenizers, 400 ids, sha256 1a2b3c4d5e6f)`` for a message."""
        size = f", {self.vocab_size:,} ids" if self.vocab_size is not None else ""
        name = self.file or "(file names differ)"
        return f"{name} ({self.kind}{size}, sha256 {self.sha256[:12]})"

    def to_dict(self) -> dict:
        """The JSON form: ``kind`` and ``sha256``, then each other field that is known."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TokenizerInfo":
        """The record of a JSON dict (a tokenize manifest's ``options.tokenizer`` or a packed
        manifest's ``tokenized.tokenizer``); keys it does not know are left out.

        Raises:
            KeyError, TypeError, ValueError: no ``kind`` or ``sha256``, or a malformed value.
        """
        def opt(name, cast):
            return None if d.get(name) is None else cast(d[name])

        return cls(str(d["kind"]), str(d["sha256"]), opt("file", str),
                   opt("vocab_size", int), opt("library_version", str),
                   opt("special_tokens_in_text", str))

    @classmethod
    def common(cls, infos: "list[TokenizerInfo]") -> "TokenizerInfo | None":
        """The one tokenizer of ``infos`` (each field kept where they all agree, None where
        they do not), or None when they are not all the same tokenizer (:meth:`same_ids`) or
        ``infos`` is empty."""
        if not infos or any(not infos[0].same_ids(i) for i in infos[1:]):
            return None
        values = {f.name: {getattr(i, f.name) for i in infos} for f in fields(cls)}
        return cls(**{k: next(iter(v)) if len(v) == 1 else None for k, v in values.items()})


@dataclass(frozen=True)
class Tokenization:
    """What ``packtool tokenize`` did to the documents of a packed output, as the manifests of
    the tokenize outputs it was packed from say: the tokenizer whose ids the rows hold and the
    BOS/EOS ids tokenize added (``--prepend-bos``, ``--append-eos``).

    A pack records it (:attr:`Manifest.tokenized`, JSON ``tokenized``) only when every input
    file is a shard of a finished tokenize output and all were made with one tokenizer
    (:meth:`common`): an id means something only with its tokenizer, so inputs of two
    tokenizers, or any input that is not a tokenize output (plain Parquet: nothing is known of
    it), record nothing. Of the BOS/EOS ids, one the inputs disagree on (``--append-eos`` given
    to one tokenize and not to another) is not recorded (named in :attr:`differs`, its field
    None). The record is not in the pack's fingerprint: the input files, which the fingerprint
    covers, decide it.

    Attributes:
        tokenizer: the tokenizer (:class:`TokenizerInfo`).
        append_eos: the EOS id tokenize appended to every non-empty document; None: none was
            appended (or the inputs disagree: ``"append_eos"`` in :attr:`differs`).
        prepend_bos: the BOS id tokenize prepended, likewise.
        differs: the ids (:data:`TOKENIZATION_FACTS`) not recorded: the inputs disagree on
            them, or a tokenizer template may have added them (:meth:`of_manifest`).

    Raises:
        ValueError: an unknown name in ``differs``, or a fact both recorded and said to differ.
    """

    tokenizer: TokenizerInfo
    append_eos: int | None = None
    prepend_bos: int | None = None
    differs: tuple = ()

    def __post_init__(self) -> None:
        unknown = set(self.differs) - set(TOKENIZATION_FACTS)
        if unknown:
            raise ValueError(f"unknown tokenization facts {sorted(unknown)}: "
                             f"{', '.join(TOKENIZATION_FACTS)}")
        for name in self.differs:
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is recorded and said to differ")
        object.__setattr__(self, "differs",
                           tuple(n for n in TOKENIZATION_FACTS if n in self.differs))

    def knows(self, fact: str) -> bool:
        """True when the id ``fact`` (one of :data:`TOKENIZATION_FACTS`) is recorded."""
        return fact not in self.differs

    @classmethod
    def of_manifest(cls, manifest: "Manifest") -> "Tokenization":
        """What the manifest of a finished ``packtool tokenize`` output (kind ``tokenized``)
        says of its documents (its options ``tokenizer``, ``append_eos`` and ``prepend_bos``).
        With ``--add-special-tokens`` the tokenizer's own template may have added a BOS or EOS
        that no option names (a post-processor adding ``<s> ... </s>``): an id no option gave is
        then not known (in :attr:`differs`), never recorded as none added.

        Raises:
            KeyError, TypeError, ValueError: a manifest without them, or malformed.
        """
        opts = manifest.options

        def boundary(name):
            return None if opts.get(name) is None else int(opts[name])

        given = {name: boundary(name) for name in TOKENIZATION_FACTS}
        templated = bool(opts.get("add_special_tokens"))
        return cls(TokenizerInfo.from_dict(opts["tokenizer"]), given["append_eos"],
                   given["prepend_bos"],
                   differs=tuple(n for n, v in given.items() if templated and v is None))

    @classmethod
    def common(cls, records) -> "Tokenization | None":
        """What the records of every input file (a :class:`Tokenization`, or None for a file
        that is not a shard of a tokenize output) agree on: their one tokenizer
        (:meth:`TokenizerInfo.common`) and each id all agree on; None when ``records`` is
        empty, holds a None, or holds two tokenizers (:meth:`TokenizerInfo.same_ids`)."""
        records = list(records)
        if not records or any(r is None for r in records):
            return None
        tokenizer = TokenizerInfo.common([r.tokenizer for r in records])
        if tokenizer is None:
            return None
        known: dict = {}
        for name in TOKENIZATION_FACTS:
            if all(r.knows(name) for r in records):
                values = {getattr(r, name) for r in records}
                if len(values) == 1:
                    known[name] = values.pop()
        return cls(tokenizer, **known,
                   differs=tuple(n for n in TOKENIZATION_FACTS if n not in known))

    def to_dict(self) -> dict:
        """The JSON form: the tokenizer and each id recorded (an id the inputs disagree on is
        left out, so an absent key is one not known; null: tokenize added none)."""
        d = {"tokenizer": self.tokenizer.to_dict()}
        for name in TOKENIZATION_FACTS:
            if self.knows(name):
                d[name] = getattr(self, name)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "Tokenization":
        """The record of its JSON form (:meth:`to_dict`): an id absent is one that differs.

        Raises:
            KeyError, TypeError, ValueError: no tokenizer, or a malformed value.
        """
        if not isinstance(d, Mapping):
            raise TypeError(f"tokenized: a JSON object, not {type(d).__name__}")
        return cls(TokenizerInfo.from_dict(d["tokenizer"]),
                   None if d.get("append_eos") is None else int(d["append_eos"]),
                   None if d.get("prepend_bos") is None else int(d["prepend_bos"]),
                   differs=tuple(n for n in TOKENIZATION_FACTS if n not in d))

    def vocabulary_warnings(self, options: Mapping, repack: bool = False,
                            padding_tokens: int | None = None) -> list[str]:
        """One line for each id a pack wrote of its own that lies outside the recorded
        vocabulary (0 .. ``vocab_size`` - 1): ``pad_id`` (every padded slot; only when the
        output holds padding tokens), ``append_eos``
        and ``prepend_bos`` (a token of every document) of ``options`` (a packed manifest's
        options, or ``PackConfig.layout_options()``). The documents' own ids come from the
        recorded tokenizer, whose ids are all inside it, so these options are the only ids a
        packed output can hold beyond it. Each such id is fed to the embedding and fails
        there (IndexError, a device assert on a GPU) unless the model's embedding has more
        rows than the tokenizer has ids, so it is warned of, not refused. Empty when the
        vocabulary size is not recorded.

        Args:
            options: the ids by option name (``pad_id``, ``append_eos``, ``prepend_bos``;
                None or absent: not given).
            repack: word the fix for a finished output (``stats``): pack again with
                ``--overwrite``.
            padding_tokens: how many padding tokens the output holds (its totals); 0: no
                position holds ``pad_id``, so it is not warned of; None: not known, warned of.
        """
        v = self.tokenizer.vocab_size
        if v is None:
            return []
        eos = self.append_eos if self.append_eos is not None and self.append_eos < v else None
        example = f"the EOS id {eos}" if eos is not None else "the tokenizer's EOS id"
        name = self.tokenizer.file or "the tokenizer"
        again = " and --overwrite" if repack else ""
        out = []
        for key, flag, where in (("pad_id", "--pad-id", "every padded position"),
                                 ("append_eos", "--append-eos", "the end of every document"),
                                 ("prepend_bos", "--prepend-bos",
                                  "the start of every document")):
            value = options.get(key)
            if value is None or 0 <= int(value) < v or (key == "pad_id" and padding_tokens == 0):
                continue
            out.append(f"{flag} {int(value)} is outside the vocabulary of {name} "
                       f"({v:,} ids: 0..{v - 1}) the inputs were tokenized with: {where} holds "
                       f"id {int(value)}, which fails at the model's embedding unless it has "
                       f"more than {int(value)} rows; pack with {flag} <an id below {v:,}, "
                       f"e.g. {example}>{again}")
        return out

    def describe(self) -> list[tuple[str, str]]:
        """``(label, value)`` of each fact, for ``packtool stats``: the tokenizer
        (:meth:`TokenizerInfo.describe`), then the EOS and BOS ids (``id 2``; ``none`` when
        tokenize added none; ``not recorded`` when the inputs disagree or the tokenizer's
        template may have added one)."""
        differs = ("not recorded (the inputs disagree, or --add-special-tokens let the "
                   "tokenizer's template add one)")
        out = [("tokenizer", self.tokenizer.describe())]
        for label, name in (("EOS added by tokenize", "append_eos"),
                            ("BOS added by tokenize", "prepend_bos")):
            value = getattr(self, name)
            out.append((label, differs if not self.knows(name) else
                        "none" if value is None else f"id {value}"))
        return out


@dataclass(frozen=True)
class HoldoutPairing:
    """How one of the two outputs of ``pack --holdout`` names the other (its manifest's
    ``holdout_pair``; which of the two it is, its options' ``holdout_part`` say).

    Attributes:
        pair: the id both outputs of one pair carry (:meth:`of_pack`: decided by both
            fingerprints, so a rerun of the same command, resumed or not, writes the same id,
            and a pack of other inputs or options another).
        partner: where the other output is: a local path relative to this output's directory
            (``../out-holdout``: the pair may be moved together), or a store URI without its
            options and credentials.
    """

    pair: str
    partner: str

    @classmethod
    def of_pack(cls, train, train_fp: str, held, held_fp: str
                ) -> "tuple[HoldoutPairing, HoldoutPairing]":
        """The pairings of the training output ``train`` (fingerprint ``train_fp``) and the
        held-out output ``held`` (``held_fp``), in that order (paths or URIs)."""
        a, b = Location.parse(train), Location.parse(held)
        pair = hashlib.sha256(json.dumps([train_fp, held_fp]).encode()).hexdigest()[:24]
        return cls(pair, _relative(b, a)), cls(pair, _relative(a, b))

    def partner_of(self, here) -> Location:
        """The partner's location, for the output at ``here`` (a path or URI) that records
        this pairing: a relative partner is taken from ``here`` (a store's credentials and
        options with it), an absolute one as it is (a store URI with ``here``'s options)."""
        loc = Location.parse(here)
        if "://" in self.partner or os.path.isabs(self.partner):
            other = Location.parse(self.partner)
            return other if other.is_local or loc.is_local else \
                type(other)(other.scheme, other.key, loc.query)
        if loc.is_local:
            return Location.parse(os.path.normpath(os.path.join(loc.path, self.partner)))
        key = posixpath.normpath(posixpath.join(loc.key, self.partner))
        return type(loc)(loc.scheme, key, loc.query)

    def names(self, here, other) -> bool:
        """True when this pairing, recorded by the output at ``here``, names ``other``."""
        return _place(self.partner_of(here)) == _place(Location.parse(other))

    def to_dict(self) -> dict:
        return {"pair": self.pair, "partner": self.partner}

    @classmethod
    def from_dict(cls, d: Mapping) -> "HoldoutPairing":
        """The record of its JSON form.

        Raises:
            KeyError, TypeError: not an object with ``pair`` and ``partner``.
        """
        if not isinstance(d, Mapping):
            raise TypeError(f"holdout_pair: a JSON object, not {type(d).__name__}")
        return cls(str(d["pair"]), str(d["partner"]))


def _place(loc: Location) -> tuple:
    """A value equal for two names of one local folder (links followed) or one store prefix
    (its credentials and options aside)."""
    return (("local", loc.path.resolve().as_posix()) if loc.is_local else
            ("store", loc.display.partition("?")[0]))


def _relative(target: Location, base: Location) -> str:
    """``target`` as a partner recorded by the output at ``base``: relative for two local
    paths, or two prefixes of one bucket (never a credential), else the store URI without
    credentials or options."""
    if target.is_local and base.is_local:
        return os.path.relpath(target.path.resolve(), base.path.resolve())
    a, b = _place(target)[1], _place(base)[1]
    if not (target.is_local or base.is_local) and target.scheme == base.scheme \
            and a.split("/")[:3] == b.split("/")[:3]:  # scheme://bucket
        return posixpath.relpath(a, b)
    return a if not target.is_local else str(target.path.resolve())


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The typed manifest of a packed output (see the module docstring).

    Attributes:
        format_version: the version it was written as (:data:`READABLE_VERSIONS`).
        packtool_version: the packtool that wrote it.
        fingerprint: sha256 of the inputs, options and byte-deciding versions.
        capacity: C, tokens per row (0 for a tokenized output).
        labels: the labels fact (:class:`LabelsInfo`); None for a tokenized output.
        options: the options that decided the bytes (read-only mapping).
        inputs: the input files in document order.
        shards: the shards in row order.
        totals: the counts of the whole output (a tokenized output: ``docs_in``, ``tokens_in``
            and the BOS/EOS counts).
        windows: the windows of a windowed pack (empty otherwise).
        windowing: how a windowed pack dealt documents to its windows (:class:`Windowing`);
            None without windows, and for an older windowed pack (contiguous windows, each
            :class:`WindowEntry` with its ``first_doc``).
        kind: :data:`PACKED_KIND` (default) or :data:`TOKENIZED_KIND`.
        source_column: the input column ``pack --source-column`` carried, or None.
        source_values: the id -> value table of the shards' ``source_ids`` (id ``i`` is
            ``source_values[i]``: strings or ints, sorted), empty without ``--source-column``.
        tokenized: a pack of ``packtool tokenize`` outputs: what their manifests agree on (the
            tokenizer, the BOS/EOS ids tokenize added: :class:`Tokenization`); None for any
            other pack (and a tokenized output, whose options say it), and for one written
            before it was recorded.
        holdout_pair: one of the two outputs of ``pack --holdout``: its pairing with the other
            (:class:`HoldoutPairing`); None for any other output, and for one packed before
            pairings were recorded.

    Raises:
        ValueError: an unknown kind, a packed manifest without a labels fact,
            ``source_values`` without a ``source_column``, or ``tokenized`` on a tokenized
            output.
    """

    format_version: int
    packtool_version: str
    fingerprint: str
    capacity: int = 0
    labels: LabelsInfo | None = None
    options: Mapping = field(default_factory=dict)
    inputs: tuple = ()
    shards: tuple = ()
    totals: PackStats = field(default_factory=PackStats)
    windows: tuple = ()
    windowing: Windowing | None = None
    kind: str = PACKED_KIND
    source_column: str | None = None
    source_values: tuple = ()
    tokenized: Tokenization | None = None
    holdout_pair: HoldoutPairing | None = None
    #: the totals count apart the documents the rows under ``--min-fill`` left out whole
    #: (``docs_under_min_fill``, ``doc_tokens_under_min_fill``); False for a manifest written
    #: before they were, whose ``docs_dropped`` mixes them with ``--overflow drop``'s
    min_fill_docs_recorded: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"manifest kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.kind == PACKED_KIND and self.labels is None:
            raise ValueError("a packed manifest records its labels fact (LabelsInfo)")
        if self.source_values and self.source_column is None:
            raise ValueError("source_values without a source_column")
        if self.tokenized is not None and self.kind != PACKED_KIND:
            raise ValueError("a tokenized output records its tokenization in its options")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "source_values", tuple(self.source_values))

    def __reduce__(self):  # a mapping proxy does not pickle: rebuild from the plain values
        return (_manifest_from_state, (self.to_dict(),))

    @property
    def num_rows(self) -> int:
        """Rows over all shards."""
        return sum(s.rows for s in self.shards)

    def output_warnings(self, padding: bool = True) -> list[str]:
        """The loud lines a reader of this packed output prints (``stats``, ``export``): those
        of its totals (:meth:`~packtool.stats.PackStats.output_warnings`), then each id its
        pack wrote outside the recorded tokenizer's vocabulary
        (:meth:`Tokenization.vocabulary_warnings`): ``--pad-id`` only when the rows hold
        padding tokens and ``padding`` is True (False: a reader that writes no padding, as
        an export, whose output holds no pad id)."""
        out = self.totals.output_warnings(self.options)
        if self.tokenized is not None:
            out += self.tokenized.vocabulary_warnings(
                self.options, repack=True,
                padding_tokens=self.totals.padding_tokens if padding else 0)
        return out

    @property
    def is_packed(self) -> bool:
        """True for packed rows (``packtool pack``), False for a tokenized output."""
        return self.kind == PACKED_KIND

    @property
    def label_masked(self) -> bool:
        """True when an input labels column left some targets -100 on purpose (SFT prompts):
        the effective targets are then fewer than sum(len - 1)."""
        return self.totals.tokens_label_masked > 0

    @property
    def indexed(self) -> bool:
        """True when every shard's row groups are recorded (no footer needed to index)."""
        return all(s.row_groups or not s.rows for s in self.shards)

    def input_row(self, doc: int) -> str:
        """How a message names the input of global document ``doc`` (a ``doc_ids`` entry):
        ``row 3 (0-based) of docs.parquet``, its file among :attr:`inputs` (document order)
        and its row there; ``document 3 (doc_ids)`` when the inputs' rows do not reach it."""
        first = 0
        for entry in self.inputs:
            if first <= doc < first + entry.rows:
                return f"{row_ref(doc - first)} of {input_display(entry.path)}"
            first += entry.rows
        return f"document {int(doc)} (doc_ids)"

    def shard(self, name: str) -> ShardEntry:
        """The entry of shard ``name``.

        Raises:
            KeyError: no such shard.
        """
        for s in self.shards:
            if s.file == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict:
        """The JSON form written in the manifest file (:data:`FORMAT_VERSION`; ``kind`` only when it is
        not ``packed``; a tokenized output has no ``capacity`` or ``labels``; ``sources``,
        ``tokenized`` and ``holdout_pair`` only when set)."""
        d = {"format_version": FORMAT_VERSION, "packtool_version": self.packtool_version,
             "fingerprint": self.fingerprint, "options": dict(self.options),
             "inputs": [{"path": i.path, "rows": i.rows, "bytes": i.bytes} for i in self.inputs],
             "shards": [s.to_dict() for s in self.shards],
             "totals": self.totals.to_dict()}
        if "min_fill" not in self.options:  # listed only with --min-fill: older manifests
            for k in ("rows_dropped", "tokens_under_min_fill", "docs_under_min_fill",
                      "doc_tokens_under_min_fill"):  # keep their form
                if not d["totals"][k]:
                    del d["totals"][k]
        if not self.min_fill_docs_recorded:  # as it was read: the counts it did not record
            for k in ("docs_under_min_fill", "doc_tokens_under_min_fill"):
                d["totals"].pop(k, None)
        if self.kind == PACKED_KIND:
            d["capacity"] = self.capacity
            d["labels"] = {"stored": self.labels.stored, "convention": self.labels.convention}
        else:
            d["kind"] = self.kind
        if self.windowing is not None:
            d["windowing"] = self.windowing.to_dict()
        if self.windows:
            d["windows"] = [w.to_dict() for w in self.windows]
        if self.source_column is not None:
            d["sources"] = {"column": self.source_column, "values": list(self.source_values)}
        if self.tokenized is not None:
            d["tokenized"] = self.tokenized.to_dict()
        if self.holdout_pair is not None:
            d["holdout_pair"] = self.holdout_pair.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "manifest") -> "Manifest":
        """The manifest of a JSON dict of format version 2, 3 or 4; the totals of versions 2 and
        3 are converted to this version's meaning (``tokens_dropped`` counts the truncated tails
        too; :meth:`packtool.stats.PackStats.from_dict`).

        Raises:
            ManifestError: another version, a version its layout contradicts (a packed
                manifest's shards are ``outputs`` in version 2, ``shards`` in 3 and 4), or a
                missing or malformed field (``where`` names the manifest file).
        """
        version = d.get("format_version") if isinstance(d, dict) else None
        if version not in READABLE_VERSIONS:
            raise ManifestError(f"{where}: format_version {version!r}; this packtool reads "
                                f"{', '.join(map(str, READABLE_VERSIONS))}: use the packtool "
                                "that wrote it, or repack with this one")
        kind = d.get("kind", PACKED_KIND)
        if kind not in KINDS:
            raise ManifestError(f"{where}: manifest of kind {kind!r}; this packtool reads "
                                f"{', '.join(KINDS)}: use the packtool that wrote it")
        listed = "outputs" if "outputs" in d else "shards" if "shards" in d else None
        if kind == PACKED_KIND and listed is not None and (listed == "outputs") != (version == 2):
            raise ManifestError(
                f"{where}: format_version {version} contradicts its layout (shards listed "
                f"under {listed!r}, as version {'2' if listed == 'outputs' else '3 and 4'} "
                "list them): the manifest was edited or damaged; restore it from a copy of "
                "this output, or rerun the same packtool pack with --overwrite")
        try:
            opts = dict(d.get("options") or {})
            if kind != PACKED_KIND:
                stored = conv = None
                capacity = 0
                shards = tuple(ShardEntry(
                    str(o["file"]), int(o["rows"]), int(o["bytes"]), str(o["sha256"]),
                    o.get("footer_sha256"),
                    tuple((int(r), int(n)) for r, n in o.get("row_groups") or ()))
                    for o in d["shards"])
            elif version == 2:
                option = str(opts.get("labels", "none"))
                info = d.get("labels") if isinstance(d.get("labels"), dict) else {}
                stored = bool(info.get("stored", option != "none"))
                conv = str(info.get("convention", "unshifted" if option == "none" else option))
                capacity = int(opts["capacity"])
                shards = tuple(ShardEntry(str(o["file"]), int(o["rows"]), int(o["bytes"]),
                                          str(o["sha256"])) for o in d["outputs"])
                for k in ("labels",):
                    opts.pop(k, None)
            else:
                stored, conv = bool(d["labels"]["stored"]), str(d["labels"]["convention"])
                capacity = int(d["capacity"])
                shards = tuple(ShardEntry(
                    str(o["file"]), int(o["rows"]), int(o["bytes"]), str(o["sha256"]),
                    o.get("footer_sha256"),
                    tuple((int(r), int(n)) for r, n in o.get("row_groups") or ()))
                    for o in d["shards"])
            windows = tuple(WindowEntry.from_dict(w) for w in d.get("windows") or ())
            windowing = (Windowing.from_dict(d["windowing"]) if d.get("windowing") is not None
                         else None)
            src = d.get("sources") or {}
            values = tuple(v if isinstance(v, str) else int(v) for v in src.get("values") or ())
            return cls(format_version=int(version),
                       packtool_version=str(d.get("packtool_version", "")),
                       fingerprint=str(d.get("fingerprint", "")), capacity=capacity,
                       labels=None if stored is None else LabelsInfo(stored, conv), options=opts,
                       inputs=tuple(InputEntry(str(i["path"]), int(i["rows"]), int(i["bytes"]))
                                    for i in d.get("inputs") or ()),
                       shards=shards, totals=PackStats.from_dict(
                           d.get("totals") or {},
                           revision=2 if version >= _DROPPED_COUNTS_TRUNCATED else 1),
                       windows=windows, windowing=windowing, kind=kind,
                       min_fill_docs_recorded=("docs_under_min_fill" in (d.get("totals") or {})
                                               or not int((d.get("totals") or {}).get(
                                                   "rows_dropped", 0))),
                       source_column=None if not src else str(src["column"]),
                       source_values=values,
                       tokenized=(Tokenization.from_dict(d["tokenized"])
                                  if kind == PACKED_KIND and d.get("tokenized")
                                  else None),
                       holdout_pair=(HoldoutPairing.from_dict(d["holdout_pair"])
                                     if kind == PACKED_KIND and d.get("holdout_pair")
                                     else None))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({exc_line(exc)}); "
                                "rerun the same packtool pack with --overwrite") from None

    def replace_shards(self, shards) -> "Manifest":
        """A copy with ``shards`` and the current :data:`FORMAT_VERSION`."""
        from dataclasses import replace

        return replace(self, shards=tuple(shards), format_version=FORMAT_VERSION)


def _manifest_from_state(d: dict) -> Manifest:
    return Manifest.from_dict(d)


def manifest_bytes(manifest: Manifest, schema: pa.Schema) -> bytes:
    """The manifest file's bytes: zero rows of ``schema`` (the shards' schema), the JSON of
    ``manifest`` under :data:`MANIFEST_META_KEY`."""
    meta = dict(schema.metadata or {})
    meta[MANIFEST_META_KEY] = json.dumps(manifest.to_dict(), sort_keys=True).encode()
    sink = pa.BufferOutputStream()
    # no rows; ``Schema.empty_table`` would import pandas (a tenth of a CPU-second)
    pq.write_table(pa.Table.from_batches([], schema=schema.with_metadata(meta)), sink,
                   compression="zstd")
    return sink.getvalue().to_pybytes()


def publish_manifest(output, manifest: Manifest, schema: pa.Schema, *,
                     data: bytes | None = None) -> None:
    """Write the manifest of OUTPUT ``output`` (a path or URI), whole or not at all
    (:meth:`packtool.location.Location.publish_bytes`); ``data``: its bytes made beforehand
    (:func:`manifest_bytes`), None to make them here."""
    if data is None:
        data = manifest_bytes(manifest, schema)
    Location.parse(output).join(MANIFEST_NAME).publish_bytes(data)


def store_failure(where, exc: BaseException) -> InputError | None:
    """The one line for a store's failure met while ``where`` (a path, URI or
    :class:`~packtool.location.Location`: an input file, a shard) was opened or read: the store
    cannot be reached, refused the request (credentials, permissions) or has no such bucket, as
    :meth:`packtool.location.Location.store_error` words them for every command. None for any
    other error (a fault of the file itself, for its reader to name) and for every local path.

    Every reader of a store's files asks this before it blames the file (``empty``,
    ``damaged or truncated``): an object the store will not hand out is no bad object."""
    told = Location.parse(where).store_error(exc)
    return InputError(str(told)) if isinstance(told, StoreError) else None


def unreadable(loc: Location, exc: BaseException) -> InputError:
    """One line for a location that cannot be read: a store's refused credentials, missing
    bucket or unreachable endpoint as :meth:`packtool.location.Location.store_error` words them
    for every command (:func:`store_failure`), else the cause and what to check."""
    told = store_failure(loc, exc)
    if told is not None:
        return told
    if loc.is_local:
        cause = getattr(exc, "strerror", None) or first_line(exc)
        return InputError(f"{loc.display}: cannot be read ({cause}); check the path and its "
                          "permissions")
    return InputError(f"{loc.display}: cannot be read ({first_line(exc)}); check the URI and the "
                      "credentials")


def _not_there(out: Location) -> PacktoolError | None:
    """Why OUTPUT ``out`` is not there (None when it is): no such directory, no bucket, nothing
    under the prefix, or it cannot be read at all."""
    try:
        if out.exists():
            return None
        why = "no such directory" if out.is_local else out.missing()
    except (OSError, pa.ArrowException) as exc:
        raise_if_shortage(exc)
        return unreadable(out, exc)
    fix = out.missing_fix("pass the OUTPUT directory of packtool pack", packed_output=True)
    return ManifestError(f"{out.display}: {why}; {fix}")


#: The lock files (:data:`LOCK_NAME`, by display name) this process holds to rewrite an OUTPUT
#: in place (``upgrade``: :func:`packtool.output.holding_lock`): its own reads of that OUTPUT
#: are not told that a run is writing it.
HELD_HERE: set = set()


def pack_running(directory) -> bool:
    """Whether a packtool run (``pack`` or ``tokenize``: :func:`marker_kind` may say which)
    holds the lock (:data:`LOCK_NAME`) of the local OUTPUT ``directory`` right now (a lock file
    left by a run that was killed is not held). A store prefix: False (its lock is advisory;
    the store's own messages name it).

    Args:
        directory: a local path or a URI.
    """
    from filelock import FileLock, Timeout

    loc = Location.parse(directory)
    if not loc.is_local or loc.join(LOCK_NAME).display in HELD_HERE:
        return False
    path = loc.join(LOCK_NAME).path
    if not path.exists():
        return False
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    except OSError:
        return False
    lock.release()
    return False


def marker_kind(directory) -> str | None:
    """The kind of output (:data:`PACKED_KIND` or :data:`TOKENIZED_KIND`) that the run which
    wrote the in-progress marker (:data:`IN_PROGRESS_NAME`) of ``directory`` (a path or URI)
    writes there; None when there is no marker to read. A marker that names no kind (written
    before kinds were recorded) or cannot be parsed is a pack's."""
    try:
        data = Location.parse(directory).join(IN_PROGRESS_NAME).read_bytes()
    except (OSError, pa.ArrowException) as exc:
        raise_if_shortage(exc)
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return kind if kind in KINDS else PACKED_KIND


#: What a directory holds at its top level when it is a packtool output, finished or not: the
#: manifest, the in-progress marker, the lock of a run writing it (taken before the marker is
#: written), the scratch a run writes (kept by one interrupted while it read or planned).
OUTPUT_MARKS = (MANIFEST_NAME, IN_PROGRESS_NAME, LOCK_NAME, TMP_DIR_NAME)


def output_mark(directory) -> str | None:
    """The first of :data:`OUTPUT_MARKS` the directory ``directory`` (a path or URI) holds: it
    is a packtool output (finished, being written or interrupted); None when it holds none.

    Raises:
        OSError, pyarrow.ArrowException: a store cannot be asked.
    """
    loc = Location.parse(directory)
    for name in OUTPUT_MARKS:
        if loc.join(name).exists():
            return name
    return None


def output_words(directory) -> str:
    """What the packtool output at ``directory`` is, for a message: ``packed output`` or
    ``tokenized output`` (its in-progress marker's kind, else its manifest's), or ``packtool
    output`` when nothing says which (a run that has taken its lock and written no marker)."""
    kind = marker_kind(directory)
    if kind is None:
        try:
            kind = read_manifest(directory).kind
        except PacktoolError:
            kind = None
    return f"{kind} output" if kind in KINDS else "packtool output"


def enclosing_output(location) -> Location | None:
    """The nearest folder holding ``location`` (a path or URI) that is a packtool output
    (:func:`output_mark`), None when none is: a file written there would join that output's
    Parquet dataset.

    Raises:
        OSError, pyarrow.ArrowException: a store cannot be asked.
    """
    for parent in Location.parse(location).ancestors():
        if output_mark(parent) is not None:
            return parent
    return None


def nested_output(directory) -> Location | None:
    """A packtool output (:func:`output_mark`) at or below the local directory ``directory``,
    found by walking it (links not followed); None when there is none, when ``directory`` does
    not exist, or for a store URI (not walked)."""
    loc = Location.parse(directory)
    if not loc.is_local or not loc.path.is_dir():
        return None
    for top, dirs, files in os.walk(loc.path):
        if set(OUTPUT_MARKS) & (set(dirs) | set(files)):
            return Location.parse(top)
        dirs.sort()
    return None


def output_around(location) -> tuple[str, Location] | None:
    """``(how, output)`` when the local folder ``location`` is a packtool output (``is``), lies
    inside one (``lies inside``) or holds one (``contains``); None when it touches none (a
    store URI: only ``is`` and ``lies inside`` are asked)."""
    loc = Location.parse(location)
    above = enclosing_output(loc)
    if above is not None:
        return "lies inside", above
    if output_mark(loc) is not None:
        return "is", loc
    below = nested_output(loc)
    return None if below is None else ("contains", below)


def run_words(kind: str | None) -> str:
    """The run that writes an output of ``kind``, for a message: ``tokenize run``, ``pack``,
    or ``run`` when the kind is not known (None)."""
    return {TOKENIZED_KIND: "tokenize run", PACKED_KIND: "pack"}.get(kind, "run")


def run_holding(out) -> tuple[str | None, dict | None]:
    """Whether a packtool run is writing OUTPUT ``out`` (a path or URI) now, as far as can be
    told, and what a store's lock object says of it:

    - ``("now", lock)``: a local lock held (:func:`pack_running`; ``lock`` None), or a store's
      lock object (:data:`LOCK_NAME`) naming a live process of this host;
    - ``("maybe", lock)``: a store's lock object naming a process of another host, which cannot
      be asked (a run writing now, or one killed there);
    - ``(None, None)``: no run holds it: no lock, or one a process known to be gone left (a run
      stopped by Ctrl-C releases its lock and keeps its in-progress marker).

    A run takes its lock before it writes its marker or removes a manifest and writes its
    manifest before it releases the lock, so a marker without a held lock is an interrupted run.
    """
    loc = Location.parse(out)
    if loc.is_local:
        return ("now", None) if pack_running(loc) else (None, None)
    from packtool.formats.holders import holder_is_gone, holder_is_here, read_json

    held = read_json(loc.join(LOCK_NAME))
    if held is None or holder_is_gone(held) or loc.join(LOCK_NAME).display in HELD_HERE:
        return None, None
    return ("now" if holder_is_here(held) else "maybe"), held


def writing_error(out, then: str = "read it again", kind: str | None = None
                  ) -> ManifestError | None:
    """The one-line error for OUTPUT ``out`` while a packtool run may be writing it
    (:func:`run_holding`): :func:`running_error`, sure or not; None when no run holds it (then
    an in-progress marker is an interrupted run's: the caller says so)."""
    state, held = run_holding(out)
    if state is None:
        return None
    return running_error(out, then, kind, held=held, sure=state == "now")


def running_error(out, then: str = "read it again", kind: str | None = None, *,
                  held: dict | None = None, sure: bool = True) -> ManifestError:
    """The one-line error for an OUTPUT a running packtool run holds: no manifest yet, or
    shards being replaced (``then``: what to do once it ends). ``kind``: what the run writes
    (default: what the lock object ``held`` or OUTPUT's in-progress marker says,
    :func:`marker_kind`); a ``tokenize`` run writes documents, so the fix is to pack them once
    it ends. ``held``: a store's lock object (None: a local lock, held); ``sure`` False: its
    holder, on another host, cannot be asked, so the run is writing it now or was interrupted
    (wait for it, or rerun it to finish it)."""
    loc = Location.parse(out)
    said = (held or {}).get("kind")
    kind = kind or (said if said in KINDS else None) or marker_kind(loc)
    word = run_words(kind)
    if held is None:
        lock = "its lock is held"
    elif sure:
        lock = (f"its lock object {LOCK_NAME} names run {held.get('run', '?')}, pid "
                f"{held.get('pid', '?')} of this host, which is running")
    else:
        lock = (f"its lock object {LOCK_NAME} names run {held.get('run', '?')} on host "
                f"{held.get('host', '?')} (pid {held.get('pid', '?')}), which cannot be asked "
                "from here")
    doing = "is writing it now" if sure else "is writing it now or was interrupted"
    wait = f"wait for that {word} to end, then"
    if not sure:
        again = {TOKENIZED_KIND: "tokenize command", PACKED_KIND: "pack"}.get(kind, "command")
        wait = (f"wait for that {word} to end, or, if it was stopped, rerun the same packtool "
                f"{again} to finish it; then")
    if kind == TOKENIZED_KIND:
        return ManifestError(f"{loc.display}: a packtool tokenize run {doing} ({lock}): "
                             f"tokenized documents, not packed rows; {wait} pack it: "
                             f"packtool pack --capacity C {shlex.quote(loc.display)} OUTPUT")
    return ManifestError(f"{loc.display}: a packtool {word} {doing} ({lock}), so it has no "
                         f"complete {MANIFEST_NAME} yet; {wait} {then}")


#: The manifest of format version 1 (a JSON file; version 2 made it Parquet), which this
#: packtool neither reads nor upgrades: its shards' columns differ.
V1_MANIFEST_NAME = "manifest.json"


def version_1_shards(out) -> list[str] | None:
    """The shard files that a format-version-1 output at ``out`` lists in its
    :data:`V1_MANIFEST_NAME`, or None when ``out`` holds no such manifest."""
    try:
        return version_1_listed(Location.parse(out).join(V1_MANIFEST_NAME).read_bytes())
    except OSError:
        return None


def version_1_listed(data: bytes) -> list[str] | None:
    """The shard files a :data:`V1_MANIFEST_NAME` of these bytes lists, or None when they are
    not one (another JSON file of that name: the user's)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format_version") != 1 \
            or not isinstance(doc.get("outputs"), list):
        return None
    return [o["file"] for o in doc["outputs"]
            if isinstance(o, dict) and isinstance(o.get("file"), str)]


def version_1_error(out) -> ManifestError | None:
    """The one line for a format-version-1 output at ``out`` (None when it is not one)."""
    if version_1_shards(out) is None:
        return None
    return ManifestError(f"{Location.parse(out).display}: an output of packtool format version 1 "
                         f"(its {V1_MANIFEST_NAME}), which this packtool neither reads nor "
                         "upgrades (packtool upgrade takes version 2); pack its input again: the "
                         "same packtool pack command with --overwrite")


def a_file_error(out) -> ManifestError | None:
    """The one line for OUTPUT ``out`` (a path or URI) naming a file (a local file, a store
    object) where the directory or prefix of a packed output is wanted; it names the directory
    or prefix holding the file when that holds a :data:`MANIFEST_NAME` (the file is one of its
    shards, or the manifest). None when ``out`` is no file (or cannot be asked)."""
    loc = Location.parse(out)
    try:
        if not loc.is_file():
            return None
        parent = loc.parent
        above = parent.join(MANIFEST_NAME).is_file()
    except (OSError, pa.ArrowException) as exc:
        raise_if_shortage(exc)
        return None
    what, place = (("a file, not a directory", "directory") if loc.is_local else
                   ("an object (a file), not a prefix", "prefix"))
    hint = f": {parent.display}, which holds it and its {MANIFEST_NAME}" if above else ""
    return ManifestError(f"{loc.display}: is {what}; pass the OUTPUT {place} of packtool "
                         f"pack{hint}")


#: the most manifests :func:`packed_outputs_below` reads
_NESTED_READ = 16


def packed_outputs_below(out) -> list[str]:
    """The finished packed outputs in folders below ``out`` (a path or URI, itself no packed
    output): each one's path relative to ``out`` (``/``-separated), sorted, none inside
    another, hidden and ``_``-prefixed folders left out. Empty when there is none or ``out``
    cannot be listed (its own message says why). Lists ``out`` recursively and reads at most
    :data:`_NESTED_READ` manifests."""
    loc = Location.parse(out)
    try:
        import pyarrow.fs as pafs

        fs, root = loc.filesystem()
        infos = fs.get_file_info(pafs.FileSelector(str(root), recursive=True))
    except (OSError, pa.ArrowException) as exc:
        raise_if_shortage(exc)
        return []
    root = str(root).rstrip("/")
    folders = sorted({i.path[len(root) + 1:].rpartition("/")[0] for i in infos
                      if i.type == pafs.FileType.File and i.base_name == MANIFEST_NAME
                      and i.path.startswith(root + "/")} - {""})
    found: list[str] = []
    for rel in folders:
        if len(found) >= _NESTED_READ:
            break
        parts = rel.split("/")
        if any(p.startswith((".", "_")) for p in parts) or any(
                rel.startswith(f + "/") for f in found):
            continue
        try:
            kind = read_manifest(loc.join(*parts)).kind
        except PacktoolError:
            continue
        if kind == PACKED_KIND:
            found.append(rel)
    return found


def nested_outputs_error(out, nested, give: Callable[[str], str] | None = None,
                         other: str | None = None) -> ManifestError:
    """The one line for a folder ``out`` (a path or URI) that is no packed output but holds
    the packed outputs ``nested`` (:func:`packed_outputs_below`): which to give instead.

    Args:
        give: what to do with an output, from its path or URI as shown (``run packtool
            stats OUT/run1``); default: ``give OUT/run1``.
        other: a data file of ``out`` outside those outputs (relative to it), said to be no
            part of them; None: none.
    """
    loc = Location.parse(out)
    give = give or (lambda shown: f"give {shown}")
    first = give(loc.join(*nested[0].split("/")).display)
    beside = f" ({other} beside {'it' if len(nested) == 1 else 'them'} is no packed " \
        "output)" if other else ""
    if len(nested) == 1:
        return ManifestError(f"{loc.display}: no {MANIFEST_NAME}, so not a packed output itself; "
                             f"{nested[0]}/ is a packed output: {first}{beside}")
    names = ", ".join(f"{n}/" for n in nested[:3]) + (
        f", ... ({len(nested)} in all)" if len(nested) > 3 else "")
    return ManifestError(f"{loc.display}: no {MANIFEST_NAME}, so not a packed output itself; "
                         f"it holds the packed outputs {names}: take one of them, e.g. "
                         f"{first}{beside}")


def _incomplete(out: Location) -> ManifestError:
    """OUTPUT ``out`` has no manifest and no run holds its lock: an interrupted run (its
    in-progress marker says which kind), a folder holding packed outputs
    (:func:`nested_outputs_error`), or not a packtool output."""
    kind = marker_kind(out)
    nested = packed_outputs_below(out) if kind is None else []
    if nested:
        return nested_outputs_error(out, nested)
    if kind == TOKENIZED_KIND:
        return ManifestError(f"{out.display}: no {MANIFEST_NAME}: an interrupted packtool "
                             "tokenize run (tokenized documents, not packed rows); rerun the "
                             "same packtool tokenize command to finish it, then pack it: "
                             f"packtool pack --capacity C {shlex.quote(out.display)} OUTPUT")
    return ManifestError(f"{out.display}: no {MANIFEST_NAME}: not a complete packtool output "
                         "(an interrupted pack: rerun the same packtool pack to finish it; raw "
                         "tokenized data: pack it first with packtool pack)")


def read_manifest_and_schema(output) -> tuple[Manifest, pa.Schema]:
    """The manifest of a packed OUTPUT and the shards' schema it carries, without checking the
    shards.

    Args:
        output: the OUTPUT directory, a ``file:`` URI or a store URI.

    Raises:
        ManifestError: no manifest (an incomplete pack or not a packtool output), or one that is
            not readable, of a version this packtool does not read, or whose two copies of its
            JSON (the file's key-value metadata and its ``ARROW:schema``) differ: a damaged or
            edited file (:func:`_copies_differ`).
    """
    out = Location.parse(output)
    mloc = out.join(MANIFEST_NAME)
    for look in range(2):
        try:
            data = mloc.read_bytes()
            break
        except NotADirectoryError:
            raise (a_file_error(out) or ManifestError(
                f"{out.display}: not a directory; pass the OUTPUT directory of packtool pack")
            ) from None
        except (FileNotFoundError, IsADirectoryError):
            # no manifest: a pack replacing it holds the lock; one that wrote it since has
            # released the lock, so the lock is looked at first, then the manifest again
            running = writing_error(out)
            if running is not None:
                raise running from None
            if look or not mloc.exists():
                raise (_not_there(out) or a_file_error(out) or version_1_error(out)
                       or _incomplete(out)) from None
        except (OSError, pa.ArrowException) as exc:
            raise_if_shortage(exc, mloc.display)
            gone = _not_there(out)
            if gone is not None:
                raise gone from None
            if isinstance(out.store_error(exc), StoreError):
                raise unreadable(mloc, exc) from None
            raise ManifestError(f"{mloc.display}: unreadable manifest ({first_line(exc)}); rerun "
                                "the same packtool pack with --overwrite") from None
    try:
        schema = pq.read_schema(pa.BufferReader(data))
        doc = json.loads((schema.metadata or {})[MANIFEST_META_KEY])
        differs = _copies_differ(data)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        raise_if_shortage(exc, mloc.display)
        raise ManifestError(f"{mloc.display}: unreadable manifest ({first_line(exc)}); rerun the "
                            "same packtool pack with --overwrite") from None
    if differs is not None:
        kind = doc.get("kind") if isinstance(doc, dict) else None
        raise ManifestError(
            f"{mloc.display}: its two copies of the manifest differ ({differs} in the Parquet "
            "key-value metadata and in ARROW:schema): the manifest file was damaged or edited; "
            "restore it from a copy of this output, or rerun the same packtool "
            f"{'tokenize' if kind == TOKENIZED_KIND else 'pack'} with --overwrite")
    meta = {k: v for k, v in (schema.metadata or {}).items() if k != MANIFEST_META_KEY}
    return Manifest.from_dict(doc, mloc.display), schema.with_metadata(meta)


#: The key-value metadata key under which Parquet files written by Arrow carry their Arrow
#: schema (base64), its metadata a second copy of the file's key-value metadata.
_ARROW_SCHEMA_KEY = b"ARROW:schema"


def _copies_differ(data: bytes) -> str | None:
    """The first key (``packtool.manifest``, say) whose value differs between the two copies
    a manifest file holds of its metadata, the manifest JSON with it: the Parquet key-value
    metadata and the metadata of the Arrow schema base64-encoded under ``ARROW:schema``
    (pyarrow reads the second and never compares them, so a byte changed in either would go
    unseen). None when they agree, or when the file holds one copy (written without the
    Arrow schema).

    Args:
        data: the bytes of the manifest file.

    Raises:
        pyarrow.ArrowException, OSError, ValueError: the file or its Arrow schema copy cannot
            be read (an unreadable manifest).
    """
    import base64

    plain = dict(pq.read_metadata(pa.BufferReader(data)).metadata or {})
    encoded = plain.pop(_ARROW_SCHEMA_KEY, None)
    if encoded is None:
        return None
    arrow = dict(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded, validate=True)))
                 .metadata or {})
    for key in sorted(set(plain) | set(arrow)):
        if plain.get(key) != arrow.get(key):
            return key.decode("utf-8", "replace")
    return None


def read_manifest(output) -> Manifest:
    """The :class:`Manifest` of a packed OUTPUT (path, ``file:`` URI or store URI), without
    checking the shards.

    Raises:
        ManifestError: as :func:`read_manifest_and_schema`.
    """
    return read_manifest_and_schema(output)[0]


def stale_holdout(manifest: Manifest, where) -> str | None:
    """The warning for reading the held-out output of ``pack --holdout`` at ``where`` (a path
    or URI; ``manifest``: its manifest) whose training output no longer pairs with it: that
    output's manifest, read, records no pairing with this one (it was packed again without
    ``--holdout``, with another fraction or seed, or with another ``--holdout-output``). Its
    documents may then be among the training rows. None for any other output, for a held-out
    output still paired, for one whose training output has no readable manifest there (copied
    or moved without it: nothing says it is stale), and for one packed before pairings were
    recorded (nothing to check). Reads one manifest.
    """
    paired = manifest.holdout_pair
    if paired is None or manifest.options.get("holdout_part") != "holdout":
        return None
    here = Location.parse(where)
    train = paired.partner_of(here)
    try:
        other = read_manifest(train)
    except PacktoolError:  # absent or unreadable there: no evidence either way
        return None
    theirs = other.holdout_pair
    if (theirs is not None and theirs.pair == paired.pair
            and other.options.get("holdout_part") == "train" and theirs.names(train, here)):
        return None
    return (f"{here.display}: stale held-out output: its training output {train.display} was "
            "packed again without it (its manifest pairs it with no held-out output or with "
            "another), so its documents may be among the training rows; remove it, or pack "
            "again with --holdout to make a new pair")


def dropped_holdout(previous: Manifest | None, where, pairing: HoldoutPairing | None
                    ) -> str | None:
    """The warning of a pack that replaced, at OUTPUT ``where`` (a path or URI), the training
    output of a ``pack --holdout`` (``previous``: the manifest it found there) without writing
    the held-out output that manifest named (``pairing``: the pairing this pack records, None
    without ``--holdout``): that output, still there, is stale (its documents may be among the
    new training rows). None when nothing was replaced, the previous pack recorded no pairing,
    this pack writes the same held-out output, or that output is gone."""
    old = previous.holdout_pair if previous is not None else None
    if old is None or previous.options.get("holdout_part") != "train":
        return None
    held = old.partner_of(where)
    if pairing is not None and pairing.names(where, held):
        return None
    try:
        if output_mark(held) is None:
            return None
    except (OSError, pa.ArrowException) as exc:
        raise_if_shortage(exc)
        return None
    return (f"{held.display}: stale held-out output: the previous pack of "
            f"{Location.parse(where).display} held these documents out, this pack does not "
            "write it, so they may be among the training rows; remove it")


def older_version_note(manifest: Manifest, where) -> str:
    """For the line of a rerun that finds its output already there (``pack``, ``tokenize``):
    `` (its manifest is format version 3: packtool upgrade OUT rewrites it as version 4)``
    when ``manifest`` was written as an older version (read as it is; a rerun does not rewrite
    it), empty otherwise. ``where`` names the output as given."""
    if manifest.format_version == FORMAT_VERSION:
        return ""
    return (f" (its manifest is format version {manifest.format_version}: packtool upgrade "
            f"{shlex.quote(str(where))} rewrites it as version {FORMAT_VERSION})")


def require_packed(manifest: Manifest, where) -> Manifest:
    """``manifest`` when it is of packed rows.

    Raises:
        ManifestError: a tokenized output (one document per row): one line saying to pack it
            first (``where`` names the output).
    """
    if manifest.kind != PACKED_KIND:
        raise ManifestError(f"{where}: a packtool {manifest.kind} output (one document per row, "
                            "not packed rows); pack it first: packtool pack "
                            f"{shlex.quote(str(where))} OUTPUT")
    return manifest


def load_manifest(output, *, check_hashes: bool = False) -> Manifest:
    """:func:`read_manifest`, then :func:`check_shards` (sizes, no extra shard; every shard's
    sha256 too when ``check_hashes``).

    Raises:
        ManifestError: as both.
    """
    manifest = read_manifest(output)
    check_shards(output, manifest, hashes=check_hashes)
    return manifest


def sha256_of(loc, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file (local path or store object), read in chunks of ``chunk_bytes``.

    Raises:
        OSError: the file cannot be read (a store's failure worded by
            :meth:`packtool.location.Location.store_error`).
    """
    loc = Location.parse(loc)
    h = hashlib.sha256()
    if loc.is_local:
        with open(loc, "rb") as f:
            while block := f.read(chunk_bytes):
                h.update(block)
        return h.hexdigest()
    fs, path = loc.filesystem()
    try:
        with fs.open_input_stream(path) as f:
            while block := f.read(chunk_bytes):
                h.update(block)
    except OSError as exc:  # the store, not the shard: its one line
        raise loc.store_error(exc) from None
    return h.hexdigest()


def footer_of(handle, size: int) -> bytes:
    """The Parquet footer of an open file (metadata, its 4-byte length and ``PAR1``), read with
    one request when it fits the last 64 KiB (two otherwise).

    Args:
        handle: a pyarrow random-access file (``read_at``).
        size: the file's size in bytes.

    Raises:
        OSError: the file is not Parquet (no ``PAR1`` at its end) or is shorter than its footer.
    """
    if size < 12:
        raise OSError(f"{size} bytes: too short for a Parquet file")
    n = min(size, _TAIL_BYTES)
    tail = handle.read_at(n, size - n)
    if tail[-4:] != b"PAR1":
        raise OSError("no Parquet footer (the file does not end in PAR1)")
    meta_len = int.from_bytes(tail[-8:-4], "little")
    if meta_len + 8 > size - 4:
        raise OSError(f"footer length {meta_len} does not fit a file of {size} bytes")
    if meta_len + 8 <= n:
        return bytes(tail[-(meta_len + 8):])
    return bytes(handle.read_at(meta_len + 8, size - meta_len - 8))


def footer_sha256(loc, tail_bytes: int = 1 << 16) -> str:
    """sha256 of a file's Parquet footer (local path or URI): it holds every row group's
    offsets, sizes and statistics, so a rewrite of the same size changes it. A file that is not
    Parquet (Arrow IPC) is represented by its last ``tail_bytes`` bytes.

    Raises:
        OSError: the file cannot be read.
    """
    loc = Location.parse(loc)
    with loc.open_input() as f:
        size = f.size()
        try:
            return hashlib.sha256(footer_of(f, size)).hexdigest()
        except OSError:
            n = min(size, tail_bytes)
            return hashlib.sha256(f.read_at(n, size - n) if n else b"").hexdigest()


#: The fix for a packed output whose shard is missing or of another size than its manifest
#: records: the same ``pack`` finds its own manifest with shards not all there and packs the
#: output again, byte-identical, without ``--overwrite`` (:class:`packtool.output.Output`).
#: A shard edited in place (its size kept) looks finished to it: that needs ``--overwrite``.
REPACK_MISSING = "rerun the same packtool pack command, which packs it again"


def check_shards(output, manifest: Manifest, *, hashes: bool = False, threads: int = 4,
                 progress: Callable[[int, int], None] | None = None) -> None:
    """Check that OUTPUT holds exactly the manifest's shards, each with its recorded size (and
    sha256 when ``hashes``: every byte is read, ``threads`` shards at a time).

    Args:
        output: the OUTPUT directory or URI.
        manifest: its manifest.
        hashes: also compare every shard's sha256 with the manifest.
        threads: shards hashed at once (hashing releases the GIL).
        progress: ``callable(done, total)`` after each shard hashed.

    Raises:
        ManifestError: a listed shard is missing or of another size or sha256 (the message names
            the first such shard in manifest order), a ``part-*.parquet`` not listed, or another
            Parquet file a third-party reader of OUTPUT reads (:func:`stray_data_files`).
    """
    out = Location.parse(output)
    try:
        found = out.listdir()
    except (OSError, pa.ArrowException) as exc:
        raise_if_shortage(exc)
        raise unreadable(out, exc) from None
    if not found:
        gone = _not_there(out)
        if gone is not None:
            raise gone

    def fault(message: str) -> ManifestError:  # a pack replacing the shards now: say so
        return writing_error(out) or ManifestError(message)

    # what wrote it, to be run again: ``pack`` or ``tokenize``
    rerun = (f"rerun the same packtool "
             f"{'tokenize' if manifest.kind == TOKENIZED_KIND else 'pack'} with --overwrite")
    # a shard missing or resized: a pack's plain rerun packs it again
    again = rerun if manifest.kind == TOKENIZED_KIND else REPACK_MISSING
    listed = {s.file for s in manifest.shards}
    for s in manifest.shards:
        e = found.get(s.file)
        where = out.join(s.file).display
        if e is None or e.is_dir:
            raise fault(f"{where}: shard listed in the manifest is missing; {again}")
        if e.size != s.bytes:
            from packtool.formats.sniff import shard_content_fix

            what = shard_content_fix(out.join(s.file))
            raise fault(f"{where}: size {e.size} bytes, the manifest says {s.bytes}: " + (
                f"the shard {what}" if what else
                f"the shard was modified or truncated; {again}"))
    extra = sorted(n for n, e in found.items() if not e.is_dir and is_shard_name(n)
                   and n not in listed)
    if extra:
        raise fault(f"{out.join(extra[0]).display}: shard not listed in the manifest; "
                    f"remove it or {rerun}")
    stray = stray_data_files(out, found, listed)
    if stray:
        more = f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""
        raise fault(f"{out.join(stray[0]).display}: a Parquet file the manifest does not "
                    f"list{more}, which Parquet readers of the folder (pyarrow.dataset, "
                    "polars, duckdb, datasets) read as more rows beside its shards; move it "
                    f"out of {out.display}")
    if not hashes:
        return
    done = 0
    with ThreadPoolExecutor(max(1, threads)) as pool:
        digests = [pool.submit(sha256_of, out.join(s.file)) for s in manifest.shards]
        try:
            for s, digest in zip(manifest.shards, digests):
                try:
                    same = task_result(digest) == s.sha256
                except FileNotFoundError:  # gone since it was listed
                    raise fault(f"{out.join(s.file).display}: shard listed in the manifest is "
                                f"missing; {again}") from None
                if not same:  # a pack replacing the shards now is no damage: said so
                    raise fault(f"{out.join(s.file).display}: sha256 differs from the "
                                f"manifest: the shard was modified; {rerun}")
                done += 1
                if progress:
                    progress(done, len(manifest.shards))
        finally:  # an error or Ctrl-C: the shards not begun are not hashed
            for digest in digests:
                digest.cancel()


#: packtool's own entries at OUTPUT's top level, never a stray (:func:`stray_data_files`): the
#: manifest, the in-progress marker, the lock and the scratch of a run.
_OWN_ENTRIES = frozenset({MANIFEST_NAME, IN_PROGRESS_NAME, LOCK_NAME, TMP_DIR_NAME})


def _is_parquet_file(loc: Location) -> bool:
    """The file begins with Parquet's magic bytes (False when it cannot be read, or is no
    regular file: opening a named pipe would wait for a writer forever)."""
    try:
        if loc.is_local and not stat.S_ISREG(os.stat(loc.path).st_mode):
            return False
        with loc.open_input() as f:
            return f.read(4) == b"PAR1"
    except (OSError, pa.ArrowException):
        return False


def stray_data_files(output, found: Mapping, listed) -> list[str]:
    """The files under OUTPUT, at any depth, that a third-party Parquet reader of the folder
    reads and the manifest does not list (a copy of a shard beside them, a folder of old
    shards), as paths relative to OUTPUT, sorted.

    What those readers take (``tests/formats/test_dataset_readers.py``): polars and
    duckdb read every ``*.parquet`` below the folder (their ``*.parquet`` globs and folder scans
    match hidden and ``_``-prefixed names too); ``pyarrow.dataset`` reads every file whose path
    has no part starting with ``.`` or ``_``, and ``datasets`` every one with no part starting
    with ``.``, whatever its suffix. So: a name ending in ``.parquet``, or a Parquet file (its
    magic bytes) outside hidden names. packtool's own entries (:data:`_OWN_ENTRIES`, the
    pending shards of a run: :func:`pending_name`) and the listed shards are not strays;
    another file is left alone (pyarrow fails on it, it adds no rows).

    Args:
        output: the OUTPUT directory or URI.
        found: its top-level listing (name -> :class:`~packtool.location.Entry`).
        listed: the shard names its manifest lists.

    Raises:
        OSError: a folder below OUTPUT cannot be listed.
    """
    out = Location.parse(output)
    stray = []

    def walk(where: Location, entries: Mapping, rel: str, hidden: bool) -> None:
        for name in sorted(entries):
            e = entries[name]
            if not rel and (name in _OWN_ENTRIES or name in listed or is_pending_name(name)):
                continue
            path = f"{rel}{name}"
            dark = hidden or name.startswith(".")
            if e.is_dir:
                walk(where.join(name), where.join(name).listdir(), f"{path}/", dark)
            elif name.lower().endswith(".parquet") or (
                    not dark and _is_parquet_file(where.join(name))):
                stray.append(path)

    walk(out, found, "", False)
    return stray


def check_rows_add_up(manifest: Manifest, where: str) -> None:
    """Refuse a manifest that lists shards of other rows than its totals count (a shard's entry
    dropped or emptied, or the totals edited): a reader would serve or export the rows left
    without a word. :meth:`packtool.formats.packed.PackedOutput.open` runs it for every reader
    of packed rows (stats, verify, export, the loader, ``pack_dataset``'s results);
    ``upgrade`` before it rewrites a manifest.

    A tokenized output (one document per row) is held to its ``docs_in`` in the same way.

    Raises:
        ManifestError: names ``where`` (the output), both counts and the fix.
    """
    listed = sum(s.rows for s in manifest.shards)
    if manifest.kind == TOKENIZED_KIND:
        if listed != manifest.totals.docs_in:
            raise ManifestError(f"{where}: its shards hold {listed:,} documents, its totals say "
                                f"{manifest.totals.docs_in:,}: the manifest of this tokenized "
                                "output was edited or damaged; rerun the same packtool tokenize "
                                "command with --overwrite")
        return
    if listed != manifest.totals.rows:
        raise ManifestError(f"{where}: its shards hold {listed:,} rows, its totals say "
                            f"{manifest.totals.rows:,}: the manifest was edited or damaged; "
                            "rerun the same packtool pack with --overwrite")


def shard_entry_of(loc, *, sha256: str | None = None) -> ShardEntry:
    """The manifest entry of the shard file at ``loc`` as it is: rows, row groups and footer
    sha256 from its footer, size, and its sha256 (read whole unless ``sha256`` is given).

    Raises:
        OSError: the file cannot be read or is not Parquet.
    """
    loc = Location.parse(loc)
    with loc.open_input() as f:
        size = f.size()
        footer = footer_of(f, size)
    md = pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
    groups = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    return ShardEntry(loc.name, md.num_rows, size, sha256 or sha256_of(loc),
                      hashlib.sha256(footer).hexdigest(), ShardEntry.run_lengths(groups))

