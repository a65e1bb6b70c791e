"""A batch's structure derived in one pass equals its slow twin and the reader's column rule.

``row_structure`` (a Numba kernel over each row's ``cu_seqlens``) must give exactly what
``reference_row_structure`` (plain loops) and the reader's NumPy path
(``structure_from_cu`` + the labels rule) give: segments, positions, labels of both
conventions, span indices, batch boundaries, the longest span and the effective targets; and it
must name the first row whose ``cu_seqlens`` breaks the contract.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.core.reference import reference_row_structure
from packtool.core.structure import row_structure
from packtool.formats.packed import labels_in, structure_from_cu


@st.composite
def batches(draw):
    C = draw(st.integers(2, 40))
    B = draw(st.integers(1, 5))
    ids, cus, ks = [], [], []
    for _ in range(B):
        cuts = sorted(draw(st.sets(st.integers(1, C - 1), max_size=min(C - 1, 8))))
        cu = [0] + cuts + [C]
        padded = draw(st.booleans())  # the last span is the padding tail
        k = len(cu) - 2 if padded else len(cu) - 1
        ids.append(draw(st.lists(st.integers(0, 2**31 - 1), min_size=C, max_size=C)))
        cus.append(cu)
        ks.append(k)
    return np.asarray(ids, dtype=np.int32), cus, ks


def flat(cus):
    offs = np.zeros(len(cus) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in cus], out=offs[1:])
    return np.asarray([x for c in cus for x in c], dtype=np.int32), offs


@settings(max_examples=200, deadline=None)
@given(batch=batches(), convention=st.sampled_from(["unshifted", "shifted"]),
       dtype=st.sampled_from([np.int32, np.int64]))
def test_row_structure_equals_twin_and_reader(batch, convention, dtype):
    ids, cus, ks = batch
    vals, offs = flat(cus)
    got = row_structure(ids, vals, offs, np.asarray(ks), convention=convention,
                        position_dtype=dtype, labels_dtype=dtype)
    assert got.bad_row == -1
    seg, pos, lab, seq, cu, longest, targets = reference_row_structure(
        ids.tolist(), cus, ks, convention)
    assert got.segment_ids.tolist() == seg and got.segment_ids.dtype == np.int32
    assert got.position_ids.tolist() == pos and got.position_ids.dtype == dtype
    assert got.labels.tolist() == lab and got.labels.dtype == dtype
    assert got.seq_idx.tolist() == seq and got.seq_idx.dtype == np.int32
    assert got.cu_seqlens.tolist() == cu and got.cu_seqlens.dtype == np.int32
    assert (got.max_seqlen, got.num_targets) == (longest, targets)
    # the reader's column rule (one row group) gives the same arrays
    rseg, rpos = structure_from_cu(vals, offs, np.asarray(ks), ids.shape[1])
    assert np.array_equal(rseg, got.segment_ids) and np.array_equal(rpos, got.position_ids)
    rlab = labels_in(convention, input_ids=ids, segment_ids=rseg)
    assert np.array_equal(rlab, got.labels)


@pytest.mark.parametrize("cu, k", [
    ([1, 4], 1),        # does not start at 0
    ([0, 3], 1),        # does not end at C
    ([0, 2, 2, 4], 2),  # an empty span
    ([0, 3, 2, 4], 2),  # decreasing
    ([0, 4], 2),        # fewer entries than documents
    ([0, 1, 2, 4], 1),  # two spans past the documents
    ([0], 0),           # one entry
])
def test_row_structure_names_the_row_that_breaks_the_contract(cu, k):
    ids = np.zeros((3, 4), dtype=np.int32)
    cus, ks = [[0, 4], [0, 2, 4], cu], [1, 2, k]
    vals, offs = flat(cus)
    assert row_structure(ids, vals, offs, np.asarray(ks)).bad_row == 2
    assert reference_row_structure(ids.tolist(), cus, ks) is None


def test_row_structure_refuses_bad_arguments():
    ids = np.zeros((1, 4), dtype=np.int32)
    vals, offs = flat([[0, 4]])
    with pytest.raises(ValueError, match="convention"):
        row_structure(ids, vals, offs, np.asarray([1]), convention="both")
    with pytest.raises(ValueError, match="int32 or int64"):
        row_structure(ids, vals, offs, np.asarray([1]), labels_dtype=np.float32)
    with pytest.raises(ValueError, match="do not fit"):
        row_structure(ids, vals, np.asarray([0, 3]), np.asarray([1]))
