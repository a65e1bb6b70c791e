"""The reader's training paths: segments and positions derived from ``cu_seqlens`` equal the
stored columns, rows gathered as slices equal the rows one by one, and row groups of several
outputs decode in the order asked, with or without a thread ahead."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcheck import invoke, write_docs
from packtool.errors import ManifestError
from packtool.formats.packed import PackedOutput, Rows, iter_decoded, structure_from_cu

ALL = ["input_ids", "segment_ids", "position_ids", "labels", "cu_seqlens", "doc_ids",
       "doc_offsets", "max_seqlen", "num_targets"]


@pytest.fixture(scope="module", params=["none", "shifted"])
def out(request, tmp_path_factory):
    """Rows with padding tails and split documents, labels derived or stored shifted."""
    d = tmp_path_factory.mktemp(f"rows-{request.param}")
    docs = [[(5 * i + k) % 89 + 1 for k in range(1 + (i * 7) % 29)] for i in range(80)]
    write_docs(d / "in" / "a.parquet", docs)
    res = invoke(["pack", "-q", "--capacity", "24", "--rows-per-shard", "9", "--labels",
                  request.param, d / "in", d / "out"])  # one group of 9 rows per shard
    assert res.exit_code == 0, res.output
    return d / "out"


@pytest.mark.parametrize("labels", ["unshifted", "shifted"])
def test_derived_structure_equals_the_stored_columns(out, labels):
    """structure='derived' reads no segment_ids / position_ids pages and hands out the same
    arrays (and the same labels in either convention) as structure='stored'."""
    o = PackedOutput.open(out)
    assert o.num_row_groups > 3
    for g in range(o.num_row_groups):
        a = o.decode(g, ALL, labels)
        b = o.decode(g, ALL, labels, structure="derived")
        assert a.tokens.keys() == b.tokens.keys()
        for k in a.tokens:
            assert np.array_equal(a.tokens[k], b.tokens[k]), (g, k)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 7), max_size=4), min_size=1, max_size=5))
def test_structure_from_cu_follows_the_contract(rows):
    """Segments 1..k then 0 on the padding tail; positions 0..len-1 in every span, the padding
    tail one pseudo-segment: built by hand per row and compared."""
    C = 12
    cu_vals, offs, k, want_seg, want_pos = [], [0], [], [], []
    for lens in rows:
        spans, at = [], 0
        for n in lens:
            n = min(n, C - at)
            if n > 0:
                spans.append(n)
                at += n
        real = len(spans)
        if at < C:
            spans.append(C - at)
        cu = np.concatenate([[0], np.cumsum(spans)])
        cu_vals += cu.tolist()
        offs.append(len(cu_vals))
        k.append(real)
        want_seg.append(sum(([q + 1 if q < real else 0] * n for q, n in enumerate(spans)), []))
        want_pos.append(sum((list(range(n)) for n in spans), []))
    seg, pos = structure_from_cu(np.array(cu_vals), np.array(offs), np.array(k), C)
    assert seg.tolist() == want_seg and pos.tolist() == want_pos


def test_a_cu_seqlens_that_breaks_the_contract_is_refused():
    for cu, k in (([0, 5, 5, 12], 2), ([0, 5, 11], 2), ([1, 12], 1), ([0, 4, 12], 0)):
        with pytest.raises(ManifestError, match="cu_seqlens .* breaks the output contract"):
            structure_from_cu(np.array(cu), np.array([0, len(cu)]), np.array([k]), 12)


def test_gathered_rows_equal_the_rows_one_by_one(out):
    """Rows.gather over rows of several blocks, in any order, single rows and runs of up to a
    whole block (both ways of gathering ragged columns), holds exactly what Block.row gives
    for each row."""
    o = PackedOutput.open(out)
    blocks = [o.decode(g, ALL, "unshifted") for g in range(o.num_row_groups)]
    assert max(b.num_rows for b in blocks) > 4
    rng = np.random.default_rng(0)
    for _ in range(20):
        parts = [(blocks[g], rng.choice(blocks[g].num_rows, rng.integers(1, blocks[g].num_rows + 1),
                                        replace=False)) for g in rng.choice(len(blocks), 3)]
        rows = Rows.gather(parts, meta={"tag": list(range(sum(len(i) for _, i in parts)))})
        want = [b.row(int(i)) for b, idx in parts for i in idx]
        assert rows.num_rows == len(want) and rows.meta["tag"] == list(range(len(want)))
        for r, item in enumerate(want):
            for k in rows.tokens:
                assert np.array_equal(rows.tokens[k][r], item[k]), k
            for k in rows.ragged:
                assert np.array_equal(rows.ragged_rows(k)[r], item[k]), k
            for k in rows.scalars:
                assert rows.scalars[k][r] == item[k]
            assert (rows.index[r], rows.row[r], rows.shard[r]) == (item["index"], item["row"],
                                                                   item["shard"])


@pytest.mark.parametrize("ahead", [0, 2])
def test_row_groups_of_several_outputs_decode_in_the_order_asked(out, tmp_path, ahead):
    other = tmp_path / "other"
    write_docs(tmp_path / "in" / "b.parquet", [[3, 4, 5, 6]] * 30)
    assert invoke(["pack", "-q", "--capacity", "24", "--rows-per-shard", "5", "--row-group-mb",
                   "0.0001", tmp_path / "in", other]).exit_code == 0
    a, b = PackedOutput.open(out), PackedOutput.open(other)
    jobs = [(a, 2), (b, 0), (a, 0), (b, 1), (a, 1)]
    got = list(iter_decoded(iter(jobs), ["input_ids", "cu_seqlens"], ahead=ahead))
    for (o, g), block in zip(jobs, got):
        assert block.group == g
        assert np.array_equal(block.tokens["input_ids"],
                              o.decode(g, ["input_ids"]).tokens["input_ids"])
    assert len(got) == len(jobs)
