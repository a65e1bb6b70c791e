"""Batches in the forms trainers take, from loader items (torch imported only here, when called).

Shape legend: B = rows in the batch, C = capacity, S = segments in the batch (documents plus one
padding segment per padded row, as ``cu_seqlens`` stores them).

- :func:`collate`: the [B, C] form. ``cu_seqlens`` int32 [S + 1] over the rows flattened to
  [B * C] (what ``flash_attn_varlen_func`` and ``torch.nn.attention.varlen`` take; B06), checked
  to fit int32, and ``max_seqlen`` a Python ``int`` (B24), never a tensor.
- :func:`collate_flat`: the padding-free flattened form, [1, B * C] ``input_ids``,
  ``position_ids``, ``labels`` plus the keyword names Hugging Face passes to FlashAttention 2
  (``cu_seq_lens_q``, ``cu_seq_lens_k`` int32, ``max_length_q``, ``max_length_k`` int), as
  ``transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` names them.
- ``num_targets`` in both: labels != -100 in the batch, the loss denominator (B19, B20): sum the
  token losses over a step's batches and divide once by the sum of their ``num_targets``.

Labels convention. Each batch says which one it holds (``labels_convention``): ``unshifted``
(``labels[i]`` is token ``i`` or -100; the model or the loss shifts, as Hugging Face models do
when given ``labels``) or ``shifted`` (``labels[i]`` is the token after ``i`` or -100; the loss
pairs ``logits[i]`` with ``labels[i]``, no shift). :func:`collate` keeps the convention the
items carry (the dataset's ``labels=`` argument, ``unshifted`` by default); :func:`collate_flat`
and :class:`~packtool.loader.hf.HFCollator` always give ``unshifted``. Items that lost their
convention key (``Trainer`` drops keys its model does not take) are checked against the
convention the collate function is told they carry: labels that contradict it are refused, so
labels are never shifted twice in silence (B05).
"""

from __future__ import annotations

import numpy as np

from packtool.formats.packed import convert_labels, shifted_labels, unshifted_labels
from packtool.types import IGNORE_INDEX

__all__ = ["collate", "collate_flat", "batch_cu_seqlens", "count_targets",
           "require_torch", "INT32_MAX", "CONVENTIONS"]

#: The two labels conventions (see the module docstring).
CONVENTIONS = ("unshifted", "shifted")

#: Largest value an int32 ``cu_seqlens`` can hold: B * C must not exceed it.
INT32_MAX = 2**31 - 1


def require_torch():
    """Import and return torch (the one place packtool imports it for the loader and verify).

    Raises:
        MissingDependencyError: torch is not installed (names what to install).
    """
    try:
        import torch
    except ImportError:
        from packtool.errors import MissingDependencyError, install_hint

        raise MissingDependencyError(
            "torch is not installed; the torch loader and packtool verify need it: "
            + install_hint("verify")) from None
    return torch


def _capacity(batch: list[dict]) -> int:
    if not batch:
        raise ValueError("collate needs at least one row")
    C = len(batch[0]["input_ids"])
    if any(len(item["input_ids"]) != C for item in batch):
        raise ValueError("rows of different capacity in one batch")
    return C


def segments_of(item: dict) -> np.ndarray:
    """int[C] segment numbering of one item: its ``segment_ids``, or, when a trainer dropped
    them, one number per run of ``position_ids`` restarting at 0 (the padding tail, positions
    0..p-1, is then one more segment, as ``cu_seqlens`` counts it)."""
    seg = item.get("segment_ids")
    if seg is not None:
        return np.asarray(seg)
    return np.cumsum(np.asarray(item["position_ids"]) == 0)


def _row_cu(item: dict) -> np.ndarray:
    """int64[k + 1 (+1)], one row's cu_seqlens (stored, or rebuilt from the segments)."""
    cu = item.get("cu_seqlens")
    if cu is not None:
        return np.asarray(cu, dtype=np.int64)
    seg = segments_of(item)
    starts = np.flatnonzero(np.concatenate([[True], seg[1:] != seg[:-1]]))
    return np.concatenate([starts, [len(seg)]]).astype(np.int64)


def batch_cu_seqlens(batch: list[dict]) -> tuple[np.ndarray, int]:
    """Batch boundaries of rows laid end to end: (int32[S + 1], max_seqlen as a Python int).

    Row r's boundaries are offset by r * C; the last entry is B * C, so padding tails are covered
    (B07) and every segment is non-empty (B08).

    Raises:
        ValueError: empty batch, rows of different capacity.
        OverflowError: B * C > 2**31 - 1, which int32 boundaries cannot hold (use fewer rows per
            batch).
    """
    C = _capacity(batch)
    B = len(batch)
    if B * C > INT32_MAX:
        raise OverflowError(f"batch of {B} rows x {C} tokens = {B * C} positions does not fit "
                            f"int32 cu_seqlens (max {INT32_MAX}); use at most "
                            f"{INT32_MAX // C} rows per batch")
    cus = [_row_cu(item) for item in batch]
    parts = [cu[:-1] + r * C for r, cu in enumerate(cus)] + [np.array([B * C], np.int64)]
    cu_seqlens = np.concatenate(parts)  # shape: (S + 1,)
    max_seqlen = max(int(np.diff(cu).max()) for cu in cus)
    return cu_seqlens.astype(np.int32), int(max_seqlen)


def count_targets(labels) -> int:
    """Effective targets: ``labels != -100`` (NumPy array or tensor), as a Python int."""
    return int((labels != IGNORE_INDEX).sum())


def _stack(batch: list[dict], name: str) -> np.ndarray:
    return np.stack([np.asarray(item[name]) for item in batch])  # shape: (B, C)


def _item_convention(item: dict) -> str | None:
    """The labels convention an item says it carries (None: it does not say)."""
    mode = item.get("labels_convention", item.get("labels_mode"))
    return "unshifted" if mode == "none" else mode  # derived by the unshifted rule


def _check_convention(lab: np.ndarray, ids: np.ndarray, seg: np.ndarray, mode: str) -> None:
    """Refuse labels that contradict ``mode``: unshifted labels are token ``i`` or -100,
    shifted ones the next token of the same segment or -100.

    Raises:
        ValueError: names the first row and position that does not fit, and the fix.
    """
    if mode == "unshifted":
        ok = (lab == IGNORE_INDEX) | (lab == ids)
    else:
        nxt = np.full(ids.shape, -1, dtype=np.int64)  # shape: (B, C)
        same = seg[:, 1:] == seg[:, :-1]
        nxt[:, :-1] = np.where(same, ids[:, 1:], -1)
        ok = (lab == IGNORE_INDEX) | (lab == nxt)
    if ok.all():
        return
    r, i = (int(x[0]) for x in np.nonzero(~ok))
    other = "shifted" if mode == "unshifted" else "unshifted"
    raise ValueError(
        f"batch row {r}, position {i}: label {int(lab[r, i])} is not {mode} (token there: "
        f"{int(ids[r, i])}); these items carry {other} labels but do not say so (a trainer "
        f"dropped their 'labels_convention' key?): build the dataset with labels='{mode}' so "
        "that no labels are shifted twice")


def _labels(batch: list[dict], want: str | None = None,
            default_mode: str = "unshifted") -> tuple[np.ndarray, str]:
    """int[B, C] labels of the batch and their convention.

    Args:
        want: the convention to hand out (converted inside each segment); None: the items'.
        default_mode: the convention of items that do not say (checked against the values).
    """
    mode = _item_convention(batch[0])
    seg = np.stack([segments_of(item) for item in batch])  # shape: (B, C)
    ids = _stack(batch, "input_ids")
    if "labels" not in batch[0]:
        out = want or mode or "unshifted"
        fn = shifted_labels if out == "shifted" else unshifted_labels
        return fn(ids, seg), out
    lab = _stack(batch, "labels")
    if mode is None:
        mode = default_mode
        _check_convention(lab, ids, seg, mode)
    out = want or mode
    return (convert_labels(lab, seg, mode, out) if out != mode else lab), out


def collate(batch: list[dict]) -> dict:
    """Stack loader items into the [B, C] training batch.

    Args:
        batch: B >= 1 items of :class:`~packtool.loader.PackedDataset` or
            :class:`~packtool.loader.PackedIterableDataset` (same capacity C).

    Returns:
        dict with
        ``input_ids``, ``labels``, ``position_ids``, ``segment_ids``: torch.int64 [B, C]
        (int64 for embedding lookup, RoPE indexing and the loss, B28; labels in the items'
        convention, named by ``labels_convention``);
        ``cu_seqlens``: torch.int32 [S + 1] (see :func:`batch_cu_seqlens`);
        ``max_seqlen``: Python int, the longest segment (B24);
        ``num_targets``: Python int, labels != -100 in the batch (the loss denominator, B20);
        ``labels_convention``: ``unshifted`` (the loss shifts: ``logits[:, :-1]`` against
        ``labels[:, 1:]``) or ``shifted`` (no shift: ``logits`` against ``labels``);
        ``labels_mode``: the same (older name); ``shard``, ``row``, ``index``: lists of B
        provenance values;
        ``doc_ids``: list of B int64 arrays.

    Raises:
        ValueError: empty batch or rows of different capacity; items that do not say their
            labels convention and whose labels are not unshifted.
        OverflowError: B * C does not fit int32 ``cu_seqlens``.
        MissingDependencyError: torch is missing.
    """
    torch = require_torch()
    cu_seqlens, max_seqlen = batch_cu_seqlens(batch)
    labels, convention = _labels(batch)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))

    return {
        "input_ids": t(_stack(batch, "input_ids")),
        "labels": t(labels),
        "position_ids": t(_stack(batch, "position_ids")),
        "segment_ids": t(np.stack([segments_of(item) for item in batch])),
        "cu_seqlens": torch.from_numpy(cu_seqlens),
        "max_seqlen": max_seqlen,
        "num_targets": count_targets(labels),
        "labels_convention": convention,
        "labels_mode": convention,
        "shard": [item.get("shard") for item in batch],
        "row": [item.get("row") for item in batch],
        "index": [item.get("index") for item in batch],
        "doc_ids": [item.get("doc_ids") for item in batch],
    }


def collate_flat(batch: list[dict]) -> dict:
    """The padding-free flattened form: B rows laid end to end as one sequence of B * C tokens.

    Padding tails stay in place as their own segments (labels -100), so ``cu_seqlens`` is the one
    of :func:`collate` and covers every position. Labels are unshifted (converted when the
    output stores shifted ones), since the Hugging Face models this form feeds shift themselves.

    Returns:
        dict with ``input_ids``, ``position_ids``, ``labels``: torch.int64 [1, B * C];
        ``cu_seq_lens_q``, ``cu_seq_lens_k``: the same torch.int32 [S + 1] tensor;
        ``max_length_q``, ``max_length_k``: Python int; ``num_targets``: Python int;
        ``labels_convention``: ``unshifted``.

    Raises:
        ValueError, OverflowError, MissingDependencyError: as :func:`collate`.
    """
    torch = require_torch()
    cu_seqlens, max_seqlen = batch_cu_seqlens(batch)
    labels, _ = _labels(batch, want="unshifted")

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64).reshape(1, -1))

    cu = torch.from_numpy(cu_seqlens)
    return {
        "input_ids": t(_stack(batch, "input_ids")),
        "position_ids": t(_stack(batch, "position_ids")),
        "labels": t(labels),
        "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
        "max_length_q": max_seqlen, "max_length_k": max_seqlen,
        "num_targets": count_targets(labels),
        "labels_convention": "unshifted",
    }
