"""The object-store backend of OUTPUT (``s3://bucket/prefix``, ``gs://...``): what
:class:`packtool.output.Output` and the pack's tasks call when OUTPUT is a URI.

An object store has no rename, no hard links and no atomic "create if absent", which a local
OUTPUT relies on (temporary names, ``os.replace``, a lock file). Every node of a cluster reaches
it, so the pack writes there directly and nothing a task needs lives on the driver's disk:

- **Shards.** A shard task writes its shard to a file in its own node's temporary directory,
  then puts it under its final key with one call (:func:`put_file`, one PUT or one multipart
  upload done in native code): an object appears whole or not at all, and a retried task puts
  the same bytes. A Python exception cannot stop that call halfway (pyarrow's output streams
  publish what was written so far when closed on an exception, so no Python loop writes a final
  object).
- **Scratch.** Window spills (tokens in row order, row index, segments) go under
  ``OUTPUT/.packtool-tmp/`` in the store; a shard task on any node reads the ranges it needs
  with ranged GETs (:func:`read_ranges`, called by :func:`packtool.pipeline.spill.read_spill`).
- **Lock.** An object (:data:`~packtool.formats.manifest.LOCK_NAME`: run id, host, pid) written
  before anything else and read back; see :func:`take_lock`.

Filesystems are opened once per process and URI root (:func:`store_of`); S3 takes its endpoint
and credentials from the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) of the
process that opens it, so every node needs them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import uuid
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from packtool.errors import OutputError
from packtool.formats.manifest import LOCK_NAME

__all__ = ["store_of", "join", "read_bytes", "read_json", "write_bytes", "put_file", "size_of",
           "listing", "delete", "delete_tree", "read_ranges", "read_session", "take_lock",
           "release_lock",
           "node_temp", "STORE_ERRORS"]

#: What a store call raises on failure (pyarrow maps most to OSError).
STORE_ERRORS = (OSError, pa.ArrowException)

_FS: dict[str, pafs.FileSystem] = {}
_FS_LOCK = threading.Lock()


def join(uri: str, *names: str) -> str:
    """``uri`` with ``names`` appended, ``/``-separated (a URI is not a ``pathlib`` path)."""
    return "/".join([str(uri).rstrip("/"), *names])


def store_of(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) of ``uri``; one filesystem per process and URI root
    (scheme, bucket and query), so a task's many reads share one client.

    Raises:
        InputError: the URI cannot be opened (unknown scheme, no credentials, ...).
    """
    from packtool.formats.reader import _location, filesystem_of

    loc = _location(uri)
    scheme, _, rest = loc.partition("://")
    rest, _, query = rest.partition("?")
    root = f"{scheme}://{rest.split('/', 1)[0]}?{query}"
    with _FS_LOCK:
        fs = _FS.get(root)
    if fs is None:
        fs, path, _ = filesystem_of(loc)
        with _FS_LOCK:
            _FS.setdefault(root, fs)
        return fs, path
    return fs, rest.rstrip("/")


def read_bytes(uri: str) -> bytes:
    """The whole object ``uri``. Raises ``OSError`` (``FileNotFoundError`` when absent)."""
    fs, path = store_of(uri)
    with fs.open_input_stream(path) as fh:
        return fh.read()


def read_json(uri: str) -> dict | None:
    """The JSON object stored at ``uri``, or None when absent or not a JSON object."""
    try:
        doc = json.loads(read_bytes(uri))
    except (*STORE_ERRORS, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@contextmanager
def _signals_held():
    """Hold SIGINT/SIGTERM (main thread only) until the block ends: a stream closed by an
    exception would publish what was written so far.

    The handlers are swapped for ones that only note the signal, and a noted signal is raised
    again once the previous handlers are back. A signal mask would not do: the kernel hands a
    signal the main thread blocks to any other thread (a worker pool, pyarrow's I/O threads),
    and Python then runs its handler in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: noted.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set in C
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)


def write_bytes(uri: str, data: bytes) -> None:
    """Put ``data`` at ``uri``: small objects (markers, the manifest), buffered and sent with
    one PUT when the stream closes; Ctrl-C is held meanwhile, so the object is whole or absent.
    Large files go through :func:`put_file`."""
    fs, path = store_of(uri)
    with _signals_held():
        with fs.open_output_stream(path) as fh:
            fh.write(data)


def put_file(local: str | os.PathLike, uri: str) -> None:
    """Upload the local file ``local`` to ``uri`` in one native call (whole or not at all)."""
    fs, path = store_of(uri)
    pafs.copy_files(os.fspath(local), path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)


def size_of(uri: str) -> int | None:
    """Size in bytes of object ``uri``, None when absent."""
    fs, path = store_of(uri)
    info = fs.get_file_info(path)
    return info.size if info.type == pafs.FileType.File else None


def listing(uri: str) -> dict[str, pafs.FileInfo]:
    """Entries directly under prefix ``uri`` by name (objects and common prefixes)."""
    fs, path = store_of(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    return {i.path.rsplit("/", 1)[-1]: i for i in infos}


def delete(uri: str) -> None:
    """Delete object ``uri``; absent is fine."""
    fs, path = store_of(uri)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def delete_tree(uri: str) -> None:
    """Delete every object under prefix ``uri``; absent is fine."""
    fs, path = store_of(uri)
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass


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
            fs, path = store_of(uri)
            fh = self.files[uri] = fs.open_input_file(path)  # one HEAD per object
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
            fs, path = store_of(uri)
            fh = stack.enter_context(fs.open_input_file(path))
        for lo, hi, a, b in spans:
            data = (session.read(uri, lo, hi) if session is not None
                    else memoryview(fh.read_at(hi - lo, lo)))
            if len(data) != hi - lo:
                raise OSError(f"{uri}: short read ({len(data)} of {hi - lo} bytes at {lo})")
            for i in order[a:b]:
                pieces[i] = data[offsets[i] - lo:offsets[i] - lo + sizes[i]]
    return b"".join(pieces)


# -- the lock object ----------------------------------------------------------------------------

def _stale(lock: dict) -> bool:
    """True for a lock left by a process of this machine that no longer runs (killed)."""
    if lock.get("host") != socket.gethostname():
        return False  # another machine's run: cannot be told dead from alive
    try:
        os.kill(int(lock.get("pid", -1)), 0)
    except (OSError, ValueError, OverflowError):
        return True
    return False


def take_lock(uri: str, *, overwrite: bool) -> dict:
    """Write the lock object of OUTPUT ``uri`` and read it back; returns what was written.

    A lock held by another live run refuses the run with its id and host. A lock whose process
    is gone from this host (a killed run) is taken over, so a plain rerun resumes; a lock from
    another host is honoured unless ``overwrite``. Advisory: pyarrow exposes no conditional
    PUT, so two runs started within the same moment could both pass the first check; the
    read-back refuses the one whose lock was overwritten.

    Raises:
        OutputError: the lock is held, or OUTPUT cannot be written.
    """
    key = join(uri, LOCK_NAME)
    try:
        held = read_json(key)
        if held is not None and not overwrite and not _stale(held):
            raise OutputError(f"{uri}: another packtool pack (run {held.get('run', '?')} on "
                              f"{held.get('host', '?')}) is writing this OUTPUT (lock "
                              f"{LOCK_NAME}); wait for it to end, or pass --overwrite if it was "
                              "killed")
        mine = {"run": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}
        write_bytes(key, json.dumps(mine).encode())
    except STORE_ERRORS as exc:
        raise OutputError(f"{uri}: cannot write ({_first(exc)}); check the URI and the "
                          "credentials") from None
    if read_json(key) != mine:
        raise OutputError(f"{uri}: another packtool pack took the lock {LOCK_NAME} at the same "
                          "time; wait for it to end or choose another OUTPUT")
    return mine


def release_lock(uri: str, mine: dict) -> None:
    """Delete the lock object of OUTPUT ``uri`` when it is still ``mine``."""
    key = join(uri, LOCK_NAME)
    try:
        if read_json(key) == mine:
            delete(key)
    except STORE_ERRORS:
        pass


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def node_temp(name: str) -> Path:
    """A unique path for ``name`` in this process's temporary directory (``TMPDIR``: on a
    cluster, the node's own disk). The caller removes it."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"packtool-{uuid.uuid4().hex}-{name}"
