"""Streaming reader of tokenized Parquet shards (one document per row, a list-of-int column).

Files are read row group by row group through ``ParquetFile.iter_batches``; no shard is ever
materialised as Python lists. Every value is checked on the way in (nulls, negative ids, ids
over int32) and errors name the file, the row and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packtool.errors import InputError, SchemaError
from packtool.formats.schema import check_token_column
from packtool.types import INT32_MAX

__all__ = ["InputFile", "TokenBatch", "discover_inputs", "open_input", "iter_token_batches"]


@dataclass(frozen=True)
class InputFile:
    """One input shard: its path, path relative to the INPUT it was found under, size in bytes."""

    path: Path
    rel: str
    bytes: int
    mtime_ns: int


@dataclass(frozen=True)
class TokenBatch:
    """Documents ``first_row .. first_row + len(lengths) - 1`` of one file."""

    first_row: int  #: row index in the file of the first document
    lengths: np.ndarray  #: int64[docs], tokens per document
    tokens: np.ndarray  #: int32[sum(lengths)], the documents' tokens back to back


def _is_data_file(p: Path) -> bool:
    return p.suffix.lower() == ".parquet" and not p.name.startswith((".", "_"))


def discover_inputs(inputs: list[str | os.PathLike]) -> list[InputFile]:
    """Expand INPUT paths into Parquet files.

    A file is taken as is; a directory is searched recursively for ``*.parquet`` (any case; names
    starting with ``.`` or ``_`` are skipped), taken in sorted relative-path order. The resulting order
    defines the global document index (file order, then row order).

    Raises:
        InputError: a path does not exist, a directory holds no Parquet file, or a file is
            given twice (directly or through a directory).
    """
    files: list[InputFile] = []
    for given in inputs:
        p = Path(given)
        if not p.exists():
            raise InputError(f"{p}: no such file or directory; check the INPUT path")
        if p.is_dir():
            found = sorted((q for q in p.rglob("*") if q.is_file() and _is_data_file(q)),
                           key=lambda q: q.relative_to(p).as_posix())
            if not found:
                raise InputError(f"{p}: directory holds no *.parquet file; point INPUT at the "
                                 "tokenized shards")
            for q in found:
                st = q.stat()
                files.append(InputFile(q, q.relative_to(p).as_posix(), st.st_size, st.st_mtime_ns))
        else:
            st = p.stat()
            files.append(InputFile(p, p.name, st.st_size, st.st_mtime_ns))
    seen: dict[Path, str] = {}
    for f in files:
        key = f.path.resolve()
        if key in seen:
            raise InputError(f"{f.path}: given twice (also as {seen[key]}); its documents would "
                             "be packed twice: list each input once")
        seen[key] = str(f.path)
    return files


def open_input(path: Path, column: str) -> pq.ParquetFile:
    """Open a Parquet file and check its token column.

    Raises:
        InputError: the file is empty, truncated or not Parquet.
        SchemaError: the token column is missing or not a list of integers.
    """
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        size = path.stat().st_size if path.exists() else 0
        what = "is empty (0 bytes)" if size == 0 else f"is not a readable Parquet file ({exc})"
        raise InputError(f"{path}: {what}; remove it or regenerate it") from None
    check_token_column(pf.schema_arrow, column, str(path))
    return pf


def _row_of_value(arr: pa.Array, value_index: int) -> int:
    """Row (within ``arr``) holding flat value ``value_index``."""
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    return int(np.searchsorted(np.cumsum(lengths), value_index, side="right"))


def iter_token_batches(path: Path, column: str, batch_rows: int = 8192,
                       row_groups: Sequence[int] | None = None) -> Iterator[TokenBatch]:
    """Stream one file's documents as :class:`TokenBatch` es.

    ``row_groups`` (ascending indices) restricts the read to those row groups; ``first_row``
    and error messages still count rows from the start of the file.

    Raises:
        InputError: the file cannot be read (the message names the row group).
        SchemaError: a null document, a null token, a negative id or an id over int32 (the message
            names the file and the row).
    """
    pf = open_input(path, column)
    groups = range(pf.num_row_groups) if row_groups is None else row_groups
    # shape: (num_row_groups + 1,), first row of each row group
    rg_start = np.cumsum([0] + [pf.metadata.row_group(i).num_rows
                                for i in range(pf.num_row_groups)])
    for rg in groups:
        row = int(rg_start[rg])
        try:
            batches = list(pf.iter_batches(batch_size=batch_rows, row_groups=[rg],
                                           columns=[column], use_threads=False))
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{path}: row group {rg} cannot be read ({exc}); the file is "
                             "damaged or truncated: regenerate it") from None
        for batch in batches:
            arr = batch.column(0)
            n = len(arr)
            if arr.null_count:
                bad = row + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                raise SchemaError(f"{path}: row {bad}: {column!r} is null; drop or fill null "
                                  "documents before packing")
            values = arr.flatten()
            if values.null_count:
                vi = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
                raise SchemaError(f"{path}: row {row + _row_of_value(arr, vi)}: a token id is "
                                  "null; fix the tokenizer output")
            flat = values.to_numpy(zero_copy_only=False)
            if flat.size:
                lo, hi = flat.min(), flat.max()
                if lo < 0:
                    vi = int(np.argmax(flat < 0))
                    raise SchemaError(f"{path}: row {row + _row_of_value(arr, vi)}: negative "
                                      f"token id {int(flat[vi])}; token ids must be >= 0")
                if hi > INT32_MAX:
                    vi = int(np.argmax(flat > INT32_MAX))
                    raise SchemaError(f"{path}: row {row + _row_of_value(arr, vi)}: token id "
                                      f"{int(flat[vi])} does not fit int32; packed input_ids are "
                                      "int32 (vocabularies up to 2**31 - 1)")
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
            yield TokenBatch(row, lengths, flat.astype(np.int32, copy=False))
            row += n
