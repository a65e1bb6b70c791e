"""Spill files: every file a pack writes into its scratch directory and reads back.

A window task (:mod:`packtool.pipeline.plan`) writes, inside the window's directory of the
scratch directory, flat files of raw native-endian numbers; the writing tasks
(:mod:`packtool.pipeline.layout`) read ranges of them back. All writes go through
:func:`spill_writer` (into the window task's local work directory, which
:func:`packtool.output.publish_window` renames into the scratch directory or uploads to the
scratch prefix of an object store) and all reads through :func:`read_spill`, given a location
string (a path or a URI), byte offsets and sizes. The files of a window (names below):

- :data:`DOC_TOKENS` (and :data:`DOC_TARGETS`): the window's tokens in input order beyond what
  the window task holds in memory (:class:`DocSpill`), written while reading, read back once by
  the same task while it writes the files below, then removed.
- :data:`ROW_TOKENS` int32: the tokens of the window's rows in the window's row order (the
  segments of a row back to back, rows back to back, no padding); :data:`ROW_TARGETS` uint8 beside
  it when the input had a labels column (1 = target, 0 = input label -100).
- :data:`ROW_INDEX` int64[rows + 1, 2]: for each row in that order, its first segment in
  :data:`SEGMENTS` and its first token in :data:`ROW_TOKENS` (last entry: the totals).
- :data:`SEGMENTS` int64[segments, 3]: each segment's length, window-local document number and
  token offset in its document; :data:`SEG_SOURCES` int32[segments] beside it with
  ``--source-column`` (each segment's source id in the window's own table).

Local reads use ``pread`` into a private buffer, never a memory map, so the spill's pages never
count in a task's resident set (see :mod:`packtool.pipeline.layout`); in an object store they
are ranged GETs (:func:`packtool.formats.object_store.read_ranges`).
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from typing import BinaryIO, Iterator

import numpy as np

from packtool.core.layout import gather_segments
from packtool.formats.reader import is_remote

__all__ = ["spill_writer", "read_spill", "read_records", "remove_spill", "DocSpill", "DOC_TOKENS",
           "DOC_TARGETS", "ROW_TOKENS", "ROW_TARGETS", "ROW_INDEX", "SEGMENTS", "SEG_SOURCES"]

DOC_TOKENS = "docs.int32"
DOC_TARGETS = "docs-targets.uint8"
ROW_TOKENS = "rows.int32"
ROW_TARGETS = "rows-targets.uint8"
ROW_INDEX = "rows-index.int64"
SEGMENTS = "segments.int64"
SEG_SOURCES = "segment-sources.int32"

#: Bytes of the largest single ``pread`` (Linux reads at most about 2 GiB per call).
_MAX_READ = 1 << 30


@contextmanager
def spill_writer(location: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file to append spill bytes to (``write(buffer)``), closed on exit.

    Args:
        location: the file to create (its directory exists).

    Raises:
        OSError: it cannot be created or written (a full disk: ``ENOSPC``).
    """
    with open(location, "wb") as f:
        yield f


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
    fd = os.open(location, os.O_RDONLY)
    try:
        for off, n in zip(run_off, run_size):
            while n:  # a short read only at the end of the file
                got = os.preadv(fd, [view[pos:pos + min(n, _MAX_READ)]], off)
                if got <= 0:
                    raise OSError(f"{location}: short read at byte {off} ({n} bytes missing): "
                                  "the spill file is truncated")
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


def remove_spill(location: str | os.PathLike) -> None:
    """Delete a spill file if it exists."""
    try:
        os.unlink(location)
    except FileNotFoundError:
        pass


class DocSpill:
    """A window's tokens (or target flags) in input order, as the window task reads them.

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
