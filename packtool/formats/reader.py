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
over int32) and errors name the file, the row and the fix.

Discovery (:func:`discover`) lists directories through :mod:`pyarrow.fs`, one level at a time so
that it can prune and report: hidden (``.``) and ``_``-prefixed entries (Spark/Hadoop
``_temporary``, ``.ipynb_checkpoints``, ...) are skipped at every level, symbolic links are
followed with a guard against loops, and a packtool output (its manifest or
in-progress marker, or ``packtool.*`` schema metadata in a shard) is refused, so packed rows are
never read back as documents.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from packtool.core.holdout import drop_documents
from packtool.core.masks import BoundaryCounts, add_boundary_tokens, drop_masked_tokens
from packtool.errors import InputError, SchemaError, row_ref
from packtool.formats.manifest import (FILE_URI, IN_PROGRESS_NAME, MANIFEST_META_KEY,
                                       MANIFEST_NAME)
from packtool.formats.schema import check_token_column, is_integer_list, is_list_layout
from packtool.types import IGNORE_INDEX, INT32_MAX

__all__ = ["InputFile", "TokenBatch", "Discovery", "InputSource", "MaskColumns", "discover",
           "discover_inputs", "open_input", "iter_token_batches", "list_parts",
           "resolve_mask_columns", "reads_labels", "filesystem_of", "is_remote",
           "SUPPORTED_FORMATS", "AUTO", "TOKENIZED_KIND"]

log = logging.getLogger(__name__)

#: One phrase naming what INPUT may be (used in every "unsupported" message).
SUPPORTED_FORMATS = ("Parquet (*.parquet), Arrow IPC/Feather v2 (*.arrow, *.feather, *.ipc, "
                     "*.arrows) and Hugging Face save_to_disk folders")

_PARQUET_SUFFIXES = (".parquet",)
_IPC_SUFFIXES = (".arrow", ".feather", ".ipc", ".arrows")
#: JSON Lines, read as text input only (``packtool tokenize``)
_JSONL_SUFFIXES = tuple(f"{s}{z}" for s in (".jsonl", ".ndjson")
                        for z in ("", ".gz", ".zst", ".bz2"))
#: the ``kind`` a ``packtool tokenize`` output's manifest records: its shards are documents
TOKENIZED_KIND = "tokenized"
#: Files that mark a directory as a packtool output (manifest written last, marker first).
_PACKED_MARKERS = (MANIFEST_NAME, IN_PROGRESS_NAME)
_PACKED_META_PREFIX = b"packtool."
_HF_STATE = "state.json"
_HF_INFO = "dataset_info.json"
_HF_DICT = "dataset_dict.json"
_IPC_FILE_MAGIC = b"ARROW1"
#: a URI scheme (two characters or more, so a Windows drive letter is not one)
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
#: what ``pathlib.Path`` makes of a URI: ``s3:/bucket/key``
_FOLDED_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")
_FEATHER_V1_MAGIC = b"FEA1"


@dataclass(frozen=True)
class InputFile:
    """One input shard: its path, path relative to the INPUT it was found under, size in bytes,
    modification time (ns) and format (``parquet`` or ``arrow``)."""

    path: Path
    rel: str
    bytes: int
    mtime_ns: int
    format: str = "parquet"


@dataclass(frozen=True)
class TokenBatch:
    """Documents ``first_row .. first_row + len(lengths) - 1`` of one file.

    With an attention-mask column, its 0 tokens are already removed (``masked_tokens`` counts
    them); with a labels column, ``targets`` flags the tokens whose input label is not -100.
    """

    first_row: int  #: row index in the file of the first document
    lengths: np.ndarray  #: int64[docs], tokens per document
    tokens: np.ndarray  #: int32[sum(lengths)], the documents' tokens back to back
    #: uint8[sum(lengths)], 0 = the input label was -100; None: no labels column
    targets: np.ndarray | None = None
    masked_tokens: int = 0  #: tokens removed because their attention mask was 0
    #: BOS/EOS added or found already there (--prepend-bos/--append-eos)
    boundary: BoundaryCounts = BoundaryCounts()
    #: (documents, tokens) left out by ``keep_rows`` (the other part of a --holdout split);
    #: such a document has length 0 here
    other_split: tuple[int, int] = (0, 0)

    def mask_counts(self) -> dict:
        """The batch's mask figures under their :class:`packtool.stats.PackStats` names.

        A document left out by ``keep_rows`` has length 0, so the plan counts it as empty:
        ``docs_empty`` is corrected here by as many (a count to add, never a count alone)."""
        b = self.boundary
        return {"tokens_attention_masked": self.masked_tokens,
                "tokens_label_masked": 0 if self.targets is None
                else int(self.targets.size - np.count_nonzero(self.targets)),
                "docs_bos_added": b.bos_added, "docs_bos_present": b.bos_present,
                "docs_eos_added": b.eos_added, "docs_eos_present": b.eos_present,
                "docs_other_split": self.other_split[0],
                "tokens_other_split": self.other_split[1],
                "docs_empty": -self.other_split[0]}


#: Mask column option value: use the column of the default name when the file has it.
AUTO = "auto"
ATTENTION_MASK_COLUMN = "attention_mask"
LABELS_COLUMN = "labels"


@dataclass(frozen=True)
class MaskColumns:
    """The mask columns used for one file (None: not used)."""

    attention_mask: str | None = None
    labels: str | None = None


def resolve_mask_columns(schema: pa.Schema, path, column: str, attention_mask: str | None = AUTO,
                         labels: str | None = AUTO) -> MaskColumns:
    """Decide which mask columns of a file are read.

    Args:
        schema: the file's Arrow schema.
        path: the file (for messages).
        column: the token column.
        attention_mask, labels: a column name, :data:`AUTO` (use ``attention_mask`` /
            ``labels`` when the file has such a column) or None (off). The attention mask may be
            a list of integers or booleans; labels a list of integers. Under :data:`AUTO` a
            present column of another type is refused, never skipped in silence.

    Raises:
        SchemaError: a named column is missing, a used column has another type, or a named
            column is the token column.
    """
    def usable(typ, allow_bool) -> bool:
        if is_integer_list(typ):
            return True
        return allow_bool and is_list_layout(typ) and pa.types.is_boolean(typ.value_type)

    def pick(name, default, option, allow_bool):
        if name is None:
            return None
        if name == AUTO:
            if default not in schema.names or default == column:
                return None
            name = default  # present: used, or refused below; never skipped in silence
        elif name == column:
            raise SchemaError(f"{path}: {option} {name!r} is the token column; name the mask "
                              "column")
        if name not in schema.names:
            raise SchemaError(f"{path}: no column {name!r} for {option}; available columns: "
                              f"{', '.join(schema.names)}; pass {option} none to pack without it")
        if not usable(schema.field(name).type, allow_bool):
            kind = "integers or booleans" if allow_bool else "integers"
            raise SchemaError(f"{path}: {option} column {name!r} has type "
                              f"{schema.field(name).type}, expected a list of {kind}; pass "
                              f"{option} none to pack without it")
        return name

    return MaskColumns(pick(attention_mask, ATTENTION_MASK_COLUMN, "--attention-mask-column", True),
                       pick(labels, LABELS_COLUMN, "--labels-column", False))


def reads_labels(files, column: str, labels: str | None) -> bool:
    """True when a labels column will be read from at least one of ``files`` (footers only).

    Decided before reading, so every window of a pack stores the same columns.

    Raises:
        InputError, SchemaError: as :func:`open_input` and :func:`resolve_mask_columns`.
    """
    if labels is None:
        return False
    found = False
    for f in files:
        src = open_input(f.path, column)
        found |= resolve_mask_columns(src.schema_arrow, src.path, column, None,
                                      labels).labels is not None
    return found


@dataclass(frozen=True)
class Discovery:
    """What :func:`discover` found: the files in global document order and what it skipped."""

    files: list[InputFile]
    #: paths skipped on purpose (hidden/``_`` entries, link loops), as given or found
    skipped: list[str] = field(default_factory=list)

    def skipped_note(self, limit: int = 3) -> str:
        """One line naming the skipped entries (empty when nothing was skipped)."""
        if not self.skipped:
            return ""
        names = ", ".join(self.skipped[:limit]) + (", ..." if len(self.skipped) > limit else "")
        return (f"skipped {len(self.skipped)} hidden, '_'-prefixed or looping entr"
                f"{'y' if len(self.skipped) == 1 else 'ies'}: {names}")


def _format_of(name: str, text: bool = False) -> str | None:
    low = name.lower()
    if low.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    if low.endswith(_IPC_SUFFIXES):
        return "arrow"
    if text and low.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    return None


def is_remote(location) -> bool:
    """True for a URI with a scheme other than ``file`` (``s3://bucket/key``, ``gs://...``)."""
    return _URI.match(str(location)) is not None and not str(location).startswith("file:")


def _location(given) -> str:
    """``given`` as a string, with a URI's ``//`` restored where ``pathlib`` folded it; a
    ``file:`` URI (``file:///abs/path``, or ``file:/abs/path`` as pathlib folds it) becomes its
    local path."""
    s = os.fspath(given) if not isinstance(given, str) else given
    f = FILE_URI.match(s)
    if f:
        return s[f.end():]
    m = _FOLDED_URI.match(s)
    return f"{m.group(1)}://{s[m.end():]}" if m else s


def filesystem_of(location) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, path inside it, URI prefix) of a local path or a URI.

    A URI goes through :func:`pyarrow.fs.FileSystem.from_uri` (S3, GCS, HDFS, ... as pyarrow
    provides them; S3 reads ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ... from the
    environment, or ``?endpoint_override=...`` from the URI). The prefix turns a path inside the
    filesystem back into a URI (``"s3://"``; ``""`` for local paths).

    Raises:
        InputError: the URI cannot be opened (unknown scheme, no credentials, ...).
    """
    loc = _location(location)
    if not is_remote(loc):
        return pafs.LocalFileSystem(), os.path.abspath(loc), ""
    try:
        fs, path = pafs.FileSystem.from_uri(loc)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{loc}: cannot open this location ({exc}); check the URI and the "
                         "credentials in the environment") from None
    return fs, path.rstrip("/"), loc.split("://", 1)[0] + "://"


class _Place:
    """A filesystem, how to name its paths in messages and how to tell two names of one file."""

    def __init__(self, fs: pafs.FileSystem, prefix: str):
        self.fs, self.prefix = fs, prefix

    def show(self, path: str):
        return Path(path) if not self.prefix else f"{self.prefix}{path}"

    def key(self, path: str):
        if self.prefix:  # object stores: no links, one name per object
            return (self.prefix, path)
        st = os.stat(path)  # follows links: a link and its target, or two hard links, share a key
        return st.st_dev, st.st_ino


def _packed_marker(fs: pafs.FileSystem, names: set[str], directory: str) -> str | None:
    """Name of the file that marks ``directory`` as a packtool output, or None. A finished
    ``packtool tokenize`` output (manifest of kind :data:`TOKENIZED_KIND`) holds documents and is
    not marked; its manifest is the empty string's stand-in ``""`` (nothing to refuse, nothing
    to report as skipped)."""
    if _PACKED_MARKERS[1] in names:
        return _PACKED_MARKERS[1]
    if _PACKED_MARKERS[0] in names:
        try:
            with fs.open_input_file(f"{directory}/{_PACKED_MARKERS[0]}") as fh:
                meta = pq.read_schema(fh).metadata or {}
        except (OSError, ValueError, pa.ArrowException):
            return None
        if MANIFEST_META_KEY in meta:
            try:
                kind = json.loads(meta[MANIFEST_META_KEY]).get("kind")
            except (ValueError, AttributeError):
                kind = None
            return "" if kind == TOKENIZED_KIND else _PACKED_MARKERS[0]
    return None


def _refuse_packed(where: Path | str, marker: str) -> None:
    raise InputError(f"{where}: is a packtool output ({marker}), not tokenized documents; point "
                     "INPUT at the raw tokenized data (to inspect packed rows use packtool stats)")


def _hf_files(fs: pafs.FileSystem, directory: str, shown) -> list[str]:
    """Data file names of a ``save_to_disk`` folder, in its own order (``state.json``)."""
    try:
        with fs.open_input_stream(f"{directory}/{_HF_STATE}") as fh:
            state = json.loads(fh.read())
        names = [d["filename"] for d in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        raise InputError(f"{shown}/{_HF_STATE}: not a readable Hugging Face dataset state "
                         f"({exc}); save the dataset again with save_to_disk") from None
    if not names:
        raise InputError(f"{shown}: Hugging Face dataset with no data files; save it again")
    return names


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _walk(place: _Place, root: str, skipped: list[str],
          text: bool = False) -> list[tuple[str, str, str, object]]:
    """(path, relative path, format, FileInfo) of every data file under ``root`` (unsorted);
    ``text``: JSON Lines files too."""
    fs = place.fs
    found: list[tuple[str, str, str, object]] = []
    other: list[str] = []
    # depth-first; each entry carries the keys of its ancestors: a link back to one of them is
    # a loop and is skipped
    stack = [(root, "", (place.key(root),))]
    while stack:
        dpath, drel, ancestors = stack.pop()
        infos = fs.get_file_info(pafs.FileSelector(dpath, recursive=False))
        by_name = {_name(i.path): i for i in infos}
        marker = _packed_marker(fs, set(by_name), dpath)
        if marker:
            _refuse_packed(place.show(dpath), marker)
        if marker == "":  # a tokenize output: its manifest is not a skipped file
            by_name.pop(MANIFEST_NAME, None)
            infos = [i for i in infos if _name(i.path) != MANIFEST_NAME]
        if _HF_DICT in by_name and _HF_STATE not in by_name:
            splits = sorted(n for n, i in by_name.items() if i.type == pafs.FileType.Directory
                            and not n.startswith((".", "_")))
            example = "train" if "train" in splits or not splits else splits[0]
            raise InputError(f"{place.show(dpath)}: Hugging Face DatasetDict with splits "
                             f"{', '.join(splits) or '(none)'}; pass one split folder as INPUT, "
                             f"e.g. {place.show(f'{dpath}/{example}')}")
        if _HF_STATE in by_name and _HF_INFO in by_name:
            for name in _hf_files(fs, dpath, place.show(dpath)):
                info = by_name.get(name)
                if info is None or info.type != pafs.FileType.File:
                    raise InputError(f"{place.show(f'{dpath}/{name}')}: listed in "
                                     f"{_HF_STATE} but missing; save the dataset again")
                found.append((info.path, f"{drel}{name}", "arrow", info))
            continue
        for info in sorted(infos, key=lambda i: i.path):
            name = _name(info.path)
            if name.startswith((".", "_")):
                skipped.append(str(place.show(info.path)))
                continue
            if info.type == pafs.FileType.Directory:
                key = place.key(info.path)
                if key in ancestors:
                    skipped.append(f"{place.show(info.path)} (link loop)")
                    continue
                stack.append((info.path, f"{drel}{name}/", ancestors + (key,)))
            elif info.type == pafs.FileType.File:
                fmt = _format_of(name, text)
                if fmt is None:
                    other.append(name)
                else:
                    found.append((info.path, f"{drel}{name}", fmt, info))
    if not found:
        seen = f" (found {', '.join(sorted(other)[:3])}{', ...' if len(other) > 3 else ''})" \
            if other else ""
        if text:
            raise InputError(f"{place.show(root)}: directory holds no *.parquet, *.jsonl, Arrow "
                             f"IPC file or Hugging Face dataset{seen}; point INPUT at the text")
        raise InputError(f"{place.show(root)}: directory holds no *.parquet, Arrow IPC file or "
                         f"Hugging Face dataset{seen}; point INPUT at the tokenized shards "
                         f"(supported: {SUPPORTED_FORMATS})")
    return found


def discover(inputs: Sequence[str | os.PathLike], *, text: bool = False) -> Discovery:
    """Expand INPUT paths or URIs into data files, in global document order.

    A file is taken as is (its format from its name). A directory (or an object-store prefix)
    is searched recursively; files are taken in sorted relative-path order, a ``save_to_disk``
    folder in the order of its ``state.json``. The resulting order defines the global document
    index (file order, then row order). Local files keep :class:`~pathlib.Path` paths; files in
    an object store are named by URI (``s3://bucket/key``). ``text``: the inputs of
    ``packtool tokenize``: JSON Lines files (format ``jsonl``) are taken too.

    Returns:
        :class:`Discovery` (files, and the entries skipped on purpose).

    Raises:
        InputError: a path does not exist; a file or directory holds no supported format (the
            message names the supported formats); a packtool output is given or nested inside
            INPUT; a Hugging Face DatasetDict (pass one split); the same file is reached twice
            (by path, symbolic link or hard link).
    """
    files: list[InputFile] = []
    skipped: list[str] = []
    keys: list = []
    for given in inputs:
        fs, path, prefix = filesystem_of(given)
        place = _Place(fs, prefix)
        shown = place.show(path) if prefix else Path(_location(given))
        try:
            info = fs.get_file_info(path)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{shown}: cannot be read ({exc}); check the INPUT path and the "
                             "credentials") from None
        if info.type == pafs.FileType.NotFound:
            raise InputError(f"{shown}: no such file or directory; check the INPUT path")
        if info.type == pafs.FileType.Directory:
            found = sorted(_walk(place, path, skipped, text), key=lambda t: t[1])
            for q, rel, fmt, qi in found:
                where = place.show(q) if prefix else Path(_location(given)) / rel
                files.append(InputFile(where, rel, int(qi.size or 0), int(qi.mtime_ns or 0), fmt))
                keys.append(place.key(q))
        else:
            fmt = _format_of(_name(path), text)
            if fmt is None and text:
                raise InputError(f"{shown}: unsupported text format; packtool tokenize reads "
                                 "Parquet, Arrow IPC and JSON Lines (*.jsonl)")
            if fmt is None:
                raise InputError(f"{shown}: unsupported input format; supported: "
                                 f"{SUPPORTED_FORMATS} (convert other data, e.g. JSONL, to "
                                 "Parquet first)")
            files.append(InputFile(shown, _name(path), int(info.size or 0),
                                   int(info.mtime_ns or 0), fmt))
            keys.append(place.key(path))
    seen: dict = {}
    for f, key in zip(files, keys):
        if key in seen:
            raise InputError(f"{f.path}: given twice (also as {seen[key]}); its documents would "
                             "be packed twice: list each input once")
        seen[key] = str(f.path)
    return Discovery(files, skipped)


def discover_inputs(inputs: Sequence[str | os.PathLike]) -> list[InputFile]:
    """The files of :func:`discover`; what was skipped is logged (one line, level INFO: the
    ``pack`` summary states it).

    Raises:
        InputError: as :func:`discover`.
    """
    d = discover(inputs)
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

    def iter_batches(self, row_group: int, columns: list[str],
                     batch_rows: int = 8192) -> Iterator[pa.RecordBatch]:
        """Record batches of row group ``row_group`` holding ``columns``.

        Raises:
            InputError: the row group cannot be read (damaged or truncated file).
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
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{self.path}: row group {row_group} cannot be read ({exc}); the "
                             "file is damaged or truncated: regenerate it") from None


def _unreadable(shown, fs: pafs.FileSystem, path: str, kind: str, exc: Exception) -> InputError:
    try:
        size = fs.get_file_info(path).size or 0
    except (pa.ArrowException, OSError):
        size = 0
    what = "is empty (0 bytes)" if size == 0 else f"is not a readable {kind} file ({exc})"
    return InputError(f"{shown}: {what}; remove it or regenerate it")


def _open_arrow(shown, fs: pafs.FileSystem, path: str, local: bool) -> tuple[pa.Schema, list]:
    with fs.open_input_stream(path) as fh:
        head = fh.read(8)
    if head.startswith(_FEATHER_V1_MAGIC):
        raise InputError(f"{shown}: Feather v1 file; write it again as Feather v2 / Arrow IPC "
                         "(pyarrow.feather.write_feather) or Parquet")
    # local: zero-copy, batches point into a memory map; remote: read into memory
    source = pa.memory_map(path, "r") if local else fs.open_input_file(path)
    if head.startswith(_IPC_FILE_MAGIC):
        reader = pa.ipc.open_file(source)
        return reader.schema, [reader.get_batch(i) for i in range(reader.num_record_batches)]
    reader = pa.ipc.open_stream(source)
    return reader.schema, list(reader)


def open_input(path, column: str, fmt: str | None = None) -> InputSource:
    """Open one input file and check its token column.

    Args:
        path: the file: a local path or a URI (``s3://bucket/key``; a URI folded by
            ``pathlib.Path`` into ``s3:/bucket/key`` is read as the URI).
        column: the token column.
        fmt: ``parquet`` or ``arrow``; None decides from the file name (Parquet otherwise).

    Raises:
        InputError: the file is empty, truncated or not in its format; it is a packtool output
            (``packtool.*`` schema metadata).
        SchemaError: the token column is missing or not an integer list.
    """
    fs, fpath, prefix = filesystem_of(path)
    shown = f"{prefix}{fpath}" if prefix else Path(path)
    fmt = fmt or _format_of(_name(fpath)) or "parquet"
    if fmt == "arrow":
        try:
            schema, batches = _open_arrow(shown, fs, fpath, not prefix)
        except (pa.ArrowException, OSError) as exc:
            raise _unreadable(shown, fs, fpath, "Arrow IPC", exc) from None
        src = InputSource(shown, fmt, schema, [b.num_rows for b in batches], batches=batches)
    else:
        try:
            pf = pq.ParquetFile(fpath if not prefix else fs.open_input_file(fpath))
        except (pa.ArrowException, OSError) as exc:
            raise _unreadable(shown, fs, fpath, "Parquet", exc) from None
        md = pf.metadata
        src = InputSource(shown, fmt, pf.schema_arrow,
                          [md.row_group(i).num_rows for i in range(md.num_row_groups)],
                          parquet=pf)
    meta = src.schema_arrow.metadata or {}
    packed = sorted(k.decode() for k in meta if k.startswith(_PACKED_META_PREFIX))
    if packed:
        _refuse_packed(shown, f"schema metadata {packed[0]}")
    check_token_column(src.schema_arrow, column, str(shown))
    return src


def list_parts(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Row lengths and values of an integer list array of any layout, in row order.

    Args:
        arr: ``list``, ``large_list``, ``fixed_size_list``, ``list_view`` or
            ``large_list_view`` array without null rows (slices allowed).

    Returns:
        (lengths int64[rows], values: the rows' items back to back, ``sum(lengths)`` long).
        List views (whose rows may overlap or come in any order in the child array) are
        gathered into row order.
    """
    # ``flatten`` honours slices and, for list views, gathers each row's view in row order
    # (a cast of a list view to a list is avoided: pyarrow 26 builds invalid offsets for views
    # that are out of order)
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    return lengths, arr.flatten()


def _row_of_value(lengths: np.ndarray, value_index: int) -> int:
    """Row holding flat value ``value_index``, given the rows' lengths."""
    return int(np.searchsorted(np.cumsum(lengths), value_index, side="right"))


def iter_token_batches(path, column: str, batch_rows: int = 8192,
                       row_groups: Sequence[int] | None = None,
                       row_range: tuple[int, int] | None = None,
                       fmt: str | None = None, *, attention_mask: str | None = None,
                       labels: str | None = None, bos: int | None = None,
                       eos: int | None = None,
                       keep_rows: Callable[[int, int], np.ndarray] | None = None
                       ) -> Iterator[TokenBatch]:
    """Stream one file's documents as :class:`TokenBatch` es.

    ``row_groups`` (ascending indices) restricts the read to those row groups (Arrow IPC: record
    batches); ``row_range`` ``(start, stop)`` (file rows) to the rows in it, cutting row groups
    at record batches (rows of a row group before ``start`` are decoded and skipped). ``first_row``
    and error messages still count rows from the start of the file.

    ``attention_mask`` / ``labels``: mask columns as in :func:`resolve_mask_columns` (default
    None: not read). Tokens whose attention mask is 0 are removed; a labels column (unshifted:
    ``labels[i]`` is ``input_ids[i]`` or -100) becomes ``TokenBatch.targets``. ``bos`` / ``eos``:
    added to every non-empty document lacking them (after the attention mask), never doubled
    (:func:`packtool.core.masks.add_boundary_tokens`). ``keep_rows(first_row, n)`` (optional)
    returns bool[n] for file rows ``first_row .. first_row + n - 1``: a row it marks False is
    read and validated like the others but yields no tokens (length 0; counted in
    ``TokenBatch.other_split``), before the masks and BOS/EOS apply.

    Raises:
        InputError: the file cannot be read (the message names the row group).
        SchemaError: a null document, a null token, a negative id or an id over int32; a mask
            row of another length than its document; a label that is neither -100 nor its token
            (the message names the file and the row).
    """
    src = open_input(path, column, fmt)
    path = src.path  # a URI folded by pathlib is named as the URI
    masks = resolve_mask_columns(src.schema_arrow, path, column, attention_mask, labels)
    columns = [column] + [c for c in (masks.attention_mask, masks.labels) if c is not None]
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
            flat = values.to_numpy(zero_copy_only=False)
            if flat.size:
                if flat.min() < 0:
                    vi = int(np.argmax(flat < 0))
                    where = row_ref(row + _row_of_value(lengths, vi))
                    raise SchemaError(f"{path}: {where}: negative token id {int(flat[vi])}; "
                                      "token ids must be >= 0")
                if flat.max() > INT32_MAX:
                    vi = int(np.argmax(flat > INT32_MAX))
                    where = row_ref(row + _row_of_value(lengths, vi))
                    raise SchemaError(f"{path}: {where}: token id "
                                      f"{int(flat[vi])} does not fit int32; packed input_ids are "
                                      "int32 (vocabularies up to 2**31 - 1)")
            # a cut batch's values are a view of the whole batch's: own them, so whoever keeps
            # the tokens (a window task holds them) does not keep the rest of the batch
            tokens = flat.astype(np.int32, copy=cut)
            targets, masked, keep = None, 0, None
            if masks.labels is not None:
                lab = _mask_values(batch.column(masks.labels), lengths, path, row,
                                   masks.labels)
                bad = (lab != IGNORE_INDEX) & (lab != tokens)
                if bad.any():
                    vi = int(np.argmax(bad))
                    raise SchemaError(
                        f"{path}: {row_ref(row + _row_of_value(lengths, vi))}: label "
                        f"{int(lab[vi])} is neither -100 nor its token {int(tokens[vi])}; the "
                        f"{masks.labels!r} column is read as unshifted labels (input_ids or "
                        "-100): fix it or pass --labels-column none")
                targets = (lab != IGNORE_INDEX).astype(np.uint8)
            if masks.attention_mask is not None:
                keep = _mask_values(batch.column(masks.attention_mask), lengths, path, row,
                                    masks.attention_mask)
            other = (0, 0)
            if keep_rows is not None:
                lengths, n_docs, n_tokens, tokens, targets, keep = drop_documents(
                    lengths, keep_rows(row, n), tokens, targets, keep)
                other = (n_docs, n_tokens)
            if keep is not None:
                lengths, tokens, targets, masked = drop_masked_tokens(lengths, tokens, keep,
                                                                      targets)
            boundary = BoundaryCounts()
            if bos is not None or eos is not None:
                lengths, tokens, targets, boundary = add_boundary_tokens(
                    lengths, tokens, targets, bos=bos, eos=eos)
            yield TokenBatch(row, lengths, tokens, targets, masked, boundary, other)
            row += n


def _mask_values(arr: pa.Array, lengths: np.ndarray, path, row: int, name: str) -> np.ndarray:
    """Values of a per-token mask column, checked to be shaped like the tokens."""
    if arr.null_count:
        bad = row + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise SchemaError(f"{path}: {row_ref(bad)}: {name!r} is null; fill it or pass "
                          f"--{name.replace('_', '-')}-column none")
    mlen, values = list_parts(arr)
    if not np.array_equal(mlen, lengths):
        bad = int(np.argmax(mlen != lengths))
        raise SchemaError(f"{path}: {row_ref(row + bad)}: {name!r} has {int(mlen[bad])} entries "
                          f"for {int(lengths[bad])} tokens; a mask column must be shaped like the "
                          "tokens (or name another column)")
    if values.null_count:
        vi = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        where = row_ref(row + _row_of_value(lengths, vi))
        raise SchemaError(f"{path}: {where}: a {name!r} value is null; fill it")
    return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
