"""The torch data path over a packed output: a map-style ``Dataset`` and its ``collate``.

Shape legend: B = rows in the batch, C = capacity, S = total segments in the batch (documents plus
one padding segment per padded row, as stored in ``cu_seqlens``).

``collate`` returns exactly what document-masked attention kernels take:
``cu_seqlens`` int32 [S + 1] (``flash_attn_varlen_func``, ``torch.nn.attention.varlen``; B06) on the
rows flattened to [B * C], and ``max_seqlen`` a Python ``int`` (B24), never a tensor.
"""

from __future__ import annotations

import os

import numpy as np

from packtool.formats.packed import PackedReader
from packtool.types import IGNORE_INDEX
from packtool.verify import require_torch

__all__ = ["PackedDataset", "collate", "unshifted_labels"]

_ROW_COLUMNS = ("input_ids", "segment_ids", "position_ids", "labels", "cu_seqlens",
                "max_seqlen", "num_targets", "doc_ids", "doc_offsets")


class PackedDataset:
    """Map-style dataset over a packed OUTPUT directory (any row by index).

    Reads the manifest (refusing edited or missing shards) and reads one Parquet row group at a
    time, so memory stays at one row group whatever the output size. Each item is a dict of
    NumPy values: ``input_ids``, ``segment_ids``, ``position_ids``, ``labels`` int32[C]
    (derived by the unshifted rule when the output was packed with ``--labels none``), ``cu_seqlens``
    int32[k + 1 (+1 with padding)], ``max_seqlen``, ``num_targets`` ints, ``doc_ids``,
    ``doc_offsets`` int64[k], and ``shard``, ``row``, ``index``.

    It subclasses nothing so that importing it needs no torch; ``torch.utils.data.DataLoader``
    accepts any object with ``__len__`` and ``__getitem__``.

    Args:
        path: the OUTPUT directory of ``packtool pack``.

    Raises:
        ManifestError: see :class:`~packtool.formats.packed.PackedReader`.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.reader = PackedReader(path)
        self.capacity = self.reader.capacity
        self.labels_mode = self.reader.labels_mode
        self._cols = [c for c in _ROW_COLUMNS if c in self.reader.columns]

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> dict:
        row = self.reader.read_row(int(index), self._cols)
        if "labels" not in row:  # packed with --labels none: derive the unshifted labels
            row["labels"] = unshifted_labels(row["input_ids"], row["segment_ids"])
        row["labels_mode"] = self.labels_mode
        return row


def unshifted_labels(input_ids: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """Unshifted labels of one row from its tokens and segments (the output contract's rule).

    Args:
        input_ids: int[C]; segment_ids: int[C] (0 = padding).

    Returns:
        int32[C]: ``input_ids``, except -100 at each segment's first token and on padding.
    """
    ids = np.asarray(input_ids, dtype=np.int32)
    seg = np.asarray(segment_ids)
    first = np.ones(seg.shape, dtype=bool)  # shape: (C,)
    first[1:] = seg[1:] != seg[:-1]
    return np.where(first | (seg == 0), np.int32(IGNORE_INDEX), ids).astype(np.int32)


def collate(batch: list[dict]) -> dict:
    """Stack rows of :class:`PackedDataset` into a training batch.

    Args:
        batch: B >= 1 items of :class:`PackedDataset` (all of the same capacity C).

    Returns:
        dict with
        ``input_ids``, ``labels``, ``position_ids``, ``segment_ids``: torch.int64 [B, C];
        ``cu_seqlens``: torch.int32 [S + 1], row r's boundaries offset by r * C, ending at B * C
        (padding tails count as segments, as stored, so the flattened buffer is covered, B07);
        ``max_seqlen``: Python int, the longest segment in the batch;
        ``num_targets``: Python int, labels != -100 in the batch (the loss denominator, B20);
        ``shard``, ``row``: lists of B provenance values; ``doc_ids``: list of B int64 arrays.

    Raises:
        ValueError: empty batch or rows of different capacity.
        MissingDependencyError: torch is missing.
    """
    torch = require_torch()
    if not batch:
        raise ValueError("collate needs at least one row")
    C = len(batch[0]["input_ids"])
    if any(len(item["input_ids"]) != C for item in batch):
        raise ValueError("rows of different capacity in one batch")

    def stack(name):  # shape: (B, C), int64 for embedding lookup, RoPE indexing and loss (B28)
        return torch.from_numpy(np.stack([np.asarray(item[name]) for item in batch])
                                .astype(np.int64))

    cu = [np.asarray(item["cu_seqlens"], dtype=np.int64)[:-1] + r * C
          for r, item in enumerate(batch)]
    cu_seqlens = np.concatenate(cu + [np.array([len(batch) * C], dtype=np.int64)])  # (S + 1,)
    max_seqlen = max(int(np.diff(np.asarray(item["cu_seqlens"])).max()) for item in batch)
    labels = stack("labels")
    return {
        "input_ids": stack("input_ids"),
        "labels": labels,
        "position_ids": stack("position_ids"),
        "segment_ids": stack("segment_ids"),
        "cu_seqlens": torch.from_numpy(cu_seqlens.astype(np.int32)),
        "max_seqlen": int(max_seqlen),
        "num_targets": int((labels != IGNORE_INDEX).sum()),
        "shard": [item.get("shard") for item in batch],
        "row": [item.get("row") for item in batch],
        "doc_ids": [item.get("doc_ids") for item in batch],
    }
