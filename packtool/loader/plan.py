"""Which rows each rank and DataLoader worker reads in an epoch, and in what order (NumPy only).

Shape legend: G = row groups of one output, S = sources, N = rows of the epoch, W = ranks,
K = DataLoader workers of a rank (0 workers count as 1), P = pieces.

Every step is a pure function of (seed, epoch, sources, weights, ranks, workers, the
DataLoader batch size the workers' runs are cut to, if any) and the row-group sizes, so any
epoch is reproducible and a resumed job recomputes exactly where it stopped without reading a
byte.

1. **Shares.** Source ``s`` (one packed output, ``n_s`` rows) contributes ``c_s`` rows to every
   epoch: its exact share of the epoch's ``N`` rows by weight (:func:`apportion`: largest
   remainders, so the shares always sum to ``N``). Without weights ``c_s = n_s`` and ``N`` is
   every row of every source once.
2. **Source streams** (:class:`SourceStream`). A pass over a source reads its row groups in
   a seeded permutation (``shuffle``; manifest order otherwise), whole groups one after
   another. Epoch ``e`` of a source of ``n_s`` rows is ``c_s // n_s`` whole passes (the first
   ``n_s`` rows are every row once: a small source is cycled), then ``c_s % n_s`` draws from
   an urn of passes that goes on across epochs and never gives a row twice in one epoch: a
   source larger than its share gives a different subset each epoch. Each whole pass gives
   first the rows the urn's current round has not given yet, so that, read *segment* after
   segment (each pass's two parts, then each urn round an epoch draws from), a source's rows
   of successive epochs never give a row a (k + 1)-th time before every row came k times. A
   single output with its own rows per epoch reads pass ``e`` seeded ``(seed, e)``: the
   one-output order.
3. **Interleave.** The epoch sequence merges the sources' epoch slices two at a time, in a
   balanced binary tree over the sources with a share (in the order given: the first half,
   the larger, merged with the second, each half merged the same way down to single sources).
   Each merge is the smooth (Sainte-Lague) order of its two streams: item ``k`` of a stream of
   ``c`` items has the key ``(2k + 1) / (2c)``, items go by key, ties to the first stream.
   One merge of two streams keeps any run of ``t`` consecutive items within one item of each
   stream's share of ``t`` (within half an item for a prefix), and a run of the merged stream
   is a run of each of its two streams, so the errors add up along a source's path to the
   root: any run of ``t`` consecutive rows holds ``t c_s / N`` rows of source ``s``, give or
   take ``ceil(log2 S)`` (S sources with a share: 1 for two sources, 2 for three or four, 3 for
   five to eight; at most ``(S + 1) / 2``). A flat merge of all S sources by the same keys
   (the order before) let the first items of small sources of equal shares tie and come
   together: 4 of 5 sources in 4 consecutive rows, ``S - 1`` in general. :func:`mix_prefix`
   gives the exact per-source counts of any prefix without building the sequence, so a rank
   builds only its own range.
4. **Ranks.** The sequence (length ``L``) is cut into W contiguous ranges of ``q`` rows, so a
   rank reads a contiguous run of each source's row groups, never a stride over all of them.
   When W does not divide L, ``drop_last=False`` makes ``q = ceil(L / W)`` and the last ranks
   wrap to the sequence's first ``W q - L`` rows again (``repeated_rows``, the padding of
   ``torch.utils.data.DistributedSampler``); ``drop_last=True`` makes ``q = floor(L / W)`` and
   leaves out the last ``L - W q`` rows (``dropped_rows``). Every rank yields exactly ``q``
   rows, so collectives stay in step.
5. **Workers and the shuffle buffer.** A rank's range is cut into K contiguous runs of
   ``q // K`` or one more rows (the first ``q % K`` runs get the extra row), one per DataLoader
   worker (a *slot*); with a DataLoader batch size B (``dataloader_batch_size``) the runs are
   of whole B-row batches instead (the rank's ``ceil(q / B)`` batches, the last runs holding
   the extra ones), so only the last run ends on a partial batch, and a DataLoader batching the
   workers' rows in turn yields exactly ``ceil(q / B)`` batches, only its last one short.
   Workers read whole row groups too, and every rank's workers yield the
   same counts. With ``shuffle`` each slot is permuted inside a bounded window: row ``p`` gets
   the key ``p + u * shuffle_buffer``, ``u`` uniform in [0, 1) from
   ``default_rng((seed, epoch, rank, worker, K))``; no row moves ``shuffle_buffer`` positions
   or more. Each source's rows are then put back in segment order within the slot
   (:meth:`EpochOrder.keep_passes`: the source keeps its shuffled places, its segment ``g``
   fills them before segment ``g + 1``), so the shuffle never brings a row a (k + 1)-th time
   before all came k times: not inside a cycled source's epoch, and not where an epoch runs
   from one round of a source's urn into the next (a source larger than its share).

**Elastic resume (phases).** Ranks advance in step (each consumes the same number of batches,
each DataLoader takes batches from its workers in turn), so after a checkpoint worker ``w`` of
*every* rank has yielded the same ``y_w`` rows: the state of any one rank (its workers' counts)
says what every rank consumed. A :class:`Phase` records that (W, K, y). The rest of the epoch is
the next phase's sequence: the rows of this phase's sequence that no rank yielded, each once,
in the order they would have been yielded: the unconsumed remainder of every slot, slot after
slot (rank-major), less the even-up repeats of step 4 (a row a copy of which, the row or its
repeat, was yielded is left out; of a row neither copy of which was, the first copy stays),
then the remainder ``drop_last`` left out (never yielded either). It is cut again into the new
W ranks and K workers by steps 4 and 5 (without a second shuffle), with the even-up repeats or
the dropped remainder of the new world size. So over the epoch every row comes exactly once,
plus only the even-up repeats of the world size that ends the epoch (none at one rank) and the
rows a phase's ranks had already yielded twice, a row and its repeat both, before a resize
(each phase records how many: ``twice``); with ``drop_last``, minus only the remainder of the
world size that ends it. The next epoch starts again at step 1, as if the job had always run
at the new size. Phases chain: a job resized twice in one epoch has two. A phase saved before
``twice`` was recorded (:data:`PHASE_RULE` 1: ``[W, K, y]``) is read by the rule of then: its
unconsumed even-up repeats are carried into the rest and its dropped remainder left out, so
its state resumes as it would have.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from typing import Sequence

import numpy as np

__all__ = ["ORDER_VERSION", "orders_agree", "check_seed", "apportion", "mix_prefix",
           "source_rows", "SourceStream",
           "EpochOrder", "PHASE_RULE", "Phase",
           "EpochPlan", "rank_rows", "worker_bounds", "bounded_shuffle", "RankSplit",
           "split_ranks", "worker_rows"]


#: The version of the epoch order this module computes (what a resume state records). Each
#: version reads another sequence for the same seed for some mixtures (:data:`_ORDER_CHANGES`).
ORDER_VERSION = 3

#: For each order version, (which mixtures it reorders, in words; a test of the mixture's
#: ``(rows, rows per epoch)`` per source that says whether it reorders that one).
_ORDER_CHANGES = {
    2: ("three or more sources with a share are merged in a balanced tree",
        lambda sources: sum(1 for _, c in sources if c > 0) >= 3),
    3: ("a source whose rows per epoch are not a multiple of its rows keeps its urn's rounds "
        "and its passes' rows in order", lambda sources: any(n and c % n for n, c in sources)),
}


def orders_agree(a: int, b: int, sources: Sequence[tuple[int, int]]) -> tuple[bool, str]:
    """Whether order versions ``a`` and ``b`` give the same sequence for a mixture of
    ``sources`` (``(rows, rows per epoch)`` of each), and if not, why (the change between them
    that reorders it, in words; a version this module does not know reorders everything).

    Returns:
        ``(True, "")`` or ``(False, reason)``.
    """
    lo, hi = sorted((int(a), int(b)))
    for v in range(lo + 1, hi + 1):
        what, hits = _ORDER_CHANGES.get(v, (f"order version {v} is not known here",
                                            lambda _: True))
        if hits(sources):
            return False, what
    return True, ""


def check_seed(seed: int, name: str = "seed") -> int:
    """``seed`` (or the epoch: any argument named ``name`` in the message) as a non-negative
    Python int.

    Raises:
        ValueError: negative or not an integer.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {seed!r}")
    return int(seed)


def _fraction(x) -> Fraction:
    """A weight (checked by :func:`_real`: an int, a Fraction or a float) as the fraction it
    was written as: a float 0.7 as 7/10, so shares are those of the decimals, or its exact
    binary value where that rounding would lose it (a weight under about 1e-12, which the
    rounding would make 0); ints and Fractions (Decimals included) as they are."""
    if not isinstance(x, float):
        return Fraction(x)
    f = Fraction(x).limit_denominator(10**12)
    return f if x <= 0 or abs(f - Fraction(x)) <= Fraction(x) / 10**9 else Fraction(x)


def apportion(weights: Sequence[float], total: int,
              names: Sequence[str] | None = None) -> np.ndarray:
    """Integer shares of ``total`` rows proportional to ``weights`` (Hamilton's largest
    remainders): ``floor(total * w / sum(w))`` each, then one more row for the largest
    remainders (ties: lower index first). Exact for any weights: the shares sum to ``total``.

    Args:
        weights: S non-negative finite real numbers (``int`` of any size, ``float``,
            ``fractions.Fraction``, ``decimal.Decimal``, NumPy scalars, any ``numbers.Real``),
            at least one positive.
        total: rows to share (>= 0).
        names: what the messages call each weight (default: its position).

    Returns:
        int64[S].

    Raises:
        ValueError: a weight that is not a real number (a string, None, a bool, a complex),
            negative, infinite or NaN (one line naming it), all zero, or a negative total.
    """
    w = [_fraction(x) for x in _finite(weights, names)]
    if total < 0:
        raise ValueError(f"rows per epoch must be >= 0, got {total}")
    s = sum(w)
    if s <= 0:
        raise ValueError("at least one weight must be positive")
    exact = [x * total / s for x in w]
    base = [int(e) for e in exact]  # floor: every term is >= 0
    left = total - sum(base)
    order = sorted(range(len(w)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return np.asarray(base, dtype=np.int64)


def _finite(weights, names=None) -> list:
    """Each weight as an exact ``int`` or ``Fraction`` (a Decimal, a Rational) or a ``float``
    (a float, a NumPy float, another ``numbers.Real``), checked finite and non-negative."""
    return [_real(x, f"weight {i}" if names is None else f"weight of source {names[i]!r}")
            for i, x in enumerate(weights)]


def _real(x, which: str):
    """``x`` as an int, Fraction or float (see :func:`_finite`).

    Raises:
        ValueError: not a real number, not finite, or negative (one line naming ``which``).
    """
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Real, Decimal)):
        raise ValueError(f"{which} is {x!r}; weights are non-negative real numbers (int, "
                         f"float, Fraction, Decimal), not {type(x).__name__}")
    if isinstance(x, Decimal):
        if not x.is_finite():
            raise ValueError(f"{which} is {x!r}; weights are non-negative finite numbers")
        v = Fraction(x)
    elif isinstance(x, numbers.Integral):
        v = int(x)
    elif isinstance(x, numbers.Rational):
        v = Fraction(int(x.numerator), int(x.denominator))
    else:
        try:
            v = float(x)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{which} is {x!r}; it cannot be read as a number ({exc})") from None
        if not math.isfinite(v):
            raise ValueError(f"{which} is {x!r}; weights are non-negative finite numbers")
    if v < 0:
        raise ValueError(f"{which} is {x!r}; weights are non-negative finite numbers")
    return v


def _position(shares: Sequence[int], s: int, k: int) -> int:
    """Position in the smooth (Sainte-Lague) merge of the streams ``shares`` of item ``k`` of
    stream ``s``: the items of every stream whose key ``(2j + 1) / (2 c_t)`` is smaller, or
    equal with ``t < s`` (exact integers)."""
    d = shares[s]
    pos = 0
    for t, c in enumerate(shares):
        if c == 0:
            continue
        x = (2 * k + 1) * c  # compare (2j + 1) * d with x
        less = ((x - 1) // d + 1) // 2
        equal = 1 if (t < s and x % d == 0 and (x // d) % 2 == 1) else 0
        pos += min(c, less + equal)
    return pos


def _two_prefix(cl: int, cr: int, a: int) -> int:
    """Items of the first stream among the first ``a`` of the smooth merge of two streams of
    ``cl`` and ``cr`` items (ties to the first): one merge of step 3."""
    if a <= 0:
        return 0
    if a >= cl + cr:
        return cl
    lo, hi = 0, cl  # count of j with _position(0, j) < a: positions increase with j
    while lo < hi:
        mid = (lo + hi) // 2
        if _position((cl, cr), 0, mid) < a:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _halves(idx: list) -> tuple[list, list]:
    """The two halves (the first the larger) of the sources ``idx`` a merge of step 3 joins."""
    mid = (len(idx) + 1) // 2
    return idx[:mid], idx[mid:]


def mix_prefix(shares: Sequence[int], a: int) -> np.ndarray:
    """Rows of each source among the first ``a`` rows of the interleave (step 3), exactly.

    Args:
        shares: int[S], rows of each source in the epoch (``c_s``).
        a: 0 .. sum(shares).

    Returns:
        int64[S] summing to ``a``.
    """
    shares = [int(c) for c in shares]
    out = np.zeros(len(shares), dtype=np.int64)

    def walk(idx: list, a: int) -> None:
        if a <= 0:
            return
        if len(idx) == 1:
            out[idx[0]] = a
            return
        left, right = _halves(idx)
        al = _two_prefix(sum(shares[i] for i in left), sum(shares[i] for i in right), a)
        walk(left, al)
        walk(right, a - al)

    walk([s for s, c in enumerate(shares) if c > 0], min(int(a), sum(shares)))
    return out


def _merge_items(shares: list, idx: list, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(source int64[b - a], index in that source's epoch int64[b - a]) of positions
    ``a .. b - 1`` of the merge of the sources ``idx`` (step 3)."""
    if len(idx) == 1:
        return np.full(b - a, idx[0], dtype=np.int64), np.arange(a, b, dtype=np.int64)
    left, right = _halves(idx)
    cl, cr = sum(shares[i] for i in left), sum(shares[i] for i in right)
    la, lb = _two_prefix(cl, cr, a), _two_prefix(cl, cr, b)
    ls, lk = _merge_items(shares, left, la, lb)
    rs, rk = _merge_items(shares, right, a - la, b - lb)
    jl = np.arange(la, lb, dtype=np.int64)
    jr = np.arange(a - la, b - lb, dtype=np.int64)
    key = np.concatenate([(2 * jl + 1) / (2.0 * cl), (2 * jr + 1) / (2.0 * cr)])
    side = np.concatenate([np.zeros(jl.size, dtype=np.int64), np.ones(jr.size, dtype=np.int64)])
    order = _exact_ties(np.lexsort((side, key)), key, side, np.concatenate([jl, jr]), [cl, cr])
    first = side[order] == 0  # the first half's items come in their own order
    src = np.empty(b - a, dtype=np.int64)
    k = np.empty(b - a, dtype=np.int64)
    src[first], k[first] = ls, lk
    src[~first], k[~first] = rs, rk
    return src, k


def _group_order(rg_rows: np.ndarray, key) -> tuple[np.ndarray, np.ndarray]:
    """(row groups int64[G] in the order ``default_rng(key).permutation(G)``, int64[G + 1]
    their first positions in that pass, then its length)."""
    order = np.random.default_rng(key).permutation(len(rg_rows))  # shape: (G,)
    cum = np.zeros(order.size + 1, dtype=np.int64)  # shape: (G + 1,), pass offsets
    np.cumsum(rg_rows[order], out=cum[1:])
    return order, cum


def _pass_rows(rg_rows: np.ndarray, rg_first: np.ndarray, key, shuffle: bool, a: int,
               b: int, perm: tuple | None = None) -> np.ndarray:
    """int64[b - a]: rows at positions ``a .. b - 1`` of one pass over a source: its row groups
    in the order ``default_rng(key).permutation(G)`` (manifest order without ``shuffle``),
    whole groups one after another. ``perm``: that order's :func:`_group_order`, if known."""
    if b <= a:
        return np.zeros(0, dtype=np.int64)
    if not shuffle:
        return np.arange(a, b, dtype=np.int64)
    order, cum = _group_order(rg_rows, key) if perm is None else perm
    j = np.arange(np.searchsorted(cum, a, side="right") - 1, np.searchsorted(cum, b, side="left"))
    lo, hi = np.maximum(a, cum[j]), np.minimum(b, cum[j + 1])
    lens = hi - lo
    starts = rg_first[order[j]] + lo - cum[j]  # first row of each piece
    piece0 = np.zeros(len(lens), dtype=np.int64)
    np.cumsum(lens[:-1], out=piece0[1:])
    return np.repeat(starts - piece0, lens) + np.arange(int(lens.sum()), dtype=np.int64)


def _first_in(a: int, m: int, lo: int, hi: int) -> int | None:
    """The smallest ``x >= 0`` with ``lo <= (a * x) mod m <= hi`` (``0 <= lo <= hi < m``),
    or None where there is none: exact integers, in O(log m) steps of Euclid's algorithm."""
    a %= m
    if lo == 0:
        return 0
    if a == 0:
        return None
    x = -(-lo // a)  # the first multiple of a from lo, before any wrap past m
    if a * x <= hi:
        return x
    # No multiple of a in [lo, hi]: ka < lo <= hi < (k + 1)a. The x sought has a * x - m * y
    # in [lo, hi] for the smallest y such that [lo + m y, hi + m y] holds a multiple of a,
    # that is (m * y) mod a in [(-hi) mod a, (-lo) mod a] (an interval that does not wrap).
    y = _first_in(m, a, (-hi) % a, (-lo) % a)
    if y is None:
        return None
    return -(-(lo + m * y) // a)


class SourceStream:
    """One source's rows in every epoch (step 2 of the module docstring).

    With ``n`` rows and a share of ``c`` rows per epoch, epoch ``e`` is ``m = c // n`` whole
    passes (each a new permutation of the row groups), then ``r = c % n`` draws from the
    source's *urn*: an endless sequence of rounds, each a permutation of every row, that goes
    on from epoch to epoch (epoch ``e`` draws ``e * r .. (e + 1) * r - 1``). A round is its
    seeded permutation, except that the rows the previous round gave to an epoch that runs on
    into this round are moved to this round's end, so that epoch gets no row twice.

    The urn's current round has given some rows before epoch ``e`` (``D``: its first
    ``(e * r) mod n`` draws), so those rows have come once more than the others: every whole
    pass of epoch ``e`` gives the other rows first, then ``D`` (each part in the pass's own
    order), and the epoch's urn draws go on with the round's rows not yet given. Cut into
    *segments* (:meth:`segments`: each pass's two parts, then each urn round the epoch draws
    from), a source's rows of successive epochs, segment after segment, never give a row a
    (k + 1)-th time before every row came k times; an epoch never holds a row of the urn twice,
    consecutive epochs of a large source (c < n) take consecutive, different subsets, and a
    cycled source's first n rows of an epoch are all of its rows.

    Any epoch is reached directly, not by building the urn's rounds before it
    (:meth:`_moved_rows`): epoch 10**12 costs about what an early epoch does.

    Pass seeds: whole pass ``e * m + i`` of a single source uses ``(seed, e * m + i)`` (the
    one-output order), of a mixture ``(seed, e * m + i, salt)``; urn round ``p`` uses
    ``(seed, p, salt or 0, 1)``.

    Args:
        rg_rows: int64[G], rows of each row group (manifest order).
        share: c, rows per epoch.
        seed: the dataset's seed; salt: the source's salt, None for a single source.
        shuffle: permute row groups; False reads passes in manifest order.

    Raises:
        ValueError: a positive share of a source without rows.
    """

    def __init__(self, rg_rows, share: int, *, seed: int, salt: int | None,
                 shuffle: bool) -> None:
        self.rg_rows = np.asarray(rg_rows, dtype=np.int64)
        self.rg_first = np.zeros(len(self.rg_rows) + 1, dtype=np.int64)  # shape: (G + 1,)
        np.cumsum(self.rg_rows, out=self.rg_first[1:])
        self.n = int(self.rg_first[-1])
        self.c = int(share)
        if self.c and not self.n:
            raise ValueError(f"a source without rows cannot give {self.c} rows per epoch")
        self.m, self.r = divmod(self.c, self.n) if self.n else (0, 0)
        self.seed, self.salt, self.shuffle = seed, salt, shuffle
        self._moved: dict = {0: np.zeros(0, dtype=np.int64)}  # urn round -> rows moved to its end
        self._drawn_in: dict = {}  # epoch -> the urn's rows given before it in its round
        self._skips: dict = {}  # whole pass -> sorted positions of those rows in it

    def _full_key(self, p: int) -> tuple:
        return (self.seed, p) if self.salt is None else (self.seed, p, self.salt)

    def _round_key(self, p: int) -> tuple:
        return (self.seed, p, self.salt or 0, 1)

    def _full(self, p: int, a: int, b: int) -> np.ndarray:
        """Positions ``a .. b - 1`` of whole pass ``p``'s permutation."""
        return _pass_rows(self.rg_rows, self.rg_first, self._full_key(p), self.shuffle, a, b)

    def _perm(self, key) -> tuple[np.ndarray, np.ndarray]:
        """:func:`_group_order` of this source's row groups."""
        return _group_order(self.rg_rows, key)

    def _positions(self, key, rows: np.ndarray) -> np.ndarray:
        """Sorted positions of ``rows`` in the permutation ``key``."""
        if not self.shuffle:
            return np.sort(rows)
        order, cum = self._perm(key)
        inv = np.empty_like(order)
        inv[order] = np.arange(order.size)
        g = np.searchsorted(self.rg_first, rows, side="right") - 1
        return np.sort(cum[inv[g]] + rows - self.rg_first[g])

    def _at(self, key, positions: np.ndarray) -> np.ndarray:
        """Rows at ``positions`` of the permutation ``key``."""
        if not self.shuffle or not positions.size:
            return np.asarray(positions, dtype=np.int64)
        order, cum = self._perm(key)
        j = np.searchsorted(cum, positions, side="right") - 1
        return self.rg_first[order[j]] + positions - cum[j]

    def _without(self, key, skip: np.ndarray, i: int, j: int) -> np.ndarray:
        """Entries ``i .. j - 1`` of the permutation ``key`` once the entries at the sorted
        positions ``skip`` are taken out."""
        if j <= i:
            return np.zeros(0, dtype=np.int64)
        if not skip.size:
            return _pass_rows(self.rg_rows, self.rg_first, key, self.shuffle, i, j)

        def at(k):  # position in the permutation of the k-th entry not skipped
            return k + int(np.searchsorted(skip - np.arange(skip.size), k, side="right"))

        x0, x1 = at(i), at(j - 1) + 1
        rows = _pass_rows(self.rg_rows, self.rg_first, key, self.shuffle, x0, x1)
        keep = ~np.isin(np.arange(x0, x1), skip)
        return rows[keep]

    def _round(self, p: int, i: int, j: int) -> np.ndarray:
        """Draws ``i .. j - 1`` of urn round ``p``: its permutation without the moved rows,
        then the moved rows."""
        moved = self._moved_rows(p)
        L = self.n - moved.size
        key = self._round_key(p)
        parts = []
        if i < L:
            skip = self._positions(key, moved) if moved.size else moved
            parts.append(self._without(key, skip, i, min(j, L)))
        if j > L:
            parts.append(moved[max(i, L) - L:j - L])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _moved_rows(self, p: int) -> np.ndarray:
        """int64[(p * n) mod r]: the rows urn round ``p`` moves to its end, those round
        ``p - 1`` gave to the epoch that crosses from it into ``p``: its last ``u_{p-1}``
        draws, where ``u_{q-1} = (q * n) mod r`` (round ``q`` moves ``u_{q-1}`` rows).

        Found without building the rounds before: the last ``l`` draws of round ``q`` are the
        last ``l`` of round ``q - 1`` where ``l <= u_{q-1}`` (they are all moved rows), and
        otherwise the last ``l - u_{q-1}`` rows of round ``q``'s permutation that it does not
        move, then its moved rows (the last ``u_{q-1}`` of round ``q - 1``). Walking back from
        ``p - 1``, the rounds passed over are skipped at once (:func:`_first_in`: the latest
        ``q`` with ``(q * n) mod r < l``), and the walk ends at a round that moves no rows
        (round 0 at the latest, or any multiple of ``r / gcd(n, r)``). So reaching round ``p``
        costs one permutation per round the moved rows come from, whatever ``p``: never the
        ``p`` rounds before it. Those rounds are at most ``min(r, r / gcd(n, r))``, about 14
        for random sizes (44 at the 90th percentile); where ``n mod r`` is 1, every round since
        the last multiple of ``r`` (each moves one row more than the round before). With round
        ``p - 1``'s moved rows known, it is one step from them."""
        got = self._moved.get(p)
        if got is not None:
            return got
        n, r = self.n, self.r
        if not r or not (p * n) % r:
            got = np.zeros(0, dtype=np.int64)
        elif p - 1 in self._moved:
            u = (p * n) % r
            got = self._round(p - 1, n - u, n)
        else:
            pieces, q, need = [], p - 1, (p * n) % r  # last `need` draws of round q
            while need:
                u = (q * n) % r  # rows round q moves
                if u >= need:  # the draws are moved rows: those of an earlier round
                    q -= _first_in((r - n % r) % r, r, r - u, r - u + need - 1)
                    u = (q * n) % r
                pieces.append((q, need - u))
                q, need = q - 1, u
            parts, taken = [], set()  # round q's moved rows (parts reversed), from the first q
            for q, k in reversed(pieces):
                parts.append(self._last_kept(q, taken, k))
                taken.update(parts[-1].tolist())
            got = np.concatenate(parts[::-1])
        self._moved[p] = got
        return got

    def _last_kept(self, q: int, moved: set, k: int) -> np.ndarray:
        """int64[k]: the last ``k`` rows of urn round ``q``'s permutation that are not among
        its ``moved`` rows, in the permutation's order."""
        key, n = self._round_key(q), self.n
        perm = self._perm(key) if self.shuffle else None
        w = k + (k * len(moved)) // max(1, n - len(moved)) + 32  # positions read from the end
        while True:
            lo = max(0, n - w)
            rows = _pass_rows(self.rg_rows, self.rg_first, key, self.shuffle, lo, n, perm)
            if moved:
                rows = rows[np.fromiter((x not in moved for x in rows.tolist()), dtype=bool,
                                        count=rows.size)]
            if rows.size >= k or lo == 0:
                return rows[rows.size - k:]
            w *= 2

    def _urn(self, d0: int, d1: int) -> np.ndarray:
        """Urn draws ``d0 .. d1 - 1``."""
        parts = []
        while d0 < d1:
            p, i = divmod(d0, self.n)
            hi = min(d1, (p + 1) * self.n)
            parts.append(self._round(p, i, hi - p * self.n))
            d0 = hi
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def drawn_before(self, epoch: int) -> np.ndarray:
        """int64[(epoch * r) mod n]: the rows the urn's current round gave before ``epoch``
        (each has come once more than the others)."""
        if epoch not in self._drawn_in:
            d = epoch * self.r
            self._drawn_in[epoch] = self._urn(d - d % self.n, d) if self.r else \
                np.zeros(0, dtype=np.int64)
        return self._drawn_in[epoch]

    def _pass(self, epoch: int, i: int, a: int, b: int) -> np.ndarray:
        """Positions ``a .. b - 1`` of whole pass ``i`` of ``epoch``: its permutation's rows
        not in :meth:`drawn_before`, then those (each part in the permutation's order)."""
        p = epoch * self.m + i
        drawn = self.drawn_before(epoch)
        if not drawn.size:
            return self._full(p, a, b)
        key = self._full_key(p)
        if p not in self._skips:
            self._skips[p] = self._positions(key, drawn)
        skip = self._skips[p]
        L = self.n - skip.size
        parts = [self._without(key, skip, a, min(b, L))]
        if b > L:
            parts.append(self._at(key, skip[max(a, L) - L:b - L]))
        return np.concatenate(parts)

    def epoch_rows(self, epoch: int, k0: int, k1: int) -> np.ndarray:
        """int64[k1 - k0]: the rows at positions ``k0 .. k1 - 1`` of the source's epoch
        ``epoch`` (0 <= k0 <= k1 <= c)."""
        parts = []
        full = self.m * self.n
        for i in range(k0 // self.n if self.n else 0, self.m):
            a, b = max(k0, i * self.n), min(k1, (i + 1) * self.n)
            if a >= b:
                break
            parts.append(self._pass(epoch, i, a - i * self.n, b - i * self.n))
        if k1 > full:
            base = epoch * self.r
            parts.append(self._urn(base + max(k0, full) - full, base + k1 - full))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def segmented(self, epoch: int) -> bool:
        """True when ``epoch`` holds more than one segment of this source (:meth:`segments`)."""
        if not self.n or not self.c:
            return False
        base = epoch * self.r
        return self.m > 1 or (self.m == 1 and self.r > 0) or (
            self.r > 0 and base // self.n != (base + self.r - 1) // self.n)

    def segments(self, epoch: int, k: np.ndarray) -> np.ndarray:
        """int64[n]: the segment of items ``k`` of ``epoch`` (non-decreasing in ``k``): whole
        pass ``i`` is segments ``2i`` (the rows not drawn before, see :meth:`_pass`) and
        ``2i + 1`` (the others), the urn draws ``2m`` plus the rounds since the epoch's first
        draw. Read segment after segment, a source's rows over successive epochs never give a
        row a (k + 1)-th time before every row came k times."""
        k = np.asarray(k, dtype=np.int64)
        full = self.m * self.n
        d = (epoch * self.r) % self.n if self.n else 0  # rows of D
        seg = np.empty(k.size, dtype=np.int64)
        whole = k < full
        i = k[whole] // self.n
        seg[whole] = 2 * i + (k[whole] - i * self.n >= self.n - d)
        seg[~whole] = 2 * self.m + (d + k[~whole] - full) // self.n  # rounds since the first
        return seg


def source_rows(rg_rows: np.ndarray, first: int, count: int, *, seed: int, salt: int | None,
                shuffle: bool) -> np.ndarray:
    """Rows at positions ``first .. first + count - 1`` of one source read in whole passes,
    pass ``p`` seeded as :class:`SourceStream`'s whole passes (the epoch-``p`` order of a
    single output).

    Returns:
        int64[count], row numbers of the source (0 .. n - 1).
    """
    rg_rows = np.asarray(rg_rows, dtype=np.int64)
    n = int(rg_rows.sum())
    if count <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    stream = SourceStream(rg_rows, n, seed=seed, salt=salt, shuffle=shuffle)
    parts, pos, end = [], int(first), int(first) + int(count)
    while pos < end:
        p, lo = divmod(pos, n)
        hi = min(n, lo + end - pos)
        parts.append(stream._full(p, lo, hi))
        pos += hi - lo
    return np.concatenate(parts)


class EpochOrder:
    """The sequence of one epoch (steps 1-3): position ``0 .. N - 1`` -> row key.

    A row key is ``row_base[s] + row``: source ``s``'s row ``row``.

    Args:
        rg_rows: per source, int64[G_s] rows of each row group.
        shares: int[S], rows of each source in an epoch (``c_s``).
        seed, epoch: the order depends on both.
        shuffle: permute row groups in each pass (step 2).
        salts: per source, an int mixed into its pass seeds; None for a single source (the
            one-output order).
    """

    def __init__(self, rg_rows: Sequence[np.ndarray], shares: Sequence[int], *, seed: int,
                 epoch: int, shuffle: bool, salts: Sequence[int] | None) -> None:
        self.rg_rows = [np.asarray(r, dtype=np.int64) for r in rg_rows]
        self.shares = [int(c) for c in shares]
        self.seed, self.epoch = check_seed(seed), check_seed(epoch, "epoch")
        self.shuffle = bool(shuffle)
        self.salts = None if salts is None else [int(x) for x in salts]
        sizes = [int(r.sum()) for r in self.rg_rows]
        for s, (n, c) in enumerate(zip(sizes, self.shares)):
            if c > 0 and n == 0:
                raise ValueError(f"source {s} has no rows but a share of {c} rows per epoch")
        self.row_base = np.zeros(len(sizes) + 1, dtype=np.int64)  # shape: (S + 1,)
        np.cumsum(sizes, out=self.row_base[1:])
        self.num_rows = sum(self.shares)
        self.streams = [SourceStream(r, c, seed=self.seed, shuffle=self.shuffle,
                                     salt=None if self.salts is None else self.salts[s])
                        for s, (r, c) in enumerate(zip(self.rg_rows, self.shares))]

    def _stream(self, s: int, k0: int, k1: int) -> np.ndarray:
        return self.row_base[s] + self.streams[s].epoch_rows(self.epoch, k0, k1)

    def _items(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(source int64[b - a], index in that source's epoch int64[b - a]) of epoch positions
        ``a .. b - 1`` (step 3); each source's indices come in increasing order."""
        live = [s for s, c in enumerate(self.shares) if c > 0]
        return _merge_items(self.shares, live, a, b)

    def rows(self, a: int, b: int) -> np.ndarray:
        """int64[b - a], row keys at epoch positions ``a .. b - 1`` (0 <= a <= b <= N)."""
        if not 0 <= a <= b <= self.num_rows:
            raise ValueError(f"epoch positions {a}..{b} outside 0..{self.num_rows}")
        out = np.zeros(b - a, dtype=np.int64)
        if b == a:
            return out
        src, k = self._items(a, b)
        for s in np.unique(src).tolist():
            sel = src == s
            ks = k[sel]
            out[sel] = self._stream(s, int(ks[0]), int(ks[-1]) + 1)
        return out

    def keep_passes(self, positions: np.ndarray, repeat: np.ndarray | None = None) -> np.ndarray:
        """int64[n], ``positions`` (a worker's slot after the bounded shuffle) with each
        source's rows put back in segment order (:meth:`SourceStream.segments`: a cycled
        source's whole passes, each cut in two, then the urn's rounds, those of a source larger
        than its share included): source ``s`` keeps the places it had, and its rows of
        segment ``g`` all come before those of segment ``g + 1``, each segment in its shuffled
        order. So no row of a source comes a (k + 1)-th time before all its rows came k times,
        in the epoch and across successive epochs. ``repeat`` (bool[n]) marks the even-up
        repeats (step 4), kept after every segment."""
        pos = np.asarray(positions, dtype=np.int64)
        cut = [s for s, stream in enumerate(self.streams) if stream.segmented(self.epoch)]
        if not cut or pos.size < 2:
            return pos
        src = np.empty(pos.size, dtype=np.int64)
        k = np.empty(pos.size, dtype=np.int64)
        uniq = np.unique(pos)
        for run in np.split(uniq, np.flatnonzero(np.diff(uniq) > 4096) + 1):
            a, b = int(run[0]), int(run[-1]) + 1
            rs, rk = self._items(a, b)
            sel = (pos >= a) & (pos < b)
            src[sel], k[sel] = rs[pos[sel] - a], rk[pos[sel] - a]
        rep = None if repeat is None else np.asarray(repeat, dtype=bool)
        out = pos.copy()
        for s in cut:
            at = np.flatnonzero(src == s)
            seg = self.streams[s].segments(self.epoch, k[at])
            if rep is not None:
                seg[rep[at]] = np.iinfo(np.int64).max
            out[at] = pos[at][np.argsort(seg, kind="stable")]
        return out

    def rows_at(self, positions: np.ndarray) -> np.ndarray:
        """int64[n], row keys at arbitrary epoch positions (computed over their runs)."""
        pos = np.asarray(positions, dtype=np.int64)
        out = np.empty(pos.size, dtype=np.int64)
        if not pos.size:
            return out
        uniq = np.unique(pos)
        cut = np.flatnonzero(np.diff(uniq) > 4096) + 1  # runs worth computing as one range
        for run in np.split(uniq, cut):
            a, b = int(run[0]), int(run[-1]) + 1
            block = self.rows(a, b)
            sel = (pos >= a) & (pos < b)
            out[sel] = block[pos[sel] - a]
        return out


def _exact_ties(order: np.ndarray, key: np.ndarray, src: np.ndarray, k: np.ndarray,
                shares: list) -> np.ndarray:
    """``order`` (by float key, then stream ``src``: item ``k`` of stream ``s`` of
    ``shares[s]`` items has the key ``(2k + 1) / (2 shares[s])``) corrected where distinct keys
    rounded to one float (only possible when c_s * c_t > 2**52): such runs are re-sorted by
    exact fractions."""
    ks = key[order]
    same = np.flatnonzero(ks[1:] == ks[:-1])
    if not same.size:
        return order
    a, b = order[same], order[same + 1]
    exact_equal = ((2 * k[a] + 1) * np.asarray(shares)[src[b]]
                   == (2 * k[b] + 1) * np.asarray(shares)[src[a]])
    if exact_equal.all():
        return order
    order = order.copy()
    i = 0
    while i < len(ks):
        j = i
        while j + 1 < len(ks) and ks[j + 1] == ks[i]:
            j += 1
        if j > i:
            run = order[i:j + 1]
            order[i:j + 1] = sorted(run.tolist(), key=lambda t: (
                Fraction(2 * int(k[t]) + 1, 2 * shares[int(src[t])]), int(src[t])))
        i = j + 1
    return order


#: How the rest of an epoch follows a finished phase (what a state's phases are read by):
#: 1, the rule before it was recorded (a phase saved as ``[W, K, y]``): the rest is the
#: unconsumed remainder of every slot, that phase's unconsumed even-up repeats included, its
#: dropped remainder left out; 2 (``[W, K, y, twice]``): the rows no rank yielded, each once,
#: the dropped remainder included (module docstring, *Elastic resume*).
PHASE_RULE = 2


@dataclass(frozen=True)
class Phase:
    """One finished stretch of an epoch at one world size (see the module docstring).

    Attributes:
        world_size: W, ranks.
        num_workers: K, DataLoader workers per rank (0 workers count as 1).
        yielded: K ints, rows worker ``w`` of every rank had yielded at the checkpoint.
        twice: rows of the phase's sequence its ranks yielded twice (a row and its even-up
            repeat both, ``drop_last=False``); None: not known yet (:class:`EpochPlan`
            counts it from the phase's slots). Rule 1 phases do not record it.
        rule: :data:`PHASE_RULE` of the packtool that recorded the phase (1: a state saved
            before the rule was recorded, read as it was then, so it resumes exactly).
        batch: the DataLoader batch size its workers' runs were cut to (``dataloader_batch_size``
            of :class:`~packtool.loader.distributed.PackedIterableDataset`, step 5), or None.

    Raises:
        ValueError: world_size or num_workers < 1, not one count per worker, a negative count
            or ``twice``, a batch < 1 or under rule 1, or an unknown rule.
    """

    world_size: int
    num_workers: int
    yielded: tuple
    twice: int | None = None
    rule: int = PHASE_RULE
    batch: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.num_workers < 1 or len(self.yielded) != self.num_workers:
            raise ValueError(f"bad phase: {self.world_size} ranks, {self.num_workers} workers, "
                             f"yielded {list(self.yielded)}")
        if any(int(y) < 0 for y in self.yielded):
            raise ValueError(f"bad phase: negative rows yielded {list(self.yielded)}")
        if self.rule not in (1, PHASE_RULE):
            raise ValueError(f"bad phase: rule {self.rule!r}, this packtool reads rules 1 to "
                             f"{PHASE_RULE}: finish the epoch with the packtool that saved it")
        if self.twice is not None and (self.rule == 1 or int(self.twice) < 0):
            raise ValueError(f"bad phase: {self.twice!r} rows yielded twice under rule "
                             f"{self.rule}")
        if self.batch is not None and (self.rule == 1 or isinstance(self.batch, bool)
                                       or not isinstance(self.batch, (int, np.integer))
                                       or self.batch < 1):
            raise ValueError(f"bad phase: batch {self.batch!r} under rule {self.rule}")

    def to_list(self) -> list:
        """``[W, K, [y...]]`` (rule 1), ``[W, K, [y...], twice]`` (rule 2) or
        ``[W, K, [y...], twice, batch]`` (rule 2, runs of whole batches), as states record it.

        Raises:
            ValueError: a rule 2 phase whose ``twice`` is not known (not closed by a plan).
        """
        out = [self.world_size, self.num_workers, [int(y) for y in self.yielded]]
        if self.rule == 1:
            return out
        if self.twice is None:
            raise ValueError("a phase records the rows it yielded twice: close it with "
                             "EpochPlan.close(...) before saving it")
        out.append(int(self.twice))
        return out if self.batch is None else out + [int(self.batch)]

    @classmethod
    def from_list(cls, x) -> "Phase":
        """The phase a state records (:meth:`to_list`; three entries: rule 1)."""
        if len(x) == 3:
            return cls(int(x[0]), int(x[1]), tuple(int(y) for y in x[2]), rule=1)
        return cls(int(x[0]), int(x[1]), tuple(int(y) for y in x[2]), int(x[3]),
                   batch=int(x[4]) if len(x) > 4 else None)


@dataclass(frozen=True)
class _Rest:
    """How phase ``k + 1``'s sequence is read from phase ``k``'s slots (:meth:`EpochPlan._rest`).

    Attributes:
        offsets: int64[W K + 1], where each slot's part (rank-major) starts in the sequence.
        skip: (rank, worker) -> int64[...] sorted yield indices of that slot left out.
        tail: (a, b): phase ``k``'s indices ``a .. b - 1`` after the slots' parts (the
            remainder ``drop_last`` left out), or None.
        twice: rows of phase ``k`` its ranks yielded twice.
    """

    offsets: np.ndarray
    skip: dict
    tail: tuple | None
    twice: int


def rank_rows(length: int, world_size: int, drop_last: bool) -> int:
    """q: rows every rank yields from a sequence of ``length`` rows (step 4)."""
    if drop_last or length == 0:
        return length // world_size
    return -(-length // world_size)


def worker_bounds(q: int, worker: int, num_workers: int,
                  batch: int | None = None) -> tuple[int, int]:
    """[a, b): worker ``worker``'s run of a rank's ``q`` rows (step 5).

    Args:
        batch: None: runs of ``q // num_workers`` or one more rows (the first ``q %
            num_workers`` runs the longer); B (the DataLoader's batch size): runs of whole
            B-row batches, ``nb // num_workers`` or one more of the rank's ``nb = ceil(q / B)``
            batches, the *last* ``nb % num_workers`` runs the longer: only the last run ends on
            a partial batch, and as a DataLoader takes one batch from each worker in turn it
            is the last batch it yields, as without workers.
    """
    if batch is not None:
        nb = -(-q // batch)
        base, extra = divmod(nb, num_workers)
        first = num_workers - extra  # the runs from this one on hold one batch more
        a = worker * base + max(0, worker - first)
        b = a + base + (worker >= first)
        return min(a * batch, q), min(b * batch, q)
    base, extra = divmod(q, num_workers)
    a = worker * base + min(worker, extra)
    return a, a + base + (worker < extra)


def bounded_shuffle(n: int, *, seed: int, epoch: int, rank: int, worker: int, num_workers: int,
                    shuffle_buffer: int) -> np.ndarray:
    """int64[n], a permutation of 0..n-1 in which no entry moves ``shuffle_buffer`` places or
    more (step 5)."""
    if shuffle_buffer <= 1 or n <= 1:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng((check_seed(seed), check_seed(epoch, "epoch"), rank, worker,
                                 num_workers))
    keys = np.arange(n, dtype=np.float64) + rng.random(n) * shuffle_buffer  # shape: (n,)
    return np.argsort(keys, kind="stable")


class EpochPlan:
    """Epoch positions each rank and worker yields, through the phases of one epoch.

    Phase 0's sequence is epoch positions ``0 .. N - 1`` in order; phase ``k + 1``'s is what
    phase ``k`` left: its rows no rank yielded, each once, slot after slot, then the remainder
    ``drop_last`` left out (module docstring, *Elastic resume*). Positions map to rows through
    :class:`EpochOrder`.

    Args:
        num_rows: N, rows of the epoch.
        history: the finished phases of this epoch, oldest first; a phase whose ``twice`` is
            None is counted from its slots (:attr:`history` holds it counted).
        seed, epoch: as for :class:`EpochOrder` (seed the shuffle buffer).
        shuffle, shuffle_buffer: the bounded shuffle of phase 0 (step 5).
        drop_last: drop the remainder of each phase instead of repeating rows.
        order: the epoch's :class:`EpochOrder`; given, the bounded shuffle keeps each cycled
            source's passes in order (:meth:`EpochOrder.keep_passes`).
        batch: the current phase's workers' runs are whole batches of ``batch`` rows
            (:func:`worker_bounds`); None: rows. Each finished phase keeps its own
            (:attr:`Phase.batch`).

    Attributes:
        history: the finished phases, each with ``twice`` known.
        lengths: L_k of every phase, the current one last.

    Raises:
        ValueError: a phase says a worker yielded more rows than its run holds, or more rows
            yielded twice than the phase repeats (a phase's recorded ``twice`` is compared with
            its slots when its rest is first read, and by :meth:`check`).
    """

    def __init__(self, num_rows: int, history: Sequence[Phase] = (), *, seed: int, epoch: int,
                 shuffle: bool, shuffle_buffer: int, drop_last: bool,
                 order: "EpochOrder | None" = None, batch: int | None = None) -> None:
        self.num_rows = int(num_rows)
        self.batch = None if batch is None else int(batch)
        self.order = order
        self.seed, self.epoch = check_seed(seed), check_seed(epoch, "epoch")
        self.shuffle, self.shuffle_buffer = bool(shuffle), int(shuffle_buffer)
        self.drop_last = bool(drop_last)
        self.lengths = [self.num_rows]  # L_k of every phase, the current one last
        self.history: tuple = ()
        self._rests: dict = {}  # k -> _Rest of finished phase k
        for k, ph in enumerate(history):
            if ph.twice is None and ph.rule != 1:
                ph = replace(ph, twice=self._count(k, ph).twice)
            self.lengths.append(self._next_length(k, ph))
            self.history += (ph,)

    def _runs(self, k: int, ph: Phase) -> list[tuple[int, int]]:
        """[a, b) of each worker's run in phase ``k`` at ``ph``'s shape, ``ph``'s counts
        checked against them."""
        q = rank_rows(self.lengths[k], ph.world_size, self.drop_last)
        runs = [worker_bounds(q, w, ph.num_workers, ph.batch) for w in range(ph.num_workers)]
        over = [w for w, (a, b) in enumerate(runs) if ph.yielded[w] > b - a]
        if over:
            w = over[0]
            raise ValueError(f"phase {k}: worker {w} yielded {ph.yielded[w]} rows of a run "
                             f"of {runs[w][1] - runs[w][0]}: the state does not belong to "
                             "this dataset")
        return runs

    def _next_length(self, k: int, ph: Phase) -> int:
        """L_{k + 1} after phase ``k`` closed as ``ph`` (its ``twice`` known)."""
        L, W = self.lengths[k], ph.world_size
        runs = self._runs(k, ph)
        if ph.rule == 1:  # every slot's unconsumed remainder, repeats in, remainder out
            return W * sum(b - a - y for (a, b), y in zip(runs, ph.yielded))
        q = rank_rows(L, W, self.drop_last)
        extra, twice = W * q - L, ph.twice
        nxt = L - W * sum(ph.yielded) + twice  # the rows no rank yielded
        if twice > max(0, extra) or nxt < 0:
            raise ValueError(f"phase {k}: {twice} rows yielded twice where its ranks yielded "
                             f"{W * sum(ph.yielded)} of {L} rows and {max(0, extra)} even-up "
                             "repeats: the state does not belong to this dataset")
        return nxt

    def _count(self, k: int, ph: Phase) -> _Rest:
        """How phase ``k`` closed as ``ph`` leaves the rest of the epoch (:class:`_Rest`).

        Rule 2: the wrapped indices ``L .. W q - 1`` (the even-up repeats, step 4) repeat the
        sequence's first rows; for each such row the copies are found in their slots (after
        phase 0's shuffle, by position: a slot holds a position once). A row one of whose
        copies was yielded is left out of the rest (each copy yielded beyond the first counts
        in ``twice``); of a row no copy of which was yielded, the first copy stays. The
        remainder ``drop_last`` left out follows the slots.
        """
        L, W, K, y = self.lengths[k], ph.world_size, ph.num_workers, ph.yielded
        runs = self._runs(k, ph)
        q = rank_rows(L, W, self.drop_last)
        counts = np.tile(np.asarray([b - a - v for (a, b), v in zip(runs, y)],
                                    dtype=np.int64), W)  # shape: (W K,)
        skip: dict = {}
        twice, tail = 0, None
        if ph.rule != 1:
            if W * q < L:
                tail = (W * q, L)
            permuted = k == 0 and self.shuffle
            slots: dict = {}

            def place(i: int) -> tuple[int, int, int]:
                """(rank, worker, yield index) of index ``i`` of the phase's ranks."""
                r, o = divmod(i, q)
                w = next(w for w, (a, b) in enumerate(runs) if a <= o < b)
                if not permuted:
                    return r, w, o - runs[w][0]
                if (r, w) not in slots:
                    slots[r, w] = self._slot(0, r, w, W, K, ph.batch)
                return r, w, int(np.flatnonzero(slots[r, w] == i % L)[0])

            for j in range(min(L, W * q - L)):  # rows with an even-up repeat
                copies = [place(i) for i in range(j, W * q, L)]
                used = sum(t < y[w] for _, w, t in copies)
                twice += max(0, used - 1)
                for r, w, t in (copies if used else copies[1:]):
                    if t >= y[w]:
                        skip.setdefault((r, w), []).append(t)
            for (r, w), ts in skip.items():
                skip[r, w] = np.sort(np.asarray(ts, dtype=np.int64))
                counts[r * K + w] -= len(ts)
        offsets = np.zeros(W * K + 1, dtype=np.int64)  # shape: (W K + 1,)
        np.cumsum(counts, out=offsets[1:])
        if ph.twice is not None and ph.rule != 1 and ph.twice != twice:
            raise ValueError(f"phase {k}: the state says its ranks yielded {ph.twice} rows "
                             f"twice, its slots say {twice}: the state does not belong to "
                             "this dataset")
        return _Rest(offsets, skip, tail, twice)

    def _rest(self, k: int) -> _Rest:
        """:meth:`_count` of finished phase ``k`` (kept)."""
        if k not in self._rests:
            self._rests[k] = self._count(k, self.history[k])
        return self._rests[k]

    def check(self) -> None:
        """Compare every finished phase's recorded ``twice`` with its slots.

        Raises:
            ValueError: a phase whose slots give another count (the state belongs to another
                epoch order).
        """
        for k in range(self.phase):
            self._rest(k)

    def close(self, world_size: int, num_workers: int, yielded: Sequence[int],
              batch: int | None = None) -> Phase:
        """The current phase, closed at ``world_size`` ranks x ``num_workers`` workers (their
        runs whole batches of ``batch`` rows, or None) after worker ``w`` of every rank yielded
        ``yielded[w]`` rows: the :class:`Phase` a resize records, its ``twice`` counted.

        Raises:
            ValueError: a count larger than the worker's run.
        """
        ph = Phase(int(world_size), int(num_workers), tuple(int(v) for v in yielded),
                   batch=None if batch is None else int(batch))
        return replace(ph, twice=self._count(self.phase, ph).twice)

    @property
    def phase(self) -> int:
        """Number of the current phase (0 without a resize in this epoch)."""
        return len(self.history)

    def length(self, k: int | None = None) -> int:
        """L_k: rows of phase ``k``'s sequence (default: the current phase)."""
        return self.lengths[self.phase if k is None else k]

    def seq(self, k: int, a: int, b: int) -> np.ndarray:
        """int64[b - a], epoch positions at indices ``a .. b - 1`` of phase ``k``'s sequence."""
        if b <= a:
            return np.zeros(0, dtype=np.int64)
        if k == 0:
            return np.arange(a, b, dtype=np.int64)
        ph = self.history[k - 1]
        rest = self._rest(k - 1)
        offs = rest.offsets
        end = int(offs[-1])
        parts = []
        if a < end:
            first = int(np.searchsorted(offs, a, side="right")) - 1
            last = int(np.searchsorted(offs, min(b, end), side="left"))
            for p in range(first, last):  # the slots' parts overlapping [a, b), rank-major
                lo, hi = max(a, int(offs[p])), min(b, int(offs[p + 1]))
                if lo >= hi:
                    continue
                r, w = divmod(p, ph.num_workers)
                y = ph.yielded[w]
                stream = self.slot(k - 1, r, w, ph.world_size, ph.num_workers)[y:]
                left_out = rest.skip.get((r, w))
                if left_out is not None:
                    stream = np.delete(stream, left_out - y)
                parts.append(stream[lo - int(offs[p]):hi - int(offs[p])])
        if b > end and rest.tail is not None:  # the remainder drop_last left out
            t0 = rest.tail[0]
            parts.append(self.seq(k - 1, t0 + max(a, end) - end, t0 + b - end))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def slot(self, k: int, rank: int, worker: int, world_size: int,
             num_workers: int) -> np.ndarray:
        """int64[n], epoch positions worker ``worker`` of rank ``rank`` yields in phase ``k``
        at ``world_size`` ranks x ``num_workers`` workers, in order (steps 4-5; the runs cut
        to whole batches as phase ``k`` was: :attr:`Phase.batch`, :attr:`batch` for the
        current phase)."""
        batch = self.history[k].batch if k < len(self.history) else self.batch
        return self._slot(k, rank, worker, world_size, num_workers, batch)

    def _slot(self, k: int, rank: int, worker: int, world_size: int, num_workers: int,
              batch: int | None) -> np.ndarray:
        """:meth:`slot` with the runs cut to whole batches of ``batch`` rows (or None)."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        if num_workers < 1 or not 0 <= worker < num_workers:
            raise ValueError(f"need 0 <= worker < num_workers, got {worker}, {num_workers}")
        L = self.lengths[k]
        q = rank_rows(L, world_size, self.drop_last)
        a, b = worker_bounds(q, worker, num_workers, batch)
        a, b = rank * q + a, rank * q + b
        parts = []
        first = a
        while a < b:  # indices past L wrap to the start (the repeated rows)
            base = (a // L) * L
            hi = min(b - base, L)
            parts.append(self.seq(k, a - base, hi))
            a = base + hi
        out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if k == 0 and self.shuffle:
            perm = bounded_shuffle(out.size, seed=self.seed, epoch=self.epoch, rank=rank,
                                   worker=worker, num_workers=num_workers,
                                   shuffle_buffer=self.shuffle_buffer)
            out = out[perm]
            if self.order is not None and self.shuffle_buffer > 1:
                out = self.order.keep_passes(out, repeat=(first + perm) >= L)
        return out

    def rows_per_rank(self, world_size: int) -> int:
        """q of the current phase at ``world_size`` ranks."""
        return rank_rows(self.length(), world_size, self.drop_last)

    def repeated_rows(self, world_size: int) -> int:
        """Rows the epoch yields twice over all ranks (``drop_last=False``) when its current
        phase runs to the end at ``world_size`` ranks: the rows each finished phase's ranks
        yielded twice (a rule 1 phase: its even-up repeats, which its rest carried on) and the
        current phase's even-up repeats."""
        if self.drop_last:
            return 0
        n = 0
        for k, ph in enumerate(self.history):
            L, W = self.lengths[k], ph.world_size
            n += ph.twice if ph.rule != 1 else max(0, rank_rows(L, W, False) * W - L)
        L = self.length()
        return n + max(0, rank_rows(L, world_size, False) * world_size - L)

    def dropped_rows(self, world_size: int) -> int:
        """Rows of the epoch no rank yields (``drop_last=True``) when its current phase runs
        to the end at ``world_size`` ranks: the current phase's remainder (and a rule 1
        phase's, which its rest left out)."""
        if not self.drop_last:
            return 0
        n = sum(self.lengths[k] - rank_rows(self.lengths[k], ph.world_size, True)
                * ph.world_size for k, ph in enumerate(self.history) if ph.rule == 1)
        L = self.length()
        return n + L - rank_rows(L, world_size, True) * world_size


# --- the one-output form of the policy (kept for callers of the first loader) --------------

@dataclass(frozen=True)
class RankSplit:
    """One rank's share of an epoch of one output.

    Attributes:
        pieces: int64[P, 3], rows ``lo .. hi - 1`` (inside the row group) of row group
            ``group`` as ``(group, lo, hi)``, in the epoch's order.
        rows_per_rank: q, rows every rank yields this epoch.
        repeated_rows: rows yielded twice in the epoch over all ranks (``drop_last=False``).
        dropped_rows: rows no rank yields this epoch (``drop_last=True``).
    """

    pieces: np.ndarray
    rows_per_rank: int
    repeated_rows: int
    dropped_rows: int


def split_ranks(rg_rows: np.ndarray, *, rank: int, world_size: int, seed: int, epoch: int,
                shuffle: bool = True, drop_last: bool = False) -> RankSplit:
    """Rank ``rank``'s contiguous range of one output's epoch as row-group pieces (steps 2
    and 4 for a single source).

    Args:
        rg_rows: int64[G], rows in each row group, manifest order.
        rank: 0 .. world_size - 1; world_size: W >= 1.
        seed, epoch: non-negative ints; the row-group order depends on both.
        shuffle: permute the row groups; False keeps manifest order.
        drop_last: drop the remainder instead of repeating rows.

    Returns:
        :class:`RankSplit`.

    Raises:
        ValueError: bad rank / world_size / seed / epoch.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    seed, epoch = check_seed(seed), check_seed(epoch, "epoch")
    rg_rows = np.asarray(rg_rows, dtype=np.int64)
    N = int(rg_rows.sum())
    q = rank_rows(N, world_size, drop_last)
    rg_first = np.zeros(len(rg_rows) + 1, dtype=np.int64)
    np.cumsum(rg_rows, out=rg_first[1:])
    order = EpochOrder([rg_rows], [N], seed=seed, epoch=epoch, shuffle=shuffle, salts=None)
    plan = EpochPlan(N, seed=seed, epoch=epoch, shuffle=False, shuffle_buffer=1,
                     drop_last=drop_last)
    rows = order.rows_at(plan.slot(0, rank, 0, world_size, 1)) if q else np.zeros(0, np.int64)
    pieces = _pieces(rows, rg_first)
    return RankSplit(pieces=pieces, rows_per_rank=q, repeated_rows=max(0, world_size * q - N),
                     dropped_rows=max(0, N - world_size * q))


def _pieces(rows: np.ndarray, rg_first: np.ndarray) -> np.ndarray:
    """int64[P, 3] (group, lo, hi): ``rows`` cut into runs of consecutive rows of one group."""
    if not rows.size:
        return np.zeros((0, 3), dtype=np.int64)
    g = np.searchsorted(rg_first, rows, side="right") - 1
    brk = np.flatnonzero((np.diff(rows) != 1) | (np.diff(g) != 0)) + 1
    starts = np.concatenate([[0], brk])
    ends = np.concatenate([brk, [rows.size]])
    lo = rows[starts] - rg_first[g[starts]]
    return np.stack([g[starts], lo, lo + ends - starts], axis=1).astype(np.int64)


def worker_rows(pieces: np.ndarray, rg_first: np.ndarray, *, worker: int, num_workers: int,
                seed: int, epoch: int, rank: int, shuffle: bool = True,
                shuffle_buffer: int = 1024) -> np.ndarray:
    """Rows one DataLoader worker yields, in order, from its rank's pieces (step 5).

    Args:
        pieces: int64[P, 3] from :func:`split_ranks`.
        rg_first: int64[G + 1], first row of each row group.
        worker: 0 .. num_workers - 1 (0 of 1 for a DataLoader without workers).
        seed, epoch, rank: as for :func:`split_ranks`.
        shuffle: apply the bounded shuffle; shuffle_buffer: its window in rows (1 = none).

    Returns:
        int64[n]: row indices in yield order.

    Raises:
        ValueError: bad worker / num_workers / shuffle_buffer.
    """
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"need 0 <= worker < num_workers, got {worker}, {num_workers}")
    if shuffle_buffer < 1:
        raise ValueError(f"shuffle_buffer must be >= 1 row, got {shuffle_buffer}")
    pieces = np.asarray(pieces, dtype=np.int64).reshape(-1, 3)
    lengths = pieces[:, 2] - pieces[:, 1]  # shape: (P,)
    q = int(lengths.sum())
    a, b = worker_bounds(q, worker, num_workers)
    starts = np.asarray(rg_first, dtype=np.int64)[pieces[:, 0]] + pieces[:, 1]
    piece_first = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    rows = (np.repeat(starts - piece_first, lengths) + np.arange(q, dtype=np.int64))[a:b]
    if shuffle:
        rows = rows[bounded_shuffle(rows.size, seed=seed, epoch=epoch, rank=rank, worker=worker,
                                    num_workers=num_workers, shuffle_buffer=shuffle_buffer)]
    return rows
