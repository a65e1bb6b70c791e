"""Where a file or folder lies: the one place that decides whether a path is local or in a store.

Every INPUT, OUTPUT, shard, scratch file and cache entry packtool names is a :class:`Location`,
parsed once by :meth:`Location.parse` from what the user typed:

- a local path (``out/``, ``/data/x.parquet``) or a ``file:`` URI (``file:///abs/out``,
  ``file://localhost/abs/out``, or ``file:/abs/out`` as :mod:`pathlib` folds it),
  percent-decoded as RFC 8089 and pyarrow read it (``file:///a/my%20data`` names
  ``/a/my data``; a ``?query`` or ``#fragment`` is no part of the path): a :class:`LocalPath`.
  A ``file:`` URI naming another host (``file://example.com/p``, ``file://out``) or no
  absolute path (``file:out``) is refused (:class:`~packtool.errors.LocationError`), never
  read as a path under the filesystem root or the working directory;
- a URI of any filesystem pyarrow provides (``s3://bucket/prefix``, ``gs://...``,
  ``hdfs://host:port/path``), with the filesystem's options in its query
  (``s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http``): a :class:`StoreURI`.
  A URI folded by :mod:`pathlib` (``s3:/bucket/key``) is read as the URI. Its key is kept as
  spelt, trailing ``/`` aside; one holding a ``.``, ``..`` or empty segment (``s3://b/./out``,
  ``s3://b//out``), which pyarrow's clients address differently from call to call, is refused
  (:class:`~packtool.errors.LocationError` naming the plain spelling), never rewritten.

A location made from another (:meth:`Location.join`, a listing) keeps its filesystem and its
options, so a file found under ``s3://b/p?endpoint_override=...`` is reopened through the same
endpoint. Store filesystems are opened once per process and root (scheme, bucket or host, query)
and never shared across ``fork`` (each DataLoader worker opens its own client).

The two kinds offer the same operations (``listdir``, ``read_bytes``, ``open_input``,
``publish_bytes``, ``publish_file``, ``delete``, ...), so callers never branch on the kind. The
one difference is how a file appears whole: a local file is written under a unique temporary name
and renamed (:meth:`LocalPath.publish_bytes`); a store object is put in one call, which is whole
or absent (:meth:`StoreURI.publish_bytes`).

This module imports neither pyarrow nor numba: the filesystem calls are
:mod:`packtool.formats.filesystem`'s, loaded when a file is opened or a store listed.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from packtool.errors import LocationError, first_line

__all__ = ["Location", "LocalPath", "StoreURI", "Entry", "StoreError", "location", "is_store",
           "display", "sweep_stages", "STAGE_HOLDER", "STAGE_UNRECORDED_DAYS", "make_dirs",
           "remove_made", "published_temp_of", "for_tasks", "task_node", "remember_task_node",
           "shared_storage_fix"]

#: The temporary name :meth:`LocalPath.publish_bytes` writes a file under before its rename
#: (``.NAME.<32 hex>.tmp``): what a process killed between the two leaves behind.
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{32}\.tmp")


def published_temp_of(name: str) -> str | None:
    """The file a temporary named ``name`` was being published as (:meth:`LocalPath.
    publish_bytes`, killed before its rename: ``..packtool-manifest.parquet.<hex>.tmp`` ->
    ``.packtool-manifest.parquet``); None for any other name."""
    m = _TEMP_NAME.fullmatch(name)
    return m.group("name") if m else None


#: ``scheme:`` + ``//`` (or ``/``, as pathlib folds it); a scheme of two characters or more, so a
#: Windows drive letter is not one
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(//|/(?!/))")
#: a ``file:`` URI's scheme, then ``//`` and its host (group 1: none, empty, ``localhost``,
#: another) when given; the absolute path it names follows
_FILE_URI = re.compile(r"^file:(?://([^/?#]*))?", re.IGNORECASE)
#: a character of a glob pattern (the shell's, :mod:`fnmatch`'s): packtool reads names as they
#: are, so a missing name holding one was most likely meant as a pattern
_PATTERN = re.compile(r"[*?\[]")
#: the hosts a ``file:`` URI may name: this machine (RFC 8089: ``localhost`` is no host)
_LOCAL_HOSTS = ("", "localhost")
#: Words of a store error (pyarrow's S3 and GCS messages): the network failed ...
_NETWORK_WORDS = ("NETWORK_CONNECTION", "curlCode", "resolve host", "Connection refused",
                  "Couldn't connect")
#: ... a gs:// client found no credentials to get a token with (on a machine outside Google
#: Cloud it then asks the metadata server, which it cannot resolve: a network error)
_GCS_NO_TOKEN = "Could not create a OAuth2 access token"
#: ... the store refused the credentials ...
_DENIED_WORDS = ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY_ID", "InvalidAccessKeyId",
                 "SIGNATURE_DOES_NOT_MATCH", "SignatureDoesNotMatch", "EXPIRED_TOKEN",
                 "ExpiredToken", "HTTP status 403", "403 Forbidden", "Permission denied")
#: ... the bucket does not exist
_NO_BUCKET_WORDS = ("NO_SUCH_BUCKET", "NoSuchBucket")
#: URI options whose values are secrets: never shown in messages or recorded in a manifest
_SECRET_OPTIONS = ("access_key", "secret_key", "session_token")
#: The file a store's staging directory (:meth:`StoreURI.stage`) holds first: the JSON record of
#: the process that made it (:func:`packtool.formats.holders.holder`); never uploaded
STAGE_HOLDER = ".packtool-holder.json"
#: Days after which a store's staging directory without a readable holder record (made by a
#: packtool before these records) is removed when nothing in it changed since
STAGE_UNRECORDED_DAYS = 7
#: The name of a store's staging directory in the temporary directory: ``packtool-``, 32 hex
#: digits, ``-`` and the unit's name (``tempfile.mkdtemp(prefix="packtool-")``'s are not)
_STAGE_NAME = re.compile(r"^packtool-[0-9a-f]{32}-.")


class StoreError(OSError):
    """A store failure already worded as one line naming the URI and what to check
    (:meth:`Location.store_error`)."""


@dataclass(frozen=True)
class Entry:
    """One entry of a listing: its name, whether it is a folder, its size and mtime (files)."""

    name: str
    is_dir: bool
    size: int = 0  #: bytes (0 for a folder)
    mtime_ns: int = 0  #: modification time in ns (0 when the store does not say)


class Location:
    """A local path or a store URI; build one with :meth:`parse` (or :func:`location`).

    Subclasses: :class:`LocalPath`, :class:`StoreURI`. Instances are frozen, hashable and
    picklable (a store's client is not part of the value).
    """

    is_local: bool = True

    @staticmethod
    def parse(given: "str | os.PathLike | Location") -> "Location":
        """The location ``given`` names.

        Args:
            given: a path (str or path-like), a ``file:`` URI, a store URI with optional query
                options, or a :class:`Location` (returned as is).

        Raises:
            LocationError: an empty string; a ``file:`` URI that names another machine
                (``file://example.com/p``, ``file://t3relout``) or no absolute path
                (``file:t21/x``); a store URI whose key holds a ``.``, ``..`` or empty
                segment (``s3://b/./out``, ``s3://b/q/../out``, ``s3://b//out``; a trailing
                ``/`` is none): one line naming the fix, before anything is read or written.
        """
        if isinstance(given, Location):
            return given
        text = os.fspath(given)
        if not text:
            raise LocationError("an empty path names nothing; give a file or directory")
        f = _FILE_URI.match(text)
        if f:
            return LocalPath(Path(_file_uri_path(_file_uri_rest(text, f))))
        m = _SCHEME.match(text)
        if m is None:
            return LocalPath(Path(text))
        rest = text[m.end():]
        rest, _, query = rest.partition("?")
        return _plain_key(StoreURI(m.group(1).lower(), rest.strip("/"), query))

    # -- naming -------------------------------------------------------------------------------
    def join(self, *names: str) -> "Location":
        """The location ``names`` below this one (same filesystem and options)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The last component (file or folder name)."""
        raise NotImplementedError

    def beside(self, suffix: str) -> "Location":
        """The location beside this one named as it, followed by ``suffix`` (``out`` ->
        ``out-holdout``), its name taken from the folder the path names, not from its spelling:
        ``.`` is the working folder (``../dotout-holdout`` from inside ``dotout``), ``..``,
        ``x/..`` and a trailing ``/.`` or ``/`` likewise; a relative path stays relative.

        Returns:
            A location of the same kind (a store's keeps its options).

        Raises:
            LocationError: the location has no name to follow (the filesystem root, a whole
                bucket).
        """
        raise NotImplementedError

    @property
    def display(self) -> str:
        """How messages and manifests name it (store options that are secrets left out)."""
        return str(self)

    def identity(self) -> tuple:
        """A value equal for two names of the same file or folder: locally links followed (a
        trailing slash, relative and absolute paths alike); in a store the URI without
        credentials, its options in any order."""
        raise NotImplementedError

    def store_error(self, exc: BaseException, doing: str = "cannot be read") -> BaseException:
        """One line saying what a store's failure means and what to check, for the failures
        every store call can meet: the store cannot be reached, it refused the credentials, the
        bucket does not exist. ``doing`` says what failed (``cannot be read``, ``cannot write``).
        Returns a :class:`StoreError` for those (one already worded is returned as it is); any
        other error, and every error of a local path, is returned as it is.

        The one place that words these failures: ``pack``, ``tokenize`` and the reader of
        packed outputs (``stats``, ``verify``, ``export``, the loader) all say them so.
        """
        return exc

    def missing(self) -> str:
        """Why nothing is here, for a message (the caller adds the fix): ``no such file or
        directory`` (local), or in a store whether the bucket itself is missing or only the
        prefix (one request more; for a missing bucket :meth:`missing_fix` names what to
        check: the bucket name and the endpoint).

        Raises:
            OSError: the store cannot be asked (:meth:`store_error`'s one line).
        """
        return "no such file or directory"

    def missing_fix(self, fix: str, *, command_line: bool = True,
                    packed_output: bool = False) -> str:
        """The fix a message gives after :meth:`missing`: ``fix`` (``check the INPUT path``);
        but when the name holds a glob pattern (``*``, ``?``, ``[``) where nothing is (locally:
        in the first component that does not exist; a name that exists with such characters
        is read as it is), that packtool does not expand patterns (the shell does), and what
        to do instead:

        - ``packed_output`` (the name is meant as one OUTPUT of ``packtool pack``: ``stats``,
          ``verify``, ``export``, ``upgrade``, the loader): pass one OUTPUT directory (in a
          store: its prefix), on a command line or not; neither the shell's expansion nor the
          folder holding the outputs is one;
        - else on a ``command_line``: leave the pattern unquoted for the shell to expand, or
          pass the folder holding what it matches (named when the pattern has one before it;
          in a store, which no shell expands: the prefix);
        - elsewhere (a Python argument): ``fix``."""
        base = self._pattern_base()
        if base is None:
            return fix
        note = "packtool does not expand patterns (*, ?, [...])"
        if packed_output:
            return (f"{note}; pass one OUTPUT directory of packtool pack" if self.is_local
                    else f"{note}; pass the prefix of one OUTPUT of packtool pack")
        if not command_line:
            return f"{note}; {fix}"
        if self.is_local:
            folder = f"the folder {base}" if base else "the folder holding the files"
            return f"{note}: leave it unquoted for the shell to expand, or pass {folder}"
        return f"{note}, and no shell expands a URI: pass the prefix {base}"

    def _pattern_base(self) -> str | None:
        """The folder (prefix) before the glob pattern in this missing name, as messages name
        it (``""`` for a local pattern with no folder before it); None when the name holds
        none (see :meth:`missing_fix`)."""
        return None

    def overlaps(self, other: "Location") -> bool:
        """True when one of the two lies inside the other (or they are the same)."""
        raise NotImplementedError

    def ancestors(self) -> list["Location"]:
        """The folders holding this one, nearest first (local: of the resolved path, up to the
        root; store: the prefixes up to the bucket)."""
        raise NotImplementedError

    # -- reading ------------------------------------------------------------------------------
    def filesystem(self):
        """(``pyarrow.fs.FileSystem``, path inside it) of this location."""
        raise NotImplementedError

    def entry(self) -> Entry | None:
        """What is there: an :class:`Entry`, or None when nothing is."""
        raise NotImplementedError

    def exists(self) -> bool:
        """True when a file or folder is there."""
        return self.entry() is not None

    def is_dir(self) -> bool:
        """True for a folder (a store prefix holding objects)."""
        e = self.entry()
        return e is not None and e.is_dir

    def is_file(self) -> bool:
        """True for a file (a store object)."""
        e = self.entry()
        return e is not None and not e.is_dir

    def size(self) -> int | None:
        """Bytes of the file, None when there is no file."""
        e = self.entry()
        return e.size if e is not None and not e.is_dir else None

    def version(self) -> tuple | None:
        """A value that changes whenever the file here is replaced or rewritten (compare two
        values of one location; None: no file). One request on a store (S3: its ``ETag``).

        Raises:
            OSError: the store cannot be asked (worded by :meth:`store_error`).
        """
        raise NotImplementedError

    def listdir(self) -> dict[str, Entry]:
        """Entries directly inside this folder by name; empty when it does not exist."""
        raise NotImplementedError

    def read_bytes(self) -> bytes:
        """The whole file. Raises ``OSError`` (``FileNotFoundError`` when absent)."""
        raise NotImplementedError

    def open_input(self):
        """A ``pyarrow`` random-access file on it (``read_at``, ``size``); the caller closes it.

        Raises:
            OSError: it cannot be opened (absent, no permission, the store refused).
        """
        raise NotImplementedError

    # -- writing ------------------------------------------------------------------------------
    def makedirs(self) -> tuple:
        """Create the folder and its parents (a store needs none: a no-op).

        Returns:
            The local folders created (:func:`make_dirs`: outermost first), for
            :func:`remove_made` to take away on a failure; ``()`` in a store.
        """
        return ()

    def publish_bytes(self, data: bytes) -> None:
        """Make ``data`` the file's content, whole or not at all (see the module docstring)."""
        raise NotImplementedError

    def publish_file(self, src: Path) -> None:
        """Make the local file ``src`` this file, whole or not at all; ``src`` is consumed
        (renamed away or uploaded; the caller removes what is left)."""
        raise NotImplementedError

    def delete(self) -> None:
        """Delete the file; absent is fine."""
        raise NotImplementedError

    def move_to(self, dest: "Location") -> None:
        """Make this file ``dest`` (a location of the same folder or store) and remove it here:
        a rename locally; in a store, which has no rename, a copy inside the store (no byte
        passes through this machine), then a delete. ``dest`` is whole or absent at every
        instant.

        Raises:
            OSError: the file is not there, or cannot be moved.
        """
        raise NotImplementedError

    def stage(self, name: str) -> Path:
        """A new local directory where files bound for this folder are written first: inside it
        for a local folder (so a rename publishes them; empty), in this process's temporary
        directory (``TMPDIR``: on a cluster, the node's own disk) for a store (holding only its
        holder record, :data:`STAGE_HOLDER`, so that a later run removes it once this process
        is gone: :func:`sweep_stages`). The caller removes it (:func:`shutil.rmtree`) when
        done.

        Raises:
            OSError: the directory cannot be made (a full disk, no permission).
        """
        raise NotImplementedError

    #: True when a staging directory left behind (a killed or stopped task's) is found again
    #: by :meth:`claim_stage`: inside a local folder; a store's are on the tasks' own disks
    #: (a killed task's is removed by the next run there: :func:`sweep_stages`).
    stages_found_again: bool = True

    def claim_stage(self, name: str, record: str) -> Path | None:
        """Take over a staging directory for ``name`` (from :meth:`stage`) that a killed or
        stopped run left here holding the file ``record``: renamed to a new unique staging
        name, so that of two tasks claiming it one only gets it. None when there is none (a
        store: always, see :attr:`stages_found_again`)."""
        raise NotImplementedError

    def publish_dir(self, work: Path, last: str) -> None:
        """Make the finished local directory ``work`` this folder, its file ``last`` appearing
        last: a rename locally (an attempt that lost the race to an identical one is dropped),
        one upload per file to a store; ``work`` is gone afterwards."""
        raise NotImplementedError

    def delete_tree(self) -> None:
        """Delete the folder and everything in it; absent is fine."""
        raise NotImplementedError


@dataclass(frozen=True)
class LocalPath(Location):
    """A path on this machine's filesystem (kept as given: messages show relative paths)."""

    path: Path
    is_local = True

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def join(self, *names: str) -> "LocalPath":
        return LocalPath(self.path.joinpath(*names))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def parent(self) -> "LocalPath":
        """The folder holding it."""
        return LocalPath(self.path.parent)

    def beside(self, suffix: str) -> "LocalPath":
        p = self.path
        if p.name not in ("", "..", "."):  # pathlib keeps no "." inside nor a trailing "/"
            return LocalPath(p.parent / f"{p.name}{suffix}")
        full = p.resolve()  # ".", "..", "x/..", "/": the folder the system finds
        if not full.name:
            raise LocationError(f"{self.display}: is the filesystem root, which has no folder "
                                "beside it")
        near = full.parent / f"{full.name}{suffix}"
        return LocalPath(near if p.is_absolute() else Path(os.path.relpath(near)))

    def identity(self) -> tuple:
        try:
            st = os.stat(self.path)  # follows links: a link and its target share a key
        except OSError:
            return ("path", str(self.path.resolve()))
        return ("inode", st.st_dev, st.st_ino)

    def _pattern_base(self) -> str | None:
        parts = self.path.parts
        for k, part in enumerate(parts):
            if not os.path.lexists(Path(*parts[:k + 1])):  # the first missing component
                if not _PATTERN.search(part):
                    return None
                return str(Path(*parts[:k])) if k else ""  # "": no folder before the pattern
        return None

    def overlaps(self, other: Location) -> bool:
        if not isinstance(other, LocalPath):
            return False
        a, b = self.path.resolve(), other.path.resolve()
        return a == b or a in b.parents or b in a.parents

    def ancestors(self) -> list["LocalPath"]:
        return [LocalPath(p) for p in self.path.resolve().parents]

    def filesystem(self):
        from packtool.formats.filesystem import local_filesystem

        return local_filesystem(self.path)

    def entry(self) -> Entry | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        is_dir = os.path.isdir(self.path)
        return Entry(self.name, is_dir, 0 if is_dir else st.st_size, st.st_mtime_ns)

    def version(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def listdir(self) -> dict[str, Entry]:
        out = {}
        try:
            it = os.scandir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return out
        with it:
            for e in it:
                try:
                    is_dir = e.is_dir()
                    st = e.stat()
                except OSError:  # a dangling link: a file of no size
                    out[e.name] = Entry(e.name, False)
                    continue
                out[e.name] = Entry(e.name, is_dir, 0 if is_dir else st.st_size, st.st_mtime_ns)
        return out

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def open_input(self):
        from packtool.formats.filesystem import open_local

        return open_local(self.path)

    def makedirs(self) -> tuple[Path, ...]:
        return make_dirs(self.path)

    def _temp(self) -> Path:
        return self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.tmp")  # _TEMP_NAME

    def publish_bytes(self, data: bytes) -> None:
        """Write ``data`` under a unique temporary name beside the file, fsync, rename; on any
        failure (Ctrl-C included) the temporary is removed."""
        tmp = self._temp()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def publish_file(self, src: Path) -> None:
        """Rename ``src`` onto the file (a copy to a temporary beside it first when ``src`` is on
        another filesystem)."""
        try:
            os.replace(src, self.path)
            return
        except OSError as exc:
            if exc.errno != 18:  # EXDEV: another filesystem
                raise
        tmp = self._temp()
        try:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def delete(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def move_to(self, dest: Location) -> None:
        os.replace(self.path, dest.path)

    def delete_tree(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def stage(self, name: str) -> Path:
        work = self.path / f".{uuid.uuid4().hex}-{name}"
        work.mkdir(parents=True)
        return work

    def claim_stage(self, name: str, record: str) -> Path | None:
        suffix = f"-{name}"
        try:
            found = sorted(p for p in self.path.iterdir()
                           if p.name.startswith(".") and p.name.endswith(suffix)
                           and (p / record).is_file())
        except OSError:
            return None
        for p in found:
            mine = self.path / f".{uuid.uuid4().hex}{suffix}"
            try:
                os.rename(p, mine)
            except OSError:
                continue  # another task took it
            return mine
        return None

    def publish_dir(self, work: Path, last: str) -> None:
        try:
            os.rename(work, self.path)
        except OSError:
            if not (self.path / last).is_file():
                raise
            shutil.rmtree(work, ignore_errors=True)  # another attempt finished the same bytes


#: Options a store URI gets unless it gives them: pyarrow's GCS client retries a failed call
#: for 15 minutes, so a gs:// URI on a machine without Google credentials (or naming a bucket
#: it may not read) waited that long with no message; 20 s (a call then fails within about a
#: minute, backoff included) still rides out a passing outage
GCS_RETRY_LIMIT_S = 20
_STORE_DEFAULTS = {"gs": {"retry_limit_seconds": str(GCS_RETRY_LIMIT_S)},
                   "gcs": {"retry_limit_seconds": str(GCS_RETRY_LIMIT_S)}}


def _with_store_defaults(scheme: str, query: str) -> str:
    """``query`` (a store URI's options, ``a=1&b=2``) with :data:`_STORE_DEFAULTS` of
    ``scheme`` added where it does not give them."""
    given = {o.partition("=")[0] for o in query.split("&") if o}
    extra = [f"{k}={v}" for k, v in _STORE_DEFAULTS.get(scheme, {}).items() if k not in given]
    return "&".join(([query] if query else []) + extra)


_FS: dict = {}
_FS_LOCK = threading.Lock()
#: (scheme, bucket, query) -> the root with the ``KEY:SECRET@`` it was first given with, so a
#: file found under such a URI (named without the credentials, as every message names it) is
#: reopened with them in this process
_CREDENTIALED_ROOTS: dict = {}


@dataclass(frozen=True)
class StoreURI(Location):
    """A file or prefix in a store pyarrow opens: ``scheme://key?query``.

    Attributes:
        scheme: ``s3``, ``gs``, ``hdfs``, ... (lower case).
        key: bucket (or host) and key, ``/``-separated, no leading or trailing ``/``.
        query: the filesystem options, as in the URI (``endpoint_override=...&scheme=http``).
    """

    scheme: str
    key: str
    query: str = ""
    is_local = False

    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}" + (f"?{self.query}" if self.query else "")

    @property
    def display(self) -> str:
        """The URI without credentials: a ``user:secret@`` before the bucket and secret query
        options (``secret_key``, ...) are left out."""
        opts = [o for o in self.query.split("&") if o and o.split("=", 1)[0] not in _SECRET_OPTIONS]
        root, sep, rest = self.key.partition("/")
        key = root.rpartition("@")[2] + sep + rest
        return f"{self.scheme}://{key}" + (f"?{'&'.join(opts)}" if opts else "")

    def join(self, *names: str) -> "StoreURI":
        parts = [self.key] + [n.strip("/") for n in names if n.strip("/")]
        return StoreURI(self.scheme, "/".join(p for p in parts if p), self.query)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "StoreURI":
        """The prefix holding it."""
        return StoreURI(self.scheme, self.key.rpartition("/")[0], self.query)

    def beside(self, suffix: str) -> "StoreURI":
        if "/" not in self.key:  # no trailing "/", no "." or ".." (Location.parse)
            raise LocationError(f"{self.display}: is a whole bucket, which has no prefix "
                                "beside it")
        return StoreURI(self.scheme, f"{self.key}{suffix}", self.query)

    def identity(self) -> tuple:
        uri, _, query = self.display.partition("?")
        return ("store", uri, tuple(sorted(o for o in query.split("&") if o)))

    def overlaps(self, other: Location) -> bool:
        if not isinstance(other, StoreURI) or other.scheme != self.scheme:
            return False
        a, b = self.key, other.key
        return a == b or a.startswith(b + "/") or b.startswith(a + "/")

    def ancestors(self) -> list["StoreURI"]:
        parts = self.key.split("/")
        return [StoreURI(self.scheme, "/".join(parts[:k]), self.query)
                for k in range(len(parts) - 1, 0, -1)]

    @property
    def _root(self) -> str:
        return self.key.split("/", 1)[0]

    def filesystem(self):
        """(filesystem, path inside it); one client per process and root. A URI without
        credentials whose bucket and options were given earlier in this process with
        ``KEY:SECRET@`` (discovery names the files it finds without them) is opened with those.

        Raises:
            OSError: the URI cannot be opened (unknown scheme, bad options, no credentials).
        """
        from packtool.formats.filesystem import from_uri

        base = self._credentialed_root()
        cache_key = (os.getpid(), self.scheme, base, self.query)
        with _FS_LOCK:
            got = _FS.get(cache_key)
        if got is None:
            query = _with_store_defaults(self.scheme, self.query)
            root = f"{self.scheme}://{base}" + (f"?{query}" if query else "")
            try:
                fs, inner = from_uri(root)
            except ValueError as exc:  # worded once here: readers pass a StoreError on
                said = first_line(exc)
                fix = ("check the spelling of the URI's options (docs/reading.md lists them)"
                       if "query parameter" in said.lower() or "option" in said.lower()
                       else "check the URI and the credentials in the environment")
                raise StoreError(f"{self.display}: cannot open this location ({said}); "
                                 f"{fix}") from None
            got = (fs, inner.rstrip("/"))
            with _FS_LOCK:
                got = _FS.setdefault(cache_key, got)
        fs, inner_root = got
        rest = self.key[len(self._root):].strip("/")
        return fs, (f"{inner_root}/{rest}" if rest else inner_root) or "/"

    def _credentialed_root(self) -> str:
        """The bucket as first given with ``KEY:SECRET@`` in this process (or handed to it by
        :func:`remember_credentialed_roots`), else as this URI gives it."""
        root_key = (self.scheme, self.bucket, self.query)
        with _FS_LOCK:
            if "@" in self._root:
                _CREDENTIALED_ROOTS.setdefault(root_key, self._root)
                return self._root
            return _CREDENTIALED_ROOTS.get(root_key, self._root)

    def entry(self) -> Entry | None:
        from packtool.formats.filesystem import file_info

        try:
            info = file_info(*self.filesystem())
        except OSError as exc:
            raise self.store_error(exc) from None
        return None if info is None else Entry(self.name, *info)

    def version(self) -> tuple | None:
        from packtool.formats.filesystem import file_version

        try:
            return file_version(*self.filesystem())
        except OSError as exc:
            raise self.store_error(exc) from None

    @property
    def bucket(self) -> str:
        """The bucket (or host) the URI names, without the ``KEY:SECRET@`` credentials a URI
        may carry before it."""
        return self._root.rpartition("@")[2]

    @property
    def bucket_key(self) -> tuple[str, str]:
        """(bucket, key inside it): what an S3 API call names (never the credentials)."""
        return self.bucket, self.key.partition("/")[2]

    def _userinfo(self) -> tuple[str, str] | None:
        """(access key, secret key) written before the bucket (percent-decoded), or None."""
        from urllib.parse import unquote

        info, at, _ = self._root.rpartition("@")
        if not at:
            return None
        user, _, secret = info.partition(":")
        return unquote(user), unquote(secret)

    def store_error(self, exc: BaseException, doing: str = "cannot be read") -> BaseException:
        text = str(exc)
        if isinstance(exc, StoreError):
            return exc
        if self.scheme in ("gs", "gcs") and _GCS_NO_TOKEN in text:  # before the network words:
            # the client names the unreachable token server, not the missing credentials
            return StoreError(f"{self.display}: {doing}: no Google credentials to use "
                              f"({first_line(exc)[:200]}...); set GOOGLE_APPLICATION_CREDENTIALS "
                              "to a service account's key file, or run 'gcloud auth "
                              "application-default login', then rerun")
        if any(k in text for k in _NETWORK_WORDS):  # pyarrow names a curl code, not the fix
            where = ("endpoint_override=HOST:PORT&scheme=http in the URI, or AWS_ENDPOINT_URL"
                     if self.scheme == "s3" else "endpoint_override=HOST:PORT in the URI")
            return StoreError(f"{self.display}: cannot reach the store ({first_line(exc)}); check "
                              f"the endpoint ({where}) and that the server is up, then "
                              "rerun")
        if any(k in text for k in _DENIED_WORDS):
            return StoreError(f"{self.display}: {doing}: the store refused the credentials "
                           f"({first_line(exc)}); check the credentials (AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY, or the URI's KEY:SECRET@ before the bucket) and "
                           f"that they may use bucket '{self.bucket}' (its permissions), "
                           "then rerun")
        if any(k in text for k in _NO_BUCKET_WORDS):
            return StoreError(f"{self.display}: no bucket '{self.bucket}' in this store; check the "
                           "bucket name in the URI and the endpoint")
        return exc

    def missing(self) -> str:
        if self._no_bucket():
            return f"no bucket '{self.bucket}' in this store"
        return f"nothing under this prefix of bucket '{self.bucket}'"

    def missing_fix(self, fix: str, *, command_line: bool = True,
                    packed_output: bool = False) -> str:
        # no bucket: what to check is its name and the endpoint, not the rest of the path
        if self._pattern_base() is None and self._no_bucket():
            return "check the bucket name and the endpoint"
        return super().missing_fix(fix, command_line=command_line, packed_output=packed_output)

    def _no_bucket(self) -> bool:
        """True when the store has no bucket this URI names (one request; a missing name is
        asked about twice: :meth:`missing`, then :meth:`missing_fix`).

        Raises:
            OSError: the store cannot be asked (:meth:`store_error`'s one line)."""
        root = StoreURI(self.scheme, self._root, self.query)
        return root == self or root.entry() is None

    def _pattern_base(self) -> str | None:
        m = _PATTERN.search(self.key)
        if m is None:
            return None
        return StoreURI(self.scheme, self.key[:m.start()].rpartition("/")[0],
                        self.query).display

    def listdir(self) -> dict[str, Entry]:
        from packtool.formats.filesystem import list_dir

        try:
            return {e[0]: Entry(*e) for e in list_dir(*self.filesystem())}
        except OSError as exc:
            raise self.store_error(exc) from None

    def read_bytes(self) -> bytes:
        fs, path = self.filesystem()
        try:
            with fs.open_input_stream(path) as fh:
                return fh.read()
        except OSError as exc:
            raise self.store_error(exc) from None

    def open_input(self):
        fs, path = self.filesystem()
        try:
            return fs.open_input_file(path)
        except OSError as exc:
            raise self.store_error(exc) from None

    def publish_bytes(self, data: bytes) -> None:
        """Put ``data`` with one request when the stream closes; SIGINT/SIGTERM are held
        meanwhile (a stream closed by an exception would publish what was written so far)."""
        from packtool.signals import signals_held

        fs, path = self.filesystem()
        with signals_held():
            with fs.open_output_stream(path) as fh:
                fh.write(data)

    def publish_file(self, src: Path) -> None:
        """Upload ``src`` in one native call (whole or not at all)."""
        from packtool.formats.filesystem import upload

        upload(src, *self.filesystem())

    def s3_client(self):
        """A boto3 S3 client with this location's endpoint, region and credentials (URI options,
        else the environment), one per process and root; None for another store or without
        boto3 (the ``s3`` extra)."""
        if self.scheme != "s3":
            return None
        try:
            import boto3
        except ImportError:
            return None
        base = self._credentialed_root()
        cache_key = ("boto3", os.getpid(), base, self.query)
        with _FS_LOCK:
            client = _FS.get(cache_key)
        if client is None:
            from urllib.parse import parse_qsl

            opts = dict(parse_qsl(self.query))
            kw = {}
            if opts.get("endpoint_override"):
                host = opts["endpoint_override"]
                kw["endpoint_url"] = (host if "://" in host
                                      else f"{opts.get('scheme', 'https')}://{host}")
            for ours, theirs in (("region", "region_name"), ("access_key", "aws_access_key_id"),
                                 ("secret_key", "aws_secret_access_key"),
                                 ("session_token", "aws_session_token")):
                if opts.get(ours):
                    kw[theirs] = opts[ours]
            creds = StoreURI(self.scheme, base, self.query)._userinfo()  # as pyarrow reads it
            if creds is not None:
                kw["aws_access_key_id"], kw["aws_secret_access_key"] = creds
            kw.setdefault("region_name", os.environ.get("AWS_DEFAULT_REGION")
                          or os.environ.get("AWS_REGION") or "us-east-1")
            client = boto3.client("s3", **kw)
            with _FS_LOCK:
                client = _FS.setdefault(cache_key, client)
        return client

    def delete(self) -> None:
        """Delete the object; absent is fine. On S3 with boto3 the object alone goes; pyarrow's
        own delete would leave a zero-byte "folder" object for an emptied parent."""
        client = self.s3_client()
        if client is not None:
            bucket, key = self.bucket_key
            try:
                client.delete_object(Bucket=bucket, Key=key)
            except Exception as exc:  # botocore's errors are not OSError
                raise OSError(f"{self.display}: cannot delete ({first_line(exc)})") from None
            return
        fs, path = self.filesystem()
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass

    def move_to(self, dest: Location) -> None:
        """A copy inside the store, then a delete: on S3 with boto3 its managed copy (in parts
        above its threshold, so objects over 5 GB copy too), else pyarrow's ``move``."""
        client = self.s3_client()
        if client is not None:
            bucket, key = self.bucket_key
            to_bucket, to_key = dest.bucket_key
            try:
                client.copy({"Bucket": bucket, "Key": key}, to_bucket, to_key)
            except Exception as exc:  # botocore's errors are not OSError
                raise OSError(f"{self.display}: cannot copy to {dest.display} "
                              f"({first_line(exc)})") from None
            self.delete()
            return
        fs, path = self.filesystem()
        try:
            fs.move(path, dest.filesystem()[1])
        except OSError as exc:
            raise self.store_error(exc, "cannot be moved") from None

    def delete_tree(self) -> None:
        """Delete every object under this prefix; absent is fine (no folder object left
        behind on S3 with boto3, see :meth:`delete`)."""
        client = self.s3_client()
        if client is not None:
            bucket, key = self.bucket_key
            try:
                pages = client.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=key.rstrip("/") + "/")
                for page in pages:
                    objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    for lo in range(0, len(objs), 1000):
                        client.delete_objects(Bucket=bucket,
                                              Delete={"Objects": objs[lo:lo + 1000],
                                                      "Quiet": True})
            except Exception as exc:
                raise OSError(f"{self.display}: cannot delete ({first_line(exc)})") from None
            return
        fs, path = self.filesystem()
        try:
            fs.delete_dir(path)
        except FileNotFoundError:
            pass

    stages_found_again = False

    def claim_stage(self, name: str, record: str) -> Path | None:
        return None

    def stage(self, name: str) -> Path:
        """``TMPDIR/packtool-<32 hex>-<name>``, holding the record of this process
        (:data:`STAGE_HOLDER`); the first stage of a process first removes those of the
        processes of this host that are gone (:func:`sweep_stages`)."""
        import json
        import tempfile

        from packtool.formats.holders import holder

        temp = Path(tempfile.gettempdir())
        sweep_stages(temp, once=True)
        work = temp / f"packtool-{uuid.uuid4().hex}-{name}"
        work.mkdir()
        try:
            (work / STAGE_HOLDER).write_text(json.dumps(holder()))
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return work

    def publish_dir(self, work: Path, last: str) -> None:
        try:
            files = [p for p in work.iterdir() if p.name != STAGE_HOLDER]
            for p in sorted(files, key=lambda q: q.name == last):
                self.join(p.name).publish_file(p)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def make_dirs(path: "str | os.PathLike") -> tuple[Path, ...]:
    """Create the local folder ``path`` and its missing parents (``mkdir -p``), and say which
    it created, so that a command failing before it writes anything there (an export, a pack,
    a tokenize into ``x/y/z``) takes away every folder it made and no other
    (:func:`remove_made`).

    Returns:
        The folders created, outermost first (``x``, ``x/y``, ``x/y/z``); ``()`` when ``path``
        was there.

    Raises:
        OSError: a folder cannot be created (those made before it are removed first).
    """
    path = Path(path)
    missing, p = [], path
    while not (p.exists() or p.is_symlink()) and p != p.parent:
        missing.append(p)
        p = p.parent
    made = tuple(reversed(missing))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except BaseException:
        remove_made(made)
        raise
    return made


def remove_made(made) -> None:
    """Remove the folders :func:`make_dirs` created (``made``), deepest first, each only when
    it is empty: never a file or folder something else put there (removal stops at the first
    folder that holds one, since its parents hold it too). Never raises."""
    for d in reversed(tuple(made)):
        try:
            Path(d).rmdir()
        except OSError:
            return


#: (pid, temporary directory) already swept by this process (:func:`sweep_stages` ``once``)
_SWEPT: set = set()
_SWEEP_LOCK = threading.Lock()


def sweep_stages(temp: "str | os.PathLike | None" = None, *, once: bool = False) -> int:
    """Remove the staging directories of store outputs (:meth:`StoreURI.stage`) that killed
    runs left in the temporary directory ``temp`` (default: this process's ``TMPDIR``): a task
    killed (SIGKILL, the OOM killer, a preempted node) cleans nothing up, and its spills or
    shard would stay there for good. A run stopped otherwise (an error, Ctrl-C, SIGTERM)
    removes its own.

    A directory named ``packtool-<32 hex>-<unit>`` goes when its holder record
    (:data:`STAGE_HOLDER`) names a process that is certainly gone
    (:func:`packtool.formats.holders.holder_is_gone`: of this host, and this host rebooted
    since, or no process has its pid, or one that started at another time). A live process's,
    this user's or another's, and another host's (a shared ``TMPDIR``: its processes cannot be
    asked) are kept. One without a readable record (made by a packtool before these records,
    or being made this instant) goes only when nothing in it changed for
    :data:`STAGE_UNRECORDED_DAYS` days: a live task writes its stage until it ends, and a
    killed run's is not left for good. Other names (``tempfile.mkdtemp(prefix="packtool-")``,
    which :func:`packtool.api.pack_dataset` uses) are never touched. A directory that cannot be
    read or removed (another user's) is left as it is: this never raises.

    Args:
        temp: the temporary directory to sweep.
        once: sweep ``temp`` at most once in this process (each task's :meth:`StoreURI.stage`);
            without it (the start of a pack or tokenize run) always.

    Returns:
        How many directories were removed.
    """
    import tempfile

    temp = Path(temp if temp is not None else tempfile.gettempdir())
    key = (os.getpid(), str(temp))
    with _SWEEP_LOCK:
        if once and key in _SWEPT:
            return 0
        _SWEPT.add(key)
    try:
        found = [e for e in os.scandir(temp) if _STAGE_NAME.match(e.name)
                 and e.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    removed = 0
    for e in found:
        try:
            if not _stage_abandoned(Path(e.path)):
                continue
        except OSError:
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        removed += not os.path.lexists(e.path)
    return removed


def _stage_abandoned(work: Path) -> bool:
    """True when the staging directory ``work`` is a killed run's (see :func:`sweep_stages`).

    Raises:
        OSError: ``work`` cannot be listed (gone meanwhile, another user's).
    """
    import json
    import time

    from packtool.formats.holders import holder_is_gone

    try:
        record = json.loads((work / STAGE_HOLDER).read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict):
        return holder_is_gone(record)
    newest = max([work.lstat().st_mtime]
                 + [e.stat(follow_symlinks=False).st_mtime for e in os.scandir(work)])
    return time.time() - newest > STAGE_UNRECORDED_DAYS * 86400


def _plain_key(uri: "StoreURI") -> "StoreURI":
    """``uri`` when its key (bucket included) has no ``.``, ``..`` or empty segment.

    Such a key is not addressed as written on every call: pyarrow's S3 client drops ``./``
    and resolves ``../`` when it writes an object but lists the prefix as spelt; ``b//x``
    reached pyarrow as ``b/x`` but boto3 (the commit's copy, the deletes) as the key ``/x``,
    and pyarrow refuses an empty segment further in (``b/x//y``). A pack into ``s3://b/./out``
    found nothing under ``./out/``, wrote into ``out/`` and replaced the manifest of a
    finished output there. Such a URI is refused, never normalized: S3 keys may hold ``./`` or
    ``//`` literally, and a key read one way here and another way by the user's other tools
    would be a second name for the same objects (or for others); the plain spelling is named
    as the fix instead.

    Raises:
        LocationError: one line naming the URI (without its secrets) and the plain spelling
            to write, or, when ``..`` climbs to the bucket or the bucket is ``.``, ``..`` or
            missing (``s3://``), that the bucket comes first.
    """
    if not uri.key:
        raise LocationError(f"{uri.display}: names no bucket; write {uri.scheme}://BUCKET/KEY")
    parts = uri.key.split("/")
    odd = [p for p in ("", ".", "..") if p in parts]
    if not odd:
        return uri
    kept: list[str] = []
    for p in parts:
        if p == "..":
            if len(kept) < 2:  # would climb to or above the bucket
                kept = []
                break
            kept.pop()
        elif p not in ("", "."):
            kept.append(p)
    holds = " and ".join(f"'{'//' if p == '' else p}'" for p in odd)
    why = (f"{uri.display}: the key holds {holds}, which pyarrow's store client drops or "
           "resolves on some calls and not on others, so packtool would write and find "
           "different objects")
    if not kept or parts[0] in (".", ".."):
        raise LocationError(f"{why}; the bucket comes first: write SCHEME://BUCKET/KEY without "
                            "'.', '..' or empty segments")
    raise LocationError(f"{why}; write it as "
                        f"{StoreURI(uri.scheme, '/'.join(kept), uri.query).display}")


def _file_uri_rest(text: str, match: "re.Match") -> str:
    """The path part of the ``file:`` URI ``text`` (``_FILE_URI`` matched it): what follows
    ``file:`` and the host, which must be none or this machine's (empty, ``localhost``, any
    case), and which must begin with ``/``, as RFC 8089 and pyarrow read a local URI
    (``file:///p``, ``file://localhost/p``, ``file:/p``: ``/p``).

    Raises:
        LocationError: another host (pyarrow: "Unsupported hostname in non-Windows local URI";
            a local write there would land under ``/HOST`` at the filesystem root), or no
            absolute path (``file:t21/x``, ``file://``).
    """
    from urllib.parse import unquote

    host, rest = match.group(1), text[match.end():]
    plain = "a plain path"
    if host is not None and unquote(host).lower() not in _LOCAL_HOSTS:
        user, at, name = host.rpartition("@")  # a user (and password) is never shown
        if not rest.strip("/") and not at and ":" not in host:
            plain += f" such as {host}"  # file://t3relout: a relative path was meant
        raise LocationError(
            f"{text.replace(host, '...@' + name, 1) if at else text}: names "
            f"{'a user and ' if at else ''}the host '{name}', and a file: URI names a file of "
            "this machine (its host empty or localhost, no user); write file:///ABS/PATH (or "
            f"file://localhost/ABS/PATH), or {plain}")
    if not rest.startswith("/"):
        if host is None and rest and rest[0] not in "?#":
            plain += f" such as {rest}"  # file:t21/x: a relative path was meant
        raise LocationError(
            f"{text}: not a file: URI (one names an absolute path: file:///ABS/PATH); write "
            f"file:///ABS/PATH, or {plain}")
    return rest


def _file_uri_path(uri_path: str) -> str:
    """The local path a ``file:`` URI's path part names (RFC 8089, as
    ``pyarrow.fs.FileSystem.from_uri`` reads it): the ``?query`` and ``#fragment`` cut off, then
    percent-decoded to bytes and those decoded as the filesystem's names are (``%E9`` is the
    byte 0xE9, kept by ``os.fsdecode``); an escape that is not two hex digits stays as written.
    """
    from urllib.parse import unquote_to_bytes

    path = re.split(r"[?#]", uri_path, maxsplit=1)[0]
    return os.fsdecode(unquote_to_bytes(path))


def credentialed_roots() -> dict:
    """The store roots given with ``KEY:SECRET@`` in this process so far, for another process
    of the same run (a Ray task) to :func:`remember_credentialed_roots`; secrets inside: never
    print or log it."""
    with _FS_LOCK:
        return dict(_CREDENTIALED_ROOTS)


def remember_credentialed_roots(roots: dict) -> None:
    """Open the files of these roots (from :func:`credentialed_roots`) with their credentials
    in this process too, as the process that found them does."""
    with _FS_LOCK:
        for k, v in roots.items():
            _CREDENTIALED_ROOTS.setdefault(k, v)


#: The node of a joined Ray cluster this process runs the pack's tasks on, as messages name
#: it (set by every task there, :func:`remember_task_node`); None elsewhere (the driver, a local
#: engine, a Ray the driver started itself).
_TASK_NODE: list = [None]


def remember_task_node(node: str | None) -> None:
    """Record that this process runs tasks on ``node`` of a joined Ray cluster (None: not)."""
    _TASK_NODE[0] = node


def task_node() -> str | None:
    """The node of a joined Ray cluster this process runs tasks on, None when it runs none
    (:func:`remember_task_node`): a local path this process does not find, though the driver
    did, is then on a disk that node does not share."""
    return _TASK_NODE[0]


def shared_storage_fix(role: str) -> str:
    """What a joined Ray cluster needs of ``role`` (``INPUT``, ``OUTPUT``), for a message."""
    return (f"with a joined Ray cluster {role} must be on storage every node sees at the same "
            "path (or a store URI)")


def for_tasks(given: "str | os.PathLike | Location") -> str:
    """``given`` as it is handed to a task that may run in another process, in another working
    directory (a Ray worker: the directory its ``ray start`` ran in): a local path made absolute
    against this process's working directory (links kept as they are); a store URI as is."""
    loc = Location.parse(given)
    return str(loc.path.absolute()) if loc.is_local else str(loc)


def location(given: "str | os.PathLike | Location") -> Location:
    """Shorthand for :meth:`Location.parse`."""
    return Location.parse(given)


def display(given: "str | os.PathLike | Location") -> str:
    """How every message and manifest names ``given``: its path, or its URI without the
    ``KEY:SECRET@`` and secret options (:attr:`Location.display`)."""
    return Location.parse(given).display


def is_store(given) -> bool:
    """True when ``given`` names a location in a store (not a local path or ``file:`` URI)."""
    return not Location.parse(given).is_local
