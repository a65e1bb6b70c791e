"""A source's urn reaches any epoch directly: the rows of every epoch are those of the urn
built round after round from round 0 (kept here as the slow reference), and an epoch of
10**12 (a resume with a large epoch number, a step-based epoch) orders a few of the urn's
rounds, not the 10**12 before it."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.loader.plan import EpochOrder, EpochPlan, SourceStream, _first_in


class _Replayed(SourceStream):
    """The urn by its definition: the moved rows of round ``p`` known by building every round
    from round 0 on (round ``q + 1`` moves the rows round ``q`` gave to the epoch that crosses
    from ``q`` into ``q + 1``). Cost: ``p`` rounds, so epochs of small sources only."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._replayed = [np.zeros(0, dtype=np.int64)]

    def _moved_rows(self, p: int) -> np.ndarray:
        while len(self._replayed) <= p:
            q = len(self._replayed) - 1
            u = ((q + 1) * self.n) % self.r if self.r else 0
            tail = self._round(q, self.n - u, self.n) if u else np.zeros(0, dtype=np.int64)
            self._replayed.append(tail)
        return self._replayed[p]


# (row groups, share): sources larger than their share, cycled ones, shares one row off a
# multiple, rows = 1 mod (share mod rows) (the urn's moved rows come from many rounds), a
# single row group, shares whose remainder divides the rows.
CASES = [([4, 4, 5], 7), ([4, 4, 5], 12), ([4, 4, 5], 14), ([4, 4, 5], 27), ([4, 4, 5], 33),
         ([1] * 11, 5), ([1] * 11, 16), ([3, 1, 2, 5, 1, 9, 4], 13), ([3, 1, 2, 5, 1, 9, 4], 24),
         ([3, 1, 2, 5, 1, 9, 4], 64), ([40], 13), ([40], 93), ([10, 10, 10, 10, 1], 20),
         ([10, 10, 10, 10, 1], 41), ([7, 7, 7], 15), ([2, 3], 4), ([2, 3], 1), ([6, 6], 4)]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("groups,share", CASES)
def test_every_epoch_equals_the_urn_built_from_round_0(groups, share, shuffle):
    """Epochs 0..50, each from a stream of its own (what EpochOrder builds per epoch) and all
    from one stream: the rows and the rows drawn before each epoch equal the replay's."""
    rg = np.asarray(groups)
    kw = dict(seed=5, salt=3, shuffle=shuffle)
    shared = SourceStream(rg, share, **kw)
    ref = _Replayed(rg, share, **kw)
    for e in range(51):
        want = ref.epoch_rows(e, 0, share)
        fresh = SourceStream(rg, share, **kw)
        assert fresh.epoch_rows(e, 0, share).tolist() == want.tolist(), e
        assert shared.epoch_rows(e, 0, share).tolist() == want.tolist(), e
        assert fresh.drawn_before(e).tolist() == ref.drawn_before(e).tolist(), e


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=6), st.integers(1, 60),
       st.integers(0, 3), st.booleans(), st.lists(st.integers(0, 150), min_size=1, max_size=4))
def test_any_epoch_in_any_order_equals_the_replay(groups, share, seed, shuffle, epochs):
    """Epochs asked for in any order, any slice of them, equal the replay's."""
    rg = np.asarray(groups)
    s = SourceStream(rg, share, seed=seed, salt=None if seed == 0 else 7, shuffle=shuffle)
    ref = _Replayed(rg, share, seed=seed, salt=None if seed == 0 else 7, shuffle=shuffle)
    for e in epochs:
        want = ref.epoch_rows(e, 0, share)
        assert s.epoch_rows(e, 0, share).tolist() == want.tolist()
        a = (e * 7) % (share + 1)
        assert s.epoch_rows(e, a, share).tolist() == want[a:].tolist()


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 200), st.integers(1, 200), st.data())
def test_first_in_is_the_first_multiple_in_the_range(a, m, data):
    """_first_in(a, m, lo, hi): the smallest x >= 0 with lo <= (a x) mod m <= hi, as a scan."""
    lo = data.draw(st.integers(0, m - 1))
    hi = data.draw(st.integers(lo, m - 1))
    want = next((x for x in range(m + 1) if lo <= (a * x) % m <= hi), None)
    assert _first_in(a, m, lo, hi) == want


@pytest.mark.parametrize("groups,share", [([4, 4, 5], 7), ([3, 1, 2, 5, 1, 9, 4], 64),
                                          ([1000] * 50 + [37], 20_011),
                                          ([1000] * 50 + [37], 77_777)])
def test_epoch_10_to_the_12_orders_a_few_urn_rounds(groups, share, monkeypatch):
    """Epoch 10**12 was reached by building every round of the urn before it (about 0.27 ms a
    round: epoch 10**5 of a 13-row source with 53 rows per epoch took 27 s, 10**12 never
    ended). It now orders a few rounds (at most 991 here, a few ms each; counted, not timed,
    so that a loaded machine cannot fail it), and epochs from there on keep the urn's rules:
    no row twice among an epoch's draws, no row a (k + 1)-th time before every row came k
    times, counted from the rows the round had given before the first of them."""
    rg = np.asarray(groups)
    n = int(rg.sum())
    rounds = []  # the urn rounds whose order is drawn (one permutation each)
    key = SourceStream._round_key

    def counted(self, p):
        rounds.append(p)
        if len(rounds) > 2_000:  # the replay of every round before: 10**12 of them
            raise AssertionError(f"{len(rounds)} urn rounds ordered to reach epoch 10**12")
        return key(self, p)

    monkeypatch.setattr(SourceStream, "_round_key", counted)
    s = SourceStream(rg, share, seed=1, salt=4, shuffle=True)
    s.epoch_rows(10**12, 0, share)
    EpochOrder([rg, np.array([5])], [share, 3], seed=1, epoch=10**12, shuffle=True,
               salts=[4, 6]).rows(0, share + 3)
    assert rounds, "the urn's rounds are drawn through _round_key"
    monkeypatch.undo()
    stream = [s.drawn_before(10**12)]
    whole = (share // n) * n
    for e in range(10**12, 10**12 + 6):
        rest = s.epoch_rows(e, whole, share)
        assert np.unique(rest).size == rest.size
        stream.append(rest)
    stream = np.concatenate(stream)  # the urn from the start of epoch 10**12's round
    for a in range(0, stream.size, n):
        chunk = np.sort(stream[a:a + n])
        assert np.unique(chunk).size == chunk.size
        if chunk.size == n:
            assert (chunk == np.arange(n)).all()


@pytest.mark.parametrize("epoch", [0, 1, 7, 50, 10**12, 10**18, 10**30])
def test_an_epoch_past_int64_draws_is_planned(epoch):
    """Epoch 10**18 of a source drawing 53 rows an epoch counted its draws (5.3e19) in int64:
    OverflowError ('Python int too large to convert to C long') from the segments of its
    rows; they are counted from the start of the epoch's round now, the same segments."""
    rg = [np.array([30, 30, 40, 7]), np.array([5, 5])]
    order = EpochOrder(rg, [53, 7], seed=1, epoch=epoch, shuffle=True, salts=[1, 2])
    s = order.streams[0]
    k = np.arange(53)
    base = epoch * s.r
    want = [2 * s.m + (base + x) // s.n - base // s.n for x in k.tolist()]
    assert s.segments(epoch, k).tolist() == want
    plan = EpochPlan(order.num_rows, seed=1, epoch=epoch, shuffle=True, shuffle_buffer=64,
                     drop_last=False, order=order)
    keys = order.rows_at(plan.slot(0, 0, 0, 1, 1))
    assert np.bincount(keys, minlength=117)[:107].sum() == 53
