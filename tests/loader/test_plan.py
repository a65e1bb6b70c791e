"""The epoch policy as pure functions: exact mixture shares, cycling and subsets, the smooth
interleave against a brute-force sort, and elastic phases that consume every row of the epoch
once whatever the world sizes and worker counts (NumPy only, no output on disk)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.loader.plan import (EpochOrder, EpochPlan, Phase, SourceStream, apportion,
                                  mix_prefix, rank_rows, worker_bounds)

FAST = settings(max_examples=60, deadline=None)


@FAST
@given(st.lists(st.integers(0, 50), min_size=1, max_size=5).filter(any),
       st.integers(0, 500))
def test_shares_are_exact_and_within_one_row_of_the_weights(weights, total):
    """Largest remainders: the shares sum to the epoch exactly, each is floor or ceil of its
    exact share, and the larger remainders get the extra rows."""
    c = apportion(weights, total)
    exact = [Fraction(w * total, sum(weights)) for w in weights]
    assert int(c.sum()) == total
    for ci, e in zip(c, exact):
        assert int(ci) in (int(e), -(-e.numerator // e.denominator))
    got_extra = [i for i, e in enumerate(exact) if c[i] > int(e)]
    left_out = [i for i, e in enumerate(exact) if c[i] == int(e) and e != int(e)]
    for i in got_extra:
        for j in left_out:
            assert exact[i] - int(exact[i]) >= exact[j] - int(exact[j])


def test_weights_that_do_not_divide_evenly():
    """0.7 / 0.3 of 101 rows: 70.7 and 30.3 -> 71 and 30; three equal weights of 10 -> 4, 3, 3."""
    assert apportion([0.7, 0.3], 101).tolist() == [71, 30]
    assert apportion([1, 1, 1], 10).tolist() == [4, 3, 3]
    for bad in ([-1, 2], [0, 0], [float("nan"), 1], [float("inf"), 1], ["a", 1]):
        with pytest.raises(ValueError):
            apportion(bad, 10)


@pytest.mark.parametrize("scale", [1.0, 1e-6, 1e-13, 1e-300, 1e200])
def test_tiny_and_huge_weights_share_as_their_ratios(scale):
    """Weights under about 1e-12 were rounded to 0 ('at least one weight must be positive');
    any scale now gives the shares of the same ratios."""
    assert apportion([1 * scale, 2 * scale], 9).tolist() == [3, 6]
    assert apportion([0.7 * scale, 0.3 * scale], 101).tolist() == [71, 30]


def _tree_merge(shares, idx=None):
    """The interleave by its definition: the sources with a share, halved (the first half the
    larger) down to single sources, each pair of halves merged by the exact keys
    (2k + 1) / (2c) of their own streams, ties to the first half."""
    if idx is None:
        idx = [s for s, c in enumerate(shares) if c > 0]
    if len(idx) == 1:
        return [idx[0]] * shares[idx[0]]
    mid = (len(idx) + 1) // 2
    left, right = _tree_merge(shares, idx[:mid]), _tree_merge(shares, idx[mid:])
    keyed = [(Fraction(2 * k + 1, 2 * len(left)), 0, s) for k, s in enumerate(left)]
    keyed += [(Fraction(2 * k + 1, 2 * len(right)), 1, s) for k, s in enumerate(right)]
    return [s for _, _, s in sorted(keyed)]


@FAST
@given(st.lists(st.integers(0, 12), min_size=2, max_size=6).filter(lambda c: sum(c) > 0))
def test_interleave_prefixes_equal_a_brute_force_merge(shares):
    """mix_prefix(a) counts each source among the first a items of the tree of merges, and
    EpochOrder's sequence is that merge, computed exactly with fractions; with two sources
    the merge is one sort by ((2k + 1) / (2 c_s), s), the order before the tree."""
    want = _tree_merge(shares)
    for a in range(sum(shares) + 1):
        got = Counter(want[:a])
        assert mix_prefix(shares, a).tolist() == [got[s] for s in range(len(shares))]
    order = EpochOrder([np.array([max(c, 1)]) for c in shares], shares, seed=0, epoch=0,
                       shuffle=False, salts=list(range(len(shares))))
    src = np.searchsorted(order.row_base, order.rows(0, order.num_rows), side="right") - 1
    assert src.tolist() == want
    if sum(1 for c in shares if c) == 2:
        flat = sorted((Fraction(2 * k + 1, 2 * c), s) for s, c in enumerate(shares)
                      for k in range(c))
        assert [s for _, s in flat] == want


@FAST
@given(st.lists(st.integers(1, 40), min_size=2, max_size=4), st.integers(0, 3))
def test_sources_interleave_finely(shares, seed):
    """Every prefix of the epoch holds each source's share of it within (S + 1) / 2 rows: no
    long run of one source."""
    N = sum(shares)
    for a in range(N + 1):
        m = mix_prefix(shares, a)
        for s, c in enumerate(shares):
            assert abs(int(m[s]) - a * c / N) <= (len(shares) + 1) / 2


def _window_deviation(shares):
    """Per source, the largest |rows of it in a run of t consecutive rows - t c_s / N| over
    every run of the epoch (the spread of prefix count - a c_s / N)."""
    order = EpochOrder([np.array([max(c, 1)]) for c in shares], shares, seed=0, epoch=0,
                       shuffle=False, salts=list(range(len(shares))))
    N = order.num_rows
    src = np.searchsorted(order.row_base, order.rows(0, N), side="right") - 1
    out = []
    for s, c in enumerate(shares):
        dev = np.concatenate([[0], np.cumsum(src == s)]) - np.arange(N + 1) * c / N
        out.append(float(dev.max() - dev.min()))
    return out


def test_small_sources_of_equal_shares_do_not_pile_up():
    """Five sources of shares 333, 3, 3, 1, 1 (341 rows): the four small ones' first rows had
    the same key and came in 4 consecutive rows, none of the large source's 3.9 expected
    there, beyond the documented (S + 1) / 2 = 3."""
    shares = [333, 3, 3, 1, 1]
    assert max(_window_deviation(shares)) <= 3
    src = _tree_merge(shares)
    assert all(src[i:i + 3].count(0) for i in range(len(src) - 2))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 4), st.integers(0, 60), st.sampled_from([333, 1000])),
                min_size=2, max_size=9).filter(lambda c: sum(1 for x in c if x) >= 2))
def test_any_run_of_rows_holds_each_source_s_share_within_the_bound(shares):
    """Any run of t consecutive rows of the epoch holds t c_s / N rows of source s give or
    take ceil(log2 S) (S sources with a share), which is at most (S + 1) / 2: each merge of
    two streams adds at most one row."""
    live = sum(1 for c in shares if c)
    bound = int(np.ceil(np.log2(live)))
    assert bound <= (live + 1) / 2
    for s, dev in enumerate(_window_deviation(shares)):
        assert dev <= bound + 1e-9, (shares, s, dev)


def _epoch_rows(rg, shares, epoch, seed=1):
    order = EpochOrder(rg, shares, seed=seed, epoch=epoch, shuffle=True,
                       salts=list(range(len(rg))))
    keys = order.rows(0, order.num_rows)
    src = np.searchsorted(order.row_base, keys, side="right") - 1
    return keys, src, order


def test_each_epoch_has_every_source_s_exact_share():
    """Two sources of 13 and 40 rows at 0.7 / 0.3 of 53: 37 and 16 rows in every epoch."""
    rg = [np.array([4, 4, 5]), np.array([10, 10, 10, 10])]
    shares = apportion([0.7, 0.3], 53)
    assert shares.tolist() == [37, 16]
    for epoch in range(3):
        _, src, _ = _epoch_rows(rg, shares, epoch)
        assert np.bincount(src, minlength=2).tolist() == [37, 16]


@FAST
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 80), st.booleans())
def test_a_cycled_source_repeats_no_row_before_all_were_seen(n_groups, group_rows, share,
                                                            shuffle):
    """A source of n rows with c >= n rows per epoch: in every epoch its first n rows are all
    n rows, and its rows beyond the whole passes (c mod n, drawn across epochs) hold no row
    twice in an epoch and come out balanced: no row is drawn a second time before every row
    was drawn once."""
    rg = [np.full(n_groups, group_rows), np.array([50])]
    n = n_groups * group_rows
    counts = Counter()
    for e in range(5):
        order = EpochOrder(rg, [share, 7], seed=2, epoch=e, shuffle=shuffle, salts=[1, 2])
        keys = order.rows(0, order.num_rows)
        mine = keys[keys < n]
        assert mine.size == share
        whole = (share // n) * n
        if whole:
            assert sorted(mine[:n].tolist()) == list(range(n))
        rest = mine[whole:].tolist()
        assert len(set(rest)) == len(rest)
        for x in rest:
            counts[x] += 1
            assert max(counts.values()) - min(counts[i] for i in range(n)) <= 1


def _balanced(stream, n):
    """The first place in ``stream`` where a row comes a (k + 1)-th time while another of the
    ``n`` rows came fewer than k times, or None."""
    counts = np.zeros(n, dtype=np.int64)
    for t, x in enumerate(stream):
        if counts[x] > counts.min():
            return t, x, counts.tolist()
        counts[x] += 1
    return None


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6), st.integers(1, 40),
       st.integers(1, 30), st.sampled_from([1, 2, 5, 64, 1024]), st.integers(0, 3))
def test_a_source_gives_every_row_once_before_any_again_across_epochs(groups, share, other,
                                                                      shuffle_buffer, seed):
    """One rank, no workers, any shuffle window: over successive epochs a source's rows never
    come a (k + 1)-th time before every row came k times, whether it is larger than its share
    (an epoch running from one round of its urn into the next was shuffled into one: a row of
    the new round came before the old round's last rows) or cycled (an epoch ended with draws
    of the urn and the next began with a whole pass: those rows came again before the others
    caught up)."""
    rg = [np.asarray(groups), np.array([7, 6])]
    n = sum(groups)
    seq = []
    for e in range(6):
        order = EpochOrder(rg, [share, other], seed=seed, epoch=e, shuffle=True, salts=[5, 9])
        plan = EpochPlan(order.num_rows, seed=seed, epoch=e, shuffle=True,
                         shuffle_buffer=shuffle_buffer, drop_last=False, order=order)
        keys = order.rows_at(plan.slot(0, 0, 0, 1, 1))
        mine = keys[keys < n]
        assert mine.size == share
        counts = Counter(mine.tolist())  # each row c // n or c // n + 1 times in the epoch
        assert set(counts.values()) <= {share // n, share // n + 1}
        if share >= n:
            assert len(counts) == n
        seq += mine.tolist()
    assert _balanced(seq, n) is None, _balanced(seq, n)


def test_the_cycled_source_of_five_rows_stays_balanced_across_the_epoch_boundary():
    """A source of 5 rows with 33 per epoch (6 passes and 3 draws of its urn): epoch 0 ended
    with draws of 3 rows, and epoch 1 began with a whole pass that gave those 3 first, an 8th
    time while 2 rows had come 6 times; its passes now give the 2 rows first."""
    rg = [np.array([1, 1, 1, 1, 1]), np.array([50])]
    seq = []
    for e in range(4):
        order = EpochOrder(rg, [33, 40], seed=3, epoch=e, shuffle=True, salts=[1, 2])
        plan = EpochPlan(order.num_rows, seed=3, epoch=e, shuffle=True, shuffle_buffer=1024,
                         drop_last=False, order=order)
        keys = order.rows_at(plan.slot(0, 0, 0, 1, 1))
        seq += keys[keys < 5].tolist()
    assert _balanced(seq, 5) is None, _balanced(seq, 5)


def test_a_large_source_gives_another_subset_each_epoch():
    """A source of 60 rows with 20 per epoch: epochs 0, 1 and 2 see disjoint rows, together all
    60 (its draws go on where the last epoch stopped); with 25 per epoch, no epoch holds a row
    twice although epochs straddle the end of a round."""
    rg = [np.full(6, 10), np.array([5])]
    seen = []
    for e in range(3):
        keys, src, _ = _epoch_rows(rg, [20, 5], e)
        seen.append(set(keys[src == 0].tolist()))
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])
    assert set().union(*seen) == set(range(60))
    for e in range(8):
        keys, src, _ = _epoch_rows(rg, [25, 5], e)
        assert len(set(keys[src == 0].tolist())) == 25


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.integers(1, 30), st.booleans())
def test_the_urn_never_gives_a_row_twice_in_an_epoch(groups, share, shuffle):
    """Whatever the row groups and the share, over 12 epochs: the draws beyond the whole
    passes never repeat a row inside one epoch (also when an epoch runs from one round of the
    urn into the next), every row is drawn once before any is drawn again, and any slice of an
    epoch equals that slice of the whole epoch."""
    s = SourceStream(np.asarray(groups), share, seed=3, salt=7, shuffle=shuffle)
    n = sum(groups)
    counts = Counter()
    for e in range(12):
        rows = s.epoch_rows(e, 0, share)
        rest = rows[(share // n) * n:].tolist()
        assert len(set(rest)) == len(rest), (e, rest)
        for x in rest:
            counts[x] += 1
            assert max(counts.values()) - min(counts[i] for i in range(n)) <= 1
        for a in range(0, share, 4):
            assert s.epoch_rows(e, a, min(share, a + 5)).tolist() == rows[a:a + 5].tolist()


def test_any_range_of_the_epoch_agrees_with_the_whole():
    """A rank computes only its range: rows(a, b) is the whole epoch's [a, b) for every cut."""
    rg = [np.array([3, 4]), np.array([5, 5, 2]), np.array([1])]
    keys, _, order = _epoch_rows(rg, apportion([3, 2, 1], 29), 2)
    for a in range(0, 30, 4):
        for b in range(a, 30, 3):
            assert order.rows(a, b).tolist() == keys[a:b].tolist()


def _consume(plan, W, K, ys):
    """Epoch positions every rank's workers yielded: worker w of each rank its first ys[w]."""
    out = Counter()
    for r in range(W):
        for w in range(K):
            out.update(plan.slot(plan.phase, r, w, W, K)[:ys[w]].tolist())
    return out


def _mixed_order(N: int, epoch: int) -> EpochOrder | None:
    """The order of an N-row epoch of two small sources (one cycled, one larger than its
    share), whose shuffle keeps each source's passes (:meth:`EpochOrder.keep_passes`)."""
    if N == 0:
        return None
    rg = [np.array([3, 2]), np.array([4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
                                      4, 4, 4, 4, 4, 4, 4])]
    return EpochOrder(rg, apportion([1, 2], N), seed=3, epoch=epoch, shuffle=True,
                      salts=[11, 12])


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 80), st.booleans(),
       st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.floats(0, 1)), min_size=1,
                max_size=3),
       st.integers(1, 4), st.integers(1, 3), st.sampled_from([1, 4, 30]), st.booleans())
def test_elastic_phases_consume_every_row_of_the_epoch_once(N, drop_last, stops, W_end, K_end,
                                                             buffer, mixed):
    """Stop at any point at any W x K, resume at any other, any number of times: the rest of
    the epoch after each resize is exactly the positions no rank yielded, each once, plus only
    the even-up repeats of the world size that reads it (drop_last=False; an earlier size's
    repeats its ranks had not reached are not carried on), or minus only its remainder
    (drop_last=True; an earlier size's remainder is carried on). Positions yielded twice
    before a resize (a row and its repeat both) are what the phases record as ``twice``."""
    kw = dict(seed=3, epoch=1, shuffle=True, shuffle_buffer=buffer, drop_last=drop_last,
              order=_mixed_order(N, 1) if mixed else None)
    plan = EpochPlan(N, **kw)
    history, seen = [], Counter()
    for W, K, frac in stops:
        q = rank_rows(plan.length(), W, drop_last)
        ys = [int(frac * (b - a)) for a, b in (worker_bounds(q, w, K) for w in range(K))]
        seen += _consume(plan, W, K, ys)
        closed = plan.close(W, K, ys)
        history.append(Phase(W, K, tuple(ys)))
        plan = EpochPlan(N, history, **kw)
        assert plan.history[-1] == closed
        history = list(plan.history)  # each with its rows yielded twice counted
    L = plan.length()
    q = rank_rows(L, W_end, drop_last)
    unseen = set(range(N)) - set(seen)
    assert sum(seen.values()) - len(seen) == sum(p.twice for p in history)
    assert L == len(unseen)
    rest = _consume(plan, W_end, K_end, [b - a for a, b in
                                         (worker_bounds(q, w, K_end) for w in range(K_end))])
    if drop_last:
        assert max(rest.values(), default=1) == 1 and set(rest) <= unseen
        assert len(unseen - set(rest)) == L - W_end * q == plan.dropped_rows(W_end) < W_end
    else:
        assert set(rest) == unseen
        assert sum(rest.values()) - L == W_end * q - L
        assert plan.repeated_rows(W_end) == sum(p.twice for p in history) + W_end * q - L
        assert sum((seen + rest).values()) - N == plan.repeated_rows(W_end)


def test_a_row_whose_repeat_was_read_before_a_resize_is_not_read_again():
    """5 positions at 4 ranks (2 each, 3 even-up repeats), shuffled, each rank reads 1: one
    rank reads a repeat of a position whose own rank has not read it. The rest leaves that
    position out (it was read), as every other one read, and gives each unread one once; the
    phase counts the position read twice (a position and its repeat both)."""
    kw = dict(seed=3, epoch=1, shuffle=True, shuffle_buffer=30, drop_last=False)
    plan = EpochPlan(5, **kw)
    seen = _consume(plan, 4, 1, [1])
    first = plan.slot(0, 0, 0, 4, 1).tolist()
    assert any(seen[v] and first.index(v) >= 1 for v in (0, 1))  # a repeat read first
    rest = EpochPlan(5, [Phase(4, 1, (1,))], **kw)
    assert rest.history[0].twice == sum(seen.values()) - len(seen)
    assert sorted(rest.seq(1, 0, rest.length()).tolist()) == sorted(set(range(5)) - set(seen))
    assert rest.repeated_rows(1) == rest.history[0].twice


def test_a_phase_saved_before_its_rows_read_twice_were_recorded_reads_as_then():
    """A phase of three entries (rule 1, as states saved it before) carries its unconsumed
    even-up repeats into the rest and leaves its dropped remainder out, as it did, so such a
    state resumes exactly; a phase recording more rows read twice than it repeats is
    refused."""
    kw = dict(seed=3, epoch=1, shuffle=False, shuffle_buffer=1, drop_last=False)
    old = EpochPlan(10, [Phase.from_list([3, 1, [1]])], **kw)  # q = 4, 2 repeats unread
    assert old.history[0].rule == 1 and old.history[0].to_list() == [3, 1, [1]]
    assert old.length() == 9 and old.repeated_rows(1) == 2
    assert old.seq(1, 0, 9).tolist() == [1, 2, 3, 5, 6, 7, 9, 0, 1]
    new = EpochPlan(10, [Phase(3, 1, (1,))], **kw)
    assert new.history[0].to_list() == [3, 1, [1], 0]
    assert new.seq(1, 0, 7).tolist() == [1, 2, 3, 5, 6, 7, 9] and new.repeated_rows(1) == 0
    dropped = dict(kw, drop_last=True)
    assert EpochPlan(10, [Phase.from_list([3, 1, [1]])], **dropped).seq(1, 0, 6).tolist() \
        == [1, 2, 4, 5, 7, 8]
    assert EpochPlan(10, [Phase(3, 1, (1,))], **dropped).seq(1, 0, 7).tolist() \
        == [1, 2, 4, 5, 7, 8, 9]
    with pytest.raises(ValueError, match="does not belong"):
        EpochPlan(10, [Phase(3, 1, (1,), 3)], **kw)
    with pytest.raises(ValueError, match="its slots say 0: the state does not belong"):
        EpochPlan(10, [Phase(3, 1, (1,), 1)], **kw).check()


def test_a_phase_that_yielded_more_than_its_run_is_refused():
    with pytest.raises(ValueError, match="yielded 9 rows of a run of 5"):
        EpochPlan(10, [Phase(2, 1, (9,))], seed=0, epoch=0, shuffle=False, shuffle_buffer=1,
                  drop_last=False)


def test_weights_of_any_real_number_type_share_exactly():
    """A weight can be any real number: a huge int (2**70 crashed in np.isfinite), a
    Fraction or a Decimal (refused as not numbers) share as their exact values; what is not a
    real number is refused in one line naming the weight."""
    from decimal import Decimal

    assert apportion([2**70, 1], 10).tolist() == [10, 0]
    assert apportion([2**70, 2**70], 9).tolist() == [5, 4]
    assert apportion([2**70, 2**69], 3).tolist() == [2, 1]
    assert apportion([Fraction(1, 3), Fraction(2, 3)], 9).tolist() == [3, 6]
    assert apportion([Decimal("0.7"), Decimal("0.3")], 101).tolist() == [71, 30]
    assert apportion([Decimal("1e-40"), Decimal("3e-40")], 8).tolist() == [2, 6]
    assert apportion([np.float32(1), np.int8(3)], 8).tolist() == [2, 6]
    for bad, why in [(Decimal("NaN"), "finite"), (Decimal("-1"), "non-negative"),
                     (Decimal("Infinity"), "finite"), (Fraction(-1, 2), "non-negative"),
                     (1j, "real number"), ("1", "real number"), (None, "real number"),
                     (True, "real number"), (float("nan"), "finite"), (-2**70, "non-negative")]:
        with pytest.raises(ValueError, match=f"^weight of source 'b' is .*{why}") as exc:
            apportion([1, bad], 10, names=["a", "b"])
        assert "\n" not in str(exc.value)
