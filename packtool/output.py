"""The one owner of OUTPUT: lock, fingerprint, temporary names, resume, manifest last, cleanup.

A pack goes through :class:`Output` and nothing else writes into OUTPUT:

1. :meth:`Output.open` (the ``with`` entry) refuses an OUTPUT that overlaps INPUT or is a file,
   creates the directory, takes an exclusive lock (:mod:`filelock`, not waiting: a second
   ``pack`` into the same OUTPUT is refused at once), then decides from what it finds: a
   complete output with the same fingerprint is *complete* (the run is a no-op); an interrupted
   one with the same fingerprint is *resumed* (its finished shards are kept); a foreign or
   different non-empty OUTPUT is refused unless ``--overwrite``; an OUTPUT holding files packtool
   did not write, or inside another packed output, is always refused (they would break the
   directory as a Parquet dataset).
2. While the input is read and planned, only the scratch directory
   (:data:`~packtool.formats.manifest.TMP_DIR_NAME`) is written; an existing output is left as it
   was. :meth:`Output.begin_write` then removes what ``--overwrite`` replaces (manifest first)
   and writes the in-progress marker.
3. Shards are written under unique temporary names (:meth:`Output.temp_path`) and published
   with ``os.replace`` (:meth:`Output.publish`), so two attempts of one shard (a Ray retry beside
   a slow first attempt) never expose a half-written file.
4. :meth:`Output.commit` writes the manifest last and removes the marker, scratch and lock.

Every failure leaves through :meth:`Output.__exit__`, the one cleanup path. Ctrl-C leaves what
SIGKILL would, tidied: the scratch directory keeps its finished windows (their row-order spills
and plans) and fingerprint, everything under a unique temporary name goes, and the lock is
released, so rerunning the same command reads and plans only the windows not finished; a
Ctrl-C before any window finished keeps no scratch. Any other failure removes the scratch
directory (token spills, plans, temporary shards), so a full disk is never left full. A failure
before writing began (bad value in any window, ENOSPC while spilling, Ctrl-C before a window
finished) leaves OUTPUT as it was before the run (a new OUTPUT is removed); after that (ENOSPC
or EIO while writing shards, Ctrl-C, a failed Ray task) the finished shards and the marker
stay, and rerunning the same command finishes the output byte-identically. ``OSError``
becomes one :class:`~packtool.errors.OutputError` line naming the path and the cause (for a
full disk: about how many bytes were needed and how many are free).

**OUTPUT in an object store** (a URI: ``s3://bucket/prefix``; the store calls are in
:mod:`packtool.formats.object_store`) follows the same steps with what a store offers: the lock
is an object written and read back (advisory); the scratch directory is the prefix
``OUTPUT/.packtool-tmp/``, where a window task puts its files (written first in its own
temporary directory) with ``done.json`` last; a shard task writes its shard in its own
temporary directory and puts it under the final name with one upload (whole or absent, so no
temporary name); the marker also lists the finished shards with size and sha256
(:meth:`Output.shard_written`), which a rerun keeps; the manifest is put last, then the marker
and the scratch prefix are deleted. So the tasks of a cluster share nothing but the store, and
the driver writes nothing on its own disk.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import shutil
import time
import uuid
from importlib import metadata
from pathlib import Path

import pyarrow.fs as pafs
from filelock import FileLock, Timeout

from packtool import signals
from packtool.errors import OutputError
from packtool.errors import ManifestError
from packtool.formats import object_store as store
from packtool.formats.manifest import (IN_PROGRESS_NAME, LOCK_NAME, MANIFEST_NAME, SHARD_GLOB,
                                       TMP_DIR_NAME, manifest_bytes, manifest_from_bytes,
                                       read_manifest, write_json_atomic,
                                       write_manifest_file)

__all__ = ["Output", "fingerprint", "footer_sha256", "BYTE_DECIDING_PACKAGES", "WINDOW_DIR_PREFIX",
           "WINDOW_DONE", "SCRATCH_FINGERPRINT", "LAYOUT_REVISION", "window_done", "window_workdir",
           "publish_window", "window_file", "shard_temp",
           "discard_shard_temp", "publish_shard", "kept_shard", "MARKER_EVERY_S"]

#: A window's spill and plan live in ``<scratch>/window-NNNNN/``, complete once ``done.json``
#: is there (it is written before the directory is renamed into place).
WINDOW_DIR_PREFIX = "window-"
WINDOW_DONE = "done.json"
#: The fingerprint of the run that created the scratch directory (a file inside it).
SCRATCH_FINGERPRINT = "fingerprint"

#: Distributions whose version can change the output bytes (recorded in the fingerprint).
BYTE_DECIDING_PACKAGES = ("packtool", "pyarrow", "numpy", "numba")
#: Revision of how packtool lays out and orders the rows of given options and inputs (and of
#: the scratch files a killed run leaves for its rerun); recorded in the fingerprint, so a
#: change between two runs of one packtool version never mixes their shards or windows.
LAYOUT_REVISION = 2


def _versions() -> dict:
    out = {}
    for name in BYTE_DECIDING_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    if out["packtool"] is None:  # run from a source tree that is not installed
        from packtool._version import __version__

        out["packtool"] = __version__
    return out


def footer_sha256(path, tail_bytes: int = 1 << 16) -> str:
    """sha256 of a Parquet file's footer (metadata block + its length + ``PAR1``).

    The footer holds every row group's offsets, sizes and statistics, so a rewrite with the
    same size and a reset mtime still changes it. Reads only the file's tail (local path or
    URI, through :mod:`pyarrow.fs`); a file that is not Parquet (Arrow IPC) is represented by its
    last ``tail_bytes`` bytes.

    Raises:
        OSError: the file cannot be read.
    """
    from packtool.formats.reader import filesystem_of

    fs, inner, _ = filesystem_of(path)
    with fs.open_input_file(inner) as f:
        size = f.size()
        if size < 8:
            return hashlib.sha256(b"").hexdigest()
        f.seek(size - 8)
        tail = f.read(8)
        n = int.from_bytes(tail[:4], "little") if tail[4:] == b"PAR1" else tail_bytes - 8
        f.seek(max(0, size - 8 - n))
        return hashlib.sha256(f.read()).hexdigest()


def _resolved(path) -> str:
    """A local path made absolute with links resolved; a URI as it is."""
    from packtool.formats.reader import filesystem_of

    _, inner, scheme = filesystem_of(path)
    return scheme + inner if scheme else str(Path(path).resolve())


def fingerprint(options: dict, files) -> str:
    """sha256 that changes whenever the output bytes could.

    Args:
        options: the options that decide the bytes (``PackConfig.layout_options()``).
        files: :class:`~packtool.formats.reader.InputFile` list in document order; each is
            recorded by resolved path (``in/`` and ``./in/`` agree), size, mtime and the
            sha256 of its Parquet footer.

    Returns:
        64 hex characters; also covers the versions of :data:`BYTE_DECIDING_PACKAGES`.
    """
    blob = json.dumps({
        "options": options,
        "versions": _versions(),
        "layout_revision": LAYOUT_REVISION,
        "inputs": [[_resolved(f.path), f.bytes, f.mtime_ns, footer_sha256(f.path)]
                   for f in files],
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def _is_full_disk(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(exc)


class Output:
    """OUTPUT of one pack; use as a context manager (see the module docstring).

    Args:
        path: the OUTPUT directory, or a URI in an object store (``s3://bucket/prefix``).
        inputs: INPUT paths as given (OUTPUT may not lie inside one, nor contain one).
        fingerprint: from :func:`fingerprint`.
        overwrite: replace a non-empty OUTPUT that is not an interrupted identical pack.

    Attributes after entry: ``complete`` (a finished identical output is there: nothing to do),
    ``resume`` (an interrupted identical pack is there: keep its shards), ``tmp`` (scratch
    directory), ``windows_kept`` (finished windows kept in the scratch directory from an
    identical run that was killed), ``manifest`` (the existing manifest when ``complete``).
    """

    def __init__(self, path: str | os.PathLike, inputs, fingerprint: str, *,
                 overwrite: bool = False):
        from packtool.formats.reader import _location, is_remote

        self.remote = is_remote(path)  #: OUTPUT is a URI: the object-store rules below
        self.fingerprint = fingerprint
        self.overwrite = overwrite
        if self.remote:
            self.path = _location(path).rstrip("/")
            self.tmp = store.join(self.path, TMP_DIR_NAME)
            self._given = [_location(p).rstrip("/") for p in inputs]
            self.inputs = []
        else:
            self.path = Path(_location(path))  # a file: URI is its local path
            self.tmp = self.path / TMP_DIR_NAME
            self.inputs = [Path(_location(p)) for p in inputs if not is_remote(p)]
        self.complete = False
        self.resume = False
        self.manifest: dict | None = None
        self.bytes_needed = 0  #: what the current phase still has to write (ENOSPC message)
        self.windows_kept = 0  #: finished windows kept from a killed identical run
        self._created = False
        self._writing = False
        self._lock: FileLock | None = None
        self._release_sigint = None  # set by commit(): Ctrl-C held until __exit__ ends
        self._scratch_needed = 0  # bytes of scratch the run asked for (check_space)
        self._store_lock: dict | None = None  # the lock object written (object store)
        self._promised: dict = {}  # shard -> {"bytes", "sha256"} from an interrupted run's marker
        self._written: dict = {}  # shard -> {"bytes", "sha256"} finished in this run
        self._marker_at = 0.0  # when the marker last listed the finished shards

    # -- entry: checks, lock, decision ---------------------------------------------------------
    def __enter__(self) -> "Output":
        if self.remote:
            return self._enter_store()
        out = self.path
        out_abs = out.resolve()
        for src in self.inputs:
            s = src.resolve()
            if _inside(out_abs, s) or _inside(s, out_abs):
                raise OutputError(f"{out}: OUTPUT overlaps INPUT {src}; choose a directory "
                                  "outside the input")
        if out.exists() and not out.is_dir():
            raise OutputError(f"{out}: exists and is a file; OUTPUT must be a directory")
        for parent in out_abs.parents:  # shards of another schema would break its dataset
            if (parent / MANIFEST_NAME).is_file() or (parent / IN_PROGRESS_NAME).is_file():
                raise OutputError(f"{out}: OUTPUT is inside the packed output {parent}; choose "
                                  "a directory outside it")
        try:
            self._created = not out.exists()
            out.mkdir(parents=True, exist_ok=True)
            lock = FileLock(out / LOCK_NAME)
            lock.acquire(timeout=0)
        except Timeout:
            raise OutputError(f"{out}: another packtool pack is writing this OUTPUT (lock "
                              f"{LOCK_NAME} is held); wait for it to end or choose another "
                              "OUTPUT") from None
        except OSError as exc:
            self._remove_created()
            raise OutputError(f"{out}: cannot write ({exc.strerror}); choose a writable "
                              "OUTPUT") from None
        self._lock = lock
        try:
            self._decide()
            if not self.complete:
                self._open_scratch()
        except BaseException as exc:
            self._cleanup(exc)
            raise
        return self

    def _decide(self) -> None:
        out = self.path
        manifest, marker = out / MANIFEST_NAME, out / IN_PROGRESS_NAME
        if manifest.is_file():
            try:
                m = read_manifest(out)
            except ManifestError:
                m = {}
            if m.get("fingerprint") == self.fingerprint:
                if not self._shards_intact(m):
                    self.overwrite = True  # this very pack, damaged since: ours to redo
                elif not self.overwrite:  # --overwrite asks for the shards to be written anew
                    self.complete, self.manifest = True, m
                    return
        elif marker.is_file():
            try:
                self.resume = json.loads(marker.read_text())["fingerprint"] == self.fingerprint
            except (ValueError, KeyError, TypeError):
                self.resume = False
            if not self.resume:
                self.overwrite = True  # an interrupted pack of other options: ours to replace
            return
        others = [p for p in out.iterdir() if p.name not in (LOCK_NAME, TMP_DIR_NAME)]
        if others and not self.overwrite:
            raise OutputError(f"{out}: OUTPUT is not empty; pass --overwrite to replace it or "
                              "choose another directory")
        own = (MANIFEST_NAME, IN_PROGRESS_NAME)
        foreign = sorted(p.name for p in others
                         if p.name not in own and not (p.is_file() and p.match(SHARD_GLOB)))
        if foreign:  # never deleted, and beside the shards they would break Parquet readers
            raise OutputError(f"{out}: OUTPUT holds {len(foreign)} entr"
                              f"{'y' if len(foreign) == 1 else 'ies'} packtool did not write "
                              f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                              "move them away or choose another directory")

    def _open_scratch(self) -> None:
        """Create the scratch directory, keeping the finished windows of a killed identical run.

        A run killed without cleanup (SIGKILL, a lost machine) leaves its scratch behind. When
        that scratch carries this run's fingerprint, the window directories that were renamed
        into place (complete by construction: ``done.json`` is written before the rename) are
        kept and their windows are not read again; everything else (half-written windows,
        temporary shards) is removed. Any other scratch is removed whole.
        """
        tag = self.tmp / SCRATCH_FINGERPRINT
        try:
            same = tag.read_text() == self.fingerprint
        except OSError:
            same = False
        if not same:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir()
            tmp = self.tmp / f".{uuid.uuid4().hex}-{SCRATCH_FINGERPRINT}"
            tmp.write_text(self.fingerprint)
            os.replace(tmp, tag)
            return
        self.windows_kept = self._trim_scratch()

    def _scratch_is_ours(self) -> bool:
        """The scratch directory (or prefix) carries this run's fingerprint."""
        try:
            if self.remote:
                tag = store.read_bytes(store.join(self.tmp, SCRATCH_FINGERPRINT)).decode()
            else:
                tag = (self.tmp / SCRATCH_FINGERPRINT).read_text()
        except (OSError, *store.STORE_ERRORS, UnicodeDecodeError):
            return False
        return tag == self.fingerprint

    def _trim_scratch(self) -> int:
        """Remove from the scratch directory (or prefix) everything but its fingerprint and the
        finished windows (``done.json`` in them); return how many finished windows are there."""
        if self.remote:
            return self._trim_scratch_store()
        kept = 0
        for p in self.tmp.iterdir():
            if p.name == SCRATCH_FINGERPRINT:
                continue
            if (p.name.startswith(WINDOW_DIR_PREFIX) and p.is_dir()
                    and (p / WINDOW_DONE).is_file()):
                kept += 1
                continue
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        return kept

    def _shards_intact(self, m: dict) -> bool:
        try:
            return all((self.path / o["file"]).stat().st_size == o["bytes"] for o in m["outputs"])
        except (OSError, KeyError, TypeError):
            return False

    # -- scratch and shard names ---------------------------------------------------------------
    def temp_path(self, name: str) -> Path:
        """A unique scratch path for a file that will be published as ``name``."""
        return self.tmp / f"{uuid.uuid4().hex}-{name}"

    def shard_path(self, name: str) -> Path:
        """Final path of shard ``name``."""
        return self.path / name

    @staticmethod
    def publish(tmp: Path, final: Path) -> None:
        """Move a finished temporary file to its final name (atomic on one filesystem)."""
        os.replace(tmp, final)

    # -- writing -------------------------------------------------------------------------------
    def begin_write(self) -> None:
        """Remove what this run replaces (manifest first, then the shards; other files stay) and
        mark OUTPUT as in progress."""
        if self.remote:
            return self._begin_write_store()
        out = self.path
        if not self.resume:  # packtool's own files only; anything else is left alone
            (out / MANIFEST_NAME).unlink(missing_ok=True)
            for p in out.glob(SHARD_GLOB):
                p.unlink()
        write_json_atomic(out / IN_PROGRESS_NAME, {"fingerprint": self.fingerprint})
        self._writing = True

    def commit(self, manifest: dict, schema) -> None:
        """Write the manifest (atomically, last; ``schema``: the shards' schema, see
        :func:`~packtool.formats.manifest.write_manifest_file`); drop the marker and scratch.

        From here to the end of :meth:`__exit__` Ctrl-C is held (:func:`packtool.signals.hold`):
        once the manifest is written the pack is complete, so the marker, scratch and lock are
        removed and the run ends as a success, never as "interrupted" beside a manifest."""
        if self._release_sigint is None:
            self._release_sigint = signals.hold()
        if self.remote:
            return self._commit_store(manifest, schema)
        write_manifest_file(self.path, manifest, schema)
        (self.path / IN_PROGRESS_NAME).unlink(missing_ok=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._writing = False
        self.manifest = manifest

    # -- exit: the one cleanup path --------------------------------------------------------------
    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self._cleanup(exc)
        finally:
            if self._release_sigint is not None:
                self._release_sigint()  # a Ctrl-C after commit() began: the pack is complete
                self._release_sigint = None
        if isinstance(exc, OSError) or (self.remote and isinstance(exc, store.STORE_ERRORS)):
            raise self._os_error(exc) from None
        return False

    def _keeps_windows(self, exc: BaseException | None) -> bool:
        """Ctrl-C leaves what a rerun of the same command resumes from, as SIGKILL would: the
        scratch stays when it is this run's and holds at least one finished window, trimmed to
        those windows and its fingerprint (half-written windows and temporary shards, under
        unique names, go). Any other failure (bad input, full disk, a failed task) removes it."""
        if not isinstance(exc, KeyboardInterrupt):
            return False
        try:
            return self._scratch_is_ours() and self._trim_scratch() > 0
        except (OSError, *store.STORE_ERRORS):
            return False

    def _cleanup(self, exc: BaseException | None) -> None:
        """Release OUTPUT after the run; on failure restore it or leave it resumable (after
        Ctrl-C the finished windows too, see :meth:`_keeps_windows`)."""
        if self.remote:
            return self._cleanup_store(exc)
        keep = False
        try:
            keep = self._keeps_windows(exc)
            if not keep:
                shutil.rmtree(self.tmp, ignore_errors=True)
            (self.path / LOCK_NAME).unlink(missing_ok=True)  # still held: nobody waits on it
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            if exc is not None and not self._writing and not keep:
                self._remove_created()

    def _remove_created(self) -> None:
        if self._created:
            try:
                self.path.rmdir()  # only when empty: never removes something not ours
            except OSError:
                pass

    def _os_error(self, exc: OSError) -> OutputError:
        where = getattr(exc, "filename", None) or self.path
        state = ("the finished shards are kept: rerun the same command to finish"
                 if self._writing else "OUTPUT is as it was before the run")
        if self.remote:
            return OutputError(f"{self.path}: cannot write ({store._first(exc)}); {state}")
        if _is_full_disk(exc):
            try:
                free = shutil.disk_usage(self.path if self.path.exists() else
                                         self.path.parent).free
            except OSError:
                free = 0
            # while shards are written, bytes_needed counts the shards left; the scratch (the
            # window spills, removed on the way out) is written again by the rerun
            needed = self.bytes_needed + (self._scratch_needed if self._writing else 0)
            return OutputError(f"{where}: no space left on device: this pack needs about "
                               f"{needed:,} bytes more to finish, its scratch included ({free:,} "
                               f"free); free space or choose another OUTPUT ({state})")
        cause = exc.strerror or str(exc).splitlines()[0]
        return OutputError(f"{where}: cannot write ({cause}); {state}")

    def check_space(self, needed: int) -> None:
        """Refuse at once when the filesystem of OUTPUT has less than ``needed`` bytes free
        (an object store: not checked)."""
        self.bytes_needed = self._scratch_needed = needed
        if self.remote:
            return
        free = shutil.disk_usage(self.path).free
        if free < needed:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    # -- shards finished (the driver reports each) -----------------------------------------------
    def promised(self, name: str) -> dict | None:
        """``{"bytes", "sha256"}`` of shard ``name`` as an interrupted identical run finished it
        (object store: from its marker; a local OUTPUT needs none, a renamed file is whole)."""
        return self._promised.get(name) if self.resume else None

    def shard_written(self, entry: dict) -> None:
        """Record a finished shard (its manifest entry). In an object store the marker lists
        the finished shards (rewritten at most every :data:`MARKER_EVERY_S` seconds, and when
        the run fails), so a rerun keeps them by size and sha256."""
        if not self.remote:
            return
        self._written[entry["file"]] = {"bytes": entry["bytes"], "sha256": entry["sha256"]}
        now = time.monotonic()
        if now - self._marker_at >= MARKER_EVERY_S:
            self._write_marker()

    def _write_marker(self) -> None:
        store.write_bytes(store.join(self.path, IN_PROGRESS_NAME), json.dumps(
            {"fingerprint": self.fingerprint, "shards": {**self._promised, **self._written}},
            sort_keys=True).encode())
        self._marker_at = time.monotonic()

    # -- the object-store rules (OUTPUT is a URI) -----------------------------------------------
    def _enter_store(self) -> "Output":
        uri = self.path
        bare = uri.split("://", 1)[1]
        for src in self._given:
            if "://" in src and src.split("://", 1)[0] == uri.split("://", 1)[0]:
                s = src.split("://", 1)[1]
                if _inside_key(bare, s) or _inside_key(s, bare):
                    raise OutputError(f"{uri}: OUTPUT overlaps INPUT {src}; choose a prefix "
                                      "outside the input")
        try:
            found = store.listing(uri)
            parts = bare.split("/")
            for k in range(len(parts) - 1, 0, -1):  # inside another packed output?
                parent = f"{uri.split('://', 1)[0]}://{'/'.join(parts[:k])}"
                if any(store.size_of(store.join(parent, n)) is not None
                       for n in (MANIFEST_NAME, IN_PROGRESS_NAME)):
                    raise OutputError(f"{uri}: OUTPUT is inside the packed output {parent}; "
                                      "choose a prefix outside it")
        except store.STORE_ERRORS as exc:
            raise OutputError(f"{uri}: cannot list OUTPUT ({store._first(exc)}); check the URI "
                              "and the credentials") from None
        found.pop(LOCK_NAME, None)
        self._created = not found
        self._store_lock = store.take_lock(uri, overwrite=self.overwrite)
        try:
            self._decide_store(found)
            if not self.complete:
                self._open_scratch_store()
        except BaseException as exc:
            self._cleanup(exc)
            if isinstance(exc, store.STORE_ERRORS):
                raise self._os_error(exc) from None
            raise
        return self

    def _decide_store(self, found: dict) -> None:
        uri = self.path
        if MANIFEST_NAME in found:
            try:
                m = manifest_from_bytes(store.read_bytes(store.join(uri, MANIFEST_NAME)), uri)
            except ManifestError:
                m = {}
            if m.get("fingerprint") == self.fingerprint:
                intact = all(isinstance(o, dict) and o.get("file") in found
                             and found[o["file"]].size == o.get("bytes")
                             for o in m.get("outputs", []))
                if not intact:
                    self.overwrite = True
                elif not self.overwrite:
                    self.complete, self.manifest = True, m
                    return
        elif IN_PROGRESS_NAME in found:
            marker = store.read_json(store.join(uri, IN_PROGRESS_NAME)) or {}
            self.resume = marker.get("fingerprint") == self.fingerprint
            if not self.resume:
                self.overwrite = True
            elif isinstance(marker.get("shards"), dict):
                self._promised = dict(marker["shards"])
            return
        others = [n for n in found if n != TMP_DIR_NAME]
        if others and not self.overwrite:
            raise OutputError(f"{uri}: OUTPUT is not empty; pass --overwrite to replace it or "
                              "choose another prefix")
        own = (MANIFEST_NAME, IN_PROGRESS_NAME)
        foreign = sorted(n for n in others if n not in own and not (
            found[n].type == pafs.FileType.File and fnmatch.fnmatchcase(n, SHARD_GLOB)))
        if foreign:
            raise OutputError(f"{uri}: OUTPUT holds {len(foreign)} entr"
                              f"{'y' if len(foreign) == 1 else 'ies'} packtool did not write "
                              f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                              "move them away or choose another prefix")

    def _open_scratch_store(self) -> None:
        """:meth:`_open_scratch` in a store: the scratch prefix keeps the finished windows
        (``done.json`` present, put last) of a killed identical run; the rest is deleted."""
        tag = store.join(self.tmp, SCRATCH_FINGERPRINT)
        try:
            same = store.read_bytes(tag).decode() == self.fingerprint
        except (*store.STORE_ERRORS, UnicodeDecodeError):
            same = False
        if not same:
            store.delete_tree(self.tmp)
            store.write_bytes(tag, self.fingerprint.encode())
            return
        self.windows_kept = self._trim_scratch_store()

    def _trim_scratch_store(self) -> int:
        """:meth:`_trim_scratch` in a store."""
        kept = 0
        for name, info in store.listing(self.tmp).items():
            if name == SCRATCH_FINGERPRINT:
                continue
            where = store.join(self.tmp, name)
            if (name.startswith(WINDOW_DIR_PREFIX) and info.type == pafs.FileType.Directory
                    and store.size_of(store.join(where, WINDOW_DONE)) is not None):
                kept += 1
                continue
            store.delete_tree(where) if info.type == pafs.FileType.Directory \
                else store.delete(where)
        return kept

    def _begin_write_store(self) -> None:
        uri = self.path
        if not self.resume:  # the manifest first, so a replaced pack never looks complete
            store.delete(store.join(uri, MANIFEST_NAME))
            for name, info in store.listing(uri).items():
                if info.type == pafs.FileType.File and fnmatch.fnmatchcase(name, SHARD_GLOB):
                    store.delete(store.join(uri, name))
        self._write_marker()
        self._writing = True

    def _commit_store(self, manifest: dict, schema) -> None:
        store.write_bytes(store.join(self.path, MANIFEST_NAME), manifest_bytes(manifest, schema))
        self._writing = False
        self.manifest = manifest
        store.delete(store.join(self.path, IN_PROGRESS_NAME))
        store.delete_tree(self.tmp)

    def _cleanup_store(self, exc: BaseException | None) -> None:
        try:
            try:
                if not self._keeps_windows(exc):
                    store.delete_tree(self.tmp)
            except store.STORE_ERRORS:
                pass
            if exc is not None and self._writing:
                try:  # the marker lists every shard finished, for the rerun
                    self._write_marker()
                except store.STORE_ERRORS:
                    pass
        finally:
            if self._store_lock is not None:
                store.release_lock(self.path, self._store_lock)
                self._store_lock = None


#: Seconds between two rewrites of an object-store marker listing the finished shards.
MARKER_EVERY_S = 10.0


def _inside_key(child: str, parent: str) -> bool:
    child, parent = child.rstrip("/"), parent.rstrip("/")
    return child == parent or child.startswith(parent + "/")


# -- the I/O of the pack's tasks: a scratch directory or prefix, shards, on any node --------------

def _remote(where) -> bool:
    from packtool.formats.reader import is_remote

    return is_remote(where)


def window_done(final: str) -> dict | None:
    """The saved counts of a finished window (its ``done.json``), None when not finished."""
    if _remote(final):
        return store.read_json(store.join(final, WINDOW_DONE))
    try:
        return json.loads((Path(final) / WINDOW_DONE).read_text())
    except (OSError, ValueError):
        return None


def window_workdir(tmp: str, name: str) -> Path:
    """A new empty local directory where a window task writes ``name``'s files: inside the
    scratch directory (renamed into place later), or, for a scratch prefix in a store, in the
    task's own temporary directory (its node's disk; uploaded, then removed)."""
    work = (store.node_temp(name) if _remote(tmp)
            else Path(tmp) / f".{uuid.uuid4().hex}-{name}")
    work.mkdir()
    return work


def publish_window(work: Path, final: str) -> None:
    """Make a finished window directory ``work`` (``done.json`` in it) the window ``final``.

    Local: one rename (an attempt that lost the race to an identical one is dropped). Store:
    every file is put under ``final/``, ``done.json`` last, then ``work`` is removed; a window
    whose ``done.json`` is there is complete.
    """
    if _remote(final):
        try:
            for p in sorted(work.iterdir(), key=lambda q: q.name == WINDOW_DONE):
                store.put_file(p, store.join(final, p.name))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        os.rename(work, final)
    except OSError:
        if not (Path(final) / WINDOW_DONE).is_file():
            raise
        shutil.rmtree(work, ignore_errors=True)  # another attempt finished the same bytes


def window_file(directory: str, name: str) -> str:
    """Location of file ``name`` of a window directory (path or URI)."""
    return store.join(directory, name) if _remote(directory) else str(Path(directory) / name)


def shard_temp(tmp: str, name: str) -> Path:
    """A unique local path where a shard task writes shard ``name`` before publishing it: in
    the scratch directory, or (scratch in a store) in a new directory of the task's own
    temporary directory. :func:`discard_shard_temp` removes what is left of it."""
    if _remote(tmp):
        d = store.node_temp("shard")
        d.mkdir()
        return d / name
    return Path(tmp) / f"{uuid.uuid4().hex}-{name}"


def discard_shard_temp(path: Path, tmp: str) -> None:
    """Remove a shard task's local file (and, for a store, its directory with the writer's own
    temporary file in it); the scratch directory's leftovers go with the scratch directory."""
    if _remote(tmp):
        shutil.rmtree(path.parent, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def publish_shard(written: Path, output: str, name: str) -> None:
    """Publish the finished shard file ``written`` as ``output/name``: ``os.replace`` locally,
    one upload (whole or not at all) to a store (the caller removes the local file)."""
    if _remote(output):
        store.put_file(written, store.join(output, name))
        return
    os.replace(written, Path(output) / name)


def kept_shard(output: str, name: str, promised: dict | None) -> tuple[int, str | None] | None:
    """(bytes, sha256) of shard ``name`` already in OUTPUT from an interrupted identical run,
    or None when it must be written.

    Local: a file at the final name is whole (renamed into place); its sha256 is None (the
    caller hashes the file). Store:
    kept only when the marker ``promised`` its size and sha256 and the object has that size (a
    put is whole or absent, and every attempt puts the same bytes).
    """
    if _remote(output):
        if not promised:
            return None
        size = store.size_of(store.join(output, name))
        return (size, promised["sha256"]) if size == promised.get("bytes") else None
    final = Path(output) / name
    if not final.is_file():
        return None
    return final.stat().st_size, None
