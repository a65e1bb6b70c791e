"""Input and packed Arrow schemas, in one place."""

from __future__ import annotations

import pyarrow as pa

from packtool.errors import SchemaError

__all__ = ["packed_schema", "check_token_column", "is_integer_list", "LABELS_META_KEY",
           "CAPACITY_META_KEY"]

LABELS_META_KEY = b"packtool.labels"
CAPACITY_META_KEY = b"packtool.capacity"


def packed_schema(capacity: int, labels: str) -> pa.Schema:
    """The schema of a packed shard (see README, "Output contract").

    Per-token columns are ``list<int32>`` of exactly ``capacity`` items; ``labels`` is omitted
    when ``labels == "none"``. Schema metadata records the capacity and the label convention
    (``unshifted``: the model shifts; ``shifted``: already shifted), so no reader shifts twice.
    """
    tok = pa.list_(pa.field("item", pa.int32(), nullable=False))
    fields = [
        pa.field("input_ids", tok, nullable=False),
        pa.field("segment_ids", tok, nullable=False),
        pa.field("position_ids", tok, nullable=False),
    ]
    if labels != "none":
        fields.append(pa.field("labels", tok, nullable=False))
    fields += [
        pa.field("cu_seqlens", tok, nullable=False),
        pa.field("max_seqlen", pa.int32(), nullable=False),
        pa.field("num_targets", pa.int32(), nullable=False),
        pa.field("doc_ids", pa.list_(pa.field("item", pa.int64(), nullable=False)), nullable=False),
        pa.field("doc_offsets", pa.list_(pa.field("item", pa.int64(), nullable=False)),
                 nullable=False),
    ]
    meta = {LABELS_META_KEY: labels.encode(), CAPACITY_META_KEY: str(capacity).encode()}
    return pa.schema(fields, metadata=meta)


def is_integer_list(typ: pa.DataType) -> bool:
    """True for a list of integers in any Arrow list layout (see :func:`check_token_column`)."""
    layouts = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list,
               pa.types.is_list_view, pa.types.is_large_list_view)
    return any(f(typ) for f in layouts) and pa.types.is_integer(typ.value_type)


def check_token_column(schema: pa.Schema, column: str, path: str) -> None:
    """Raise :class:`SchemaError` unless ``column`` is an integer list of any Arrow layout.

    Accepted: ``list``, ``large_list``, ``fixed_size_list``, ``list_view`` and
    ``large_list_view`` whose items are integers of any width (signed or not); the values
    themselves are range-checked when read.

    Raises:
        SchemaError: the column is missing (the message lists the available columns) or has
            another type (string, float, nested lists, ...).
    """
    if column not in schema.names:
        avail = ", ".join(schema.names) or "(none)"
        raise SchemaError(
            f"{path}: no column {column!r}; available columns: {avail}; pass --column NAME")
    typ = schema.field(column).type
    ok = is_integer_list(typ)
    if not ok:
        raise SchemaError(
            f"{path}: column {column!r} has type {typ}, expected a list of integer token ids "
            "(list<int32> or similar); tokenize the text first or pass --column NAME")
