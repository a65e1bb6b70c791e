"""The row layout: kernel == reference twin, and the output contract's invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcheck import flat_docs as flat, layout_dicts
from packtool.core import layout_rows, pack_lengths
from packtool.core.layout import append_eos, gather_segments
from packtool.core.reference import (reference_gather_segments, reference_layout,
                                     reference_pack)
from packtool.errors import ConfigError


def kernel_rows(docs, capacity, **kw):
    return layout_dicts(docs, capacity, **kw)[1]


def test_contract_hand_case_two_documents():
    """Docs [11,12,13],[21,22] at C=6: the README's contract example (B01, B03, B06)."""
    (row,) = kernel_rows([[11, 12, 13], [21, 22]], 6)
    assert row["input_ids"] == [11, 12, 13, 21, 22, 0]
    assert row["segment_ids"] == [1, 1, 1, 2, 2, 0]
    assert row["position_ids"] == [0, 1, 2, 0, 1, 0]
    assert row["cu_seqlens"] == [0, 3, 5, 6]
    assert row["labels"] == [-100, 12, 13, -100, 22, -100]
    assert row["max_seqlen"] == 3 and row["num_targets"] == 3


def test_shifted_labels_never_cross_a_boundary():
    """B04: shifted labels are per document: position 2 is -100, not 21."""
    (row,) = kernel_rows([[11, 12, 13], [21, 22]], 6, labels="shifted")
    assert row["labels"] == [12, 13, -100, 22, -100, -100]


def test_full_row_has_no_padding_segment():
    """B07(b): a row filled exactly ends cu_seqlens at C once, with no zero-length segment."""
    (row,) = kernel_rows([[4, 5, 6, 7, 8], [1, 2, 3]], 8)
    assert row["cu_seqlens"] == [0, 5, 8]


def test_padding_tail_is_one_pseudo_segment():
    """The padding tail gets positions 0..p-1 and one cu_seqlens entry; it is never a target."""
    (row,) = kernel_rows([[1, 2, 3, 4, 5]], 8, pad_id=7)
    assert row["input_ids"] == [1, 2, 3, 4, 5, 7, 7, 7]
    assert row["position_ids"] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert row["cu_seqlens"] == [0, 5, 8]
    assert row["labels"][5:] == [-100, -100, -100]


def test_labels_none_omits_labels():
    (row,) = kernel_rows([[1, 2]], 4, labels="none")
    assert row["labels"] is None and row["num_targets"] == 1


def test_pad_id_outside_int32_is_refused():
    lengths, tokens, starts = flat([[1]])
    plan = pack_lengths(lengths, 4)
    with pytest.raises(ConfigError, match="pad-id"):
        layout_rows(plan, [0], tokens, starts, pad_id=2**31)


def test_append_eos_adds_one_token_to_non_empty_documents():
    lengths, tokens = append_eos(np.array([2, 0, 1]), np.array([5, 6, 7], dtype=np.int32), 99)
    assert lengths.tolist() == [3, 0, 2]
    assert tokens.tolist() == [5, 6, 99, 7, 99]


def test_append_eos_never_doubles_an_eos():
    """[..., 2] + EOS 2 would train an EOS -> EOS target."""
    lengths, tokens = append_eos(np.array([2, 1]), np.array([5, 99, 99], dtype=np.int32), 99)
    assert lengths.tolist() == [2, 1]
    assert tokens.tolist() == [5, 99, 99]


docs_strategy = st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=30), max_size=25)


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, capacity=st.integers(2, 40),
       strategy=st.sampled_from(["obfd", "ordered", "concat"]),
       overflow=st.sampled_from(["split", "truncate", "drop"]),
       labels=st.sampled_from(["unshifted", "shifted"]))
def test_layout_kernel_equals_reference(docs, capacity, strategy, overflow, labels):
    """Kernel layout == the naive twin's layout, column by column, on generated documents."""
    got = kernel_rows(docs, capacity, strategy=strategy, overflow=overflow, labels=labels)
    want = reference_layout(reference_pack([len(d) for d in docs], capacity, strategy, overflow),
                            docs, capacity, labels=labels)
    assert got == want


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, capacity=st.integers(2, 40),
       strategy=st.sampled_from(["obfd", "ordered", "concat"]))
def test_contract_invariants_hold(docs, capacity, strategy):
    """Positions restart at every segment, no label crosses a segment, cu_seqlens strictly
    increases to C, padding only at the tail, and every token is written exactly once."""
    rows = kernel_rows(docs, capacity, strategy=strategy)
    written = []
    for row in rows:
        seg, pos, ids, lab = row["segment_ids"], row["position_ids"], row["input_ids"], row["labels"]
        assert len(seg) == len(pos) == len(ids) == len(lab) == capacity
        cu = row["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == capacity and all(b > a for a, b in zip(cu, cu[1:]))
        real = sum(1 for s in seg if s)
        assert all(s == 0 for s in seg[real:]) and all(s > 0 for s in seg[:real])
        for i in range(capacity):
            if i == 0 or seg[i] != seg[i - 1]:
                assert pos[i] == 0
                assert lab[i] == -100
            else:
                assert pos[i] == pos[i - 1] + 1
                assert lab[i] == (ids[i] if seg[i] else -100)
        assert row["num_targets"] == sum(1 for x in lab if x != -100)
        for d, off, k in zip(row["doc_ids"], row["doc_offsets"], range(1, len(row["doc_ids"]) + 1)):
            piece = [ids[i] for i in range(capacity) if seg[i] == k]
            assert piece == docs[d][off:off + len(piece)]
            written.append((d, off, len(piece)))
    # conservation: each document's pieces tile it exactly
    for d, doc in enumerate(docs):
        pieces = sorted((o, n) for dd, o, n in written if dd == d)
        covered = 0
        for o, n in pieces:
            assert o == covered
            covered += n
        assert covered == len(doc)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), size=st.integers(0, 300), dtype=st.sampled_from([np.int32, np.uint8]))
def test_gather_segments_equals_reference(data, size, dtype):
    """Segments copied back to back, or to given places, equal the slow twin."""
    values = np.arange(size, dtype=np.int64).astype(dtype) * 7 + 3
    n = data.draw(st.integers(0, 20))
    src = [data.draw(st.integers(0, size)) for _ in range(n)]
    lens = [data.draw(st.integers(0, size - s)) for s in src]
    got = gather_segments(values, np.array(src, dtype=np.int64), np.array(lens, dtype=np.int64))
    assert got.dtype == values.dtype
    assert got.tolist() == [int(x) for x in reference_gather_segments(values, src, lens)]
    # placed in reverse order in a larger buffer: each segment lands at its dest
    ends = np.cumsum(lens[::-1])
    dest = np.array((ends - np.array(lens[::-1], dtype=np.int64)).tolist()[::-1],
                    dtype=np.int64) + 5
    out = np.full(int(sum(lens)) + 5, 99, dtype=dtype)
    gather_segments(values, np.array(src, dtype=np.int64), np.array(lens, dtype=np.int64),
                    out, dest)
    want = [int(x) for s, n in zip(src[::-1], lens[::-1]) for x in values[s:s + n]]
    assert out[:5].tolist() == [99] * 5 and out[5:].tolist() == want


def test_gather_segments_refuses_a_segment_outside_the_values():
    with pytest.raises(ValueError, match="outside"):
        gather_segments(np.zeros(4, np.int32), np.array([2]), np.array([3]))


@pytest.mark.parametrize("tokens, starts, what", [
    (np.array([11, 12, 13], np.int32), [0, 10**9], "lie outside tokens"),  # was a segfault
    (np.array([11, 12, 13], np.int32), [0, 3], "lie outside tokens"),  # was heap memory
    (np.array([11, 12, 13], np.int32), [-1, 0], "lie outside tokens"),
    (np.arange(8, dtype=np.int32), [0], "one start per planned document"),
    (np.arange(8, dtype=np.int32), [0.0, 3.0], "doc_starts must be integers"),
    (np.array([1, 2, 3, 2**33, 5, 6, 7, 8]), [0, 3], r"tokens\[3\] = 8589934592"),
    (np.array([1, 2, 3, -12, 5, 6, 7, 8]), [0, 3], r"tokens\[3\] = -12"),
    (np.array([11.5] * 8), [0, 3], "integer ids"),
    (np.array([True] * 8), [0, 3], "integer ids"),
])
def test_layout_rows_refuses_what_it_cannot_lay_out(tokens, starts, what):
    """Starts that send a segment outside ``tokens`` (the copy kernel does not check bounds),
    and ids that casting to int32 would wrap or cut, are refused, never laid out."""
    plan = pack_lengths(np.array([3, 5]), 8)
    with pytest.raises(ConfigError, match=what):
        layout_rows(plan, np.arange(plan.num_rows), tokens, np.array(starts))


def test_layout_rows_takes_any_integer_tokens_that_fit():
    """int64 / uint16 ids within int32 lay out as the int32 ones do; targets must match."""
    plan = pack_lengths(np.array([3, 5]), 8)
    want = layout_rows(plan, [0], np.arange(8, dtype=np.int32), np.array([0, 3])).input_ids
    for dt in (np.int64, np.uint16, np.int8):
        got = layout_rows(plan, [0], np.arange(8, dtype=dt), np.array([0, 3])).input_ids
        assert got.tolist() == want.tolist()
    with pytest.raises(ConfigError, match="one flag per token"):
        layout_rows(plan, [0], np.arange(8, dtype=np.int32), np.array([0, 3]),
                    targets=np.ones(5, np.uint8))
