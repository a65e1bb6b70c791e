"""Finding and streaming tokenized input: one document per row, an integer-list token column.

Formats (chosen by file name, then checked by content):

- Parquet (``*.parquet``): read row group by row group through ``ParquetFile.iter_batches``.
- Arrow IPC, file or stream form (``*.arrow``, ``*.feather``, ``*.ipc``, ``*.arrows``; Feather
  v2 is the IPC file form): memory-mapped, each record batch is one "row group".
- Hugging Face ``datasets`` ``save_to_disk`` folders (``state.json`` + ``dataset_info.json`` +
  ``data-*.arrow`` in the IPC stream form): read with pyarrow, in the order ``state.json``
  lists the files; ``datasets`` itself is not imported.

The token column may be any Arrow integer list layout: ``list``, ``large_list``,
``fixed_size_list``, ``list_view`` and ``large_list_view`` of any integer width. No shard is
materialised as Python lists. Every value is checked on the way in (nulls, negative ids, ids
over int32, ids outside the min/max a Parquet footer's statistics record for their row group:
a file damaged after it was written) and errors name the file, the row and the fix. No id is
held to a vocabulary size: a tokenize manifest's record or a ``tokenizer_vocab_size`` schema
metadata does not bound the ids a valid corpus holds (a BOS/EOS added above a BPE file's ranks,
a vocabulary with gaps, a column the tokenizer did not write).

Discovery (:func:`discover`) lists directories through :mod:`pyarrow.fs`, one level at a time so
that it can prune and report: hidden (``.``) and ``_``-prefixed entries (Spark/Hadoop
``_temporary``, ``.ipynb_checkpoints``, ...) are skipped at every level, symbolic links are
followed with a guard against loops, and a packtool output (its manifest or
in-progress marker, or ``packtool.*`` schema metadata in a shard) is refused, so packed rows are
never read back as documents; so are another tool's packed rows and a packtool shard re-saved
without its metadata (:func:`packed_evidence` reads their columns from the footer). A
finished ``packtool tokenize`` output (its manifest says kind ``tokenized``) holds documents:
exactly the shards its manifest lists are read, in its order, each checked against it first
(size and footer), and a file or folder it does not list is refused
(:func:`_tokenized_shards`). Every other entry it does not read is reported with the reason;
a file of another format inside a directory is refused unless the caller asks to skip such
files. With ``text=True`` (the inputs of ``packtool tokenize``) JSON Lines files are data too.
The global document order keeps each format's own order (a ``save_to_disk`` folder's
``state.json``; docs/inputs.md states the rule for every format).

The reader checks the mask columns (shape, nulls, values) but applies none of them:
:func:`packtool.core.masks.prepare_documents` does, for ``pack`` and ``compare`` alike.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import heapq
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from packtool.errors import (InputError, ManifestError, PacktoolError, SchemaError,
                             first_line, raise_if_shortage, row_ref)
from packtool.formats.arrays import list_parts, numpy_values
from packtool.formats.manifest import (IN_PROGRESS_NAME, KINDS, MANIFEST_META_KEY,
                                       MANIFEST_NAME, PACKED_KIND, TOKENIZED_KIND,
                                       V1_MANIFEST_NAME, LOCK_NAME, Manifest, Tokenization,
                                       footer_of,
                                       read_manifest, run_holding,
                                       store_failure, unreadable, version_1_listed)
from packtool.formats.sniff import IPC_FILE_MAGIC, compression_of, content_fix
from packtool.formats.schema import (MASK_LIKE, check_single_column, check_token_column,
                                     is_integer_list, is_list_layout, pass_token_column,
                                     token_column_candidates, tokenize_first)
from packtool.location import Location, StoreError
from packtool.types import (ATTENTION_MASK_COLUMN, COLUMN_OPTIONS, IGNORE_INDEX, INT32_MAX,
                            LABELS_COLUMN, LOSS_MASK_COLUMNS, PACKED_COLUMNS, token_column_fix)

__all__ = ["InputFile", "RawBatch", "Discovery", "InputSource", "MaskColumns", "InputColumns",
           "discover", "discover_inputs", "open_input", "input_schema", "check_not_packed",
           "check_stream_end", "unreadable_error", "DENIED",
           "packed_evidence", "PACKED_COLUMNS", "iter_token_batches",
           "list_parts", "resolve_mask_columns", "input_columns", "reads_labels",
           "check_source_column", "first_data_file", "check_token_columns_agree",
           "holds_no_documents", "jsonl_token_keys", "jsonl_tokens_fix",
           "filesystem_of", "is_remote", "SUPPORTED_FORMATS", "TEXT_FORMATS", "AUTO",
           "LOSS_MASK_COLUMNS", "text_compression"]

log = logging.getLogger(__name__)

#: One phrase naming what INPUT may be (used in every "unsupported" message).
SUPPORTED_FORMATS = ("Parquet (*.parquet), Arrow IPC/Feather v2 (*.arrow, *.feather, *.ipc, "
                     "*.arrows) and Hugging Face save_to_disk folders")

#: What is said of a file or folder packtool may not read (the fix is its permissions, not
#: the data).
DENIED = ("permission denied: fix its permissions (packtool must read it), or move it out of "
          "INPUT")
_PARQUET_SUFFIXES = (".parquet",)
_IPC_SUFFIXES = (".arrow", ".feather", ".ipc", ".arrows")
#: Whole-file compression of JSON Lines: suffix (matched in any case) -> the codec that
#: decompresses it (:func:`text_compression`; None: plain text).
_JSONL_CODECS = {"": None, ".gz": "gzip", ".zst": "zstd", ".bz2": "bz2"}
#: JSON Lines, read as text input only (``packtool tokenize``)
_JSONL_SUFFIXES = tuple(f"{s}{z}" for s in (".jsonl", ".ndjson") for z in _JSONL_CODECS)
#: One phrase naming what ``packtool tokenize`` reads.
TEXT_FORMATS = ("Parquet (*.parquet), Arrow IPC/Feather v2 (*.arrow, *.feather, *.ipc, *.arrows), "
                "Hugging Face save_to_disk folders with a text column and JSON Lines (*.jsonl, "
                "*.ndjson, optionally .gz/.zst/.bz2)")
_PACKED_META_PREFIX = b"packtool."
_HF_STATE = "state.json"
_HF_INFO = "dataset_info.json"
_HF_DICT = "dataset_dict.json"
_FEATHER_V1_MAGIC = b"FEA1"


@dataclass(frozen=True)
class InputFile:
    """One input shard: its path, path relative to the INPUT it was found under, size in bytes,
    modification time (ns) and format (``parquet``, ``arrow``, or ``jsonl`` for text input)."""

    path: Path
    rel: str
    bytes: int
    mtime_ns: int
    format: str = "parquet"
    #: a shard of a finished ``packtool tokenize`` output: what its manifest says tokenize did
    #: (:class:`~packtool.formats.manifest.Tokenization`: the tokenizer, the BOS/EOS ids
    #: added); None for any other file (nothing is known of it)
    tokenization: Tokenization | None = None


@dataclass(frozen=True)
class RawBatch:
    """Documents ``first_row .. first_row + len(lengths) - 1`` of one file as stored: the tokens
    and the mask columns read with them, each checked (shape, nulls, values) but not applied.
    :func:`packtool.core.masks.prepare_documents` turns them into the documents packed."""

    first_row: int  #: row index in the file of the first document
    lengths: np.ndarray  #: int64[docs], tokens per document
    tokens: np.ndarray  #: int32[sum(lengths)], the documents' tokens back to back
    #: int64[sum(lengths)] attention mask (0 = padding); None: not read
    keep: np.ndarray | None = None
    labels: np.ndarray | None = None  #: int64[sum(lengths)] unshifted labels (-100 or the token)
    loss_masks: tuple = ()  #: int64[sum(lengths)] loss masks, 1 = learn, 0 = not a target
    #: [docs] the ``--source-column`` value of each document (int64, or str objects); None:
    #: not read
    sources: np.ndarray | None = None


#: Mask column option value: use the column of the default name when the file has it.
AUTO = "auto"


@dataclass(frozen=True)
class MaskColumns:
    """The mask columns used for one file (None or empty: not used), and the per-token columns
    whose name looks like a mask that are not used."""

    attention_mask: str | None = None
    labels: str | None = None
    loss_masks: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()

    @property
    def targets(self) -> bool:
        """True when target flags come from this file (a labels column or a loss mask)."""
        return self.labels is not None or bool(self.loss_masks)


def resolve_mask_columns(schema: pa.Schema, path, column: str, attention_mask: str | None = AUTO,
                         labels: str | None = AUTO, loss_mask: str | None = AUTO) -> MaskColumns:
    """Decide which mask columns of a file are read.

    Args:
        schema: the file's Arrow schema.
        path: the file (for messages).
        column: the token column.
        attention_mask, labels: a column name, :data:`AUTO` (use ``attention_mask`` /
            ``labels`` when the file has such a column) or None (off). The attention mask may be
            a list of integers or booleans; labels a list of integers. Under :data:`AUTO` a
            present column of another type is refused, never skipped in silence.
        loss_mask: a column name (0/1 per token, 1 = learn), :data:`AUTO` (each of
            :data:`LOSS_MASK_COLUMNS` the file has) or None (off); integers or booleans.

    Returns:
        :class:`MaskColumns`, with ``unused`` the other list columns whose name holds ``mask``
        or ``label`` (e.g. ``special_tokens_mask``, or ``labels`` with ``--labels-column
        none``).

    Raises:
        SchemaError: a named column is missing, a used column appears more than once or has
            another type, or a named column is the token column.
    """
    def usable(typ, allow_bool) -> bool:
        if is_integer_list(typ):
            return True
        return allow_bool and is_list_layout(typ) and pa.types.is_boolean(typ.value_type)

    def pick(name, default, option, allow_bool):
        if name is None:
            return None
        if name == AUTO:
            if default not in schema.names:
                return None
            if default == column:  # told so, not packed as ids nor checked against the others
                raise SchemaError(
                    f"{path}: --column {column!r} is the column read as "
                    f"{COLUMN_OPTIONS[option][0]} under {option} auto, not the token ids; "
                    f"{pass_token_column(schema, column)}; if {column!r} does hold the token "
                    f"ids, pass {option} none")
            name = default  # present: used, or refused below; never skipped in silence
        elif name == column:
            shown = ", ".join(schema.names[:8]) + (", ..." if len(schema.names) > 8 else "")
            raise SchemaError(f"{path}: {option} {name!r} is the token column; "
                              f"{token_column_fix(option, column)} (its columns: {shown})")
        if name not in schema.names:
            raise SchemaError(f"{path}: no column {name!r} for {option}; available columns: "
                              f"{', '.join(schema.names)}; pass {option} none to pack without it")
        check_single_column(schema, name, path)
        if not usable(schema.field(name).type, allow_bool):
            kind = "integers or booleans" if allow_bool else "integers"
            raise SchemaError(f"{path}: column {name!r} has type {schema.field(name).type}, "
                              f"expected a list of {kind} for {option}; pass {option} none "
                              "to pack without it")
        return name

    option = "--loss-mask-column"
    if loss_mask == AUTO:
        loss = tuple(n for n in (pick(AUTO, d, option, True) for d in LOSS_MASK_COLUMNS) if n)
    else:
        loss = tuple(n for n in [pick(loss_mask, None, option, True)] if n)
    cols = MaskColumns(pick(attention_mask, ATTENTION_MASK_COLUMN, "--attention-mask-column", True),
                       pick(labels, LABELS_COLUMN, "--labels-column", False), loss)
    used = {column, cols.attention_mask, cols.labels, *cols.loss_masks}
    unused = tuple(f.name for f in schema if f.name not in used and MASK_LIKE.search(f.name)
                   and is_list_layout(f.type))
    return dataclasses.replace(cols, unused=unused)


@dataclass(frozen=True)
class InputColumns:
    """What the mask columns of a whole INPUT come to (schemas only, read before packing)."""

    targets: bool  #: target flags come from at least one file (labels column or loss mask)
    #: per-token columns that look like masks but are not used -> files holding them
    unused: dict = field(default_factory=dict)

    def unused_note(self) -> str:
        """One line naming the unused mask-like columns (empty when there is none)."""
        if not self.unused:
            return ""
        parts = [f"{name} ({len(paths)} file{'' if len(paths) == 1 else 's'})"
                 for name, paths in self.unused.items()]
        return ("input columns that look like masks but are not used: " + ", ".join(parts)
                + "; name one with --attention-mask-column, --labels-column or "
                "--loss-mask-column if it should apply")


def input_columns(files, column: str, attention_mask: str | None = AUTO,
                  labels: str | None = AUTO, loss_mask: str | None = AUTO) -> InputColumns:
    """Which mask columns INPUT's files will be read with (their schemas only).

    Decided before reading, so every window of a pack stores the same columns.

    Raises:
        InputError, SchemaError: as :func:`input_schema` and :func:`resolve_mask_columns`; a
            file of packed rows (:func:`check_not_packed`).
    """
    targets, unused, agreed = False, {}, False
    for f in files:
        schema, shown = input_schema(f.path, getattr(f, "format", None))
        if column not in schema.names and not agreed:  # files naming it otherwise: said of all
            check_token_columns_agree(files, column)
            agreed = True
        check_not_packed(schema, shown, column)  # before its columns are judged as masks
        cols = resolve_mask_columns(schema, shown, column, attention_mask, labels, loss_mask)
        targets |= cols.targets
        for name in cols.unused:
            unused.setdefault(name, []).append(str(shown))
    return InputColumns(targets, unused)


def reads_labels(files, column: str, labels: str | None, loss_mask: str | None = None) -> bool:
    """True when target flags (a labels column, or a loss mask) will be read from at least one
    of ``files`` (schemas only): the packed labels then carry real information.

    Raises:
        InputError, SchemaError: as :func:`input_columns`.
    """
    if labels is None and loss_mask is None:
        return False
    return input_columns(files, column, None, labels, loss_mask).targets


@dataclass(frozen=True)
class Discovery:
    """What :func:`discover` found: the files in global document order, every file or folder
    it did not read (and why), and notes on the order."""

    files: list[InputFile]
    #: every entry under INPUT that is not read, as ``"path (reason)"``: hidden or
    #: ``_``-prefixed, a link loop, a second name (link) of a file or folder already read, a
    #: documentation file, a file a ``save_to_disk`` folder's
    #: ``state.json`` does not list, or (``skip_unsupported``) a file of another format
    skipped: list[str] = field(default_factory=list)
    #: notes on the order (file names whose numbers are not zero-padded)
    notes: list[str] = field(default_factory=list)

    def skipped_note(self, limit: int = 3) -> str:
        """One line naming the entries not read, by reason (empty when every file was read).

        Up to ``limit`` names per reason; :attr:`skipped` lists them all."""
        if not self.skipped:
            return ""
        by_reason: dict[str, list[str]] = {}
        for entry in self.skipped:
            path, _, reason = entry.rpartition(" (")
            by_reason.setdefault(reason.rstrip(")") if path else "skipped",
                                 []).append(path or entry)
        parts = []
        for reason, paths in by_reason.items():
            names = ", ".join(paths[:limit]) + (", ..." if len(paths) > limit else "")
            parts.append(f"{len(paths)} {reason}: {names}")
        n = len(self.skipped)
        return f"skipped {n} entr{'y' if n == 1 else 'ies'} (not read): " + "; ".join(parts)


def _format_of(name: str, text: bool = False) -> str | None:
    low = name.lower()
    if low.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    if low.endswith(_IPC_SUFFIXES):
        return "arrow"
    if text and low.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    return None


def data_file_suffix(name: str) -> str | None:
    """The suffix by which ``name`` (a file name or path) is a data file some command reads
    (``pack``: Parquet, Arrow IPC; ``tokenize``: JSON Lines too, optionally compressed), in
    any case, as written in ``name``; None for any other name. A folder named so (a Spark-style
    ``x.parquet/``) is still a folder: this looks at the name alone."""
    low = str(name).rstrip("/").lower()
    if _format_of(low, text=True) is None:
        return None
    for s in sorted((*_PARQUET_SUFFIXES, *_IPC_SUFFIXES, *_JSONL_SUFFIXES), key=len,
                    reverse=True):
        if low.endswith(s):
            return str(name).rstrip("/")[-len(s):]
    return None


#: Suffixes of a whole file compressed by a general-purpose tool (never read: Parquet and Arrow
#: IPC compress inside the file).
_COMPRESSED_SUFFIXES = (".gz", ".gzip", ".zst", ".zstd", ".bz2", ".xz", ".lz4", ".zip")


def text_compression(name: str) -> str | None:
    """The codec that decompresses the JSON Lines file ``name`` (a file name or path), by the
    suffix :func:`discover` recognised it by, in any case: ``gzip`` (``.gz``), ``zstd``
    (``.zst``), ``bz2`` (``.bz2``); None for plain ``.jsonl`` / ``.ndjson``."""
    low = str(name).lower()
    for z, codec in _JSONL_CODECS.items():
        if z and low.endswith(z):
            return codec
    return None


def _compressed_data(name: str, text: bool = False) -> bool:
    """True for the name of a data file compressed whole (``part-0.parquet.zst``,
    ``a.arrow.gz``): the name without its compression suffix is a format read."""
    low = name.lower()
    for z in _COMPRESSED_SUFFIXES:
        if low.endswith(z) and _format_of(low[:-len(z)], text) is not None:
            return True
    return False


def _has_text(names) -> bool:
    """Any of ``names`` a JSON Lines file (text for ``packtool tokenize``)."""
    return any(n.lower().endswith(_JSONL_SUFFIXES) for n in names)


def _convert_hint(paths, them: str = "them") -> str:
    """The fix for files ``pack`` cannot read (``paths``: how they are shown, local paths or
    URIs): JSON Lines of token ids (:func:`jsonl_token_keys`) are converted to Parquet, JSON
    Lines of text tokenized first, a data file named otherwise renamed
    (:func:`~packtool.formats.sniff.content_fix`), other data converted to tokenized Parquet."""
    paths = list(paths)
    text = [p for p in paths if _has_text([_name(str(p))])]
    if text:
        keys = jsonl_token_keys(text[0])
        if not keys:
            return tokenize_first()
        return (f"{'it' if them == 'it' else _name(str(text[0]))} "
                f"{jsonl_tokens_fix(text[0], keys, packing=True)}")
    for p in paths[:_SNIFFED]:
        fix = content_fix(_head_of(p))
        if fix:
            return f"{_name(str(p))} {fix}"
    return f"convert {them} to tokenized Parquet first"


#: Files of an unknown format whose first bytes are read to say what they are (a folder of
#: many such files is not read through).
_SNIFFED = 64


#: What a local entry that is neither a regular file nor a folder is, by its mode's file type
_SPECIAL_KINDS = (("S_ISFIFO", "a named pipe"), ("S_ISCHR", "a character device"),
                  ("S_ISBLK", "a block device"), ("S_ISSOCK", "a socket"))


def special_file(path) -> str | None:
    """What local ``path`` is when it is neither a regular file nor a folder (symbolic links
    followed): ``"a named pipe"`` (a FIFO, or the ``/dev/fd/N`` pipe of a shell's process
    substitution ``<(zcat x)``), ``"a character device"`` (``/dev/urandom``), ``"a block
    device"``, ``"a socket"``; None for a regular file, a folder, or a path that cannot be
    looked at (its reader names that fault). Never opens ``path``: opening a named pipe waits
    for a writer forever, deaf to Ctrl-C."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in _SPECIAL_KINDS:
        if getattr(stat, test)(mode):
            return kind
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else "not a file"


def _refuse_special(shown, kind: str) -> InputError:
    """The one-line refusal of INPUT ``shown`` that is ``kind`` (:func:`special_file`)."""
    return InputError(f"{shown}: not a regular file ({kind}); pass a file: packtool reads its "
                      "inputs whole, never a stream (a Parquet footer is at the end), so write "
                      "the stream to a file first (e.g. zcat x.jsonl.gz > x.jsonl, not <(zcat "
                      "x.jsonl.gz))")


def _head_of(shown, n: int = 32) -> bytes:
    """The first ``n`` bytes of file ``shown`` (a local path or URI); empty when it cannot be
    read (its reader names that fault)."""
    try:
        fs, path, _ = filesystem_of(shown)
        with fs.open_input_stream(path) as fh:
            return fh.read(n)
    except (PacktoolError, pa.ArrowException, OSError) as exc:
        raise_if_shortage(exc, str(shown))
        return b""


def jsonl_token_keys(shown, limit: int = 1 << 20) -> list[str]:
    """The keys of the first JSON object of the JSON Lines file ``shown`` (a local path or
    URI, compressed as its suffix says) whose values are lists of integers: token ids, not
    text. Empty when there is none, or the file cannot be read or parsed (within its first
    ``limit`` bytes)."""
    try:
        fs, path, _ = filesystem_of(shown)
        with fs.open_input_stream(path, compression=text_compression(path)) as fh:
            data = fh.read(limit)
    except (PacktoolError, pa.ArrowException, OSError) as exc:
        raise_if_shortage(exc, str(shown))
        return []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            return []
        if not isinstance(obj, dict):
            return []
        return [k for k, v in obj.items() if isinstance(v, list) and v
                and all(isinstance(x, int) and not isinstance(x, bool) for x in v)]
    return []


def jsonl_tokens_fix(shown, keys: Sequence[str], packing: bool = False) -> str:
    """The one fix for JSON Lines of token ids (``keys``: its keys holding lists of integers,
    :func:`jsonl_token_keys`): ``pack`` reads Parquet or Arrow, not JSON Lines: the two lines
    of pyarrow that convert it, then ``pack``; to follow the file's name (``tok.jsonl holds
    token ids ...``). ``packing``: said to a reader of token ids (``pack``, ``compare``),
    which are what it wants; False: to ``tokenize``, already tokenized, not text."""
    src = str(shown)
    stem = re.sub(r"\.(jsonl|ndjson)(\.(gz|zst|bz2))?$", "", src, flags=re.IGNORECASE)
    dest = f"{stem}.parquet"
    column = "" if keys[0] == "input_ids" else f" --column {keys[0]}"
    what = (f"holds token ids (key {keys[0]!r}, a list of integers) as JSON Lines, and "
            "packtool pack reads them from Parquet or Arrow only" if packing else
            f"holds token ids already (key {keys[0]!r}, a list of integers), not text, and "
            "packtool pack reads them from Parquet")
    return (f"{what}: convert it with python -c \"import "
            "pyarrow.json as pj, pyarrow.parquet as pq; pq.write_table(pj.read_json("
            f"{src!r}, read_options=pj.ReadOptions(block_size=1 << 28)), {dest!r})\", then "
            f"packtool pack --capacity C{column} {dest} OUTPUT")


def _decompress_hint(names: Sequence[str]) -> str:
    """The fix for compressed data files among ``names`` (empty when there is none)."""
    packed = [n for n in names if _compressed_data(_name(n))]
    if not packed:
        return ""
    return (f"; {', '.join(packed[:3])}{', ...' if len(packed) > 3 else ''} "
            f"{'is' if len(packed) == 1 else 'are'} compressed whole: decompress "
            f"{'it' if len(packed) == 1 else 'them'} first (zstd -d, gunzip, ...), Parquet and "
            "Arrow IPC compress inside the file")


def is_remote(location) -> bool:
    """True for a location in a store (``s3://bucket/key``, ``gs://...``), not a local path or a
    ``file:`` URI (:class:`packtool.location.Location` decides)."""
    return not Location.parse(location).is_local


def _location(given) -> str:
    """``given`` as a string: a local path (a ``file:`` URI becomes its path), or a store URI
    with its options (``//`` restored where ``pathlib`` folded it)."""
    return str(Location.parse(given))


def filesystem_of(location) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, path inside it, URI prefix) of a local path or a URI.

    A URI goes through :meth:`packtool.location.StoreURI.filesystem` (S3, GCS, HDFS, ... as
    pyarrow provides them; S3 reads ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ... from the
    environment, or ``?endpoint_override=...`` from the URI). The prefix turns a path inside the
    filesystem back into a URI (``"s3://"``; ``""`` for local paths).

    Raises:
        InputError: the URI cannot be opened (unknown scheme, no credentials, ...).
    """
    loc = Location.parse(location)
    try:
        fs, path = loc.filesystem()
    except OSError as exc:  # the location's own one-line message
        raise_if_shortage(exc)
        raise InputError(str(exc)) from None
    except (pa.ArrowException, ValueError) as exc:
        raise_if_shortage(exc)
        raise InputError(f"{loc.display}: cannot open this location ({first_line(exc)}); "
                         "check the URI and the credentials in the environment") from None
    return fs, path, "" if loc.is_local else f"{loc.scheme}://"


class _Place:
    """A filesystem, how to name its paths (a store's with the URI's options, so a file found
    through an endpoint is reopened through it) and how to tell two names of one file."""

    def __init__(self, fs: pafs.FileSystem, prefix: str, query: str = ""):
        self.fs, self.prefix, self.query = fs, prefix, query

    def show(self, path: str):
        if not self.prefix:
            return Path(path)
        return f"{self.prefix}{path}" + (f"?{self.query}" if self.query else "")

    def key(self, path: str):
        if self.prefix:  # object stores: no links, one name per object
            return (self.prefix, path)
        st = os.stat(path)  # follows links: a link and its target, or two hard links, share a key
        return st.st_dev, st.st_ino

    def enclosing(self, path: str) -> tuple:
        """Keys of every folder that holds ``path``, physically (its real path's parents) or as
        written (the parents of the path as given, which differ when ``path`` or one of its
        parents is a link), up to the root: a link to one of them leads back to ``path`` (a
        loop). A store: none."""
        if self.prefix:
            return ()
        parents = dict.fromkeys([*Path(os.path.realpath(path)).parents,
                                 *Path(os.path.abspath(path)).parents])
        return tuple(self.key(str(q)) for q in parents)

    def outputs(self, outputs) -> dict:
        """Folder key -> how a message names it, for each output (``(path, role)``) that
        exists on this local filesystem. A store: none (it has no links)."""
        if self.prefix:
            return {}
        found = {}
        for path, role in outputs:
            loc = Location.parse(path)
            if loc.is_local and os.path.isdir(loc.path):
                found[self.key(str(loc.path))] = f"{role} {loc.display}"
        return found

    @staticmethod
    def dangling(path: str) -> str:
        """What is wrong with a symbolic link the filesystem cannot follow, in words: a chain
        of links that comes back on itself, or a link to nothing."""
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                chain, q = [os.path.basename(path)], path
                for _ in range(8):  # the first links of the chain, as they are written
                    if not os.path.islink(q):
                        break
                    target = os.readlink(q)
                    chain.append(target)
                    q = os.path.join(os.path.dirname(q), target)
                return f"a loop of symbolic links ({' -> '.join(chain)} -> ...)"
        return f"a broken symbolic link (to {os.readlink(path)}, which does not exist)"

    def broken_links(self, directory: str, listed) -> list[str]:
        """Names in local ``directory`` that are symbolic links to nothing (the filesystem
        listing leaves them out), sorted. A store: none."""
        if self.prefix:
            return []
        try:
            names = os.listdir(directory)
        except OSError:
            return []
        return sorted(n for n in set(names) - set(listed)
                      if os.path.islink(os.path.join(directory, n))
                      and not os.path.exists(os.path.join(directory, n)))


@dataclass(frozen=True)
class _OutputMark:
    """What marks a folder as a packtool output: the file that shows it (for a message), the
    kind of output (:data:`PACKED_KIND` or :data:`TOKENIZED_KIND`) and, for a finished one, its
    manifest (None while a run writes it, and for format version 1)."""

    name: str
    kind: str
    manifest: Manifest | None = None


def _output_mark(fs: pafs.FileSystem, names: set[str], directory: str) -> _OutputMark | None:
    """What marks ``directory`` as a packtool output, or None. A readable manifest comes first
    (a finished output: the in-progress marker beside it is a run killed once it was written,
    or an ``--overwrite`` run not yet committed, which leaves it whole until then); then an
    in-progress marker (a run writes the folder, or was interrupted: its kind is the marker's;
    a marker written before kinds existed is a pack's); then an unreadable manifest (taken for
    packed rows, never read as documents); then a format-version-1 manifest."""
    unreadable = None
    if MANIFEST_NAME in names:
        try:
            with fs.open_input_file(f"{directory}/{MANIFEST_NAME}") as fh:
                meta = pq.read_schema(fh).metadata or {}
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise_if_shortage(exc)
            meta = None
        if meta is not None and MANIFEST_META_KEY in meta:
            try:
                manifest = Manifest.from_dict(json.loads(meta[MANIFEST_META_KEY]))
            except (ManifestError, ValueError):  # unreadable: refused as packed
                unreadable = _OutputMark(MANIFEST_NAME, PACKED_KIND)
            else:
                return _OutputMark(MANIFEST_NAME, manifest.kind, manifest)
    if IN_PROGRESS_NAME in names:
        try:
            with fs.open_input_stream(f"{directory}/{IN_PROGRESS_NAME}") as fh:
                doc = json.loads(fh.read())
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise_if_shortage(exc)
            doc = None
        kind = doc.get("kind") if isinstance(doc, dict) else None
        return _OutputMark(IN_PROGRESS_NAME, kind if kind in KINDS else PACKED_KIND)
    if unreadable is not None:
        return unreadable
    if MANIFEST_NAME in names and meta is None:
        return None
    if V1_MANIFEST_NAME in names:  # an output of format version 1
        try:
            with fs.open_input_stream(f"{directory}/{V1_MANIFEST_NAME}") as fh:
                listed = version_1_listed(fh.read())
        except (OSError, pa.ArrowException) as exc:
            raise_if_shortage(exc)
            return None
        if listed is not None:
            return _OutputMark(f"{V1_MANIFEST_NAME}, format version 1", PACKED_KIND)
    return None


def _tokenization(manifest: Manifest) -> Tokenization | None:
    """What the manifest of a finished tokenize output says tokenize did to its documents, or
    None when it does not say it whole (a manifest edited by hand): nothing is then known."""
    try:
        return Tokenization.of_manifest(manifest)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _tokenized_shards(place: _Place, dpath: str, drel: str, infos, manifest: Manifest, disp,
                      skipped: list[str], other: list[tuple[str, str]],
                      linked: bool) -> list[_Found]:
    """The shards of the finished ``packtool tokenize`` output in folder ``dpath``: exactly
    those its manifest lists, in its order (the documents' order), each checked before
    anything is read.

    A listed shard must be there with its recorded size and Parquet footer (the footer's sha256
    when the manifest records it, else its row count: what the packed-output reader's ``footer``
    integrity checks, one small read per shard; the whole file's sha256 is not read), and the
    shards' rows must add up to the manifest's ``docs_in``. Of the other entries, the manifest
    is neither data nor reported; hidden or ``_``-prefixed entries and documentation are
    reported (``skipped``); a file of another format goes to ``other`` (refused unless
    ``skip_unsupported``, as in any folder); a data file or folder the manifest does not list is
    refused: a copy of a shard would be packed twice, anything else is not that output's.

    Each shard found carries what the manifest says tokenize did to its documents
    (:func:`_tokenization`; ``InputFile.tokenization``), which ``pack`` records.

    Raises:
        InputError: one line naming the first shard missing, resized or rewritten, the
            entries not listed, or the counts that disagree, with the fix.
    """
    where = disp(drel.rstrip("/"))
    fix = ("restore the file, or rerun the same packtool tokenize command to write the output "
           "again")
    by_name = {_name(i.path): i for i in infos}
    listed = {s.file for s in manifest.shards}
    docs = sum(s.rows for s in manifest.shards)
    if docs != manifest.totals.docs_in:
        raise InputError(f"{where}: the shards its manifest lists hold {docs:,} documents, its "
                         f"totals say {manifest.totals.docs_in:,}: the manifest of this "
                         "tokenized output was edited or damaged; rerun the same packtool "
                         "tokenize command with --overwrite")
    for s in manifest.shards:
        info = by_name.get(s.file)
        if info is None or info.type != pafs.FileType.File:
            raise InputError(f"{disp(drel + s.file)}: listed in the manifest of the tokenized "
                             f"output {where} ({s.rows:,} documents) but missing; {fix}")
        if int(info.size or 0) != s.bytes:
            raise InputError(f"{disp(drel + s.file)}: size {int(info.size or 0):,} bytes, the "
                             f"manifest of the tokenized output {where} says {s.bytes:,}: the "
                             f"shard was changed or truncated; {fix}")
    unlisted, found = [], []
    made = _tokenization(manifest)
    for name in sorted(by_name):
        info = by_name[name]
        if name == MANIFEST_NAME or name in listed:
            continue
        if name.startswith((".", "_")):
            skipped.append(f"{disp(drel + name)} (hidden or '_'-prefixed)")
        elif info.type == pafs.FileType.Directory or _format_of(name) is not None:
            unlisted.append(name + ("/" if info.type == pafs.FileType.Directory else ""))
        elif _DOC_NAMES.search(name):
            skipped.append(f"{disp(drel + name)} (documentation)")
        else:
            other.append((f"{drel}{name}", str(disp(drel + name))))
    if unlisted:
        names = ", ".join(unlisted[:3]) + (f", ... ({len(unlisted)} in all)"
                                           if len(unlisted) > 3 else "")
        one = len(unlisted) == 1
        raise InputError(f"{where}: a tokenized output holding {'an entry' if one else 'entries'} "
                         f"its manifest does not list ({names}): a copy of a shard would be "
                         f"packed twice, and anything else is not that output's; move "
                         f"{'it' if one else 'them'} out of {where} (data of its own: pass it "
                         "as another INPUT)")
    for i, s in enumerate(manifest.shards):
        info = by_name[s.file]
        shown = disp(drel + s.file)
        try:
            with place.fs.open_input_file(info.path) as fh:
                footer = footer_of(fh, s.bytes)
            rows = (None if s.footer_sha256 is not None else
                    pq.read_metadata(pa.BufferReader(b"PAR1" + footer)).num_rows)
        except (OSError, pa.ArrowException) as exc:
            raise_if_shortage(exc, str(shown))
            told = store_failure(shown, exc)  # the store failed, not the shard
            if told is not None:
                raise told from None
            raise InputError(f"{shown}: not the shard the manifest of the tokenized output "
                             f"{where} lists ({first_line(exc)}); {fix}") from None
        if (hashlib.sha256(footer).hexdigest() != s.footer_sha256 if rows is None
                else rows != s.rows):
            raise InputError(f"{shown}: its Parquet footer differs from the manifest of the "
                             f"tokenized output {where}: the shard was rewritten; {fix}")
        found.append((info.path, f"{drel}{s.file}", "parquet", info, (drel, i),
                      linked or (not place.prefix and os.path.islink(info.path)), made))
    return found


#: What a packer writes in each of :data:`packtool.types.PACKED_COLUMNS` beside a packed row,
#: for the refusal.
_PACKED_COLUMN_MEANING = {
    "seq_lengths": "the lengths of the row's documents",
    "position_ids": "positions restarting at each document of the row",
    "cu_seqlens": "the offsets of the row's documents",
    "cu_seq_lens": "the offsets of the row's documents",
    "segment_ids": "each token's document",
    "seq_idx": "each token's document",
    "seq_start_id": "where each document of the row starts",
}
#: The columns of a packtool output that together name it one (its schema metadata lost in a
#: re-save by polars, pandas or ``datasets.to_parquet``).
_PACKTOOL_COLUMNS = ("segment_ids", "cu_seqlens", "doc_ids", "doc_offsets")


def packed_evidence(schema: pa.Schema, column: str | None = None) -> tuple[str, str | None] | None:
    """What in ``schema`` shows that a file holds packed rows (several documents a row), or None.

    The one owner of that decision for input files (schema only: nothing is read but the
    footer): ``packtool.*`` schema metadata (a packtool shard), packtool's own columns (a
    packtool shard re-saved without its metadata), or one of :data:`PACKED_COLUMNS`
    (another tool's packed rows). ``column`` (the token column) is never evidence.

    Returns:
        (what shows it, for a message; the column of another tool's packed rows, None for a
        packtool output), or None.
    """
    key = _packed_key(schema)
    if key:
        return f"schema metadata {key}", None
    names = set(schema.names) - {column}
    if all(c in names for c in _PACKTOOL_COLUMNS):
        return (f"columns {', '.join(_PACKTOOL_COLUMNS)}, its packtool schema metadata lost in a "
                "re-save"), None
    found = [c for c in PACKED_COLUMNS if c in names]
    return (f"column {found[0]!r}", found[0]) if found else None


def check_not_packed(schema: pa.Schema, where, column: str | None = None) -> None:
    """Refuse a file whose schema shows packed rows (:func:`packed_evidence`).

    Raises:
        InputError: one line naming the file, what shows it and the fix.
    """
    found = packed_evidence(schema, column)
    if found is not None:
        _refuse_packed(where, *found)


def _refuse_packed(where: Path | str, evidence: str, column: str | None = None) -> None:
    """The one refusal of packed rows given as INPUT (``evidence``: what shows them; ``column``:
    the column of another tool's packed rows, None for a packtool output). Another tool's
    column is judged by its name alone (:data:`PACKED_COLUMNS`): the message says what such a
    column marks and that its values were not read, never that the rows hold several
    documents."""
    if column is None:
        raise InputError(f"{where}: is a packtool output ({evidence}), not tokenized documents: "
                         "packing it again would join the documents of each row; point INPUT "
                         "at the tokenized documents it was packed from (to inspect packed rows "
                         "use packtool stats)")
    raise InputError(f"{where}: has a {column!r} column, which marks rows another tool packed "
                     f"(a packer writes {_PACKED_COLUMN_MEANING[column]} in it; read as one "
                     "document, a packed row would join its documents): refused from the "
                     "schema, its values unread; pack the unpacked documents instead, or, if "
                     f"each row is one document, drop the {column!r} column")


def _refuse_unfinished_tokenize(place: _Place, directory: str, where) -> None:
    """The one refusal of a ``packtool tokenize`` OUTPUT that is not finished (its in-progress
    marker says kind ``tokenized``): its documents are not all written, so none is read. One
    whose lock is held (a local lock, or a store's lock object naming a live process of this
    host) is being written now; a store's lock object naming another host's process cannot be
    asked: being written or interrupted; else interrupted
    (:func:`~packtool.formats.manifest.run_holding`).

    Raises:
        InputError: names the folder (as ``where``), what it is and the fix.
    """
    state, held = run_holding(str(place.show(directory)))
    if state == "now":
        lock = ("its lock is held" if held is None else f"its lock object {LOCK_NAME} names "
                f"pid {held.get('pid', '?')} of this host, which is running")
        raise InputError(f"{where}: a packtool tokenize run is writing it now ({lock}), so not "
                         "all of its documents are written yet; wait for that tokenize run to "
                         "end, then pack it")
    if state == "maybe":
        raise InputError(f"{where}: an unfinished (interrupted or running) packtool tokenize "
                         f"run ({IN_PROGRESS_NAME}, no {MANIFEST_NAME} yet; its lock object "
                         f"{LOCK_NAME} names host {held.get('host', '?')}, which cannot be asked "
                         "from here), so not all of its documents are written; wait for that "
                         "tokenize run to end, or, if it was stopped, rerun the same packtool "
                         "tokenize command to finish it; then pack it")
    raise InputError(f"{where}: an interrupted packtool tokenize run ({IN_PROGRESS_NAME}, no "
                     f"{MANIFEST_NAME} yet), so not all of its documents are written; rerun "
                     "the same packtool tokenize command to finish it, then pack it")


def _hf_files(fs: pafs.FileSystem, directory: str, shown) -> list[str]:
    """Data file names of a ``save_to_disk`` folder, in its own order (``state.json``).

    Raises:
        InputError: ``state.json`` is not readable, lists no file, or holds an indices mapping
            (an older ``datasets`` saved a selection or shuffle as row numbers over the data
            files: the dataset's rows are then not the files' rows in order).
    """
    try:
        with fs.open_input_stream(f"{directory}/{_HF_STATE}") as fh:
            state = json.loads(fh.read())
        names = [d["filename"] for d in state["_data_files"]]
        indices = state.get("_indices_data_files")
    except (OSError, ValueError, KeyError, TypeError, AttributeError,
            pa.ArrowException) as exc:
        raise_if_shortage(exc)
        raise InputError(f"{shown}/{_HF_STATE}: not a readable Hugging Face dataset state "
                         f"({first_line(exc)}); save the dataset again with save_to_disk") from None
    if indices:
        listed = ", ".join(str(d.get("filename", d)) if isinstance(d, dict) else str(d)
                           for d in indices)
        raise InputError(f"{shown}: Hugging Face dataset saved with an indices mapping "
                         f"({_HF_STATE} lists {listed}): its row order is not the data files' "
                         "order; load it, call flatten_indices() and save_to_disk again")
    if not names:
        raise InputError(f"{shown}: Hugging Face dataset with no data files; save it again")
    return names


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


#: files next to data that are never data (read by people, not by packtool): reported as
#: skipped, never refused
_DOC_NAMES = re.compile(r"^(readme|license|licence|copying|notice|changelog)([._-].*)?$|\.md$",
                        re.IGNORECASE)


def _natural_key(name: str):
    return [(0, int(t), "") if t.isdecimal() else (1, 0, t) for t in re.split(r"(\d+)", name) if t]


def first_data_file(names) -> str | None:
    """The data file a message names of a folder's ``names`` (relative paths with ``/``, any
    order): the first in natural order (``shard-0``, ``shard-2``, ``shard-10``:
    :func:`_natural_key`), hidden and ``_``-prefixed entries left out as discovery leaves
    them; None for none."""
    names = [n for n in names if not any(part.startswith((".", "_")) for part in n.split("/"))]
    return min(names, key=_natural_key, default=None)


def _order_note(shown, names: list[str]) -> str | None:
    """A note when names in one folder whose numbers differ in width are read in text order
    against their numeric order (``part-10`` before ``part-2``); None otherwise."""
    text = sorted(names)
    natural = sorted(names, key=_natural_key)
    if text == natural:
        return None
    i = next(k for k, (a, b) in enumerate(zip(text, natural)) if a != b)
    first, second = text[i], natural[i]
    return (f"{shown}: file names are read in text order, so {first} comes before "
            f"{second} (as pyarrow.dataset reads them); zero-pad the numbers in the names, or "
            "pass the files in the order you mean, if that is not the order of the documents")


def _escaped(name: bytes) -> str:
    """A file name of any bytes as printable text: invalid UTF-8 bytes as ``\\xe9``."""
    return name.decode("utf-8", "backslashreplace")


def _utf8_entries(infos, drel: str, disp, skipped: list[str], skip_unsupported: bool,
                  text: bool) -> list:
    """The entries of one folder listing whose names are valid UTF-8.

    pyarrow names files in UTF-8 only (a Latin-1 ``caf\\xe9.parquet`` cannot be opened or even
    named by it). Such an entry is reported (hidden or ``_``-prefixed; documentation or, with
    ``skip_unsupported``, a file of another format) like any entry not read, else refused.

    Raises:
        InputError: a folder or data file (or, without ``skip_unsupported``, any file) whose
            name is not valid UTF-8: every such name in the folder, as bytes, and the fix.
    """
    good, bad = [], []
    for info in infos:
        try:
            _ = info.path  # pyarrow decodes the name here
        except UnicodeDecodeError as exc:  # exc.object: the path's bytes
            bad.append((bytes(exc.object).rstrip(b"/").rsplit(b"/", 1)[-1], info))
            continue
        good.append(info)
    refused = []
    for raw, info in bad:
        name = _escaped(raw)
        if raw.startswith((b".", b"_")):
            skipped.append(f"{disp(drel + name)} (hidden or '_'-prefixed)")
        elif info.type == pafs.FileType.File and _format_of(name, text) is None and (
                _DOC_NAMES.search(name) or skip_unsupported):
            why = "documentation" if _DOC_NAMES.search(name) else "unsupported format"
            skipped.append(f"{disp(drel + name)} ({why})")
        else:
            refused.append(raw)
    if refused:
        names = ", ".join(repr(n) for n in refused[:5]) + (
            f", ... ({len(refused)} in all)" if len(refused) > 5 else "")
        one = len(refused) == 1
        raise InputError(f"{disp(drel.rstrip('/'))}: holds {'a' if one else len(refused)} "
                         f"{'name' if one else 'names'} that {'is' if one else 'are'} not valid "
                         f"UTF-8 ({names}), which pyarrow cannot open; rename "
                         f"{'it' if one else 'them'} in UTF-8 (e.g. convmv -f latin1 -t utf8 "
                         f"--notest) or move {'it' if one else 'them'} out of INPUT")
    return good


#: one walk entry: (path, relative path, format, FileInfo, sort key, reached through a link,
#: the :class:`~packtool.formats.manifest.Tokenization` of the tokenize output it is a shard of
#: or None)
_Found = tuple


def _walk(place: _Place, root: str, skipped: list[str], notes: list[str],
          skip_unsupported: bool, disp=None, text: bool = False,
          avoid: dict | None = None) -> list[_Found]:
    """Every data file under ``root``, each with its key in the global document order.

    The key is the relative path, except for the files of a ``save_to_disk`` folder, which
    sort at the folder's relative path in their ``state.json`` order (their names say nothing
    of it). Entries not read go to ``skipped`` with the reason, named by ``disp(relative
    path)`` (default: the path inside the filesystem). ``text``: JSON Lines files are data too.
    ``avoid``: folder key -> name of the run's own outputs (:meth:`_Place.outputs`), refused
    when a link leads to one.

    Raises:
        InputError: as :func:`discover`; a file of another format inside the folder (unless
            ``skip_unsupported``).
    """
    avoid = avoid or {}
    fs = place.fs
    skipped_before = len(skipped)
    disp = disp or (lambda rel: place.show(f"{root}/{rel}" if rel else root))
    found: list[_Found] = []
    other: list[tuple[str, str]] = []  # files of another format: (relative path, shown)
    # Folders are entered from a heap: every folder reached without a link first, then those
    # reached through one, each in sorted relative-path order. Each carries the keys of the
    # folders that hold it, by the walk and physically (INPUT's own included): a link to one
    # of them is a loop, never entered. A folder reached twice is read once, at the first
    # place popped: its own path if INPUT holds it, else the first link's.
    entered: dict = {}  # folder key -> relative path it is read at
    top = place.key(root)
    heap = [(False, "", root, top, (top,) + place.enclosing(root))]
    while heap:
        linked, drel, dpath, key, ancestors = heapq.heappop(heap)
        if key in entered:
            skipped.append(f"{disp(drel.rstrip('/'))} (another name of a folder read at "
                           f"{entered[key] or '.'})")
            continue
        entered[key] = drel
        try:
            infos = fs.get_file_info(pafs.FileSelector(dpath, recursive=False))
        except PermissionError:
            raise InputError(f"{disp(drel.rstrip('/'))}: {DENIED}") from None
        infos = _utf8_entries(infos, drel, disp, skipped, skip_unsupported, text)
        by_name = {_name(i.path): i for i in infos}
        broken = []
        for name in place.broken_links(dpath, by_name):
            if name.startswith((".", "_")):
                skipped.append(f"{disp(drel + name)} (hidden or '_'-prefixed)")
            else:
                broken.append(name)
        if broken:  # every one of the folder's named at once, not one a run
            more = "".join(f"; {disp(drel + n)}: {place.dangling(os.path.join(dpath, n))}"
                           for n in broken[1:6])
            more += f"; and {len(broken) - 6} more" if len(broken) > 6 else ""
            raise InputError(f"{disp(drel + broken[0])}: "
                             f"{place.dangling(os.path.join(dpath, broken[0]))}{more}; fix the "
                             f"link{'s' if len(broken) > 1 else ''} or remove "
                             f"{'them' if len(broken) > 1 else 'it'} from INPUT")
        mark = _output_mark(fs, set(by_name), dpath)
        if mark is not None and mark.manifest is not None and mark.kind == TOKENIZED_KIND:
            # a finished tokenize output: its documents are the shards its manifest lists
            found.extend(_tokenized_shards(place, dpath, drel, infos, mark.manifest, disp,
                                           skipped, other, linked))
            continue
        if mark is not None and mark.kind == TOKENIZED_KIND:  # a tokenize run not finished
            _refuse_unfinished_tokenize(place, dpath, disp(drel.rstrip("/")))
        if mark is not None:
            _refuse_packed(place.show(dpath), mark.name)
        if _HF_DICT in by_name and _HF_STATE not in by_name:
            splits = sorted(n for n, i in by_name.items() if i.type == pafs.FileType.Directory
                            and not n.startswith((".", "_")))
            example = "train" if "train" in splits or not splits else splits[0]
            raise InputError(f"{place.show(dpath)}: Hugging Face DatasetDict with splits "
                             f"{', '.join(splits) or '(none)'}; pass one split folder as INPUT, "
                             f"e.g. {place.show(f'{dpath}/{example}')}")
        if _HF_STATE in by_name and _HF_INFO in by_name:
            listed = _hf_files(fs, dpath, place.show(dpath))
            for i, name in enumerate(listed):
                info = by_name.get(name)
                if info is None or info.type != pafs.FileType.File:
                    raise InputError(f"{place.show(f'{dpath}/{name}')}: listed in "
                                     f"{_HF_STATE} but missing; save the dataset again")
                found.append((info.path, f"{drel}{name}", "arrow", info, (drel, i), linked,
                              None))
            for name in sorted(set(by_name) - set(listed) - {_HF_STATE, _HF_INFO}):
                why = "hidden or '_'-prefixed" if name.startswith((".", "_")) else \
                    f"not listed in {_HF_STATE}"
                skipped.append(f"{disp(drel + name)} ({why})")
            continue
        read_here = []
        for info in sorted(infos, key=lambda i: i.path):
            name = _name(info.path)
            if name.startswith((".", "_")):
                skipped.append(f"{disp(drel + name)} (hidden or '_'-prefixed)")
                continue
            if info.type == pafs.FileType.Directory:
                key = place.key(info.path)
                if key in ancestors:
                    skipped.append(f"{disp(drel + name)} (link loop)")
                    continue
                held = ancestors + (key,)
                link = not place.prefix and os.path.islink(info.path)
                if (linked or link) and key in avoid:  # the pack's own output, by a link
                    raise InputError(f"{disp(drel + name)}: leads to {avoid[key]} through a "
                                     "symbolic link (INPUT must not hold the pack's output); "
                                     "remove the link from INPUT")
                if link:  # it may lead out of INPUT: what holds its target is a loop too
                    held += place.enclosing(info.path)
                heapq.heappush(heap, (linked or link, f"{drel}{name}/", info.path, key, held))
                read_here.append(name)
            elif info.type == pafs.FileType.File:
                fmt = _format_of(name, text)
                if fmt is not None:
                    found.append((info.path, f"{drel}{name}", fmt, info, (f"{drel}{name}", 0),
                                  linked or (not place.prefix and os.path.islink(info.path)),
                                  None))
                    read_here.append(name)
                elif _DOC_NAMES.search(name):
                    skipped.append(f"{disp(drel + name)} (documentation)")
                else:
                    other.append((f"{drel}{name}", str(disp(drel + name))))
            elif not place.prefix and (kind := special_file(info.path)) is not None:
                # a named pipe or a device (a link to /dev/urandom) is never opened
                skipped.append(f"{disp(drel + name)} (not a regular file: {kind})")
        note = _order_note(disp(drel.rstrip("/")), read_here)
        if note:
            notes.append(note)
    other.sort()
    if not found:
        names = [_name(rel) for rel, _ in other]
        seen = f" (found {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" \
            if other else ""
        hint = _convert_hint([shown for _, shown in other]) if other else ""
        if text and hint.startswith("text is tokenized"):
            hint = ""  # what tokenize reads
        hint = f"; {hint}" if hint and not hint.startswith("convert ") else ""
        hidden = _hidden_note(skipped[skipped_before:])
        if text:
            raise InputError(f"{disp('')}: directory holds no *.parquet, *.jsonl, Arrow "
                             f"IPC file or Hugging Face dataset{seen}{hidden}; point INPUT at "
                             f"the text (supported: {TEXT_FORMATS}){hint}")
        raise InputError(f"{disp('')}: directory holds no *.parquet, Arrow IPC file or "
                         f"Hugging Face dataset{seen}{hidden}; point INPUT at the tokenized "
                         f"shards (supported: {SUPPORTED_FORMATS}){hint}"
                         + _decompress_hint(names))
    if other and not skip_unsupported:
        names = ", ".join(rel for rel, _ in other[:5]) + (
            f", ... ({len(other)} in all)" if len(other) > 5 else "")
        if text:
            raise InputError(f"{disp('')}: holds {len(other)} file"
                             f"{'' if len(other) == 1 else 's'} of an unsupported format that "
                             f"would not be tokenized: {names}; supported: {TEXT_FORMATS}; move "
                             "them out of INPUT, or pass --skip-unsupported to tokenize the rest"
                             f"{_decompress_hint([rel for rel, _ in other])}")
        raise InputError(f"{disp('')}: holds {len(other)} file"
                         f"{'' if len(other) == 1 else 's'} of an unsupported format that would "
                         f"not be packed: {names}; supported: {SUPPORTED_FORMATS}; "
                         f"{_convert_hint([shown for _, shown in other])}; move them out of "
                         "INPUT, or pass --skip-unsupported to pack the rest"
                         f"{_decompress_hint([rel for rel, _ in other])}")
    for i, (rel, shown) in enumerate(other):
        fix = content_fix(_head_of(shown)) if i < _SNIFFED else None
        if _compressed_data(_name(rel)):
            skipped.append(f"{shown} (compressed whole, decompress it to read it)")
        elif fix:
            skipped.append(f"{shown} ({fix.removeprefix('is ').replace('; ', ': ')})")
        else:
            skipped.append(f"{shown} (unsupported format)")
    return found


#: the reason :func:`discover` gives a hidden or ``_``-prefixed entry it skips
_HIDDEN = "(hidden or '_'-prefixed)"


def _hidden_note(skipped: Sequence[str]) -> str:
    """What a folder that holds no data says of the hidden and ``_``-prefixed entries it
    skipped (empty when there is none): their names, why they are skipped, and that such an
    entry given as INPUT itself is read."""
    hidden = [e[:-len(_HIDDEN) - 1] for e in skipped if e.endswith(_HIDDEN)]
    if not hidden:
        return ""
    names = ", ".join(hidden[:3]) + (f", ... ({len(hidden)} in all)" if len(hidden) > 3 else "")
    return (f"; skipped {names}: names starting with '_' or '.' are skipped as Spark/Hadoop "
            "metadata (_temporary, _SUCCESS) and hidden files; if the data is there, pass it "
            f"as INPUT itself (e.g. {hidden[0]}) or rename it")


def _check_utf8_path(path: str, given: str) -> None:
    """Refuse a local INPUT whose path is not valid UTF-8 (pyarrow opens UTF-8 paths only).

    Raises:
        InputError: the path (invalid bytes as ``\\xe9``), the first such part and the fix.
    """
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        bad = next(p for p in Path(path).parts if not _is_utf8(p))
        raise InputError(f"{_escaped(os.fsencode(given))}: {os.fsencode(bad)!r} in the path is "
                         "not valid UTF-8, which pyarrow cannot open; rename it in UTF-8 (e.g. "
                         "convmv -f latin1 -t utf8 --notest)") from None


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def discover(inputs: Sequence[str | os.PathLike], *, skip_unsupported: bool = False,
             text: bool = False, outputs: Sequence[tuple] = ()) -> Discovery:
    """Expand INPUT paths or URIs into data files, in global document order.

    Order (what ``doc_ids`` numbers): the INPUT paths in the order given; inside a directory
    (or an object-store prefix), searched recursively, files in sorted relative-path order
    (Python string order of the path with ``/`` separators, as ``pyarrow.dataset`` sorts them);
    a ``save_to_disk`` folder's files, at the folder's place in that order, in the order its
    ``state.json`` lists them (what ``datasets.load_from_disk`` returns); then rows in file
    order (Parquet row groups, Arrow IPC record batches). Local files keep
    :class:`~pathlib.Path` paths; files in an object store are named by URI
    (``s3://bucket/key``).

    Symbolic links are followed, to files and to folders anywhere (shards kept elsewhere), but
    a folder link that leads back to a folder holding it (INPUT, one of INPUT's own parents, or
    a parent of the link's target, as written or physically) is a loop: never entered,
    reported; a link that leads to one of the run's ``outputs`` is refused. Inside one INPUT
    folder, a file or folder reached by several names (symbolic or hard links) is read once:
    at its own path when INPUT holds it, else at the name that sorts first; the other names
    are reported. Files keep their place in the order above.

    Every entry that is not read is reported in :attr:`Discovery.skipped` with the reason:
    hidden or ``_``-prefixed entries, link loops, second names of a file or folder,
    documentation files (``README*``, ``LICENSE*``, ``*.md``), files a ``save_to_disk``
    folder does not list, entries that are no regular file (a named pipe, a link to a device:
    never opened, :func:`special_file`), and, with ``skip_unsupported``, files of another
    format.

    Args:
        inputs: INPUT paths or URIs.
        outputs: ``(path, role)`` of the run's own outputs (``("out/", "OUTPUT")``): a folder
            link inside INPUT that leads to one is refused (the second run would find its
            own output in its input).
        skip_unsupported: skip files of an unsupported format inside a directory (listed in
            ``skipped``) instead of refusing them.
        text: the inputs of ``packtool tokenize``: JSON Lines files (format ``jsonl``) are
            data too, and the messages name :data:`TEXT_FORMATS`.

    Returns:
        :class:`Discovery` (files, entries not read, notes).

    Raises:
        InputError: a path does not exist; a file or directory holds no supported format (the
            message names the supported formats); a directory holds files of an unsupported
            format (unless ``skip_unsupported``); a packtool output of packed rows, or a
            tokenize run not finished, is given or nested inside INPUT; a finished tokenize
            output whose shards disagree with its manifest (:func:`_tokenized_shards`); a
            Hugging Face DatasetDict (pass one split) or a dataset saved with an indices
            mapping; the same file is reached from two INPUT arguments (by path,
            symbolic link or hard link); a local path, or a folder or data file under INPUT,
            whose name is not valid UTF-8; a symbolic link (not hidden) leads nowhere
            or into a loop of links; a folder link leads to one of ``outputs``; a local INPUT
            that is no regular file or folder (a named pipe, ``<(zcat x)``'s ``/dev/fd/N``,
            a device), refused without opening it (pass a file).
    """
    files: list[InputFile] = []
    skipped: list[str] = []
    notes: list[str] = []
    keys: list = []
    origins: list[str] = []  # how each file was reached, for the message of a file given twice
    for given in inputs:
        fs, path, prefix = filesystem_of(given)
        if not prefix:
            _check_utf8_path(path, _location(given))
        place = _Place(fs, prefix, getattr(Location.parse(given), "query", ""))
        shown = place.show(path) if prefix else Path(_location(given))
        loc = Location.parse(given)
        try:
            info = fs.get_file_info(path)
            missing = loc.missing() if info.type == pafs.FileType.NotFound else None
        except (pa.ArrowException, OSError) as exc:
            raise_if_shortage(exc, str(shown))  # too many open files: not a bad path
            if isinstance(exc, PermissionError) and not prefix:
                raise InputError(f"{shown}: {DENIED}") from None
            told = loc.store_error(exc)
            if isinstance(told, StoreError):
                raise InputError(str(told)) from None
            raise InputError(f"{shown}: cannot be read ({first_line(exc)}); check the INPUT "
                             "path and the credentials") from None
        if missing is not None and not prefix and os.path.islink(path):
            raise InputError(f"{shown}: {place.dangling(path)}; fix the link or check the INPUT "
                             "path")
        if missing is not None:
            raise InputError(f"{shown}: {missing}; {loc.missing_fix('check the INPUT path')}")
        kind = special_file(path) if not prefix and info.type not in (
            pafs.FileType.File, pafs.FileType.Directory) else None
        if kind is not None:  # checked before any open: a named pipe's waits forever
            raise _refuse_special(shown, kind)
        if not prefix and not os.access(path, os.R_OK | (
                os.X_OK if info.type == pafs.FileType.Directory else 0)):
            raise InputError(f"{shown}: {DENIED}")  # as a file inside an INPUT folder
        if info.type == pafs.FileType.Directory:
            if prefix:
                def disp(rel, _p=path):
                    return place.show(f"{_p}/{rel}" if rel else _p)
            else:
                def disp(rel, _g=Path(_location(given))):
                    return _g / rel if rel else _g
            found = sorted(_walk(place, path, skipped, notes, skip_unsupported, disp, text,
                                 place.outputs(outputs)), key=lambda t: t[4])
            # a file with several names (symbolic or hard links) is read once: at its own path
            # if INPUT holds it, else at the name that sorts first
            found_keys = [place.key(t[0]) for t in found]
            first: dict = {}  # file key -> (reached through a link, relative path) read
            for (_, rel, _, _, _, linked, _), key in zip(found, found_keys):
                if key not in first or (linked, rel) < first[key]:
                    first[key] = (linked, rel)
            for (q, rel, fmt, qi, _, _, made), key in zip(found, found_keys):
                if first[key][1] != rel:
                    skipped.append(f"{disp(rel)} (another name of a file read at "
                                   f"{first[key][1]})")
                    continue
                where = place.show(q) if prefix else Path(_location(given)) / rel
                files.append(InputFile(where, rel, int(qi.size or 0), int(qi.mtime_ns or 0), fmt,
                                       made))
                keys.append(key)
                origins.append(f"inside INPUT {shown}")
        else:
            fmt = _format_of(_name(path), text)
            if fmt is None and _compressed_data(_name(path), text):
                raise InputError(f"{shown}: is compressed whole; decompress it first (zstd -d, "
                                 "gunzip, ...): Parquet and Arrow IPC compress inside the file")
            fix = content_fix(_head_of(shown)) if fmt is None else None
            if fix:
                raise InputError(f"{shown}: {fix}")
            if fmt is None and text:
                raise InputError(f"{shown}: unsupported text format; packtool tokenize reads "
                                 f"{TEXT_FORMATS}")
            if fmt is None:
                raise InputError(f"{shown}: unsupported input format; supported: "
                                 f"{SUPPORTED_FORMATS}; {_convert_hint([shown], 'it')}")
            files.append(InputFile(shown, _name(path), int(info.size or 0),
                                   int(info.mtime_ns or 0), fmt))
            keys.append(place.key(path))
            origins.append(f"as INPUT {shown}")
    seen: dict = {}
    for f, key, origin in zip(files, keys, origins):
        if key in seen:
            path, before = seen[key]
            also = f"{before} and {origin}" if path == str(f.path) else f"also as {path}"
            raise InputError(f"{f.path}: given twice ({also}); its documents would be "
                             f"{'tokenized' if text else 'packed'} twice: list each input once")
        seen[key] = (str(f.path), origin)
    return Discovery(files, skipped, notes)


def discover_inputs(inputs: Sequence[str | os.PathLike], *, skip_unsupported: bool = False,
                    outputs: Sequence[tuple] = ()) -> list[InputFile]:
    """The files of :func:`discover`; what was skipped is logged (one line, level INFO: the
    ``pack`` summary states it).

    Raises:
        InputError: as :func:`discover`.
    """
    d = discover(inputs, skip_unsupported=skip_unsupported, outputs=outputs)
    if d.skipped:
        log.info("%s", d.skipped_note())
    return d.files


class _RowGroup:
    __slots__ = ("num_rows",)

    def __init__(self, num_rows: int):
        self.num_rows = num_rows


class InputSource:
    """One opened input file, whatever its format: schema and row groups.

    A "row group" is a Parquet row group or an Arrow IPC record batch. ``num_rows``,
    ``num_row_groups`` and ``row_group(i).num_rows`` answer like a Parquet footer, for every
    format, so windowing code reads any format the same way.
    """

    def __init__(self, path: Path, fmt: str, schema: pa.Schema, row_group_rows: Sequence[int],
                 parquet: pq.ParquetFile | None = None, batches: list | None = None):
        self.path = path
        self.format = fmt
        self.schema_arrow = schema
        self.row_group_rows = tuple(int(n) for n in row_group_rows)
        self.num_rows = sum(self.row_group_rows)
        self.num_row_groups = len(self.row_group_rows)
        self._parquet = parquet
        self._batches = batches

    @property
    def metadata(self):
        """The Parquet footer (``pyarrow.parquet.FileMetaData``); for Arrow IPC, this object,
        which answers the row counts of a footer and ``num_columns == 0`` (no column chunk
        statistics)."""
        return self._parquet.metadata if self._parquet is not None else self

    @property
    def num_columns(self) -> int:
        """Column chunks with statistics: 0 outside Parquet (see :attr:`metadata`)."""
        return 0 if self._parquet is None else self._parquet.metadata.num_columns

    def row_group(self, i: int) -> _RowGroup:
        """Row group ``i``: its ``num_rows``."""
        return _RowGroup(self.row_group_rows[i])

    def value_bounds(self, row_group: int, column: str) -> tuple[int, int] | None:
        """``(min, max)`` of the values of list column ``column`` in row group ``row_group`` as
        the Parquet footer's statistics of that column chunk record them (written with the
        file, so a decoded value outside them was damaged after); None where there are none
        (Arrow IPC, a file written without statistics, a column of several leaves)."""
        if self._parquet is None:
            return None
        try:
            md = self._parquet.metadata
            leaf = [i for i in range(md.num_columns)
                    if md.schema.column(i).path.split(".")[0] == column]
            if len(leaf) != 1:
                return None
            st = md.row_group(row_group).column(leaf[0]).statistics
            if st is None or not st.has_min_max:
                return None
            lo, hi = st.min, st.max
        except (pa.ArrowException, OSError, ValueError, TypeError, IndexError):
            return None
        if isinstance(lo, bool) or not isinstance(lo, int) or not isinstance(hi, int):
            return None
        return int(lo), int(hi)

    def iter_batches(self, row_group: int, columns: list[str],
                     batch_rows: int = 8192) -> Iterator[pa.RecordBatch]:
        """Record batches of row group ``row_group`` holding ``columns``.

        Raises:
            InputError: the row group cannot be read (damaged or truncated file, a Parquet
                page that fails its CRC checksum; a store that failed:
                :func:`~packtool.formats.manifest.store_failure`).
        """
        try:
            if self._parquet is not None:  # lazily: a huge row group is never held whole
                yield from self._parquet.iter_batches(
                    batch_size=batch_rows, row_groups=[row_group], columns=columns,
                    use_threads=False)
            else:
                batch = self._batches[row_group].select(columns)
                for lo in range(0, batch.num_rows, batch_rows):
                    yield batch.slice(lo, batch_rows)
        except (pa.ArrowException, OSError, MemoryError) as exc:
            raise_if_shortage(exc, f"{self.path}: row group {row_group}")
            told = store_failure(self.path, exc)  # the store failed, not the file
            if told is not None:
                raise told from None
            if "checksum" in str(exc).lower():
                raise InputError(f"{self.path}: row group {row_group}: a page fails its CRC "
                                 f"checksum ({first_line(exc)}): the file was damaged after it "
                                 "was written; copy it again from its source or regenerate "
                                 "it") from None
            raise InputError(f"{self.path}: row group {row_group} cannot be read "
                             f"({first_line(exc)}); the file is damaged or truncated: "
                             "regenerate it") from None


def unreadable_error(shown, fs: pafs.FileSystem, path: str, kind: str,
                     exc: Exception) -> InputError:
    """The one line for an input file that does not open as ``kind`` (``Parquet``, ``Arrow
    IPC``): no permission; a store that cannot be reached, refuses the read or lost the bucket
    (:func:`~packtool.formats.manifest.store_failure`: the object is not blamed); gone since
    it was listed; empty (its size is 0); compressed whole, a Git LFS pointer or the other
    format under this one's name (:func:`~packtool.formats.sniff.content_fix`), or damaged
    (``pack``, ``compare`` and ``tokenize`` alike).

    Raises:
        ResourceError: the machine is short of memory or open files (not a bad file).
    """
    raise_if_shortage(exc, str(shown))  # a machine short of memory or files: not a bad file
    if isinstance(exc, PermissionError):
        return InputError(f"{shown}: {DENIED}")
    told = store_failure(shown, exc)
    if told is not None:
        return told
    try:  # what the file is, from its size and first bytes
        info = fs.get_file_info(path)
        head = b""
        if info.type != pafs.FileType.NotFound and info.size:
            with fs.open_input_stream(path) as fh:
                head = fh.read(32)
    except (pa.ArrowException, OSError) as again:  # it cannot be read at all: no size is known
        raise_if_shortage(again, str(shown))
        if isinstance(again, PermissionError):
            return InputError(f"{shown}: {DENIED}")
        return unreadable(Location.parse(shown), again)
    if info.type == pafs.FileType.NotFound:
        return InputError(f"{shown}: is gone (deleted or moved since INPUT was listed); check "
                          "the INPUT path and rerun")
    if not info.size:
        return InputError(f"{shown}: is empty (0 bytes); remove it or regenerate it")
    packed = compression_of(head)
    if packed:
        tool, command, _ = packed
        return InputError(f"{shown}: is a {tool}-compressed file, not {kind}; decompress it "
                          f"({command}): {kind} compresses inside the file")
    fix = content_fix(head, kind)
    if fix:
        return InputError(f"{shown}: {fix}")
    return InputError(f"{shown}: is not a readable {kind} file ({first_line(exc)}); remove it or "
                      "regenerate it")


def _open_arrow(shown, fs: pafs.FileSystem, path: str, local: bool) -> tuple[pa.Schema, list]:
    with fs.open_input_stream(path) as fh:
        head = fh.read(8)
    if head.startswith(_FEATHER_V1_MAGIC):
        raise InputError(f"{shown}: Feather v1 file; write it again as Feather v2 / Arrow IPC "
                         "(pyarrow.feather.write_feather) or Parquet")
    # local: zero-copy, batches point into a memory map; remote: read into memory
    source = pa.memory_map(path, "r") if local else fs.open_input_file(path)
    if head.startswith(IPC_FILE_MAGIC):
        reader = pa.ipc.open_file(source)
        return reader.schema, [reader.get_batch(i) for i in range(reader.num_record_batches)]
    data = source.read_buffer()  # local: a view of the memory map
    check_stream_end(shown, data)
    reader = pa.ipc.open_stream(data)
    return reader.schema, list(reader)


#: The end of an Arrow IPC stream: continuation 0xFFFFFFFF and a zero length, or (before Arrow
#: 0.15, the legacy format) a zero length alone.
_STREAM_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_STREAM_END_LEGACY = b"\x00\x00\x00\x00"


def check_stream_end(shown, data: pa.Buffer) -> None:
    """Refuse an Arrow IPC stream (the whole file in ``data``) that does not end with its
    end-of-stream marker right after its last message.

    A stream reader stops at the end of the file as it stops at the marker, so a stream still
    being written (its writer has flushed whole record batches, not closed it) or cut at a
    message boundary reads as complete, without its last batches. Its messages are walked (their
    headers only; the bodies are skipped) to find where the last one ends. Bytes after the
    marker (two streams joined with ``cat``) would not be read either.

    Raises:
        InputError: no marker after the last message, or bytes after it (file named, fix).
        pyarrow.ArrowException, OSError: a message is cut or damaged (the caller's message).
    """
    src = pa.BufferReader(data)
    messages = pa.ipc.MessageReader.open_stream(src)
    end = 0
    while True:
        try:
            messages.read_next_message()
        except StopIteration:
            break
        end = src.tell()
    tail = data.slice(end, min(data.size - end, 16)).to_pybytes()
    if tail in (_STREAM_END, _STREAM_END_LEGACY):
        return
    if tail.startswith((_STREAM_END, _STREAM_END_LEGACY)):
        extra = data.size - end - (len(_STREAM_END) if tail.startswith(_STREAM_END)
                                   else len(_STREAM_END_LEGACY))
        raise InputError(f"{shown}: holds {extra} bytes after the Arrow end-of-stream marker, "
                         "which no reader reads (two streams joined, or a file written over); "
                         "regenerate it")
    raise InputError(f"{shown} ends without the Arrow end-of-stream marker: it is still being "
                     "written or was cut; wait for its writer or regenerate it")


def open_input(path, column: str, fmt: str | None = None) -> InputSource:
    """Open one input file and check its token column.

    Args:
        path: the file: a local path or a URI (``s3://bucket/key``; a URI folded by
            ``pathlib.Path`` into ``s3:/bucket/key`` is read as the URI).
        column: the token column.
        fmt: ``parquet`` or ``arrow``; None decides from the file name (Parquet otherwise).

    Raises:
        InputError: the file is empty, truncated or not in its format (an Arrow IPC stream
            without its end-of-stream marker: :func:`check_stream_end`); it holds packed rows
            (:func:`check_not_packed`: a packtool output, or another tool's packed rows).
        SchemaError: the token column is missing or not an integer list.
    """
    fs, fpath, prefix = filesystem_of(path)
    shown = Location.parse(path).display if prefix else Path(_location(path))
    fmt = fmt or _format_of(_name(fpath)) or "parquet"
    if fmt == "arrow":
        try:
            schema, batches = _open_arrow(shown, fs, fpath, not prefix)
        except (pa.ArrowException, OSError) as exc:
            raise unreadable_error(shown, fs, fpath, "Arrow IPC", exc) from None
        src = InputSource(shown, fmt, schema, [b.num_rows for b in batches], batches=batches)
    else:
        try:
            # pages written with a CRC (Spark and parquet-java write one by default) are
            # checked as they are read: a damaged page is refused, never packed
            pf = pq.ParquetFile(fpath if not prefix else fs.open_input_file(fpath),
                                page_checksum_verification=True)
        except (pa.ArrowException, OSError) as exc:
            raise unreadable_error(shown, fs, fpath, "Parquet", exc) from None
        md = pf.metadata
        src = InputSource(shown, fmt, pf.schema_arrow,
                          [md.row_group(i).num_rows for i in range(md.num_row_groups)],
                          parquet=pf)
    check_not_packed(src.schema_arrow, shown, column)
    if not holds_no_documents(src.schema_arrow, column, src.num_rows):
        check_token_column(src.schema_arrow, column, str(shown))
    return src


def holds_no_documents(schema: pa.Schema, column: str, rows: int) -> bool:
    """True for a file of no rows that has the token column ``column``, whatever its type
    (pandas writes an empty column as null, or as double when pandas 3 infers a float): it
    holds no documents, an empty shard like any other, not a column of the wrong type. A file
    with rows is typed by :func:`check_token_column`."""
    return rows == 0 and column in schema.names


def _packed_key(schema: pa.Schema) -> str | None:
    """The first ``packtool.*`` key of ``schema``'s metadata (a packed shard's), or None."""
    return min((k.decode() for k in (schema.metadata or {})
                if k.startswith(_PACKED_META_PREFIX)), default=None)


def packed_marker(path) -> str | None:
    """The ``packtool.*`` schema metadata key that marks file ``path`` as a packed shard, or
    None for any other file (tokenized input, or a file that cannot be read: its reader names
    the fault).

    Args:
        path: a Parquet or Arrow IPC file, local path or URI.
    """
    try:
        schema, _ = input_schema(path)
    except PacktoolError:
        return None
    return _packed_key(schema)


def input_schema(path, fmt: str | None = None) -> tuple[pa.Schema, object]:
    """The Arrow schema of one input file, read cheaply (a Parquet footer, an Arrow IPC file's
    footer or a stream's first message), and the file's name for messages.

    Raises:
        InputError: the file is empty or not in its format.
    """
    fs, fpath, prefix = filesystem_of(path)
    shown = f"{prefix}{fpath}" if prefix else Path(path)
    fmt = fmt or _format_of(_name(fpath)) or "parquet"
    kind = "Arrow IPC" if fmt == "arrow" else "Parquet"
    try:
        if fmt == "parquet":
            with fs.open_input_file(fpath) as fh:
                return pq.read_schema(fh), shown
        with fs.open_input_file(fpath) as fh:
            head = fh.read(8)
            if head.startswith(_FEATHER_V1_MAGIC):
                return open_input(path, "", fmt).schema_arrow, shown  # refused there
            fh.seek(0)
            if head.startswith(IPC_FILE_MAGIC):
                return pa.ipc.open_file(fh).schema, shown
            return pa.ipc.open_stream(fh).schema, shown
    except (pa.ArrowException, OSError) as exc:
        raise unreadable_error(shown, fs, fpath, kind, exc) from None


def _refuse_out_of_bounds(path, column: str, rg: int, row: int, lengths: np.ndarray,
                          flat: np.ndarray, lo: int, hi: int,
                          bounds: tuple[int, int]) -> None:
    """Refuse a batch whose ids (``flat``, of min ``lo`` and max ``hi``) lie outside the footer
    statistics of its row group ``rg`` (``bounds``: the file was damaged after it was written).

    Raises:
        InputError: one line naming the file, the row group and row, the id and the fix.
    """
    if lo < bounds[0] or hi > bounds[1]:
        vi = int(np.argmax((flat < bounds[0]) | (flat > bounds[1])))
        what = "negative token id" if flat[vi] < 0 else "token id"
        raise InputError(f"{path}: row group {rg}, {row_ref(row + _row_of_value(lengths, vi))}: "
                         f"{what} {int(flat[vi])} lies outside {bounds[0]}..{bounds[1]}, the "
                         f"range the file's footer statistics record for {column!r} in this "
                         "row group: the file was damaged after it was written; copy it again "
                         "from its source (re-download it) or regenerate it")


def _labels_as_tokens(schema: pa.Schema, column: str, value: int) -> str:
    """What a negative id ``value`` in token column ``column`` says of it, for the end of the
    line refusing it: -100 is the ignore index of labels, and a name holding ``mask`` or
    ``label`` (:data:`MASK_LIKE`) says what the column is; either way the token column to pass
    instead (:func:`~packtool.formats.schema.pass_token_column`). Empty otherwise."""
    if value == IGNORE_INDEX:
        why = f"; -100 is the ignore index of labels: {column!r} looks like a labels column"
    elif MASK_LIKE.search(column):
        why = f"; {column!r} is named as a mask or labels column"
    else:
        return ""
    return f"{why}, not the token ids; {pass_token_column(schema, column)}"


def _row_of_value(lengths: np.ndarray, value_index: int) -> int:
    """Row holding flat value ``value_index``, given the rows' lengths."""
    return int(np.searchsorted(np.cumsum(lengths), value_index, side="right"))


def check_source_column(schema: pa.Schema, name: str, path) -> None:
    """Refuse a ``--source-column`` a file lacks, holds more than once, or holds in a type that
    is not one value per document (a string or an integer, plain or dictionary-encoded).

    Raises:
        SchemaError: names the file, the column and the fix.
    """
    if name not in schema.names:
        raise SchemaError(f"{path}: no column {name!r} for --source-column; available columns: "
                          f"{', '.join(schema.names) or '(none)'}{_partition_note(path, name)}")
    check_single_column(schema, name, path)
    typ = schema.field(name).type
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_integer(typ)
            or getattr(pa.types, "is_string_view", lambda t: False)(typ)):
        raise SchemaError(f"{path}: --source-column {name!r} has type "
                          f"{schema.field(name).type}; it must hold one string or integer per "
                          "document (e.g. source, lang, a URL's domain)")


def _partition_note(path, name: str) -> str:
    """What a refusal of ``--source-column NAME`` adds when the file's path holds a folder
    ``NAME=value`` (Hive partitioning, as Spark writes it): packtool reads columns from the
    files only, never partition keys from their paths, and how to write the key into them;
    empty otherwise."""
    parts = str(path).replace("\\", "/").split("/")
    at = next((i for i, p in enumerate(parts) if p.startswith(f"{name}=")), None)
    if at is None:
        return ""
    root = "/".join(parts[:at]) or "."
    return (f"; {name!r} is a partition key in the folder names ({parts[at]}/), and packtool "
            "reads columns from the files only, never keys from their paths: write it into "
            "the files first, e.g. python -c \"import pyarrow.dataset as ds, pyarrow.parquet "
            f"as pq; pq.write_table(ds.dataset({root!r}, partitioning='hive').to_table(), "
            f"{root.rstrip('/') + '.parquet'!r})\", then pack that file")


def check_token_columns_agree(files, column: str) -> None:
    """Refuse input files that name their token column differently (some ``input_ids``, some
    ``tokens``): ``--column`` names one column for every file, so the ``--column`` one file's
    refusal suggests would fail on the others. A file's name for it is ``column`` when it has
    it, else its one candidate (:func:`~packtool.formats.schema.token_column_candidates`);
    files with none or several candidates are left to :func:`open_input`'s message. Reads
    the schemas only.

    Raises:
        SchemaError: one line naming, for each name, the files that use it, and the fix.
        InputError: a file cannot be read (:func:`input_schema`).
    """
    by_name: dict[str, list[str]] = {}
    for f in files:
        schema, shown = input_schema(f.path, getattr(f, "format", None))
        if column in schema.names:
            name = column
        else:
            found = token_column_candidates(schema)
            if len(found) != 1:
                continue
            name = found[0]
        by_name.setdefault(name, []).append(str(shown))
    if len(by_name) < 2:
        return
    parts = []
    for name, shown in by_name.items():
        more = f" and {len(shown) - 1} more" if len(shown) > 1 else ""
        parts.append(f"{shown[0]}{more} hold{'s' if len(shown) == 1 else ''} {name!r}")
    raise SchemaError(f"the input files name their token column differently: "
                      f"{'; '.join(parts)}; --column names one column in every file: rename "
                      "the column in one set of files to match the other (pyarrow: "
                      "table.rename_columns), or pack each set on its own")


def _nulls(arr, packed: np.ndarray, path, row: int, fix) -> np.ndarray | None:
    """The one rule for a null in a column read beside the tokens (a mask, labels, the
    ``--source-column``): refused on a document that is packed (``packed``: bool[docs], True
    for a document with a token to pack), left alone on one that is not (empty, or every token
    masked: pack skips it, so nothing of it is used).

    Args:
        arr: the column's values of the batch's documents (``row``: the first one's file row).
        fix: ``fix(file_row)`` -> what the message says after the row (:func:`_null_fix`).

    Returns:
        bool[docs], True where the value is null (None when none is).

    Raises:
        SchemaError: a null on a packed document: names the file, the row and ``fix``'s words.
    """
    if not arr.null_count:
        return None
    null = arr.is_null().to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(null & packed)
    if bad.size:
        at = row + int(bad[0])
        raise SchemaError(f"{path}: {row_ref(at)}: {fix(at)}")
    return null


def _null_fix(path, row: int, name: str, what: str, fill: str) -> str:
    """What a message says of a null ``what`` (``--source-column 'src'``) of column ``name``
    at file row ``row`` of ``path``: ``fill`` (how to fill it before packing); but in a shard
    of a tokenize OUTPUT, whose shards cannot be edited (its manifest refuses a changed one),
    where the null comes from: the document of its text input without the key, to be filled
    there and tokenized again."""
    default = f"{what} is null; {fill}"
    try:
        loc = Location.parse(path)
        manifest = read_manifest(loc.parent)
    except (PacktoolError, OSError, ValueError, AttributeError):
        return default
    if manifest.kind != TOKENIZED_KIND or name not in (manifest.options.get("keep_columns")
                                                        or ()):
        return default
    where = "in its text input"
    m = re.fullmatch(r"part-(\d+)-(\d+)\.parquet", loc.name)
    per = manifest.options.get("rows_per_shard")
    if m and isinstance(per, int) and int(m[1]) < len(manifest.inputs):
        source = manifest.inputs[int(m[1])].path
        doc = int(m[2]) * per + row
        where = (f"here: {source}, document {doc + 1} (1-based; blank lines not counted)"
                 if _format_of(_name(source), text=True) == "jsonl" else
                 f"here: {source}, {row_ref(doc)}")
    return (f"{what} is null: tokenize --keep-column keeps a missing key or a null as null "
            f"({where}); fill it in the text input and tokenize it again ('packtool tokenize "
            "--overwrite' with the same options): a tokenized output's shards cannot be "
            "edited")


def _source_values(arr, path, row: int, name: str, packed: np.ndarray) -> np.ndarray:
    """The source values of a batch's documents: int64 for an integer column, str objects
    for a string column; None (in an array of objects) for a null on a document that is not
    packed (:func:`_nulls`).

    Raises:
        SchemaError: a null value of a packed document, or a uint64 value over 2**63 - 1 (file
            and row named).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    what = f"--source-column {name!r}"
    nulls = _nulls(arr, packed, path, row, lambda at: _null_fix(
        path, at, name, what, "fill it (e.g. 'unknown') before packing"))
    if pa.types.is_integer(arr.type):
        vals = (arr if nulls is None else arr.fill_null(0)).to_numpy(zero_copy_only=False)
        if vals.dtype == np.uint64 and vals.size and vals.max() > np.iinfo(np.int64).max:
            bad = int(np.argmax(vals > np.iinfo(np.int64).max))
            raise SchemaError(f"{path}: {row_ref(row + bad)}: {what} value "
                              f"{int(vals[bad])} does not fit int64 (the source ids' type); "
                              "cast the column to int64 or to string before packing")
        vals = vals.astype(np.int64)
        if nulls is None:
            return vals
        vals = vals.astype(object)
        vals[nulls] = None
        return vals
    return np.asarray(arr.cast(pa.large_string()).to_pylist(), dtype=object)


def iter_token_batches(path, column: str, batch_rows: int = 8192,
                       row_groups: Sequence[int] | None = None,
                       row_range: tuple[int, int] | None = None,
                       fmt: str | None = None, *, attention_mask: str | None = None,
                       labels: str | None = None, loss_mask: str | None = None,
                       source: str | None = None) -> Iterator[RawBatch]:
    """Stream one file's documents and mask columns as :class:`RawBatch` es, checked, as stored.

    ``row_groups`` (ascending indices) restricts the read to those row groups (Arrow IPC: record
    batches); ``row_range`` ``(start, stop)`` (file rows) to the rows in it, cutting row groups
    at record batches (rows of a row group before ``start`` are decoded and skipped). ``first_row``
    and error messages still count rows from the start of the file.

    ``attention_mask`` / ``labels`` / ``loss_mask``: mask columns as in
    :func:`resolve_mask_columns` (default None: not read). ``source``: a ``--source-column``
    read as each document's source value (:attr:`RawBatch.sources`;
    :func:`check_source_column`). Nothing is applied here:
    :func:`packtool.core.masks.prepare_documents` does that, for ``pack`` and ``compare`` alike
    (:func:`packtool.pipeline.read.iter_documents`).

    In a Parquet file written with statistics every id must lie inside the min/max its footer
    records for the row group (:meth:`InputSource.value_bounds`): one min and max of each
    batch's ids, compared with them. No id is held to a vocabulary size (a tokenize manifest's
    record or a schema metadata declaration does not bound a valid corpus's ids).

    Raises:
        InputError: the file cannot be read (the message names the row group); an id outside
            its row group's footer statistics (the file was damaged after it was written; file,
            row group and row named).
        SchemaError: a null document, a null token, a negative id or an id over int32; a mask
            row of another length than its document; a label that is neither -100 nor its
            token; an attention mask or loss mask value other than 0 or 1 (an attention mask
            numbering the documents of packed rows among them); an attention mask 0 between two
            1s of a row (not padding, which sits at a row's ends: several padded examples laid
            end to end); a source column missing or of
            another type; a null mask, labels or source value of a document that is packed (one
            with a token left after its attention mask; on any other document a null is left
            alone, its source None); the message names the file and the row.
    """
    src = open_input(path, column, fmt)
    path = src.path  # a URI folded by pathlib is named as the URI
    if holds_no_documents(src.schema_arrow, column, src.num_rows):
        return
    masks = resolve_mask_columns(src.schema_arrow, path, column, attention_mask, labels,
                                 loss_mask)
    columns = [column] + [c for c in (masks.attention_mask, masks.labels, *masks.loss_masks)
                          if c is not None]
    if source is not None:
        check_source_column(src.schema_arrow, source, path)
        if source not in columns:
            columns.append(source)
    # shape: (num_row_groups + 1,), first row of each row group
    rg_start = np.cumsum((0,) + src.row_group_rows)
    lo, hi = (0, int(rg_start[-1])) if row_range is None else row_range
    if row_groups is not None:
        groups = row_groups
    else:
        groups = [g for g in range(src.num_row_groups)
                  if row_range is None or (rg_start[g] < hi and rg_start[g + 1] > lo)]
    for rg in groups:
        row = int(rg_start[rg])
        bounds = src.value_bounds(rg, column)
        for batch in src.iter_batches(rg, columns, batch_rows):
            if row >= hi:
                break
            if row + batch.num_rows <= lo:
                row += batch.num_rows
                continue
            cut = row < lo or row + batch.num_rows > hi
            if cut:  # keep only the rows inside the range
                a = max(lo - row, 0)
                batch = batch.slice(a, min(hi - row, batch.num_rows) - a)
                row += a
            arr = batch.column(0)
            n = len(arr)
            if arr.null_count:
                bad = row + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                raise SchemaError(f"{path}: {row_ref(bad)}: {column!r} is null; drop or fill null "
                                  "documents before packing")
            lengths, values = list_parts(arr)
            if values.null_count:
                vi = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
                where = row_ref(row + _row_of_value(lengths, vi))
                raise SchemaError(f"{path}: {where}: a token id is null; fix the tokenizer output")
            flat = numpy_values(values)
            if flat.size:
                vmin = vmax = None
                if bounds is not None:  # one min and max of the batch
                    vmin, vmax = int(flat.min()), int(flat.max())
                    if vmin < bounds[0] or vmax > bounds[1]:
                        _refuse_out_of_bounds(path, column, rg, row, lengths, flat, vmin, vmax,
                                              bounds)
                # a pass over the ids only where their type can hold a value out of range
                if flat.dtype.kind == "i" and (flat.min() if vmin is None else vmin) < 0:
                    vi = int(np.argmax(flat < 0))
                    where = row_ref(row + _row_of_value(lengths, vi))
                    raise SchemaError(f"{path}: {where}: negative token id {int(flat[vi])}; "
                                      "token ids must be >= 0"
                                      + _labels_as_tokens(src.schema_arrow, column,
                                                          int(flat[vi])))
                if np.iinfo(flat.dtype).max > INT32_MAX and (flat.max() if vmax is None
                                                              else vmax) > INT32_MAX:
                    vi = int(np.argmax(flat > INT32_MAX))
                    where = row_ref(row + _row_of_value(lengths, vi))
                    raise SchemaError(f"{path}: {where}: token id "
                                      f"{int(flat[vi])} does not fit int32; packed input_ids are "
                                      "int32 (vocabularies up to 2**31 - 1)")
            # a cut batch's values are a view of the whole batch's: own them, so whoever keeps
            # the tokens (a window task holds them) does not keep the rest of the batch
            tokens = flat.astype(np.int32, copy=cut)
            lab = keep = None
            # which documents are packed (a token left after the attention mask) decides where
            # a null of the other columns is refused (:func:`_nulls`): the attention mask is
            # read first, and its faults told after those of labels and loss masks, as before
            keep_fault = None
            if masks.attention_mask is not None:
                try:
                    keep = _mask_values(batch.column(masks.attention_mask), lengths, path, row,
                                        masks.attention_mask, "--attention-mask-column",
                                        lengths > 0)
                except SchemaError as exc:
                    keep_fault = exc
            # shape: (docs,), True for a document with a token to pack (after the attention
            # mask only where a null needs it: a pass over the tokens)
            packed = lengths > 0
            nulls = any(batch.column(c).null_count for c in (masks.labels, *masks.loss_masks,
                                                              source) if c is not None)
            if nulls and keep is not None and keep.size:
                packed = np.bincount(np.repeat(np.arange(n), lengths), weights=keep != 0,
                                     minlength=n) > 0
            if masks.labels is not None:
                lab = _mask_values(batch.column(masks.labels), lengths, path, row,
                                   masks.labels, "--labels-column", packed, IGNORE_INDEX)
                bad = (lab != IGNORE_INDEX) & (lab != tokens)
                if bad.any():
                    vi = int(np.argmax(bad))
                    raise SchemaError(
                        f"{path}: {row_ref(row + _row_of_value(lengths, vi))}: label "
                        f"{int(lab[vi])} is neither -100 nor its token {int(tokens[vi])}; the "
                        f"{masks.labels!r} column is read as unshifted labels (input_ids or "
                        "-100): fix it or pass --labels-column none")
            loss = []
            for name in masks.loss_masks:
                m = _mask_values(batch.column(name), lengths, path, row, name,
                                 "--loss-mask-column", packed)
                bad = (m != 0) & (m != 1)
                if bad.any():
                    vi = int(np.argmax(bad))
                    raise SchemaError(
                        f"{path}: {row_ref(row + _row_of_value(lengths, vi))}: {name!r} holds "
                        f"{int(m[vi])}; a loss mask holds 1 on the tokens to learn and 0 "
                        "elsewhere: fix it or pass --loss-mask-column none")
                loss.append(m)
            if keep_fault is not None:
                raise keep_fault
            if keep is not None:
                name = masks.attention_mask
                bad = (keep != 0) & (keep != 1)
                if bad.any():
                    vi = int(np.argmax(bad))
                    where = row_ref(row + _row_of_value(lengths, vi))
                    # LLaMA-Factory's neat_packing numbers a packed row's documents 1, 2, ...
                    numbered = (" (values 1, 2, ... number the documents of a packed row: "
                                "packing it again would join them; pack the unpacked documents "
                                "instead)" if keep[vi] > 1 else "")
                    raise SchemaError(
                        f"{path}: {where}: {name!r} holds {int(keep[vi])}; an attention mask "
                        f"holds 1 on real tokens and 0 on padding{numbered}: fix it or pass "
                        "--attention-mask-column none")
                # core.masks loads numba: only where an attention mask is read (stats and
                # verify of a packed output never load it)
                from packtool.core.masks import inner_mask_zeros

                inner = inner_mask_zeros(lengths, keep)
                if inner.size:
                    _refuse_inner_zeros(path, row, name, lengths, keep, int(inner[0]))
            srcs = None if source is None else _source_values(batch.column(source), path, row,
                                                                source, packed)
            yield RawBatch(row, lengths, tokens, keep, lab, tuple(loss), srcs)
            row += n


def _refuse_inner_zeros(path, row: int, name: str, lengths: np.ndarray, keep: np.ndarray,
                        vi: int) -> None:
    """Refuse the row holding ``keep[vi]``, an attention-mask 0 between tokens marked 1
    (:func:`packtool.core.masks.inner_mask_zeros`): padding sits at a row's ends, so these
    zeros are not padding, and removing them would join the tokens before and after into one
    document.

    Args:
        path: the file; row: file row of the batch's first document.
        lengths: int64[docs] of the batch; keep: int[T] the attention mask.
        vi: flat index in ``keep`` of the first such zero.

    Raises:
        SchemaError: one line naming the file, the row, the run of zeros and the fix.
    """
    r = _row_of_value(lengths, vi)
    first = vi - (int(lengths[:r].sum()))
    nonzero = np.flatnonzero(keep[vi:vi + int(lengths[r]) - first])  # the run ends before one
    last = first + int(nonzero[0]) - 1
    span = f"token {first}" if last == first else f"tokens {first}..{last}"
    raise SchemaError(
        f"{path}: {row_ref(row + r)}: {name!r} is 0 on {span} (0-based) of its "
        f"{int(lengths[r])}, between tokens it marks 1; padding sits at a row's ends, so these "
        "are not padding (likely several padded examples laid end to end in one row, or tokens "
        "masked inside a document) and removing them would join what comes before and after "
        "into one document: split the examples into one row each, or pass "
        "--attention-mask-column none and remove the tokens yourself")


def _mask_values(arr: pa.Array, lengths: np.ndarray, path, row: int, name: str,
                 option: str, packed: np.ndarray, neutral: int = 0) -> np.ndarray:
    """Values of a per-token mask column, checked to be shaped like the tokens: int64[T],
    T = sum(lengths).

    A null row is refused on a document that is packed (``packed``, :func:`_nulls`); on one
    that is not, it stands for ``neutral`` on each of the document's tokens (-100 for labels, 0
    for a loss mask: the document is not packed, so they are never used).

    Raises:
        SchemaError: a null row of a packed document; a row of another length than its
            document; a null value inside a row.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    nulls = _nulls(arr, packed, path, row, lambda at: _null_fix(
        path, at, name, repr(name), f"fill it or pass {option} none"))
    if nulls is not None and not pa.types.is_fixed_size_list(arr.type):
        arr = arr.fill_null(pa.scalar([], arr.type))  # no entry, whatever its offsets said
    mlen, values = list_parts(arr)
    live = np.ones(len(lengths), dtype=bool) if nulls is None else ~nulls  # rows read
    off = live & (mlen != lengths)
    if off.any():
        bad = int(np.argmax(off))
        raise SchemaError(f"{path}: {row_ref(row + bad)}: {name!r} has {int(mlen[bad])} entries "
                          f"for {int(lengths[bad])} tokens; a mask column must be shaped like the "
                          "tokens (or name another column)")
    if values.null_count:
        vnull = values.is_null().to_numpy(zero_copy_only=False)
        if nulls is not None:
            vnull &= np.repeat(live, mlen)
        if vnull.any():
            vi = int(np.argmax(vnull))
            where = row_ref(row + _row_of_value(mlen, vi))
            raise SchemaError(f"{path}: {where}: a {name!r} value is null; fill it")
        values = values.fill_null(0)
    vals = numpy_values(values).astype(np.int64, copy=False)
    if nulls is None:
        return vals
    out = np.full(int(lengths.sum()), neutral, dtype=np.int64)
    out[np.repeat(live, lengths)] = vals[np.repeat(live, mlen)]
    return out
