"""The one reader of a packed output, wherever it lies: index, open files, row-group decode, labels.

Shape legend: R = rows in a row group, C = capacity, G = row groups over all shards.

Every consumer of a packed output (the loader's datasets, ``packtool stats``, ``packtool verify``,
``packtool export``) reads it through :class:`PackedOutput`, so what ``verify`` checks is exactly
what training reads:

- **Index.** Built from the typed manifest alone (:mod:`packtool.formats.manifest`: each shard's
  row groups are recorded), so opening an output of any size touches no shard; a version-2
  output is indexed from its shards' footers. It is plain data (a location, NumPy arrays), so it
  pickles for ``spawn``/``forkserver`` DataLoader workers.
- **Open files.** At most ``max_open_files`` shard handles per process, least recently used
  closed first, dropped when pickled and after a ``fork`` (each worker opens its own).
- **Wherever it lies.** A local directory, a ``file:`` URI or a store URI
  (``s3://bucket/packed/?endpoint_override=...``, credentials as for ``pack``). A store is read
  with ranged reads of whole row groups (pyarrow's pre-buffering coalesces a group's column
  chunks), :meth:`PackedOutput.iter_groups` decodes the next row groups in a background thread
  while the current one is used, and an optional :class:`~packtool.formats.cache.ShardCache`
  keeps whole shards on the node's disk under a size cap. Without a cache, memory stays at the
  row groups in flight.
- **Tamper-evident.** ``integrity="size"``: every listed shard exists with its recorded size and no
  unlisted one is present. ``"footer"`` (the loader's default) adds, when a shard is first
  opened, its size and Parquet footer against the manifest's footer sha256, and Parquet page
  checksums on every page decoded (written by ``pack`` since format version 3): a changed byte
  anywhere is refused in one line naming the shard. ``"sha256"`` (``stats`` and ``verify`` by
  default) also hashes every shard whole at open. At every level a shard whose own schema
  metadata (labels convention, capacity, ``--segment-multiple``) contradicts the manifest is
  refused when opened, so no reader shifts labels twice or cuts rows at another capacity.
- **One decoder.** :meth:`PackedOutput.decode` reads one row group and returns a :class:`Block` of
  NumPy columns: per-token columns ``int32[R, C]``, ragged ones as (values, offsets), scalars
  ``[R]``; nulls, other types and wrong sizes are refused naming shard and column. With
  ``structure="derived"`` it reads no ``segment_ids`` or ``position_ids`` pages and computes both
  from ``cu_seqlens`` and the segment count (:func:`structure_from_cu`, the output contract's
  definition; with ``--segment-multiple`` from the padded spans of ``cu_seqlens`` and the real
  lengths of ``cu_seqlens_unpadded``): a training read decodes ``input_ids`` and two small columns, about a third of the
  bytes (``docs/benchmarks.md``). ``packtool verify`` checks the stored columns against
  ``cu_seqlens``, so both ways give the same arrays on a verified output.
- **Rows as slices.** :meth:`Rows.gather` takes any rows of decoded blocks (a training batch)
  into one :class:`Rows` of ``[B, C]`` arrays with one copy per column and block, no per-row
  dicts; :func:`iter_decoded` decodes row groups of several outputs (a mixture) ahead in one
  thread.
- **One read-side label rule.** ``labels`` comes back in the convention asked for: as stored,
  converted inside each segment (:func:`convert_labels`, so a stored input mask survives), or
  derived from ``input_ids`` and ``segment_ids`` when not stored (:func:`unshifted_labels`,
  :func:`shifted_labels`).
"""

from __future__ import annotations

import hashlib
import operator
import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.errors import ManifestError, first_line, raise_if_shortage
from packtool.formats.arrays import list_parts, numpy_values
from packtool.formats.manifest import (MANIFEST_NAME, REPACK_MISSING, Manifest,
                                       check_rows_add_up, check_shards, footer_of,
                                       read_manifest_and_schema, require_packed, store_failure,
                                       unreadable)
from packtool.formats.schema import (CAPACITY_META_KEY, LABELS_CONVENTION_META_KEY,
                                     RAGGED_COLUMNS, SCALAR_COLUMNS, SEGMENT_MULTIPLE_META_KEY,
                                     SHARD_META_KEY, TOKEN_COLUMNS)
from packtool.location import Location
from packtool.signals import result as task_result
from packtool.types import IGNORE_INDEX

__all__ = ["PackedOutput", "Block", "Rows", "INTEGRITY", "LABEL_CONVENTIONS", "KNOWN_COLUMNS",
           "STRUCTURE", "unshifted_labels", "shifted_labels", "convert_labels", "labels_in",
           "structure_from_cu", "iter_decoded", "TOKEN_COLUMNS", "RAGGED_COLUMNS",
           "SCALAR_COLUMNS", "REOPEN_FIX"]

#: Integrity levels of :meth:`PackedOutput.open`, weakest first (see the module docstring).
INTEGRITY = ("size", "footer", "sha256")
#: A manifest version not taken (:meth:`PackedOutput._raise_if_repacked_since_read`): equal to
#: no :meth:`~packtool.location.Location.version`, so the manifest is read at each open.
_UNSEEN = ("not taken",)
#: What a reader's "packed again since it was opened" line tells a caller to do by default (a
#: dataset or a :class:`PackedOutput` of one's own); a command gives its own
#: (:meth:`PackedOutput.open`'s ``reopen``: ``rerun the same packtool export``).
REOPEN_FIX = "open it again (a new dataset or PackedOutput.open)"
#: The two labels conventions a reader hands out.
LABEL_CONVENTIONS = ("unshifted", "shifted")
#: Every column of the output contract, in schema order.
KNOWN_COLUMNS = TOKEN_COLUMNS + RAGGED_COLUMNS + SCALAR_COLUMNS
#: Row groups decoded ahead by :meth:`PackedOutput.iter_groups` (in one background thread).
READ_AHEAD = 2
#: How :meth:`PackedOutput.decode` gets ``segment_ids`` and ``position_ids``: ``stored`` (read
#: their pages) or ``derived`` (computed from ``cu_seqlens`` and the segment count).
STRUCTURE = ("stored", "derived")


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
        if mode not in LABEL_CONVENTIONS:
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


def labels_in(convention: str, *, input_ids: np.ndarray, segment_ids: np.ndarray,
              stored: np.ndarray | None = None, stored_convention: str | None = None) -> np.ndarray:
    """The read-side label rule: labels in ``convention`` from what the output holds.

    Args:
        convention: ``unshifted`` or ``shifted``, what the caller wants.
        input_ids, segment_ids: int[..., C].
        stored: the stored ``labels`` int[..., C], or None when the output stores none.
        stored_convention: their convention (when ``stored`` is given).

    Returns:
        int32[..., C].

    Raises:
        ValueError: unknown convention.
    """
    if convention not in LABEL_CONVENTIONS:
        raise ValueError(f"unknown labels convention {convention!r}; expected unshifted or shifted")
    if stored is None:
        fn = shifted_labels if convention == "shifted" else unshifted_labels
        return fn(input_ids, segment_ids)
    return convert_labels(stored, segment_ids, stored_convention, convention)


def structure_from_cu(cu_values: np.ndarray, cu_offsets: np.ndarray, num_segments: np.ndarray,
                      capacity: int, where: str = "",
                      unpadded: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``segment_ids`` and ``position_ids`` of R rows from their ``cu_seqlens`` (docs/output.md,
    the output contract: segments 1..k, 0 on the padding tail; positions 0..len-1 in each span,
    the padding tail counted as one pseudo-segment).

    With ``pack --segment-multiple N`` the spans of ``cu_seqlens`` are padded documents and
    ``unpadded`` (the rows' ``cu_seqlens_unpadded``, the same offsets) gives each span's real
    tokens a: segment q covers the first a tokens of span q, the rest of the span is 0 (padding,
    never a target), and positions run over the whole span (the padding goes on counting).

    Args:
        cu_values: int[E], every row's ``cu_seqlens`` back to back; cu_offsets: int64[R + 1],
            row r's entries are ``cu_values[cu_offsets[r]:cu_offsets[r + 1]]``.
        num_segments: int[R], k, real segments per row (the length of its ``doc_ids``).
        capacity: C.
        where: names the shard in error messages.
        unpadded: int[E] ``cu_seqlens_unpadded`` values (same offsets), or None when the spans
            are the documents themselves.

    Returns:
        (segment_ids int32[R, C], position_ids int32[R, C]).

    Raises:
        ManifestError: a row's ``cu_seqlens`` does not start at 0, end at C and strictly
            increase, or does not have k + 1 or k + 2 entries; ``unpadded`` of another size,
            not starting each row at 0, or giving a document 0 real tokens or more than its
            span.
    """
    C = int(capacity)
    cu = np.asarray(cu_values, dtype=np.int64)
    offs = np.asarray(cu_offsets, dtype=np.int64)
    k = np.asarray(num_segments, dtype=np.int64)
    R = offs.size - 1
    n_ent = np.diff(offs)  # shape: (R,), entries per row
    first, last = offs[:-1], offs[1:] - 1
    bad = (n_ent < 2) | (n_ent - 1 < k) | (n_ent - 1 > k + 1)
    if not bad.any():
        bad = (cu[first] != 0) | (cu[last] != C)
    if not bad.any() and cu.size > 1:
        step = np.diff(cu)  # shape: (E - 1,)
        inside = np.ones(step.size, dtype=bool)
        inside[last[:-1]] = False  # the pair (last of row r, first of row r + 1)
        if (step[inside] <= 0).any():
            i = int(np.flatnonzero(inside & (step <= 0))[0])
            bad = np.zeros(R, dtype=bool)
            bad[int(np.searchsorted(offs, i, side="right") - 1)] = True
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise ManifestError(f"{where}: row {r} of its row group: cu_seqlens "
                            f"{cu[offs[r]:offs[r + 1]].tolist()[:8]} with {int(k[r])} segments "
                            f"breaks the output contract (0 .. {C}, increasing, one entry per "
                            "segment and the padding tail); rerun the same packtool pack with "
                            "--overwrite")
    left = np.ones(cu.size, dtype=bool)
    left[last] = False  # every entry but a row's last opens a segment
    row_of = np.repeat(np.arange(R, dtype=np.int64), n_ent - 1)  # shape: (segments,)
    starts = cu[left] + row_of * C  # shape: (segments,), flat position of each segment
    lengths = np.diff(np.append(starts, R * C))
    j = np.arange(starts.size, dtype=np.int64) - np.repeat(first - np.arange(R), n_ent - 1)
    real_seg = j < k[row_of]  # shape: (segments,), False on padding tails
    ids = np.where(real_seg, j + 1, 0).astype(np.int32)
    seg = np.repeat(ids, lengths).reshape(R, C)  # shape: (R, C)
    # one new array each (fresh pages cost more than the arithmetic at these sizes)
    if R * C < 2**31:
        pos = np.repeat(starts.astype(np.int32), lengths)  # shape: (R * C,)
        np.subtract(_arange32(R * C), pos, out=pos)
    else:
        pos = (np.arange(R * C, dtype=np.int64) - np.repeat(starts, lengths)).astype(np.int32)
    pos = pos.reshape(R, C)
    if unpadded is not None:  # --segment-multiple: the real part of each span only
        un = np.asarray(unpadded, dtype=np.int64)
        bad_un = np.zeros(R, dtype=bool)
        if un.size != cu.size:
            raise ManifestError(f"{where}: cu_seqlens_unpadded holds {un.size} values for "
                                f"{cu.size} cu_seqlens entries; the shard breaks the output "
                                "contract; rerun the same packtool pack with --overwrite")
        idx = np.flatnonzero(left)  # shape: (segments,), each span's entry in cu
        real = un[idx + 1] - un[idx]  # shape: (segments,), real tokens of each span
        span = lengths
        broken = real_seg & ((real < 1) | (real > span))
        bad_un[row_of[broken]] = True
        bad_un |= un[first] != 0
        if bad_un.any():
            r = int(np.flatnonzero(bad_un)[0])
            raise ManifestError(f"{where}: row {r} of its row group: cu_seqlens_unpadded "
                                f"{un[offs[r]:offs[r + 1]].tolist()[:8]} does not fit the spans "
                                f"of cu_seqlens {cu[offs[r]:offs[r + 1]].tolist()[:8]} (0, then "
                                "1 .. span real tokens per document); rerun the same packtool "
                                "pack with --overwrite")
        if (real_seg & (real < span)).any():
            seg[pos >= np.repeat(np.where(real_seg, real, span), span).reshape(R, C)] = 0
    return seg, pos


_ARANGE32 = [np.zeros(0, dtype=np.int32)]


def _arange32(n: int) -> np.ndarray:
    """A read-only view of ``0 .. n - 1`` as int32, kept between calls (grows as needed)."""
    if _ARANGE32[0].size < n:
        a = np.arange(max(n, 2 * _ARANGE32[0].size), dtype=np.int32)
        a.flags.writeable = False
        _ARANGE32[0] = a
    return _ARANGE32[0][:n]


@dataclass
class Block:
    """One decoded row group: NumPy columns of its R rows.

    Attributes:
        group: row-group number over all shards (index into the :class:`PackedOutput` arrays).
        first: global row of its first row.
        shard_row0: row inside the shard of its first row.
        shard: shard file name (relative to OUTPUT).
        num_rows: R.
        tokens: name -> int32[R, C] (``input_ids``, ``segment_ids``, ``position_ids``,
            ``labels``).
        ragged: name -> (values, offsets int64[R + 1] from 0).
        scalars: name -> int[R].
        labels_mode: convention of ``tokens["labels"]`` when present.
    """

    group: int
    first: int
    shard_row0: int
    shard: str
    num_rows: int
    tokens: dict
    ragged: dict
    scalars: dict
    labels_mode: str = "unshifted"

    def ragged_rows(self, name: str) -> list[np.ndarray]:
        """Column ``name`` as one 1-D array per row (views of the block's values)."""
        vals, offs = self.ragged[name]
        return [vals[offs[i]:offs[i + 1]] for i in range(self.num_rows)]

    def offsets_list(self, name: str) -> list[int]:
        """The offsets of ragged column ``name`` as Python ints (kept: a block serves many
        rows, and slicing with Python ints costs less than with NumPy scalars)."""
        cache = self.__dict__.setdefault("_offsets_lists", {})
        out = cache.get(name)
        if out is None:
            out = cache[name] = self.ragged[name][1].tolist()
        return out

    def row(self, i: int) -> dict:
        """Row ``i`` of the block as an item dict of fresh NumPy arrays (no view keeps the block
        alive): per-token ``int32[C]``, ragged 1-D arrays, scalars Python ints, plus ``shard``,
        ``row`` (inside the shard), ``index`` (global) and ``labels_mode``."""
        out = {k: np.array(v[i]) for k, v in self.tokens.items()}
        for k, (vals, offs) in self.ragged.items():
            out[k] = np.array(vals[offs[i]:offs[i + 1]])
        for k, v in self.scalars.items():
            out[k] = int(v[i])
        out.update(shard=self.shard, row=self.shard_row0 + i, index=self.first + i,
                   labels_mode=self.labels_mode)
        return out


@dataclass
class Rows:
    """B rows of one or more decoded row groups, gathered: what a batch is built from.

    Attributes:
        tokens: name -> int32[B, C].
        ragged: name -> (values, offsets int64[B + 1] from 0).
        scalars: name -> int[B].
        index: int64[B], each row's global row in its output.
        row: int64[B], each row's row inside its shard.
        shard: B shard file names.
        labels_mode: convention of ``tokens["labels"]`` when present.
        meta: name -> list of B per-row values added by the caller (e.g. ``source``).
    """

    tokens: dict
    ragged: dict
    scalars: dict
    index: np.ndarray
    row: np.ndarray
    shard: list
    labels_mode: str = "unshifted"
    meta: dict = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        """B."""
        return int(self.index.size)

    def ragged_rows(self, name: str) -> list[np.ndarray]:
        """Column ``name`` as one 1-D array per row (views)."""
        vals, offs = self.ragged[name]
        return [vals[offs[i]:offs[i + 1]] for i in range(self.num_rows)]

    @classmethod
    def gather(cls, parts: Sequence[tuple["Block", np.ndarray]], meta: dict | None = None,
               alloc=None) -> "Rows":
        """Rows ``idx`` of each block, in the order given, as one :class:`Rows`.

        Each per-token column is written once into a fresh ``[B, C]`` array (one copy per
        column and block); ragged columns are gathered by index.

        Args:
            parts: ``(block, idx)`` pairs, ``idx`` int[n] rows of that block; every block has
                the same columns and labels convention.
            meta: per-row lists to carry (each of B entries).
            alloc: ``alloc(name, shape, dtype)`` -> the array a per-token column is written
                into (e.g. a view of shared memory); None: ``np.empty``.

        Raises:
            ValueError: no rows, or blocks with different columns.
        """
        parts = [(b, np.asarray(i, dtype=np.int64)) for b, i in parts]
        B = sum(i.size for _, i in parts)
        if not B:
            raise ValueError("no rows to gather")
        b0 = parts[0][0]
        if any(b.tokens.keys() != b0.tokens.keys() or b.ragged.keys() != b0.ragged.keys()
               for b, _ in parts):
            raise ValueError("blocks with different columns cannot be gathered")
        rows = [i.tolist() for _, i in parts]  # Python ints: cheaper than NumPy scalars here
        # a shuffled batch takes one or two rows of many blocks: per-row slices cost less
        # than vectorised gathers there, so only runs of several rows use the latter
        tokens = {}
        for name, arr in b0.tokens.items():
            out = (np.empty((B, arr.shape[1]), dtype=arr.dtype) if alloc is None
                   else alloc(name, (B, arr.shape[1]), arr.dtype))  # shape: (B, C)
            at = 0
            for (b, idx), il in zip(parts, rows):
                src = b.tokens[name]
                if len(il) == 1:
                    out[at] = src[il[0]]
                else:
                    src.take(idx, axis=0, out=out[at:at + len(il)])
                at += len(il)
            tokens[name] = out
        ragged = {}
        for name in b0.ragged:
            pieces, lens = [], []
            for (b, idx), il in zip(parts, rows):
                v = b.ragged[name][0]
                o = b.offsets_list(name)
                if len(il) <= 4:
                    pieces.extend(v[o[i]:o[i + 1]] for i in il)
                    lens.extend(o[i + 1] - o[i] for i in il)
                else:
                    oa = b.ragged[name][1]
                    n = oa[idx + 1] - oa[idx]
                    first = np.zeros(n.size, dtype=np.int64)
                    n[:-1].cumsum(out=first[1:])
                    pieces.append(v[(oa[idx] - first).repeat(n) + np.arange(int(n.sum()))])
                    lens.extend(n.tolist())
            offs = np.zeros(B + 1, dtype=np.int64)  # shape: (B + 1,)
            np.cumsum(lens, out=offs[1:])
            ragged[name] = (np.concatenate(pieces), offs)
        scalars = {name: np.concatenate([b.scalars[name][idx] for b, idx in parts])
                   for name in b0.scalars}
        index = np.array([b.first + i for (b, _), il in zip(parts, rows) for i in il],
                         dtype=np.int64)
        row = np.array([b.shard_row0 + i for (b, _), il in zip(parts, rows) for i in il],
                       dtype=np.int64)
        shard = [b.shard for (b, _), il in zip(parts, rows) for _ in il]
        return cls(tokens, ragged, scalars, index, row, shard, b0.labels_mode, dict(meta or {}))


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal types, the names of list items aside (a footer calls them ``item`` or ``element``
    depending on how it is read)."""
    if pa.types.is_fixed_size_list(a) or pa.types.is_list(a) or pa.types.is_large_list(a):
        return (type(a) is type(b) and getattr(a, "list_size", None) == getattr(b, "list_size", None)
                and _same_type(a.value_type, b.value_type))
    return a.equals(b)


def _layout_problem(meta: dict, manifest: Manifest) -> str | None:
    """How a shard's own schema metadata (what ``pack`` wrote into it: labels convention,
    capacity, ``--segment-multiple``) contradicts the manifest's record of the same, or None.
    A key the shard lacks (an older output) is not compared."""
    multiple = int(manifest.options.get("segment_multiple", 1))
    recorded = ((LABELS_CONVENTION_META_KEY, "labels convention", manifest.labels.convention,
                 None),
                (CAPACITY_META_KEY, "capacity", str(manifest.capacity), None),
                (SEGMENT_MULTIPLE_META_KEY, "--segment-multiple", str(multiple), b"1"))
    for key, name, in_manifest, absent in recorded:
        own = meta.get(key, absent)
        if own is not None and own.decode(errors="replace") != in_manifest:
            return (f"its schema metadata says {name} {own.decode(errors='replace')}, the "
                    f"manifest says {in_manifest}")
    return None


def _schema_problem(got: pa.Schema, want: pa.Schema) -> str | None:
    if got.names != want.names:
        return f"columns {got.names}, the manifest's schema has {want.names}"
    for a, b in zip(got, want):
        if not _same_type(a.type, b.type):
            return f"column {a.name!r} is {a.type}, the manifest's schema says {b.type}"
    return None


class _OpenShards:
    """At most ``max_open`` open shards of one process, least recently used closed first; empty
    again after pickling or ``fork``. Opening a shard checks it against the manifest."""

    def __init__(self, owner: "PackedOutput", max_open: int) -> None:
        self.owner = owner
        self.max_open = int(max_open)
        self._files: OrderedDict = OrderedDict()
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"owner": self.owner, "max_open": self.max_open}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["owner"], state["max_open"])

    def __len__(self) -> int:
        return len(self._files)

    def get(self, s: int) -> pq.ParquetFile:
        with self._lock:
            if self._pid != os.getpid():  # inherited through fork: this process opens its own
                self._files = OrderedDict()
                self._pid = os.getpid()
            f = self._files.get(s)
            if f is not None:
                self._files.move_to_end(s)
                return f[0]
            while len(self._files) >= self.max_open:
                self._files.popitem(last=False)[1][1].close()
            pf, handle = self.owner._open_shard(s)
            self._files[s] = (pf, handle)
            return pf

    def drop(self, s: int) -> None:
        """Close shard ``s`` if open (the next :meth:`get` opens it again)."""
        with self._lock:
            f = self._files.pop(s, None) if self._pid == os.getpid() else None
        if f is not None:
            f[1].close()

    def close(self) -> None:
        with self._lock:
            files, self._files = self._files, OrderedDict()
            if self._pid == os.getpid():
                for _, handle in files.values():
                    handle.close()


class PackedOutput:
    """A packed output: its manifest, its row-group index and its rows (module docstring).

    Build with :meth:`open`. Attributes: ``location`` (:class:`~packtool.location.Location`),
    ``manifest`` (:class:`~packtool.formats.manifest.Manifest`), ``schema`` (the shards' Arrow
    schema), ``capacity`` (C), ``labels`` (the manifest's :class:`LabelsInfo`), ``columns`` (the
    stored columns), ``shards`` (file names in manifest order), ``reopen`` (the fix a "packed
    again since it was opened" line ends with: :meth:`open`), and the index arrays
    ``rg_shard`` int32[G], ``rg_index`` int32[G] (row group inside its shard), ``rg_first``
    int64[G + 1] (global row of each group's first row, then the row count), ``shard_first``
    int64[S + 1].
    """

    def __init__(self, location: Location, manifest: Manifest, schema: pa.Schema, *,
                 integrity: str = "footer", cache=None, max_open_files: int = 64,
                 reopen: str = REOPEN_FIX) -> None:
        if integrity not in INTEGRITY:
            raise ValueError(f"integrity {integrity!r}: choose one of {', '.join(INTEGRITY)}")
        if max_open_files < 1:
            raise ValueError(f"max_open_files must be >= 1, got {max_open_files}")
        require_packed(manifest, location.display)
        self.location = location
        self.manifest = manifest
        self.schema = schema
        self.integrity = integrity
        self.cache = cache
        self.reopen = reopen  # the fix of a "packed again since it was opened" line
        # the manifest's version when it was read (Location.version), for the shards opened
        # from a cache (_raise_if_repacked_since_read); _UNSEEN: not taken (checked at each open)
        self._manifest_seen = _UNSEEN
        self.capacity = int(manifest.capacity)
        self.labels = manifest.labels
        self.columns = tuple(schema.names)
        self.shards = tuple(s.file for s in manifest.shards)
        missing = [c for c in ("input_ids", "segment_ids") if c not in self.columns]
        if missing and manifest.shards:
            raise ManifestError(f"{location.display}: the shards lack {', '.join(missing)} "
                                f"(columns: {', '.join(self.columns)}); not a packtool output")
        if self.labels.stored != ("labels" in self.columns):
            raise ManifestError(f"{location.display}: the manifest says labels are "
                                f"{'' if self.labels.stored else 'not '}stored, the schema "
                                f"{'lacks' if self.labels.stored else 'has'} a labels column; "
                                "rerun the same packtool pack with --overwrite")
        if (manifest.source_column is not None) != ("source_ids" in self.columns) \
                and manifest.shards:
            raise ManifestError(f"{location.display}: the manifest and the shards disagree on "
                                "source_ids (pack --source-column); rerun the same packtool "
                                "pack with --overwrite")
        self._open = _OpenShards(self, max_open_files)
        if manifest.indexed:
            # a shard listed with no rows is never opened by a reader: its footer must agree
            groups = [self._footer_groups(i) if s.rows == 0 else s.group_rows()
                      for i, s in enumerate(manifest.shards)]
        else:  # version 2: the footers say
            groups = [self._footer_groups(s) for s in range(len(self.shards))]
        shard_of, group_of, rows = [], [], []
        for s, (entry, g_rows) in enumerate(zip(manifest.shards, groups)):
            if sum(g_rows) != entry.rows:
                raise ManifestError(f"{self._where(s)}: row groups of {sum(g_rows)} rows, the "
                                    f"manifest says {entry.rows}; rerun the same packtool pack "
                                    "with --overwrite")
            for g, n in enumerate(g_rows):
                if n:
                    shard_of.append(s)
                    group_of.append(g)
                    rows.append(n)
        self.rg_shard = np.asarray(shard_of, dtype=np.int32)  # shape: (G,)
        self.rg_index = np.asarray(group_of, dtype=np.int32)  # shape: (G,)
        self.rg_first = np.zeros(len(rows) + 1, dtype=np.int64)  # shape: (G + 1,)
        np.cumsum(np.asarray(rows, dtype=np.int64), out=self.rg_first[1:])
        self.shard_first = np.zeros(len(self.shards) + 1, dtype=np.int64)  # shape: (S + 1,)
        np.cumsum([s.rows for s in manifest.shards], out=self.shard_first[1:])

    @classmethod
    def open(cls, path, *, integrity: str = "footer", cache=None, max_open_files: int = 64,
             progress=None, rows_add_up: bool = True,
             reopen: str = REOPEN_FIX) -> "PackedOutput":
        """Open the packed output at ``path``.

        Args:
            path: the OUTPUT directory, a ``file:`` URI or a store URI.
            integrity: ``size``, ``footer`` (default) or ``sha256`` (module docstring).
            cache: a :class:`~packtool.formats.cache.ShardCache` for a store output, or None
                (with a cache the manifest's version is taken first, and compared before each
                shard is opened from the cache: :meth:`_raise_if_repacked_since_read`).
            max_open_files: open shard handles per process (>= 1).
            progress: ``callable(done, total)`` told about the sha256 of each shard.
            rows_add_up: refuse a manifest whose shards' rows do not add up to its totals
                (:func:`~packtool.formats.manifest.check_rows_add_up`); False only for a
                reader that recounts every total from the rows and reports the difference
                itself (``stats``, ``verify``).
            reopen: what the caller's user does once the output turns out packed again since
                it was opened (:meth:`_raise_if_repacked`: the fix ending that line): by
                default :data:`REOPEN_FIX`; a command says to rerun itself.

        Raises:
            ManifestError: not a complete packed output (no manifest: an interrupted pack or not
                a packtool output; a ``packtool tokenize`` output: documents, not packed rows),
                a missing, extra, resized or (``sha256``) edited shard, or (``rows_add_up``)
                a manifest whose shards' rows do not add up to its totals
                (:func:`~packtool.formats.manifest.check_rows_add_up`: an entry dropped with
                its shard, or the totals edited; every reader refuses it here).
            ValueError: unknown ``integrity`` or ``max_open_files < 1``.
        """
        loc = Location.parse(path)
        # a cached copy is named by its sha256: the manifest's version, taken before it is read,
        # is what tells a shard opened from the cache that the output was packed again since
        seen = _UNSEEN
        if cache is not None and not loc.is_local:
            try:
                seen = loc.join(MANIFEST_NAME).version()
            except OSError:
                pass  # a store that cannot be asked: said by the manifest's read, next
        manifest, schema = read_manifest_and_schema(loc)
        require_packed(manifest, loc.display)  # before any shard is checked or hashed
        check_shards(loc, manifest, hashes=integrity == "sha256", progress=progress)
        reader = cls(loc, manifest, schema, integrity=integrity, cache=cache,
                     max_open_files=max_open_files, reopen=reopen)
        reader._manifest_seen = seen
        try:  # after the shards' own checks, which name the shard at fault
            if rows_add_up:  # no reader serves or exports a subset of the rows in silence
                check_rows_add_up(manifest, loc.display)
        except ManifestError:
            reader.close()
            raise
        return reader

    # -- pickling: plain data, no handles --------------------------------------------------------
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_open"] = self._open.max_open
        state.pop("_pool", None)
        return state

    def __setstate__(self, state: dict) -> None:
        max_open = state.pop("_open")
        self.__dict__.update(state)
        self._open = _OpenShards(self, max_open)

    # -- the index -------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Rows over all shards."""
        return int(self.rg_first[-1])

    def __len__(self) -> int:
        return self.num_rows

    @property
    def num_row_groups(self) -> int:
        """G, non-empty row groups over all shards."""
        return len(self.rg_shard)

    @property
    def rg_rows(self) -> np.ndarray:
        """int64[G], rows in each row group."""
        return np.diff(self.rg_first)

    @property
    def open_files(self) -> int:
        """Shard handles this process holds open now."""
        return len(self._open)

    def group_of(self, rows):
        """Row group(s) holding global row(s) ``rows`` (no range check)."""
        g = np.searchsorted(self.rg_first, rows, side="right") - 1
        return int(g) if np.ndim(g) == 0 else g

    def locate(self, index: int) -> tuple[int, int]:
        """(shard index, row inside that shard) of global row ``index`` (negative counts from
        the end).

        Raises:
            IndexError: out of range.
        """
        n = self.num_rows
        i = int(index) + (n if int(index) < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"row {index} out of range for {n} rows in {self.location.display}")
        s = int(np.searchsorted(self.shard_first, i, side="right") - 1)
        return s, i - int(self.shard_first[s])

    def default_columns(self) -> list[str]:
        """Every contract column present, plus ``labels`` (derived when not stored)."""
        cols = [c for c in KNOWN_COLUMNS if c in self.columns]
        if "labels" not in cols:
            cols.insert(3, "labels")
        return cols

    def check_columns(self, columns: Iterable[str]) -> list[str]:
        """``columns`` as a list, checked to be stored (or ``labels``, always available).

        Raises:
            ManifestError: a column the shards do not hold.
        """
        cols = list(dict.fromkeys(columns))
        missing = [c for c in cols if c not in self.columns and c != "labels"]
        if missing:
            raise ManifestError(f"{self.location.display}: no column(s) {missing}; available: "
                                f"{', '.join(self.columns)}")
        return cols

    # -- shards ----------------------------------------------------------------------------------
    def _where(self, s: int) -> str:
        return self.location.join(self.shards[s]).display

    def _handle(self, s: int):
        """(pyarrow file, is_remote) of shard ``s``: a cached local copy when a cache holds (or
        can take) it, opened by the cache (one evicted before its open is fetched again:
        :meth:`~packtool.formats.cache.ShardCache.open`), else the file itself."""
        entry = self.manifest.shards[s]
        loc = self.location.join(entry.file)
        if self.cache is not None and not loc.is_local:
            local = self.cache.open(loc, entry.sha256, entry.bytes,
                                    lambda path: pa.OSFile(str(path), "r"))
            if local is not None:
                return local, False
        return loc.open_input(), not loc.is_local

    def _raise_if_repacked(self, s: int, *, same_shard_ok: bool = False) -> None:
        """Shard ``s`` differs from the manifest this reader opened (missing, resized,
        rewritten), or (``same_shard_ok``) the manifest in OUTPUT changed since it was read:
        when the manifest now in OUTPUT records it otherwise, the output was packed
        again (``--overwrite``) since it was opened; when there is no manifest now, a pack is
        replacing it (its lock is held; a store's lock object whose holder cannot be asked: it
        is replacing it or was interrupted) or one that did was interrupted (its in-progress
        marker is there). None of these is damage. The one owner of "packed again since it was
        opened", for the shards read where they lie and those opened from a cache
        (:meth:`_raise_if_repacked_since_read`).

        Args:
            s: the shard about to be read.
            same_shard_ok: refuse only when the manifest now records shard ``s`` otherwise (a
                pack of other options that wrote this shard byte for byte again leaves its
                rows as they were, as a reader of the store's shard finds them).

        Raises:
            ManifestError: says which, and the caller's fix (``reopen`` of :meth:`open`: by
                default to open the output again) once the pack has ended, or been rerun to
                its end.
        """
        from packtool.formats.manifest import (marker_kind, read_manifest, run_words,
                                               writing_error)

        loc = self.location
        again = self.reopen
        for look in range(2):
            try:
                now = read_manifest(loc)
                break
            except (ManifestError, OSError):
                pass
            # no manifest now: a pack replacing it holds the lock (one that has finished since
            # wrote its manifest before releasing it: looked for again), or was interrupted
            running = writing_error(loc, then=again)
            if running is not None:
                raise running from None
            kind = marker_kind(loc)
            if kind is not None:
                word = run_words(kind)
                raise ManifestError(f"{loc.display}: packed again since it was opened, by a "
                                    f"packtool {word} that was interrupted (its in-progress "
                                    f"marker is there, no manifest): rerun that {word} to finish "
                                    f"it, then {again}") from None
        else:
            return  # no manifest and no pack replacing it: damaged, said by the caller
        entry = self.manifest.shards[s]
        if entry not in now.shards or (now.fingerprint != self.manifest.fingerprint
                                       and not same_shard_ok):
            raise ManifestError(f"{self.location.display}: packed again since it was opened "
                                f"(its manifest changed; {entry.file} is another file now): "
                                f"{again}")

    def _raise_if_repacked_since_read(self, s: int) -> None:
        """Before shard ``s`` is opened through the cache: its cached copy is named by its
        sha256, so it never differs from the manifest, and the size and footer checks that
        tell a reader of the store's shard that the output was packed again see nothing. So the
        manifest's version (:meth:`~packtool.location.Location.version`: one request, S3's
        ``ETag``) is compared with the one taken when the output was opened; when it changed,
        :meth:`_raise_if_repacked` reads the manifest now there and refuses the shard it
        records otherwise, as a reader without a cache refuses it when it opens it. A local
        output or no cache: nothing to do (the shard itself is read).

        Raises:
            ManifestError: packed again since it was opened, or a pack replacing it now.
            InputError: the store cannot be asked (its one line).
        """
        if self.cache is None or self.location.is_local:
            return
        mloc = self.location.join(MANIFEST_NAME)
        try:
            now = mloc.version()
        except OSError as exc:
            raise_if_shortage(exc, mloc.display)
            raise unreadable(mloc, exc) from None
        if now is not None and now == self._manifest_seen:
            return
        self._raise_if_repacked(s, same_shard_ok=True)
        self._manifest_seen = now  # taken before that read: a later change is seen again

    def _raise_if_store_failed(self, s: int, exc: BaseException) -> None:
        """A store that stopped answering, refused the credentials or lost its bucket while
        shard ``s`` was opened or read: the one line every command gives for it, as an
        :class:`~packtool.errors.InputError` (not a damaged shard, nor a file limit).

        Raises:
            InputError: names the URI and what to check (the endpoint, the credentials).
        """
        told = store_failure(self.location.join(self.shards[s]), exc)
        if told is not None:
            raise told from None

    def _drop_cached(self, s: int, close: bool = True) -> bool:
        """Shard ``s`` was read from a cached copy that turned out damaged: close it (``close``:
        it is among the open shards) and remove the copy, so the next open downloads it again
        (checked against the manifest's sha256). False when the shard was not read from a
        cache copy (nothing to retry)."""
        if self.cache is None or self.location.is_local:
            return False
        if close:
            self._open.drop(s)
        return self.cache.discard(self.manifest.shards[s].sha256)

    def _open_shard(self, s: int):
        """Open shard ``s`` (a cached copy that fails the checks is fetched again, once). An
        output packed again since it was opened is refused first, the cached copy kept."""
        self._raise_if_repacked_since_read(s)
        try:
            return self._open_checked(s)
        except ManifestError:
            if not self._drop_cached(s, close=False):  # not open yet (the caller holds the lock)
                raise
        return self._open_checked(s)

    def _open_checked(self, s: int):
        """Open shard ``s`` and check its size, footer and schema against the manifest.

        Returns:
            (``pq.ParquetFile`` with page checksum verification, the handle to close).

        Raises:
            ManifestError: the shard cannot be opened or differs from the manifest.
        """
        entry = self.manifest.shards[s]
        where = _Where(self, s)  # the shard's display name, built only for a message
        try:
            handle, remote = self._handle(s)
        except ManifestError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise_if_shortage(exc, str(where))
            self._raise_if_store_failed(s, exc)
            self._raise_if_repacked(s)
            if isinstance(exc, FileNotFoundError):
                raise ManifestError(f"{where}: missing (deleted or moved since the output was "
                                    f"opened); {REPACK_MISSING}") from None
            raise ManifestError(f"{where}: cannot open ({first_line(exc)}); with many shards lower "
                                "max_open_files or raise `ulimit -n`") from None
        try:
            size = handle.size()
            if size != entry.bytes:
                self._raise_if_repacked(s)
                from packtool.formats.sniff import shard_content_fix

                what = shard_content_fix(self.location.join(entry.file))
                raise ManifestError(f"{where}: size {size} bytes, the manifest says "
                                    f"{entry.bytes}: " + (f"the shard {what}" if what else
                                    f"the shard was modified or truncated; {REPACK_MISSING}"))
            try:
                footer = footer_of(handle, size)
                md = pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
            except (OSError, pa.ArrowException) as exc:
                raise_if_shortage(exc, str(where))
                self._raise_if_store_failed(s, exc)  # the store, not the shard
                self._raise_if_repacked(s)
                raise ManifestError(f"{where}: unreadable Parquet footer ({first_line(exc)}); the "
                                    "shard is damaged: rerun the same packtool pack with "
                                    "--overwrite") from None
            if (self.integrity != "size" and entry.footer_sha256 is not None
                    and hashlib.sha256(footer).hexdigest() != entry.footer_sha256):
                self._raise_if_repacked(s)
                raise ManifestError(f"{where}: its footer differs from the manifest's: the shard "
                                    "was modified or replaced; rerun the same packtool pack "
                                    "with --overwrite")
            named = (md.metadata or {}).get(SHARD_META_KEY)
            if named is not None and named.decode(errors="replace") != entry.file:
                raise ManifestError(f"{where}: holds the rows of shard {named.decode(errors='replace')}"
                                    ": shards were renamed or swapped; rerun the same packtool "
                                    "pack with --overwrite")
            layout = _layout_problem(md.metadata or {}, self.manifest)
            if layout:  # e.g. labels read as shifted that the shard stores unshifted
                raise ManifestError(f"{where}: {layout}: the manifest does not describe this "
                                    "shard's rows; rerun the same packtool pack with "
                                    "--overwrite")
            problem = _schema_problem(md.schema.to_arrow_schema(), self.schema)
            multiple = int(self.manifest.options.get("segment_multiple", 1))
            if not problem and multiple > 1 and "cu_seqlens_unpadded" not in self.schema.names:
                problem = (f"column cu_seqlens_unpadded is missing, which an output packed with "
                           f"--segment-multiple {multiple} (the manifest's options) stores, the "
                           "real tokens of each span (without it the padding inside spans "
                           "cannot be told from tokens)")
            if problem:
                raise ManifestError(f"{where}: {problem}; the shard does not belong to this "
                                    "output: rerun the same packtool pack with --overwrite")
            if md.num_rows != entry.rows:
                raise ManifestError(f"{where}: {md.num_rows} rows, the manifest says "
                                    f"{entry.rows}; rerun the same packtool pack with "
                                    "--overwrite")
            pf = pq.ParquetFile(handle, metadata=md, pre_buffer=remote,
                                page_checksum_verification=self.integrity != "size")
        except BaseException:
            handle.close()
            raise
        return pf, handle

    def _footer_groups(self, s: int) -> list[int]:
        """Rows of each row group of shard ``s`` from its footer (version-2 outputs)."""
        pf, handle = self._open_shard(s)
        try:
            md = pf.metadata
            return [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        finally:
            handle.close()

    # -- decoding --------------------------------------------------------------------------------
    def _plan_read(self, want: list, structure: str) -> tuple[list, set, tuple]:
        """What :meth:`decode` reads to hand out ``want``: the stored columns it reads, those
        it derives, and the helper columns a derivation needs."""
        derive = {c for c in ("segment_ids", "position_ids")
                  if structure == "derived" and c in want}
        if structure == "derived" and "labels" in want:
            derive.add("segment_ids")  # the label rule needs the segments
        read = [c for c in want if (c != "labels" or self.labels.stored) and c not in derive]
        if "labels" in want:
            read += [c for c in ("input_ids", "segment_ids") if c not in read and c not in derive]
        # --segment-multiple: the spans' real tokens too (a span is not its document)
        helpers = ("cu_seqlens", "doc_ids") + (
            ("cu_seqlens_unpadded",) if "cu_seqlens_unpadded" in self.columns else ())
        if derive:
            read += [c for c in helpers if c not in read]
        return read, derive, helpers

    def columns_read(self, columns: Sequence[str], *, structure: str = "stored") -> list[str]:
        """The stored columns :meth:`decode` reads to hand out ``columns``, in the shards'
        order: the pages whose checksums a read checks (``labels`` reads ``input_ids`` and
        ``segment_ids`` too). A page of any other column is not read, so at the ``footer``
        integrity level a change there goes unseen.

        Raises:
            ManifestError: as :meth:`check_columns`.
        """
        read = set(self._plan_read(self.check_columns(columns), structure)[0])
        return [c for c in self.columns if c in read]

    def decode(self, group: int, columns: Sequence[str], labels: str | None = None, *,
               structure: str = "stored") -> Block:
        """Read whole row group ``group`` (over all shards) and decode ``columns``.

        Args:
            group: 0 .. G - 1 (or -G .. -1, counted from the end).
            columns: column names; ``labels`` is always available (see the module docstring).
            labels: the convention of the ``labels`` handed out (None: the output's own).
            structure: ``stored`` reads ``segment_ids`` / ``position_ids``; ``derived``
                computes them from ``cu_seqlens`` and ``doc_ids`` (and, with
                ``--segment-multiple``, ``cu_seqlens_unpadded``: :func:`structure_from_cu`)
                and reads neither.

        Returns:
            A :class:`Block`.

        Raises:
            ManifestError: a column the shards lack, a damaged page (checksum), nulls, another
                type or a per-token column that does not hold R * C values, a ``cu_seqlens``
                that breaks the contract (``derived``) (the message names shard, row group and
                column).
            ValueError: unknown ``structure``.
            IndexError: ``group`` outside -G .. G - 1.
        """
        if structure not in STRUCTURE:
            raise ValueError(f"structure {structure!r}: choose stored or derived")
        n = self.num_row_groups
        group = operator.index(group)
        if not -n <= group < n:
            raise IndexError(f"row group {group} out of range for {n} row groups")
        group %= n  # -1 is the last (its first row and shard rows counted from there too)
        mode = labels or self.labels.convention
        want = self.check_columns(columns)
        s, g = int(self.rg_shard[group]), int(self.rg_index[group])
        where = _Where(self, s)  # the shard's display name, built only for a message
        stored = self.labels.stored
        read, derive, helpers = self._plan_read(want, structure)
        for attempt in (0, 1):
            pf = self._open.get(s)
            try:
                table = pf.read_row_group(g, columns=read, use_threads=False)
                break
            except (OSError, pa.ArrowException) as exc:
                raise_if_shortage(exc, f"{where}: row group {g}")
                self._raise_if_store_failed(s, exc)  # the store, not the shard
                # a cached copy damaged on this disk (a page checksum fails): fetched again
                if attempt == 0 and self._drop_cached(s):
                    continue
                # a store object rewritten under this reader is read by ranges of the new one
                self._raise_if_repacked(s)
                raise ManifestError(f"{where}: row group {g} cannot be read ({first_line(exc)}): "
                                    "the shard is damaged; rerun the same packtool pack with "
                                    "--overwrite") from None
        C, R = self.capacity, table.num_rows
        tokens, ragged, scalars = {}, {}, {}
        for c in read:
            arr = table.column(c)
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
            if arr.null_count:
                raise ManifestError(f"{where}: column {c!r} has null rows; the shard breaks the "
                                    "output contract; rerun the same packtool pack with "
                                    "--overwrite")
            if c in TOKEN_COLUMNS:
                _, flat = _list_values(arr, c, where)
                if flat.size != R * C:
                    raise ManifestError(f"{where}: column {c!r} holds {flat.size} values for {R} "
                                        f"rows of capacity {C}; the shard breaks the output "
                                        "contract")
                tokens[c] = flat.reshape(R, C)  # shape: (R, C)
            elif pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
                lengths, vals = _list_values(arr, c, where)
                offs = np.zeros(R + 1, dtype=np.int64)  # shape: (R + 1,)
                np.cumsum(lengths, out=offs[1:])
                ragged[c] = (vals, offs)
            else:
                scalars[c] = numpy_values(arr)  # shape: (R,)
        derived_labels = None
        if derive:
            cu_vals, cu_offs = ragged["cu_seqlens"]
            un = ragged.get("cu_seqlens_unpadded")
            num_segments = np.diff(ragged["doc_ids"][1])
            st = None
            if un is None and "input_ids" in tokens:  # one pass over each row
                from packtool.core.structure import row_structure

                st = row_structure(tokens["input_ids"], cu_vals, cu_offs, num_segments,
                                   convention=mode, position_dtype=np.int32,
                                   labels_dtype=np.int32)
            if st is not None and st.bad_row < 0:
                seg, pos, derived_labels = st.segment_ids, st.position_ids, st.labels
            else:  # --segment-multiple spans, or a row whose cu_seqlens this rule refuses
                seg, pos = structure_from_cu(cu_vals, cu_offs, num_segments, C,
                                             f"{where}: row group {g}",
                                             unpadded=None if un is None else un[0])
            if "segment_ids" in derive:
                tokens["segment_ids"] = seg
            if "position_ids" in derive:
                tokens["position_ids"] = pos
        if "labels" in want:
            if derived_labels is not None and not stored:
                tokens["labels"] = derived_labels  # the same rule, from the same pass
            else:
                tokens["labels"] = labels_in(mode, input_ids=tokens["input_ids"],
                                             segment_ids=tokens["segment_ids"],
                                             stored=tokens.get("labels") if stored else None,
                                             stored_convention=self.labels.convention)
        for c in ("input_ids", "segment_ids"):
            if c in tokens and c not in want:
                del tokens[c]
        for c in helpers:
            if c in ragged and c not in want:
                del ragged[c]
        tokens = {c: tokens[c] for c in TOKEN_COLUMNS if c in tokens}  # contract order
        first = int(self.rg_first[group])
        return Block(group=group, first=first, shard_row0=first - int(self.shard_first[s]),
                     shard=self.shards[s], num_rows=R, tokens=tokens, ragged=ragged,
                     scalars=scalars, labels_mode=mode)

    def iter_groups(self, groups: Iterable[int], columns: Sequence[str],
                    labels: str | None = None, ahead: int = READ_AHEAD, *,
                    structure: str = "stored") -> Iterator[Block]:
        """Decode ``groups`` in order, up to ``ahead`` of them in a background thread while the
        caller uses the current one (``ahead=0``: in the caller's thread).

        Raises:
            ManifestError: as :meth:`decode`.
        """
        cols = self.check_columns(columns)
        return iter_decoded(((self, int(g)) for g in groups), cols, labels, ahead,
                            structure=structure)

    def iter_blocks(self, columns: Sequence[str] | None = None, labels: str | None = None,
                    ahead: int = READ_AHEAD) -> Iterator[Block]:
        """Every row group in manifest order (:meth:`iter_groups` over all of them)."""
        cols = self.default_columns() if columns is None else columns
        return self.iter_groups(range(self.num_row_groups), cols, labels, ahead)

    def read_row(self, index: int, columns: Sequence[str] | None = None,
                 labels: str | None = None) -> dict:
        """Row ``index`` (global; negative counts from the end) as an item dict (see
        :meth:`Block.row`). Decodes its row group (no cache: see
        :class:`packtool.loader.PackedDataset` for repeated access).

        Raises:
            IndexError: out of range. ManifestError: as :meth:`decode`.
        """
        s, r = self.locate(index)
        i = int(self.shard_first[s]) + r
        g = self.group_of(i)
        block = self.decode(g, self.default_columns() if columns is None else columns, labels)
        return block.row(i - block.first)

    def close(self) -> None:
        """Close every shard handle this process holds."""
        self._open.close()


def iter_decoded(jobs: Iterable[tuple["PackedOutput", int]], columns: Sequence[str],
                 labels: str | None = None, ahead: int = READ_AHEAD, *,
                 structure: str = "stored") -> Iterator[Block]:
    """Decode ``(output, group)`` jobs in order, of one output or several (a mixture), up to
    ``ahead`` of them in one background thread while the caller uses the current one
    (``ahead=0``: in the caller's thread). Every output is asked for the same ``columns``.

    Raises:
        ManifestError: as :meth:`PackedOutput.decode`.
    """
    if ahead <= 0:
        for out, g in jobs:
            yield out.decode(int(g), columns, labels, structure=structure)
        return
    pending: deque = deque()
    with ThreadPoolExecutor(1, thread_name_prefix="packtool-read") as pool:
        try:
            for out, g in jobs:
                pending.append(pool.submit(out.decode, int(g), columns, labels,
                                           structure=structure))
                if len(pending) > ahead:
                    yield task_result(pending.popleft())
            while pending:
                yield task_result(pending.popleft())
        finally:
            for f in pending:
                f.cancel()


def _list_values(arr: pa.Array, name: str, where) -> tuple[np.ndarray, np.ndarray]:
    """Row lengths (int64[rows]) and flattened values (NumPy, a view: no compute call, no copy)
    of a list / large_list / fixed_size_list array without null lists
    (:func:`~packtool.formats.arrays.list_parts`).

    Raises:
        ManifestError: another type, or null values.
    """
    typ = arr.type
    if not (pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ)
            or pa.types.is_large_list(typ)):
        raise ManifestError(f"{where}: column {name!r} has type {arr.type}, expected a list of "
                            "integers; not a packtool output")
    lengths, values = list_parts(arr)
    if values.null_count:
        raise ManifestError(f"{where}: column {name!r} has null values; the shard breaks the "
                            "output contract")
    return lengths, numpy_values(values)


class _Where:
    """Shard ``s`` of ``output`` as its messages name it, formatted only when a message is."""

    __slots__ = ("output", "s")

    def __init__(self, output: "PackedOutput", s: int) -> None:
        self.output, self.s = output, s

    def __str__(self) -> str:
        return self.output._where(self.s)


