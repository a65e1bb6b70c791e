"""Batches in the forms trainers take, from loader items or gathered rows (torch imported only
here, when called).

Shape legend: B = rows in the batch, C = capacity, S = segments in the batch (documents plus one
padding segment per padded row, as ``cu_seqlens`` stores them).

Every function takes either a list of items (dicts, as a ``DataLoader`` hands them over) or a
:class:`~packtool.formats.packed.Rows` (what
:class:`~packtool.loader.distributed.PackedIterableDataset` gathers with ``batch_size``: rows as
slices of the decoded row groups, no per-row dict), and builds the batch in one step per column.
Gathered rows that hold ``input_ids`` and the spans only (``cu_seqlens``, ``doc_ids``: what the
training batches read) get segments, positions, labels, ``seq_idx`` and the batch boundaries
from one pass over each row (:func:`packtool.core.structure.row_structure`), each array
written once in the dtype handed out.

- :func:`collate`: the [B, C] form. ``cu_seqlens`` int32 [S + 1] over the rows flattened to
  [B * C] (what ``flash_attn_varlen_func`` and ``torch.nn.attention.varlen`` take; B06), checked
  to fit int32, and ``max_seqlen`` a Python ``int`` (B24), never a tensor.
- :func:`collate_flat`: the flattened (varlen) form, [1, B * C] ``input_ids``,
  ``position_ids``, ``labels`` plus the keyword names Hugging Face passes to FlashAttention 2
  (``cu_seq_lens_q``, ``cu_seq_lens_k`` int32, ``max_length_q``, ``max_length_k`` int), as
  ``transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` names them.
- ``token_source_ids`` in both, for rows with ``source_ids`` (``pack --source-column``): int32,
  each token's segment's source id, -1 on padding, [B, C] or [1, B * C]. Not in
  :class:`~packtool.loader.hf.HFCollator`'s batches, every key of which reaches the model.
- ``num_targets`` in both: labels != -100 in the batch, the loss denominator (B19, B20): sum the
  token losses over a step's batches and divide once by the sum of their ``num_targets``.
- ``seq_idx`` in both (and in :class:`~packtool.loader.hf.HFCollator`): int32, the index of the
  ``cu_seqlens`` span each token lies in (documents 0, 1, ..., then the padding tail), [B, C]
  counted per row or [1, B * C] counted over the flattened batch. It is what Mamba-2 / SSD and
  short-convolution layers need to reset their state at each document start
  (``causal_conv1d_fn(x, w, b, seq_idx=...)`` and ``mamba_chunk_scan_combined(...,
  seq_idx=...)`` take int32 (batch, seqlen); Hugging Face hybrid models take the ``seq_idx``
  keyword, as ``DataCollatorWithFlattening(return_seq_idx=True)`` names it; Megatron derives
  the same index from ``cu_seqlens_q_padded``). An end-of-document token is no boundary for
  these layers: without ``seq_idx`` the convolution window and the recurrent state carry one
  document into the next.
- With an output packed with ``--segment-multiple N`` (context parallelism), both also give
  TransformerEngine / Megatron ``PackedSeqParams`` names: ``cu_seqlens_q`` = ``cu_seqlens_kv``
  (real lengths summed), ``cu_seqlens_q_padded`` = ``cu_seqlens_kv_padded`` (the padded spans,
  equal to ``cu_seqlens``), int32 [S + 1], and ``max_seqlen_q`` = ``max_seqlen_kv`` (int, the
  longest span). Each document's span then ends in padding (``segment_ids`` 0, labels -100,
  positions going on), which belongs to that document's span, not to the next.

**Dtypes.** ``input_ids``, ``segment_ids`` and ``token_source_ids`` are int32, as stored:
``nn.Embedding`` and Hugging Face causal LMs index with int32 as with int64. ``position_ids`` are
int64 (``torch.long``): position code indexes rotary tables and position embeddings with them,
and some of it (sglang, vLLM kernels, ``index_select`` paths) takes only a long tensor (B28).
``labels`` are int64: ``cross_entropy`` / ``nll_loss`` refuse int32 class targets. Inside a
DataLoader worker a batch crosses to the training process with its arrays pickled by value (one
copy), not as one shared-memory segment per tensor, which cost more CPU than the copy.

**What each form needs.** The padding tail is not a document: only ``segment_ids`` (0 on
padding) or ``labels`` (-100 on padding) tell it apart; positions alone cannot (the tail restarts
at 0 like a document, and labels derived from them would train it). Every form needs
``input_ids`` and either ``segment_ids``, ``cu_seqlens`` with ``doc_ids`` (and
``cu_seqlens_unpadded`` for a ``--segment-multiple`` output, whose spans are padded documents),
or ``position_ids`` with ``labels`` (what ``transformers.Trainer`` leaves of an item); missing
positions are rebuilt from the spans.
Items without them are refused with the columns named, never batched with an invented
boundary, and :func:`check_item_columns` refuses a dataset whose ``columns=`` cannot make a
batch. Rebuilt from positions, ``segment_ids`` is 0 on the padding tail when a per-segment
column (``doc_ids``, ``source_ids``, ``doc_offsets``) says how many documents a row holds;
without one, a row's last span is taken for the padding tail when it holds no target (labels
all -100), so a last document without targets is numbered 0 as well (no loss changes, and
no attention between documents).

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

from typing import Mapping, Sequence

import numpy as np

from packtool.formats.packed import Rows, convert_labels
from packtool.loader import pool
from packtool.loader.wrappers import refuse_accelerate_wrapper, refuse_trainer_collate
from packtool.types import IGNORE_INDEX

__all__ = ["collate", "collate_flat", "batch_cu_seqlens", "batch_cu_seqlens_unpadded",
           "batch_seq_idx", "count_targets", "rows_of", "check_item_columns", "require_torch",
           "INT32_MAX", "CONVENTIONS"]

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


# --- what each form needs -------------------------------------------------------------------

#: The columns beside ``input_ids`` that tell the padding tail from a document: any one set
#: will do (an output packed with ``--segment-multiple``: the spans it stores, only).
_SPAN_SETS = (("segment_ids",), ("cu_seqlens", "doc_ids"), ("position_ids", "labels"))
_PADDED_SPAN_SETS = (("cu_seqlens", "cu_seqlens_unpadded", "doc_ids"),)


def _and(names) -> str:
    return " and ".join(names)


def _ways(have, padded: bool = False) -> list[str]:
    """Every way to complete columns ``have`` into a batch, in words, the fewest columns to add
    first ("doc_ids (beside cu_seqlens)"); empty when they already make one."""
    have = set(have)
    sets = _PADDED_SPAN_SETS if padded else _SPAN_SETS
    if any(set(cols) <= have for cols in sets):
        return []
    ways = []
    for cols in sorted(sets, key=lambda cols: len(set(cols) - have)):
        lack = [c for c in cols if c not in have]
        kept = [c for c in cols if c in have]
        ways.append(_and(lack) + (f" (beside {_and(kept)})" if kept else ""))
    return ways


def _missing(have, padded: bool = False) -> str | None:
    """What a batch lacks among columns ``have``, naming every set of columns that would
    complete it: ``input_ids``, and one of :data:`_SPAN_SETS` ("one of: segment_ids; doc_ids
    (beside cu_seqlens); position_ids and labels"). None: nothing."""
    have = set(have)
    ways = _ways(have, padded)
    need = [] if "input_ids" in have else ["input_ids"]
    if ways:
        need.append(ways[0] if len(ways) == 1 else "one of: " + "; ".join(ways))
    return ", and ".join(need) or None


def check_item_columns(columns: Sequence[str], *, labels_stored: bool = True,
                       padded: bool = False) -> None:
    """Refuse columns no collate function can make a correct batch of. Every form needs
    ``input_ids`` and one of: ``segment_ids`` (0 on the padding tail), ``cu_seqlens`` with
    ``doc_ids`` (the segments past the documents are the padding tail), or ``position_ids``
    with ``labels`` (-100 on the padding tail). Positions alone restart at 0 on the padding
    tail as on a document, and labels derived from them would train it. With ``padded`` (an
    output packed with ``--segment-multiple``: a span is a document and its padding) only the
    stored spans will do: ``cu_seqlens``, ``cu_seqlens_unpadded`` and ``doc_ids``.

    Raises:
        ValueError: names the columns given, every set of columns that would complete them and
            the fix.
    """
    missing = _missing(columns, padded)
    if missing and padded:
        raise ValueError(
            f"an output packed with --segment-multiple: a batch's spans are its documents with "
            f"their padding, which segment_ids and positions cannot rebuild (the padding inside "
            f"a span would become a span of its own), so items need input_ids, cu_seqlens, "
            f"cu_seqlens_unpadded and doc_ids (columns: {', '.join(sorted(set(columns)))}; "
            f"missing {missing}): add them to columns=")
    have = set(columns)
    if missing and "labels" in have and not have & {"position_ids", "segment_ids",
                                                     "cu_seqlens"}:
        # a Trainer keeps the columns its model's forward names: labels kept, positions not
        raise ValueError(
            f"a batch needs position_ids beside input_ids and labels (columns: "
            f"{', '.join(sorted(have))}; missing {missing}): keep position_ids in "
            "columns=; TRL's SFTTrainer keeps only "
            "input_ids, labels and seq_lengths (pass remove_unused_columns=False in its "
            "config); Trainer's remove_unused_columns drops it only for a model whose forward "
            "takes no position_ids (BLOOM, MPT and a few more), which cannot keep the "
            "documents of a packed row apart whatever the batch holds: train such a model on "
            "unpacked rows, or a model that takes position_ids (packtool verify --hf-config "
            "shows which keep documents apart)")
    if missing:
        raise ValueError(
            f"a batch needs input_ids and segment_ids (or cu_seqlens and doc_ids, or "
            f"position_ids and labels) (columns: {', '.join(sorted(have)) or 'none'}; missing "
            f"{missing}): without segment_ids, the spans (cu_seqlens and doc_ids) or labels the "
            "padding tail cannot be told from a document; keep them in columns= (a trainer that "
            "drops item columns its model does not name, such as TRL's SFTTrainer, needs "
            "remove_unused_columns=False, or the labels stored: pack with --labels unshifted, "
            "or pack_dataset(..., labels='unshifted'))")


def _needs(columns) -> None:
    check_item_columns(columns)


# --- items -> rows --------------------------------------------------------------------------

_TOKENS = ("input_ids", "segment_ids", "position_ids", "labels")
_RAGGED = ("cu_seqlens", "cu_seqlens_unpadded", "doc_ids", "doc_offsets", "source_ids")
_SCALARS = ("max_seqlen", "num_targets")
_COLUMNS = _TOKENS + _RAGGED + _SCALARS


def _convention(item) -> str | None:
    """The labels convention an item says it carries (``labels_convention``, or the older
    ``labels_mode``; ``none``, labels derived by the unshifted rule, is ``unshifted``), or
    None when it does not say."""
    mode = item.get("labels_convention", item.get("labels_mode"))
    return "unshifted" if mode == "none" else mode


def _spans_cover(flat: np.ndarray, offs: np.ndarray, C: int) -> bool:
    """True when every item's ``cu_seqlens`` (``flat``, the items' 1-D arrays concatenated,
    item ``i`` at ``offs[i]:offs[i + 1]``) rises strictly from 0 to ``C``: one pass over the
    batch (B07)."""
    if (np.diff(offs) < 2).any():
        return False
    if (flat[offs[:-1]] != 0).any() or (flat[offs[1:] - 1] != C).any():
        return False
    rise = np.diff(flat) > 0
    rise[offs[1:-1] - 1] = True  # the step from one item's C to the next item's 0
    return bool(rise.all())


def _refuse_spans(parts: list, C: int) -> None:
    """Raise the B07 error naming the first item whose ``cu_seqlens`` does not rise from 0 to
    ``C``."""
    for i, p in enumerate(parts):
        if p.ndim != 1 or p.size < 2 or p[0] != 0 or p[-1] != C or not (np.diff(p) > 0).all():
            raise ValueError(
                f"batch item {i}: cu_seqlens {p.tolist()[:8]}"
                f"{' ...' if p.size > 8 else ''} must rise from 0 to C = {C} (the "
                "padding tail a span of its own, no empty span); keep the "
                "row's stored cu_seqlens")


def _same_columns(batch) -> None:
    """Refuse items that do not carry the same columns a batch is built of (``_TOKENS``,
    ``_RAGGED``, ``_SCALARS``): a batch takes its columns from its first item, so a column the
    others lack would fail deep inside, and one the first lacks would be left out in silence
    (rows of outputs packed with other options, e.g. ``--segment-multiple`` or
    ``--source-column``, in one batch)."""
    first = batch[0]
    have = [k for k in _COLUMNS if k in first]
    for i, item in enumerate(batch):
        if sum(k in item for k in _COLUMNS) == len(have) and all(k in item for k in have):
            continue  # the same columns
        only_first = [k for k in have if k not in item]
        only_this = [k for k in _COLUMNS if k in item and k not in first]
        said = "; ".join(
            f"only item {j} carries {', '.join(ks)}"
            for j, ks in ((0, only_first), (i, only_this)) if ks)
        raise ValueError(
            f"batch items 0 and {i} carry different columns ({said}): rows of outputs packed "
            "with other options (--segment-multiple, --source-column, --labels) or read with "
            "other columns= cannot share a batch; read them with the same columns=, or batch "
            "each output's rows apart")


_ROW_DICTS = ("items must be a list of row dicts (python, numpy or torch format: "
              "[d[i] for i in range(...)], with d.with_format('numpy') for a datasets.Dataset)")


def _kind(x) -> str | None:
    """What a table-like ``x`` is (``pandas DataFrame``, ``pyarrow Table``, ...) when it
    comes from pandas, pyarrow or polars, else None."""
    module = type(x).__module__.split(".")[0]
    if module in ("pandas", "pyarrow", "polars"):
        return f"{module} {type(x).__name__}"
    return None


def _made_batch(batch: Mapping) -> bool:
    """True when the dict ``batch`` looks like a batch this module built (torch ``input_ids``;
    ``cu_seqlens``, when present, one flat tensor for the whole batch), False when it holds
    several rows' columns side by side (a ``datasets`` slice such as ``d[0:4]``)."""
    ids, cu = batch.get("input_ids"), batch.get("cu_seqlens")
    return hasattr(ids, "dim") and (cu is None or (hasattr(cu, "dim") and cu.dim() == 1))


def _refuse_not_rows(batch) -> None:
    """Refuse, in one line, a batch that is not a list of row dicts: a table (a pandas
    DataFrame, a pyarrow Table: a ``datasets`` slice in pandas or arrow format), items that are
    tables (rows of a ``datasets.Dataset`` in pandas or arrow format), or a dict of columns of
    several rows (a ``datasets`` slice ``d[0:4]``), or items that are batches already made
    (``input_ids`` of two dimensions). Each otherwise failed deep inside (a DataFrame's truth
    value, ``cu_seqlens`` against C = 1, a Table without ``keys``), was taken for a batch a
    dataset had already made, or was told to repack at one capacity."""
    kind = _kind(batch)
    if kind is not None:
        raise ValueError(f"got one {kind} (a datasets slice in pandas or arrow format?); "
                         + _ROW_DICTS)
    if isinstance(batch, Mapping):
        if _made_batch(batch):
            return
        raise ValueError("got a dict of columns of several rows (a datasets slice d[0:4]?); "
                         + _ROW_DICTS)
    for i, item in enumerate(batch if isinstance(batch, (list, tuple)) else ()):
        if not isinstance(item, Mapping):
            what = _kind(item) or type(item).__name__
            raise ValueError(f"batch item {i} is a {what} (a datasets row in pandas or arrow "
                             "format?), not a dict; " + _ROW_DICTS)
        shape = getattr(item.get("input_ids"), "shape", None)
        if shape is not None and len(shape) == 2:  # a row's input_ids are [C]
            raise ValueError(f"batch item {i} is a batch already made (input_ids of shape "
                             f"{list(shape)}), not one row: a dataset given batch_size= and "
                             "every collate function yield whole batches; hand each to the "
                             "model as it is, or collate a list of rows (dataset[i], or the "
                             "items of a dataset read without batch_size=)")


def rows_of(batch) -> Rows:
    """The batch as :class:`~packtool.formats.packed.Rows` (items are stacked once per column;
    a ``Rows`` is returned as it is). The labels convention is the items' (``labels_convention``
    or ``labels_mode`` key), or None when they do not say.

    Raises:
        ValueError: an empty batch, a batch already made (a dict, or a list of them), not a
            list of row dicts (a pandas or pyarrow table, items that are, a dict of several
            rows' columns: a ``datasets`` slice), rows of different capacity,
            an item whose per-token columns differ in length or whose ``cu_seqlens`` does
            not rise from 0 to C, items with different columns (both items named), or
            items that say different labels conventions (or one says and another does not).
        OverflowError: B * C over 2**31 - 1 (int32 ``cu_seqlens``, which every batch this
            module builds carries), refused before anything is stacked.
    """
    if isinstance(batch, Rows):
        return batch
    _refuse_not_rows(batch)
    if isinstance(batch, Mapping):  # a DataLoader handed over what a dataset already batched
        raise ValueError("collate takes a list of items (or gathered Rows), not one batch (a "
                         "dict): a dataset with batch_size= yields batches already made; give "
                         "its DataLoader batch_size=None and no collate_fn (pass collate_fn= "
                         "to the dataset)")
    if not batch:
        raise ValueError("collate needs at least one row")
    first = batch[0]
    if "input_ids" not in first:
        check_item_columns(first.keys())
    C = len(first["input_ids"])
    for i, item in enumerate(batch):
        if len(item["input_ids"]) != C:
            raise ValueError(
                f"batch items 0 and {i} hold rows of different capacity ({C} and "
                f"{len(item['input_ids'])} tokens): batch rows of one capacity (a mixture's "
                "outputs share one; pack every output with the same --capacity)")
    _check_int32(len(batch), C)
    _same_columns(batch)
    keys = [k for k in _TOKENS if k in first]
    for i, item in enumerate(batch):  # B27: a transform that padded or cut one column only
        for k in keys[1:]:
            if len(item[k]) != C:
                raise ValueError(f"batch item {i}: {k} holds {len(item[k])} values and "
                                 f"input_ids {C}: every per-token column of a row holds C "
                                 "values; pad or cut all of them alike, or none")
    tokens = {k: np.stack([np.asarray(item[k]) for item in batch]) for k in keys}
    ragged = {}
    for k in _RAGGED:
        if k in first:
            parts = [np.asarray(item[k]) for item in batch]
            offs = np.zeros(len(parts) + 1, dtype=np.int64)  # shape: (B + 1,)
            np.cumsum([p.size for p in parts], out=offs[1:])
            if k == "cu_seqlens" and any(p.ndim != 1 for p in parts):
                _refuse_spans(parts, C)
            flat = np.concatenate(parts)
            if k == "cu_seqlens" and not _spans_cover(flat, offs, C):
                _refuse_spans(parts, C)
            ragged[k] = (flat, offs)
    scalars = {k: np.asarray([item[k] for item in batch]) for k in _SCALARS if k in first}
    mode = _convention(first)
    for i, item in enumerate(batch):
        if _convention(item) != mode:
            raise ValueError(
                f"batch items 0 and {i} carry different labels conventions ({mode} and "
                f"{_convention(item)}): one batch would shift some labels twice or not at all; "
                "read every dataset of the batch with the same labels= (e.g. "
                "labels='unshifted')")

    def col(name):
        return [item.get(name) for item in batch]

    meta = {"source": col("source")} if "source" in first else {}
    return Rows(tokens, ragged, scalars, np.asarray(col("index"), dtype=object),
                np.asarray(col("row"), dtype=object), col("shard"), mode, meta)


# --- boundaries, labels ---------------------------------------------------------------------

def _starts(rows: Rows) -> np.ndarray:
    """bool[B, C], True where a span of ``cu_seqlens`` (a segment, or the padding tail) starts:
    from ``cu_seqlens`` when the rows have it, else where ``segment_ids`` changes or
    ``position_ids`` restart at 0."""
    if "cu_seqlens" in rows.ragged:
        B, C = rows.tokens["input_ids"].shape
        starts = np.zeros(B * C, dtype=bool)  # shape: (B * C,)
        starts[_cu(rows)[0][:-1]] = True
        return starts.reshape(B, C)
    seg = rows.tokens.get("segment_ids")
    ref = seg if seg is not None else rows.tokens["position_ids"]
    B, C = ref.shape
    starts = np.empty((B, C), dtype=bool)  # shape: (B, C)
    starts[:, 0] = True
    if seg is not None:
        np.not_equal(seg[:, 1:], seg[:, :-1], out=starts[:, 1:])
    else:  # positions restart at 0 at every segment and at the padding tail
        np.equal(ref[:, 1:], 0, out=starts[:, 1:])
    return starts


def _structure(rows: Rows) -> None:
    """Add ``segment_ids`` and ``position_ids`` to rows that have ``cu_seqlens`` and
    ``doc_ids`` (and ``cu_seqlens_unpadded`` for a ``--segment-multiple`` output) but not them
    (the training batch path reads only those), computed once for the whole batch
    (:func:`~packtool.formats.packed.structure_from_cu`)."""
    if "segment_ids" in rows.tokens or not {"cu_seqlens", "doc_ids"} <= rows.ragged.keys():
        return
    from packtool.formats.packed import structure_from_cu

    vals, offs = rows.ragged["cu_seqlens"]
    un = rows.ragged.get("cu_seqlens_unpadded")
    seg, pos = structure_from_cu(vals, offs, np.diff(rows.ragged["doc_ids"][1]),
                                 rows.tokens["input_ids"].shape[1], "batch",
                                 unpadded=None if un is None else un[0])
    rows.tokens["segment_ids"] = seg
    rows.tokens.setdefault("position_ids", pos)


def _segments(rows: Rows) -> np.ndarray:
    """int[B, C] ``segment_ids`` (0 on padding): the rows', or rebuilt from the positions, one
    number per run restarting at 0. The padding tail is the runs after the row's k documents
    when a per-segment column says k (``doc_ids``, ``source_ids``, ``doc_offsets``); else the
    last run when the row has several and that one holds no target (labels all -100: a
    document without targets there is numbered 0 too, which changes no loss, and no attention
    between documents); else it is numbered like a segment. Computed once per ``rows``."""
    seg = rows.tokens.get("segment_ids")
    if seg is not None:
        return seg
    cached = rows.__dict__.get("_rebuilt_segments")
    if cached is not None:
        return cached
    seg = np.cumsum(rows.tokens["position_ids"] == 0, axis=1, dtype=np.int32)  # shape: (B, C)
    k = next((np.diff(rows.ragged[name][1]) for name in ("doc_ids", "source_ids", "doc_offsets")
              if name in rows.ragged), None)
    if k is not None:
        seg[seg > k[:, None]] = 0
    elif "labels" in rows.tokens:
        last = seg[:, -1:]  # shape: (B, 1)
        tail = seg == last
        targets = ((rows.tokens["labels"] != IGNORE_INDEX) & tail).any(axis=1)
        seg[tail & ((last[:, 0] > 1) & ~targets)[:, None]] = 0
    rows.__dict__["_rebuilt_segments"] = seg
    return seg


def _positions(rows: Rows) -> np.ndarray:
    """int[B, C] ``position_ids``: the rows', or 0..len-1 inside each span (:func:`_starts`;
    the padding tail one pseudo-segment, as the output contract has it)."""
    pos = rows.tokens.get("position_ids")
    if pos is not None:
        return pos
    starts = _starts(rows).ravel()
    flat = np.arange(starts.size, dtype=np.int64)  # shape: (B * C,)
    first = np.maximum.accumulate(np.where(starts, flat, 0))
    return (flat - first).reshape(rows.tokens["segment_ids"].shape)


def _check_int32(B: int, C: int) -> None:
    """Refuse a batch whose B * C positions int32 ``cu_seqlens`` cannot hold."""
    if B * C > INT32_MAX:
        raise OverflowError(f"batch of {B} rows x {C} tokens = {B * C} positions does not fit "
                            f"int32 cu_seqlens (max {INT32_MAX}); use at most "
                            f"{INT32_MAX // C} rows per batch")


def _cu(rows: Rows) -> tuple[np.ndarray, int]:
    """(int32[S + 1] boundaries of the rows laid end to end, max_seqlen: the longest span)."""
    B, C = rows.tokens["input_ids"].shape
    _check_int32(B, C)
    if "cu_seqlens" in rows.ragged:
        vals, offs = rows.ragged["cu_seqlens"]
        keep = np.ones(vals.size, dtype=bool)
        keep[offs[1:] - 1] = False  # each row's last entry (C) is the next row's 0
        row_of = np.repeat(np.arange(B, dtype=np.int64), np.diff(offs))
        cu = np.append(vals[keep].astype(np.int64) + row_of[keep] * C, B * C)
    else:
        cu = np.append(np.flatnonzero(_starts(rows).ravel()), B * C)  # shape: (S + 1,)
    return cu.astype(np.int32), int(np.diff(cu).max())


def batch_cu_seqlens(batch) -> tuple[np.ndarray, int]:
    """Batch boundaries of rows laid end to end: (int32[S + 1], max_seqlen as a Python int).

    Row r's boundaries are offset by r * C; the last entry is B * C, so padding tails are covered
    (B07) and every segment is non-empty (B08).

    Raises:
        ValueError: empty batch, rows of different capacity, or neither ``cu_seqlens``,
            ``segment_ids`` nor ``position_ids``.
        OverflowError: B * C > 2**31 - 1, which int32 boundaries cannot hold (use fewer rows per
            batch).
    """
    rows = rows_of(batch)
    have = set(rows.tokens) | set(rows.ragged)
    if not have & {"cu_seqlens", "segment_ids", "position_ids"}:
        raise ValueError("batch boundaries need cu_seqlens, segment_ids or position_ids")
    return _cu(rows)


def _seq_idx(cu: np.ndarray, shape: tuple[int, int], flat: bool) -> np.ndarray:
    """int32 span index of every token from the batch's boundaries ``cu`` (int[S + 1] over the
    rows laid end to end): [1, B * C] counted over the batch, or [B, C] counted per row (every
    row starts a span, so a row's count is the batch count less its first token's)."""
    cu = np.asarray(cu, dtype=np.int64)
    idx = np.repeat(np.arange(cu.size - 1, dtype=np.int32), np.diff(cu))  # shape: (B * C,)
    if flat:
        return idx.reshape(1, -1)
    idx = idx.reshape(shape)
    np.subtract(idx, idx[:, :1].copy(), out=idx)
    return idx


def batch_seq_idx(batch, *, flat: bool = False) -> np.ndarray:
    """Document index of every token: the span of the row's ``cu_seqlens`` it lies in.

    Args:
        batch: B >= 1 loader items of one capacity C, or a
            :class:`~packtool.formats.packed.Rows`.
        flat: False: counted per row, 0 at each row's start; True: counted over the rows laid
            end to end (the spans of :func:`batch_cu_seqlens`).

    Returns:
        int32 [B, C] (or [1, B * C] with ``flat``): 0..k-1 on a row's documents (with
        ``--segment-multiple``, the padding after a document carries its index), k on its
        padding tail. Megatron's rule: ``repeat(arange(S), diff(cu_seqlens))``.

    Raises:
        ValueError, OverflowError: as :func:`batch_cu_seqlens`.
    """
    rows = rows_of(batch)
    return _seq_idx(batch_cu_seqlens(rows)[0], rows.tokens["input_ids"].shape, flat)


def _cu_unpadded(rows: Rows) -> np.ndarray | None:
    """int32[S + 1] real lengths summed over the rows laid end to end (None without
    ``cu_seqlens_unpadded``): row r's entries continue from the total of rows 0..r-1."""
    if "cu_seqlens_unpadded" not in rows.ragged:
        return None
    vals, offs = rows.ragged["cu_seqlens_unpadded"]
    vals = vals.astype(np.int64)
    B = offs.size - 1
    totals = vals[offs[1:] - 1]  # shape: (B,), each row's last entry (the tail counted whole)
    base = np.zeros(B + 1, dtype=np.int64)  # shape: (B + 1,)
    np.cumsum(totals, out=base[1:])
    keep = np.ones(vals.size, dtype=bool)
    keep[offs[1:] - 1] = False  # each row's last entry is the next row's first
    row_of = np.repeat(np.arange(B, dtype=np.int64), np.diff(offs))
    return np.append(vals[keep] + base[row_of[keep]], base[-1]).astype(np.int32)


def batch_cu_seqlens_unpadded(batch) -> np.ndarray | None:
    """Real lengths summed over the batch: TransformerEngine's ``cu_seqlens_q`` for an output
    packed with ``--segment-multiple`` (None when the items have no ``cu_seqlens_unpadded``).

    Args:
        batch: B >= 1 loader items, or a :class:`~packtool.formats.packed.Rows`.

    Returns:
        int32 [S + 1], one entry per entry of :func:`batch_cu_seqlens`: row r's real lengths
        continue from the total of rows 0..r-1 (each row's padding tail counted whole).

    Raises:
        ValueError: as :func:`rows_of`.
    """
    return _cu_unpadded(rows_of(batch))


def _packed_seq_params(torch, rows: Rows, cu, max_seqlen: int) -> dict:
    """The ``PackedSeqParams`` fields of a ``--segment-multiple`` batch (empty without it);
    ``cu``: the batch's ``cu_seqlens`` tensor (the padded spans)."""
    unpadded = _cu_unpadded(rows)
    if unpadded is None:
        return {}
    real = torch.from_numpy(unpadded)
    return {"cu_seqlens_q": real, "cu_seqlens_kv": real, "cu_seqlens_q_padded": cu,
            "cu_seqlens_kv_padded": cu, "max_seqlen_q": max_seqlen, "max_seqlen_kv": max_seqlen}


def count_targets(labels) -> int:
    """Effective targets: ``labels != -100`` (NumPy array or tensor), as a Python int."""
    return int((labels != IGNORE_INDEX).sum())


#: How the caller of a collate function says the convention of items that do not: in the items
#: (:func:`collate`, :func:`collate_flat`: the dataset's items carry ``labels_mode``), or to
#: :class:`~packtool.loader.HFCollator` (a Trainer drops the keys its model does not name).
_SAY_CONVENTION = {
    "collate": "keep each item's 'labels_mode' key (or give it 'labels_convention': '{other}')",
    "HFCollator": "say what they are: HFCollator(labels_mode='{other}')",
}


def _check_convention(lab: np.ndarray, ids: np.ndarray, seg: np.ndarray, mode: str,
                      caller: str = "HFCollator") -> None:
    """Refuse labels that contradict ``mode``: unshifted labels are token ``i`` or -100, and
    -100 on each segment's first token; shifted ones the next token of the same segment or
    -100, and -100 on each segment's last token; -100 on padding (``seg`` 0) in both. (Over a
    repeated token, shifted labels look unshifted but for those boundaries.) ``caller``: the
    collate function asking, ``collate`` (also :func:`collate_flat`) or ``HFCollator``, whose
    way of saying the convention the message names (:data:`_SAY_CONVENTION`).

    Raises:
        ValueError: names the first row and position that does not fit, and the fixes open to
            ``caller``.
    """
    ignored = lab == IGNORE_INDEX
    same = seg[:, 1:] == seg[:, :-1]  # shape: (B, C - 1)
    if mode == "unshifted":
        first = np.ones(ids.shape, dtype=bool)  # shape: (B, C), a segment's first token
        first[:, 1:] = ~same
        ok = ignored | ((lab == ids) & ~first)
    else:
        nxt = np.full(ids.shape, -1, dtype=np.int64)  # shape: (B, C)
        nxt[:, :-1] = np.where(same, ids[:, 1:], -1)
        ok = ignored | (lab == nxt)
    ok &= ignored | (seg != 0)  # padding is never a target
    if ok.all():
        return
    r, i = (int(x[0]) for x in np.nonzero(~ok))
    other = "shifted" if mode == "unshifted" else "unshifted"
    raise ValueError(
        f"batch row {r}, position {i}: label {int(lab[r, i])} is not {mode}: "
        f"{_why_not(lab[r], ids[r], seg[r], i, mode)}; these items carry {other} labels but do "
        "not say so (no 'labels_mode' or 'labels_convention' key: a trainer that drops the keys "
        f"its model does not name removed it?): build the dataset with labels='{mode}', or "
        f"{_SAY_CONVENTION[caller].format(other=other)}, so that no labels are shifted twice")


def _why_not(lab: np.ndarray, ids: np.ndarray, seg: np.ndarray, i: int, mode: str) -> str:
    """Why label ``i`` of one row (``lab``, ``ids``, ``seg``: int[C]) breaks the rule of
    ``mode`` (:func:`_check_convention`), in words: the rule it breaks, what the label had to
    be there, and the neighbouring token that shows the other convention when one does (a
    label equal to the next token: shifted; to the token itself: unshifted)."""
    label, c = int(lab[i]), ids.size
    if seg[i] == 0:
        return f"position {i} is padding (segment_ids 0), whose label must be -100"
    first = i == 0 or seg[i - 1] != seg[i]
    last = i == c - 1 or seg[i + 1] != seg[i]
    nxt = None if last else int(ids[i + 1])
    if mode == "unshifted":
        rule = (f"position {i} is the first token of its document (segment {int(seg[i])}), "
                "whose unshifted label must be -100 (no token before it predicts it)" if first
                else f"an unshifted label is the token at its own position or -100, so "
                f"labels[{i}] must be input_ids[{i}] = {int(ids[i])} or -100")
        shows = (f"; {label} is the next token, input_ids[{i + 1}] = {nxt}: a shifted label"
                 if nxt == label else "")
        return rule + shows
    rule = (f"position {i} is the last token of its document (segment {int(seg[i])}), whose "
            "shifted label must be -100 (no next token in its document)" if last
            else f"a shifted label is the next token of its document or -100, so labels[{i}] "
            f"must be input_ids[{i + 1}] = {nxt} or -100")
    shows = (f"; {label} is the token at that position, input_ids[{i}] = {int(ids[i])}: an "
             "unshifted label" if label == int(ids[i]) else "")
    return rule + shows


def _derived_labels64(ids: np.ndarray, seg: np.ndarray, cu: np.ndarray,
                      convention: str) -> tuple[np.ndarray, int]:
    """int64[B, C] labels of ``convention`` derived from tokens and segments, and their
    effective targets: the same values as :func:`~packtool.formats.packed.unshifted_labels` /
    :func:`~packtool.formats.packed.shifted_labels`, built in the int64 array the loss takes
    (one cast, then -100 written at each boundary and over each padding tail, found from the
    batch's boundaries ``cu``: int[S + 1] over the rows laid end to end). Spans that end in
    padding (``--segment-multiple``: ``segment_ids`` 0 after a document's real tokens) are
    found by counting the real tokens, and take the segment rule token by token."""
    B, C = ids.shape
    lab = np.empty((B, C), dtype=np.int64)  # shape: (B, C)
    flat = lab.reshape(-1)
    starts = np.asarray(cu[:-1], dtype=np.int64)  # shape: (S,), every segment's first token
    ends = np.asarray(cu[1:], dtype=np.int64)
    real = seg.reshape(-1)[starts] != 0  # shape: (S,), False on padding tails
    real_tokens = int((ends - starts)[real].sum())
    if np.count_nonzero(seg) != real_tokens:  # padding inside spans: the general rule
        from packtool.formats.packed import shifted_labels, unshifted_labels

        fn = shifted_labels if convention == "shifted" else unshifted_labels
        lab[:] = fn(ids, seg)
        return lab, count_targets(lab)
    if convention == "shifted":
        lab[:, :-1] = ids[:, 1:]
        flat[ends - 1] = IGNORE_INDEX  # the last token of a segment predicts nothing
    else:
        lab[:] = ids
        flat[starts] = IGNORE_INDEX  # each segment's first token is no target
    for a, b in zip(starts[~real].tolist(), ends[~real].tolist()):
        flat[a:b] = IGNORE_INDEX  # padding tails
    return lab, real_tokens - int(np.count_nonzero(real))


def _labels(rows: Rows, want: str | None = None, default_mode: str = "unshifted",
            cu: np.ndarray | None = None, *, caller: str) -> tuple[np.ndarray, str, int]:
    """int[B, C] labels of the batch, their convention and their effective targets.

    Args:
        want: the convention to hand out (converted inside each segment); None: the rows'.
        default_mode: the convention of rows that do not say (checked against the values).
        cu: the batch's boundaries (:func:`_cu`), used when labels are derived.
        caller: the collate function asking (:func:`_check_convention`): ``collate`` or
            ``HFCollator`` (the default: :mod:`packtool.loader.hf` passes none).

    Raises:
        ValueError: rows that do not say their convention, whose labels contradict
            ``default_mode`` (:func:`_check_convention`).
    """
    mode = rows.labels_mode
    ids = rows.tokens["input_ids"]
    lab = rows.tokens.get("labels")
    if lab is None:  # derived: needs the real segments (padding 0)
        out = want or mode or "unshifted"
        if cu is None:
            cu = _cu(rows)[0]
        lab, n = _derived_labels64(ids, rows.tokens["segment_ids"], cu, out)
        return lab, out, n
    if mode is None:
        mode = default_mode
        _check_convention(lab, ids, _segments(rows), mode, caller)
    out = want or mode
    lab = convert_labels(lab, _segments(rows), mode, out) if out != mode else lab
    return lab, out, count_targets(lab)


def _parts(rows: Rows, want: str | None = None) -> tuple:
    """Everything a batch derives, as NumPy: (``cu_seqlens`` int32[S + 1], ``max_seqlen``,
    labels int[B, C], their convention, effective targets, ``segment_ids`` int[B, C],
    ``position_ids`` int[B, C], per-row ``seq_idx`` int32[B, C]).

    Rows that hold ``input_ids`` and the spans only (``cu_seqlens`` and ``doc_ids``: what the
    training batches read) get all of it in one pass over each row, labels and positions
    written as int64 at once (:func:`packtool.core.structure.row_structure`); other rows
    column by column. ``want``: the labels convention to hand out (None: the rows'). Labels
    that contradict the convention assumed for rows that do not say it are refused naming
    the fixes open to a caller of :func:`collate` (:func:`_check_convention`).
    """
    ids = rows.tokens["input_ids"]
    if (rows.tokens.keys() == {"input_ids"} and "cu_seqlens_unpadded" not in rows.ragged
            and {"cu_seqlens", "doc_ids"} <= rows.ragged.keys()):
        from packtool.core.structure import row_structure

        _check_int32(*ids.shape)
        convention = want or rows.labels_mode or "unshifted"
        vals, offs = rows.ragged["cu_seqlens"]
        st = row_structure(ids, vals, offs, np.diff(rows.ragged["doc_ids"][1]),
                           convention=convention, alloc=pool.empty)
        if st.bad_row < 0:
            return (st.cu_seqlens, st.max_seqlen, st.labels, convention, st.num_targets,
                    st.segment_ids, st.position_ids, st.seq_idx)
        # a row breaks the output contract: the column path below names it
    _structure(rows)
    cu_seqlens, max_seqlen = _cu(rows)
    labels, convention, targets = _labels(rows, want, cu=cu_seqlens, caller="collate")
    seg = _segments(rows)
    return (cu_seqlens, max_seqlen, labels, convention, targets, seg, _positions(rows),
            _seq_idx(cu_seqlens, seg.shape, flat=False))


# --- tensors --------------------------------------------------------------------------------

def _tensor(torch, arr: np.ndarray, dtype, shape=None):
    """``arr`` as a torch tensor of ``dtype`` (reshaped to ``shape``), zero-copy when it already
    has the dtype. The cast is NumPy's: torch's own runs on its intra-op thread pool, which
    cost 100x the copy on a loaded machine (busy-waiting threads)."""
    shape = tuple(arr.shape if shape is None else shape)
    np_dtype = np.int64 if dtype == torch.int64 else np.int32
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np_dtype)).reshape(shape)


class _Batch(dict):
    """A batch built in a DataLoader worker: a plain dict, except that it crosses to the
    training process with its tensors pickled by value, as NumPy arrays (the tensors are
    rebuilt there, zero-copy). torch would move each tensor through its own shared-memory
    segment and file descriptor instead, which costs more CPU than the copy at these sizes
    (``docs/benchmarks.md``, "Workers")."""

    def __reduce__(self):
        import torch

        def plain(v):
            return isinstance(v, torch.Tensor) and v.device.type == "cpu" and not v.requires_grad

        out = {}
        for k, v in self.items():
            if plain(v):
                out[k] = ("tensor", v.numpy())
            elif isinstance(v, list) and v and all(plain(x) for x in v):  # doc_ids
                out[k] = ("tensors", [x.numpy() for x in v])
            else:
                out[k] = ("value", v)
        return _unbatch, (out,)


def _unbatch(fields: dict) -> dict:
    import torch

    def back(kind, v):
        if kind == "tensor":
            return torch.from_numpy(v)
        return [torch.from_numpy(x) for x in v] if kind == "tensors" else v

    return {k: back(kind, v) for k, (kind, v) in fields.items()}


def _deliver(batch: dict) -> dict:
    """``batch``, as a :class:`_Batch` inside a DataLoader worker."""
    from torch.utils.data import get_worker_info

    return batch if get_worker_info() is None else _Batch(batch)


def _token_sources(rows: Rows, seg: np.ndarray) -> np.ndarray | None:
    """int32[B, C] per-token source ids from per-segment ``source_ids`` (-1 on padding);
    ``seg``: the batch's segment ids (:func:`_parts`), real ones when the rows have
    ``segment_ids`` or the spans (``cu_seqlens`` and ``doc_ids``)."""
    if "source_ids" not in rows.ragged:  # which says k, so ``seg`` has 0 on padding
        return None
    vals, offs = rows.ragged["source_ids"]
    idx = offs[:-1, None] + seg.astype(np.int64) - 1  # shape: (B, C)
    out = np.full(seg.shape, -1, dtype=np.int32)
    real = seg > 0
    out[real] = vals[idx[real]]
    return out


def _doc_ids(torch, rows: Rows) -> list:
    """Each row's ``doc_ids`` as a torch.int64 tensor (views of one tensor), or None per row
    when they were not read. Tensors, not NumPy arrays: a DataLoader converts NumPy arrays one
    by one (``default_convert``), which cost a tenth of the batch; tensors pass through it, so
    a batch holds the same types with and without a DataLoader."""
    if "doc_ids" not in rows.ragged:
        return [None] * rows.num_rows
    vals, offs = rows.ragged["doc_ids"]
    return list(torch.from_numpy(np.ascontiguousarray(vals, dtype=np.int64)).split(
        np.diff(offs).tolist()))


def _ints(values) -> list:
    """Provenance values (``row``, ``index``) as a list of Python ints (None kept)."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values.tolist()
    return [None if v is None else int(v) for v in values]


def _provenance(torch, rows: Rows) -> dict:
    """Where each of the batch's B rows came from: ``shard``, ``row``, ``index`` (lists of B),
    ``doc_ids`` (list of B torch.int64 [k], None where not read), ``source`` (list of B source
    names, None where unknown)."""
    return {"shard": list(rows.shard), "row": _ints(rows.row), "index": _ints(rows.index),
            "doc_ids": _doc_ids(torch, rows),
            "source": list(rows.meta.get("source") or [None] * rows.num_rows)}


def collate(batch) -> dict:
    """Stack loader items (or gathered rows) into the [B, C] training batch.

    Args:
        batch: B >= 1 items of :class:`~packtool.loader.PackedDataset` or
            :class:`~packtool.loader.PackedIterableDataset` (same capacity C), or a
            :class:`~packtool.formats.packed.Rows`. Needs ``input_ids`` and ``segment_ids``, or
            ``input_ids``, ``position_ids`` and ``labels`` (module docstring).

    Returns:
        dict with
        ``input_ids``, ``segment_ids``: torch.int32 [B, C]; ``position_ids``: torch.int64
        [B, C] (positions rebuilt
        from the segments when the items have none, segments from the positions);
        ``labels``: torch.int64 [B, C] in the items' convention, named by
        ``labels_convention`` (int64: the loss needs it);
        ``cu_seqlens``: torch.int32 [S + 1] (see :func:`batch_cu_seqlens`);
        ``max_seqlen``: Python int, the longest segment (B24);
        ``seq_idx``: torch.int32 [B, C], each token's document index in its row
        (:func:`batch_seq_idx`);
        with ``--segment-multiple`` outputs, the ``PackedSeqParams`` fields of the module
        docstring (``cu_seqlens_q_padded`` is the ``cu_seqlens`` tensor itself);
        ``num_targets``: Python int, labels != -100 in the batch (the loss denominator, B20);
        ``labels_convention``: ``unshifted`` (the loss shifts: ``logits[:, :-1]`` against
        ``labels[:, 1:]``) or ``shifted`` (no shift: ``logits`` against ``labels``);
        ``labels_mode``: the same (older name); ``shard``, ``row``, ``index``: lists of B
        provenance values; ``doc_ids``: list of B torch.int64 [k] tensors (None where not
        read);
        ``source``: list of B source names (mixtures; None where unknown);
        ``token_source_ids``: torch.int32 [B, C], each token's per-segment source id (-1 on
        padding), when the rows carry ``source_ids`` (``pack --source-column``).

    Raises:
        ValueError: empty batch or rows of different capacity; items without the columns named
            above (the padding tail could not be told from a document); items that do not say
            their labels convention and whose labels are not unshifted; called under
            accelerate's batch dispatching, which would cut ``cu_seqlens`` to the batch's rows
            (:func:`~packtool.loader.wrappers.refuse_accelerate_wrapper`); called as
            ``transformers.Trainer``'s ``data_collator``, which hands every key to the model
            (provenance ``source`` clashed with its loss function's argument; names
            :class:`~packtool.loader.hf.HFCollator`,
            :func:`~packtool.loader.wrappers.refuse_trainer_collate`).
        OverflowError: B * C does not fit int32 ``cu_seqlens``.
        MissingDependencyError: torch is missing.
    """
    torch = require_torch()
    refuse_trainer_collate("collate")  # every key would reach the model's forward
    refuse_accelerate_wrapper(depth=64)  # boundaries it would cut
    rows = rows_of(batch)
    _needs(set(rows.tokens) | set(rows.ragged))
    cu_seqlens, max_seqlen, labels, convention, targets, seg, pos, seq_idx = _parts(rows)
    cu = torch.from_numpy(cu_seqlens)
    out = {
        "input_ids": _tensor(torch, rows.tokens["input_ids"], torch.int32),
        "labels": _tensor(torch, labels, torch.int64),
        "position_ids": _tensor(torch, pos, torch.int64),
        "segment_ids": _tensor(torch, seg, torch.int32),
        "cu_seqlens": cu,
        "max_seqlen": max_seqlen,
        "seq_idx": torch.from_numpy(seq_idx),
        **_packed_seq_params(torch, rows, cu, max_seqlen),
        "num_targets": targets,
        "labels_convention": convention,
        "labels_mode": convention,
        **_provenance(torch, rows),
    }
    token_src = _token_sources(rows, seg)
    if token_src is not None:
        out["token_source_ids"] = _tensor(torch, token_src, torch.int32)
    return _deliver(out)


collate.needs_columns = _needs
#: its batch is not a set of model forward keywords (refused as Trainer's data_collator)
collate.forward_keywords = False


def collate_flat(batch) -> dict:
    """The flattened (varlen) form: B rows laid end to end as one sequence of B * C tokens.

    Padding tails stay in place as their own segments (labels -100), so ``cu_seqlens`` is the one
    of :func:`collate` and covers every position. Labels are unshifted (converted when the
    output stores shifted ones), since the Hugging Face models this form feeds shift themselves.

    Args:
        batch: items or a :class:`~packtool.formats.packed.Rows`; needs what :func:`collate`
            needs.

    Returns:
        dict with ``input_ids``: torch.int32 [1, B * C]; ``position_ids``, ``labels``:
        torch.int64 [1, B * C]; ``cu_seq_lens_q``, ``cu_seq_lens_k``: the same torch.int32
        [S + 1] tensor; ``max_length_q``, ``max_length_k``: Python int; ``num_targets``: Python
        int; ``labels_convention``: ``unshifted``; ``seq_idx``: torch.int32 [1, B * C], counted
        over the batch (the spans of ``cu_seq_lens_q``); with ``--segment-multiple`` outputs,
        the ``PackedSeqParams`` fields; ``token_source_ids``: torch.int32 [1, B * C], each
        token's per-segment source id (-1 on padding), when the rows carry ``source_ids``
        (``pack --source-column``): :func:`collate`'s, flattened; the rows' provenance as
        :func:`collate` gives it (``shard``, ``row``, ``index``, ``doc_ids``, ``source``: lists
        of B, in row order).

    Raises:
        ValueError, OverflowError, MissingDependencyError: as :func:`collate` (items without
            the columns named above; ``Trainer``'s ``data_collator``: use
            ``HFCollator(flatten=True)``).
    """
    torch = require_torch()
    refuse_trainer_collate("collate_flat")  # every key would reach the model's forward
    refuse_accelerate_wrapper(depth=64)  # boundaries it would cut
    rows = rows_of(batch)
    _needs(set(rows.tokens) | set(rows.ragged))
    cu_seqlens, max_seqlen, labels, _, targets, seg, pos, seq_idx = _parts(rows, "unshifted")
    flat = (1, labels.size)
    cu = torch.from_numpy(cu_seqlens)
    spans = np.diff(rows.ragged["cu_seqlens"][1]) - 1 if "cu_seqlens" in rows.ragged else None
    if spans is not None and spans.sum() == cu_seqlens.size - 1:  # count over the batch
        before = np.zeros(spans.size, dtype=np.int32)  # shape: (B,), spans of earlier rows
        np.cumsum(spans[:-1], out=before[1:])
        seq_idx = np.add(seq_idx, before[:, None], out=seq_idx).reshape(flat)
    else:
        seq_idx = _seq_idx(cu_seqlens, flat, flat=True)
    out = {
        "input_ids": _tensor(torch, rows.tokens["input_ids"], torch.int32, flat),
        "position_ids": _tensor(torch, pos, torch.int64, flat),
        "labels": _tensor(torch, labels, torch.int64, flat),
        "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
        "max_length_q": max_seqlen, "max_length_k": max_seqlen,
        "seq_idx": torch.from_numpy(seq_idx),
        **_packed_seq_params(torch, rows, cu, max_seqlen),
        "num_targets": targets,
        "labels_convention": "unshifted",
        **_provenance(torch, rows),
    }
    token_src = _token_sources(rows, seg)
    if token_src is not None:
        out["token_source_ids"] = _tensor(torch, token_src, torch.int32, flat)
    return _deliver(out)


collate_flat.needs_columns = _needs
collate_flat.forward_keywords = False
