"""Spill files: every file a pack writes into its scratch directory and reads back.

Flat files of raw native-endian numbers, written once through :func:`spill_writer` (or appended
to, for a read part that resumes) and read back by ranges. Two kinds of directories live in the
scratch directory:

A **read part** (``read-NNNNN/``, :mod:`packtool.pipeline.read`): a run of input documents in
input order, after masks and BOS/EOS.

- :data:`TOKENS` int32: the documents' tokens back to back.
- :data:`STARTS` int64[docs + 1]: each document's first token in :data:`TOKENS`, then the total.
- :data:`TARGETS` uint8 beside the tokens, only when a labels column or a loss mask was read
  (1 = target, 0 = input label -100 or loss mask 0).
- :data:`DOC_SOURCES` int32[docs], with ``--source-column`` only: each document's source id in
  the part's own table (its ``done.json``, values in order of first appearance).

A **window** (``window-NNNNN/``, :mod:`packtool.pipeline.plan`): the planned rows of a window
in the window's row order.

- :data:`ROW_INDEX` int64[rows + 1]: each row's first segment in :data:`SEGMENTS` (last entry:
  the total).
- :data:`SEGMENTS` int64[segments, 4]: each segment's length, global document number, token
  offset in its document, and where its tokens are: the global token position over the read
  parts' :data:`TOKENS` (read part ``p`` holds positions ``base[p] .. base[p + 1] - 1``), or,
  when the scratch is in an object store, the position in the window's own :data:`ROW_TOKENS`.
- :data:`SEG_SOURCES` int32[segments] beside :data:`SEGMENTS`, with ``--source-column`` only:
  each segment's source id in the output's table (the manifest's ``sources``).
- :data:`ROW_TOKENS` int32 (and :data:`ROW_TARGETS` uint8), object-store scratch only: the
  tokens of the window's rows in row order, so that the rows a row group takes from a window
  are one ranged GET.

Reading: a local spill is read with ``pread`` straight into the caller's buffer
(:func:`gather_spill`: one call per segment, into the row being laid out, no intermediate copy
and no memory map, so the spill's pages never count in a task's resident set; with Numba's JIT
disabled, ``NUMBA_DISABLE_JIT=1``, the same reads are ``os.preadv`` calls); in an object store
with ranged GETs (:func:`read_spill`, nearby ranges coalesced).
"""

from __future__ import annotations

import os
import resource
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from typing import BinaryIO, Iterator

import numba
import numpy as np
from numba import njit, types

from packtool.core.layout import gather_segments
from packtool.errors import as_read
from packtool.formats.reader import is_remote

__all__ = ["spill_writer", "read_spill", "read_records", "gather_spill", "SpillReader",
           "remove_spill", "DocSpill", "TOKENS", "STARTS", "TARGETS", "DOC_SOURCES",
           "ROW_TOKENS", "ROW_TARGETS", "ROW_INDEX", "SEGMENTS", "SEG_SOURCES", "SEGMENT_FIELDS"]

TOKENS = "tokens.int32"
STARTS = "starts.int64"
TARGETS = "targets.uint8"
DOC_SOURCES = "doc-sources.int32"
ROW_TOKENS = "rows.int32"
ROW_TARGETS = "rows-targets.uint8"
ROW_INDEX = "rows-index.int64"
SEGMENTS = "segments.int64"
SEG_SOURCES = "segment-sources.int32"
#: Columns of a :data:`SEGMENTS` record.
SEGMENT_FIELDS = ("length", "doc", "offset", "position")

#: Bytes of the largest single ``pread`` (Linux reads at most about 2 GiB per call).
_MAX_READ = 1 << 30


@contextmanager
def spill_writer(location: str | os.PathLike, append: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write spill bytes to (``write(buffer)``), closed on exit.

    Args:
        location: the file (its directory exists).
        append: add to the end of an existing file (a read part that resumes) instead of
            creating it anew.

    Raises:
        OSError: it cannot be created or written (a full disk: ``ENOSPC``).
    """
    with open(location, "ab" if append else "wb") as f:
        yield f


def _open_read(location) -> int:
    """A descriptor of scratch file ``location`` opened to read; an OSError (the file gone)
    is marked a read (:func:`packtool.errors.as_read`)."""
    try:
        return os.open(location, os.O_RDONLY)
    except OSError as exc:
        raise as_read(exc) from None


def read_spill(location: str | os.PathLike, offsets, sizes) -> np.ndarray:
    """Byte ranges of a spill file, back to back in the order given.

    Args:
        location: the file: a path, or a URI of an object in a store (ranged GETs, nearby
            ranges coalesced: :func:`packtool.formats.object_store.read_ranges`).
        offsets: int[k], byte offset of each range.
        sizes: int[k], bytes of each range (>= 0). Ranges that follow each other in the file
            are read with one ``pread``.

    Returns:
        uint8[sum(sizes)], a private buffer (view it with ``.view(dtype)``).

    Raises:
        OSError: the file cannot be read, or holds fewer bytes than asked (truncated).
    """
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    keep = sizes > 0
    if not keep.all():
        offsets, sizes = offsets[keep], sizes[keep]
    total = int(sizes.sum())
    if not total:
        return np.zeros(0, dtype=np.uint8)
    if is_remote(location):
        from packtool.formats.object_store import read_ranges

        data = read_ranges(str(location), sizes.tolist(), offsets.tolist())
        return np.frombuffer(bytearray(data), dtype=np.uint8)  # private and writable
    out = np.empty(total, dtype=np.uint8)
    # runs of ranges contiguous in the file become one read
    breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + sizes[:-1]) + 1
    first = np.concatenate([[0], breaks])
    last = np.concatenate([breaks, [sizes.size]]) - 1
    run_off = offsets[first].tolist()
    run_size = (offsets[last] + sizes[last] - offsets[first]).tolist()
    view = memoryview(out)
    pos = 0
    fd = _open_read(location)
    try:
        for off, n in zip(run_off, run_size):
            while n:  # a short read only at the end of the file
                got = os.preadv(fd, [view[pos:pos + min(n, _MAX_READ)]], off)
                if got <= 0:
                    raise as_read(OSError(f"{location}: short read at byte {off} ({n} bytes "
                                          "missing): the spill file is truncated"))
                pos, off, n = pos + got, off + got, n - got
    finally:
        os.close(fd)
    return out


def read_records(location: str | os.PathLike, dtype, width: int, start: int,
                 stop: int) -> np.ndarray:
    """Records ``start .. stop - 1`` of a flat file of ``dtype[*, width]``.

    Returns:
        dtype[stop - start, width] (a private copy).

    Raises:
        OSError: as :func:`read_spill`.
    """
    item = np.dtype(dtype).itemsize * width
    raw = read_spill(location, [start * item], [max(0, stop - start) * item])
    return raw.view(dtype).reshape(-1, width)


# -- gathering segments straight into the rows being laid out ------------------------------------

_pread = types.ExternalFunction("pread", types.int64(types.int32, types.voidptr, types.uint64,
                                                     types.int64))


@njit(cache=True, nogil=True)
def _pread_segments(fds, src, lens, out, dest):
    """``out[dest[q] .. dest[q] + lens[q] - 1]`` = items ``src[q] ..`` of the file open as
    ``fds[q]``, for every segment q (int32 fds, int64 src/lens/dest in items of ``out``).
    Returns the first segment that could not be read whole (a short read or an error), or -1.
    Private: called only by :func:`gather_spill`, which checks the bounds."""
    base = out.ctypes.data
    item = out.itemsize
    for q in range(src.shape[0]):
        want = lens[q] * item
        done = 0
        while done < want:
            got = _pread(fds[q], base + dest[q] * item + done, want - done,
                         src[q] * item + done)
            if got <= 0:
                return q
            done += got
    return -1


def _pread_segments_python(fds, src, lens, out, dest):
    """:func:`_pread_segments` with ``os.preadv`` into a view of ``out``: the one used when
    Numba's JIT is disabled (``NUMBA_DISABLE_JIT=1``), where the kernel's ``pread``, a C
    function typed for compiled code only, cannot be called."""
    view = memoryview(out).cast("B")
    item = out.itemsize
    for q in range(src.shape[0]):
        fd, at, want = int(fds[q]), int(dest[q]) * item, int(lens[q]) * item
        off = int(src[q]) * item
        done = 0
        while done < want:
            got = os.preadv(fd, [view[at + done:at + min(want, done + _MAX_READ)]], off + done)
            if got <= 0:
                return q
            done += got
    return -1


if numba.config.DISABLE_JIT:
    _pread_segments = _pread_segments_python  # noqa: F811


def _open_files_limit() -> int:
    """Soft limit of open files, raised towards the hard limit (at most 65,536) once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return 65536 if soft == resource.RLIM_INFINITY else int(soft)


class SpillReader:
    """Read-only descriptors of the local spill files one task gathers from, kept open for the
    task (its files do not change while it runs) and closed on exit; use as a context manager.

    At most :attr:`limit` stay open (the least recently used are closed first): an eighth of
    the process's open-files limit, which is raised towards the hard limit once, so a pack of
    thousands of read parts keeps them open in every worker.
    """

    def __init__(self) -> None:
        self._fds: "OrderedDict[str, int]" = OrderedDict()
        self.limit = max(16, _open_files_limit() // 8)

    def __enter__(self) -> "SpillReader":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def fds(self, paths: list[str]) -> tuple[np.ndarray, list[int]]:
        """(int32 descriptor of each path, descriptors opened for this call only, beyond the
        limit: close them with :meth:`release` after use)."""
        out = np.empty(len(paths), dtype=np.int32)
        extra: list[int] = []
        wanted = set(paths)
        new = sum(p not in self._fds for p in wanted)
        while self._fds and len(self._fds) + new > self.limit:
            p, fd = next(iter(self._fds.items()))  # least recently used
            if p in wanted:
                break
            del self._fds[p]
            os.close(fd)
        for i, p in enumerate(paths):
            fd = self._fds.get(p)
            if fd is None:
                fd = _open_read(p)
                if len(self._fds) >= self.limit:
                    extra.append(fd)
                else:
                    self._fds[p] = fd
            else:
                self._fds.move_to_end(p)
            out[i] = fd
        return out, extra

    @staticmethod
    def release(extra: list[int]) -> None:
        for fd in extra:
            os.close(fd)

    def close(self) -> None:
        """Close every descriptor."""
        while self._fds:
            os.close(self._fds.popitem()[1])

    def gather(self, locations: list[str], which: np.ndarray, src: np.ndarray,
               lens: np.ndarray, out: np.ndarray, dest: np.ndarray) -> np.ndarray:
        """:func:`gather_spill` with this reader's descriptors."""
        return gather_spill(locations, which, src, lens, out, dest, reader=self)

    def pinned(self, locations: list[str]) -> np.ndarray | None:
        """int32 descriptors of local ``locations``, kept open until :meth:`close` (None when one
        is in an object store or they are more than :attr:`limit`): for :meth:`read_into`."""
        if len(locations) > self.limit or any(is_remote(loc) for loc in locations):
            return None
        fds, extra = self.fds([str(loc) for loc in locations])
        if extra:
            self.release(extra)
            return None
        return fds

    def read_into(self, fds: np.ndarray, src: np.ndarray, lens: np.ndarray, out: np.ndarray,
                  dest: np.ndarray, locations: list[str] | None = None,
                  which: np.ndarray | None = None) -> np.ndarray:
        """Items ``src[q] ..`` of the file open as ``fds[q]`` (from :meth:`pinned`) to
        ``out[dest[q] ..]``, ``lens[q]`` each: one ``pread`` per segment, nothing else per call
        (the hot path of a writing task).

        Raises:
            ValueError: a segment outside ``out``.
            OSError: a short read (named by ``locations[which[q]]`` when given).
        """
        if not src.size:
            return out
        if dest[-1] + lens[-1] > out.size or dest.min() < 0 or (dest + lens).max() > out.size:
            raise ValueError("a segment lies outside out")
        bad = _pread_segments(fds, src, lens, out, dest)
        if bad >= 0:
            where = (locations[int(which[bad])] if locations is not None and which is not None
                     else f"descriptor {int(fds[bad])}")
            size = out.dtype.itemsize
            raise as_read(OSError(f"{where}: short read of {int(lens[bad]) * size} bytes at "
                                  f"byte {int(src[bad]) * size}: the spill file is truncated "
                                  "or unreadable"))
        return out


def gather_spill(locations: list[str], which: np.ndarray, src: np.ndarray, lens: np.ndarray,
                 out: np.ndarray, dest: np.ndarray, *,
                 reader: SpillReader | None = None) -> np.ndarray:
    """Copy segments of spill files into a buffer: items ``src[q] .. src[q] + lens[q] - 1`` of
    file ``locations[which[q]]`` go to ``out[dest[q] ..]``, for every segment ``q``.

    Local files are read with one ``pread`` per segment straight into ``out`` (about the cost
    of a copy in memory: 0.07 CPU-s for 100,000 segments of 50 M tokens from the page cache);
    files in an object store with :func:`read_spill` (one ranged GET per run of nearby
    segments), then copied.

    Args:
        locations: spill files (paths or URIs), all of ``out``'s item type.
        which: int[S], file of each segment (index into ``locations``).
        src, lens, dest: int64[S], in items.
        out: 1-D C-contiguous writable array (int32 tokens or uint8 flags).
        reader: keeps the local files open between calls (None: opened and closed here).

    Returns:
        ``out``.

    Raises:
        ValueError: a segment outside ``out``.
        OSError: a file cannot be read or is shorter than asked (truncated).
    """
    src = np.ascontiguousarray(src, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    dest = np.ascontiguousarray(dest, dtype=np.int64)
    which = np.asarray(which, dtype=np.int64)
    if not src.size:
        return out
    if out.ndim != 1 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writable 1-D C-contiguous array")
    if lens.min() < 0 or src.min() < 0 or dest.min() < 0 or (dest + lens).max() > out.size:
        raise ValueError("a segment lies outside out")
    size = out.dtype.itemsize
    if any(is_remote(loc) for loc in locations):
        for f in np.unique(which).tolist():
            sel = which == f
            if is_remote(locations[f]):
                got = read_spill(locations[f], src[sel] * size, lens[sel] * size).view(out.dtype)
                starts = np.zeros(int(sel.sum()), dtype=np.int64)
                np.cumsum(lens[sel][:-1], out=starts[1:])
                gather_segments(got, starts, lens[sel], out, dest[sel])
            else:
                gather_spill([locations[f]], np.zeros(int(sel.sum()), np.int64), src[sel],
                             lens[sel], out, dest[sel], reader=reader)
        return out
    own = reader is None
    reader = SpillReader() if own else reader
    try:
        fds, extra = reader.fds([str(loc) for loc in locations])
        try:
            bad = _pread_segments(fds[which], src, lens, out, dest)
        finally:
            reader.release(extra)
    finally:
        if own:
            reader.close()
    if bad >= 0:
        loc = locations[int(which[bad])]
        raise as_read(OSError(f"{loc}: short read of {int(lens[bad]) * size} bytes at byte "
                              f"{int(src[bad]) * size}: the spill file is truncated or "
                              "unreadable"))
    return out


def remove_spill(location: str | os.PathLike) -> None:
    """Delete a spill file if it exists."""
    try:
        os.unlink(location)
    except FileNotFoundError:
        pass


class DocSpill:
    """A window's tokens (or target flags) in input order, held while its rows are rewritten in
    row order (an object-store scratch only, :mod:`packtool.pipeline.plan`).

    The first ``memory_items`` items are held in memory as they were written (the buffers
    themselves, no copy: the caller must not reuse them); from the first write that does not
    fit on, everything goes to the spill file ``location`` (through :func:`spill_writer`). Each
    write holds whole documents, so no document lies partly in memory and partly in the file.
    Use as a context manager: on exit the buffers are dropped and the file removed.

    Args:
        location: the spill file, created only when needed.
        dtype: item type (``int32`` tokens, ``uint8`` flags).
        memory_items: items held in memory at most.
    """

    def __init__(self, location: str | os.PathLike, dtype, memory_items: int):
        self.location = location
        self.dtype = np.dtype(dtype)
        self.memory_items = max(0, int(memory_items))
        self._parts: list[np.ndarray] = []  # the buffers written, held as they are (no copy)
        self._firsts = [0]  # item number of each part's first item, then the end
        self.held = 0  #: items in memory (the first ones)
        self.items = 0  #: items written
        self._stack = ExitStack()
        self._file = None

    def __enter__(self) -> "DocSpill":
        return self

    def __exit__(self, *exc) -> bool:
        self.remove()
        return False

    def write(self, data) -> int:
        """Append ``data`` (a buffer of whole documents' items, kept as it is while it fits in
        memory); returns its bytes."""
        arr = np.frombuffer(data, dtype=self.dtype)
        if self._file is None and self.held + arr.size <= self.memory_items:
            self._parts.append(arr)
            self.held += arr.size
            self._firsts.append(self.held)
        else:
            if self._file is None:
                self._file = self._stack.enter_context(spill_writer(self.location))
            self._file.write(memoryview(arr))
        self.items += arr.size
        return arr.nbytes

    def finish(self) -> None:
        """Close the file (all writes done); reading may start."""
        self._stack.close()

    def gather(self, src: np.ndarray, lens: np.ndarray, out: np.ndarray | None = None
               ) -> np.ndarray:
        """Items ``src[q] .. src[q] + lens[q] - 1`` of every segment ``q`` (each inside one
        document), back to back: from memory, or with :func:`read_spill` from the file.

        Args:
            out: a buffer of at least ``sum(lens)`` items of this dtype to fill (reused by the
                caller), or None (a new one).

        Returns:
            dtype[sum(lens)] (the start of ``out`` when given).

        Raises:
            OSError: the file cannot be read.
        """
        src = np.asarray(src, dtype=np.int64)
        lens = np.asarray(lens, dtype=np.int64)
        total = int(lens.sum())
        out = np.empty(total, dtype=self.dtype) if out is None else out[:total]
        dest = np.zeros(lens.size, dtype=np.int64)
        if lens.size:
            np.cumsum(lens[:-1], out=dest[1:])
        part = np.searchsorted(np.asarray(self._firsts), src, side="right") - 1  # shape: (S,)
        for k in np.unique(part).tolist():
            if k >= len(self._parts):
                continue
            sel = part == k
            gather_segments(self._parts[k], src[sel] - self._firsts[k], lens[sel], out, dest[sel])
        far = src >= self.held
        if not far.any():
            return out
        size = self.dtype.itemsize
        got = read_spill(self.location, (src[far] - self.held) * size,
                         lens[far] * size).view(self.dtype)
        return gather_segments(got, np.concatenate([[0], np.cumsum(lens[far])[:-1]]),
                               lens[far], out, dest[far])

    def remove(self) -> None:
        """Drop the buffer and delete the file."""
        self._stack.close()
        self._parts, self._firsts = [], [0]
        self.held = 0
        if self._file is not None:
            remove_spill(self.location)
            self._file = None
