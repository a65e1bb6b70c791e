"""Input and packed Arrow schemas, in one place.

Per-token columns are ``fixed_size_list<int32>[C]``: the type carries the capacity and no list
offsets, so no int32 offset can wrap however large a row group is (``list<int32>`` offsets are
``(rows + 1) * C`` and wrap at 2**31 tokens per row group). The variable-length columns
(``cu_seqlens``, ``doc_ids``, ``doc_offsets``) hold one entry per segment (at most C + 1 per row)
and stay ``list``.

``labels`` is a pure function of ``input_ids`` and ``segment_ids`` under both conventions, so it
is stored only on request (``--labels unshifted|shifted``); by default (``--labels none``) readers
derive it. The manifest records the labels fact (stored or not, and the convention readers hand
out); the schema metadata says the same convention (:data:`LABELS_CONVENTION_META_KEY`), so a
shard read alone tells it too.
"""

from __future__ import annotations

import re

import pyarrow as pa

from packtool.errors import SchemaError
from packtool.types import DEFAULT_TOKEN_COLUMN

__all__ = ["packed_schema", "packed_columns", "labels_convention", "check_token_column",
           "check_single_column", "token_column_candidates", "MASK_LIKE", "text_columns",
           "tokenize_first", "missing_token_column", "pass_token_column",
           "is_integer_list", "is_list_layout",
           "LABELS_CONVENTION_META_KEY", "CAPACITY_META_KEY", "FORMAT_VERSION_META_KEY",
           "SHARD_META_KEY", "SEGMENT_MULTIPLE_META_KEY", "shard_schema", "written_as_shard",
           "TOKEN_COLUMNS", "RAGGED_COLUMNS", "SCALAR_COLUMNS"]

#: Schema metadata key: the labels convention a reader gets, stored or derived
#: (``unshifted`` | ``shifted``; ``--labels none`` means readers derive ``unshifted``).
LABELS_CONVENTION_META_KEY = b"packtool.labels_convention"
#: Schema metadata key: the capacity C (tokens per row), decimal.
CAPACITY_META_KEY = b"packtool.capacity"
#: Schema metadata key: the output format version (decimal; see
#: :mod:`packtool.formats.manifest`).
FORMAT_VERSION_META_KEY = b"packtool.format_version"
#: Schema metadata key of each shard (not of the manifest): the shard's own file name, so that
#: two shards never share a footer and a shard moved to another name is told apart.
SHARD_META_KEY = b"packtool.shard"
#: Schema metadata key: N of ``--segment-multiple`` (only when N > 1), decimal.
SEGMENT_MULTIPLE_META_KEY = b"packtool.segment_multiple"

#: fixed_size_list<int32>[C] columns, in schema order (``labels`` only when stored).
TOKEN_COLUMNS = ("input_ids", "segment_ids", "position_ids", "labels")
#: variable-length list columns (one entry per segment, ``cu_seqlens`` and
#: ``cu_seqlens_unpadded`` one more; ``cu_seqlens_unpadded`` only with ``--segment-multiple``
#: N > 1, ``source_ids`` only with ``pack --source-column``).
RAGGED_COLUMNS = ("cu_seqlens", "doc_ids", "doc_offsets", "cu_seqlens_unpadded", "source_ids")
#: one int32 per row.
SCALAR_COLUMNS = ("max_seqlen", "num_targets")
#: a per-token column whose name says it masks something or holds labels: never taken for the
#: token column, and named in pack's summary when it is not used as a mask
MASK_LIKE = re.compile(r"mask|label", re.IGNORECASE)


def labels_convention(labels: str) -> str:
    """The convention of the labels a reader gets for ``--labels labels``.

    ``unshifted`` and ``shifted`` are stored as such; ``none`` stores nothing and readers derive
    the ``unshifted`` labels (the model shifts; Hugging Face convention) from ``input_ids`` and
    ``segment_ids``.

    Raises:
        ValueError: ``labels`` is not ``none``, ``unshifted`` or ``shifted``.
    """
    if labels not in ("none", "unshifted", "shifted"):
        raise ValueError(f"labels mode {labels!r}: choose none, unshifted or shifted")
    return "unshifted" if labels == "none" else labels


def packed_columns(labels: str, segment_multiple: int = 1, *, sources: bool = False) -> list[str]:
    """Column names of a packed shard, in order, for ``--labels labels`` and
    ``--segment-multiple segment_multiple`` (``cu_seqlens_unpadded`` after ``cu_seqlens`` when
    it is over 1), and ``--source-column`` when ``sources`` (``source_ids`` last)."""
    return ([c for c in TOKEN_COLUMNS if c != "labels" or labels != "none"] + ["cu_seqlens"]
            + (["cu_seqlens_unpadded"] if segment_multiple > 1 else [])
            + list(SCALAR_COLUMNS) + ["doc_ids", "doc_offsets"]
            + (["source_ids"] if sources else []))


def packed_schema(capacity: int, labels: str, segment_multiple: int = 1, *,
                  sources: bool = False) -> pa.Schema:
    """The schema of a packed shard (README, "Output contract"; docs/output.md).

    Args:
        capacity: C, tokens per row (2 .. 2**24).
        labels: ``none`` (no ``labels`` column; readers derive unshifted labels), ``unshifted``
            or ``shifted``.
        segment_multiple: N of ``--segment-multiple``; over 1 adds ``cu_seqlens_unpadded``
            (``list<int32>``) and :data:`SEGMENT_MULTIPLE_META_KEY`.
        sources: add ``source_ids`` (``pack --source-column``): ``list<int32>``, one id per
            segment, beside ``doc_ids``; the manifest holds the id -> value table.

    Returns:
        Per-token columns ``fixed_size_list<int32>[C]``, ``cu_seqlens`` (and
        ``cu_seqlens_unpadded``) ``list<int32>``, ``max_seqlen``/``num_targets`` ``int32``,
        ``doc_ids``/``doc_offsets`` ``list<int64>`` (and ``source_ids`` ``list<int32>``), none
        nullable. Metadata: :data:`CAPACITY_META_KEY`, :data:`LABELS_CONVENTION_META_KEY`,
        :data:`FORMAT_VERSION_META_KEY` (and :data:`SEGMENT_MULTIPLE_META_KEY`).
    """
    tok = pa.list_(pa.field("element", pa.int32(), nullable=False), capacity)
    i32 = pa.list_(pa.field("element", pa.int32(), nullable=False))
    i64 = pa.list_(pa.field("element", pa.int64(), nullable=False))
    types = {"input_ids": tok, "segment_ids": tok, "position_ids": tok, "labels": tok,
             "cu_seqlens": i32, "cu_seqlens_unpadded": i32, "max_seqlen": pa.int32(),
             "num_targets": pa.int32(),
             "doc_ids": i64, "doc_offsets": i64, "source_ids": i32}
    fields = [pa.field(c, types[c], nullable=False)
              for c in packed_columns(labels, segment_multiple, sources=sources)]
    from packtool.formats.manifest import FORMAT_VERSION

    meta = {LABELS_CONVENTION_META_KEY: labels_convention(labels).encode(),
            CAPACITY_META_KEY: str(capacity).encode(),
            FORMAT_VERSION_META_KEY: str(FORMAT_VERSION).encode()}
    if segment_multiple > 1:
        meta[SEGMENT_MULTIPLE_META_KEY] = str(segment_multiple).encode()
    return pa.schema(fields, metadata=meta)


def shard_schema(schema: pa.Schema, name: str) -> pa.Schema:
    """``schema`` (from :func:`packed_schema`) with shard ``name`` in its metadata
    (:data:`SHARD_META_KEY`): what shard ``name`` is written with."""
    return schema.with_metadata({**(schema.metadata or {}), SHARD_META_KEY: name.encode()})


def is_list_layout(typ: pa.DataType) -> bool:
    """True for any Arrow list layout: list, large_list, fixed_size_list, (large_)list_view."""
    layouts = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list,
               pa.types.is_list_view, pa.types.is_large_list_view)
    return any(f(typ) for f in layouts)


def is_integer_list(typ: pa.DataType) -> bool:
    """True for a list of integers in any Arrow list layout (see :func:`check_token_column`)."""
    return is_list_layout(typ) and pa.types.is_integer(typ.value_type)


def check_single_column(schema: pa.Schema, column: str, path) -> None:
    """Raise :class:`SchemaError` when a column packtool reads appears more than once in a file.

    Parquet and Arrow IPC files may hold two columns of one name; which of them a name means is
    then undecided, so a column that is read must appear once (a duplicated column that is not
    read is left alone).

    Raises:
        SchemaError: ``<file>: column 'NAME' appears N times; rename or drop one``.
    """
    n = schema.get_all_field_indices(column)
    if len(n) > 1:
        raise SchemaError(f"{path}: column {column!r} appears {len(n)} times; rename or drop one")


def check_token_column(schema: pa.Schema, column: str, path: str) -> None:
    """Raise :class:`SchemaError` unless ``column`` is an integer list of any Arrow layout.

    Accepted: ``list``, ``large_list``, ``fixed_size_list``, ``list_view`` and
    ``large_list_view`` whose items are integers of any width (signed or not); the values
    themselves are range-checked when read.

    Raises:
        SchemaError: the column is missing (the message lists the available columns), appears
            more than once (:func:`check_single_column`) or has another type (string, float,
            nested lists, ...).
    """
    if column not in schema.names:
        raise missing_token_column(schema, column, path)
    check_single_column(schema, column, path)
    typ = schema.field(column).type
    if not is_integer_list(typ):
        found = [n for n in token_column_candidates(schema) if n != column]
        raise SchemaError(f"{path}: column {column!r} has type {typ}, expected a list of "
                          f"integer token ids (list<int32> or similar); "
                          f"{token_type_fix(typ, column, found)}")


def missing_token_column(schema: pa.Schema, column: str, where, option: str = "--column"
                         ) -> SchemaError:
    """The one line for token column ``column`` that ``schema`` lacks, naming the fix: the one
    list of integers there (:func:`token_column_candidates`: ``pass --column tokens``), else
    ``pass --column NAME``; a file of text and no list of integers is tokenized first.

    Args:
        schema: the columns there are (a file's, or the Python API's documents').
        column: the token column asked for.
        where: what the line names first (the file, or ``documents``).
        option: how the fix names the option: ``--column``, or the Python API's ``column=``
            (the name quoted).
    """
    keyword = option.endswith("=")
    avail = ", ".join(schema.names) or "(none)"
    found = token_column_candidates(schema)
    texts = text_columns(schema)
    if not found and texts:  # text to be tokenized: --column NAME would name no token ids
        return SchemaError(f"{where}: no column {column!r}; available columns: {avail}; it "
                           f"holds text ({', '.join(map(repr, texts[:3]))}), not token ids: "
                           + (_TOKENIZE_IT_FIRST if keyword else tokenize_first(texts[0])))
    return SchemaError(f"{where}: no column {column!r}; available columns: {avail}; "
                       f"{pass_token_column(schema, column, option)}")


def pass_token_column(schema: pa.Schema, column: str, option: str = "--column") -> str:
    """The fix naming the token column to read instead of ``column`` (missing, or holding
    something else: labels, a mask): ``pass --column input_ids`` when ``schema`` has
    ``input_ids`` as a list of integers, else the one other list of integers whose name says
    no mask or label (:func:`token_column_candidates`), else ``pass --column NAME``.
    ``option``: ``--column``, or the Python API's ``column=`` (the name quoted)."""
    keyword = option.endswith("=")
    found = [n for n in token_column_candidates(schema) if n != column]
    name = (DEFAULT_TOKEN_COLUMN if DEFAULT_TOKEN_COLUMN in found
            else found[0] if len(found) == 1 else None)
    if name is None:
        return f"pass {option}{'' if keyword else ' '}NAME"
    return f"pass {option}{name!r}" if keyword else f"pass {option} {name}"


#: The Python API's fix for text where token ids are read (the command line's:
#: :func:`tokenize_first`).
_TOKENIZE_IT_FIRST = "tokenize it first (your tokenizer, or packtool tokenize on a file of it)"


def token_type_fix(typ: pa.DataType, column: str, candidates=(), option: str = "--column",
                   holder: str = "this file") -> str:
    """The fix for a token column ``column`` of type ``typ`` that is no list of integers, by
    what it holds: a list of floats is cast to integers (how, with pyarrow); nested lists of
    integers are flattened to one list per document; another column that is a list of
    integers (``candidates``, :func:`token_column_candidates`) is named for ``option``; lists of
    the null type (Arrow's inference for lists all empty) are cast to integers first
    (``--column``, or the Python API's ``column=``); a string per document with none is text,
    tokenized first (:func:`tokenize_first`); any other type (one integer, bool, struct,
    bytes or decimal per document, lists of bools or strings) names ``option`` with no
    tokenize advice. ``holder``: what holds the columns, as the message names it (``this
    file``, ``these documents``)."""
    keyword = option.endswith("=")  # the Python API's column=, its value quoted

    def named(name: str) -> str:  # --column NAME, column='NAME'
        return f"{option}{name!r}" if keyword else f"{option} {name}"

    listed = ", ".join(candidates[:3]) + (", ..." if len(candidates) > 3 else "")
    if is_list_layout(typ) and pa.types.is_floating(typ.value_type):
        return (f"token ids are integers: cast the column first, e.g. with pyarrow: "
                f"t = t.set_column(t.schema.get_field_index({column!r}), {column!r}, "
                f"t[{column!r}].cast(pa.list_(pa.int32()))), then write t again")
    if is_list_layout(typ) and pa.types.is_null(typ.value_type):
        # what Arrow infers for lists that are all empty (or hold only nulls): no type to read
        return (f"{column!r} holds lists of the null type, which Arrow infers when every list "
                f"is empty or holds only nulls: write the column with an integer type, e.g. "
                f"with pyarrow: t = t.set_column(t.schema.get_field_index({column!r}), "
                f"{column!r}, t[{column!r}].cast(pa.list_(pa.int32()))), then write t again "
                f"(its empty documents are then skipped as empty)")
    if _nested_integer_lists(typ):
        other = (f", or pass {named(candidates[0])} (the lists of integers in {holder}: "
                 f"{listed})") if candidates else ""
        return (f"{column!r} holds lists of lists, not one list of token ids per document: "
                f"flatten each document's lists into one list of ids first{other}")
    if candidates:
        return (f"{column!r} holds {_held(typ)}, not token ids; the lists of integers in "
                f"{holder}: {listed}: pass {named(candidates[0])}")
    if _is_text(typ):
        return (tokenize_first(column) if not keyword else
                f"{column!r} holds text: {_TOKENIZE_IT_FIRST}")
    return (f"{column!r} holds {_held(typ)}, not one list of token ids per document, and no "
            f"column of {holder} holds one: pass {option}{'' if keyword else ' '}NAME")


def _nested_integer_lists(typ: pa.DataType) -> bool:
    """True for lists of lists (at any depth) whose innermost values are integers."""
    if not (is_list_layout(typ) and is_list_layout(typ.value_type)):
        return False
    while is_list_layout(typ):
        typ = typ.value_type
    return pa.types.is_integer(typ)


def _held(typ: pa.DataType) -> str:
    """What a column of ``typ`` holds, for a message: ``one int64 value per document``,
    ``lists of bool values``."""
    if is_list_layout(typ):
        return f"lists of {typ.value_type} values"
    return f"one {typ} value per document"


def _is_text(typ: pa.DataType) -> bool:
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return (pa.types.is_string(typ) or pa.types.is_large_string(typ)
            or pa.types.is_string_view(typ))


def text_columns(schema: pa.Schema) -> list[str]:
    """The string columns of ``schema`` (plain, large, view or dictionary-encoded), in schema
    order: text ``packtool tokenize`` can read."""
    return [f.name for f in schema if _is_text(f.type)]


def tokenize_first(text_column: str | None = None) -> str:
    """The one fix for text given where token ids are read: ``packtool tokenize`` into a
    tokenized output, then ``pack`` it (with ``--text-column`` when the text is not in
    ``text``)."""
    option = "" if text_column in (None, "text") else f" --text-column {text_column}"
    return (f"text is tokenized first: packtool tokenize --tokenizer FILE{option} INPUT "
            "TOKENIZED, then pack TOKENIZED")


def token_column_candidates(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` that may hold the token ids, in schema order: lists of
    integers (any layout) whose name does not say mask or label (:data:`MASK_LIKE`). One name:
    the obvious ``--column`` of a file without ``input_ids``; none or several: the user names
    it."""
    return [f.name for f in schema if is_integer_list(f.type) and not MASK_LIKE.search(f.name)]


def written_as_shard(loc) -> bool:
    """True when the Parquet file at ``loc`` is a packed shard packtool wrote at this very name:
    its footer's schema metadata names it (:data:`SHARD_META_KEY`). A name alone
    (``part-0.parquet``, what ``pyarrow.dataset.write_dataset`` writes too) proves nothing; a
    file that cannot be read as Parquet is not one. Reads only the footer."""
    import pyarrow.parquet as pq

    from packtool.errors import raise_if_shortage
    from packtool.formats.manifest import footer_of
    from packtool.location import Location

    loc = Location.parse(loc)
    try:
        with loc.open_input() as f:
            footer = footer_of(f, f.size())
        md = pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
    except (OSError, pa.ArrowException) as exc:  # a store's errors are OSErrors too
        raise_if_shortage(exc, loc.display)
        return False
    return (md.metadata or {}).get(SHARD_META_KEY) == loc.name.encode()
