"""``pack_lengths(min_fill=...)`` / ``pack --min-fill``: planned rows under a fill threshold left
out, their documents and tokens counted as dropped (public case B15: the statistics must describe
the rows that remain, not the plan before the drop)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.core.packing import drop_underfilled, min_fill_tokens, pack_lengths
from packtool.core.reference import (reference_drop_underfilled, reference_overflow_counts,
                                     reference_pack)
from packtool.errors import ConfigError
from packtool.stats import PackStats


def rows_of(plan):
    return [[(int(plan.seg_doc[q]), int(plan.seg_offset[q]), int(plan.seg_len[q]))
             for q in range(plan.row_offsets[r], plan.row_offsets[r + 1])]
            for r in range(plan.num_rows)]


def test_B15_the_partial_row_is_left_out_and_the_figures_describe_what_remains():
    """B15: documents [4, 4, 1] at C = 4 with only full rows kept: 2 rows, 8 real tokens, 8
    slots, no padding, fill 1.0 (not 8 / 12), 1 document and 1 token dropped."""
    plan = pack_lengths([4, 4, 1], 4, min_fill=1.0)
    s = PackStats.from_plan(plan)
    assert (s.rows, s.real_tokens, s.rows * s.capacity, s.padding_tokens) == (2, 8, 8, 0)
    assert s.fill == 1.0 and s.padding_fraction == 0.0
    assert (s.docs_dropped, s.tokens_dropped, s.rows_dropped) == (1, 1, 1)
    assert s.effective_targets == 6


def test_dropping_every_row_gives_zeros():
    plan = pack_lengths([1, 2], 4, min_fill=1.0)
    s = PackStats.from_plan(plan)
    assert (plan.num_rows, plan.num_segments, s.real_tokens, s.padding_tokens) == (0, 0, 0, 0)
    assert (s.docs_dropped, s.tokens_dropped, s.rows_dropped) == (2, 3, 1)
    assert s.fill == 0.0 and s.padding_fraction == 0.0
    assert plan.row_offsets.tolist() == [0]


def test_a_split_document_that_keeps_some_pieces_loses_only_their_tokens():
    """10 tokens at C = 4: pieces 4, 4, 2; the row of 2 goes: the document stays (cut in 2)."""
    plan = pack_lengths([10], 4, min_fill=1.0)
    assert rows_of(plan) == [[(0, 0, 4)], [(0, 4, 4)]]
    c = plan.counts
    assert (c["docs_dropped"], c["tokens_dropped"], c["rows_dropped"], c["docs_cut"]) == (0, 2, 1, 1)
    assert (c["docs_split"], c["split_fragments"]) == (1, 1)  # the pieces written: 2, not 3


def test_zero_keeps_the_plan_and_counts_unchanged():
    lengths = [5, 3, 9, 1]
    a, b = pack_lengths(lengths, 8), pack_lengths(lengths, 8, min_fill=0)
    assert rows_of(a) == rows_of(b) and a.counts == b.counts
    assert "rows_dropped" not in b.counts
    assert drop_underfilled(a, 0) is a


@pytest.mark.parametrize("f,C,want", [(0.3, 10, 3), (0.7, 10, 7), (1.0, 2048, 2048),
                                      (0.5, 3, 2), (1e-9, 4, 1), (0.0, 4, 0)])
def test_threshold_is_the_ceiling_of_the_decimal_product(f, C, want):
    assert min_fill_tokens(f, C) == want


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "half", None])
def test_a_fraction_outside_0_1_is_refused(bad):
    with pytest.raises(ConfigError, match="min_fill"):
        pack_lengths([3], 4, min_fill=bad)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=40), st.integers(2, 24),
       st.sampled_from(["obfd", "ordered", "concat"]),
       st.sampled_from(["split", "truncate", "drop"]),
       st.floats(0, 1, allow_nan=False), st.sampled_from([1, 2]))
def test_rows_left_out_equal_the_reference_and_every_count_adds_up(lengths, C, strategy,
                                                                   overflow, f, multiple):
    C -= C % multiple
    full = pack_lengths(lengths, C, strategy=strategy, overflow=overflow,
                        segment_multiple=multiple)
    plan = pack_lengths(lengths, C, strategy=strategy, overflow=overflow,
                        segment_multiple=multiple, min_fill=f)
    need = min_fill_tokens(f, C)
    kept, rows_lost, tokens_lost, docs_lost, cut, split, fragments = \
        reference_drop_underfilled(reference_pack(lengths, C, strategy, overflow, multiple), need)
    assert rows_of(plan) == kept
    assert all(n >= need for n in plan.row_lengths())
    c, c0 = plan.counts, full.counts
    lost = reference_overflow_counts(lengths, C, overflow)
    assert {k: c0[k] for k in lost} == lost
    assert c.get("rows_dropped", 0) == rows_lost
    assert c.get("tokens_under_min_fill", 0) == tokens_lost
    assert c["tokens_dropped"] - c0["tokens_dropped"] == tokens_lost
    assert c["docs_dropped"] - c0["docs_dropped"] == docs_lost
    # the documents left out whole with those rows, apart from --overflow drop's, and their
    # tokens there (the rest of the rows' tokens are pieces of documents written in part)
    kept_docs = {d for row in kept for d, _, _ in row}
    gone = [(d, n) for row in reference_pack(lengths, C, strategy, overflow, multiple)
            if sum(n for _, _, n in row) < need for d, _, n in row if d not in kept_docs]
    assert c.get("docs_under_min_fill", 0) == len({d for d, _ in gone}) == docs_lost
    assert c.get("doc_tokens_under_min_fill", 0) == sum(n for _, n in gone) <= tokens_lost
    if rows_lost:
        assert c["docs_cut"] == cut
        if strategy != "concat":  # concat splits nothing: its pieces are cuts of the stream
            assert (c["docs_split"], c["split_fragments"]) == (split, fragments)
    # every token read is written or counted in tokens_dropped (public case B11), whose parts
    # are the truncated tails, the dropped documents' tokens and the rows under --min-fill
    s = PackStats.from_plan(plan)
    assert s.real_tokens + s.tokens_dropped == sum(lengths) == s.tokens_in
    assert s.tokens_lost == s.tokens_dropped
    assert s.tokens_of_dropped_docs == lost["tokens_dropped"] - lost["tokens_truncated"] >= 0
    assert s.padding_tokens == s.rows * C - s.real_tokens
    assert np.all(plan.seg_len > 0)


def test_the_threshold_is_exact_for_the_decimal_given_and_numpy_floats_are_accepted():
    """ceil of the decimal product, even one digit past what 9-decimal rounding would keep; a
    NumPy float32 0.3 is 0.3 (not its binary value 0.30000001...), in the core and the config."""
    from packtool.config import PackConfig

    assert min_fill_tokens(0.1000000000001, 10) == 2
    assert min_fill_tokens(np.float32(0.3), 10) == 3
    assert rows_of(pack_lengths([10, 1], 10, min_fill=0.1000000000001)) == [[(0, 0, 10)]]
    cfg = PackConfig(inputs=("x",), output="y", min_fill=np.float32(0.3))
    assert cfg.min_fill == 0.3 and type(cfg.min_fill) is float
    with pytest.raises(ConfigError, match="--min-fill True"):
        PackConfig(inputs=("x",), output="y", min_fill=True)
