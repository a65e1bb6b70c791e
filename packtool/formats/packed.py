"""Reading a packed OUTPUT directory (the output contract of ``packtool pack``).

:class:`PackedReader` opens the directory through :func:`load_manifest` (which refuses missing,
edited or extra shards), then reads shards row group by row group, so random access to row ``i``
costs one row group in memory, never a whole shard. Columns come back as NumPy arrays:
per-token columns as ``int32[rows, C]``, ragged columns (``cu_seqlens``, ``doc_ids``,
``doc_offsets``) as a list of 1-D arrays, scalar columns as ``int32[rows]``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.errors import ManifestError
from packtool.formats.manifest import load_manifest
from packtool.formats.schema import (RAGGED_COLUMNS, SCALAR_COLUMNS, TOKEN_COLUMNS,
                                     labels_convention)
from packtool.types import IGNORE_INDEX

__all__ = ["PackedReader", "RowGroupBlock", "READAHEAD_GROUPS", "TOKEN_COLUMNS", "RAGGED_COLUMNS",
           "SCALAR_COLUMNS", "derive_labels"]


#: Row groups read in one call when rows are read in order (``iter_blocks``, or ``read_row`` on
#: the row group right after the cached block): about 8 MiB of per-token data at the default
#: ``--row-group-mb``, which amortises pyarrow's per-call cost; a random row still decodes its
#: one row group only.
READAHEAD_GROUPS = 8


def derive_labels(input_ids: np.ndarray, segment_ids: np.ndarray,
                  convention: str = "unshifted") -> np.ndarray:
    """Labels of packed rows from their tokens and segments (the output contract's rule).

    What ``--labels unshifted|shifted`` would have stored; readers call it for outputs packed
    with ``--labels none`` (the default).

    Args:
        input_ids: int[..., C] tokens of one row or of a block of rows.
        segment_ids: int[..., C], same shape, 0 = padding.
        convention: ``unshifted`` (the token, except -100 at each segment's first token and on
            padding; the model shifts) or ``shifted`` (``input_ids[i + 1]`` inside the same
            segment, else -100).

    Returns:
        int32[..., C], ``IGNORE_INDEX`` (-100) where nothing is predicted.

    Raises:
        ValueError: shapes differ or an unknown convention.
    """
    ids = np.asarray(input_ids)
    seg = np.asarray(segment_ids)
    if ids.shape != seg.shape or ids.ndim == 0:
        raise ValueError(f"input_ids {ids.shape} and segment_ids {seg.shape} must have one shape")
    same = np.zeros(seg.shape, dtype=bool)  # same[..., i]: token i continues token i-1's segment
    same[..., 1:] = (seg[..., 1:] == seg[..., :-1]) & (seg[..., 1:] != 0)
    out = np.full(ids.shape, IGNORE_INDEX, dtype=np.int32)
    if convention == "unshifted":
        np.copyto(out, ids, where=same, casting="unsafe")
    elif convention == "shifted":
        np.copyto(out[..., :-1], ids[..., 1:], where=same[..., 1:], casting="unsafe")
    else:
        raise ValueError(f"labels convention {convention!r}: choose unshifted or shifted")
    return out


@dataclass(frozen=True)
class RowGroupBlock:
    """Rows ``first_row .. first_row + num_rows - 1`` of one shard, as NumPy columns."""

    shard: str  #: shard file name (``part-00000.parquet``)
    first_row: int  #: row index inside the shard of the block's first row
    global_first_row: int  #: row index over the whole output (shards in manifest order)
    columns: dict  #: name -> int32[rows, C] | list[np.ndarray] | int32[rows]

    @property
    def num_rows(self) -> int:
        for v in self.columns.values():
            return len(v)
        return 0


def _to_numpy(name: str, arr: pa.ChunkedArray | pa.Array, capacity: int):
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if name in TOKEN_COLUMNS:
        flat = arr.flatten().to_numpy(zero_copy_only=False)  # fixed_size_list: no offsets
        if flat.size != len(arr) * capacity:
            raise ManifestError(f"column {name!r} has {flat.size} values for {len(arr)} rows of "
                                f"capacity {capacity}; the shard breaks the output contract")
        return flat.reshape(len(arr), capacity)  # shape: (rows, C)
    if name in RAGGED_COLUMNS:
        flat = arr.flatten().to_numpy(zero_copy_only=False)
        offsets = arr.offsets.to_numpy() - arr.offsets[0].as_py()
        return [flat[offsets[i]:offsets[i + 1]] for i in range(len(arr))]
    return arr.to_numpy(zero_copy_only=False)  # shape: (rows,)


class PackedReader:
    """A packed output directory: its manifest, shards, rows and columns.

    Args:
        path: the OUTPUT directory of ``packtool pack``.
        check_hashes: also compare each shard's sha256 with the manifest (reads every byte).

    Raises:
        ManifestError: no manifest, an edited/missing/extra shard (see
            :func:`~packtool.formats.manifest.load_manifest`), or a shard whose row count
            differs from the manifest.
    """

    def __init__(self, path: str | os.PathLike, *, check_hashes: bool = False) -> None:
        self.path = Path(path)
        self.manifest = load_manifest(self.path, check_hashes=check_hashes)
        opts = self.manifest.get("options", {})
        self.capacity: int = int(opts["capacity"])
        #: the ``--labels`` option: ``unshifted`` | ``shifted`` | ``none`` (not stored)
        self.labels_mode: str = str(opts.get("labels", "unshifted"))
        #: convention of the labels this reader returns (stored, or derived when not stored)
        self.labels_convention: str = labels_convention(self.labels_mode)
        self.shards: list[str] = [o["file"] for o in self.manifest["outputs"]]
        self._files: dict[str, pq.ParquetFile] = {}
        self._pid = os.getpid()
        self._cache: tuple | None = None  # (shard, first group, end group, columns key, block)
        # per shard: row offset of each row group, shape (num_row_groups + 1,)
        self._rg_offsets: list[np.ndarray] = []
        rows = []
        for o in self.manifest["outputs"]:
            md = self._file(o["file"]).metadata
            n = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
            self._rg_offsets.append(np.concatenate([[0], np.cumsum(n, dtype=np.int64)]))
            if md.num_rows != o["rows"]:
                raise ManifestError(f"{self.path / o['file']}: {md.num_rows} rows, manifest says "
                                    f"{o['rows']}; rerun the same packtool pack with --overwrite")
            rows.append(md.num_rows)
        # global row offset of each shard, shape (num_shards + 1,)
        self.shard_offsets = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._cache: tuple | None = None  # (shard, first group, end group, columns key, block)

    def _file(self, name: str) -> pq.ParquetFile:
        if self._pid != os.getpid():  # a DataLoader worker after fork: open its own handles
            self._files, self._cache, self._pid = {}, None, os.getpid()
        f = self._files.get(name)
        if f is None:
            f = self._files[name] = pq.ParquetFile(self.path / name)
        return f

    @property
    def columns(self) -> list[str]:
        """Column names stored in the shards (``labels`` only when packed with
        ``--labels unshifted|shifted``; it can still be requested, see :meth:`read_row`)."""
        if not self.shards:
            return []
        return list(self._file(self.shards[0]).schema_arrow.names)

    def _table_columns(self, name: str, groups: Sequence[int], columns: Sequence[str]) -> dict:
        """Read ``columns`` of the consecutive row groups ``groups`` of shard ``name`` as NumPy,
        deriving ``labels`` from ``input_ids`` and ``segment_ids`` when not stored."""
        stored = set(self.columns)
        derive = "labels" in columns and "labels" not in stored
        want = [c for c in columns if c in stored]
        if derive:
            want += [c for c in ("input_ids", "segment_ids") if c not in want]
        f = self._file(name)
        # one thread: a row group is a few MB, and pyarrow's column threads cost more than they
        # save at that size (and contend with DataLoader workers)
        table = f.read_row_groups(list(groups), columns=want, use_threads=False)
        cols = {c: _to_numpy(c, table.column(c), self.capacity) for c in want}
        if derive:
            cols["labels"] = derive_labels(cols["input_ids"], cols["segment_ids"],
                                           self.labels_convention)
        return {c: cols[c] for c in columns}

    def __len__(self) -> int:
        return int(self.shard_offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """(shard index, row inside that shard) of global row ``index``.

        Raises:
            IndexError: ``index`` outside ``0 .. len(self) - 1`` (negative indices count from the
                end).
        """
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"row {index} out of range for {n} rows in {self.path}")
        s = int(np.searchsorted(self.shard_offsets, index, side="right") - 1)
        return s, int(index - self.shard_offsets[s])

    def _read_group(self, s: int, g: int, columns: Sequence[str]) -> RowGroupBlock:
        """The block holding row group ``g`` of shard ``s``: the cached one, or a fresh read of
        ``g`` alone (random access) or of ``g`` and up to :data:`READAHEAD_GROUPS` - 1 groups
        after it when the previous block ended right before ``g`` (sequential reads)."""
        key = tuple(columns)
        c = self._cache
        if c is not None and c[0] == s and c[1] <= g < c[2] and c[3] == key:
            return c[4]
        ng = len(self._rg_offsets[s]) - 1
        sequential = c is not None and c[0] == s and c[2] == g and c[3] == key
        hi = min(ng, g + READAHEAD_GROUPS) if sequential else g + 1
        name = self.shards[s]
        cols = self._table_columns(name, range(g, hi), columns)
        first = int(self._rg_offsets[s][g])
        block = RowGroupBlock(name, first, int(self.shard_offsets[s]) + first, cols)
        self._cache = (s, g, hi, key, block)
        return block

    def _resolve(self, columns: Sequence[str] | None) -> list[str]:
        have = self.columns
        if columns is None:
            return have
        derivable = {"labels"} if {"input_ids", "segment_ids"} <= set(have) else set()
        missing = [c for c in columns if c not in have and c not in derivable]
        if missing:
            raise ManifestError(f"{self.path}: shards have no column(s) {missing}; available: "
                                f"{', '.join(have)}")
        return list(columns)

    def read_row(self, index: int, columns: Sequence[str] | None = None) -> dict:
        """Row ``index`` (global, shards in manifest order) as a dict of NumPy values.

        Reads (and caches) only the row group holding the row. Per-token columns are
        ``int32[C]``, ragged ones 1-D arrays (``cu_seqlens`` int32, ``doc_ids``/``doc_offsets``
        int64), scalars Python ints. Extra keys: ``shard`` (file name), ``row`` (row inside the
        shard), ``index`` (global row). ``columns=None`` means the stored columns; ``labels`` may
        be requested from an output packed with ``--labels none``: it is then derived
        (:func:`derive_labels`, convention :attr:`labels_convention`).

        Raises:
            IndexError: ``index`` out of range.
            ManifestError: a requested column is not in the shards (and not derivable).
        """
        cols = self._resolve(columns)
        s, r = self.locate(index)
        g = int(np.searchsorted(self._rg_offsets[s], r, side="right") - 1)
        block = self._read_group(s, g, cols)
        i = r - block.first_row
        out = {}
        for c in cols:
            v = block.columns[c][i]
            out[c] = int(v) if c in SCALAR_COLUMNS else v
        out.update(shard=block.shard, row=r, index=int(self.shard_offsets[s]) + r)
        return out

    def iter_blocks(self, columns: Sequence[str] | None = None) -> Iterator[RowGroupBlock]:
        """Every row of every shard, in manifest order, as :class:`RowGroupBlock` s of up to
        :data:`READAHEAD_GROUPS` consecutive row groups of one shard (one pyarrow call each)."""
        cols = self._resolve(columns)
        for s, name in enumerate(self.shards):
            ng = len(self._rg_offsets[s]) - 1
            for g in range(0, ng, READAHEAD_GROUPS):
                first = int(self._rg_offsets[s][g])
                groups = range(g, min(ng, g + READAHEAD_GROUPS))
                yield RowGroupBlock(name, first, int(self.shard_offsets[s]) + first,
                                    self._table_columns(name, groups, cols))

    def iter_rows(self, columns: Sequence[str] | None = None) -> Iterator[dict]:
        """Every row as :meth:`read_row` returns it, streaming by row group."""
        for block in self.iter_blocks(columns):
            for i in range(block.num_rows):
                row = {c: (int(v[i]) if c in SCALAR_COLUMNS else v[i])
                       for c, v in block.columns.items()}
                row.update(shard=block.shard, row=block.first_row + i,
                           index=block.global_first_row + i)
                yield row
