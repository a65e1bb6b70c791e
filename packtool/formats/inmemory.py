"""In-memory data in and out of the pack pipeline: the pyarrow side of :mod:`packtool.api`.

In: a list of token sequences (or of row dicts), a ``pyarrow.Table`` or the Arrow batches of a
Hugging Face dataset are written, batch by batch, to one Arrow IPC file (uncompressed: the
cheapest file pyarrow writes and the reader memory-maps), which ``packtool pack`` then reads like
any INPUT. Out: the rows of a packed OUTPUT as Arrow, in manifest order, with the shards' schema,
decoded by the one reader of packed outputs (:class:`packtool.formats.packed.PackedOutput`) and
turned back into Arrow by :func:`packed_batches`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from packtool.errors import InputError, SchemaError, raise_if_shortage

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

    The column types are pyarrow's inference from the values, never a cast: NumPy arrays keep
    their dtype, Python ints become ``int64``, floats ``double``, bools ``bool``. So ``pack``'s
    own schema and token checks judge the documents as they judge a Parquet file of the same
    values: floats, bools, strings and nested lists are refused (``SchemaError``, not cut to
    integers), as are null, negative and beyond-int32 ids. Only all-empty or all-null tokens
    (no type to infer) are taken as ``list<int64>``.

    Returns:
        A table with ``column`` (sequences), or the mappings' columns.

    Raises:
        InputError: an empty list, or an item that is neither a sequence nor a mapping.
        SchemaError: items pyarrow cannot turn into one column (mixed types, a string among
            ids, an id beyond int64, a 2-D array); the message names the first bad row.
    """
    if not data:
        raise InputError("no documents: the list is empty")
    mappings = isinstance(data[0], Mapping)
    want = Mapping if mappings else (list, tuple, np.ndarray, type(None))
    bad = next((i for i, d in enumerate(data) if not isinstance(d, want)), None)
    if bad is not None:
        raise InputError(f"documents: item {bad} is of type {type(data[bad]).__name__}; give one "
                         "sequence of integer token ids (or one dict of columns) per document")
    try:
        if mappings:
            return pa.Table.from_pylist(list(data))
        tokens = pa.array(data)  # inferred: a Parquet file of these values has this type
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise_if_shortage(exc)
        raise _unconvertible(data, mappings, exc) from None
    if pa.types.is_null(tokens.type) or (pa.types.is_list(tokens.type)
                                         and pa.types.is_null(tokens.type.value_type)):
        tokens = tokens.cast(pa.list_(pa.int64()))  # no id anywhere: nothing to judge
    return pa.table({column: tokens})


def _unconvertible(data: list, mappings: bool, exc: Exception) -> SchemaError:
    """The error for items pyarrow cannot convert, naming the first row that fails alone (or
    pyarrow's reason when only the mix fails)."""
    from packtool.errors import row_ref

    convert = (lambda d: pa.Table.from_pylist([d])) if mappings else (lambda d: pa.array([d]))
    for i, d in enumerate(data):
        try:
            convert(d)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as one:
            exc, where = one, f"documents: {row_ref(i)}"
            break
    else:
        where = "documents"
    if isinstance(exc, OverflowError):
        return SchemaError(f"{where}: a token id does not fit int64; packed input_ids are "
                           "int32 (vocabularies up to 2**31 - 1)")
    return SchemaError(f"{where}: {exc}; give one sequence of integer token ids (or one dict "
                       "of columns) per document")


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


def packed_arrow_schema(out_dir) -> pa.Schema:
    """The schema of a packed OUTPUT's shards (path or URI), as its manifest records it, with its
    ``packtool.*`` metadata (:data:`~packtool.formats.schema.LABELS_CONVENTION_META_KEY` names the
    convention of the stored labels).

    Raises:
        ManifestError: not a complete packed output.
    """
    from packtool.formats.manifest import read_manifest_and_schema, require_packed

    manifest, schema = read_manifest_and_schema(out_dir)
    require_packed(manifest, str(out_dir))
    return schema


def _ragged(values: np.ndarray, offsets: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets, dtype=np.int32)),
                                    pa.array(values, typ.value_type), type=typ)


def packed_batches(out_dir, groups=None) -> Iterator[pa.RecordBatch]:
    """Every row of a packed OUTPUT, in manifest order, as Arrow record batches of the shards'
    schema (what the shards store; ``labels`` only when stored, in the convention the manifest
    records: ``PackedOutput.labels.convention``). ``groups``: only these row groups (numbered
    over the output, in the order given); None: all of them.

    Reads through :class:`packtool.formats.packed.PackedOutput` (the one reader: manifest,
    footers and page checksums checked), one row group per batch.

    Raises:
        ManifestError: not a complete packed output, or a shard that differs from it.
    """
    from packtool.formats.packed import PackedOutput

    reader = PackedOutput.open(out_dir)
    schema = reader.schema
    try:
        for block in (reader.iter_blocks(schema.names) if groups is None
                      else reader.iter_groups(list(groups), schema.names)):
            cols = []
            for f in schema:
                if f.name in block.tokens:  # int32[R, C]
                    flat = pa.array(np.ascontiguousarray(block.tokens[f.name],
                                                         dtype=np.int32).reshape(-1))
                    cols.append(pa.FixedSizeListArray.from_arrays(flat, type=f.type))
                elif f.name in block.ragged:
                    cols.append(_ragged(*block.ragged[f.name], f.type))
                else:
                    cols.append(pa.array(block.scalars[f.name], f.type))
            yield pa.RecordBatch.from_arrays(cols, schema=schema)
    finally:
        reader.close()


def read_packed_table(out_dir) -> pa.Table:
    """All rows of a packed OUTPUT as one table (:func:`packed_batches`); zero rows keep the
    schema."""
    schema = packed_arrow_schema(out_dir)
    batches = list(packed_batches(out_dir))
    # no batches: one empty chunk per column (a column of no chunks is refused by some readers,
    # Hugging Face's Dataset among them)
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
