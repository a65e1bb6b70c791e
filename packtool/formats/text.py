"""Text in, tokenized Parquet out: the files of ``packtool tokenize``.

Text inputs are found by :func:`packtool.formats.reader.discover` (``text=True``: JSON Lines as
well as Parquet, Arrow IPC and Hugging Face ``save_to_disk`` folders; local paths or store URIs)
and read in batches of documents:

- Parquet and Arrow: the text column (``string`` or ``large_string``), batch by batch;
- JSON Lines (``*.jsonl``, ``*.ndjson``, compressed ``.gz``/``.zst``/``.bz2`` by suffix, in any
  case: :func:`~packtool.formats.reader.text_compression`, the file's first bytes checked
  against it: :func:`~packtool.formats.sniff.compression_of`, and its content's for another
  container, compressed twice, Parquet, Arrow IPC or a Git LFS pointer, named with the fix
  instead of read as text): one JSON object per line in
  UTF-8, read 1 MiB at a time and parsed line by line, so an error names its line; blank lines
  are skipped (a UTF-8 byte-order mark before the first line is no part of it).

A null or non-string text, a missing column, a line that is not a JSON object, and text that is
not Unicode (bytes that are not UTF-8, in a JSON Lines line or a Parquet or Arrow string column,
text or kept; half a surrogate pair written as a JSON ``\\u`` escape) stop the run before any of
it is encoded, with one line naming the file, the row (Parquet: 0-based, labelled so) or the line
(JSON Lines: 1-based, as editors count) and the fix.

Tokenized shards hold ``input_ids: list<int32>`` (what ``packtool pack`` reads), then the
columns named by ``--keep-column`` carried from the text input as they are (Parquet and Arrow:
their own type, a dictionary-encoded column as its values; JSON Lines: as text, a string kept
as is and any other JSON value as its JSON text with its characters as they are (no ``\\u``
escapes), a missing key or ``null`` as null), one row per
document in input order, written as :mod:`packtool.formats.writer` writes packed shards (zstd,
PLAIN ids, page checksums, sha256 taken while writing); each is recorded in the typed
manifest as a :class:`~packtool.formats.manifest.ShardEntry`.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packtool.errors import InputError, SchemaError, first_line, row_ref
from packtool.formats.manifest import ShardEntry, store_failure
from packtool.formats.reader import (DENIED, TEXT_FORMATS, check_stream_end, filesystem_of,
                                     jsonl_tokens_fix, text_compression, unreadable_error)
from packtool.formats.schema import check_single_column, text_columns, token_column_candidates
from packtool.formats.sniff import compression_of, content_fix, table_format_of
from packtool.formats.writer import write_shard
from packtool.location import Location

__all__ = ["TOKENIZED_SCHEMA", "TEXT_FORMATS", "TextBatch", "iter_texts", "tokenized_schema",
           "common_tokenized_schema",
           "write_tokenized_shard", "tokenized_counts"]

#: Schema of a tokenized shard.
TOKENIZED_SCHEMA = pa.schema([pa.field(
    "input_ids", pa.list_(pa.field("element", pa.int32(), nullable=False)), nullable=False)])
_READ_BYTES = 1 << 20  # a damaged compressed file is named to within one block


@dataclass(frozen=True)
class TextBatch:
    """Consecutive documents of one input file: their texts and the kept columns' values.

    Attributes:
        texts: one string per document.
        kept: the ``--keep-column`` values, a ``pyarrow.Table`` of ``len(texts)`` rows (None
            when no column is kept).
    """

    texts: list
    kept: object = None

    def __len__(self) -> int:
        return len(self.texts)

    @staticmethod
    def concat(batches: list["TextBatch"]) -> "TextBatch":
        """The documents of ``batches`` in order, as one batch (kept columns in one chunk, so
        the bytes written from it do not depend on how the documents were batched)."""
        if len(batches) == 1:
            return batches[0]
        texts = [t for b in batches for t in b.texts]
        kept = [b.kept for b in batches if b.kept is not None]
        return TextBatch(texts, pa.concat_tables(kept).combine_chunks() if kept else None)

    def split(self, n: int) -> tuple["TextBatch", "TextBatch"]:
        """(the first ``n`` documents, the rest)."""
        k = self.kept
        return (TextBatch(self.texts[:n], None if k is None else k.slice(0, n)),
                TextBatch(self.texts[n:], None if k is None else k.slice(n)))


def common_tokenized_schema(sources, keep: tuple[str, ...] = ()) -> pa.Schema:
    """The one schema of every shard tokenized from ``sources``: each kept column in the type
    all the files' types promote to (``int16`` in one file and ``int64`` in another: ``int64``;
    ``string`` and ``large_string``: ``large_string``; a dictionary, such as a pandas
    ``Categorical``, as its values' type), so a later file's values are never cut to the first
    file's type.

    Args:
        sources: (path, format) of every input file, in input order.
        keep: the ``--keep-column`` names.

    Raises:
        SchemaError: a kept column whose types in two files have no common type (``string``
            from JSON Lines and ``int64`` from Parquet), naming both files; a key no line of a
            JSON Lines file holds, where its text type would meet another (the key is named
            missing, as :func:`iter_texts` names it); or as :func:`tokenized_schema`.
        InputError: an unreadable file.
    """
    sources = list(sources)
    if not keep or not sources:
        return TOKENIZED_SCHEMA
    schemas = [(path, fmt, tokenized_schema(path, fmt, keep)) for path, fmt in sources]
    return pa.schema(list(TOKENIZED_SCHEMA) + [
        _kept_field(name, [(path, fmt, s.field(name)) for path, fmt, s in schemas])
        for name in keep])


def _kept_field(name: str, files: list) -> pa.Field:
    """The field of the kept column ``name`` that its field in each of ``files`` ((path,
    format, field), in input order) promotes to.

    A JSON Lines file's field is text; where it meets a type it does not promote with, the
    file is read up to the first line holding the key: one that holds no document adds no
    type, one where no line holds the key is refused as a typo.

    Raises:
        SchemaError: two files' types with no common type, naming both; a key no line of a
            JSON Lines file holds.
    """
    files = list(files)
    while True:
        have = files[0][2]
        origin = files[0]  # the first file of the type so far
        for entry in files[1:]:
            path, fmt, fld = entry
            if fld.type == have.type:
                continue
            try:
                merged = pa.unify_schemas([pa.schema([have]), pa.schema([fld])],
                                          promote_options="permissive").field(0)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                empty = next((e for e in (origin, entry)
                              if e[1] == "jsonl" and not _jsonl_holds_key(e[0], name)), None)
                if empty is None:
                    text = (" (JSON Lines keeps a key's values as text)"
                            if "jsonl" in (fmt, origin[1]) else "")
                    raise SchemaError(f"{path}: kept column {name!r} is {fld.type} here and "
                                      f"{have.type} in {origin[0]}, with no common type"
                                      f"{text}; give the input files the same type for "
                                      "it") from None
                files.remove(empty)
                break  # promoted again without it
            if merged.type != have.type:
                origin = entry
            have = merged
        else:
            return have


def _values_type(typ: pa.DataType) -> pa.DataType:
    """The type of a kept column's values: a dictionary's (a pandas ``Categorical``) value
    type, any other type as it is. The shards hold values, whichever way a file stores them."""
    return typ.value_type if pa.types.is_dictionary(typ) else typ


def _decoded(table: pa.Table) -> pa.Table:
    """``table`` with every dictionary column replaced by its values (:func:`_values_type`)."""
    for i, col in enumerate(table.columns):
        if pa.types.is_dictionary(col.type):
            table = table.set_column(i, table.field(i).with_type(_values_type(col.type)),
                                     col.cast(_values_type(col.type)))
    return table


def tokenized_schema(path, fmt: str, keep: tuple[str, ...] = ()) -> pa.Schema:
    """The schema of the shards tokenized from the file ``path``: ``input_ids`` and the kept
    columns (their type in a Parquet or Arrow file, a dictionary's as its values' type;
    ``string`` from JSON Lines).

    Raises:
        SchemaError: a kept column the file does not hold, or holds more than once.
        InputError: an unreadable file.
    """
    if not keep:
        return TOKENIZED_SCHEMA
    if fmt == "jsonl":
        fields = [pa.field(name, pa.string()) for name in keep]
    else:
        schema, _ = _table_source(path, fmt)
        missing = [name for name in keep if name not in schema.names]
        if missing:
            raise SchemaError(f"{path}: no column {missing[0]!r} for --keep-column; available "
                              f"columns: {', '.join(schema.names)}")
        for name in keep:
            check_single_column(schema, name, path)
        fields = [schema.field(name).with_type(_values_type(schema.field(name).type))
                  for name in keep]
    return pa.schema(list(TOKENIZED_SCHEMA) + fields)


#: half of a UTF-16 surrogate pair, which a JSON \u escape can write but no text holds
_SURROGATE = re.compile("[\ud800-\udfff]")
#: a byte that is not UTF-8, as ``surrogateescape`` decodes it
_ESCAPED = re.compile("[\udc80-\udcff]")
_BOM = b"\xef\xbb\xbf"
#: the tool of each codec of :func:`~packtool.formats.reader.text_compression`, as
#: :func:`~packtool.formats.sniff.compression_of` names it
_CODEC_TOOL = {"gzip": "gzip", "zstd": "zstd", "bz2": "bzip2"}
#: the command writing a file of each such tool decompressed to standard output
_TO_STDOUT = {"gzip": "gunzip -c", "zstd": "zstd -dc", "bzip2": "bunzip2 -c"}
#: the first bytes of a JSON Lines file's content that :func:`_content_fix` looks at
_HEAD_BYTES = 32
#: JSON's name of a parsed value's Python type
_JSON_NAMES = {type(None): "null", bool: "boolean", int: "number", float: "number",
               str: "string", list: "array", dict: "object"}


class _Number(float):
    """A JSON number with a fraction or an exponent as parsed, its characters kept in ``raw``
    (``1.0e2``, ``1e400``: a float would write ``100.0``, ``inf``)."""

    raw: str

    def __new__(cls, raw: str) -> "_Number":
        self = super().__new__(cls, raw)
        self.raw = raw
        return self


class _Integer(int):
    """A JSON integer as parsed, its characters kept in ``raw`` (``-0``)."""

    raw: str

    def __new__(cls, raw: str) -> "_Integer":
        self = super().__new__(cls, raw)
        self.raw = raw
        return self


class _NotJSON:
    """``NaN``, ``Infinity`` or ``-Infinity`` where a value stands: Python's json module writes
    them and reads them back, but they are not JSON. Refused where the text or a kept value
    holds one (:func:`_not_json_in`), left alone in a key neither read nor kept."""

    def __init__(self, literal: str) -> None:
        self.literal = literal


#: parses a JSON Lines line keeping each number's characters (:class:`_Number`,
#: :class:`_Integer`, written back by :func:`_json_text`) and marking the literals that are
#: not JSON (:class:`_NotJSON`)
_DECODER = json.JSONDecoder(parse_float=_Number, parse_constant=_NotJSON,
                            parse_int=lambda raw: _Integer(raw) if raw == "-0" else int(raw))


def _not_json_in(value) -> str | None:
    """The first :class:`_NotJSON` literal in a parsed value (nested too), None when none."""
    if isinstance(value, _NotJSON):
        return value.literal
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) \
        else ()
    return next((lit for lit in map(_not_json_in, items) if lit is not None), None)


def _dumps(value) -> str:
    """A parsed JSON value written back as JSON, as ``json.dumps(value, ensure_ascii=False)``
    writes it, each number with the characters it was read with."""
    if isinstance(value, (_Number, _Integer)):
        return value.raw
    if isinstance(value, list):
        return "[" + ", ".join(map(_dumps, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_dumps(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _json_name(value) -> str:
    """JSON's name of a parsed value's type (``number`` for :class:`_Number` too)."""
    return next((name for t, name in _JSON_NAMES.items() if type(value) is t), None) or next(
        (name for t, name in _JSON_NAMES.items() if isinstance(value, t)), type(value).__name__)


def _json_text(value):
    """A kept JSON Lines value as text: a string as it is, anything else as its JSON with its
    characters as they are (``{"lang": "日本"}``, not ``\\u65e5``; ``1.0e2``, not ``100.0``),
    None as None."""
    return value if value is None or isinstance(value, str) else _dumps(value)


def _encoding_error(path, n: int, line: bytes) -> InputError | None:
    """The refusal of JSON Lines line ``n`` (its bytes ``line``) that is not UTF-8 JSON because
    of how the file was written: UTF-16 without a byte-order mark (NUL bytes between its
    characters), or a UTF-8 byte-order mark at the start of a line after the first (files
    joined with ``cat``); None for any other line."""
    if n > 1 and line.startswith(_BOM):
        return InputError(f"{path}: line {n}: begins with a UTF-8 byte-order mark in the middle "
                          "of the file (files joined with cat, each with its mark); remove the "
                          f"marks: sed -i 's/^\\xEF\\xBB\\xBF//' {path}")
    nul = line.count(0)
    if nul < 2 or nul * 4 < len(line) or (n == 1 and line[:2] in (b"\xff\xfe", b"\xfe\xff")):
        return None  # a UTF-16 byte-order mark is named by the not-UTF-8 refusal
    order = "LE" if line[1::2].count(0) >= line[0::2].count(0) else "BE"
    name = str(path)
    if text_compression(_file_name(path)) is not None:
        how = f"decompress it, then convert it: iconv -f UTF-16{order} -t UTF-8"
    else:
        stem = name[:name.rfind(".")] if "." in _file_name(path) else name
        how = f"convert it: iconv -f UTF-16{order} -t UTF-8 {name} > {stem}.utf8.jsonl"
    return InputError(f"{path}: line {n}: looks like UTF-16 text without a byte-order mark (NUL "
                      f"bytes between its characters), not UTF-8; {how}")


def _file_name(path) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def _misnamed_fix(path, head: bytes, codec: str | None) -> str | None:
    """What a JSON Lines file is and the fix, when its first bytes ``head`` (as stored, not
    decompressed) disagree with the compression its name says (``codec``:
    :func:`~packtool.formats.reader.text_compression`): another compression, none (plain
    text, or an LFS pointer, Parquet or Arrow IPC: :func:`~packtool.formats.sniff.content_fix`);
    None when they agree."""
    name = _file_name(path)
    found = compression_of(head)
    if codec is None:
        if found is None:
            return None
        tool, command, suffix = found
        if tool in _CODEC_TOOL.values():
            return (f"is compressed with {tool} but named {name[name.rfind('.'):]}: rename it "
                    f"to {name}{suffix}")
        return (f"is compressed with {tool}, which packtool does not read: decompress it "
                f"({command}), or compress it with gzip or zstd instead")
    if not head or (found is not None and found[0] == _CODEC_TOOL[codec]):
        return None
    base = name[:name.rfind(".")]
    if found is None:  # an LFS pointer, Parquet or Arrow IPC is no text to rename
        return content_fix(head, "JSON Lines") or (
            f"is not {codec}-compressed (its bytes are plain): rename it to {base}")
    tool, command, suffix = found
    if tool in _CODEC_TOOL.values():
        return f"is not {codec}-compressed (its bytes are {tool}): rename it to {base}{suffix}"
    return (f"is not {codec}-compressed (its bytes are {tool}, which packtool does not read): "
            f"decompress it ({command})")


def _content_fix(path, head: bytes, codec: str | None) -> str | None:
    """What a JSON Lines file holds instead of text and the fix, by the first bytes ``head``
    of its content (decompressed by the compression its name says: ``codec``,
    :func:`~packtool.formats.reader.text_compression`; None: read as it is stored), with the
    magic bytes :mod:`packtool.formats.sniff` knows: a compression (under a compressed name:
    compressed twice; under a plain one: :func:`_misnamed_fix`), a Parquet or Arrow IPC file,
    a Git LFS pointer. None when they say nothing more (the line is then read as text)."""
    if codec is None:
        return _misnamed_fix(path, head, None) or content_fix(head, "JSON Lines")
    shown = str(path)
    outer = _CODEC_TOOL[codec]
    unpack = f"{_TO_STDOUT[outer]} {shlex.quote(shown)}"
    base = shown[:shown.rfind(".")]  # a.jsonl.gz -> a.jsonl
    found = compression_of(head)
    if found is not None:
        tool, command, _ = found
        if tool == "zip":  # an archive: unzip reads a file, not a stream
            return (f"is a zip archive compressed with {outer}; decompress it: {unpack} > "
                    f"{shlex.quote(base[:base.rfind('.')] + '.zip')}, then unzip that")
        return (f"is compressed twice ({tool} inside {outer}); decompress both: {unpack} | "
                f"{command} > {shlex.quote(base)}")
    table = table_format_of(head)
    if table is not None:
        stem = base[:base.rfind(".")] + (".parquet" if table == "Parquet" else ".arrow")
        return (f"is {'a' if table == 'Parquet' else 'an'} {table} file compressed with {outer}, "
                f"not JSON Lines; decompress it: {unpack} > {shlex.quote(stem)} ({table} "
                "compresses inside the file)")
    return content_fix(head, "JSON Lines")


def _stored_head(path, n: int = _HEAD_BYTES) -> bytes:
    """The first ``n`` bytes of ``path`` as stored (not decompressed); empty when they cannot
    be read (the reader names that fault)."""
    try:
        fs, inner, _ = filesystem_of(path)
        with fs.open_input_stream(inner, compression=None) as fh:  # not by the suffix
            return fh.read(n)
    except (pa.ArrowException, OSError):
        return b""


def _open_stream(path):
    """The decompressed bytes of a JSON Lines file, by the suffix it was recognised by (any
    case: ``a.JSONL.GZ`` too)."""
    fs, inner, _ = filesystem_of(path)
    try:
        return fs.open_input_stream(inner, compression=text_compression(inner))
    except PermissionError:
        raise InputError(f"{path}: {DENIED}") from None
    except (pa.ArrowException, OSError) as exc:
        raise (store_failure(path, exc) or InputError(
            f"{path}: cannot be read ({first_line(exc)}); check the path")) from None


def _jsonl_lines(path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of every non-blank line; a UTF-8 byte-order mark before
    the first line is no part of it (a mark alone makes a blank line).

    Raises:
        InputError: the file cannot be read, is damaged, or its first bytes say another
            compression than its name (:func:`_misnamed_fix`).
    """
    n, tail, first = 0, b"", True
    codec = text_compression(_file_name(path))
    with _open_stream(path) as f:
        while True:
            try:
                block = f.read(_READ_BYTES)
            except (pa.ArrowException, OSError) as exc:
                told = store_failure(path, exc)  # the store failed, not the file
                if told is not None:
                    raise told from None
                fix = _misnamed_fix(path, _stored_head(path), codec) if first else None
                if fix:
                    raise InputError(f"{path}: {fix}") from None
                after = f" after line {n:,}" if n else ""
                raise InputError(f"{path}: cannot be read{after} ({first_line(exc)}); the "
                                 "file is damaged or truncated") from None
            if first:  # the content is another container: named, never read as text
                first = False
                fix = _content_fix(path, block[:_HEAD_BYTES], codec)
                if fix:
                    raise InputError(f"{path}: {fix}")
                block = block.removeprefix(_BOM)
            if not block:
                break
            lines = (tail + block).split(b"\n")
            tail = lines.pop()
            for line in lines:
                n += 1
                if line.strip():
                    yield n, line
    if tail.strip():
        yield n + 1, tail


def _no_key_error(path, name: str, first_keys: list) -> SchemaError:
    """The refusal of a ``--keep-column`` key that no line of the JSON Lines file holds."""
    return SchemaError(f"{path}: no line holds the key {name!r} for --keep-column (keys of the "
                       f"first line: {', '.join(first_keys[:8])}); check the name")


def _jsonl_holds_key(path, name: str) -> bool:
    """Read the JSON Lines file ``path`` up to the first line holding the key ``name``: True
    when one does, False when the file holds no document (no JSON object).

    Raises:
        SchemaError: no line holds it (:func:`_no_key_error`).
        InputError: an unreadable file.
    """
    needles = {json.dumps(name).encode(), json.dumps(name, ensure_ascii=False).encode(), b"\\u"}
    first_keys = None
    for _, line in _jsonl_lines(path):
        if first_keys is not None and not any(n in line for n in needles):
            continue  # a line whose bytes cannot hold the key
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # named where the file is read
        if not isinstance(obj, dict):
            continue
        if name in obj:
            return True
        if first_keys is None:
            first_keys = list(obj)
    if first_keys is not None:
        raise _no_key_error(path, name, first_keys)
    return False


def _token_ids(value) -> bool:
    """True for a JSON value that is a list of integers: token ids, not text."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in value))


def _tokenized_fix(path, schema: pa.Schema, column: str) -> str:
    """The fix for a Parquet or Arrow input of ``tokenize`` that holds token ids, not text
    (empty when ``schema`` holds none): it is packed as it is. When the text column
    ``column`` is missing and string columns lie beside the ids (a ``source`` or ``url``
    column), it looks tokenized all the same, with ``--text-column NAME`` offered second for
    text in another column."""
    found = token_column_candidates(schema)
    other = ""
    if column in schema.names and column in found:
        name = column
    elif column not in schema.names and found:
        name = found[0]
        if text_columns(schema):
            other = ", or pass --text-column NAME if its text is in another column"
    else:
        return ""
    option = "" if name == "input_ids" else f" --column {name}"
    return (f"it looks already tokenized (column {name!r} holds lists of integer token ids): "
            f"pack it with packtool pack --capacity C{option} {path} OUTPUT{other}")


def _jsonl_texts(path, column: str, batch_docs: int, skip: int,
                 keep: tuple[str, ...]) -> Iterator[tuple[int, TextBatch]]:
    batch, first, row = [], skip, 0
    kept: list[list] = [[] for _ in keep]
    unseen, first_keys = set(keep), None  # a kept key no line holds is a typo

    def done() -> TextBatch:
        table = None if not keep else pa.table(
            {name: pa.array(vals, type=pa.string()) for name, vals in zip(keep, kept)})
        for vals in kept:
            vals.clear()
        return TextBatch(list(batch), table)

    for n, line in _jsonl_lines(path):
        if row < skip:  # resumed: documents already tokenized are not parsed again
            row += 1
            continue
        try:
            obj = _DECODER.decode(line.decode("utf-8"))  # strict: never surrogates (CESU-8)
        except UnicodeDecodeError as exc:
            raise (_encoding_error(path, n, line)
                   or _not_utf8_error(path, n, line, exc)) from None
        except ValueError as exc:
            raise (_encoding_error(path, n, line) or InputError(
                f"{path}: line {n}: not valid JSON ({first_line(exc)}); fix or remove the line")
            ) from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}: line {n}: a JSON "
                             f"{_json_name(obj)}, not an object; "
                             "each line must be one object holding the text")
        tokens = [] if isinstance(obj.get(column), str) else \
            [k for k, v in obj.items() if _token_ids(v)]
        if tokens and (column not in obj or _token_ids(obj[column])):  # not text: tokenized
            said = f"{column!r} is a list of integers" if column in obj else \
                f"no key {column!r}"
            raise SchemaError(f"{path}: line {n}: {said}; the file "
                              f"{jsonl_tokens_fix(path, tokens)}")
        if column not in obj:
            keys = ", ".join(list(obj)[:8]) or "none"
            raise SchemaError(f"{path}: line {n}: no key {column!r} (keys: {keys}); pass "
                              "--text-column NAME")
        text = obj[column]
        if b"NaN" in line or b"Infinity" in line:  # maybe a literal that is not JSON
            for name, value in [(column, text), *((k, obj.get(k)) for k in keep)]:
                lit = _not_json_in(value)
                if lit is not None:
                    raise InputError(f"{path}: line {n}: {name!r} holds {lit}, which is not JSON "
                                     "(Python's json module writes it for a float that is not "
                                     "a number); write null or a string there, or drop the line")
        if not isinstance(text, str):
            what = "null" if text is None else next(
                (word for t, word in ((bool, "a boolean"), (int, "an integer"),
                                      (float, "a number"), (list, "a list"),
                                      (dict, "an object")) if isinstance(text, t)),
                f"a {type(text).__name__}")
            raise SchemaError(f"{path}: line {n}: {column!r} is {what}, not a string; fix the "
                              "line or drop it")
        values = [_json_text(obj.get(name)) for name in keep]
        if b"\\ud" in line or b"\\uD" in line:  # a \uD8xx escape: maybe half a pair
            for name, value in [(column, text), *zip(keep, values)]:
                bad = _SURROGATE.search(value) if isinstance(value, str) else None
                if bad:
                    raise InputError(f"{path}: line {n}: {name!r} holds a lone surrogate "
                                     f"(\\u{ord(bad.group()):04x}), which is not Unicode text; "
                                     "fix the line (a \\ud83d\\ude00 pair is fine) or drop it")
        batch.append(text)
        if first_keys is None:
            first_keys = list(obj)
        for vals, value in zip(kept, values):
            vals.append(value)
        if unseen:
            unseen.difference_update(obj.keys())
        row += 1
        if len(batch) == batch_docs:
            yield first, done()
            first, batch = row, []
    if unseen and not skip and first_keys is not None:  # resumed: earlier lines were not parsed
        raise _no_key_error(path, sorted(unseen)[0], first_keys)
    if batch:
        yield first, done()


def _not_utf8_error(path, n: int, line: bytes, exc: UnicodeDecodeError) -> InputError:
    """The refusal of JSON Lines line ``n`` whose bytes ``line`` are not UTF-8 (Latin-1,
    UTF-16, surrogates written as bytes by a CESU-8 or WTF-8 writer), naming the key whose
    value holds them where the line parses."""
    bad = line[exc.start:exc.start + 2]
    if n == 1 and line.startswith((b"\xff\xfe", b"\xfe\xff")):
        why = "UTF-16 text: the file begins with a UTF-16 byte-order mark"
    elif bad[:1] == b"\xed" and bad[1:2] >= b"\xa0":
        why = (f"half a UTF-16 surrogate pair written as bytes (CESU-8, WTF-8) at byte "
               f"{exc.start:,} of the line")
    else:
        why = f"{exc.reason}: 0x{line[exc.start]:02x} at byte {exc.start:,} of the line"
    where = ""
    try:
        obj = json.loads(line.decode("utf-8", "surrogateescape"))
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        where = next((f"{k!r} is " for k, v in obj.items()
                      if _ESCAPED.search(v if isinstance(v, str) else json.dumps(
                          v, ensure_ascii=False))), "")
    return InputError(f"{path}: line {n}: {where}not valid UTF-8 ({why}); re-encode the file as "
                      "UTF-8 or drop the line")


def _check_kept_utf8(path, kept: pa.Table, first: int) -> None:
    """Refuse kept Parquet or Arrow columns whose strings are not UTF-8 (Arrow's string types
    promise UTF-8, but a writer can break the promise): SchemaError naming the file, the row
    (``first``: the row of ``kept``'s first) and the column. Other damage is raised as
    pyarrow's ArrowInvalid."""
    for name, col in zip(kept.column_names, kept.columns):
        try:
            col.validate(full=True)
        except pa.ArrowInvalid as exc:
            if "UTF8" not in str(exc):
                raise
            row = 0
            for i in range(len(col)):
                try:
                    col.slice(i, 1).validate(full=True)
                except pa.ArrowInvalid:
                    row = i
                    break
            raise SchemaError(f"{path}: {row_ref(first + row)}: kept column {name!r} is not "
                              "valid UTF-8; re-encode it as UTF-8 (or drop the row) before "
                              "tokenizing") from None


def _table_source(path, fmt: str):
    """(schema, record batch iterator factory) of a Parquet or Arrow IPC file."""
    fs, inner, prefix = filesystem_of(path)
    try:
        if fmt == "parquet":
            pf = pq.ParquetFile(inner if not prefix else fs.open_input_file(inner),
                                page_checksum_verification=True)  # as pack reads Parquet
            return pf.schema_arrow, lambda cols, n: pf.iter_batches(batch_size=n, columns=cols,
                                                                   use_threads=False)
        source = pa.memory_map(inner, "r") if not prefix else fs.open_input_file(inner)
        with fs.open_input_stream(inner) as fh:
            head = fh.read(6)
        if head != b"ARROW1":  # a stream: whole, as pack reads it
            source = source.read_buffer()
            check_stream_end(path, source)
        reader = pa.ipc.open_file(source) if head == b"ARROW1" else pa.ipc.open_stream(source)
        batches = ([reader.get_batch(i) for i in range(reader.num_record_batches)]
                   if head == b"ARROW1" else list(reader))

        def it(cols, n):
            for b in batches:
                b = b.select(cols)
                for lo in range(0, b.num_rows, n):
                    yield b.slice(lo, n)

        return reader.schema, it
    except (pa.ArrowException, OSError) as exc:
        raise unreadable_error(path, fs, inner, "Parquet" if fmt == "parquet" else "Arrow IPC",
                               exc) from None


def _pylist(arr, path, first: int, column: str) -> list:
    """The texts of ``arr`` as Python strings; SchemaError naming the first row whose bytes are
    not UTF-8 (Arrow's string types promise UTF-8, but a writer can break the promise)."""
    try:
        return arr.to_pylist()
    except UnicodeDecodeError as exc:
        for i in range(len(arr)):
            try:
                arr[i].as_py()
            except UnicodeDecodeError:
                break
        else:
            i = 0
        raise SchemaError(f"{path}: {row_ref(first + i)}: {column!r} is not valid UTF-8 "
                          f"({exc.reason} at byte {exc.start:,}); re-encode the texts as UTF-8 "
                          "(or drop the row) before tokenizing") from None


def _table_texts(path, fmt: str, column: str, batch_docs: int, skip: int,
                 keep: tuple[str, ...]) -> Iterator[tuple[int, TextBatch]]:
    schema, batches = _table_source(path, fmt)
    fix = _tokenized_fix(path, schema, column) or "pass --text-column NAME"
    if column not in schema.names:
        raise SchemaError(f"{path}: no column {column!r}; available columns: "
                          f"{', '.join(schema.names)}; {fix}")
    check_single_column(schema, column, path)
    typ = schema.field(column).type
    if pa.types.is_dictionary(typ):  # e.g. a pandas Categorical: the texts are its values
        typ = typ.value_type
    if (pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
            or pa.types.is_fixed_size_binary(typ) or pa.types.is_binary_view(typ)):
        raise SchemaError(f"{path}: column {column!r} has type {typ}: bytes, not text; cast it "
                          "to string where its bytes are UTF-8 text (pyarrow: "
                          "table.cast(schema with pa.string()); pandas: .str.decode('utf-8')) "
                          "and write the file again")
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)
            or pa.types.is_string_view(typ)):
        raise SchemaError(f"{path}: column {column!r} has type {typ}, expected text (string); "
                          f"{fix}")
    missing = [name for name in keep if name not in schema.names]
    if missing:
        raise SchemaError(f"{path}: no column {missing[0]!r} for --keep-column; available "
                          f"columns: {', '.join(schema.names)}")
    for name in keep:
        check_single_column(schema, name, path)
    row = 0
    try:
        for b in batches([column, *keep], batch_docs):
            n = b.num_rows
            if row + n <= skip:
                row += n
                continue
            arr = b.column(0)
            if pa.types.is_dictionary(arr.type):
                arr = arr.dictionary_decode()
            lo = max(0, skip - row)
            if arr.null_count:
                nulls = np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))
                nulls = nulls[nulls >= lo]
                if nulls.size:
                    raise SchemaError(f"{path}: {row_ref(row + int(nulls[0]))}: {column!r} is "
                                      "null; drop or fill null texts before tokenizing")
            kept = (_decoded(pa.Table.from_batches([b.slice(lo).select(list(keep))]))
                    if keep else None)
            if kept is not None:
                _check_kept_utf8(path, kept, row + lo)
            yield row + lo, TextBatch(_pylist(arr.slice(lo), path, row + lo, column), kept)
            row += n
    except (pa.ArrowException, OSError) as exc:
        told = store_failure(path, exc)  # the store failed, not the file
        if told is not None:
            raise told from None
        raise InputError(f"{path}: {row_ref(row)}: cannot be read ({first_line(exc)}); the "
                         "file is damaged or truncated: regenerate it") from None


def iter_texts(path, fmt: str, column: str, *, batch_docs: int = 1024, skip: int = 0,
               keep: tuple[str, ...] = ()) -> Iterator[tuple[int, TextBatch]]:
    """Stream the texts of one input file.

    Args:
        path: a local path or URI.
        fmt: ``parquet``, ``arrow`` or ``jsonl`` (as :func:`~packtool.formats.reader.discover`
            found it).
        column: the text column (JSON Lines: the key).
        batch_docs: documents per batch (the last one shorter; Parquet and Arrow batches may be
            shorter at row-group ends).
        skip: leave out the first ``skip`` documents (resume).
        keep: columns (JSON Lines: keys) carried beside the texts (``--keep-column``).

    Yields:
        (index of the batch's first document in the file, :class:`TextBatch`).

    Raises:
        InputError: an unreadable file, a JSON Lines file whose first bytes say another
            compression than its name, a line that is not a JSON object or not UTF-8 (any key),
            a text or kept value holding half a surrogate pair.
        SchemaError: a missing text column or key, a null or non-string text, a Parquet or
            Arrow text or kept string that is not UTF-8, a binary text column, a kept column
            missing from a Parquet or Arrow file or from every line of a JSON Lines file (raised
            at the end of the file).
    """
    keep = tuple(keep)
    if fmt == "jsonl":
        return _jsonl_texts(path, column, batch_docs, skip, keep)
    return _table_texts(path, fmt, column, batch_docs, skip, keep)


def write_tokenized_shard(path: Path, batches: Iterator[tuple[np.ndarray, np.ndarray, object]],
                          schema: pa.Schema = TOKENIZED_SCHEMA,
                          source: str | None = None, name: str | None = None
                          ) -> tuple[ShardEntry, int]:
    """Write tokenized documents to ``path`` (one row group per batch), a temporary name the
    caller publishes as shard ``name``.

    Args:
        path: the file to write (``shard_temp``).
        batches: (lengths int64[docs], ids int32[sum(lengths)], kept columns: a
            ``pyarrow.Table`` of docs rows or None) per batch.
        schema: :func:`common_tokenized_schema` of the input files.
        source: the input file the documents come from (named in messages).
        name: the shard's file name in its manifest entry (None: ``path``'s name).

    Returns:
        (the shard's manifest entry, tokens written).

    Raises:
        InputError: a batch of over 2**31 tokens (int32 list offsets).
        SchemaError: kept values that do not fit the schema's type.
        OSError: ``path`` cannot be written.
    """
    counts = [0, 0]
    source = f"{source}: " if source else ""

    def tables():
        for lengths, ids, kept in batches:
            offsets = np.zeros(lengths.size + 1, dtype=np.int64)  # shape: (docs + 1,)
            np.cumsum(lengths, out=offsets[1:])
            if offsets[-1] >= 2**31:  # int32 list offsets; never with sane batch sizes
                raise InputError("a batch of documents holds over 2**31 tokens; lower "
                                 "--batch-docs")
            arr = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids),
                                           type=TOKENIZED_SCHEMA.field(0).type)
            counts[0] += lengths.size
            counts[1] += int(offsets[-1])
            cols = [arr]
            for fld in list(schema)[1:]:
                col = kept.column(fld.name)
                try:
                    cols.append(col.cast(fld.type) if col.type != fld.type else col)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SchemaError(f"{source}kept column {fld.name!r}: values of type "
                                      f"{col.type} do not fit the shards' {fld.type} "
                                      f"({first_line(exc)}); give the input files the same "
                                      "type") from None
            yield pa.Table.from_arrays(cols, schema=schema)

    w = write_shard(path, schema, tables())
    entry = ShardEntry(name or Path(path).name, counts[0], w.bytes, w.sha256, w.footer_sha256,
                       ShardEntry.run_lengths(w.group_rows))
    return entry, counts[1]


def tokenized_counts(loc) -> tuple[int, int]:
    """(documents, tokens) of a tokenized shard (a path or URI), read from its lengths (the
    footer's value count would count an empty document as one value).

    Raises:
        OSError: the file cannot be read or is not Parquet.
    """
    loc = Location.parse(loc)
    try:
        with loc.open_input() as fh:
            col = pq.ParquetFile(fh).read(columns=["input_ids"]).column(0)
    except pa.ArrowException as exc:
        raise OSError(f"{loc.display}: not a readable tokenized shard "
                      f"({first_line(exc)})") from None
    tokens = int(sum(pc.sum(pc.list_value_length(c)).as_py() or 0 for c in col.chunks))
    return len(col), tokens
