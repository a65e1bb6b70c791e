"""Packed shard writer: explicit schema, measured encodings, sha256 computed as the bytes go out.

Encodings and compression were chosen by measurement on real token ids (Tekken ids of source
code and docs: ``sample_data/`` and the 120 M-token corpus of ``scripts/make_corpus.py``;
``scripts/bench_format.py encodings`` reproduces the tables in docs/benchmarks.md, "Parquet
encodings of the output"). Bytes per packed token on the corpus, C = 2048, 1 MiB row groups:

- ``input_ids`` (and ``labels`` when stored): PLAIN + zstd level 3, 1.05 bytes/token. Real ids
  are not random: zstd finds the repeated byte patterns of frequent tokens, which
  DELTA_BINARY_PACKED destroys (differences of consecutive ids are as wide as the ids): DELTA +
  zstd 3 costs 1.99. zstd 1 is 6 % larger (1.11) for a similar write time; zstd 9 is 8 %
  smaller (0.97) but 3.6x slower to write; BYTE_STREAM_SPLIT 1.19, dictionary 1.46.
- ``position_ids``: DELTA_BINARY_PACKED + zstd (0.008; ramps become constant deltas; PLAIN
  0.053). ``doc_ids``: DELTA (0.0034 against 0.0040).
- ``segment_ids``, ``cu_seqlens``, ``doc_offsets``, ``max_seqlen``, ``num_targets``: PLAIN +
  zstd (0.0035, 0.0029, 0.0029, 0.0018, 0.0016; DELTA is equal or larger).

All structural columns together cost 0.024 bytes/token, 2.3 % of ``input_ids``.

``pack --compression lz4`` trades bytes for the reader's CPU: ``input_ids`` take about 1.45
bytes a token instead of about 1, and a training loader decodes a row in about 0.6x the CPU
(docs/benchmarks.md, "Training loader"); the encodings are the same.
BYTE_STREAM_SPLIT is not used (larger on ids, and not every reader decodes it for integers);
dictionary encoding is off (larger everywhere but ``doc_offsets``). All encodings are Parquet 2
standard ones.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.core.layout import PackedRows
from packtool.formats.manifest import footer_of

__all__ = ["rows_to_table", "write_shard", "shard_num_targets", "COLUMN_ENCODING",
           "column_encodings", "COMPRESSION", "COMPRESSION_LEVEL", "CODECS", "HashingFile",
           "WrittenShard"]

#: Parquet encoding of each column's values (top-level column name -> encoding); see above.
COLUMN_ENCODING = {
    "input_ids": "PLAIN",
    "labels": "PLAIN",
    "segment_ids": "PLAIN",
    "position_ids": "DELTA_BINARY_PACKED",
    "cu_seqlens": "PLAIN",
    "cu_seqlens_unpadded": "PLAIN",
    "max_seqlen": "PLAIN",
    "num_targets": "PLAIN",
    "doc_ids": "DELTA_BINARY_PACKED",
    "doc_offsets": "PLAIN",
    "source_ids": "PLAIN",
}
#: Parquet compression codec of every column (the default; see :data:`CODECS`).
COMPRESSION = "zstd"
#: zstd level (see the module docstring for the measurement).
COMPRESSION_LEVEL = 3
#: The codecs ``pack --compression`` offers -> their level (None: the codec has none). lz4 is
#: Parquet's ``LZ4_RAW``: larger files, cheaper to decode.
CODECS = {"zstd": COMPRESSION_LEVEL, "lz4": None}


def column_encodings(schema: pa.Schema) -> dict:
    """``column_encoding`` argument for ``pq.ParquetWriter``: keys are leaf column paths.

    pyarrow matches the keys against Parquet leaf paths and silently ignores a top-level name
    of a list column, so list columns (fixed-size ones included) are addressed as
    ``name.list.element``. A column of a packed column's name but of another type (a kept
    ``doc_ids`` column of strings in a tokenized shard) keeps pyarrow's default:
    ``DELTA_BINARY_PACKED`` takes 32- and 64-bit integers only.
    """
    out = {}
    for f in schema:
        if f.name in COLUMN_ENCODING:
            nested = pa.types.is_list(f.type) or pa.types.is_fixed_size_list(f.type)
            values = f.type.value_type if nested else f.type
            encoding = COLUMN_ENCODING[f.name]
            if encoding == "DELTA_BINARY_PACKED" and not (
                    pa.types.is_int32(values) or pa.types.is_int64(values)):
                continue
            out[f"{f.name}.list.element" if nested else f.name] = encoding
    return out


def _int_array(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    # zero-copy view of a contiguous NumPy buffer (``pa.array`` would also probe for pandas,
    # whose import costs a tenth of a CPU-second)
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(typ, values.size, [None, pa.py_buffer(values)])


def _fixed_lists(mat: np.ndarray, typ: pa.DataType) -> pa.Array:
    # no offsets: a fixed_size_list of n * C int32 values, zero-copy from the layout buffer
    return pa.FixedSizeListArray.from_arrays(_int_array(mat.reshape(-1), pa.int32()), type=typ)


def _ragged(values: np.ndarray, offsets: np.ndarray, typ: pa.DataType, value_type) -> pa.Array:
    # one entry per segment: at most rows * (C + 1) values per row group, far below 2**31
    values = values.astype(np.int64 if value_type == pa.int64() else np.int32, copy=False)
    return pa.ListArray.from_arrays(_int_array(offsets.astype(np.int32), pa.int32()),
                                    _int_array(values, value_type), type=typ)


def rows_to_table(rows: PackedRows, schema: pa.Schema) -> pa.Table:
    """Arrow table of packed rows with exactly ``schema`` (from :func:`packed_schema`).

    Raises:
        ValueError: ``schema`` asks for ``labels`` but ``rows`` has none.
    """
    if "labels" in schema.names and rows.labels is None:
        raise ValueError("the schema stores labels but the rows were laid out without them")
    if "source_ids" in schema.names and rows.source_ids is None:
        raise ValueError("the schema stores source_ids but the rows carry none")
    if "cu_seqlens_unpadded" in schema.names and rows.cu_unpadded_values is None:
        raise ValueError("the schema stores cu_seqlens_unpadded but the rows were laid out "
                         "without padded segments")
    cols = {
        "input_ids": lambda t: _fixed_lists(rows.input_ids, t),
        "segment_ids": lambda t: _fixed_lists(rows.segment_ids, t),
        "position_ids": lambda t: _fixed_lists(rows.position_ids, t),
        "labels": lambda t: _fixed_lists(rows.labels, t),
        "cu_seqlens": lambda t: _ragged(rows.cu_values, rows.cu_offsets, t, pa.int32()),
        "cu_seqlens_unpadded": lambda t: _ragged(rows.cu_unpadded_values, rows.cu_offsets, t,
                                                 pa.int32()),
        "max_seqlen": lambda t: _int_array(rows.max_seqlen.astype(np.int32, copy=False),
                                           pa.int32()),
        "num_targets": lambda t: _int_array(rows.num_targets.astype(np.int32, copy=False),
                                            pa.int32()),
        "doc_ids": lambda t: _ragged(rows.doc_ids, rows.seg_offsets, t, pa.int64()),
        "doc_offsets": lambda t: _ragged(rows.doc_offsets, rows.seg_offsets, t, pa.int64()),
        "source_ids": lambda t: _ragged(rows.source_ids, rows.seg_offsets, t, pa.int32()),
    }
    return pa.Table.from_arrays([cols[f.name](f.type) for f in schema], schema=schema)


class HashingFile:
    """A binary file opened for writing that hashes every byte written (sha256).

    The Parquet writer streams into it, so the shard's checksum is known when the last byte is
    written, without reading the file back. Only sequential writes are supported (``tell``
    reports the bytes written; there is no ``seek``).
    """

    def __init__(self, path: Path) -> None:
        self._f = open(path, "wb")
        self._h = hashlib.sha256()
        self._n = 0
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data)
        self._h.update(view)
        self._f.write(view)
        self._n += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._n

    def flush(self) -> None:
        self._f.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._f.fileno()

    def hexdigest(self) -> str:
        """sha256 of the bytes written so far, hex."""
        return self._h.hexdigest()

    def close(self) -> None:
        """Flush, fsync and close (idempotent)."""
        if not self.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self.closed = True


@dataclass(frozen=True)
class WrittenShard:
    """What :func:`write_shard` wrote: what the manifest records of the shard."""

    bytes: int  #: file size
    sha256: str  #: hex sha256 of the file, taken while writing
    footer_sha256: str  #: hex sha256 of its Parquet footer
    group_rows: tuple  #: rows of each row group, in order


def write_shard(path: Path, schema: pa.Schema, tables: Iterable[pa.Table], *,
                compression: str = COMPRESSION) -> WrittenShard:
    """Write ``tables`` (one row group each) to ``path``, a temporary name the caller publishes.

    ``compression``: a codec of :data:`CODECS` (every column; zstd at level 3, lz4 without
    a level).

    Parquet page checksums are written (readers verify every page: a changed byte is refused).
    The file is fsynced; its sha256 is computed as the bytes go out (no second pass), its footer
    read back from the file's end.

    Raises:
        OSError: ``path`` cannot be written (a full disk: ``ENOSPC``).
        ValueError: a codec not in :data:`CODECS`.
    """
    if compression not in CODECS:
        raise ValueError(f"compression {compression!r}: choose one of {', '.join(CODECS)}")
    sink = HashingFile(path)
    groups = []
    try:
        with pq.ParquetWriter(sink, schema, compression=compression,
                              compression_level=CODECS[compression], use_dictionary=False,
                              column_encoding=column_encodings(schema),
                              write_statistics=False, write_page_checksum=True) as w:
            for table in tables:
                w.write_table(table, row_group_size=max(1, table.num_rows))
                groups.append(table.num_rows)
    finally:
        sink.close()
    with pa.OSFile(str(path), "r") as f:
        footer = footer_of(f, sink.tell())
    return WrittenShard(sink.tell(), sink.hexdigest(), hashlib.sha256(footer).hexdigest(),
                        tuple(groups))


def shard_num_targets(location) -> int:
    """Effective targets of a written shard: the sum of its ``num_targets`` column (a shard kept
    from an interrupted pack, when the totals must count input label masks).

    Args:
        location: the shard (a local path or a URI: :class:`packtool.location.Location`).

    Raises:
        OSError: the shard cannot be read.
    """
    from packtool.location import Location

    with Location.parse(location).open_input() as f:
        col = pq.read_table(f, columns=["num_targets"]).column(0)
    total = 0
    for c in col.chunks:
        vals = np.frombuffer(c.buffers()[1], dtype=np.int32)[c.offset:c.offset + len(c)]
        total += int(vals.sum(dtype=np.int64))
    return total
