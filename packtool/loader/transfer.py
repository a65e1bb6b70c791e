"""Batches from DataLoader workers to the training process: gathered rows, their per-token
columns through a shared-memory ring per worker.

A :class:`~packtool.loader.distributed.PackedIterableDataset` with ``batch_size`` hands a
DataLoader worker's batch over as its gathered :class:`~packtool.formats.packed.Rows`, collated
where it arrives (:class:`_InTransit`). The per-token columns are most of the bytes
(``input_ids``: int32 [B, C], 256 KiB at B = 8, C = 8192). Pickled by value through the
DataLoader's pipe they are copied about five times (pickle, pipe writes of 64 KiB, reads,
unpickle): 0.3 to 0.6 ms of CPU a batch (``docs/benchmarks.md``). Instead:

- Each worker owns a ring of :data:`SLOTS` slots, each large enough for the per-token columns
  of ``batch_size`` rows, in one shared-memory segment, and a pipe of release tokens (one byte:
  a slot number).
- The worker's first batch crosses by value, carrying the segment's and the pipe's write end's
  file descriptors (``multiprocessing.reduction.DupFd``, as torch passes shared tensors). The
  training process maps the segment and writes one token per slot into the pipe.
- For each later batch the worker reads a token without blocking. With one, ``Rows.gather``
  writes the per-token columns straight into that slot, and only the slot number and the
  column layout cross the pipe, beside the small columns (``cu_seqlens``, ``doc_ids``, the
  provenance): a few hundred bytes. With none (every slot in flight), or a column that does not
  fit its slot, that batch or column crosses by value, as it would without the ring: the
  worker never waits.
- On arrival the training process copies the columns out of the slot into arrays of its own,
  and only then writes the slot's token back. A batch handed to the training loop is never a
  view of the ring.

**Ordering.** Batches and tokens travel through pipes, and a pipe write happens before the read
that returns it (the kernel's pipe lock orders the memory operations before and after it on
weakly ordered CPUs too, ARM included): the worker's writes to a slot are visible before the
batch that names it is read, and the training process's copy out of a slot is complete before
the worker can read the token that lets it write there again. No flag in shared memory is
polled.

**Lifetime.** The segment has no name: an anonymous ``memfd`` (Linux), else a ``/dev/shm`` file
unlinked the moment it is created. It is freed when the last process mapping it unmaps it or
exits, so a worker killed or a DataLoader shut down mid-epoch leaves nothing in ``/dev/shm``.
Its pages are reserved when it is made (``posix_fallocate``: a full ``/dev/shm`` is refused
then, not found by a SIGBUS at the first write). A persistent worker keeps its ring across
epochs. The training process unmaps a ring once its worker is gone (the token pipe has no
reader left), checked whenever another worker's ring arrives: at most the rings of the last
DataLoader's workers (``SLOTS`` batches each) stay mapped after it ends.

**Fallback.** Without ``memfd`` and ``/dev/shm``, with ``/dev/shm`` full, without file
descriptor passing, or with ``PACKTOOL_LOADER_SHM=0`` in the environment, every batch crosses
by value: the same batches, no error.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import multiprocessing
import os
import select
import tempfile
import threading
from collections.abc import Callable

import numpy as np

from packtool.loader import pool

__all__ = ["ENV", "SLOTS", "counts", "in_transit"]

#: Slots of each worker's ring. A DataLoader keeps ``prefetch_factor`` (default 2) batches of
#: each worker in flight, and a slot is held from the gather until the batch is unpickled; a
#: batch that finds every slot taken crosses by value.
SLOTS = 4

#: ``PACKTOOL_LOADER_SHM=0`` turns the ring off (every batch by value); read by each worker when
#: it makes its ring, from its own environment (under ``forkserver``, the server's: fixed when
#: the server started).
ENV = "PACKTOOL_LOADER_SHM"

_ALIGN = 64  # bytes: each column of a slot starts on a cache line


def _aligned(n: int, to: int = _ALIGN) -> int:
    return -(-n // to) * to


# --- the worker's side --------------------------------------------------------------------------


def _segment(size: int) -> int:
    """A file descriptor of ``size`` bytes of shared memory with no name, its pages reserved.

    Raises:
        OSError: no ``memfd`` and no ``/dev/shm``, or not enough room there.
    """
    fd = None
    if hasattr(os, "memfd_create"):
        try:
            fd = os.memfd_create("packtool-batches", os.MFD_CLOEXEC)
        except OSError:
            fd = None
    if fd is None:
        if not os.path.isdir("/dev/shm"):
            raise OSError("no memfd_create and no /dev/shm")
        fd, name = tempfile.mkstemp(prefix="packtool-batches-", dir="/dev/shm")
        os.unlink(name)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclasses.dataclass(frozen=True)
class _Handoff:
    """What the training process needs to map a worker's ring: its id, the segment and the
    token pipe's write end (``DupFd`` objects, detached once, in the process that unpickles
    them), the slot size in bytes and the slot count."""

    ring: str
    segment: object
    tokens: object
    slot_bytes: int
    slots: int


class _WorkerRing:
    """A worker's ring: the mapped segment, the read end of its token pipe (non-blocking) and
    the slots whose tokens were read but not yet used.

    Raises:
        OSError, ValueError: shared memory or descriptor passing unavailable.
    """

    def __init__(self, slot_bytes: int, slots: int) -> None:
        from multiprocessing.reduction import DupFd

        self.slot_bytes, self.slots = int(slot_bytes), int(slots)
        self.id = os.urandom(8).hex()
        fd = _segment(self.slot_bytes * self.slots)
        try:
            self.mm = mmap.mmap(fd, self.slot_bytes * self.slots)
            r, w = os.pipe()
            try:
                self.handoff: _Handoff | None = _Handoff(self.id, DupFd(fd), DupFd(w),
                                                         self.slot_bytes, self.slots)
            except BaseException:
                os.close(r)
                raise
            finally:
                os.close(w)  # DupFd keeps its own copy until the training process takes it
        finally:
            os.close(fd)  # the mapping keeps the memory
        os.set_blocking(r, False)
        self.r = r
        self.free: list[int] = []

    def take(self) -> int | None:
        """A free slot, or None when every slot is in flight (or the training process has
        let the ring go)."""
        if not self.free:
            try:
                self.free.extend(os.read(self.r, self.slots))  # b"" once the writer is gone
            except BlockingIOError:
                return None
        return self.free.pop() if self.free else None

    def close(self) -> None:
        os.close(self.r)
        try:
            self.mm.close()
        except BufferError:  # a view still exported: the mapping goes with the process
            pass


class _Slot:
    """One slot being filled: ``alloc`` is ``Rows.gather``'s (each per-token column placed
    after the previous one while it fits, else given ``np.empty``: it crosses by value), and
    :meth:`put` copies a small array in. ``columns`` lists what the slot holds, as
    ``(key, offset in the slot, shape, dtype str)``; a key names the array in a ``Rows``
    (:func:`_get`)."""

    def __init__(self, ring: _WorkerRing, slot: int) -> None:
        self.ring, self.slot, self.used = ring, slot, 0
        self.columns: list[tuple] = []

    def _place(self, key: tuple, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
        n = math.prod(shape) * dtype.itemsize
        at = -(-self.used // _ALIGN) * _ALIGN
        if n == 0 or at + n > self.ring.slot_bytes or dtype.hasobject:
            return None
        self.used = at + n
        self.columns.append((key, at, shape, dtype.str))
        return np.ndarray(shape, dtype=dtype, buffer=self.ring.mm,
                          offset=self.slot * self.ring.slot_bytes + at)

    def alloc(self, name: str, shape: tuple, dtype) -> np.ndarray:
        out = self._place(("tokens", name), tuple(shape), np.dtype(dtype))
        return np.empty(shape, dtype=dtype) if out is None else out

    def put(self, key: tuple, arr) -> None:
        if isinstance(arr, np.ndarray):
            out = self._place(key, arr.shape, arr.dtype)
            if out is not None:
                np.copyto(out, arr)


def _small_arrays(rows) -> list[tuple]:
    """``(key, array)`` of the arrays of ``rows`` besides its per-token columns."""
    out = [(("ragged", k, i), a) for k, pair in rows.ragged.items() for i, a in enumerate(pair)]
    out += [(("scalars", k), a) for k, a in rows.scalars.items()]
    return out + [(("index",), rows.index), (("row",), rows.row)]


def _without(rows, keys: set):
    """A copy of ``rows`` (sharing its arrays) with the arrays named in ``keys`` set to None."""
    def drop(key, a):
        return None if key in keys else a

    return dataclasses.replace(
        rows,
        tokens={k: drop(("tokens", k), a) for k, a in rows.tokens.items()},
        ragged={k: tuple(drop(("ragged", k, i), a) for i, a in enumerate(pair))
                for k, pair in rows.ragged.items()},
        scalars={k: drop(("scalars", k), a) for k, a in rows.scalars.items()},
        index=drop(("index",), rows.index), row=drop(("row",), rows.row))


def _set(rows, key: tuple, arr: np.ndarray) -> None:
    """Put ``arr`` back where ``key`` (of :class:`_Slot`) names it in ``rows``."""
    if key[0] == "tokens":
        rows.tokens[key[1]] = arr
    elif key[0] == "ragged":
        pair = list(rows.ragged[key[1]])
        pair[key[2]] = arr
        rows.ragged[key[1]] = tuple(pair)
    elif key[0] == "scalars":
        rows.scalars[key[1]] = arr
    else:
        setattr(rows, key[0], arr)


class _WorkerState:
    """This process's ring (made at its first batch); none in a process forked from it."""

    def __init__(self) -> None:
        self.ring: _WorkerRing | None = None
        self.off = False  # unavailable or turned off: every batch by value

    def make(self, slot_bytes: int) -> _WorkerRing | None:
        if self.ring is None and not self.off:
            if os.environ.get(ENV, "1").strip() == "0":
                self.off = True
            else:
                try:
                    self.ring = _WorkerRing(slot_bytes, SLOTS)
                except (OSError, ValueError, AttributeError):
                    self.off = True  # no shared memory here: by value from now on
        return self.ring


_worker = _WorkerState()


def in_transit(parts: list, meta: dict, collate_fn: Callable, batch_size: int) -> _InTransit:
    """One batch of a DataLoader worker, gathered for the trip to the training process.

    Args:
        parts: ``(block, rows)`` pairs for :meth:`~packtool.formats.packed.Rows.gather`.
        meta: per-row lists to carry (``source``).
        collate_fn: applied to the rows where they arrive.
        batch_size: rows of a full batch (sizes the ring's slots at the first batch).

    Returns:
        An :class:`_InTransit`: its ``rows`` hold the per-token columns in a slot of this
        worker's ring when one was free, else in memory of their own.
    """
    from packtool.formats.packed import Rows

    ring = _worker.ring
    slot = ring.take() if ring is not None else None
    if slot is None:
        rows = Rows.gather(parts, meta=meta)
        handoff = None
        if ring is None and not _worker.off:
            tokens = sum(_aligned(a.shape[1] * a.itemsize * batch_size)
                         for a in rows.tokens.values())
            small = sum(_aligned(a.nbytes) for _, a in _small_arrays(rows))
            # room for 4x this batch's small arrays (their sizes vary with the documents a
            # row holds); one that does not fit crosses by value
            ring = _worker.make(_aligned(tokens + max(4 * small, 1 << 16), mmap.PAGESIZE))
            if ring is not None:
                handoff, ring.handoff = ring.handoff, None
        return _InTransit(rows, collate_fn, handoff=handoff)
    place = _Slot(ring, slot)
    rows = Rows.gather(parts, meta=meta, alloc=place.alloc)
    for key, arr in _small_arrays(rows):
        place.put(key, arr)
    if not place.columns:
        ring.free.append(slot)
        return _InTransit(rows, collate_fn)
    return _InTransit(rows, collate_fn, shared=(ring.id, slot, tuple(place.columns)))


_UNSET = object()


class _InTransit:
    """A batch on its way from a DataLoader worker to the training process.

    The worker decodes and gathers (most of the work); the gathered rows cross (their per-token
    columns through the worker's ring when they are in a slot, else pickled by value, with the
    small ``cu_seqlens`` / ``doc_ids`` arrays), and the collate function runs where they
    arrive, in the training process (positions, segments and labels derived there, about a
    fifth of the work of a row). A collated batch would move five times the bytes, and torch
    would send each of its tensors through its own shared-memory segment and file descriptor:
    that cost more CPU than reading the rows (``docs/benchmarks.md``, "Workers").

    **Read in the worker.** Code that runs in the worker on the item the dataset yields (a
    DataLoader ``collate_fn``, which runs there with ``batch_size=None``; a wrapping
    ``IterableDataset``) sees the batch: the mapping methods (``b[k]``, ``b[k] = v``,
    ``del b[k]``, ``k in b``, ``len``, ``iter``, ``keys``, ``items``, ``values``, ``get``,
    ``pop``, ``setdefault``, ``update``; so ``dict(b)`` and ``{**b}``), ``copy.copy``,
    ``copy.deepcopy`` and ``repr`` collate it there first (:meth:`batch`): the same dict the
    training process would have built (keys, dtypes, values, provenance). The rows leave the
    ring slot (copied, the slot kept by the worker for its next batch), and from then on that
    dict, with any change made to it, crosses by value instead. It is not a ``Mapping``
    instance: torch's ``default_convert`` (the DataLoader's ``collate_fn`` with
    ``batch_size=None``) rebuilds every ``Mapping``, which would collate every batch in the
    worker. An item nothing reads crosses as gathered rows.
    """

    def __init__(self, rows, collate_fn, *, shared: tuple | None = None,
                 handoff: _Handoff | None = None) -> None:
        self.rows, self.collate_fn = rows, collate_fn
        self.shared, self.handoff = shared, handoff
        self.collated = _UNSET

    def batch(self):
        """The collated batch, built in this process at the first call (the rows copied out
        of their ring slot first, and the slot given back to this worker's ring).

        Raises:
            what ``collate_fn`` raises (the rows stay, so a later call tries again).
        """
        if self.collated is _UNSET:
            if self.shared is not None:
                ring_id, slot, columns = self.shared
                for key, *_ in columns:
                    if key[0] == "tokens":  # the others stayed the rows' own in the slot
                        self.rows.tokens[key[1]] = np.array(self.rows.tokens[key[1]])
                self.shared = None
                ring = _worker.ring
                if ring is not None and ring.id == ring_id:
                    ring.free.append(slot)  # its token was never sent: this worker's again
            self.collated = self.collate_fn(self.rows)
            self.rows = None
        return self.collated

    def __reduce__(self):
        if self.collated is not _UNSET:
            out = self.collated
            if type(out) is dict:  # e.g. one a user's collate function built: tensors by value
                from packtool.loader.collate import _Batch

                out = _Batch(out)
            return _arrive_collated, (out, self.handoff)
        if self.shared is None:
            return _arrive, (self.rows, self.collate_fn, self.handoff)
        rows = _without(self.rows, {c[0] for c in self.shared[2]})
        return _arrive_shared, (rows, self.collate_fn, *self.shared)

    # the batch's mapping methods, on the collated batch
    def __getitem__(self, key):
        return self.batch()[key]

    def __setitem__(self, key, value) -> None:
        self.batch()[key] = value

    def __delitem__(self, key) -> None:
        del self.batch()[key]

    def __contains__(self, key) -> bool:
        return key in self.batch()

    def __iter__(self):
        return iter(self.batch())

    def __len__(self) -> int:
        return len(self.batch())

    def keys(self):
        return self.batch().keys()

    def items(self):
        return self.batch().items()

    def values(self):
        return self.batch().values()

    def get(self, key, default=None):
        return self.batch().get(key, default)

    def pop(self, key, *default):
        return self.batch().pop(key, *default)

    def setdefault(self, key, default=None):
        return self.batch().setdefault(key, default)

    def update(self, *args, **kwargs) -> None:
        self.batch().update(*args, **kwargs)

    def __copy__(self):
        return dict(self.batch())

    def __deepcopy__(self, memo):
        import copy

        return copy.deepcopy(dict(self.batch()), memo)

    def __repr__(self) -> str:
        return repr(self.batch())


# --- the training process's side ------------------------------------------------------------


class _MappedRing:
    """A worker's ring as mapped in the training process, with the token pipe's write end."""

    def __init__(self, handoff: _Handoff) -> None:
        self.id, self.slot_bytes, self.slots = handoff.ring, handoff.slot_bytes, handoff.slots
        size = self.slot_bytes * self.slots
        fd = handoff.segment.detach()
        try:
            if os.fstat(fd).st_size != size:
                raise ValueError(f"shared segment of {os.fstat(fd).st_size} bytes, "
                                 f"expected {size}")
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        try:
            self.w = handoff.tokens.detach()
            os.set_blocking(self.w, False)
        except BaseException:
            self.mm.close()
            raise

    def gone(self) -> bool:
        """The worker (the token pipe's only reader) has exited."""
        p = select.poll()
        p.register(self.w, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL)
                   for _, ev in p.poll(0))

    def release(self, slots: bytes) -> None:
        try:
            os.write(self.w, slots)
        except OSError:  # the worker is gone (BrokenPipeError): nothing will take the slot
            pass

    def close(self) -> bool:
        try:
            self.mm.close()
        except BufferError:
            return False
        os.close(self.w)
        return True


class _Mapped:
    """The rings this process has mapped, by id, and what arrived how."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rings: dict[str, _MappedRing] = {}
        self.counts = {"shared": 0, "by_value": 0, "collated_in_worker": 0, "rings_mapped": 0,
                       "rings_refused": 0}

    def attach(self, handoff: _Handoff) -> None:
        try:
            ring = _MappedRing(handoff)
        except (OSError, EOFError, ValueError, RuntimeError, multiprocessing.ProcessError):
            # descriptor passing (the worker gone, refused) or mapping failed: the worker
            # never gets a token, so it stays by value
            with self.lock:
                self.counts["rings_refused"] += 1
            return
        with self.lock:
            for k, old in list(self.rings.items()):
                if old.gone() and old.close():
                    del self.rings[k]
            self.rings[ring.id] = ring
            self.counts["rings_mapped"] += 1
            ring.release(bytes(range(ring.slots)))  # the slots are the worker's to fill

    def copy_out(self, rows, ring_id: str, slot: int, columns: tuple) -> None:
        with self.lock:
            ring = self.rings.get(ring_id)
            if ring is None:
                raise RuntimeError(
                    f"a DataLoader batch sits in shared memory this process has not mapped "
                    f"(ring {ring_id}): the batch was unpickled in another process than the "
                    f"DataLoader's; set {ENV}=0 to send batches by value")
            base = slot * ring.slot_bytes
            for key, at, shape, dtype in columns:
                out = pool.empty(shape, dtype)  # mapped already once the loop drops its batches
                np.copyto(out, np.ndarray(shape, dtype=dtype, buffer=ring.mm, offset=base + at))
                _set(rows, key, out)
            self.counts["shared"] += 1
            # after the copy: the worker may overwrite the slot now (under the lock, so a
            # ring is never closed, and its descriptor reused, between the two)
            ring.release(bytes((slot,)))

    def forget(self) -> None:
        """In a child forked from this process: the parent's rings are not this one's."""
        for ring in self.rings.values():
            ring.close()
        self.__init__()


_mapped = _Mapped()


def _forget_after_fork() -> None:
    global _worker
    if _worker.ring is not None:
        _worker.ring.close()
    _worker = _WorkerState()
    _mapped.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _arrive(rows, collate_fn, handoff: _Handoff | None = None):
    """The batch of an :class:`_InTransit` that crossed by value, collated in the process that
    receives it (mapping the worker's ring when the batch brings it)."""
    if handoff is not None:
        _mapped.attach(handoff)
    with _mapped.lock:
        _mapped.counts["by_value"] += 1
    return collate_fn(rows)


def _arrive_shared(rows, collate_fn, ring_id: str, slot: int, columns: tuple):
    """The batch of an :class:`_InTransit` whose per-token columns are in slot ``slot`` of
    ring ``ring_id``: copied out, the slot released, then collated."""
    _mapped.copy_out(rows, ring_id, slot, columns)
    return collate_fn(rows)


def _arrive_collated(batch, handoff: _Handoff | None = None):
    """The batch of an :class:`_InTransit` that code in the worker read: collated there,
    crossed by value (mapping the worker's ring when the batch brings it)."""
    if handoff is not None:
        _mapped.attach(handoff)
    with _mapped.lock:
        _mapped.counts["by_value"] += 1
        _mapped.counts["collated_in_worker"] += 1
    return batch


def counts() -> dict:
    """What reached this process from DataLoader workers: ``shared`` (batches whose per-token
    columns came through a ring), ``by_value`` (batches pickled whole), ``collated_in_worker``
    (those of them collated in the worker, because code there read them: :class:`_InTransit`),
    ``rings_mapped`` and ``rings_refused`` (workers' rings mapped, or that could not be: those
    workers send by value), and ``rings`` (rings mapped now). Counted since the process started (or was forked).
    """
    with _mapped.lock:
        return {**_mapped.counts, "rings": len(_mapped.rings)}
