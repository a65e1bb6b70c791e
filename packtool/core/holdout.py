"""A seeded held-out split of whole documents (``pack --holdout FRACTION``).

Each document is held out independently with probability ``fraction``, decided by a counter-based
hash of (seed, global document index): SplitMix64 (Steele, Lea and Flood 2014, *Fast splittable
pseudorandom number generators*, OOPSLA; the finaliser of Java's ``SplittableRandom``). The
decision for document ``d`` depends on ``d``, the seed and the fraction only, never on the
windows, the engine, the worker count or the other documents, so a window task decides its own
documents without a global table (constant memory at any corpus size), and the held-out set is
the same for every run of the same seed. The number held out is Binomial(N, fraction), not
exactly ``fraction * N``.

Pure NumPy (``uint64`` arithmetic wraps modulo 2**64, which is what the hash needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["HoldoutSplit", "holdout_mask", "count_held_out", "drop_documents"]

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, SplitMix64's increment
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
#: separates this stream from any other use of the seed (the row shuffle uses numpy's PCG64)
_SALT = np.uint64(0x686F6C646F75742E)  # b"holdout."


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64[n] (new array)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def holdout_mask(first_doc: int, n: int, fraction: float, seed: int) -> np.ndarray:
    """Which of documents ``first_doc .. first_doc + n - 1`` are held out.

    Args:
        first_doc: global index of the first document (>= 0).
        n: documents (>= 0).
        fraction: probability of each document being held out, in [0, 1].
        seed: 0 .. 2**63 - 1.

    Returns:
        bool[n]: True where the document is held out. Document ``d`` is held out when the top
        53 bits of ``mix(mix(seed ^ salt) + (d + 1) * gamma)`` are below ``fraction * 2**53``.

    Raises:
        ValueError: ``fraction`` outside [0, 1], a negative ``first_doc``, ``n`` or ``seed``.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if first_doc < 0 or n < 0 or seed < 0:
        raise ValueError("first_doc, n and seed must be >= 0")
    key = _mix(np.array([seed], dtype=np.uint64) ^ _SALT)  # shape: (1,)
    d = np.arange(first_doc, first_doc + n, dtype=np.uint64) + np.uint64(1)  # shape: (n,)
    z = _mix(key + d * _GAMMA)  # shape: (n,)
    threshold = np.uint64(int(fraction * 2**53))
    return (z >> np.uint64(11)) < threshold


def count_held_out(num_docs: int, fraction: float, seed: int, chunk: int = 1 << 22) -> int:
    """How many of documents ``0 .. num_docs - 1`` :func:`holdout_mask` holds out (computed in
    chunks of ``chunk`` documents: 32 MiB of scratch at most)."""
    return sum(int(np.count_nonzero(holdout_mask(lo, min(chunk, num_docs - lo), fraction, seed)))
               for lo in range(0, num_docs, chunk))


def drop_documents(lengths: np.ndarray, keep_docs: np.ndarray,
                   *arrays: np.ndarray | None) -> tuple:
    """Remove the tokens of the documents not kept; their length becomes 0.

    Args:
        lengths: int64[docs], tokens per document.
        keep_docs: bool[docs], False for documents to leave out.
        arrays: per-token arrays [T] (T = sum(lengths)) filtered alike; None passes through.

    Returns:
        (lengths int64[docs] with 0 for the dropped documents, dropped documents, dropped tokens,
        then each array filtered to [T'] (or None)).

    Raises:
        ValueError: ``keep_docs`` does not have one entry per document, or an array does not have
            one entry per token.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    keep_docs = np.asarray(keep_docs, dtype=bool)
    if keep_docs.shape != lengths.shape:
        raise ValueError("keep_docs must have one entry per document")
    total = int(lengths.sum())
    for a in arrays:
        if a is not None and a.size != total:
            raise ValueError("every per-token array must have one entry per token")
    dropped = int(keep_docs.size - np.count_nonzero(keep_docs))
    if not dropped:
        return (lengths, 0, 0, *arrays)
    keep_tokens = np.repeat(keep_docs, lengths)  # shape: (T,)
    new_lengths = np.where(keep_docs, lengths, 0)
    dropped_tokens = total - int(new_lengths.sum())
    return (new_lengths, dropped, dropped_tokens,
            *(a[keep_tokens] if a is not None else None for a in arrays))


@dataclass(frozen=True)
class HoldoutSplit:
    """One side of a held-out split: which documents a pack keeps."""

    fraction: float  #: probability of a document being held out
    seed: int  #: seeds :func:`holdout_mask`
    held_out: bool  #: True: keep the held-out documents; False: keep the others (training)

    def keep(self, first_doc: int, n: int) -> np.ndarray:
        """bool[n]: documents ``first_doc ..`` this side keeps."""
        mask = holdout_mask(first_doc, n, self.fraction, self.seed)
        return mask if self.held_out else ~mask
