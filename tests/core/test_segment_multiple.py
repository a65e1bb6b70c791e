"""Segments padded to a multiple N (``pack --segment-multiple N``, context parallelism).

The plan and the layout equal their naive twins; the padding inside a row is never a target, is
part of its own document's span only, and every span and the tail are multiples of N.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcheck import flat_docs as flat, layout_dicts
from packtool.core import layout_rows, pack_lengths
from packtool.core.packing import segment_spans
from packtool.core.reference import reference_layout, reference_pack
from packtool.errors import ConfigError


def kernel_rows(docs, capacity, multiple, **kw):
    return layout_dicts(docs, capacity, multiple=multiple, **kw)


def test_two_documents_padded_to_multiples_of_four():
    """Docs of 3 and 5 tokens at C=16, N=4: spans 4 and 8, tail 4 (README's CP example)."""
    _, (row,) = kernel_rows([[11, 12, 13], [21, 22, 23, 24, 25]], 16, 4, strategy="ordered",
                            pad_id=9)
    assert row["input_ids"] == [11, 12, 13, 9, 21, 22, 23, 24, 25, 9, 9, 9, 9, 9, 9, 9]
    assert row["segment_ids"] == [1, 1, 1, 0, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0]
    assert row["position_ids"] == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    assert row["labels"] == [-100, 12, 13, -100, -100, 22, 23, 24, 25] + [-100] * 7
    assert row["cu_seqlens"] == [0, 4, 12, 16]
    assert row["cu_seqlens_unpadded"] == [0, 3, 8, 12]
    assert row["max_seqlen"] == 8 and row["num_targets"] == 6


def test_multiple_one_is_the_plain_layout():
    """N = 1 changes nothing: unpadded and padded cu_seqlens are one array."""
    lengths, tokens, starts = flat([[1, 2, 3], [4, 5]])
    plan = pack_lengths(lengths, 8, segment_multiple=1)
    out = layout_rows(plan, [0], tokens, starts)
    assert out.cu_unpadded_values is None
    assert out.cu_seqlens(0).tolist() == out.cu_seqlens_unpadded(0).tolist() == [0, 3, 5, 8]


def test_capacity_not_a_multiple_is_refused():
    """C = 2050 with N = 8 would leave a tail that no context-parallel split accepts."""
    with pytest.raises(ConfigError, match="not a multiple"):
        pack_lengths(np.array([5, 7]), 2050, segment_multiple=8)
    with pytest.raises(ConfigError, match=">= 1"):
        pack_lengths(np.array([5, 7]), 16, segment_multiple=0)


def test_counts_are_of_real_tokens():
    """Truncated and dropped tokens are counted from the real lengths, not the rounded ones."""
    lengths = np.array([5, 21, 0, 17])
    trunc = pack_lengths(lengths, 16, overflow="truncate", segment_multiple=8)
    assert trunc.counts["tokens_truncated"] == (21 - 16) + (17 - 16)
    assert trunc.counts["tokens_dropped"] == trunc.counts["tokens_truncated"]  # every token lost
    assert trunc.counts["tokens_in"] == 43 and trunc.counts["docs_empty"] == 1
    drop = pack_lengths(lengths, 16, overflow="drop", segment_multiple=8)
    assert drop.counts["tokens_dropped"] == 38 and drop.counts["docs_dropped"] == 2
    split = pack_lengths(lengths, 16, segment_multiple=8)
    assert split.counts["docs_split"] == 2 and split.counts["split_fragments"] == 2
    assert int(split.seg_len.sum()) == 43


docs_strategy = st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=30), max_size=25)


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, n_spans=st.integers(1, 8), multiple=st.sampled_from([1, 2, 3, 4, 8]),
       strategy=st.sampled_from(["obfd", "ordered", "concat"]),
       overflow=st.sampled_from(["split", "truncate", "drop"]),
       labels=st.sampled_from(["unshifted", "shifted"]))
def test_padded_plan_and_layout_equal_the_twins(docs, n_spans, multiple, strategy, overflow,
                                                labels):
    """Kernel plan and layout == the naive twins, column by column (C = a multiple of N)."""
    capacity = n_spans * multiple if n_spans * multiple >= 2 else 2 * multiple
    plan, got = kernel_rows(docs, capacity, multiple, strategy=strategy, overflow=overflow,
                            labels=labels)
    want_rows = reference_pack([len(d) for d in docs], capacity, strategy, overflow, multiple)
    assert [[(int(plan.seg_doc[q]), int(plan.seg_offset[q]), int(plan.seg_len[q]))
             for q in range(plan.row_offsets[r], plan.row_offsets[r + 1])]
            for r in range(plan.num_rows)] == want_rows
    assert got == reference_layout(want_rows, docs, capacity, labels=labels,
                                   segment_multiple=multiple)


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, n_spans=st.integers(1, 8), multiple=st.sampled_from([2, 3, 4, 8]),
       strategy=st.sampled_from(["obfd", "ordered", "concat"]), data=st.data())
def test_padding_inside_a_row_is_never_a_target_nor_another_documents_key(
        docs, n_spans, multiple, strategy, data):
    """Every span and the tail are multiples of N; inside a span the real tokens come first, then
    padding (segment 0, label -100, positions going on, so causally it follows its own document
    and precedes the next span's start); no label is set on padding (also with input label
    masks); the real tokens are the document's, each written once."""
    capacity = max(2, n_spans) * multiple
    targets = [[data.draw(st.integers(0, 1)) for _ in d] for d in docs]
    plan, rows = kernel_rows(docs, capacity, multiple, strategy=strategy, targets=targets)
    assert int(plan.seg_len.sum()) + plan.segment_padding() == sum(
        int(s) for s in segment_spans(plan.seg_len, multiple))
    written = []
    for row in rows:
        cu, cu_real = row["cu_seqlens"], row["cu_seqlens_unpadded"]
        seg, pos, lab, ids = row["segment_ids"], row["position_ids"], row["labels"], row["input_ids"]
        assert cu[0] == 0 and cu[-1] == capacity and len(cu) == len(cu_real)
        spans = np.diff(cu)
        reals = np.diff(cu_real)
        assert (spans % multiple == 0).all() and (spans > 0).all()
        k = len(row["doc_ids"])
        assert (reals[:k] <= spans[:k]).all() and (-(-reals[:k] // multiple) * multiple
                                                    == spans[:k]).all()
        assert (reals[k:] == spans[k:]).all()  # the tail counts whole
        for q in range(len(spans)):
            a, b, r = cu[q], cu[q + 1], reals[q]
            assert pos[a:b] == list(range(b - a))
            if q < k:
                assert seg[a:a + r] == [q + 1] * r and seg[a + r:b] == [0] * (b - a - r)
                assert lab[a] == -100 and lab[a + r:b] == [-100] * (b - a - r)
                d, off = row["doc_ids"][q], row["doc_offsets"][q]
                assert ids[a:a + r] == docs[d][off:off + r]
                written.append((d, off, r))
                for i in range(a + 1, a + r):
                    assert lab[i] == (ids[i] if targets[d][off + i - a] else -100)
            else:
                assert seg[a:b] == [0] * (b - a) and lab[a:b] == [-100] * (b - a)
        assert row["num_targets"] == sum(1 for x in lab if x != -100)
        assert row["max_seqlen"] == int(spans.max())
    for d, doc in enumerate(docs):
        covered = 0
        for o, n in sorted((o, n) for dd, o, n in written if dd == d):
            assert o == covered
            covered += n
        assert covered == len(doc)


@settings(max_examples=100, deadline=None)
@given(docs=docs_strategy, n_spans=st.integers(1, 8), multiple=st.sampled_from([1, 2, 3, 4, 8]),
       labels=st.sampled_from(["unshifted", "shifted", "none"]), pad_id=st.integers(0, 9),
       data=st.data())
def test_rows_read_into_place_then_completed_equal_the_twin(docs, n_spans, multiple, labels,
                                                           pad_id, data):
    """The pack's writing path: each segment's tokens and target flags put at
    ``row_destinations`` (a buffer full of garbage elsewhere), then ``complete_rows`` with
    reused buffers still holding an earlier group's columns: the reference layout, padding
    inside the spans and the tail, labels, both cu_seqlens and the counts included."""
    from packtool.core.layout import complete_rows, gather_segments, row_destinations

    capacity = max(2, n_spans) * multiple
    targets = [[data.draw(st.integers(0, 1)) for _ in d] for d in docs]
    lengths, tokens, starts = flat(docs)
    flags = np.array([f for t in targets for f in t], np.uint8)
    plan = pack_lengths(lengths, capacity, segment_multiple=multiple)
    n = plan.num_rows
    seg_len = plan.seg_len.astype(np.int64)
    src = starts[plan.seg_doc] + plan.seg_offset
    dest = row_destinations(plan.row_offsets, seg_len, capacity, multiple)
    ids = np.full((n, capacity), -7, dtype=np.int32)  # what is not a token must be written
    fl = np.full((n, capacity), 5, dtype=np.uint8)
    gather_segments(tokens, src, seg_len, ids.reshape(-1), dest)
    gather_segments(flags, src, seg_len, fl.reshape(-1), dest)
    dirty = {k: np.full(3 * (n + 1) * capacity, 77, np.int32)
             for k in ("segment_ids", "position_ids", "labels", "cu_values", "cu_unpadded")}
    out = complete_rows(plan.row_offsets, seg_len, ids, pad_id=pad_id, labels=labels, flags=fl,
                        doc_ids=plan.seg_doc, doc_offsets=plan.seg_offset,
                        segment_multiple=multiple, out=dirty)
    rows = [[(int(plan.seg_doc[q]), int(plan.seg_offset[q]), int(plan.seg_len[q]))
             for q in range(plan.row_offsets[r], plan.row_offsets[r + 1])] for r in range(n)]
    want = reference_layout(rows, docs, capacity, pad_id=pad_id, labels=labels,
                            targets=targets, segment_multiple=multiple)
    for k, w in enumerate(want):
        assert out.input_ids[k].tolist() == w["input_ids"]
        assert out.segment_ids[k].tolist() == w["segment_ids"]
        assert out.position_ids[k].tolist() == w["position_ids"]
        assert (out.labels is None) == (w["labels"] is None)
        if out.labels is not None:
            assert out.labels[k].tolist() == w["labels"]
        assert out.cu_seqlens(k).tolist() == w["cu_seqlens"]
        assert out.cu_seqlens_unpadded(k).tolist() == w.get("cu_seqlens_unpadded",
                                                            w["cu_seqlens"])
        assert int(out.max_seqlen[k]) == w["max_seqlen"]
        assert int(out.num_targets[k]) == w["num_targets"]
    assert (out.cu_unpadded_values is None) == (multiple == 1)


def test_spans_that_do_not_fit_a_row_are_refused():
    """A row whose spans take more than C slots is refused before the kernel writes past it."""
    from packtool.core.layout import complete_rows, row_destinations

    seg_offsets, seg_len = np.array([0, 2]), np.array([5, 9])  # spans 8 + 16 at N = 8
    with pytest.raises(ConfigError, match="do not fit a row of 16"):
        row_destinations(seg_offsets, seg_len, 16, 8)
    with pytest.raises(ValueError, match="more than its 16 slots"):
        complete_rows(seg_offsets, seg_len, np.zeros((1, 16), np.int32), segment_multiple=8)
    assert row_destinations(seg_offsets, seg_len, 16, 2).tolist() == [0, 6]  # 6 + 10 fit
