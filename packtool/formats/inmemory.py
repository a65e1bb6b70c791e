"""In-memory data in and out of the pack pipeline: the pyarrow side of :mod:`packtool.api`.

In: a list of token sequences (or of row dicts), a ``pyarrow.Table`` or the Arrow batches of a
Hugging Face dataset are written, batch by batch, to one Arrow IPC file (uncompressed: the
cheapest file pyarrow writes and the reader memory-maps), which ``packtool pack`` then reads like
any INPUT. Out: the rows of a packed OUTPUT as Arrow, in manifest order, with the shards' schema,
decoded by the one reader of packed outputs (:class:`packtool.formats.packed.PackedOutput`) and
turned back into Arrow by :func:`packed_batches`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from packtool.errors import InputError, SchemaError, first_line, raise_if_shortage
from packtool.formats.manifest import IN_MEMORY_INPUT
from packtool.formats.schema import (is_integer_list, is_list_layout, missing_token_column,
                                     token_column_candidates, token_type_fix)

__all__ = ["streamed_tables", "INPUT_NAME", "INPUT_DESCRIPTION", "is_arrow_table", "table_from_list",
           "table_from_pandas", "table_to_pandas",
           "tables_from_dicts", "write_input", "packed_batches", "read_packed_table",
           "packed_arrow_schema"]

#: File name of the in-memory input once written (Arrow IPC file form).
INPUT_NAME = "documents.arrow"
#: How a manifest names that input: its temporary path is gone once the documents are packed.
INPUT_DESCRIPTION = IN_MEMORY_INPUT


def is_arrow_table(data) -> bool:
    """True for a ``pyarrow.Table`` or ``pyarrow.RecordBatch``."""
    return isinstance(data, (pa.Table, pa.RecordBatch))


def table_from_pandas(frame, column: str) -> pa.Table:
    """The Arrow table of a ``pandas.DataFrame``'s columns (its index is not a column).

    A column of NumPy integer arrays (or scalars) of several dtypes (``uint32`` beside
    ``int64``, which pyarrow will not mix) is one integer column, as in :func:`table_from_list`.

    Args:
        frame: the DataFrame; column: the token column's name (for messages).

    Raises:
        SchemaError: a column pyarrow cannot convert: the message names it and the first row
            (0-based position) whose values differ in type from the rows before, or a value
            beyond int64.
    """
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise_if_shortage(exc)
    else:
        typ = table.schema.field(column).type if column in table.schema.names else None
        if typ is not None and is_list_layout(typ) and frame[column].dtype == object and not (
                pa.types.is_integer(typ.value_type) or pa.types.is_null(typ.value_type)):
            # an object column of documents is typed as a whole (one float array makes every
            # row float): name the row that holds it, as a list of the documents does
            _refuse_non_integer(frame[column].tolist(), column, False, typ, 0)
        return table
    arrays = []
    for name in frame.columns:
        try:
            arrays.append(pa.Array.from_pandas(frame[name]))
            continue
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise_if_shortage(exc)
        values = [_tensor_as_array(v) for v in frame[name].tolist()]
        try:
            arrays.append(_arrow_column(values, str(name), column, 0))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise_if_shortage(exc)
            raise _column_error(values, str(name), column, exc, 0) from None
    return pa.Table.from_arrays(arrays, names=[str(n) for n in frame.columns])


def table_to_pandas(table: pa.Table):
    """A ``pandas.DataFrame`` of ``table``, one row per packed row; list columns hold NumPy
    arrays."""
    return table.to_pandas()


def table_from_list(data: list, column: str, first_row: int = 0) -> pa.Table:
    """One document per item: a sequence of token ids (list, tuple, NumPy array) or a mapping
    of columns (``{"input_ids": [...], "labels": [...]}``).

    The columns are the union of the mappings' keys, in the order first seen: a key missing
    from a mapping is null in that row, as in one Parquet file of those rows, so ``pack``'s
    null rules judge it (a mask column read is refused naming the row), never dropped.
    The column types are pyarrow's inference from the values, never a cast: NumPy arrays keep
    their dtype, Python ints become ``int64``, floats ``double``, bools ``bool``; NumPy integer
    data of several dtypes in one column (``uint32`` arrays beside ``int64`` ones, which pyarrow
    will not mix) becomes ``int64``, every value kept. So ``pack``'s
    own schema and token checks judge the documents as they judge a Parquet file of the same
    values: floats, bools, strings and nested lists are refused (``SchemaError``, not cut to
    integers), as are null, negative and beyond-int32 ids. All-empty or all-null tokens (no type
    to infer) keep pyarrow's null type; :func:`write_input` writes them as ``list<int64>``.

    Args:
        data: the documents.
        column: the token column's name (of the table made from sequences; the key holding
            the tokens in mappings).
        first_row: the row number of ``data[0]`` in messages (a batch of a longer stream).

    Returns:
        A table with ``column`` (sequences), or the mappings' columns.

    Raises:
        InputError: an empty list, or an item that is neither a sequence nor a mapping.
        SchemaError: items pyarrow cannot turn into one column (a float array beside integer
            ones, a string among ids, an id beyond int64, a 2-D array); the message names the
            first bad row.
    """
    if not data:
        raise InputError("no documents: the list is empty")
    mappings = isinstance(data[0], Mapping)
    # tensors (torch, JAX, TensorFlow) are documents as the NumPy arrays of their values
    data = [{k: _tensor_as_array(v) for k, v in d.items()} if isinstance(d, Mapping)
            else _tensor_as_array(d) for d in data]
    want = Mapping if mappings else (list, tuple, np.ndarray, type(None))
    bad = next((i for i, d in enumerate(data) if not isinstance(d, want)), None)
    if bad is not None:
        raise InputError(f"documents: item {bad} is of type {type(data[bad]).__name__}; give one "
                         "sequence of integer token ids (or one dict of columns) per document")
    try:
        if mappings:  # the union of the keys: one missing from a row is null there
            keys = dict.fromkeys(k for d in data for k in d)
            table = pa.Table.from_arrays(
                [_arrow_column([d.get(k) for d in data], k, column, first_row) for k in keys],
                names=list(keys))
            typ = table.schema.field(column).type if column in table.schema.names else None
            if typ is not None and is_list_layout(typ) and not (
                    pa.types.is_integer(typ.value_type) or pa.types.is_null(typ.value_type)):
                _refuse_non_integer(data, column, True, typ, first_row)
            return table
        # inferred: a Parquet file of these values has this type
        tokens = _arrow_column(data, column, column, first_row)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise_if_shortage(exc)
        raise _unconvertible(data, mappings, exc, column, first_row) from None
    if is_list_layout(tokens.type) and not (pa.types.is_integer(tokens.type.value_type)
                                            or pa.types.is_null(tokens.type.value_type)):
        _refuse_non_integer(data, column, False, tokens.type, first_row)
    return pa.table({column: tokens})


def tables_from_dicts(batches: Iterable[Mapping], column: str,
                      first_row: int = 0) -> Iterator[pa.Table]:
    """Tables from batches of Python values (``{column name: [one value per row]}``), each
    typed from its values as :func:`table_from_list` types a list of row dicts, rows numbered
    across the batches in messages: how a streamed dataset with no declared features is read
    (its own Arrow batches fail when one batch holds an empty document beside ids), and the
    batches a ``datasets.Dataset`` transform returns (lists, NumPy arrays or tensors).

    Args:
        first_row: the row number of the first batch's first row in messages.

    Raises:
        SchemaError, InputError: as :func:`table_from_list`, naming the row in the stream.
    """
    first = first_row
    for batch in batches:
        names = list(batch)
        cols = {k: plain_array(batch[k]) for k in names}
        n = len(cols[names[0]]) if names else 0
        if n:
            rows = [{k: plain_array(cols[k][i]) for k in names} for i in range(n)]
            yield table_from_list(rows, column, first)
        first += n


def _arrow_column(values: list, name: str, column: str, first_row: int):
    """``pa.array(values)``, one column's value per row, inferred; where pyarrow refuses to mix
    NumPy integer dtypes (``uint32`` and ``int64``, ``int8`` and ``uint16``: it mixes only some
    pairs), the values of :func:`_one_integer_type` instead: every integer dtype is one integer
    column, as the docs promise (``pack`` then checks the ids' range, naming the row).

    Raises:
        whatever ``pa.array`` raises for values that are not integers of several dtypes;
        SchemaError: a NumPy unsigned value beyond int64 (:func:`_beyond_int64_error`).
    """
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        widened = _one_integer_type(values, name, column, first_row)
        if widened is None:
            raise
    return pa.array(widened)


def _numpy_integer_types(v) -> set:
    """The NumPy integer dtypes in one row's value: an integer array's, an integer scalar's, or
    those of the integer scalars inside a list or tuple."""
    if isinstance(v, np.ndarray):
        return {v.dtype} if v.dtype.kind in "iu" else set()
    if isinstance(v, np.integer):
        return {v.dtype}
    if isinstance(v, (list, tuple)):
        return {x.dtype for x in v if isinstance(x, np.integer)}
    return set()


def _one_integer_type(values: list, name: str, column: str, first_row: int) -> list | None:
    """``values`` (one column's value per row) with NumPy integer data of several dtypes made
    one type pyarrow infers as ``int64``: integer arrays as ``int64`` arrays, integer scalars
    (alone or inside a list) as Python ints; None when the column holds fewer than two NumPy
    integer dtypes (nothing to make one).

    Raises:
        SchemaError: an unsigned value beyond int64, naming the row
            (:func:`_beyond_int64_error`).
    """
    kinds: set = set()
    for v in values:
        kinds |= _numpy_integer_types(v)
    if len(kinds) < 2:
        return None
    top = np.iinfo(np.int64).max

    def one(i, v):
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in "iu":
                return v
            if v.dtype == np.uint64 and v.size and int(v.max()) > top:
                raise _beyond_int64_error(name, column, first_row + i, int(v.max()))
            return v.astype(np.int64)
        if isinstance(v, np.integer):
            if int(v) > top:
                raise _beyond_int64_error(name, column, first_row + i, int(v))
            return int(v)
        if isinstance(v, (list, tuple)) and any(isinstance(x, np.integer) for x in v):
            big = next((int(x) for x in v if isinstance(x, np.integer) and int(x) > top), None)
            if big is not None:
                raise _beyond_int64_error(name, column, first_row + i, big)
            return [int(x) if isinstance(x, np.integer) else x for x in v]
        return v

    return [one(i, v) for i, v in enumerate(values)]


def _beyond_int64_error(name: str, column: str, row: int, value: int) -> SchemaError:
    """The one line for a value beyond int64 in a row of the documents (the token column: as
    ``pack`` names an id beyond int32)."""
    from packtool.errors import row_ref

    where = f"documents: {row_ref(row)}"
    if name == column:  # pack's own line for the id
        return SchemaError(f"{where}: token id {value} does not fit int32; packed input_ids "
                           "are int32 (vocabularies up to 2**31 - 1)")
    return SchemaError(f"{where}: value {value} of column {name!r} does not fit int64; give "
                       "values in range")


def _value_kind(v) -> str | None:
    """What a row's value is, for a message on values pyarrow cannot hold in one column:
    ``NumPy float64 array``, ``list``, ``int``...; None for a null."""
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return f"NumPy {v.dtype} array"
    if isinstance(v, np.generic):
        return f"NumPy {v.dtype}"
    return type(v).__name__


def _column_error(values: list, name: str, column: str, exc: Exception,
                  first_row: int) -> SchemaError:
    """The error for one column's values that convert row by row but not together: names the
    first row whose value is of another kind than the first row's (a float array after integer
    ones), never asking for what every row already is."""
    from packtool.errors import row_ref

    kinds = [_value_kind(v) for v in values]
    first = next((i for i, k in enumerate(kinds) if k is not None), None)
    other = None if first is None else next(
        (i for i in range(first + 1, len(kinds)) if kinds[i] not in (None, kinds[first])), None)
    if other is None:
        return SchemaError(f"documents: column {name!r} cannot be read as one Arrow column: "
                           f"{first_line(exc)}")
    what = "token ids" if name == column else "values"
    return SchemaError(
        f"documents: {row_ref(first_row + other)}: column {name!r} holds a {kinds[other]}, "
        f"{row_ref(first_row + first)} a {kinds[first]}, which cannot be one Arrow column "
        f"({first_line(exc)}); give the column's {what} one kind in every document")


def plain_array(value):
    """A tensor (torch, JAX, TensorFlow: what a ``datasets`` transform may return, or a
    document handed over as one; a torch tensor on a GPU is copied to the CPU) as the NumPy
    array of its values, its dtype kept; anything else unchanged."""
    if value is None or isinstance(value, (list, tuple, np.ndarray, np.generic, str, bytes,
                                           int, float, bool, Mapping)):
        return value
    if not hasattr(value, "__array__"):
        return value
    if callable(getattr(value, "detach", None)) and callable(getattr(value, "cpu", None)):
        value = value.detach().cpu()  # torch: no NumPy view of a GPU (or grad) tensor
    return np.asarray(value)


def _tensor_as_array(value):
    """A tensor (:func:`is_tensor`) as the NumPy array of its values (:func:`plain_array`);
    anything else, a DataFrame where a document belongs included, unchanged (for the
    messages to name)."""
    return plain_array(value) if is_tensor(value) else value


#: Packages whose arrays are tensors to :func:`is_tensor` (not tables or frames, which also
#: have ``__array__``).
_TENSOR_PACKAGES = ("torch", "jax", "jaxlib", "tensorflow", "cupy", "mlx")


def is_tensor(value) -> bool:
    """True for a tensor of torch, JAX, TensorFlow, CuPy or MLX: an array :func:`plain_array`
    makes the NumPy array of its values (a DataFrame, which has ``__array__`` too, is none)."""
    root = (type(value).__module__ or "").split(".")[0]
    return root in _TENSOR_PACKAGES and hasattr(value, "__array__")


def _non_integer_row(data: list, column: str, mappings: bool) -> int | None:
    """The first item whose token ids are not all integers (a float, bool, string or nested
    sequence among them; nulls are left to ``pack``'s own check), or None."""
    for i, d in enumerate(data):
        ids = d.get(column) if mappings else d
        if ids is None:
            continue
        if isinstance(ids, np.ndarray):
            if ids.size and ids.dtype.kind not in "iu":
                return i
            continue
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
            return i
        for x in ids:
            if x is not None and (isinstance(x, (bool, np.bool_))
                                  or not isinstance(x, (int, np.integer))):
                return i
    return None


def _refuse_non_integer(data: list, column: str, mappings: bool, typ, first_row: int) -> None:
    """Raise :func:`_type_error` for token ids that are not integers, naming the first row
    that holds one (or the first row at all when the scan finds none)."""
    row = _non_integer_row(data, column, mappings)
    raise _type_error(column, column, typ, None, first_row + (0 if row is None else row))


def _unconvertible(data: list, mappings: bool, exc: Exception, column: str,
                   first_row: int) -> SchemaError:
    """The error for items pyarrow cannot convert, naming the first row that fails alone, else
    the first row holding a token id that is not an integer (an all-bool or all-string row
    converts alone), else pyarrow's reason."""
    from packtool.errors import row_ref

    convert = (lambda d: pa.Table.from_pylist([d])) if mappings else (lambda d: pa.array([d]))
    for i, d in enumerate(data):
        try:
            convert(d)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as one:
            exc, where = one, f"documents: {row_ref(first_row + i)}"
            break
    else:
        row = _non_integer_row(data, column, mappings)
        if row is None:  # every row converts alone and holds integer ids: columns disagree
            keys = dict.fromkeys(k for d in data for k in d) if mappings else (column,)
            for k in keys:
                values = [d.get(k) for d in data] if mappings else data
                try:
                    _arrow_column(values, k, column, first_row)
                except (pa.ArrowException, TypeError, ValueError) as one:
                    return _column_error(values, k, column, one, first_row)
        where = "documents" if row is None else f"documents: {row_ref(first_row + row)}"
    if isinstance(exc, OverflowError):
        return SchemaError(f"{where}: a token id does not fit int64; packed input_ids are "
                           "int32 (vocabularies up to 2**31 - 1)")
    return SchemaError(f"{where}: {first_line(exc)}; give one sequence of integer token ids "
                       "(or one dict of columns) per document")


def _canonical_type(typ: pa.DataType, token: bool) -> pa.DataType:
    """The type a batch's column is written as, whatever width or layout its batch had: integer
    lists (list, large_list, fixed_size_list) and lists with no value at all become
    ``list<int64>``, integers ``int64`` (so batches of one dataset that pyarrow or a streaming
    dataset typed apart agree without cutting a value); a token column of nulls only is
    ``list<int64>``, one of any other type that is no list (an integer per document) is kept;
    anything else is kept for ``pack`` (or the check here) to judge."""
    layout = (pa.types.is_list(typ) or pa.types.is_large_list(typ)
              or pa.types.is_fixed_size_list(typ))
    if layout and (pa.types.is_integer(typ.value_type) or pa.types.is_null(typ.value_type)):
        return pa.list_(pa.int64())
    if token:  # one value per document is no token ids: kept for the check to name its type
        return pa.list_(pa.int64()) if pa.types.is_null(typ) else typ
    return pa.int64() if pa.types.is_integer(typ) else typ


def _first_valued(arr) -> int:
    """Index of the first entry of ``arr`` that is neither null nor an empty list (0 if none):
    the row whose values show a batch's type."""
    import pyarrow.compute as pc

    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if is_list_layout(arr.type) and not pa.types.is_list_view(arr.type) \
            and not pa.types.is_large_list_view(arr.type):
        valued = pc.fill_null(pc.greater(pc.list_value_length(arr), 0), False)
    else:
        valued = arr.is_valid()
    hits = np.flatnonzero(valued.to_numpy(zero_copy_only=False))
    return int(hits[0]) if hits.size else 0


def _first_telling(arr) -> int:
    """Index of the row of a token column that shows its type is no integer list: of a column
    of floating lists (typed as a whole: one float among integers makes every row float), the
    first holding a value with a fraction, an infinity or a NaN; else the first valued row
    (:func:`_first_valued`)."""
    import pyarrow.compute as pc

    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
            or pa.types.is_fixed_size_list(arr.type)) and pa.types.is_floating(
                arr.type.value_type):
        values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.float64)
        with np.errstate(invalid="ignore"):
            odd = np.flatnonzero(~np.isfinite(values) | (np.floor(values) != values))
        if odd.size:
            return int(pc.list_parent_indices(arr)[int(odd[0])].as_py())
    return _first_valued(arr)


def _canonical(b, column: str, first_row: int):
    """``b`` with each column cast to :func:`_canonical_type`.

    Raises:
        SchemaError: an id that does not fit int64 (the row is named), or a column that cannot
            be cast for another reason (named, with pyarrow's reason).
    """
    for i, f in enumerate(b.schema):
        want = _canonical_type(f.type, f.name == column)
        if want.equals(f.type):
            continue
        try:
            col = b.column(i).cast(want)
        except (pa.ArrowException, ValueError) as exc:
            raise_if_shortage(exc)
            bad = next(((r, _beyond_int64(v)) for r, v in enumerate(b.column(i).to_pylist())
                        if _beyond_int64(v) is not None), None)
            if bad is not None:  # an unsigned value beyond int64
                raise _beyond_int64_error(f.name, column, first_row + bad[0], bad[1]) from None
            raise SchemaError(f"documents: {_batch_ref(first_row)}: column {f.name!r} of type "
                              f"{f.type} could not be written as {want} "
                              f"({first_line(exc).rstrip(': ')}); give it as one list of "
                              "integers per document") from None
        b = b.set_column(i, pa.field(f.name, want), col)
    return b


def _beyond_int64(value) -> int | None:
    """The first integer beyond int64 in a row's value (an int or a list of them), or None."""
    values = value if isinstance(value, list) else [value]
    return next((v for v in values if v is not None and v > np.iinfo(np.int64).max), None)


def _batch_ref(first_row: int) -> str:
    """``"rows from 8 (0-based)"``: a batch of documents named by its first row."""
    return f"rows from {int(first_row)} (0-based)"


def _type_error(column: str, name: str, typ, before, row: int, schema=None) -> SchemaError:
    """One line for a batch column of a type the documents cannot be packed with (``schema``:
    the batch's, whose lists of integers the fix names)."""
    from packtool.errors import row_ref

    where = f"documents: {row_ref(row)}: column {name!r} has type {typ}"
    if name == column:  # pack's own line for such a file, with the row that shows the type
        found = [n for n in token_column_candidates(schema) if n != column] if schema else []
        return SchemaError(f"{where}, expected a list of integer token ids (list<int32> or "
                           f"similar); {token_type_fix(typ, column, found, 'column=', 'these documents')}")
    return SchemaError(f"{where}, the documents before it {before}; give every document the "
                       "same type in each column")


class _ContentDigest:
    """sha256 of the documents' content in the columns ``pack`` reads (their names, canonical
    types, values and nulls), the same however the rows were cut into batches: one running
    hash per column and part (lengths, validity, values), combined at the end with the written
    schema of those columns. Columns written but not read (an unused list column) are not in
    it: changing them changes no packed row."""

    def __init__(self, read) -> None:
        self._parts: dict[str, object] = {}
        self._read = read  #: name -> True for a column read

    def _feed(self, key: str, data: bytes) -> None:
        self._parts.setdefault(key, hashlib.sha256()).update(data)

    def _array(self, key: str, arr: pa.Array) -> None:
        self._feed(key + "/valid", arr.is_valid().to_numpy(zero_copy_only=False)
                   .astype(np.uint8).tobytes())
        typ = arr.type
        if is_list_layout(typ) and not (pa.types.is_list_view(typ)
                                        or pa.types.is_large_list_view(typ)):
            import pyarrow.compute as pc

            lengths = pc.fill_null(pc.list_value_length(arr), 0)
            self._feed(key + "/len", lengths.to_numpy(zero_copy_only=False)
                       .astype(np.int64).tobytes())
            self._array(key + "/item", pc.list_flatten(arr))
        elif pa.types.is_primitive(typ) and not pa.types.is_boolean(typ):
            self._feed(key + "/val", arr.fill_null(0).to_numpy(zero_copy_only=False).tobytes())
        else:  # strings, bools, the rest: their Python values, one line each
            for v in arr.to_pylist():
                self._feed(key + "/val", (repr(v) + "\n").encode())

    def update(self, b) -> None:
        """Add the rows of a batch (``RecordBatch`` or ``Table``) of the written schema."""
        for f in b.schema:
            if not self._read(f.name):
                continue
            col = b.column(f.name)
            chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
            for c in chunks:
                self._array(f.name, c)

    def hexdigest(self, schema: pa.Schema) -> str:
        """The digest of the rows added, whose columns are ``schema``'s."""
        self._feed("schema", "".join(f"{f.name}:{f.type}\n" for f in schema
                                     if self._read(f.name)).encode())
        total = hashlib.sha256()
        for key in sorted(self._parts):
            total.update(f"{key}={self._parts[key].hexdigest()};".encode())
        return total.hexdigest()


def _read_batch_error(exc: pa.ArrowException, rows: int) -> SchemaError:
    """A streamed batch whose rows pyarrow could not type as one batch."""
    raise_if_shortage(exc)
    reason = first_line(exc).rstrip(": ")
    return SchemaError(f"documents: the {_batch_ref(rows)} could not be read as one batch "
                       f"({reason}); give every document the same columns, of the same types")


def _conformed(b, schema: pa.Schema):
    """``b`` with ``schema``'s columns in its order: one ``b`` lacks is all null (the rows hold
    no such key), one of null type (no value) takes the schema's type."""
    cols = []
    for f in schema:
        if f.name in b.schema.names and b.schema.field(f.name).type.equals(f.type):
            cols.append(b.column(f.name))
        else:
            cols.append(pa.nulls(b.num_rows, f.type))
    return (pa.Table.from_arrays(cols, schema=schema) if isinstance(b, pa.Table)
            else pa.RecordBatch.from_arrays(cols, schema=schema))


def _widened(schema: pa.Schema, b, column: str, first_row: int) -> pa.Schema:
    """The union of ``schema`` (the file's so far) and batch ``b``'s columns: a column new in
    ``b`` is added at the end, one of null type so far takes ``b``'s type.

    Raises:
        SchemaError: a column of another type than the batches' before it (not null in either),
            naming the first row of ``b`` with a value of that type.
    """
    fields = list(schema)
    for f in b.schema:
        i = schema.get_field_index(f.name)
        if i < 0:
            fields.append(f)
        elif not f.type.equals(fields[i].type) and not pa.types.is_null(f.type):
            if not pa.types.is_null(fields[i].type):
                raise _type_error(column, f.name, f.type, fields[i].type,
                                  first_row + _first_valued(b.column(f.name)))
            fields[i] = f
    return pa.schema(fields)


def _copy_widened(old: str, new: str, schema: pa.Schema, digest: "_ContentDigest | None"):
    """An Arrow IPC file writer at ``new`` (left open, to go on writing) holding the rows of
    the file ``old`` with the wider ``schema`` (a column added, or typed at last: null in those
    rows), copied one batch at a time; ``old`` is removed. ``digest`` (fresh) gets every
    batch."""
    writer = pa.ipc.new_file(new, schema)
    try:
        with pa.memory_map(old) as src, pa.ipc.open_file(src) as reader:
            for i in range(reader.num_record_batches):
                rb = _conformed(reader.get_batch(i), schema)
                if digest is not None:
                    digest.update(rb)
                writer.write_batch(rb)
    except BaseException:
        writer.close()
        raise
    os.remove(old)
    return writer


def write_input(batches: Iterable, path: str | os.PathLike, column: str,
                named: Iterable[str] = (), fingerprint: bool = False) -> tuple[int, str | None]:
    """Write ``batches`` (``pyarrow.Table`` or ``RecordBatch``) to ``path`` as one Arrow IPC
    file, streaming: one batch in memory at a time.

    Kept: the token ``column``, the ``named`` columns that exist, and every other list column
    (a mask column ``pack`` may find by its default name); text and scalar columns are left out.
    The file's columns are the union of the batches' kept columns, as one table of all the
    rows would have them: a column a batch lacks is null in its rows, a column first seen in a
    later batch is null in the rows before it (the file is rewritten once with it), so
    ``pack``'s null rules judge a mask column that some documents lack, naming the row; no
    column is dropped. Integer columns are written as int64 (:func:`_canonical_type`): batches
    that a streaming dataset typed apart (``int32`` then ``int64``, empty lists first) agree,
    and no value is cut. A batch whose column has another type than the batches before it
    (floats after integers, say) is refused, never cast.

    Args:
        batches: the documents, in order.
        path: the file to write (its directory exists).
        column: the token column (in the first batch).
        named: columns named by an option or found under their default name (kept whatever
            their type: ``pack`` checks them).
        fingerprint: also compute the content digest.

    Returns:
        ``(rows written, content digest)``: with ``fingerprint``, a sha256 hex string of the
        names, types and values of the columns ``pack`` reads (``column`` and the ``named``
        ones present; not the other list columns written), independent of how the rows were
        batched (else None).

    Raises:
        SchemaError: the first batch has no ``column``; the token column is not a list of
            integers, or a column's type differs from the batches' before it (the message
            names the first row with a value of that type); an id beyond int64 (the row is
            named).
        InputError: no rows.
    """
    path = str(path)
    writer, schema, rows = None, None, 0
    current, copies = path, 0  # the file written; a widened copy goes on under another name
    named = set(named)

    def read(name: str) -> bool:  # a column pack reads: the digest covers these
        return name == column or name in named

    digest = _ContentDigest(read) if fingerprint else None
    it = iter(batches)
    try:
        while True:
            try:
                b = next(it)
            except StopIteration:
                break
            except pa.ArrowException as exc:  # a streamed batch whose rows are typed apart
                raise _read_batch_error(exc, rows) from None
            if schema is None and column not in b.schema.names:
                raise missing_token_column(b.schema, column, "documents", "column=")
            keep = [f.name for f in b.schema
                    if f.name == column or f.name in named or is_list_layout(f.type)]
            b = _canonical(b.select(keep), column, rows).replace_schema_metadata(None)
            if column in b.schema.names:
                typ = b.schema.field(column).type
                if not is_integer_list(typ) and b.num_rows:
                    raise _type_error(column, column, typ, None,
                                      rows + _first_telling(b.column(column)), b.schema)
            if writer is None:
                schema = b.schema
                writer = pa.ipc.new_file(path, schema)
            else:
                wider = _widened(schema, b, column, rows)
                if not wider.equals(schema):  # the rows so far get the column, null
                    writer.close()
                    writer = None
                    if digest is not None:
                        digest = _ContentDigest(read)
                    copies += 1
                    old, current = current, f"{path}.{copies}.tmp"
                    writer = _copy_widened(old, current, wider, digest)
                    schema = wider
                b = _conformed(b, schema)
            if digest is not None:
                digest.update(b)
            if isinstance(b, pa.Table):
                for rb in b.to_batches():
                    writer.write_batch(rb)
            else:
                writer.write_batch(b)
            rows += b.num_rows
        if writer is None or not rows:  # no batch, or only batches of no row
            raise InputError("no documents: the data holds no rows")
        writer.close()
        writer = None
        if current != path:
            os.replace(current, path)
    finally:
        if writer is not None:
            writer.close()
        if current != path and os.path.exists(current):  # a refused widened copy
            os.remove(current)
    return rows, None if digest is None else digest.hexdigest(schema)


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


def streamed_tables(data, column: str, batch_rows: int):
    """The Arrow batches (``pyarrow.Table``) of a ``datasets.IterableDataset`` with declared
    features, ``batch_rows`` rows each; from a batch
    ``datasets`` cannot make (rows whose keys differ: it concatenates per-row tables of other
    schemas), the rest of the stream as its Python rows (a key missing from a row null, as the
    features say), read again from the start and typed by
    :func:`~packtool.formats.inmemory.tables_from_dicts`, rows numbered on."""
    done = 0
    batches = data.with_format("arrow").iter(batch_size=batch_rows)
    while True:
        try:
            b = next(batches)
        except StopIteration:
            return
        except pa.ArrowException:
            break
        done += b.num_rows
        yield b
    yield from tables_from_dicts(_rows_after(data.iter(batch_size=batch_rows), done), column,
                                 first_row=done)


def _rows_after(batches, n: int):
    """Python batches (``{column: [values]}``) with their first ``n`` rows left out."""
    for batch in batches:
        size = len(next(iter(batch.values()))) if batch else 0
        if n >= size:
            n -= size
            continue
        yield {k: v[n:] for k, v in batch.items()} if n else batch
        n = 0
