"""The packed output as the loader sees it: a row-group index, open-file LRU, row-group decode.

Shape legend: R = rows in a row group, C = capacity, G = row groups over all shards, S = shards.

:class:`ShardIndex` is built once from the manifest (through
:func:`packtool.formats.manifest.load_manifest`, never a hard-coded file name) and the Parquet
footers, each opened and closed in turn, so building it holds no file open whatever the shard
count. It is plain data (paths, NumPy arrays), so it pickles for ``spawn``/``forkserver``
DataLoader workers.

:class:`OpenFiles` keeps at most ``max_open`` ``pyarrow.parquet.ParquetFile`` handles per
process (least recently used closed first), drops its handles when pickled and closes inherited
ones after a ``fork``, so each worker opens its own.

:func:`decode_row_group` reads one whole row group and returns NumPy columns. Per-token columns
come back as ``int32[R, C]`` from the flattened values, so ``list<int32>`` and
``fixed_size_list<int32>[C]`` read the same way. When the shards store no ``labels`` column, the
labels are derived from ``input_ids`` and ``segment_ids`` in the recorded convention (a pure
function of the two: :func:`unshifted_labels`, :func:`shifted_labels`).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from packtool.errors import ManifestError
from packtool.types import IGNORE_INDEX

__all__ = ["ShardIndex", "open_index", "OpenFiles", "Block", "decode_row_group", "unshifted_labels",
           "shifted_labels", "convert_labels", "TOKEN_COLUMNS", "RAGGED_COLUMNS", "SCALAR_COLUMNS"]

#: per-token columns, decoded as int32[R, C]
TOKEN_COLUMNS = ("input_ids", "segment_ids", "position_ids", "labels")
#: variable-length list columns, decoded as (values, offsets int64[R + 1])
#: (``cu_seqlens_unpadded`` only in outputs packed with ``--segment-multiple``)
RAGGED_COLUMNS = ("cu_seqlens", "doc_ids", "doc_offsets", "cu_seqlens_unpadded")
#: one integer per row, decoded as [R]
SCALAR_COLUMNS = ("max_seqlen", "num_targets")
_KNOWN = TOKEN_COLUMNS + RAGGED_COLUMNS + SCALAR_COLUMNS
_LABEL_MODES = ("unshifted", "shifted")


def unshifted_labels(input_ids: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """Unshifted labels (the model shifts; Hugging Face convention) from tokens and segments.

    Args:
        input_ids: int[..., C] token ids; segment_ids: int[..., C], 1..k per segment, 0 on padding.

    Returns:
        int32[..., C]: ``input_ids`` except ``-100`` at each segment's first token and on padding,
        so no position is trained to predict the next document's first token.
    """
    ids = np.asarray(input_ids)
    seg = np.asarray(segment_ids)
    first = np.ones(seg.shape, dtype=bool)  # shape: (..., C)
    first[..., 1:] = seg[..., 1:] != seg[..., :-1]
    return np.where(first | (seg == 0), np.int32(IGNORE_INDEX), ids).astype(np.int32)


def shifted_labels(input_ids: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """Shifted labels (``labels[i] = input_ids[i + 1]`` inside a segment) from tokens and segments.

    Args:
        input_ids: int[..., C]; segment_ids: int[..., C] (0 on padding).

    Returns:
        int32[..., C]: the next token of the same segment, ``-100`` at each segment's last token
        and on padding.
    """
    ids = np.asarray(input_ids)
    seg = np.asarray(segment_ids)
    out = np.full(ids.shape, IGNORE_INDEX, dtype=np.int32)  # shape: (..., C)
    same = (seg[..., 1:] == seg[..., :-1]) & (seg[..., :-1] != 0)
    out[..., :-1] = np.where(same, ids[..., 1:], IGNORE_INDEX)
    return out


def convert_labels(labels: np.ndarray, segment_ids: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Labels moved from convention ``src`` to ``dst`` (``unshifted`` | ``shifted``) inside each
    segment, so a stored mask (a -100 that is not a boundary) survives the move.

    Args:
        labels: int[..., C]; segment_ids: int[..., C] (0 on padding).

    Returns:
        int32[..., C]; a position with no counterpart in the segment gets -100.

    Raises:
        ValueError: unknown convention.
    """
    for mode in (src, dst):
        if mode not in _LABEL_MODES:
            raise ValueError(f"unknown labels convention {mode!r}; expected unshifted or shifted")
    labels = np.asarray(labels)
    if src == dst:
        return labels.astype(np.int32, copy=False)
    seg = np.asarray(segment_ids)
    out = np.full(labels.shape, IGNORE_INDEX, dtype=np.int32)  # shape: (..., C)
    same = (seg[..., 1:] == seg[..., :-1]) & (seg[..., 1:] != 0)
    if dst == "unshifted":  # the target of position i moves to position i + 1
        out[..., 1:] = np.where(same, labels[..., :-1], IGNORE_INDEX)
    else:
        out[..., :-1] = np.where(same, labels[..., 1:], IGNORE_INDEX)
    return out


@dataclass(frozen=True)
class ShardIndex:
    """Where every row of a packed output lives: shards, row groups, capacity, labels.

    Attributes:
        root: the OUTPUT directory.
        files: shard paths relative to ``root``, in manifest order (S entries).
        capacity: C, tokens per row.
        labels_mode: convention of the labels the loader hands out, ``unshifted`` or ``shifted``
            (stored ones as recorded; derived ones in the recorded convention, ``unshifted`` when
            the output records none).
        stored_labels: True when the shards hold a ``labels`` column.
        columns: the columns present in the shards.
        rg_shard: int32[G], shard of each row group.
        rg_index: int32[G], row-group number inside its shard.
        rg_first: int64[G + 1], global row of each row group's first row (manifest order), then
            the total row count.
    """

    root: Path
    files: tuple
    capacity: int
    labels_mode: str
    stored_labels: bool
    columns: tuple
    rg_shard: np.ndarray
    rg_index: np.ndarray
    rg_first: np.ndarray

    @classmethod
    def open(cls, path: str | os.PathLike) -> "ShardIndex":
        """Index the packed output at ``path`` (reads the manifest and every shard footer).

        Raises:
            ManifestError: not a complete packed output (see
                :func:`~packtool.formats.manifest.load_manifest`), a shard whose row count
                differs from the manifest, or shards without ``input_ids``/``segment_ids``.
        """
        import pyarrow.parquet as pq

        from packtool.formats.manifest import load_manifest, output_dir

        root = output_dir(path)  # a file: URI is its local path; a store URI is refused
        manifest = load_manifest(root)
        outputs = manifest["outputs"]
        files = tuple(str(o["file"]) for o in outputs)
        opts = manifest.get("options", {})
        shard_of, group_of, rows = [], [], []
        schema = None
        for s, o in enumerate(outputs):
            p = root / o["file"]
            try:
                md = pq.read_metadata(p)
            except (OSError, ValueError) as exc:
                raise ManifestError(f"{p}: unreadable Parquet footer ({exc}); rerun packtool "
                                    "pack") from None
            if md.num_rows != int(o["rows"]):
                raise ManifestError(f"{p}: {md.num_rows} rows, manifest says {o['rows']}; "
                                    "rerun the same packtool pack with --overwrite")
            if schema is None:
                schema = md.schema.to_arrow_schema()
            for g in range(md.num_row_groups):
                n = md.row_group(g).num_rows
                if n:
                    shard_of.append(s)
                    group_of.append(g)
                    rows.append(n)
        meta = (schema.metadata or {}) if schema is not None else {}
        capacity = opts.get("capacity", meta.get(b"packtool.capacity"))
        if capacity is None:
            raise ManifestError(f"{root}: the manifest records no capacity; rerun the same packtool pack with --overwrite")
        columns = tuple(schema.names) if schema is not None else ()
        if schema is not None and not {"input_ids", "segment_ids"} <= set(columns):
            raise ManifestError(f"{root / files[0]}: shards lack input_ids/segment_ids (columns: "
                                f"{', '.join(columns)}); not a packtool output")
        # the convention readers get, stored or derived: schema metadata, then the manifest;
        # an output that records none (or only "none") gets the unshifted rule
        recorded = [meta.get(b"packtool.labels_convention", b"").decode(),
                    meta.get(b"packtool.labels", b"").decode()]
        labels_info = manifest.get("labels")
        if isinstance(labels_info, dict):
            recorded.append(str(labels_info.get("convention", "")))
        recorded.append(str(opts.get("labels", "")))
        stored = "labels" in columns
        mode = next((m for m in recorded if m in _LABEL_MODES), "unshifted")
        first = np.zeros(len(rows) + 1, dtype=np.int64)  # shape: (G + 1,)
        np.cumsum(np.asarray(rows, dtype=np.int64), out=first[1:])
        return cls(root=root, files=files, capacity=int(capacity), labels_mode=mode,
                   stored_labels=stored, columns=columns,
                   rg_shard=np.asarray(shard_of, dtype=np.int32),
                   rg_index=np.asarray(group_of, dtype=np.int32), rg_first=first)

    @property
    def num_rows(self) -> int:
        """Rows over all shards."""
        return int(self.rg_first[-1])

    @property
    def num_row_groups(self) -> int:
        """G, non-empty row groups over all shards."""
        return len(self.rg_shard)

    @property
    def rg_rows(self) -> np.ndarray:
        """int64[G], rows in each row group."""
        return np.diff(self.rg_first)

    def group_of(self, rows: np.ndarray | int) -> np.ndarray | int:
        """Row group(s) holding global row(s) ``rows`` (no range check)."""
        g = np.searchsorted(self.rg_first, rows, side="right") - 1
        return int(g) if np.ndim(g) == 0 else g


class OpenFiles:
    """At most ``max_open`` open ``ParquetFile`` handles of one process, least recently used
    closed first; empty again after pickling or ``fork``.

    Args:
        root: directory the shard names are relative to.
        max_open: handles kept open (>= 1).

    Raises:
        ValueError: ``max_open < 1``.
    """

    def __init__(self, root: Path, max_open: int = 64) -> None:
        if max_open < 1:
            raise ValueError(f"max_open_files must be >= 1, got {max_open}")
        self.root = Path(root)
        self.max_open = int(max_open)
        self._files: OrderedDict = OrderedDict()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {"root": self.root, "max_open": self.max_open}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"], state["max_open"])

    def __len__(self) -> int:
        return len(self._files)

    def get(self, name: str):
        """The open ``pyarrow.parquet.ParquetFile`` of shard ``name``.

        Raises:
            ManifestError: the shard cannot be opened (the message names it and the limit on
                open files when that is the cause).
        """
        import pyarrow.parquet as pq

        if self._pid != os.getpid():  # inherited through fork: this process opens its own
            self.close()
            self._pid = os.getpid()
        f = self._files.get(name)
        if f is not None:
            self._files.move_to_end(name)
            return f
        while len(self._files) >= self.max_open:
            self._files.popitem(last=False)[1].close()
        try:
            f = pq.ParquetFile(self.root / name)
        except OSError as exc:
            raise ManifestError(f"{self.root / name}: cannot open ({exc}); with many shards "
                                "lower max_open_files or raise `ulimit -n`") from None
        self._files[name] = f
        return f

    def close(self) -> None:
        """Close every handle this process holds."""
        files, self._files = self._files, OrderedDict()
        if self._pid == os.getpid():
            for f in files.values():
                f.close()


@dataclass
class Block:
    """One decoded row group: NumPy columns of its R rows.

    Attributes:
        group: row-group number over all shards (index into :class:`ShardIndex` arrays).
        first: global row of its first row.
        shard_row0: row inside the shard of its first row.
        shard: shard file name (relative to the OUTPUT directory).
        num_rows: R.
        tokens: name -> int32[R, C] (``input_ids``, ``segment_ids``, ``position_ids``,
            ``labels``).
        ragged: name -> (values, offsets int64[R + 1]).
        scalars: name -> int[R].
    """

    group: int
    first: int
    shard_row0: int
    shard: str
    num_rows: int
    tokens: dict
    ragged: dict
    scalars: dict

    def row(self, i: int, labels_mode: str) -> dict:
        """Row ``i`` of the block as an item dict of fresh NumPy arrays (no view keeps the block
        alive): per-token ``int32[C]``, ragged 1-D arrays, scalars Python ints, plus ``shard``,
        ``row`` (inside the shard), ``index`` (global) and ``labels_mode``."""
        out = {k: np.array(v[i]) for k, v in self.tokens.items()}
        for k, (vals, offs) in self.ragged.items():
            out[k] = np.array(vals[offs[i]:offs[i + 1]])
        for k, v in self.scalars.items():
            out[k] = int(v[i])
        out.update(shard=self.shard, row=self.shard_row0 + i, index=self.first + i,
                   labels_mode=labels_mode)
        return out


def _flat_values(arr, name: str, path: Path):
    """Flattened values of a list / large_list / fixed_size_list array as NumPy."""
    import pyarrow as pa

    if arr.null_count:
        raise ManifestError(f"{path}: column {name!r} has null rows; the shard breaks the output "
                            "contract; rerun the same packtool pack with --overwrite")
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
            or pa.types.is_fixed_size_list(arr.type)):
        raise ManifestError(f"{path}: column {name!r} has type {arr.type}, expected a list of "
                            "integers; not a packtool output")
    return arr.flatten().to_numpy(zero_copy_only=False)


def decode_row_group(index: ShardIndex, files: OpenFiles, group: int,
                     columns: Sequence[str], labels_mode: str | None = None) -> Block:
    """Read whole row group ``group`` (over all shards) and decode ``columns``.

    ``labels`` is derived (see module docstring) when requested and not stored, and converted
    to ``labels_mode`` when given and different from the output's convention.

    Raises:
        ManifestError: a requested column is missing or a per-token column does not hold
            R * C values (the message names shard and column).
    """
    import pyarrow as pa

    s, g = int(index.rg_shard[group]), int(index.rg_index[group])
    name = index.files[s]
    path = index.root / name
    want = list(dict.fromkeys(columns))
    derive = "labels" in want and not index.stored_labels
    mode = labels_mode or index.labels_mode
    convert = "labels" in want and index.stored_labels and mode != index.labels_mode
    read = [c for c in want if c != "labels" or not derive]
    if derive:
        read += [c for c in ("input_ids", "segment_ids") if c not in read]
    if convert and "segment_ids" not in read:
        read.append("segment_ids")
    missing = [c for c in read if c not in index.columns]
    if missing:
        raise ManifestError(f"{path}: no column(s) {missing}; available: "
                            f"{', '.join(index.columns)}")
    pf = files.get(name)
    table = pf.read_row_group(g, columns=read, use_threads=False)
    C = index.capacity
    R = table.num_rows
    tokens, ragged, scalars = {}, {}, {}
    for c in read:
        arr = table.column(c)
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
        if c in TOKEN_COLUMNS:
            flat = _flat_values(arr, c, path)
            if flat.size != R * C:
                raise ManifestError(f"{path}: column {c!r} holds {flat.size} values for {R} rows "
                                    f"of capacity {C}; the shard breaks the output contract")
            tokens[c] = flat.reshape(R, C)  # shape: (R, C)
        elif c in RAGGED_COLUMNS or pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            vals = _flat_values(arr, c, path)
            offs = arr.offsets.to_numpy().astype(np.int64)  # shape: (R + 1,)
            ragged[c] = (vals, offs - offs[0])
        else:
            scalars[c] = arr.to_numpy(zero_copy_only=False)  # shape: (R,)
    if derive:
        fn = shifted_labels if mode == "shifted" else unshifted_labels
        tokens["labels"] = fn(tokens["input_ids"], tokens["segment_ids"])
    elif convert:
        tokens["labels"] = convert_labels(tokens["labels"], tokens["segment_ids"],
                                          index.labels_mode, mode)
    for c in ("input_ids", "segment_ids"):
        if c in tokens and c not in want:
            del tokens[c]
    first = int(index.rg_first[group])
    shard_first = first - int(index.rg_first[np.searchsorted(index.rg_shard, s, side="left")])
    return Block(group=group, first=first, shard_row0=shard_first, shard=name, num_rows=R,
                 tokens=tokens, ragged=ragged, scalars=scalars)


def open_index(path, labels: str | None) -> tuple["ShardIndex", str]:
    """The :class:`ShardIndex` of a packed OUTPUT and the labels convention items carry.

    Args:
        path: the packed output directory.
        labels: ``unshifted``, ``shifted`` or None (the convention the output records).

    Raises:
        ManifestError: not a complete packed output.
        ValueError: an unknown ``labels`` convention.
    """
    if labels not in (None, "unshifted", "shifted"):
        raise ValueError(f"labels must be 'unshifted' or 'shifted', got {labels!r}")
    index = ShardIndex.open(path)
    return index, labels or index.labels_mode


def default_columns(index: ShardIndex) -> list[str]:
    """The columns an item carries by default: every known column present, plus ``labels``."""
    cols = [c for c in _KNOWN if c in index.columns]
    if "labels" not in cols:
        cols.insert(3, "labels")
    return cols
