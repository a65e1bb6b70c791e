"""Batch arrays of the training process, reused once nothing refers to them any more.

A batch at B = 8, C = 8192 is about 1.8 MB of fresh arrays (``input_ids`` copied out of a
worker's ring, segments, positions, labels and ``seq_idx`` written by the one-pass structure
kernel). glibc serves blocks of that size from fresh mappings, or trims them back to the
system once freed, so every batch paid its pages again: 10 to 16 page faults a row, about a
third of the training process's CPU with 2 DataLoader workers (``docs/benchmarks.md``). Setting
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` removes them too, but that is the
whole process's business; this pool is the loader's own.

An array is handed out again only when the pool holds the last reference to it: a tensor made
with ``torch.from_numpy`` (and every view of it, every NumPy array made from it) keeps a
reference to the array, so a batch the training loop still holds, or any piece of it, is never
written. A loop that drops each batch before the next gets the same few blocks back, already
mapped. At most :data:`KEEP` arrays of each shape and dtype are kept, :data:`MAX_BYTES` in all
(15 MB at B = 8, C = 8192); beyond that, arrays are plain ``np.empty`` ones.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["ArrayPool", "KEEP", "MAX_BYTES", "empty"]

#: Arrays kept per (shape, dtype): the batch the loop holds, the one being built, and those a
#: DataLoader holds decoded while it waits for an earlier one (``prefetch_factor`` per worker).
KEEP = 8
#: Bytes a pool keeps at most (beyond: plain ``np.empty`` arrays).
MAX_BYTES = 64 << 20


def _baseline() -> int:
    """What ``sys.getrefcount`` says of an array that only a pool list holds (interpreters
    count borrowed references differently)."""
    held = [np.empty(1)]
    return sys.getrefcount(held[0])


class ArrayPool:
    """Arrays by (shape, dtype), reused once only the pool refers to them. Thread-safe (the
    DataLoader's pin-memory thread unpickles and collates batches beside the main thread).

    Args:
        keep: arrays kept per (shape, dtype) (>= 0; 0 keeps none: every call is ``np.empty``).
        max_bytes: bytes kept in all (>= 0).

    Raises:
        ValueError: ``keep`` or ``max_bytes`` < 0.
    """

    def __init__(self, keep: int = KEEP, max_bytes: int = MAX_BYTES) -> None:
        if keep < 0 or max_bytes < 0:
            raise ValueError(f"keep and max_bytes must be >= 0, got {keep}, {max_bytes}")
        self.keep, self.max_bytes = int(keep), int(max_bytes)
        self._bytes = 0
        self._arrays: dict = {}
        self._lock = threading.Lock()
        self._free_refs = _baseline()

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``: one of the pool's
        that nothing else refers to, else a new one (kept when there is room).

        Raises:
            ValueError, TypeError: as ``np.empty``.
        """
        key = (tuple(int(n) for n in shape), np.dtype(dtype))
        with self._lock:
            held = self._arrays.setdefault(key, [])
            for i in range(len(held)):
                if sys.getrefcount(held[i]) == self._free_refs:
                    return held[i]
            arr = np.empty(key[0], dtype=key[1])
            if len(held) < self.keep and self._bytes + arr.nbytes <= self.max_bytes:
                held.append(arr)
                self._bytes += arr.nbytes
            return arr

    def clear(self) -> None:
        """Forget every array (those in use stay valid: they belong to their holders)."""
        with self._lock:
            self._arrays.clear()
            self._bytes = 0

    def __getstate__(self) -> dict:
        return {"keep": self.keep, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["keep"], state["max_bytes"])


_POOL = ArrayPool()


def empty(shape, dtype) -> np.ndarray:
    """:meth:`ArrayPool.empty` of the process's pool (shape, dtype as ``np.empty``)."""
    return _POOL.empty(shape, dtype)
