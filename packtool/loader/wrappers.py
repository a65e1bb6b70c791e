"""Accelerate's DataLoader wrappers that would silently break packed batches or a rank's share.

``transformers.Trainer`` (and ``Accelerator.prepare``) wrap a DataLoader: for an
``IterableDataset`` by default in a ``DataLoaderDispatcher``, which reads the batches in one
process and slices every tensor of a batch to its rows, cutting ``cu_seqlens`` /
``cu_seq_lens_q`` (one entry per document, not per row) short; on several processes with
``dispatch_batches=False`` in an ``IterableDatasetShard``, which gives each process a share of
the dataset's items. The datasets and collate functions of :mod:`packtool.loader` look for them
in the Python stack and refuse, naming the fix (``docs/training.md``); so does a dataset that
yields whole batches for a torch DataLoader that would batch them again, and
:func:`~packtool.loader.collate.collate` / :func:`~packtool.loader.collate.collate_flat` made
``transformers.Trainer``'s data collator, whose every key the Trainer hands to the model.
"""

from __future__ import annotations

import sys
import weakref

__all__ = ["refuse_accelerate_wrapper", "refuse_dataloader_batching",
           "map_fetcher_checked", "refuse_trainer_collate", "refuse_trainer_collate_fn"]

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


def _ragged(dataset) -> bool:
    """Whether ``dataset``'s items carry a per-document column (one entry per document, not
    per token: ``cu_seqlens``, ``doc_ids``...), which torch's default collate cannot stack; items
    of per-token columns only (``columns=`` such a subset) it stacks."""
    from packtool.formats.schema import RAGGED_COLUMNS

    return any(c in RAGGED_COLUMNS for c in getattr(dataset, "columns", RAGGED_COLUMNS))


def _refuse_default_collate(fetcher, dataset, other_fix: str = "") -> None:
    """Raise when DataLoader ``fetcher`` batches ``dataset``'s items with torch's
    ``default_collate`` and they carry per-document columns it cannot stack."""
    from torch.utils.data._utils.collate import default_collate

    if fetcher.auto_collation and fetcher.collate_fn is default_collate and _ragged(dataset):
        raise ValueError(
            "the DataLoader batches this dataset's items with torch's default collate, which "
            "cannot stack their per-document columns (cu_seqlens, doc_ids): give it "
            "collate_fn=collate (packtool.loader; or collate_flat, HFCollator())" + other_fix)


def refuse_dataloader_batching(dataset, batch_size: int | None, *, depth: int = 8) -> bool:
    """Refuse a torch DataLoader that batches ``dataset``'s output in a way that cannot work,
    found as the fetcher iterating this very dataset among the ``depth`` frames from the
    caller's caller up, with automatic batching on:

    - ``batch_size`` set (the dataset yields whole batches): the DataLoader would batch them
      again (its default ``batch_size=1`` stacked [1, B, C] batches and tensors out of the
      counts, a larger one failed at the first short batch);
    - ``batch_size`` None (the dataset yields items) and torch's ``default_collate``: the
      items' ragged columns (``cu_seqlens``, ``doc_ids``: one entry per document) cannot be
      stacked, and it failed inside torch ("stack expects each tensor to be equal size").

    Returns:
        True when a DataLoader fetcher of ``dataset`` batches what it yields (automatic
        batching on), False otherwise (none found, or ``batch_size=None`` on the DataLoader).

    Raises:
        ValueError: names the fix (``batch_size=None`` on the DataLoader; or
            ``collate_fn=collate`` and its kin, or batches built by the dataset).
    """
    from torch.utils.data._utils.fetch import _IterableDatasetFetcher

    for f in _frames(sys._getframe(2), depth):
        owner = f.f_locals.get("self")
        if isinstance(owner, _IterableDatasetFetcher) and owner.dataset is dataset:
            if owner.auto_collation and batch_size is not None:
                raise ValueError(
                    f"this dataset yields whole batches (batch_size={batch_size}), and the "
                    "DataLoader would batch them again: give it batch_size=None (and no "
                    "collate_fn; the dataset's collate_fn= builds each batch)")
            _refuse_default_collate(owner, dataset, ", or build the dataset with batch_size=B "
                                                    "and give the DataLoader batch_size=None")
            return bool(owner.auto_collation)
    return False


def map_fetcher_checked(dataset, checked=None, *, depth: int = 4):
    """For a map-style ``dataset``'s ``__getitem__``: refuse torch's ``default_collate`` as the
    DataLoader fetcher that calls it batches the items (their per-document columns cannot be
    stacked; it failed inside torch), found among the ``depth`` frames from the caller's
    caller up. A fetcher is looked at once: ``checked``, the one this returned before, is not
    checked again; every other fetcher is (a dataset read by a DataLoader that batches fine,
    then by one with the default collate, is refused there).

    Returns:
        The DataLoader fetcher calling it (fine), or None when none does (a direct
        ``dataset[i]``).

    Raises:
        ValueError: names the fix (``collate_fn=collate`` and its kin).
    """
    fetch = sys.modules.get("torch.utils.data._utils.fetch")
    if fetch is None:  # no DataLoader in this process
        return None
    for f in _frames(sys._getframe(2), depth):
        if f.f_code.co_name != "fetch":  # a method's frame; locals only of that one
            continue
        owner = f.f_locals.get("self")
        if isinstance(owner, fetch._MapDatasetFetcher) and owner.dataset is dataset:
            if owner is not checked:
                _refuse_default_collate(owner, dataset)
            return owner
    return None


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


def _trainer_fix(name: str) -> str:
    """The one-line refusal of collate function ``name`` as ``transformers.Trainer``'s
    ``data_collator``."""
    flat = name == "collate_flat"
    form = "HFCollator(flatten=True)" if flat else "HFCollator()"
    return (f"{name} as transformers.Trainer's data_collator: Trainer hands every key of the "
            f"batch to the model's forward, and {name}'s are for a loop of one's own (its "
            "provenance key source clashes with the loss function's own source argument, "
            + ("" if flat else "segment_ids, cu_seqlens, max_seqlen, ")
            + "num_targets, labels_convention, shard, row, index and doc_ids are not model "
            "inputs, and without use_cache=False a Hugging Face model "
            f"lets packed documents attend to each other): give the Trainer data_collator="
            f"{form} (packtool.loader), which holds only keywords the model takes")


def _trainer_above(frame, depth: int) -> bool:
    """Whether ``frame`` or one of the ``depth - 1`` frames that called it runs code of
    ``transformers.trainer`` (``Trainer``'s training or evaluation loop, subclasses included)."""
    if "transformers.trainer" not in sys.modules:  # no Trainer in this process
        return False
    return any(f.f_globals.get("__name__") == "transformers.trainer"
               for f in _frames(frame, depth))


#: DataLoader fetchers (one per DataLoader iteration) found outside a Trainer's loop
_FETCHERS_OUTSIDE_TRAINER: "weakref.WeakSet" = weakref.WeakSet()


def refuse_trainer_collate(name: str, *, depth: int = 64) -> None:
    """Refuse collate function ``name`` (``collate``, ``collate_flat``) called as
    ``transformers.Trainer``'s ``data_collator``, found from the function that calls this one:

    - called by Trainer's ``RemoveColumnsCollator`` (``remove_unused_columns``, the default), in
      the training process or a DataLoader worker, one frame looked at;
    - called by a torch DataLoader fetcher in a process whose stack, ``depth`` frames up, holds
      Trainer's loop (``remove_unused_columns=False`` without DataLoader workers), looked for
      once per fetcher (one per iteration of a DataLoader) while ``transformers.trainer`` is
      imported. In a worker no Trainer is seen there: :meth:`PackedIterableDataset.set_epoch
      <packtool.loader.distributed.PackedIterableDataset.set_epoch>` looks at the DataLoader's
      ``collate_fn`` in the training process instead (:func:`refuse_trainer_collate_fn`); a
      ``PackedDataset`` read by workers without the column removal goes unseen.

    A function of one's own that calls ``name`` and hands the Trainer other keys is not refused.

    Raises:
        ValueError: naming ``HFCollator`` (its batches hold only keywords the model takes).
    """
    caller = sys._getframe(2)  # the collate function's caller
    module = caller.f_globals.get("__name__", "")
    if module == "transformers.trainer_utils":
        if type(caller.f_locals.get("self")).__name__ == "RemoveColumnsCollator":
            raise ValueError(_trainer_fix(name))
    elif module == "torch.utils.data._utils.fetch" and "transformers.trainer" in sys.modules:
        fetcher = caller.f_locals.get("self")
        if fetcher in _FETCHERS_OUTSIDE_TRAINER:  # looked at already: the same loop drives it
            return
        if _trainer_above(caller, depth):
            raise ValueError(_trainer_fix(name))
        if fetcher is not None:
            _FETCHERS_OUTSIDE_TRAINER.add(fetcher)


def refuse_trainer_collate_fn(*, depth: int = 16) -> None:
    """In a dataset's ``set_epoch`` (the training process, before the epoch's first batch):
    refuse ``collate`` / ``collate_flat`` as the ``collate_fn`` of the accelerate DataLoader
    that ``transformers.Trainer`` calls it through, found among the ``depth`` frames from the
    caller's caller up (``Trainer`` -> accelerate's ``DataLoaderShard.set_epoch`` -> the
    dataset), Trainer's ``RemoveColumnsCollator`` around it or not. It catches what
    :func:`refuse_trainer_collate` cannot see: the collate run in DataLoader workers with
    ``remove_unused_columns=False``.

    Raises:
        ValueError: as :func:`refuse_trainer_collate`.
    """
    if "transformers.trainer" not in sys.modules:
        return
    for f in _frames(sys._getframe(2), depth):
        if f.f_globals.get("__name__", "").startswith("accelerate."):
            fn = getattr(f.f_locals.get("self"), "collate_fn", None)  # a DataLoaderShard's
            if fn is None:
                continue
            fn = getattr(fn, "data_collator", fn)  # inside Trainer's RemoveColumnsCollator
            if getattr(fn, "forward_keywords", True) is False and _trainer_above(f, depth):
                raise ValueError(_trainer_fix(fn.__name__))
            return
