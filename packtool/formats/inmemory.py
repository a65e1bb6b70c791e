"""In-memory data in and out of the pack pipeline: the pyarrow side of :mod:`packtool.api`.

In: a list of token sequences (or of row dicts), a ``pyarrow.Table`` or the Arrow batches of a
Hugging Face dataset are written, batch by batch, to one Arrow IPC file (uncompressed: the
cheapest file pyarrow writes and the reader memory-maps), which ``packtool pack`` then reads like
any INPUT. Out: the rows of a packed OUTPUT as Arrow, in manifest order, with the packed schema
(:func:`packtool.formats.schema.packed_schema`), read through the packed-output reader
(:func:`packed_batches`, the one function that reads them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from packtool.errors import InputError, SchemaError
from packtool.formats.schema import packed_schema

__all__ = ["INPUT_NAME", "is_arrow_table", "table_from_list", "write_input", "packed_batches",
           "read_packed_table", "packed_arrow_schema"]

#: File name of the in-memory input once written (Arrow IPC file form).
INPUT_NAME = "documents.arrow"


def is_arrow_table(data) -> bool:
    """True for a ``pyarrow.Table`` or ``pyarrow.RecordBatch``."""
    return isinstance(data, (pa.Table, pa.RecordBatch))


def table_from_list(data: list, column: str) -> pa.Table:
    """One document per item: a sequence of token ids (list, tuple, NumPy array) or a mapping
    of columns (``{"input_ids": [...], "labels": [...]}``).

    Returns:
        A table with ``column`` as ``list<int64>`` (sequences), or the mappings' columns.

    Raises:
        InputError: an empty list, or items pyarrow cannot turn into a table (the message names
            the first bad item).
    """
    if not data:
        raise InputError("no documents: the list is empty")
    try:
        if isinstance(data[0], Mapping):
            return pa.Table.from_pylist(list(data))
        values = [np.asarray(d).tolist() if isinstance(d, np.ndarray) else d for d in data]
        return pa.table({column: pa.array(values, pa.list_(pa.int64()))})
    except (pa.ArrowException, TypeError, ValueError) as exc:
        bad = next((i for i, d in enumerate(data)
                    if not isinstance(d, (Mapping, list, tuple, np.ndarray))), None)
        where = f"item {bad} is a {type(data[bad]).__name__}" if bad is not None else str(exc)
        raise InputError(f"documents: {where}; give one sequence of integer token ids (or one "
                         f"dict of columns) per document") from None


def _is_list(typ: pa.DataType) -> bool:
    return any(f(typ) for f in (pa.types.is_list, pa.types.is_large_list,
                                pa.types.is_fixed_size_list, pa.types.is_list_view,
                                pa.types.is_large_list_view))


def write_input(batches: Iterable, path: str | os.PathLike, column: str,
                named: Iterable[str] = ()) -> int:
    """Write ``batches`` (``pyarrow.Table`` or ``RecordBatch``) to ``path`` as one Arrow IPC
    file, streaming: one batch in memory at a time.

    Kept: the token ``column``, the ``named`` columns that exist, and every other list column
    (a mask column ``pack`` may find by its default name); text and scalar columns are left out.

    Args:
        batches: the documents, in order; every batch has the first batch's columns.
        path: the file to write (its directory exists).
        column: the token column.
        named: columns named by an option (kept whatever their type: ``pack`` checks them).

    Returns:
        Rows written.

    Raises:
        SchemaError: ``column`` is missing, or a batch's schema differs from the first batch's
            (the message names both).
        InputError: no rows.
    """
    writer, schema, keep, rows = None, None, None, 0
    try:
        for b in batches:
            if keep is None:
                if column not in b.schema.names:
                    raise SchemaError(f"documents: no column {column!r}; available columns: "
                                      f"{', '.join(b.schema.names)}; pass column=NAME")
                named = set(named)
                keep = [f.name for f in b.schema
                        if f.name == column or f.name in named or _is_list(f.type)]
            b = b.select(keep)
            if writer is None:
                schema = b.schema.remove_metadata()
                writer = pa.ipc.new_file(str(path), schema)
            elif not b.schema.remove_metadata().equals(schema):
                try:
                    b = b.cast(schema)
                except (pa.ArrowException, ValueError):
                    raise SchemaError(f"documents: a batch has schema {b.schema}, the first had "
                                      f"{schema}; give documents of one schema") from None
            if isinstance(b, pa.Table):
                for rb in b.to_batches():
                    writer.write_batch(rb)
            else:
                writer.write_batch(b)
            rows += b.num_rows
        if writer is None:
            raise InputError("no documents: the data holds no rows")
    finally:
        if writer is not None:
            writer.close()
    return rows


def packed_arrow_schema(out_dir: str | os.PathLike) -> pa.Schema:
    """The schema of a packed OUTPUT's shards (from its manifest's options)."""
    from packtool.formats.manifest import read_manifest

    opts = read_manifest(out_dir)["options"]
    return packed_schema(int(opts["capacity"]), str(opts.get("labels", "none")))


def _ragged(arrays: list, typ: pa.DataType, value_type: pa.DataType) -> pa.Array:
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)  # shape: (rows + 1,)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, value_type), type=typ)


def packed_batches(out_dir: str | os.PathLike) -> Iterator[pa.RecordBatch]:
    """Every row of a packed OUTPUT, in manifest order, as Arrow record batches of the packed
    schema (what the shards store; labels only when stored).

    Reads through :class:`packtool.formats.packed.PackedReader` (manifest and shards checked),
    a few row groups at a time.

    Raises:
        ManifestError: not a complete packed output.
    """
    from packtool.formats.packed import PackedReader

    reader = PackedReader(Path(out_dir))
    schema = packed_arrow_schema(out_dir)
    for block in reader.iter_blocks(schema.names):
        cols = []
        for f in schema:
            v = block.columns[f.name]
            if pa.types.is_fixed_size_list(f.type):
                flat = pa.array(np.ascontiguousarray(v, dtype=np.int32).reshape(-1))
                cols.append(pa.FixedSizeListArray.from_arrays(flat, type=f.type))
            elif pa.types.is_list(f.type):
                cols.append(_ragged(v, f.type, f.type.value_type))
            else:
                cols.append(pa.array(v, f.type))
        yield pa.RecordBatch.from_arrays(cols, schema=schema)


def read_packed_table(out_dir: str | os.PathLike) -> pa.Table:
    """All rows of a packed OUTPUT as one table (:func:`packed_batches`); zero rows keep the
    schema."""
    return pa.Table.from_batches(list(packed_batches(out_dir)),
                                 schema=packed_arrow_schema(out_dir))
