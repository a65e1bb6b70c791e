"""The training dataset: one output or a weighted mixture, ranks, DataLoader workers, seeded
epochs, exact and elastic resume, rows or whole batches.

:class:`PackedIterableDataset` is a ``torch.utils.data.IterableDataset`` (torch is imported by
this module only; ``import packtool.loader`` loads it on first use). Which rows each rank and
worker yields, and in which order, is the policy of :mod:`packtool.loader.plan`; the sources and
their shares are :class:`~packtool.loader.mixture.Mixture`; the state is
:mod:`packtool.loader.resume`.

**Ranks.** Each rank computes the epoch's order itself and takes its slice, so every rank must
compute the same one; with ``torch.distributed`` initialised the dataset checks that they do
(:mod:`packtool.loader.ranks`, one collective at construction, ``set_epoch`` and
``load_state_dict``; ``check_ranks=False`` turns it off).

**Resume.** The order is a pure function of (seed, epoch, sources, shares, ranks, workers and
``dataloader_batch_size``), so
the state is the epoch, the phases of the epoch so far and the rows yielded, and a restored
dataset recomputes its order and skips without reading.

- *Same world size and workers*: torchdata's ``StatefulDataLoader.load_state_dict`` (it calls
  :meth:`~PackedIterableDataset.load_state_dict` in each worker): the stream continues exactly
  as if never stopped, order included. ``ds.load_state_dict(loader_state)`` before the
  DataLoader is built gives exactly the remaining rows, each worker's in the same order, but a
  new DataLoader asks worker 0 first, so when the checkpoint fell inside a round of the
  DataLoader's round robin the workers' batches interleave in another turn.
- *Elastic* (another world size, worker count or ``dataloader_batch_size``):
  ``ds.load_state_dict(state)`` on every new rank, before its DataLoader is built, with the
  ``StatefulDataLoader.state_dict()`` that any one rank saved (rank 0's: ranks advance in step, so
  one rank's workers' counts say what every rank consumed), or a dataset's own ``state_dict()`` when
  it ran without workers. The rest of the epoch is then exactly the rows not yet consumed over all
  ranks, each once (plus the even-up repeats of the new world size, counted in
  :attr:`~PackedIterableDataset.repeated_rows`), spread over the new ranks and workers; the next
  epoch is as if the job had always run at the new size. A single worker's state (of a loader with
  several) cannot say what its siblings consumed and is refused for a resize.
- A state saved after the epoch's last row starts the next epoch at its first row, whenever it
  is loaded (before or after ``set_epoch``), never the finished epoch again. Each worker of a
  ``StatefulDataLoader`` gets only its own state; the workers tell each other through a board in
  the shared epoch box whether their runs were finished (:meth:`_post_board`). A DataLoader
  that batches items itself can still make the first pass after loading empty (torchdata's
  single-process fetcher restored as ended, or rows its ``drop_last`` drops again): nothing the
  dataset yields changes that pass, so :meth:`set_epoch` warns when a loop goes on to the epoch
  after the one it skipped (the box records the loaded state's epoch and the latest epoch any
  copy yielded a row of).

**Persistent workers.** A DataLoader with ``persistent_workers=True`` keeps the copies of the
dataset its workers got when they started, so an attribute set later in the training process
never reaches them. :meth:`~PackedIterableDataset.set_epoch` (and a finished epoch's state
loaded in the training process) therefore also writes the epoch into a small shared-memory
tensor that every copy holds; each worker reads it when an iteration starts and takes that
epoch's order. A mid-epoch state must reach persistent workers through torchdata's
``StatefulDataLoader`` (or be loaded before the DataLoader is built). A worker that loaded a
state and began its resumed run takes, when asked again, a later epoch the training process set
before the state reached it (as a new worker made from the training process's copy would),
not the resumed epoch a second time.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import sys
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packtool.loader import resume
from packtool.loader.collate import check_item_columns
from packtool.loader.mixture import Mixture
from packtool.loader.plan import (ORDER_VERSION, EpochPlan, Phase, check_seed, rank_rows,
                                  worker_bounds)
from packtool.loader.transfer import in_transit
from packtool.loader.wrappers import (refuse_accelerate_wrapper, refuse_dataloader_batching,
                                     refuse_trainer_collate_fn)

__all__ = ["PackedIterableDataset"]


def _default_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class PackedIterableDataset(IterableDataset):
    """Rows of one packed OUTPUT, or of several mixed by weight, for distributed training.

    Items are dicts of NumPy values (the keys of :class:`~packtool.loader.dataset.PackedDataset`,
    plus ``source``: the name of the source the row came from); with ``batch_size`` the dataset
    yields whole batches instead (``collate_fn`` applied to each batch's rows, gathered as
    slices of the decoded row groups: no per-row dicts), for ``DataLoader(ds,
    batch_size=None)``.

    In one epoch, rank ``r`` of ``W`` yields exactly :attr:`rows_per_rank` rows; over all ranks
    and DataLoader workers every row of the epoch comes once, plus :attr:`repeated_rows` rows a
    second time (``drop_last=False``: ranks are evened up with rows from the start of the
    epoch's order) or minus :attr:`dropped_rows` rows (``drop_last=True``). An epoch of a
    mixture holds each source's exact share of ``rows_per_epoch`` rows (largest remainders), a
    source smaller than its share cycled (every row once before any repeats), a larger one a
    different subset each epoch, the sources interleaved as finely as their shares allow. Each
    rank reads a contiguous run of each source's row groups (never a stride over all of them),
    each worker a contiguous part of it. Call :meth:`set_epoch` before each epoch
    (``transformers.Trainer`` does) for a new order.

    Args:
        path: a packed OUTPUT (a directory, a ``file:`` URI or a store URI such as
            ``s3://bucket/packed/``; credentials and endpoint as for ``pack``), or a mapping
            source name -> OUTPUT for a mixture. Every output must have the same capacity and
            hand out the same columns (a one-line refusal otherwise).
        weights: source name -> non-negative weight (any scale), each source's share of every
            epoch (weight 0: none); None: every row of every source once per epoch. Weights
            can change between runs (no repacking); a mid-epoch state resumes only with the
            weights it was saved with, a state taken at an epoch's end with any.
        rows_per_epoch: rows of an epoch over all sources (default: the rows of the sources
            with a positive weight, of every source without ``weights``); without ``weights``
            they are shared in proportion to the sources' rows.
        rank, world_size: this process's rank and the number of ranks; default: from
            ``torch.distributed`` when initialised, else the ``RANK`` / ``WORLD_SIZE`` variables
            ``torchrun`` sets, else 0 / 1 (``world_size=1`` alone: rank 0; another
            ``world_size`` than torch.distributed's needs ``rank`` too).
        seed: non-negative; with ``epoch`` it fixes the order.
        epoch: the starting epoch (non-negative).
        shuffle: shuffle row-group order and rows within ``shuffle_buffer``; False reads in
            manifest order (ranks still get contiguous ranges).
        shuffle_buffer: rows of the bounded shuffle window (>= 1); memory is about
            ``2 * shuffle_buffer`` decoded rows plus two row groups per worker.
        drop_last: drop the remainder instead of repeating rows.
        columns: columns each item carries (default: all present, plus derived ``labels``);
            refused when no collate function could make a correct batch of them
            (:func:`~packtool.loader.collate.check_item_columns`).
        labels: convention of the labels items carry, whatever the outputs store:
            ``unshifted`` (default; ``labels[i]`` is token ``i`` or -100, the Hugging Face
            convention: the model or the loss shifts them) or ``shifted`` (``labels[i]`` is the
            token after ``i`` or -100: no shift at the loss); None: the outputs' own. Converted
            inside each segment, so stored masks survive.
        batch_size: None: yield rows; B: yield batches of B rows (each worker's last one
            shorter), built by ``collate_fn``; in DataLoader workers, built where they arrive,
            the rows crossing through a shared-memory ring per worker
            (:mod:`packtool.loader.transfer`).
        dataloader_batch_size: for rows (``batch_size`` None) that the DataLoader batches
            itself: its ``batch_size`` (``per_device_train_batch_size`` under the Hugging Face
            ``Trainer``). Each DataLoader worker then gets a whole number of batches of the
            rank's rows (only the worker holding the rank's last rows ends on a partial batch),
            so a DataLoader with any number of workers yields exactly ``len(DataLoader)``
            batches, every row included (with ``drop_last=True`` on the DataLoader, only the
            rank's last ``rows_per_rank % B`` rows are left out, as without workers). Without
            it each worker ends on its own partial batch: up to K - 1 batches more than
            ``len(DataLoader)``, which a loop sized by that length (the ``Trainer``, an LR
            schedule) never reaches, so their rows are never trained (a warning says so).
        collate_fn: the batch builder with ``batch_size`` (default
            :func:`~packtool.loader.collate.collate`; also ``collate_flat`` or an
            :class:`~packtool.loader.hf.HFCollator`): called with a
            :class:`~packtool.formats.packed.Rows`.
        structure: ``derived`` (default) computes ``segment_ids`` and ``position_ids`` from
            ``cu_seqlens`` instead of decoding them (a third of the bytes decoded); ``stored``
            reads them (:mod:`packtool.formats.packed`).
        read_ahead: row groups decoded ahead in a background thread, per worker; None
            (default): 0 for local outputs (decoding is CPU-bound there, and a second thread
            cost about a third more CPU per row in ``scripts/bench_loader.py``), 2 when an
            output is in a store (hides the latency of ranged reads).
        max_open_files: open shard handles per worker and output (>= 1), least recently used
            closed first.
        cache_dir, cache_limit: a local directory keeping whole shards of a store output, at
            most ``cache_limit`` bytes (an int or ``"20G"``), shared by the ranks and workers of
            a node and kept across restarts (:class:`~packtool.formats.cache.ShardCache`).
        integrity: ``footer`` (default), ``size`` or ``sha256`` (:mod:`packtool.formats.packed`).
        check_ranks: with ``torch.distributed`` initialised over two or more processes, check
            at construction, at each :meth:`set_epoch` and after :meth:`load_state_dict` (in the
            training process, never in a DataLoader worker) that every rank splits the same
            order: the same seed, epoch, world size, sources and shares, shuffle options and
            resume point, and every dataset rank held (:mod:`packtool.loader.ranks`). The check
            is a collective that every process of the default group must reach; False (no
            check, no collective) where the dataset is built on some ranks only.

    Warns:
        UserWarning: without ``weights``, a source (or the output) that holds no rows, naming
            it; once per dataset, when a DataLoader with K >= 2 workers batches its rows and
            ``dataloader_batch_size`` was not given (rows left out by a loop sized by
            ``len(DataLoader)``).

    Raises:
        ManifestError: not a complete packed output, a shard that differs from its manifest
            (when it is opened), outputs of different capacity or columns.
        LoaderError: (``check_ranks``) ranks that disagree on what decides the order, a
            dataset rank no process holds, or a process that did not reach the check in time.
        ValueError: unknown ``labels`` convention, bad rank, world_size, seed, epoch,
            shuffle_buffer, max_open_files, batch_size, dataloader_batch_size (or both it and
            batch_size), weights or rows_per_epoch, one output
            under two names, a source with a positive weight and no rows, or columns no batch
            can be made of.
    """

    def __init__(self, path: str | os.PathLike | Mapping, *,
                 weights: Mapping[str, float] | None = None, rows_per_epoch: int | None = None,
                 rank: int | None = None, world_size: int | None = None, seed: int = 0,
                 epoch: int = 0, shuffle: bool = True, shuffle_buffer: int = 1024,
                 drop_last: bool = False, columns: Sequence[str] | None = None,
                 labels: str | None = "unshifted", batch_size: int | None = None,
                 collate_fn: Callable | None = None, structure: str = "derived",
                 read_ahead: int | None = None, max_open_files: int = 64,
                 cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None, integrity: str = "footer",
                 check_ranks: bool = True,
                 dataloader_batch_size: int | None = None) -> None:
        if rank is None and world_size == 1:
            rank = 0  # one split: rank 0 of it, whatever torch.distributed's rank
        elif rank is None or world_size is None:
            r, w = _default_rank_world()
            if rank is None and world_size is not None and world_size != w:
                raise ValueError(f"world_size={world_size} without rank=: the rank would be "
                                 f"torch.distributed's ({r} of {w}), which does not split "
                                 f"{world_size} ways; pass rank= too")
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        if shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1 row, got {shuffle_buffer}")
        if batch_size is not None and (isinstance(batch_size, bool)
                                       or not isinstance(batch_size, numbers.Integral)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        if dataloader_batch_size is not None and (
                isinstance(dataloader_batch_size, bool)
                or not isinstance(dataloader_batch_size, numbers.Integral)
                or dataloader_batch_size < 1):
            raise ValueError("dataloader_batch_size must be a positive integer (the "
                             f"DataLoader's batch_size) or None, got {dataloader_batch_size!r}")
        if dataloader_batch_size is not None and batch_size is not None:
            raise ValueError(f"batch_size={batch_size} makes the dataset yield whole batches "
                             "and dataloader_batch_size is for rows a DataLoader batches: give "
                             "one of them")
        if collate_fn is not None and batch_size is None:
            raise ValueError("collate_fn needs batch_size (without it, give collate_fn to the "
                             "DataLoader)")
        if structure not in ("stored", "derived"):
            raise ValueError(f"structure {structure!r}: choose stored or derived")
        self.mixture = Mixture(path, weights=weights, rows_per_epoch=rows_per_epoch,
                               labels=labels, columns=columns, max_open_files=max_open_files,
                               cache_dir=cache_dir, cache_limit=cache_limit,
                               integrity=integrity)
        self.labels_mode = self.mixture.labels_mode
        self.columns = self.mixture.columns
        # --segment-multiple: spans are padded documents, their real tokens in cu_seqlens_unpadded
        padded = any("cu_seqlens_unpadded" in o.columns for o in self.mixture.outputs)
        if columns is not None:
            check_item_columns(self.columns, labels_stored=True, padded=padded)
        self.capacity = self.mixture.capacity
        self.rank, self.world_size = int(rank), int(world_size)
        self.seed, self.epoch = check_seed(seed), check_seed(epoch, "epoch")
        self.shuffle, self.shuffle_buffer = bool(shuffle), int(shuffle_buffer)
        self.drop_last = bool(drop_last)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.dataloader_batch_size = (None if dataloader_batch_size is None
                                      else int(dataloader_batch_size))
        if self.batch_size is not None:
            from packtool.loader.collate import collate

            self.collate_fn = collate_fn if collate_fn is not None else collate
            needs = getattr(self.collate_fn, "needs_columns", None)
            if needs is not None:
                needs(self.columns)
        else:
            self.collate_fn = None
        # what is decoded: the items' columns, or for whole batches only what a batch is
        # built from (segments, positions and labels are derived for the batch at once)
        self._read = self.columns
        if self.batch_size is not None and columns is None:
            self._read = ["input_ids", "cu_seqlens", "doc_ids"] + [
                c for c in ("cu_seqlens_unpadded", "source_ids") if c in self.columns]
            if any(o.labels.stored for o in self.mixture.outputs):
                self._read.append("labels")
        self.structure = structure
        if read_ahead is None:
            remote = any(not o.location.is_local for o in self.mixture.outputs)
            read_ahead = 2 if remote else 0
        if isinstance(read_ahead, bool) or read_ahead < 0:
            raise ValueError(f"read_ahead must be >= 0 row groups, got {read_ahead!r}")
        self.read_ahead = int(read_ahead)
        self._history: tuple = ()  # finished phases of this epoch
        self._pending: dict | None = None  # a loaded state not yet started
        self._yielded = 0  # rows of the current phase yielded by this process (this worker)
        # [generation, epoch, workers read]: the training process's last set_epoch, shared with
        # the copies persistent DataLoader workers hold (module docstring), and 1 once a
        # worker's copy has yielded a row since (the training process's state does not count it)
        # slots 3 .. 3 + _BOARD - 1: the board on which DataLoader workers loading their own
        # states tell each other whether their runs were finished (:meth:`load_state_dict`);
        # then _LOADED, _LOADED_END, _YIELDED_EPOCH: what the loop did since the last loaded
        # state, for the warning of an epoch skipped after it (:meth:`_check_skipped_epoch`)
        self._epoch_box = _shared_epoch(self.epoch)
        self._epoch_seen = 0
        # a DataLoader worker that loaded a state: 1 until its resumed run begins, then 2: at
        # the next iteration it takes the later epoch the training process set before the state
        # reached it (:meth:`_follow_epoch`)
        self._resync = 0
        self._await_board: tuple | None = None  # (tag, workers): the board to read first
        #: (the loaded state's key, the Phase it closes at a resize): :meth:`_resolve`
        self._closed: tuple | None = None
        #: the refusal of a loaded state of other options, unless the board says its epoch ended
        self._refusal: str | None = None
        self.check_ranks = bool(check_ranks)
        self._agree("at construction")

    # --- sources ------------------------------------------------------------------------------

    @property
    def output(self):
        """The first source's :class:`~packtool.formats.packed.PackedOutput` (the only one of
        a single-output dataset)."""
        return self.mixture.outputs[0]

    @property
    def sources(self) -> tuple:
        """Source names, in the order given."""
        return self.mixture.names

    @property
    def source_shares(self) -> dict:
        """Source name -> rows it contributes to every epoch."""
        return {n: int(c) for n, c in zip(self.mixture.names, self.mixture.shares)}

    @property
    def source_values(self) -> tuple:
        """The id -> value table of the per-segment ``source_ids`` items carry (outputs packed
        with ``--source-column``; one table over all sources)."""
        return self.mixture.source_values

    @property
    def path(self):
        """The first source's location."""
        return self.output.location

    @property
    def labels_convention(self) -> str:
        """Convention of the labels items carry: ``unshifted`` or ``shifted``."""
        return self.labels_mode

    # --- the epoch's shape --------------------------------------------------------------------

    def _plan(self, history: tuple | None = None) -> EpochPlan:
        order = self.mixture.order(seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        return EpochPlan(self.mixture.rows_per_epoch, self._history if history is None
                         else history, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle,
                         shuffle_buffer=self.shuffle_buffer, drop_last=self.drop_last,
                         order=order, batch=self.dataloader_batch_size)

    def _current(self) -> EpochPlan:
        """The plan of the current phase (a loaded state counted in, as a DataLoader without
        workers would resume it)."""
        return self._plan(self._resolve(0, 1, counting=True)[0] if self._pending is not None
                          else None)

    @property
    def rows_per_rank(self) -> int:
        """Rows this rank yields in the current epoch (the same on every rank); with a resume
        point loaded, in the rest of the epoch, as a DataLoader without workers resumes it."""
        history, start = (self._resolve(0, 1, counting=True) if self._pending is not None
                          else (None, 0))
        return rank_rows(self._plan(history).length(), self.world_size, self.drop_last) - start

    def __len__(self) -> int:
        """Rows this rank yields per epoch (:attr:`rows_per_rank`; the rest of it with a resume
        point loaded); with ``batch_size``, the batches of a DataLoader without workers (each
        worker ends on its own partial batch: :meth:`num_batches` counts them for a number of
        workers)."""
        q = self.rows_per_rank
        return q if self.batch_size is None else -(-q // self.batch_size)

    def num_batches(self, num_workers: int = 0) -> int:
        """Batches this rank yields in the current epoch (the rest of it after a resume point
        is loaded) through a DataLoader with ``num_workers`` workers: each worker ends on its
        own partial batch, so with workers there can be up to ``num_workers - 1`` more than
        ``len(ds)`` (what ``len(DataLoader)`` says). With ``dataloader_batch_size`` B (rows
        a DataLoader batches), the DataLoader's batches: ``ceil(len(ds) / B)`` at any number
        of workers (each worker's run is whole batches but the last), what
        ``len(DataLoader)`` says. Rows without either.

        Raises:
            ValueError: ``num_workers`` < 0.
        """
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        K = max(1, int(num_workers))
        B = self.batch_size or self.dataloader_batch_size or 1
        total = 0
        for w in range(K):
            history, start = (self._resolve(w, K, counting=True) if self._pending is not None
                              else (self._history, 0))
            plan = self._plan(history)
            n = plan.slot(plan.phase, self.rank, w, self.world_size, K).size - start
            total += -(-max(0, n) // B)
        return total

    @property
    def repeated_rows(self) -> int:
        """Rows the epoch yields twice over all ranks (``drop_last=False``): the even-up
        repeats of this world size; after an elastic resume, those of the new world size in
        the rest of the epoch, plus the rows the ranks before it had already yielded twice (a
        row and its even-up repeat both; the repeats they had not reached are not carried on:
        :meth:`~packtool.loader.plan.EpochPlan.repeated_rows`)."""
        return self._current().repeated_rows(self.world_size)

    @property
    def dropped_rows(self) -> int:
        """Rows of the epoch no rank yields (``drop_last=True``): the remainder this world
        size leaves out (after an elastic resume, of the rest; the remainder of the world size
        before it is part of the rest)."""
        return self._current().dropped_rows(self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on (a resume point loaded for
        that same epoch is kept).

        Warns (``UserWarning``, "epoch e + 1 is skipped"), at the first call after a state of
        epoch ``e`` was loaded, when ``epoch`` >= e + 2 and no row of an epoch after ``e`` was
        read since: the pass after loading was empty (a DataLoader that batches items itself:
        ``docs/training.md``, "End of an epoch"), and epoch e + 1 would be skipped in silence.

        With ``check_ranks`` (in the training process), a collective: every rank must call it,
        with the same ``epoch``.

        Raises:
            ValueError: negative epoch; called by an accelerate wrapper that would cut this
                dataset's batches or rows
                (:func:`~packtool.loader.wrappers.refuse_accelerate_wrapper`); called by
                ``transformers.Trainer`` whose DataLoader collates with ``collate`` or
                ``collate_flat`` (:func:`~packtool.loader.wrappers.refuse_trainer_collate_fn`).
            LoaderError: (``check_ranks``) the ranks' epochs (or anything else deciding the
                order) differ, or not every rank called it in time.
        """
        epoch = check_seed(epoch, "epoch")
        refuse_accelerate_wrapper(self.rank, self.world_size, depth=16)
        refuse_trainer_collate_fn(depth=16)  # collate in Trainer's workers, unseen there
        if get_worker_info() is None:
            self._check_skipped_epoch(epoch)
        self._use_epoch(epoch)
        if get_worker_info() is None:  # the training process: its workers follow
            self._publish_epoch()
            self._agree("at set_epoch")

    def _check_skipped_epoch(self, epoch: int) -> None:
        """Warn when the loop goes on to ``epoch`` >= e + 2 after a state of epoch ``e`` was
        loaded (by this copy or a DataLoader worker's) and no copy has yielded a row of an
        epoch after ``e`` since: the first pass after loading gave no row of epoch e + 1, so
        that epoch would be skipped in silence. Looked at once per loaded state, at the first
        ``set_epoch`` after it."""
        box = self._epoch_box
        loaded = int(box[_LOADED])
        if not loaded:
            return
        box[_LOADED] = 0
        e = loaded - 1
        if (epoch < e + 2 or int(box[_YIELDED_EPOCH]) >= e + 2
                or not rank_rows(self.mixture.rows_per_epoch, self.world_size, self.drop_last)):
            return
        import warnings

        if int(box[_LOADED_END]):
            why = (f"that state was saved after epoch {e}'s last row, and the first pass over "
                   "the DataLoader after loading it ended without asking the dataset for a "
                   "row. torchdata's StatefulDataLoader without workers (num_workers=0) that "
                   "batches items itself (batch_size=B, collate_fn=...) saves its fetcher as "
                   "ended when the epoch's last batch was short (the rank's rows not divisible "
                   "by B) and restores it so. Fix: batch on the dataset "
                   "(PackedIterableDataset(..., batch_size=B) and DataLoader(ds, "
                   "batch_size=None)), or iterate the DataLoader once more in the saved epoch "
                   "(to its StopIteration) before saving the state")
        else:
            why = (f"that state was not at epoch {e}'s end as the dataset loaded it, so the "
                   f"first pass after loading read only what was left of epoch {e}: a "
                   "DataLoader with drop_last=True saves, after the last batch it keeps, a "
                   "state that still holds the rows it drops (a worker's rows not divisible by "
                   "the batch size), and drops them again on that pass; with more than 64 "
                   "DataLoader workers a worker whose run was finished cannot tell whether its "
                   "siblings' were, and yields nothing. Fix: iterate the DataLoader once more "
                   "in the saved epoch (to its StopIteration) before saving the state, or "
                   f"resume the loop at epoch {e}")
        warnings.warn(f"epoch {e + 1} is skipped: set_epoch({epoch}) after loading a state "
                      f"of epoch {e}, and no row of epoch {e + 1} was read since; " + why,
                      stacklevel=3)

    def _use_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._history, self._pending, self._yielded = epoch, (), None, 0
            self._await_board = self._refusal = None

    def _next_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (the one after a finished state's) from its first row, and tell the
        other copies (the training process's, sibling and later workers') through the box."""
        self.epoch, self._history, self._pending, self._yielded = epoch, (), None, 0
        self._await_board = self._refusal = None
        self._publish_epoch()

    def _publish_epoch(self) -> None:
        """Tell the copies of persistent DataLoader workers this process's epoch."""
        box = self._epoch_box
        box[1] = self.epoch
        box[2] = 0
        box[0] += 1
        self._epoch_seen = int(box[0])

    def _follow_epoch(self) -> None:
        """Take the epoch another copy published since this one was made or last looked: the
        training process's ``set_epoch`` (a persistent worker's copy outlives it), or a worker
        that found a loaded state finished."""
        seen, published = int(self._epoch_box[0]), int(self._epoch_box[1])
        if seen != self._epoch_seen:
            self._epoch_seen, self._resync = seen, 0
            self._use_epoch(published)
        elif self._resync == 2:
            # a worker's resumed run has begun, and it is asked again (a persistent worker: as
            # for a DataLoader that drops each worker's short last batch, where the state saved
            # after its StopIteration still holds the dropped rows): go on with the later epoch
            # the training process set, as a new worker made from its copy would, not the
            # resumed epoch again
            self._resync = 0
            if published > self.epoch:
                self._use_epoch(published)

    def rows_for(self, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        """int64[n]: row keys worker ``worker`` of ``num_workers`` yields in the current phase,
        in order, ignoring any resume point inside it. A key is the row's index in its output
        plus the rows of the sources before it (a single output: its global row index)."""
        history = self._resolve(worker, num_workers)[0] if self._pending is not None \
            else self._history
        plan = self._plan(history)
        order = self.mixture.order(seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        return order.rows_at(plan.slot(plan.phase, self.rank, worker, self.world_size,
                                       num_workers))

    def groups_for(self, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        """int64[g]: the row groups (numbered over all sources) worker ``worker`` of
        ``num_workers`` decodes in the current phase, in order of first need."""
        groups = self.mixture.locate(self.rows_for(worker, num_workers))[2]
        uniq, first = np.unique(groups, return_index=True)
        return uniq[np.argsort(first, kind="stable")]

    # --- iteration ----------------------------------------------------------------------------

    @staticmethod
    def _worker() -> tuple[int, int]:
        info = get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    def __iter__(self) -> Iterator:
        info = get_worker_info()  # a wrapper set_epoch did not see (one without set_epoch)
        refuse_accelerate_wrapper(self.rank, self.world_size, depth=16,
                                  workers=info.num_workers if info is not None else 0)
        # batches must not be batched again; items not by torch's default collate
        batched = refuse_dataloader_batching(self, self.batch_size)
        worker, num_workers = self._worker()
        self._follow_epoch()
        if self._await_board is not None:
            return self._after_board()
        history, start = (self._resolve(worker, num_workers) if self._pending is not None
                          else (self._history, 0))
        plan = self._plan(history)
        order = self.mixture.order(seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        keys = order.rows_at(plan.slot(plan.phase, self.rank, worker, self.world_size,
                                       num_workers))
        rows = self._generate(keys, start, history)
        if batched and num_workers >= 2 and self.dataloader_batch_size is None \
                and not int(self._epoch_box[_WARNED]):
            return self._warn_worker_batches(rows, plan, num_workers)
        return rows

    def _warn_worker_batches(self, rows: Iterator, plan: EpochPlan,
                             num_workers: int) -> Iterator:
        """``rows``, after warning (once per dataset: the first worker to find it, the flag is
        in the shared epoch box) that a DataLoader batching this rank's rows in
        ``num_workers`` workers yields more batches than its length, as
        ``dataloader_batch_size`` was not given. The DataLoader's batch size B is the length
        of the index list its fetcher asks rows for (known at the first row): no warning when
        the workers' runs, each ending on its own partial batch, make no more batches than
        ``ceil(q / B)`` (B = 1, or runs that are whole batches)."""
        it = iter(rows)
        try:
            first = next(it)
        except StopIteration:
            return
        B, dropping = _fetch_batching(self)
        q = rank_rows(plan.length(), self.world_size, self.drop_last)
        runs = [worker_bounds(q, w, num_workers) for w in range(num_workers)]
        fix = ("pass PackedIterableDataset(..., dataloader_batch_size=<the DataLoader's "
               "batch_size>)")
        if B is None:
            extra, said = num_workers - 1, None
        elif dropping:  # each worker drops its own partial batch: fewer batches, rows unread
            made = sum((b - a) // B for a, b in runs)
            extra = q // B - made
            said = (f"with {num_workers} DataLoader workers each dropping its own partial "
                    f"batch (drop_last=True), a DataLoader batching these rows yields "
                    f"{extra} batch{'es' if extra != 1 else ''} fewer than len(DataLoader) and leaves "
                    f"{q - B * made:,} of this rank's {q:,} rows unread this epoch ({q % B:,} "
                    f"without workers): {fix}")
        else:
            extra = sum(-(-(b - a) // B) for a, b in runs) - -(-q // B)
            said = None
        if extra > 0 and not int(self._epoch_box[_WARNED]):
            self._epoch_box[_WARNED] = 1
            import warnings

            say = f"up to {num_workers - 1}" if B is None else str(extra)
            warnings.warn(said or (
                f"with {num_workers} DataLoader workers each ending on its own partial batch, "
                f"a DataLoader batching these rows yields {say} "
                f"batch{'es' if extra != 1 else ''} more than len(DataLoader), and a loop sized "
                f"by that length (the Hugging Face Trainer, an LR schedule) leaves their rows "
                f"out: {fix}"), stacklevel=2)
        yield first
        yield from it

    def _after_board(self) -> Iterator:
        """The iteration of a worker that loaded its own finished run of several, decided at
        the first request for data: by then every sibling has loaded its state (the DataLoader
        waits for all its workers to start) and posted it on the board. All runs finished: the
        epoch was, so this worker starts the next one (and tells the others); otherwise it has
        nothing left of this epoch."""
        tag, K = self._await_board
        self._await_board = None
        refusal, self._refusal = self._refusal, None
        if self._pending is not None and self._board_finished(tag, K):
            self._next_epoch(self._pending["epoch"] + 1)
        elif refusal is not None and self._pending is not None and self._board_untouched(tag, K):
            # a state of other options taken before any worker read a row of its epoch: that
            # epoch's start, under this dataset's options (as every sibling decides)
            self.epoch, self._history, self._pending, self._yielded = (
                self._pending["epoch"], (), None, 0)
        elif refusal is not None:  # a state of other options, and the epoch went on
            raise ValueError(refusal)
        yield from self.__iter__()

    def _commit(self, history: tuple, start: int) -> None:
        """The iteration has begun: the loaded resume point (if any) is used up."""
        self._pending, self._history, self._yielded = None, history, start
        if self._resync == 1:
            self._resync = 2

    def _generate(self, keys: np.ndarray, start: int, history: tuple) -> Iterator:
        mix = self.mixture
        keys = keys[start:]
        src, local, groups = mix.locate(keys)
        if not keys.size:
            self._commit(history, start)
            return
        # row groups in order of first need; each decoded block is freed after its last use,
        # so a worker holds only the groups overlapping its shuffle window (and those ahead)
        uniq, first_at = np.unique(groups, return_index=True)
        need = uniq[np.argsort(first_at, kind="stable")]
        uniq_r, first_rev = np.unique(groups[::-1], return_index=True)
        last_use = dict(zip(uniq_r.tolist(), (len(groups) - 1 - first_rev).tolist()))
        jobs = (self._job(int(g)) for g in need)
        from packtool.formats.packed import Rows, iter_decoded

        decoded = iter_decoded(jobs, self._read, self.labels_mode, self.read_ahead,
                               structure=self.structure)
        blocks: dict = {}
        step = self.batch_size or 1
        glist, llist, slist = groups.tolist(), local.tolist(), src.tolist()
        names = mix.names
        flag = get_worker_info() is not None
        self._commit(history, start)
        for lo in range(0, len(glist), step):
            hi = min(lo + step, len(glist))
            parts, srcs = [], []
            for k in range(lo, hi):
                g = glist[k]
                block = blocks.get(g)
                if block is None:
                    block = next(decoded)
                    mix.remap_sources(mix.split_group(g)[0], block)
                    blocks[g] = block
                parts.append((block, llist[k] - block.first))
                srcs.append(names[slist[k]])
            if self.batch_size is None:
                block, i = parts[0]
                item = block.row(i)
                item["source"] = srcs[0]
                out = item
            elif get_worker_info() is None:
                out = self.collate_fn(Rows.gather(_runs(parts), meta={"source": srcs}))
            else:  # a DataLoader worker: the rows cross as they are, collated on arrival
                out = in_transit(_runs(parts), {"source": srcs}, self.collate_fn,
                                 self.batch_size)
            for k in range(lo, hi):
                if last_use[glist[k]] == k:
                    del blocks[glist[k]]
            if flag:  # a worker: rows the training process's copy does not count
                self._epoch_box[2], flag = 1, False
            if lo == 0 and int(self._epoch_box[_YIELDED_EPOCH]) <= self.epoch:
                self._epoch_box[_YIELDED_EPOCH] = self.epoch + 1  # a row of this epoch came
            self._yielded = start + hi
            yield out

    def _job(self, group: int):
        s, g = self.mixture.split_group(group)
        return self.mixture.outputs[s], g

    # --- resume -------------------------------------------------------------------------------

    def _agree(self, where: str) -> None:
        """In the training process, with ``check_ranks``: refuse ranks of the default
        ``torch.distributed`` group that would split the epoch differently
        (:func:`~packtool.loader.ranks.check_ranks_agree`, one collective; ``where`` names the
        call site in the message). Never in a DataLoader worker.

        Raises:
            LoaderError: the ranks disagree on the seed, the epoch, the world size, the
                sources and shares, the order's options or the loaded resume point, or leave a
                dataset rank unread.
        """
        if not self.check_ranks or get_worker_info() is not None:
            return
        from packtool.loader.ranks import check_ranks_agree

        mine = self._mine()
        fp = mine.pop("mixture")
        st = self._pending
        resume = None
        if st is not None:
            resume = (f"{st['world_size']} ranks x {st['num_workers']} workers, rows yielded "
                      f"{st['yielded']}")
            if st.get("dataloader_batch_size") is not None:
                resume += f", runs of batches of {st['dataloader_batch_size']}"
            if st["phases"]:
                digest = hashlib.blake2b(repr(st["phases"]).encode(), digest_size=6).hexdigest()
                resume += f", {len(st['phases'])} earlier phases {digest}"
        mix = self.mixture
        # a single output's name (its directory's) does not enter the order; a mixture's do
        sources = (mix.describe() if len(mix) > 1
                   else f"{int(mix.shares[0])} of {int(mix.rows[0])} rows")
        check_ranks_agree({
            **mine, "rank": self.rank, "world_size": self.world_size, "epoch": self.epoch,
            "sources": sources, "resume": resume,
            "dataloader_batch_size": self.dataloader_batch_size,
            "content": hashlib.blake2b(repr(fp["content"]).encode(), digest_size=8).hexdigest()},
            where)

    def _mine(self) -> dict:
        return {"order": ORDER_VERSION, "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer, "drop_last": self.drop_last,
                "mixture": self.mixture.fingerprint()}

    def _resolve(self, worker: int, num_workers: int, counting: bool = False
                 ) -> tuple[tuple, int]:
        """(phases, rows to skip) of the loaded state for worker ``worker`` of
        ``num_workers`` at this world size: the same shape continues exactly, another one
        starts a new phase.

        Raises:
            ValueError: a resize from a single worker's state of several workers.
        """
        st = self._pending
        history = tuple(Phase.from_list(p) for p in st["phases"])
        W, K, y = st["world_size"], st["num_workers"], st["yielded"]
        B = st.get("dataloader_batch_size")
        if (W, K, B) == (self.world_size, num_workers, self.dataloader_batch_size):
            if isinstance(y, list):
                return history, y[worker]
            if st["worker"] == worker:
                return history, y
        if not isinstance(y, list):
            if K != 1:
                what = ("len() and the row counts cannot count the rest of the epoch from it"
                        if counting else f"it cannot resume at {self.world_size} ranks x "
                        f"{num_workers} workers" + (
                            f", dataloader_batch_size={self.dataloader_batch_size} (saved "
                            f"with {B})" if B != self.dataloader_batch_size else ""))
                raise ValueError(
                    f"this state is worker {st['worker']}'s of {K}: it cannot say what the "
                    f"other workers consumed, so {what}; load the StatefulDataLoader's whole "
                    "state_dict() into the dataset (ds.load_state_dict(loader_state)) before "
                    "building the new DataLoader")
            y = [y]
        if not any(y):  # nothing read in that phase: the epoch goes on as at this size
            return history, 0
        key = (st["epoch"], repr(st["phases"]), W, K, B, tuple(y))
        if self._closed is None or self._closed[0] != key:  # counted once per loaded state
            self._closed = (key, self._plan(history).close(W, K, y, batch=B))
        return history + (self._closed[1],), 0

    def state_dict(self) -> dict:
        """Where this process (this DataLoader worker) stands in the epoch: a dict of ints,
        bools, strings and lists (:mod:`packtool.loader.resume`).

        Warns (``UserWarning``) in the training process when its DataLoader's workers yielded
        rows of this epoch: their copies of the dataset did, this one did not count them, so
        its state would replay them; save torchdata's ``StatefulDataLoader.state_dict()``."""
        worker, num_workers = self._worker()
        if get_worker_info() is None and int(self._epoch_box[2]):
            # whatever this copy read itself (a peek at one item, a loaded state): the rows its
            # workers' copies yielded since are not in its count
            import warnings

            mine = (f" (it counts only the {self._yielded} rows it yielded itself)"
                    if self._yielded and self._pending is None else "")
            warnings.warn("DataLoader workers yielded rows of this epoch that this dataset (the "
                          f"training process's copy) did not see{mine}: its state_dict() would "
                          "replay them on resume; save the StatefulDataLoader's state_dict() "
                          "(torchdata) instead, or read without workers", stacklevel=2)
        if self._pending is not None:
            history, yielded = self._resolve(worker, num_workers)
        else:
            history, yielded = self._history, self._yielded
        return {"version": resume.STATE_VERSION, "epoch": self.epoch, **self._mine(),
                "phases": [p.to_list() for p in history], "world_size": self.world_size,
                "num_workers": num_workers, "rank": self.rank, "worker": worker,
                "yielded": yielded, "dataloader_batch_size": self.dataloader_batch_size}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: this dataset's :meth:`state_dict` (any worker, any rank:
        ranks advance in step) or a torchdata ``StatefulDataLoader.state_dict()`` (all its
        workers). At the same world size and worker count the stream continues exactly;
        at another (decided when iteration starts, where the worker count is known) the rest
        of the epoch is the rows not yet consumed by any rank, spread over the new ranks and
        workers (module docstring). A state saved after the epoch's last row starts the next
        epoch.

        With ``check_ranks``, in the training process, a collective: every rank must load
        a state (the same one, or each its own at the same world size and worker count).

        Raises:
            ValueError: a state of another output, mixture, seed or shuffle setting in
                mid-epoch (the resume could not be exact), a malformed state, or (when
                iteration starts) a resize from a single worker's state of several.
            LoaderError: (``check_ranks``) the ranks' loaded states (or anything else deciding
                the order) differ, or not every rank loaded one in time.
        """
        st = resume.normalize(state)
        info = get_worker_info()
        self._load(st, info)
        self._resync = int(info is not None)
        box = self._epoch_box  # a state was loaded: what the loop reads next (set_epoch)
        box[_LOADED], box[_LOADED_END], box[_YIELDED_EPOCH] = (
            st["epoch"] + 1, int(resume.finished(st)), 0)
        if info is None:  # this copy's state is the loaded one: no worker has read past it yet
            box[2] = 0
            self._agree("after load_state_dict")

    def _load(self, st: dict, info) -> None:
        """:meth:`load_state_dict` of a normalized state ``st`` in this process (``info``:
        its DataLoader worker, or None)."""
        self._await_board = self._refusal = None
        if info is None:  # the state decides this copy's epoch, not an earlier publication
            self._epoch_seen = int(self._epoch_box[0])
        tag = self._post_board(st, info) if info is not None else None
        if resume.finished(st) or (tag is not None
                                   and self._board_finished(tag, info.num_workers)):
            self._next_epoch(st["epoch"] + 1)
            return
        bad = resume.mismatch(st, self._mine())
        if bad and resume.untouched(st):  # taken before any row of its epoch: its start
            self.epoch, self._history, self._pending, self._yielded = st["epoch"], (), None, 0
            return
        if bad:
            refusal = ("cannot resume exactly: state differs in " + ", ".join(bad)
                       + "; resume with the options it was saved with, or from a state taken "
                       "at the end of an epoch")
            if tag is not None and (resume.worker_finished(st) or resume.worker_untouched(st)):
                # this worker's run was finished, or it had read nothing of it; whether the
                # epoch was finished, or untouched, is known once every sibling has posted its
                # own (at the first request for data)
                self.epoch, self._pending, self._refusal = st["epoch"], st, refusal
                self._await_board = (tag, info.num_workers)
                return
            raise ValueError(refusal)
        # validates the phases (each one's rows yielded twice recounted from its slots)
        self._plan(tuple(Phase.from_list(p) for p in st["phases"])).check()
        self.epoch = st["epoch"]
        self._history, self._yielded = (), 0
        self._pending = st
        if tag is not None and resume.worker_finished(st):
            self._await_board = (tag, info.num_workers)

    def _post_board(self, st: dict, info) -> int | None:
        """In a DataLoader worker loading its own state of K > 1 workers (what torchdata's
        ``StatefulDataLoader`` hands each worker): post on the shared board whether its run was
        finished and whether it had read nothing of it, tagged with the state's epoch, phases and
        the loader's base seed (the same for every sibling). Returns the tag, or None where there
        is no board to use.

        One worker's state cannot say whether its siblings were done when the checkpoint was
        taken; the board lets each worker read the others' before it yields anything."""
        K = info.num_workers
        if (isinstance(st["yielded"], list) or st["num_workers"] != K or not 2 <= K <= _BOARD
                or st["worker"] != info.id or st["world_size"] != self.world_size
                or st.get("dataloader_batch_size") != self.dataloader_batch_size):
            return None
        key = repr((st["epoch"], st["phases"], st["world_size"], K, st["seed"],
                    int(info.seed) - int(info.id)))
        tag = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=7).digest(), "little") + 1
        self._epoch_box[3 + info.id] = (4 * tag + 2 * int(resume.worker_untouched(st))
                                        + int(resume.worker_finished(st)))
        return tag

    def _board_all(self, tag: int, num_workers: int, bit: int) -> bool:
        """True when all ``num_workers`` workers posted ``tag`` with ``bit`` set (1: their runs
        finished; 2: they read no row of it)."""
        vals = self._epoch_box[3:3 + num_workers].tolist()
        return all(v >> 2 == tag and v & bit for v in vals)

    def _board_finished(self, tag: int, num_workers: int) -> bool:
        return self._board_all(tag, num_workers, 1)

    def _board_untouched(self, tag: int, num_workers: int) -> bool:
        return self._board_all(tag, num_workers, 2)

    def __getstate__(self) -> dict:
        return self.__dict__.copy()  # the readers pickle without their handles


def _runs(parts: list) -> list:
    """``(block, row)`` pairs as ``(block, rows)`` runs of one block each, in order."""
    out = []
    for block, i in parts:
        if out and out[-1][0] is block:
            out[-1][1].append(i)
        else:
            out.append((block, [i]))
    return [(b, np.asarray(i, dtype=np.int64)) for b, i in out]


#: Workers of one DataLoader that can tell each other a loaded state's runs were finished.
_BOARD = 64
#: Slots of the epoch box after the board: the epoch + 1 of the last state loaded (0: none,
#: or looked at by set_epoch), 1 when it was finished, and the epoch + 1 of the latest epoch
#: a copy yielded a row of since that load.
_LOADED, _LOADED_END, _YIELDED_EPOCH = 3 + _BOARD, 4 + _BOARD, 5 + _BOARD
def _fetch_batching(dataset) -> tuple[int | None, bool]:
    """The batch size of the torch DataLoader fetcher asking ``dataset`` for rows now (the
    length of the index list its ``fetch`` holds) and its ``drop_last``, found among the frames
    above the caller; (None, False) when no such fetcher is found."""
    from torch.utils.data._utils.fetch import _IterableDatasetFetcher

    f = sys._getframe(1)
    for _ in range(6):
        if f is None:
            return None
        owner = f.f_locals.get("self")
        if isinstance(owner, _IterableDatasetFetcher) and owner.dataset is dataset:
            index = f.f_locals.get("possibly_batched_index")
            dropping = bool(getattr(owner, "drop_last", False))
            try:
                return (len(index) if owner.auto_collation else None), dropping
            except TypeError:
                return None, dropping
        f = f.f_back
    return None, False


#: Set once a DataLoader worker warned that its rows lack ``dataloader_batch_size``.
_WARNED = 6 + _BOARD


def _shared_epoch(epoch: int):
    """int64[7 + _BOARD] ``[generation, epoch, workers yielded, board..., loaded epoch,
    loaded finished, yielded epoch, warned]`` in shared memory (a torch tensor:
    fork children share its pages, spawn and forkserver workers receive it through torch's
    shared-memory pickling; a plain pickle copies it)."""
    import torch

    box = torch.zeros(7 + _BOARD, dtype=torch.int64)
    box[1] = epoch
    try:
        box.share_memory_()
    except (OSError, RuntimeError):  # no shared memory: persistent workers keep their epoch
        pass
    return box
