"""Token masks carried through packing: padding removed, prompt tokens kept out of the loss,
BOS/EOS added once.

Inputs come as the documents' tokens back to back (``tokens`` int32[T]) with their lengths
(``lengths`` int64[docs]), and optionally a per-token flag ``targets`` (uint8[T], 0 = the token
is not a target: its input label was -100, or a loss mask such as TRL's ``completion_mask`` or
``assistant_masks`` was 0, e.g. the prompt of an SFT example).

- :func:`prepare_documents`: the one path from the columns read to the documents packed, used
  by ``packtool pack`` and ``packtool compare`` alike: target flags from the input labels and
  loss masks (:func:`target_flags`), then the documents a ``--holdout`` split leaves out, then
  the attention mask, then BOS/EOS.

- :func:`drop_masked_tokens`: tokens whose ``attention_mask`` is 0 (padding of a padded
  tokenization) are removed before packing; a document may become empty.
- :func:`inner_mask_zeros`: the attention-mask zeros lying between two ones of one document.
  Padding sits at a row's ends (left, right or both); a run of zeros between ones is several
  padded examples laid end to end in one row (or tokens masked inside a document), which
  removing them would join into one document: the reader refuses such a row.
- :func:`add_boundary_tokens`: ``--prepend-bos`` / ``--append-eos`` add the id to every non-empty
  document that does not already start / end with it (never a doubled BOS or EOS). An added BOS
  is the segment's first token, which the boundary rule never makes a target; an added EOS
  takes the targets flag of the document's last token (the end of a response is learned, the
  end of a masked prompt is not).
- :func:`mask_labels`: after layout, a label is -100 where its target token is flagged 0, in
  addition to the boundary rule; ``num_targets`` is recounted.
- :func:`segment_targets`: effective targets per plan segment, without laying rows out (what
  ``stats`` and the pack summary count).

Numba kernels: ``core/_kernels.py``; slow twins: ``core/reference.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.core import _kernels as K
from packtool.core.holdout import drop_documents
from packtool.core.packing import PackPlan

__all__ = ["BoundaryCounts", "TokenBatch", "prepare_documents", "target_flags",
           "drop_masked_tokens", "inner_mask_zeros", "add_boundary_tokens", "mask_labels",
           "segment_targets",
           "plan_segment_targets"]


@dataclass(frozen=True)
class BoundaryCounts:
    """What :func:`add_boundary_tokens` did, in documents."""

    bos_added: int = 0  #: documents that got a BOS
    bos_present: int = 0  #: non-empty documents that already started with it (left alone)
    eos_added: int = 0  #: documents that got an EOS
    eos_present: int = 0  #: non-empty documents that already ended with it (left alone)

    def __add__(self, other: "BoundaryCounts") -> "BoundaryCounts":
        return BoundaryCounts(self.bos_added + other.bos_added,
                              self.bos_present + other.bos_present,
                              self.eos_added + other.eos_added,
                              self.eos_present + other.eos_present)


@dataclass(frozen=True)
class TokenBatch:
    """Documents ``first_row .. first_row + len(lengths) - 1`` of one file, as they are packed:
    attention-mask zeros removed, target flags set, BOS/EOS added (:func:`prepare_documents`).
    """

    first_row: int  #: row index in the file of the first document
    lengths: np.ndarray  #: int64[docs], tokens per document
    tokens: np.ndarray  #: int32[sum(lengths)], the documents' tokens back to back
    #: uint8[sum(lengths)], 0 = not a target (input label -100 or a loss mask 0); None: neither
    #: an input labels column nor a loss mask was read
    targets: np.ndarray | None = None
    masked_tokens: int = 0  #: tokens removed because their attention mask was 0
    #: BOS/EOS added or found already there (--prepend-bos/--append-eos)
    boundary: BoundaryCounts = BoundaryCounts()
    #: (documents, tokens) left out whole as the other part of a ``--holdout`` split (such a
    #: document has length 0 here)
    other_split: tuple[int, int] = (0, 0)
    #: [docs] each document's ``--source-column`` value as read (int64 or str objects),
    #: carried untouched; None: not read
    sources: np.ndarray | None = None
    #: (index in the batch, length as it would be packed) of the longest document left out as
    #: the other part of a ``--holdout`` split, with ``measure_other``; (0, 0) otherwise
    other_longest: tuple[int, int] = (0, 0)
    #: documents of this side that held no token as read (before the attention mask): what
    #: tells an empty document from one whose tokens were all masked
    docs_empty_read: int = 0
    #: (documents empty as read, tokens left after the attention mask) of the documents left
    #: out as the other part of a ``--holdout`` split: whether that side has a token to pack
    other_packed: tuple[int, int] = (0, 0)

    def mask_counts(self) -> dict:
        """The batch's mask figures under their :class:`packtool.stats.PackStats` names
        (``tokens_label_masked``: tokens kept out of the targets by input labels or loss
        masks).

        A document left out by a ``--holdout`` split has length 0, so the plan counts it as
        empty: ``docs_empty`` is corrected here by as many (a count to add to the plan's, never
        a count alone)."""
        b = self.boundary
        return {"tokens_attention_masked": self.masked_tokens,
                "tokens_label_masked": 0 if self.targets is None
                else int(self.targets.size - np.count_nonzero(self.targets)),
                "docs_bos_added": b.bos_added, "docs_bos_present": b.bos_present,
                "docs_eos_added": b.eos_added, "docs_eos_present": b.eos_present,
                "docs_other_split": self.other_split[0],
                "tokens_other_split": self.other_split[1],
                "docs_empty": -self.other_split[0]}


def target_flags(labels: np.ndarray | None, loss_masks=()) -> np.ndarray | None:
    """Per-token target flags from an input labels column and loss masks.

    A token is a target only when every source says so: its label is not -100 (Hugging Face
    convention) and each loss mask is nonzero (TRL's ``completion_mask`` and
    ``assistant_masks``: 1 on the tokens to learn, 0 elsewhere; TRL sets the label of a token
    to -100 where any of them is 0).

    Args:
        labels: int[T] unshifted labels (-100 or the token) or None.
        loss_masks: sequence of int or bool [T] masks.

    Returns:
        uint8[T] (1 = target), or None when neither labels nor a mask is given.
    """
    flags = None
    if labels is not None:
        flags = np.asarray(labels) != -100
    for m in loss_masks:
        m = np.asarray(m) != 0
        flags = m if flags is None else flags & m
    return None if flags is None else flags.astype(np.uint8)


def prepare_documents(first_row: int, lengths: np.ndarray, tokens: np.ndarray, *,
                      keep: np.ndarray | None = None, labels: np.ndarray | None = None,
                      loss_masks=(), bos: int | None = None,
                      eos: int | None = None,
                      keep_docs: np.ndarray | None = None,
                      measure_other: bool = False) -> TokenBatch:
    """Documents as packed, from the columns read: the one path of ``pack`` and ``compare``.

    Order: target flags from ``labels`` and ``loss_masks`` on the tokens as read
    (:func:`target_flags`), then the documents ``keep_docs`` leaves out removed whole
    (:func:`packtool.core.holdout.drop_documents`: ``--holdout``), then the tokens whose
    attention mask is 0 removed (:func:`drop_masked_tokens`), then BOS/EOS added
    (:func:`add_boundary_tokens`: an added EOS is a target when the document's last token is
    one).

    Args:
        first_row: row index in its file of the first document.
        lengths: int64[docs]; tokens: int[T], T = sum(lengths), ids in 0..2**31-1.
        keep: the attention mask, int or bool [T] (nonzero = a real token), or None.
        labels: int[T], -100 or the token (checked by the reader), or None.
        loss_masks: int or bool [T] masks, 1 = learn.
        bos, eos: ``--prepend-bos`` / ``--append-eos`` ids, or None.
        keep_docs: bool[docs], False for a document of the other part of a held-out split
            (it gets length 0 and is counted in ``other_split``, its tokens as read, and in
            ``other_packed``, its tokens after the attention mask); None keeps every
            document.
        measure_other: also find the longest document ``keep_docs`` leaves out, as it would be
            packed on its own side (masks and BOS/EOS applied):
            :attr:`TokenBatch.other_longest`, for ``--overflow error`` to refuse it before
            either side is written.

    Returns:
        :class:`TokenBatch`.

    Raises:
        ValueError: a mask without T entries, or ``keep_docs`` without one entry per document.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int32)
    targets = target_flags(labels, loss_masks)
    if targets is not None and targets.size != tokens.size:
        raise ValueError("labels and loss masks must have one entry per token")
    other, longest = (0, 0), (0, 0)
    if keep_docs is not None and measure_other and not np.all(keep_docs):
        theirs = prepare_documents(first_row, lengths, tokens, keep=keep, bos=bos, eos=eos,
                                   keep_docs=~np.asarray(keep_docs, dtype=bool))
        if theirs.lengths.size:
            i = int(np.argmax(theirs.lengths))
            longest = (i, int(theirs.lengths[i]))
    other_packed = (0, 0)
    empty_read = int(lengths.size - np.count_nonzero(lengths))
    if keep_docs is not None:
        real = None if keep is None else int(np.count_nonzero(keep))
        lengths, n_docs, n_tokens, tokens, targets, keep = drop_documents(
            lengths, keep_docs, tokens, targets, None if keep is None else np.asarray(keep))
        other = (n_docs, n_tokens)
        this_empty = int(lengths.size - np.count_nonzero(lengths)) - n_docs  # theirs are 0 now
        other_packed = (empty_read - this_empty,
                        n_tokens if real is None else real - int(np.count_nonzero(keep)))
        empty_read = this_empty
    masked = 0
    if keep is not None:
        lengths, tokens, targets, masked = drop_masked_tokens(lengths, tokens, keep, targets)
    boundary = BoundaryCounts()
    if bos is not None or eos is not None:
        lengths, tokens, targets, boundary = add_boundary_tokens(lengths, tokens, targets,
                                                                 bos=bos, eos=eos)
    return TokenBatch(int(first_row), lengths, tokens, targets, masked, boundary,
                      other_split=other, other_longest=longest, docs_empty_read=empty_read,
                      other_packed=other_packed)


def _doc_of_token(lengths: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)  # shape: (T,)


def drop_masked_tokens(lengths: np.ndarray, tokens: np.ndarray, keep: np.ndarray,
                       targets: np.ndarray | None = None):
    """Remove the tokens whose attention mask is 0.

    Args:
        lengths: int64[docs], tokens per document.
        tokens: int32[T], T = sum(lengths).
        keep: bool or integer [T], the attention mask (nonzero = a real token).
        targets: optional uint8[T] flags, filtered alike.

    Returns:
        (lengths int64[docs], tokens int32[T'], targets uint8[T'] or None, removed tokens).

    Raises:
        ValueError: ``keep`` or ``targets`` does not have T entries.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    keep = np.asarray(keep) != 0
    if keep.size != tokens.size or (targets is not None and targets.size != tokens.size):
        raise ValueError("keep and targets must have one entry per token")
    removed = int(keep.size - np.count_nonzero(keep))
    if not removed:
        return lengths, tokens, targets, 0
    new_lengths = np.bincount(_doc_of_token(lengths)[keep], minlength=lengths.size)
    return (new_lengths.astype(np.int64), tokens[keep],
            None if targets is None else targets[keep], removed)


def inner_mask_zeros(lengths: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Flat indices of the attention-mask zeros that lie between two nonzero entries of the
    same document: not padding (which sits at a document's ends), so removing them would join
    what comes before to what comes after.

    Args:
        lengths: int64[docs], tokens per document.
        keep: bool or integer [T], T = sum(lengths), the attention mask (nonzero = a real
            token).

    Returns:
        int64[k], ascending; empty when every document's zeros sit at its ends (or it has
        none).

    Raises:
        ValueError: ``keep`` does not have T entries.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    nz = np.asarray(keep) != 0
    ends = np.cumsum(lengths)  # shape: (docs,), one past each document's last token
    if nz.size != (int(ends[-1]) if ends.size else 0):
        raise ValueError("keep must have one entry per token")
    zeros = np.flatnonzero(~nz)  # shape: (z,)
    if not zeros.size:
        return zeros.astype(np.int64)
    # before[i]: nonzero entries among the first i tokens; shape: (T + 1,)
    before = np.concatenate(([0], np.cumsum(nz, dtype=np.int64)))
    doc = np.searchsorted(ends, zeros, side="right")  # shape: (z,), each zero's document
    start = ends[doc] - lengths[doc]
    inner = (before[zeros] > before[start]) & (before[ends[doc]] > before[zeros + 1])
    return zeros[inner].astype(np.int64)


def add_boundary_tokens(lengths: np.ndarray, tokens: np.ndarray,
                        targets: np.ndarray | None = None, *, bos: int | None = None,
                        eos: int | None = None):
    """Prepend ``bos`` and append ``eos`` to every non-empty document lacking them.

    Args:
        lengths: int64[docs], tokens per document.
        tokens: int32[T], T = sum(lengths).
        targets: optional uint8[T] flags (0 = not a target); an added BOS gets 1 (it is a
            segment's first token, never a target), an added EOS the flag of the last token.
        bos, eos: token ids (int32 range) or None.

    Returns:
        (lengths int64[docs], tokens int32[T'], targets uint8[T'] or None,
        :class:`BoundaryCounts`). Empty documents stay empty.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int32)
    nonempty = lengths > 0
    ends = np.cumsum(lengths)  # shape: (docs,), one past each document's last token
    starts = ends - lengths
    add_b = np.zeros(lengths.size, dtype=bool)
    add_e = np.zeros(lengths.size, dtype=bool)
    if bos is not None:
        add_b = nonempty.copy()
        add_b[nonempty] = tokens[starts[nonempty]] != bos
    if eos is not None:
        add_e = nonempty.copy()
        add_e[nonempty] = tokens[ends[nonempty] - 1] != eos
    n_docs_nonempty = int(nonempty.sum())
    counts = BoundaryCounts(
        int(add_b.sum()), n_docs_nonempty - int(add_b.sum()) if bos is not None else 0,
        int(add_e.sum()), n_docs_nonempty - int(add_e.sum()) if eos is not None else 0)
    if not (add_b.any() or add_e.any()):
        return lengths, tokens, targets, counts
    new_lengths = lengths + add_b + add_e
    new_ends = np.cumsum(new_lengths)
    new_starts = new_ends - new_lengths
    is_old = np.ones(int(new_ends[-1]), dtype=bool)
    is_old[new_starts[add_b]] = False
    is_old[new_ends[add_e] - 1] = False
    out = np.empty(is_old.size, dtype=np.int32)
    out[is_old] = tokens
    if bos is not None:
        out[new_starts[add_b]] = bos
    if eos is not None:
        out[new_ends[add_e] - 1] = eos
    new_targets = None
    if targets is not None:
        new_targets = np.ones(is_old.size, dtype=np.uint8)
        new_targets[is_old] = targets
        new_targets[new_ends[add_e] - 1] = targets[ends[add_e] - 1]
    return new_lengths, out, new_targets, counts


def mask_labels(labels: np.ndarray, num_targets: np.ndarray, seg_offsets: np.ndarray,
                seg_len: np.ndarray, seg_src: np.ndarray, targets: np.ndarray, *,
                shifted: bool) -> None:
    """Apply input target flags to laid-out labels, in place, and recount ``num_targets``.

    Args:
        labels: int32[n, C], from the layout (boundary rule applied), modified in place.
        num_targets: int32[n], overwritten with count(labels != -100) per row.
        seg_offsets: int64[n + 1], row k's segments are ``seg_offsets[k]:seg_offsets[k+1]``.
        seg_len: int64[S], seg_src: int64[S] (flat index of each segment's first token).
        targets: uint8[T] (any array-like, e.g. a memmap), 0 = not a target.
        shifted: the labels convention (False: unshifted, the model shifts).
    """
    K._mask_labels(np.ascontiguousarray(seg_offsets, dtype=np.int64),
                   np.ascontiguousarray(seg_len, dtype=np.int64),
                   np.ascontiguousarray(seg_src, dtype=np.int64),
                   targets if isinstance(targets, np.ndarray) and targets.dtype == np.uint8
                   else np.asarray(targets, dtype=np.uint8), labels, num_targets,
                   1 if shifted else 0)


def segment_targets(seg_src: np.ndarray, seg_len: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Effective targets of each segment (tokens 1..len-1 flagged as targets).

    Args:
        seg_src: int64[S], flat index in ``targets`` of each segment's first token.
        seg_len: int64[S], segment lengths in tokens.
        targets: uint8[T] flags (a memmap is read sequentially per segment).

    Returns:
        int64[S]; without masks this is ``seg_len - 1`` (the boundary rule alone).
    """
    return K._segment_targets(np.ascontiguousarray(seg_src, dtype=np.int64),
                              np.ascontiguousarray(seg_len, dtype=np.int64),
                              targets if isinstance(targets, np.ndarray)
                              and targets.dtype == np.uint8
                              else np.asarray(targets, dtype=np.uint8))


def plan_segment_targets(plan: PackPlan, doc_starts: np.ndarray,
                         targets: np.ndarray | None) -> np.ndarray:
    """int64[S]: effective targets of every segment of ``plan`` (``seg_len - 1`` without flags).

    ``doc_starts``: int64[docs], flat index of each document's first token.
    """
    seg_len = plan.seg_len.astype(np.int64)
    if targets is None:
        return seg_len - 1
    seg_src = np.asarray(doc_starts, dtype=np.int64)[plan.seg_doc] + plan.seg_offset
    return segment_targets(seg_src, seg_len, targets)
