"""Packed shard writer: explicit schema, zstd, temporary name then ``os.replace``.

Encodings are chosen per column: ``segment_ids`` and ``position_ids`` are long runs and ramps,
so they use DELTA_BINARY_PACKED (a ramp 0,1,2,... costs almost nothing); token and label columns
keep plain encoding + zstd (token ids are high-entropy, dictionaries would only cost time).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.core.layout import PackedRows

__all__ = ["rows_to_table", "write_shard", "COLUMN_ENCODING"]

COLUMN_ENCODING = {
    "segment_ids": "DELTA_BINARY_PACKED",
    "position_ids": "DELTA_BINARY_PACKED",
    "cu_seqlens": "DELTA_BINARY_PACKED",
    "doc_ids": "DELTA_BINARY_PACKED",
    "doc_offsets": "DELTA_BINARY_PACKED",
}


def _fixed_lists(mat: np.ndarray, typ: pa.DataType) -> pa.Array:
    n, c = mat.shape
    offsets = pa.array(np.arange(0, (n + 1) * c, c, dtype=np.int32), pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array(mat.reshape(-1), pa.int32())).cast(typ)


def _ragged(values: np.ndarray, offsets: np.ndarray, typ: pa.DataType, value_type) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()),
                                    pa.array(values, value_type)).cast(typ)


def rows_to_table(rows: PackedRows, schema: pa.Schema) -> pa.Table:
    """Arrow table of packed rows with exactly ``schema`` (from :func:`packed_schema`)."""
    cols = {
        "input_ids": lambda t: _fixed_lists(rows.input_ids, t),
        "segment_ids": lambda t: _fixed_lists(rows.segment_ids, t),
        "position_ids": lambda t: _fixed_lists(rows.position_ids, t),
        "labels": lambda t: _fixed_lists(rows.labels, t),
        "cu_seqlens": lambda t: _ragged(rows.cu_values, rows.cu_offsets, t, pa.int32()),
        "max_seqlen": lambda t: pa.array(rows.max_seqlen, pa.int32()),
        "num_targets": lambda t: pa.array(rows.num_targets, pa.int32()),
        "doc_ids": lambda t: _ragged(rows.doc_ids, rows.seg_offsets, t, pa.int64()),
        "doc_offsets": lambda t: _ragged(rows.doc_offsets, rows.seg_offsets, t, pa.int64()),
    }
    return pa.Table.from_arrays([cols[f.name](f.type) for f in schema], schema=schema)


def write_shard(path: Path, schema: pa.Schema, tables: Iterable[pa.Table]) -> int:
    """Write ``tables`` (one row group each) to ``path`` atomically; return the size in bytes.

    The data goes to ``.<name>.tmp`` beside ``path``, is fsynced, then renamed, so a crash never
    leaves a half-written file under the final name.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    enc = {k: v for k, v in COLUMN_ENCODING.items() if k in schema.names}
    with pq.ParquetWriter(tmp, schema, compression="zstd", use_dictionary=False,
                          column_encoding=enc, write_statistics=False) as w:
        for table in tables:
            w.write_table(table, row_group_size=max(1, table.num_rows))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path.stat().st_size
