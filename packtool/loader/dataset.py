"""Map-style access to a packed output: any row by index, picklable, bounded open files.

:class:`PackedDataset` subclasses nothing, so importing it needs neither torch nor numba;
``torch.utils.data.DataLoader`` accepts any object with ``__len__`` and ``__getitem__``. For
training, :class:`~packtool.loader.distributed.PackedIterableDataset` (ranks, workers, epochs,
exact resume) reads whole row groups in a seeded order; this class is for random access
(inspection, ``packtool verify``) and small outputs.
"""

from __future__ import annotations

import operator
import os
import weakref
from collections import OrderedDict
from typing import Sequence

import numpy as np

from packtool.loader.source import check_label_masks, open_source
from packtool.loader.wrappers import map_fetcher_checked

__all__ = ["PackedDataset"]


class PackedDataset:
    """Any row of a packed output by index, wherever it lies (a directory or a store URI).

    Each item is a dict of NumPy values: ``input_ids``, ``segment_ids``, ``position_ids``,
    ``labels`` int32[C] (``labels`` derived in the recorded convention when the shards do not
    store them), ``cu_seqlens`` int32[k + 1 (+1 with padding)] (and ``cu_seqlens_unpadded``,
    the same size, for outputs packed with ``--segment-multiple``), ``doc_ids``, ``doc_offsets``
    int64[k] (and ``source_ids`` int32[k] with ``pack --source-column``), ``max_seqlen``,
    ``num_targets`` Python ints, and ``shard`` (file name), ``row``
    (inside the shard), ``index`` (global), ``labels_mode`` (``unshifted`` | ``shifted``: the
    convention of the item's labels, also :attr:`labels_convention`).

    A row costs the decode of its row group: ``input_ids`` and the small ``cu_seqlens`` and
    ``doc_ids`` columns, ``segment_ids`` and ``position_ids`` computed from them
    (``structure="derived"``, the default; about 0.5 ms of CPU at C = 8192 with the default
    1 MiB row groups, 0.3 ms with ``pack --row-group-mb 0.25``: ``docs/benchmarks.md``). The
    last ``cached_row_groups`` decoded groups are kept, so reading in order costs one decode per
    row group. At most ``max_open_files``
    shards are open at once (least recently used closed first). Pickling drops handles and
    caches (DataLoader workers under ``spawn``, ``forkserver`` and ``fork`` each open their own).

    Args:
        path: the OUTPUT of ``packtool pack``: a directory, a ``file:`` URI or a store URI
            (``s3://bucket/packed/``, credentials and endpoint as for ``pack``).
        columns: columns each item carries (default: all present, plus derived ``labels``);
            refused when no collate function could make a correct batch of them.
        labels: convention of the labels items carry, whatever the output stores:
            ``unshifted`` (default; ``labels[i]`` is token ``i`` or -100, the Hugging Face
            convention: the model or the loss shifts them) or ``shifted`` (``labels[i]`` is the
            token after ``i`` or -100: no shift at the loss); None: the output's own (as
            stored, or as recorded when derived). Converted inside each segment, so stored
            masks survive.
        max_open_files: open shard handles per process (>= 1).
        cached_row_groups: decoded row groups kept per process (>= 1).
        cache_dir, cache_limit: a local directory keeping whole shards of a store output, at
            most ``cache_limit`` bytes (an int or ``"20G"``), shared by the ranks and workers of
            a node (:class:`~packtool.formats.cache.ShardCache`); None reads the store directly.
        integrity: ``footer`` (default: each shard's size and footer checked when first opened,
            page checksums on every read), ``size``, or ``sha256`` (every shard hashed whole at
            once); see :mod:`packtool.formats.packed`.
        structure: ``derived`` (default) or ``stored``: how ``segment_ids`` and
            ``position_ids`` are obtained (:meth:`~packtool.formats.packed.PackedOutput.decode`).

    Raises:
        ManifestError: not a complete packed output, a shard that differs from the manifest, or
            a requested column is missing.
        ValueError: unknown ``labels`` convention or ``structure``, ``max_open_files`` or
            ``cached_row_groups`` < 1, or columns no batch can be made of.
    """

    def __init__(self, path: str | os.PathLike, *, columns: Sequence[str] | None = None,
                 labels: str | None = "unshifted", max_open_files: int = 64,
                 cached_row_groups: int = 2, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None, integrity: str = "footer",
                 structure: str = "derived") -> None:
        if cached_row_groups < 1:
            raise ValueError(f"cached_row_groups must be >= 1, got {cached_row_groups}")
        if structure not in ("stored", "derived"):
            raise ValueError(f"structure {structure!r}: choose stored or derived")
        self.structure = structure
        self.output, self.labels_mode = open_source(
            path, labels, max_open_files=max_open_files, cache_dir=cache_dir,
            cache_limit=cache_limit, integrity=integrity)
        self.path = self.output.location
        self.capacity = self.output.capacity
        self.columns = self.output.check_columns(columns) if columns is not None \
            else self.output.default_columns()
        padded = "cu_seqlens_unpadded" in self.output.columns  # --segment-multiple
        if columns is not None:
            from packtool.loader.collate import check_item_columns

            check_item_columns(self.columns, padded=padded)
            check_label_masks(self.output, self.columns)
        # derived: decode the stored columns only; a row's segments, positions and (when not
        # stored) labels are computed for that row alone, not for its whole row group
        self._derive = [c for c in ("segment_ids", "position_ids", "labels")
                        if structure == "derived" and c in self.columns
                        and (c != "labels" or not self.output.labels.stored)]
        self._read = [c for c in self.columns if c not in self._derive]
        self._helpers = ("input_ids", "cu_seqlens", "doc_ids") + (
            ("cu_seqlens_unpadded",) if padded else ())
        if self._derive:
            self._read += [c for c in self._helpers if c not in self._read]
        self.cached_row_groups = int(cached_row_groups)
        self._blocks: OrderedDict = OrderedDict()
        self._pid = os.getpid()
        self._fetcher = None  # weakref to the DataLoader fetcher last checked (wrappers.py)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_blocks"] = OrderedDict()
        state["_fetcher"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.output.num_rows

    @property
    def labels_convention(self) -> str:
        """Convention of the labels items carry: ``unshifted`` or ``shifted``."""
        return self.labels_mode

    @property
    def source_values(self) -> tuple:
        """The id -> value table of the per-segment ``source_ids`` items carry (an output
        packed with ``--source-column``; empty otherwise): ``source_values[id]`` is the input
        column's value, a str or an int."""
        return tuple(getattr(self.output.manifest, "source_values", ()) or ())

    @property
    def open_files(self) -> int:
        """Shard handles this process holds open now."""
        return self.output.open_files

    def __getitem__(self, index: int) -> dict:
        """Row ``index`` (global, manifest order; negative counts from the end).

        Raises:
            TypeError: not an integer (a float, as a list refuses it, or a bool); an integer
                of NumPy or a one-element integer tensor (what torch's samplers such as
                ``SubsetRandomSampler`` yield) is accepted, as a list accepts it.
            IndexError: out of range.
        """
        n = len(self)
        boolean = isinstance(index, (bool, np.bool_)) or str(getattr(index, "dtype", "")) in (
            "bool", "torch.bool")
        try:
            i = None if boolean else operator.index(index)
        except TypeError:
            i = None
        if i is None:
            raise TypeError(f"row indexes are integers, not {type(index).__name__} "
                            f"({index!r})")
        index = i
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {index} out of range for {n} rows in {self.path}")
        if self._pid != os.getpid():
            self._blocks, self._pid = OrderedDict(), os.getpid()
            self._fetcher = None
        seen = self._fetcher() if self._fetcher is not None else None
        fetcher = map_fetcher_checked(self, seen)  # each DataLoader's fetcher checked once
        if fetcher is not None and fetcher is not seen:
            self._fetcher = weakref.ref(fetcher)
        g = self.output.group_of(i)
        block = self._blocks.get(g)
        if block is None:
            block = self.output.decode(g, self._read, self.labels_mode,
                                       structure=self.structure)
            self._blocks[g] = block
            while len(self._blocks) > self.cached_row_groups:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(g)
        item = block.row(i - block.first)
        if self._derive:
            self._complete(item)
        return item

    def _complete(self, item: dict) -> None:
        """Add the derived columns of one row, drop the helper columns not asked for."""
        cu = np.asarray(item["cu_seqlens"])
        derived = None
        if item.get("cu_seqlens_unpadded") is None:  # one pass over the row
            from packtool.core.structure import row_structure

            st = row_structure(item["input_ids"][None], cu, np.array([0, cu.size]),
                               np.array([len(item["doc_ids"])]), convention=self.labels_mode,
                               position_dtype=np.int32, labels_dtype=np.int32)
            if st.bad_row < 0:
                derived = {"segment_ids": st.segment_ids[0], "position_ids": st.position_ids[0],
                           "labels": st.labels[0]}
        if derived is None:  # --segment-multiple spans, or a row the column rule refuses
            from packtool.formats.packed import labels_in, structure_from_cu

            seg, pos = structure_from_cu(cu, np.array([0, cu.size]),
                                         np.array([len(item["doc_ids"])]), self.capacity,
                                         f"{item['shard']} row {item['row']}",
                                         unpadded=item.get("cu_seqlens_unpadded"))
            derived = {"segment_ids": seg[0], "position_ids": pos[0]}
            if "labels" in self._derive:
                derived["labels"] = labels_in(self.labels_mode, input_ids=item["input_ids"],
                                              segment_ids=seg[0])
        for c in self._derive:
            item[c] = derived[c]
        for c in self._helpers:
            if c not in self.columns:
                item.pop(c, None)

    def close(self) -> None:
        """Close open shard handles and drop cached row groups."""
        self.output.close()
        self._blocks.clear()
