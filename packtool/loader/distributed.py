"""The training dataset: ranks, DataLoader workers, seeded epochs, exact resume.

:class:`PackedIterableDataset` is a ``torch.utils.data.IterableDataset`` (torch is imported by
this module only; ``import packtool.loader`` loads it on first use). Which rows each rank and
worker yields, and in which order, is the policy of :mod:`packtool.loader.plan`: shuffled row-group
order per (seed, epoch), contiguous whole-row-group ranges per rank, equal contiguous runs of
them per worker, a bounded shuffle window inside each worker; remainder rows repeated (default) or
dropped, and counted.

Resume is exact because the order is a pure function of (seed, epoch, rank, world size, worker,
number of workers): the state is the epoch and the number of rows yielded, and a restored dataset
recomputes its order and skips that many rows without reading them. ``state_dict`` /
``load_state_dict`` are the methods torchdata's ``StatefulDataLoader`` calls in each worker (or
in the main process without workers).
"""

from __future__ import annotations

import os
from typing import Iterator, Sequence

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packtool.loader.source import open_source
from packtool.loader.plan import check_seed, split_ranks, worker_rows

__all__ = ["PackedIterableDataset"]

_STATE_VERSION = 1
# fields of the state that must match for a resume to be exact
_MUST_MATCH = ("seed", "rank", "world_size", "num_rows", "shuffle", "shuffle_buffer",
               "drop_last")


def _default_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class PackedIterableDataset(IterableDataset):
    """Rows of a packed OUTPUT for distributed training, as item dicts (see
    :class:`~packtool.loader.dataset.PackedDataset` for the keys).

    In one epoch, rank ``r`` of ``W`` yields exactly ``len(self)`` rows; over all ranks and
    DataLoader workers every row comes once, plus ``repeated_rows`` rows a second time
    (``drop_last=False``: ranks are evened up with rows from the start of the epoch's order) or
    minus ``dropped_rows`` rows (``drop_last=True``). Each rank reads whole row groups of a
    contiguous range of the epoch's row-group order, never a stride over all of them. Call
    :meth:`set_epoch` before each epoch (``transformers.Trainer`` does) for a new order.

    Args:
        path: the OUTPUT of ``packtool pack``: a directory, a ``file:`` URI or a store URI
            (``s3://bucket/packed/``; credentials and endpoint as for ``pack``).
        rank, world_size: this process's rank and the number of ranks; default: from
            ``torch.distributed`` when initialised, else the ``RANK`` / ``WORLD_SIZE`` variables
            ``torchrun`` sets, else 0 / 1.
        seed: non-negative; with ``epoch`` it fixes the order.
        epoch: the starting epoch (non-negative).
        shuffle: shuffle row-group order and rows within ``shuffle_buffer``; False reads in
            manifest order (ranks still get contiguous ranges).
        shuffle_buffer: rows of the bounded shuffle window (>= 1); memory is about
            ``2 * shuffle_buffer`` decoded rows plus two row groups per worker.
        drop_last: drop the remainder instead of repeating rows.
        columns: columns each item carries (default: all present, plus derived ``labels``).
        labels: convention of the labels items carry, whatever the output stores:
            ``unshifted`` (default; ``labels[i]`` is token ``i`` or -100, the Hugging Face
            convention: the model or the loss shifts them) or ``shifted`` (``labels[i]`` is the
            token after ``i`` or -100: no shift at the loss); None: the output's own (as
            stored, or as recorded when derived). Converted inside each segment, so stored
            masks survive.
        max_open_files: open shard handles per worker (>= 1), least recently used closed first.
        cache_dir, cache_limit: a local directory keeping whole shards of a store output, at
            most ``cache_limit`` bytes (an int or ``"20G"``), shared by the ranks and workers of
            a node and kept across restarts (:class:`~packtool.formats.cache.ShardCache`).
        integrity: ``footer`` (default), ``size`` or ``sha256`` (:mod:`packtool.formats.packed`).

    Raises:
        ManifestError: not a complete packed output, or a shard that differs from its manifest
            (when it is opened).
        ValueError: unknown ``labels`` convention, bad rank, world_size, seed, epoch, shuffle_buffer or max_open_files.
    """

    def __init__(self, path: str | os.PathLike, *, rank: int | None = None,
                 world_size: int | None = None, seed: int = 0, epoch: int = 0,
                 shuffle: bool = True, shuffle_buffer: int = 1024, drop_last: bool = False,
                 columns: Sequence[str] | None = None, labels: str | None = "unshifted",
                 max_open_files: int = 64, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None, integrity: str = "footer") -> None:
        if rank is None or world_size is None:
            r, w = _default_rank_world()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        if shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1 row, got {shuffle_buffer}")
        self.output, self.labels_mode = open_source(
            path, labels, max_open_files=max_open_files, cache_dir=cache_dir,
            cache_limit=cache_limit, integrity=integrity)
        self.path = self.output.location
        self.capacity = self.output.capacity
        self.rank, self.world_size = int(rank), int(world_size)
        self.seed, self.epoch = check_seed(seed), check_seed(epoch)
        self.shuffle, self.shuffle_buffer = bool(shuffle), int(shuffle_buffer)
        self.drop_last = bool(drop_last)
        self.columns = self.output.check_columns(columns) if columns is not None \
            else self.output.default_columns()
        self._yielded = 0  # rows of this epoch yielded by this process (this worker)
        self._resume = False  # True after load_state_dict, until the next __iter__

    # --- the epoch's shape --------------------------------------------------------------------

    def _split(self):
        return split_ranks(self.output.rg_rows, rank=self.rank, world_size=self.world_size,
                           seed=self.seed, epoch=self.epoch, shuffle=self.shuffle,
                           drop_last=self.drop_last)

    @property
    def labels_convention(self) -> str:
        """Convention of the labels items carry: ``unshifted`` or ``shifted``."""
        return self.labels_mode

    def __len__(self) -> int:
        """Rows this rank yields per epoch (the same on every rank)."""
        N, W = self.output.num_rows, self.world_size
        return N // W if self.drop_last or N == 0 else -(-N // W)

    @property
    def repeated_rows(self) -> int:
        """Rows yielded twice per epoch over all ranks (``drop_last=False``)."""
        return 0 if self.drop_last else max(0, len(self) * self.world_size - self.output.num_rows)

    @property
    def dropped_rows(self) -> int:
        """Rows no rank yields per epoch (``drop_last=True``)."""
        return max(0, self.output.num_rows - len(self) * self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on (a resume point loaded for
        that same epoch is kept).

        Raises:
            ValueError: negative epoch.
        """
        epoch = check_seed(epoch)
        if epoch != self.epoch:
            self.epoch, self._resume, self._yielded = epoch, False, 0

    def rows_for(self, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        """int64[n]: global rows worker ``worker`` of ``num_workers`` yields this epoch, in
        order (the whole epoch, ignoring any resume point)."""
        return worker_rows(self._split().pieces, self.output.rg_first, worker=worker,
                           num_workers=num_workers, seed=self.seed, epoch=self.epoch,
                           rank=self.rank, shuffle=self.shuffle,
                           shuffle_buffer=self.shuffle_buffer)

    # --- iteration ----------------------------------------------------------------------------

    @staticmethod
    def _worker() -> tuple[int, int]:
        info = get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    def __iter__(self) -> Iterator[dict]:
        start = self._yielded if self._resume else 0
        self._resume, self._yielded = False, start
        worker, num_workers = self._worker()
        return self._generate(self.rows_for(worker, num_workers), start)

    def _generate(self, rows: np.ndarray, start: int) -> Iterator[dict]:
        rows = rows[start:]
        groups = self.output.group_of(rows) if len(rows) else np.zeros(0, np.int64)
        # the row groups in order of first need; each decoded block is freed after its last
        # use, so a worker holds only the groups overlapping its shuffle window (plus the ones
        # decoded ahead)
        uniq, first_at = np.unique(groups, return_index=True)
        order = uniq[np.argsort(first_at, kind="stable")]
        uniq_r, first_rev = np.unique(groups[::-1], return_index=True)
        last_use = dict(zip(uniq_r.tolist(), (len(groups) - 1 - first_rev).tolist()))
        blocks: dict = {}
        decoded = self.output.iter_groups(order.tolist(), self.columns, self.labels_mode)
        first = self.output.rg_first
        for k, g in enumerate(groups.tolist()):
            block = blocks.get(g)
            if block is None:
                block = blocks[g] = next(decoded)
            item = block.row(int(rows[k] - first[g]))
            if last_use[g] == k:
                del blocks[g]
            self._yielded = start + k + 1
            yield item

    # --- exact resume (torchdata StatefulDataLoader protocol) --------------------------------

    def state_dict(self) -> dict:
        """Where this process (this DataLoader worker) stands in the epoch: a dict of ints and
        bools (``epoch``, ``yielded`` rows, and the fields that fix the order)."""
        worker, num_workers = self._worker()
        return {"version": _STATE_VERSION, "epoch": self.epoch, "yielded": self._yielded,
                "seed": self.seed, "rank": self.rank, "world_size": self.world_size,
                "worker": worker, "num_workers": num_workers, "num_rows": self.output.num_rows,
                "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer,
                "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`state_dict`): the next iteration yields exactly
        the rows of that epoch not yet yielded, in the same order.

        Raises:
            ValueError: ``state`` comes from another output, seed, rank, world size, shuffle
                setting, worker or worker count (the resume could not be exact).
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r}, expected {_STATE_VERSION}")
        mine = self.state_dict()
        bad = [k for k in _MUST_MATCH + ("worker", "num_workers") if state.get(k) != mine[k]]
        if bad:
            raise ValueError("cannot resume exactly: state differs in " + ", ".join(
                f"{k} (saved {state.get(k)!r}, now {mine[k]!r})" for k in bad))
        self.epoch = check_seed(state["epoch"])
        self._yielded = int(state["yielded"])
        self._resume = True

    def __getstate__(self) -> dict:
        return self.__dict__.copy()  # the reader pickles without its handles
