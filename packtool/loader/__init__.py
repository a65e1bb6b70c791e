"""Training on a packed output: datasets, batches, Hugging Face glue.

``import packtool.loader`` needs only NumPy and pyarrow: no numba, no packer, no torch. torch is
imported where a tensor is made (the collate functions) and by
:class:`~packtool.loader.distributed.PackedIterableDataset` (a ``torch.utils.data.IterableDataset``),
which is loaded on first access.

- :class:`PackedIterableDataset`: one output or a weighted mixture of several
  (:mod:`~packtool.loader.mixture`), ranks x DataLoader workers, seeded epochs, bounded shuffle,
  exact and elastic resume (``state_dict``/``load_state_dict``, :mod:`~packtool.loader.resume`),
  whole row groups per rank, rows or whole batches. Train with this (``docs/training.md``).
- :class:`PackedDataset`: any row by index (random access, inspection, verify).
- :func:`collate` ([B, C]), :func:`collate_flat` ([1, B * C], FlashAttention 2 keyword names),
  :class:`HFCollator` (``transformers.Trainer``, ``use_cache=False`` in every batch); all three
  give ``seq_idx`` (int32 document index per token) for hybrid and linear-attention layers.
- :func:`check_isolation`, :class:`IsolationCheck` (a ``Trainer`` callback, loaded on first
  access with transformers): before training, the model fed its collator's batch must give each
  packed document the logits of the document alone.
- :func:`unshifted_labels`, :func:`shifted_labels`: labels derived from ``input_ids`` and
  ``segment_ids`` when the output does not store them.
"""

from __future__ import annotations

from packtool.formats.packed import convert_labels, shifted_labels, unshifted_labels
from packtool.loader.collate import (batch_cu_seqlens, batch_cu_seqlens_unpadded, batch_seq_idx,
                                     collate, collate_flat, count_targets)
from packtool.loader.dataset import PackedDataset
from packtool.loader.hf import HFCollator, Isolation, check_isolation

__all__ = ["PackedIterableDataset", "PackedDataset", "collate", "collate_flat", "HFCollator",
           "check_isolation", "Isolation", "IsolationCheck",
           "batch_cu_seqlens", "batch_cu_seqlens_unpadded", "batch_seq_idx", "count_targets",
           "convert_labels", "unshifted_labels", "shifted_labels"]


def __getattr__(name: str):
    if name == "PackedIterableDataset":  # a torch IterableDataset: import torch only now
        from packtool.loader.distributed import PackedIterableDataset

        return PackedIterableDataset
    if name == "IsolationCheck":  # a transformers TrainerCallback: import it only now
        from packtool.loader.hf import IsolationCheck

        return IsolationCheck
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
