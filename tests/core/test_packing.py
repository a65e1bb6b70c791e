"""Hand cases of the packer: each names the claim it checks."""

from __future__ import annotations

import numpy as np
import pytest

from packtool.core import pack_lengths
from packtool.core.reference import reference_pack
from packtool.errors import ConfigError, PackingError


def rows_of(plan):
    return [[(int(plan.seg_doc[q]), int(plan.seg_offset[q]), int(plan.seg_len[q]))
             for q in range(plan.row_offsets[r], plan.row_offsets[r + 1])]
            for r in range(plan.num_rows)]


def test_paper_figure1_example_best_fit():
    """arXiv 2404.10830 Fig. 1: C=8, documents of 14, 7, 5, 2, 3 tokens fit in 4 sequences.

    The 14-token document is the only one cut (8 + 6); chunks go 8, 7, 6, 5, 3, 2 into the bin
    with the least room that fits: 3 joins the 5, 2 joins the 6.
    """
    plan = pack_lengths([14, 7, 5, 2, 3], 8)
    assert rows_of(plan) == [
        [(0, 0, 8)],
        [(1, 0, 7)],
        [(0, 8, 6), (3, 0, 2)],
        [(2, 0, 5), (4, 0, 3)],
    ]
    assert plan.counts["docs_split"] == 1 and plan.counts["split_fragments"] == 1


def test_best_fit_prefers_tightest_bin_not_first():
    """Best fit, not first fit: the 1 goes to the bin with 1 token of room, not the first bin.

    C=10: 6 -> bin 0 (room 4), 6 -> bin 1 (room 4), 3 -> bin 1 (tie, most recent; room 1),
    1 -> bin 1 (room 1 is the tightest fit). First fit would have put 3 and 1 into bin 0.
    """
    plan = pack_lengths([6, 6, 3, 1], 10)
    assert rows_of(plan) == [[(0, 0, 6)], [(1, 0, 6), (2, 0, 3), (3, 0, 1)]]


def test_ties_by_document_index_then_chunk():
    """Equal lengths keep input order (stable counting sort)."""
    plan = pack_lengths([3, 3, 3, 3], 6)
    assert rows_of(plan) == [[(0, 0, 3), (1, 0, 3)], [(2, 0, 3), (3, 0, 3)]]


def test_equal_remaining_capacity_goes_to_most_recent_bin():
    """Documented tie rule: among bins with equal room, the one that reached it last."""
    # C=10: 7, 7 -> two bins with room 3; the 3 goes to the second (most recent) one
    plan = pack_lengths([7, 7, 3], 10)
    assert rows_of(plan) == [[(0, 0, 7)], [(1, 0, 7), (2, 0, 3)]]
    assert rows_of(plan) == reference_pack([7, 7, 3], 10)


def test_ordered_is_next_fit_in_input_order():
    """The lecture's example: lengths [3, 2, 4], capacity 5 -> [[0, 1], [2]]."""
    plan = pack_lengths([3, 2, 4], 5, strategy="ordered")
    assert [[s[0] for s in row] for row in rows_of(plan)] == [[0, 1], [2]]


def test_concat_cuts_the_stream_every_capacity_tokens():
    """concat: documents straddle rows; each piece is its own segment with its offset."""
    plan = pack_lengths([3, 4, 2], 4, strategy="concat")
    assert rows_of(plan) == [[(0, 0, 3), (1, 0, 1)], [(1, 1, 3), (2, 0, 1)], [(2, 1, 1)]]
    assert plan.counts["docs_cut"] == 2


def test_empty_documents_are_skipped_and_counted():
    plan = pack_lengths([2, 0, 1, 0], 4)
    assert plan.counts["docs_empty"] == 2
    assert sorted(d for row in rows_of(plan) for d, _, _ in row) == [0, 2]


@pytest.mark.parametrize("strategy", ["obfd", "ordered", "concat"])
def test_no_input_gives_no_rows(strategy):
    plan = pack_lengths(np.zeros(0, dtype=np.int64), 8, strategy=strategy)
    assert plan.num_rows == 0 and plan.num_segments == 0


def test_split_chunks_are_consecutive_and_counted():
    """--overflow split: chunks of C, the last shorter; B10's input gives exactly 3 bins."""
    plan = pack_lengths([5, 2, 3, 1], 4)
    assert rows_of(plan) == [[(0, 0, 4)], [(2, 0, 3), (0, 4, 1)], [(1, 0, 2), (3, 0, 1)]]
    assert plan.counts["split_fragments"] == 1


def test_truncate_drop_counts_tokens():
    """B11: ``tokens_dropped`` is every token not written (the truncated tail too), and
    ``tokens_truncated`` the part of it that truncation cut."""
    t = pack_lengths([6, 2], 4, overflow="truncate")
    assert rows_of(t) == [[(0, 0, 4)], [(1, 0, 2)]]
    assert (t.counts["docs_truncated"], t.counts["tokens_truncated"]) == (1, 2)
    assert (t.counts["docs_dropped"], t.counts["tokens_dropped"]) == (0, 2)
    d = pack_lengths([6, 2], 4, overflow="drop")
    assert rows_of(d) == [[(1, 0, 2)]]
    assert (d.counts["docs_dropped"], d.counts["tokens_dropped"]) == (1, 6)
    assert d.counts["tokens_truncated"] == 0
    for plan in (t, d, pack_lengths([6, 2], 4)):
        assert plan.counts["tokens_in"] == int(plan.seg_len.sum()) + plan.counts["tokens_dropped"]


def test_overflow_error_names_document_and_length():
    with pytest.raises(PackingError, match=r"document 1 has 9 tokens"):
        pack_lengths([2, 9], 4, overflow="error")


@pytest.mark.parametrize("capacity", [0, 1, -3, 2**24 + 1])
def test_capacity_out_of_range_is_refused(capacity):
    with pytest.raises(ConfigError, match="capacity"):
        pack_lengths([1], capacity)


def test_negative_length_is_refused():
    with pytest.raises(PackingError, match="negative"):
        pack_lengths([1, -1], 4)


@pytest.mark.parametrize("lengths, what", [
    ([3.7, 2.2], "must be integers"), (np.array([3.0, 2.0]), "must be integers"),
    (["3", "2"], "must be integers"), ([True, False], "must be integers"),
    (np.array([2**63], np.uint64), "does not fit int64"),
])
def test_lengths_that_are_not_integers_are_refused_not_cut(lengths, what):
    """3.7 was planned as 3, "3" and True as integers, 2**63 as a negative length."""
    with pytest.raises(PackingError, match=what):
        pack_lengths(lengths, 6)


def test_integer_lengths_of_any_dtype_plan_alike():
    want = pack_lengths(np.array([3, 2, 5], np.int64), 6)
    for dt in (np.uint8, np.int16, np.uint32, np.uint64):
        got = pack_lengths(np.array([3, 2, 5], dt), 6)
        assert got.seg_len.tolist() == want.seg_len.tolist()
        assert got.row_offsets.tolist() == want.row_offsets.tolist()
    assert pack_lengths([], 6).num_rows == 0


def test_odd_and_non_power_of_two_capacities():
    """The capacity tree is sized for any C (a power-of-two assumption would break these)."""
    rng = np.random.default_rng(7)
    for capacity in (2, 3, 63, 64, 65, 127, 129, 4095, 4097):
        lengths = rng.integers(0, 2 * capacity, 300)
        assert rows_of(pack_lengths(lengths, capacity)) == reference_pack(lengths, capacity)


def test_obfd_never_uses_more_rows_than_ordered_on_random_input():
    rng = np.random.default_rng(3)
    for _ in range(20):
        lengths = rng.integers(1, 100, 200)
        assert pack_lengths(lengths, 128).num_rows <= pack_lengths(
            lengths, 128, strategy="ordered").num_rows
