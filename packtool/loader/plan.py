"""Which rows each rank and DataLoader worker reads in an epoch, and in what order (NumPy only).

Shape legend: G = row groups over all shards, N = rows, W = world size (ranks), P = pieces.

The policy, in three steps, each a pure function of (seed, epoch, rank, world size, worker,
number of workers) and the row-group sizes, so any epoch is reproducible and a resumed job can
recompute exactly where it stopped without reading a byte:

1. **Row-group order.** With ``shuffle``, the G row groups (over all shards) are permuted with
   ``numpy.random.default_rng((seed, epoch))``; without, they stay in manifest order. Their rows,
   concatenated in that order, form the epoch's row sequence.
2. **Ranks.** The sequence is cut into W contiguous ranges of equal length ``q``, so each rank
   reads whole row groups (only the two at the ends of its range are shared with a neighbour)
   and never strides over all of them: per-rank decode work is about N / W rows. When W does not
   divide N, ``drop_last=False`` (the default) makes ``q = ceil(N / W)`` and fills the last
   ranks with the first ``W * q - N`` rows of the sequence again (they are counted as
   ``repeated_rows``: ``torch.utils.data.DistributedSampler``'s padding); ``drop_last=True``
   makes ``q = floor(N / W)`` and leaves out the last ``N - W * q`` rows of the sequence
   (``dropped_rows``; a different set each epoch when shuffled). Every rank yields exactly
   ``q`` rows, so collective calls stay in step.
3. **Workers and the shuffle buffer.** A rank's range is cut into ``num_workers`` contiguous
   runs of ``q // num_workers`` or one more rows (the first ``q % num_workers`` runs get the extra
   row), one per DataLoader worker, so workers also read whole row groups and every rank's
   workers yield the same counts: ranks make the same number of batches, partial ones
   included, and collectives stay in step. With ``shuffle`` each worker permutes its
   stream inside a bounded window: row ``p`` gets the key ``p + u * shuffle_buffer`` with ``u``
   uniform in [0, 1) from ``default_rng((seed, epoch, rank, worker, num_workers))``, and rows are
   yielded by key. No row moves ``shuffle_buffer`` positions or more, so a worker holds at most
   the row groups that overlap ``2 * shuffle_buffer`` consecutive rows of its stream, and rows of
   several row groups (of several shards, windows or input files) are interleaved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RankSplit", "split_ranks", "worker_rows", "check_seed"]


def check_seed(seed: int) -> int:
    """``seed`` as a non-negative Python int.

    Raises:
        ValueError: negative or not an integer.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


@dataclass(frozen=True)
class RankSplit:
    """One rank's share of an epoch.

    Attributes:
        pieces: int64[P, 3], rows ``lo .. hi - 1`` (inside the row group) of row group ``group``
            as ``(group, lo, hi)``, in the epoch's order.
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
    """Rank ``rank``'s contiguous range of the epoch's row sequence (module docstring, steps 1-2).

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
    seed, epoch = check_seed(seed), check_seed(epoch)
    rg_rows = np.asarray(rg_rows, dtype=np.int64)
    G = len(rg_rows)
    order = (np.random.default_rng((seed, epoch)).permutation(G) if shuffle
             else np.arange(G))  # shape: (G,)
    cum = np.zeros(G + 1, dtype=np.int64)  # shape: (G + 1,), row offset in the epoch sequence
    np.cumsum(rg_rows[order], out=cum[1:])
    N = int(cum[-1])
    q = N // world_size if drop_last or N == 0 else -(-N // world_size)
    a, b = rank * q, (rank + 1) * q
    parts = []
    while a < b:  # positions past N wrap to the start of the sequence (the repeated rows)
        base = (a // N) * N
        lo, hi = a - base, min(b - base, N)
        j = np.arange(np.searchsorted(cum, lo, side="right") - 1,
                      np.searchsorted(cum, hi, side="left"))
        parts.append(np.stack([order[j], np.maximum(lo, cum[j]) - cum[j],
                               np.minimum(hi, cum[j + 1]) - cum[j]], axis=1))
        a = base + hi
    pieces = np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)
    return RankSplit(pieces=pieces.astype(np.int64), rows_per_rank=q,
                     repeated_rows=max(0, world_size * q - N), dropped_rows=max(0, N - world_size * q))


def worker_rows(pieces: np.ndarray, rg_first: np.ndarray, *, worker: int, num_workers: int,
                seed: int, epoch: int, rank: int, shuffle: bool = True,
                shuffle_buffer: int = 1024) -> np.ndarray:
    """Global rows one DataLoader worker yields, in order (module docstring, step 3).

    Args:
        pieces: int64[P, 3] from :func:`split_ranks`.
        rg_first: int64[G + 1], global row of each row group's first row.
        worker: 0 .. num_workers - 1 (0 of 1 for a DataLoader without workers).
        seed, epoch, rank: as for :func:`split_ranks`.
        shuffle: apply the bounded shuffle; shuffle_buffer: its window in rows (1 = none).

    Returns:
        int64[n]: global row indices in yield order.

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
    # this worker's contiguous run [a, b) of the rank's q rows
    base, extra = divmod(q, num_workers)
    a = worker * base + min(worker, extra)
    b = a + base + (worker < extra)
    starts = np.asarray(rg_first, dtype=np.int64)[pieces[:, 0]] + pieces[:, 1]
    # row p of the rank's stream = start of its piece + offset inside the piece
    piece_first = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    rows = (np.repeat(starts - piece_first, lengths) + np.arange(q, dtype=np.int64))[a:b]
    n = len(rows)  # shape of rows: (n,)
    if shuffle and shuffle_buffer > 1 and n > 1:
        rng = np.random.default_rng((check_seed(seed), check_seed(epoch), rank, worker,
                                     num_workers))
        keys = np.arange(n, dtype=np.float64) + rng.random(n) * shuffle_buffer  # shape: (n,)
        rows = rows[np.argsort(keys, kind="stable")]
    return rows
