"""What only an object store needs: coalesced ranged reads, the lock object, pending uploads.

Paths, listings, reads, whole-object writes and deletes in a store go through
:class:`packtool.location.StoreURI` like any local path. This module holds the rest:

- **Ranged reads** of window spills (:func:`read_ranges`, :func:`read_session`): many small
  pieces of one object become a few GETs, read ahead within a session.
- **The lock object** of an OUTPUT in a store (:func:`take_lock`): a store has no exclusive
  create, so the lock is an object naming its holder, written and read back. The holder is known
  by host, boot id, process id and process start time, so a process id reused by another
  process after a kill never passes for the holder (a rerun takes a dead run's lock over).
- **Pending multipart uploads** (:func:`abort_uploads`): a process killed while it uploads a
  large object leaves an unfinished multipart upload, invisible in listings but stored and billed
  by S3; the cleanup of a pack and every rerun abort those under OUTPUT.

Filesystems are opened once per process and URI root (:meth:`packtool.location.StoreURI.filesystem`);
S3 takes its endpoint and credentials from the URI's options or the environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) of the process that opens it, so every node of
a cluster needs them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from contextlib import ExitStack, contextmanager

import pyarrow as pa

from packtool.errors import OutputError, first_line, install_hint
from packtool.formats.manifest import (KINDS, LOCK_NAME, PACKED_KIND, marker_kind,
                                       run_words)
from packtool.formats.holders import holder, holder_is_gone, holder_is_here
from packtool.formats.holders import read_json as _read_json
from packtool.location import Location, StoreError

__all__ = ["read_ranges", "read_session", "take_lock", "release_lock", "holder",
           "holder_is_gone", "holder_is_here", "lock_of", "abort_uploads", "STORE_ERRORS"]

log = logging.getLogger(__name__)

#: What a store call raises on failure (pyarrow maps most to OSError).
STORE_ERRORS = (OSError, pa.ArrowException)


#: Ranges of one object closer than this many bytes are fetched with one GET (the bytes
#: between them are read and dropped): a request costs milliseconds, a MiB about one.
HOLE_LIMIT = 1 << 20
#: ... up to a GET of this many bytes.
SPAN_LIMIT = 64 << 20


#: Within a :func:`read_session`, a GET reads at least this many bytes (clipped to the object),
#: so the next row groups' ranges of one spill, which follow, are served from memory.
READ_AHEAD = 256 << 10
#: Bytes a :func:`read_session` keeps at most (the least recently used object's span goes).
SESSION_BUDGET = 64 << 20

_LOCAL = threading.local()


class _Session:
    """Open objects and the last span read of each (see :func:`read_session`)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.files: dict = {}
        self.spans: "OrderedDict[str, tuple[int, memoryview]]" = OrderedDict()
        self.held = 0

    def file(self, uri: str):
        fh = self.files.get(uri)
        if fh is None:
            fh = self.files[uri] = Location.parse(uri).open_input()  # one HEAD per object
        return fh

    def read(self, uri: str, lo: int, hi: int) -> memoryview:
        got = self.spans.get(uri)
        if got is not None and got[0] <= lo and hi <= got[0] + len(got[1]):
            self.spans.move_to_end(uri)
            return got[1][lo - got[0]:hi - got[0]]
        fh = self.file(uri)
        end = min(max(hi, lo + READ_AHEAD), max(hi, fh.size()))
        data = memoryview(fh.read_at(end - lo, lo))
        if got is not None:
            self.held -= len(self.spans.pop(uri)[1])
        self.spans[uri] = (lo, data)
        self.held += len(data)
        while self.held > self.budget and len(self.spans) > 1:
            self.held -= len(self.spans.popitem(last=False)[1][1])
        return data[:hi - lo]

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()
        self.files.clear()
        self.spans.clear()


@contextmanager
def read_session(budget: int = SESSION_BUDGET):
    """Within the block (this thread), :func:`read_ranges` keeps every object it reads open (one
    HEAD per object instead of one per call) and reads ahead at least :data:`READ_AHEAD` bytes
    per GET, keeping up to ``budget`` bytes. For readers whose objects do not change while the
    block runs (a shard task reading finished windows, which read each spill forwards)."""
    prev = getattr(_LOCAL, "session", None)
    session = _LOCAL.session = _Session(budget)
    try:
        yield session
    finally:
        _LOCAL.session = prev
        session.close()


def read_ranges(uri: str, sizes: list[int], offsets: list[int]) -> bytes:
    """Bytes ``offsets[i] .. offsets[i] + sizes[i] - 1`` of object ``uri`` for every ``i``,
    back to back in the order given.

    Ranges are sorted and those closer than :data:`HOLE_LIMIT` are coalesced into one ranged GET
    (at most :data:`SPAN_LIMIT` bytes), so many small pieces of one spill cost a few requests;
    inside a :func:`read_session` the object stays open and GETs read ahead.

    Raises:
        OSError: the object cannot be read, or is shorter than a range.
    """
    uri = str(uri)
    sizes, offsets = list(map(int, sizes)), list(map(int, offsets))
    order = sorted(range(len(sizes)), key=offsets.__getitem__)
    spans: list[list[int]] = []  # [start, end, first index in order, last index + 1]
    for k, i in enumerate(order):
        lo, hi = offsets[i], offsets[i] + sizes[i]
        if spans and lo - spans[-1][1] <= HOLE_LIMIT and hi - spans[-1][0] <= SPAN_LIMIT:
            spans[-1][1] = max(spans[-1][1], hi)
            spans[-1][3] = k + 1
        else:
            spans.append([lo, hi, k, k + 1])
    pieces: list = [b""] * len(sizes)
    session = getattr(_LOCAL, "session", None)
    with ExitStack() as stack:
        if session is None:
            fh = stack.enter_context(Location.parse(uri).open_input())
        for lo, hi, a, b in spans:
            data = (session.read(uri, lo, hi) if session is not None
                    else memoryview(fh.read_at(hi - lo, lo)))
            if len(data) != hi - lo:
                raise OSError(f"{uri}: short read ({len(data)} of {hi - lo} bytes at {lo})")
            for i in order[a:b]:
                pieces[i] = data[offsets[i] - lo:offsets[i] - lo + sizes[i]]
    return b"".join(pieces)


# -- the lock object ----------------------------------------------------------------------------

def lock_of(uri) -> dict | None:
    """What the lock object of OUTPUT ``uri`` (a store prefix) says: its holder
    (:func:`holder`) and the ``kind`` of output it writes; None when there is none (or it
    cannot be read or parsed)."""
    return _read_json(Location.parse(uri).join(LOCK_NAME))


def take_lock(uri, *, overwrite: bool, kind: str | None = PACKED_KIND,
              command: str | None = None) -> dict:
    """Write the lock object of OUTPUT ``uri`` and read it back; returns what was written (who
    holds it, :func:`holder`, and the ``kind`` of output the run writes, so that a refused run
    is told whether a pack or a tokenize holds it; ``command``: the packtool command taking
    it when it writes no output of a kind (``upgrade``; ``kind`` None), named instead).

    A lock held by another live run refuses the run with its id and host, ``overwrite`` or not.
    A lock whose holder is gone (:func:`holder_is_gone`) is taken over, so a plain rerun
    resumes; a lock from another host (whose holder cannot be asked) is honoured unless
    ``overwrite``. Advisory: pyarrow exposes no conditional PUT, so two
    runs started within the same moment could both pass the first check; the read-back refuses
    the one whose lock was overwritten.

    Raises:
        OutputError: the lock is held, or OUTPUT cannot be written.
    """
    out = Location.parse(uri)
    key = out.join(LOCK_NAME)
    try:
        held = _read_json(key)
        here = held is not None and holder_is_here(held)
        # a holder on this host is asked whether it lives (--overwrite never takes a live
        # run's lock: both would write the same shards); one on another host cannot be asked
        if held is not None and not holder_is_gone(held) and (here or not overwrite):
            raise OutputError(f"{out.display}: another packtool {_holder_words(held, out)} "
                              f"(run {held.get('run', '?')} "
                              f"on {held.get('host', '?')}, pid {held.get('pid', '?')}) is writing "
                              f"this OUTPUT (lock {LOCK_NAME}); wait for it to end"
                              + ("" if here else ", or pass --overwrite if it was killed (its "
                                 "host cannot be asked)"))
        mine = {**holder(), **({"kind": kind} if kind else {}),
                **({"command": command} if command else {})}
        key.publish_bytes(json.dumps(mine).encode())
    except STORE_ERRORS as exc:
        told = out.store_error(exc, "cannot write")
        if isinstance(told, StoreError):  # credentials, bucket, endpoint: one wording
            raise OutputError(str(told)) from None
        raise OutputError(f"{out.display}: cannot write ({first_line(exc)}); check the URI and "
                          "the credentials") from None
    now = _read_json(key)
    if now != mine:
        raise OutputError(f"{out.display}: another packtool {_holder_words(now or {}, out)} "
                          f"took the lock {LOCK_NAME} at the same time; wait for it to end or "
                          "choose another OUTPUT")
    return mine


def _holder_words(held: dict, out) -> str:
    """What the run holding lock ``held`` of OUTPUT ``out`` is, for a message: the command its
    lock records (``upgrade``), else the kind it records, else the one OUTPUT's in-progress
    marker says (``pack``, ``tokenize run``; ``run`` when none says)."""
    command = held.get("command")
    if isinstance(command, str) and command.isidentifier():
        return command
    kind = held.get("kind")
    return run_words(kind if kind in KINDS else marker_kind(out))


def release_lock(uri, mine: dict) -> None:
    """Delete the lock object of OUTPUT ``uri`` when it is still ``mine``."""
    key = Location.parse(uri).join(LOCK_NAME)
    try:
        if _read_json(key) == mine:
            key.delete()
    except STORE_ERRORS:
        pass


# -- pending multipart uploads --------------------------------------------------------------------

_WARNED = threading.Event()


def abort_uploads(uri) -> int:
    """Abort every unfinished multipart upload under prefix ``uri`` (S3 only).

    Returns:
        How many were aborted (0 for other stores, or when boto3, which lists them, is not
        installed: said once in the log).

    Raises:
        OSError: the store refused the listing or an abort.
    """
    loc = Location.parse(uri)
    if loc.is_local or loc.scheme != "s3":
        return 0
    client = loc.s3_client()
    if client is None:
        if not _WARNED.is_set():
            _WARNED.set()
            log.warning("%s: boto3 is not installed, so unfinished multipart uploads left by a "
                        "killed run cannot be listed and aborted (%s)", loc.display,
                        install_hint("s3"))
        return 0
    bucket, prefix = loc.bucket_key
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    aborted = 0
    try:
        kw = {"Bucket": bucket, "Prefix": prefix}
        while True:
            page = client.list_multipart_uploads(**kw)
            for up in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=bucket, Key=up["Key"],
                                              UploadId=up["UploadId"])
                aborted += 1
            if not page.get("IsTruncated"):
                break
            kw.update(KeyMarker=page.get("NextKeyMarker", ""),
                      UploadIdMarker=page.get("NextUploadIdMarker", ""))
    except Exception as exc:  # botocore's errors are not OSError
        raise OSError(f"{loc.display}: cannot abort unfinished uploads ({first_line(exc)})") from None
    return aborted
