"""Accelerate's DataLoader wrappers that would silently break packed batches or a rank's share.

``transformers.Trainer`` (and ``Accelerator.prepare``) wrap a DataLoader: for an
``IterableDataset`` by default in a ``DataLoaderDispatcher``, which reads the batches in one
process and slices every tensor of a batch to its rows, cutting ``cu_seqlens`` /
``cu_seq_lens_q`` (one entry per document, not per row) short; on several processes with
``dispatch_batches=False`` in an ``IterableDatasetShard``, which gives each process a share of
the dataset's items. The datasets and collate functions of :mod:`packtool.loader` look for them
in the Python stack and refuse, naming the fix (``docs/training.md``); so does a dataset that
yields whole batches for a torch DataLoader that would batch them again.
"""

from __future__ import annotations

import sys

__all__ = ["refuse_accelerate_wrapper", "refuse_dataloader_batching"]

_DISPATCH_FIX = ("set dispatch_batches=False (TrainingArguments(accelerator_config={"
                 "'dispatch_batches': False}), or Accelerator(dataloader_config="
                 "DataLoaderConfiguration(dispatch_batches=False)))")


def _frames(frame, depth: int):
    """``frame`` and the ``depth - 1`` frames that called it, innermost first."""
    while frame is not None and depth > 0:
        yield frame
        frame, depth = frame.f_back, depth - 1


def _accelerate_wrapper(frame, depth: int) -> str | None:
    """The class name of the first accelerate DataLoader wrapper among ``frame`` and the
    ``depth - 1`` frames that called it (``self`` of a method of ``accelerate.*``), or None."""
    if "accelerate.data_loader" not in sys.modules:  # no wrapper exists in this process
        return None
    for f in _frames(frame, depth):
        # the module's name first: reading f_locals builds a dict of the frame's locals
        if f.f_globals.get("__name__", "").startswith("accelerate."):
            kind = type(f.f_locals.get("self"))
            if kind.__name__ in ("DataLoaderDispatcher", "IterableDatasetShard"):
                return kind.__name__
    return None


def refuse_dataloader_batching(dataset, batch_size: int, *, depth: int = 8) -> None:
    """Refuse a torch DataLoader that batches what ``dataset`` already batched (its default
    ``batch_size=1`` stacked [1, B, C] batches and tensors out of the counts, a larger one
    failed at the first short batch): found as the fetcher iterating this very dataset among
    the ``depth`` frames from the caller's caller up, with automatic batching on.

    Raises:
        ValueError: names the fix (``batch_size=None`` on the DataLoader).
    """
    from torch.utils.data._utils.fetch import _IterableDatasetFetcher

    for f in _frames(sys._getframe(2), depth):
        owner = f.f_locals.get("self")
        if isinstance(owner, _IterableDatasetFetcher) and owner.dataset is dataset:
            if owner.auto_collation:
                raise ValueError(
                    f"this dataset yields whole batches (batch_size={batch_size}), and the "
                    "DataLoader would batch them again: give it batch_size=None (and no "
                    "collate_fn; the dataset's collate_fn= builds each batch)")
            return


def refuse_accelerate_wrapper(rank: int = 0, world_size: int = 1, *, depth: int = 1,
                              workers: int = 0) -> None:
    """Refuse the accelerate DataLoader wrappers (``Trainer`` prepares its DataLoader with
    accelerate) that would silently break packed batches or a rank's share, found among the
    ``depth`` frames from the function that calls this one up (its callers):

    - ``DataLoaderDispatcher`` (``dispatch_batches``, accelerate's default for an
      ``IterableDataset``, one process included): it slices every tensor of a batch to the
      batch's rows, which cuts ``cu_seqlens`` / ``cu_seq_lens_q`` (one entry per document) to
      B entries, so FlashAttention varlen runs on wrong boundaries; on several processes it
      also concatenates the batches of several steps.
    - ``IterableDatasetShard`` (several processes, ``dispatch_batches=False``) over a dataset
      that is rank ``rank`` of ``world_size`` > 1 already: each process would keep 1 /
      world_size of its share, and the other ranks' rows would never be read; or run in each of
      ``workers`` > 1 DataLoader workers, where it pads each worker's part of the stream on its
      own (rows skipped and repeated, more batches than the DataLoader's length).

    A wrapper is found in the stack of the process that runs the code: DataLoader workers
    started by ``spawn`` or ``forkserver`` do not see the training process's dispatcher (the
    dataset's :meth:`set_epoch`, in the training process, still does).

    Args:
        rank, world_size: the dataset's share.
        depth: frames looked at.
        workers: DataLoader workers of the process (``get_worker_info().num_workers``; 0 in
            the training process).

    Raises:
        ValueError: naming the wrapper and the fix.
    """
    kind = _accelerate_wrapper(sys._getframe(2), depth)  # the caller's callers
    if kind == "DataLoaderDispatcher":
        raise ValueError(
            "packed batches under accelerate's batch dispatching (dispatch_batches, Trainer's "
            "default for an IterableDataset), which slices every tensor of a batch to its rows "
            "and so cuts cu_seqlens / cu_seq_lens_q (the documents' boundaries) short: "
            + _DISPATCH_FIX
            + (f", and build the dataset with rank=0, world_size=1 (it is rank {rank} of "
               f"{world_size}: accelerate then gives each process its share)"
               if world_size > 1 else ""))
    if kind == "IterableDatasetShard" and world_size == 1 and workers > 1:
        raise ValueError(
            f"accelerate's IterableDatasetShard runs in each of the {workers} DataLoader workers "
            "and pads each worker's part of the stream on its own, so rows would be skipped and "
            "repeated: with PackedIterableDataset on several processes under accelerate use "
            "dataloader_num_workers 0 or 1, or PackedDataset (map-style, sharded by index) "
            "with any number of workers")
    if kind == "IterableDatasetShard" and world_size > 1:
        raise ValueError(
            f"PackedIterableDataset is rank {rank} of {world_size} already, and accelerate's "
            f"IterableDatasetShard gives each of its processes a share of what it yields again, "
            "so most rows would never be read: build it with rank=0, world_size=1 under "
            "Trainer / accelerate (each process then reads every row and keeps its own share), "
            "or use PackedDataset, which accelerate shards by index")
