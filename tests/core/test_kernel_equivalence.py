"""The compiled packer equals its pure-Python twin, bin for bin and segment for segment.

``pack_lengths`` (counting sort + capacity tree + bulk placement of equal-length runs, in Numba)
must give exactly the rows of ``reference_pack`` (a stable sort and a scan over every open bin):
same bins, in creation order, same segments in placement order, same tie rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from packtool.core import pack_lengths
from packtool.core.reference import reference_chunks, reference_pack

STRATEGIES = ["obfd", "ordered", "concat"]
OVERFLOWS = ["split", "truncate", "drop"]


def rows_of(plan):
    return [[(int(plan.seg_doc[q]), int(plan.seg_offset[q]), int(plan.seg_len[q]))
             for q in range(plan.row_offsets[r], plan.row_offsets[r + 1])]
            for r in range(plan.num_rows)]


def assert_same_as_twin(lengths, capacity, strategy, overflow):
    plan = pack_lengths(np.asarray(lengths, dtype=np.int64), capacity, strategy=strategy,
                        overflow=overflow)
    want = reference_pack(list(lengths), capacity, strategy=strategy, overflow=overflow)
    assert rows_of(plan) == want, (capacity, strategy, overflow, list(lengths))
    for arr in (plan.row_offsets, plan.seg_doc, plan.seg_offset, plan.seg_len):
        assert arr.dtype == np.int64


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("overflow", OVERFLOWS)
@pytest.mark.parametrize("capacity", [2, 3, 7, 64, 65, 100, 127, 1000])
def test_kernel_equals_twin_on_random_lengths(strategy, overflow, capacity):
    """Random lengths with empties and documents over C: every strategy and overflow mode."""
    rng = np.random.default_rng(capacity * 31 + len(strategy) + len(overflow))
    for trial in range(12):
        n = int(rng.integers(0, 300))
        top = [capacity, 2 * capacity, 5 * capacity + 3][trial % 3]
        lengths = rng.integers(0, top + 1, size=n)
        lengths[rng.random(n) < 0.05] = 0
        assert_same_as_twin(lengths, capacity, strategy, overflow)


@pytest.mark.parametrize("capacity", [8, 33, 2048])
def test_kernel_equals_twin_on_heavy_ties(capacity):
    """Many equal lengths: the bulk placement of a run must follow the one-at-a-time rule."""
    rng = np.random.default_rng(capacity)
    for _ in range(10):
        pool = rng.integers(1, capacity + 1, size=int(rng.integers(1, 6)))
        lengths = rng.choice(pool, size=int(rng.integers(1, 400)))
        assert_same_as_twin(lengths, capacity, "obfd", "split")


def test_kernel_equals_twin_on_small_pieces_and_exact_multiples():
    """Lengths 1, divisors of C, exact multiples of C and C +- 1 (split remainders of 0 and 1)."""
    c = 12
    lengths = [1, 1, 2, 3, 4, 6, 12, 24, 36, 11, 13, 25, 1, 6, 6, 4, 3, 0, 0, 2, 1, 12, 23]
    for overflow in OVERFLOWS:
        assert_same_as_twin(lengths, c, "obfd", overflow)
        assert_same_as_twin(lengths[::-1], c, "obfd", overflow)


def test_counting_sort_is_stable_ties_by_document_then_chunk():
    """Chunks over C/2 each open a bin, so bin order is the sort order: length desc, doc, chunk."""
    c = 10
    rng = np.random.default_rng(7)
    lengths = rng.integers(6, 35, size=200)  # chunks of 10, remainders 1..9
    plan = pack_lengths(lengths, c)
    firsts = [row[0] for row in rows_of(plan)]
    big = [ch for ch in reference_chunks(list(lengths), c) if 2 * ch[2] > c]
    assert firsts[:len(big)] == sorted(big, key=lambda ch: (-ch[2], ch[0], ch[1]))


def test_empty_input_and_all_empty_documents():
    """No chunks at all gives no rows, whatever the strategy."""
    for strategy in STRATEGIES:
        for lengths in ([], [0, 0, 0]):
            assert_same_as_twin(lengths, 16, strategy, "split")


def test_int64_ids_path_matches_int32_path():
    """The kernel's int32 and int64 scratch specialisations give the same plan."""
    from packtool.core import _kernels as K
    from packtool.core import packing

    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 300, size=2000).astype(np.int64)
    want = rows_of(pack_lengths(lengths, 128))
    orig = packing._index_dtype
    try:
        packing._index_dtype = lambda *a: np.int64
        got = rows_of(pack_lengths(lengths, 128))
    finally:
        packing._index_dtype = orig
    assert got == want
    assert K._BLOCK > 0


@settings(max_examples=150, deadline=None)
@given(
    lengths=arrays(np.int64, st.integers(0, 120), elements=st.integers(0, 70)),
    capacity=st.integers(2, 40),
    overflow=st.sampled_from(OVERFLOWS),
    strategy=st.sampled_from(STRATEGIES),
)
def test_kernel_equals_twin_hypothesis(lengths, capacity, overflow, strategy):
    """Hypothesis-generated lengths (0 and > C included) and capacities."""
    assert_same_as_twin(lengths, capacity, strategy, overflow)
