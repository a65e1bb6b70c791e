"""Token masks: the compiled/NumPy mask functions equal their plain-Python twins.

An attention-mask 0 token never reaches a row; a token whose input label is -100 is never a
target after packing, whatever row, split or label convention it lands in; BOS and EOS are
never doubled; ``num_targets`` and the per-segment target counts agree with the labels.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.core import layout_rows, pack_lengths
from packtool.core.masks import (add_boundary_tokens, drop_masked_tokens, inner_mask_zeros,
                                 mask_labels, plan_segment_targets)
from packtool.core.reference import (IGNORE, reference_boundary_tokens, reference_drop_masked,
                                     reference_inner_mask_zeros, reference_layout)


def flat(docs, dtype=np.int32):
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    values = np.array([t for d in docs for t in d], dtype=dtype)
    return lengths, values


def unflat(lengths, values):
    ends = np.cumsum(lengths)
    return [values[e - n:e].tolist() for e, n in zip(ends, lengths)]


doc_st = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1), st.integers(0, 1)),
                  max_size=12)
docs_st = st.lists(doc_st, max_size=8)


def split(docs3):
    docs = [[t for t, _, _ in d] for d in docs3]
    masks = [[m for _, m, _ in d] for d in docs3]
    targets = [[f for _, _, f in d] for d in docs3]
    return docs, masks, targets


@settings(deadline=None, max_examples=200)
@given(docs_st)
def test_drop_masked_tokens_equals_twin(docs3):
    docs, masks, targets = split(docs3)
    lengths, tokens = flat(docs)
    _, keep = flat(masks, np.int8)
    _, tflags = flat(targets, np.uint8)
    got_len, got_tok, got_t, removed = drop_masked_tokens(lengths, tokens, keep, tflags)
    want_docs, want_t, want_removed = reference_drop_masked(docs, masks, targets)
    assert unflat(got_len, got_tok) == want_docs
    assert unflat(got_len, got_t) == want_t
    assert removed == want_removed


@settings(deadline=None, max_examples=300)
@given(st.lists(st.lists(st.integers(0, 1), max_size=10), max_size=8))
def test_inner_mask_zeros_equals_twin(masks):
    """The attention-mask zeros between two ones of a document (not padding: that sits at a
    document's ends) are found as the token-by-token twin finds them."""
    lengths, keep = flat(masks, np.int8)
    got = inner_mask_zeros(lengths, keep)
    assert got.dtype == np.int64
    starts = np.cumsum(lengths) - lengths
    doc = np.searchsorted(np.cumsum(lengths), got, side="right")
    assert list(zip(doc.tolist(), (got - starts[doc]).tolist())) == \
        reference_inner_mask_zeros(masks)


def test_inner_mask_zeros_are_only_those_between_ones():
    masks = [[1, 1, 0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0], [],
             [1, 0, 1, 0, 0, 1, 0]]
    lengths, keep = flat(masks, np.int8)
    assert inner_mask_zeros(lengths, keep).tolist() == [2, 3, 21, 23, 24]
    assert inner_mask_zeros(lengths, keep.astype(bool)).tolist() == [2, 3, 21, 23, 24]
    with pytest.raises(ValueError, match="one entry per token"):
        inner_mask_zeros(lengths, keep[:-1])


@settings(deadline=None, max_examples=200)
@given(docs_st, st.sampled_from([None, 0, 5]), st.sampled_from([None, 0, 6]))
def test_add_boundary_tokens_equals_twin(docs3, bos, eos):
    docs, _, targets = split(docs3)
    lengths, tokens = flat(docs)
    _, tflags = flat(targets, np.uint8)
    got_len, got_tok, got_t, counts = add_boundary_tokens(lengths, tokens, tflags, bos=bos,
                                                          eos=eos)
    want_docs, want_t, want_counts = reference_boundary_tokens(docs, targets, bos, eos)
    assert unflat(got_len, got_tok) == want_docs
    assert unflat(got_len, got_t) == want_t
    assert (counts.bos_added, counts.bos_present, counts.eos_added, counts.eos_present) == (
        want_counts["bos_added"], want_counts["bos_present"], want_counts["eos_added"],
        want_counts["eos_present"])


def test_eos_is_not_doubled_and_bos_is_prepended_once():
    lengths, tokens = flat([[5, 6, 2], [7, 8], [], [1, 9]])
    got_len, got_tok, _, counts = add_boundary_tokens(lengths, tokens, bos=1, eos=2)
    assert unflat(got_len, got_tok) == [[1, 5, 6, 2], [1, 7, 8, 2], [], [1, 9, 2]]
    assert (counts.bos_added, counts.bos_present, counts.eos_added, counts.eos_present) == (
        2, 1, 2, 1)


def test_added_eos_inherits_the_last_tokens_target_flag():
    """The end of a trained response is learned; the end of a masked prompt is not."""
    lengths, tokens = flat([[5, 6], [7, 8]])
    t = np.array([0, 1, 0, 0], dtype=np.uint8)
    _, _, got_t, _ = add_boundary_tokens(lengths, tokens, t, eos=2)
    assert got_t.tolist() == [0, 1, 1, 0, 0, 0]


@settings(deadline=None, max_examples=150)
@given(st.lists(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 1)), max_size=14),
                min_size=1, max_size=10),
       st.integers(2, 9), st.sampled_from(["obfd", "ordered", "concat"]),
       st.sampled_from(["unshifted", "shifted"]))
def test_masked_layout_equals_twin(docs2, capacity, strategy, labels):
    """Kernel labels/num_targets with input target flags == the plain-Python layout."""
    docs = [[t for t, _ in d] for d in docs2]
    targets = [[f for _, f in d] for d in docs2]
    lengths, tokens = flat(docs)
    _, tflags = flat(targets, np.uint8)
    if not lengths.any():
        return
    plan = pack_lengths(lengths, capacity, strategy=strategy, overflow="split")
    doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    rows = np.arange(plan.num_rows)
    packed = layout_rows(plan, rows, tokens, doc_starts, labels=labels)
    seg_src = doc_starts[packed.doc_ids] + packed.doc_offsets
    seg_len = plan.seg_len  # rows in plan order: segments in plan order
    labs, nt = packed.labels.copy(), packed.num_targets.copy()
    mask_labels(labs, nt, packed.seg_offsets, seg_len, seg_src, tflags,
                shifted=labels == "shifted")
    plan_rows = [[(int(plan.seg_doc[q]), int(plan.seg_offset[q]), int(plan.seg_len[q]))
                  for q in range(plan.row_offsets[r], plan.row_offsets[r + 1])]
                 for r in range(plan.num_rows)]
    want = reference_layout(plan_rows, docs, capacity, labels=labels, targets=targets)
    assert labs.tolist() == [w["labels"] for w in want]
    assert nt.tolist() == [w["num_targets"] for w in want]
    assert nt.tolist() == (labs != IGNORE).sum(axis=1).tolist()
    # the flags applied inside the layout kernel give the same labels and counts
    fused = layout_rows(plan, rows, tokens, doc_starts, labels=labels, targets=tflags)
    assert fused.labels.tolist() == labs.tolist()
    assert fused.num_targets.tolist() == nt.tolist()
    counted = layout_rows(plan, rows, tokens, doc_starts, labels="none", targets=tflags)
    assert counted.labels is None and counted.num_targets.tolist() == nt.tolist()
    per_seg = plan_segment_targets(plan, doc_starts, tflags)
    assert int(per_seg.sum()) == int(nt.sum())
    # a flagged-0 token is never a target: unshifted, its own position; shifted, the one before
    for r, row in enumerate(plan_rows):
        pos = 0
        for doc, off, length in row:
            for t in range(length):
                if not targets[doc][off + t]:
                    p = pos + t if labels == "unshifted" else pos + t - 1
                    if p >= pos:
                        assert labs[r, p] == IGNORE
            pos += length


def test_without_flags_segment_targets_is_the_boundary_rule():
    plan = pack_lengths(np.array([3, 5, 1], dtype=np.int64), 4)
    assert plan_segment_targets(plan, np.array([0, 3, 8]), None).tolist() == (
        plan.seg_len - 1).tolist()


@pytest.mark.parametrize("n", [0, 1])
def test_drop_masked_tokens_with_nothing_masked_is_identity(n):
    lengths, tokens = flat([[1, 2, 3]] * n)
    out = drop_masked_tokens(lengths, tokens, np.ones(tokens.size))
    assert out[1] is tokens and out[3] == 0


prep_doc_st = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1), st.integers(0, 1),
                                 st.integers(0, 1), st.integers(0, 1)), max_size=10)


@settings(deadline=None, max_examples=200)
@given(st.lists(prep_doc_st, max_size=8), st.booleans(), st.booleans(), st.integers(0, 2),
       st.sampled_from([None, 0, 3]), st.sampled_from([None, 0, 5]),
       st.one_of(st.none(), st.integers(0, 255)))
def test_prepare_documents_equals_twin(docs5, use_keep, use_labels, n_masks, bos, eos,
                                       drop_bits):
    """The one path from columns to packed documents (labels, loss masks, documents of the
    other held-out part, attention mask, BOS/EOS, in that order) equals its token-by-token
    twin."""
    from packtool.core.masks import prepare_documents
    from packtool.core.reference import reference_prepare_documents

    docs = [[t for t, *_ in d] for d in docs5]
    keep = [[k for _, k, *_ in d] for d in docs5] if use_keep else None
    labels = [[IGNORE if lab == 0 else t for t, _, lab, _, _ in d] for d in docs5] \
        if use_labels else None
    masks = [[[m1 for *_, m1, _ in d] for d in docs5],
             [[m2 for *_, m2 in d] for d in docs5]][:n_masks]
    keep_docs = None if drop_bits is None else [not (drop_bits >> (i % 8)) & 1
                                                for i in range(len(docs))]
    want_docs, want_flags = reference_prepare_documents(docs, keep, labels, masks, bos, eos,
                                                        keep_docs)
    lengths, tokens = flat(docs)
    tb = prepare_documents(7, lengths, tokens,
                           keep=None if keep is None else flat(keep, np.int8)[1],
                           labels=None if labels is None else flat(labels, np.int64)[1],
                           loss_masks=[flat(m, np.int8)[1] for m in masks], bos=bos, eos=eos,
                           keep_docs=None if keep_docs is None else np.array(keep_docs, bool))
    assert tb.first_row == 7
    left = [] if keep_docs is None else [d for d, k in zip(docs, keep_docs) if not k]
    assert tb.other_split == (len(left), sum(map(len, left)))
    assert tb.mask_counts()["docs_other_split"] == len(left)
    # what tells empty from masked: documents empty as read on each side, and the other
    # side's tokens after the attention mask (its own twin's)
    mine = docs if keep_docs is None else [d for d, k in zip(docs, keep_docs) if k]
    theirs = [] if keep_docs is None else reference_prepare_documents(
        docs, keep, keep_docs=[not k for k in keep_docs])[0]
    assert tb.docs_empty_read == sum(not d for d in mine)
    assert tb.other_packed == (sum(not d for d in left), sum(map(len, theirs)))
    assert unflat(tb.lengths, tb.tokens) == want_docs
    if want_flags is None:
        assert tb.targets is None
    else:
        assert unflat(tb.lengths, tb.targets) == want_flags
        assert tb.mask_counts()["tokens_label_masked"] == sum(f.count(0) for f in want_flags)
