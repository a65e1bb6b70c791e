"""A local cache of whole shards read from a store, bounded in bytes and shared by processes.

Training reads the same shards every epoch; a node that keeps them on its own disk reads the store
once. :class:`ShardCache` keeps whole shard files in one directory, named by their sha256
(``<sha256>.parquet``): content-addressed, so a cached file is never served for another content,
and two outputs that share a shard share its copy.

- **Never a partial file.** A shard is downloaded to ``.<sha256>.<unique>.part`` (created at its
  full size, so it counts against the cap from the start), hashed while it streams in, checked
  against the manifest's size and sha256, fsynced and renamed into place. A copy that does not
  match is refused (:class:`~packtool.errors.ManifestError`), never served.
- **Shared.** Ranks and DataLoader workers of one node may share the directory: one process
  downloads a shard while the others wait on its lock (``filelock``, released by the kernel if
  the process dies); eviction runs under one directory lock.
- **Bounded.** Before a download, the least recently used files are deleted until the cached
  files plus the downloads in flight plus the new shard fit ``max_bytes``; a shard that cannot fit
  is read from the store directly (:meth:`ShardCache.fetch` returns None). A file another
  process still reads stays readable after its deletion (POSIX), so eviction never breaks a
  reader; one evicted between :meth:`ShardCache.fetch` and its open is fetched again
  (:meth:`ShardCache.open`, a few times, then read from the store). Each use of a file sets its
  mtime, which orders the eviction.
- **Survives a restart.** A file whose name and size match is reused as it is; a ``.part`` left
  by a killed process is removed once its lock is free.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

from filelock import FileLock, Timeout

from packtool.errors import ConfigError, ManifestError

__all__ = ["ShardCache", "parse_bytes"]

_ENTRY = re.compile(r"^[0-9a-f]{64}\.parquet$")
_PART = re.compile(r"^\.([0-9a-f]{64})\.[0-9a-f]{32}\.part$")
_CHUNK = 8 << 20
_OPEN_TRIES = 3  # fetches of a copy other processes keep evicting before it is read from the store
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40,
          "TB": 1 << 40, "TIB": 1 << 40}


def parse_bytes(value: "int | str") -> int:
    """A size in bytes from an int or a string such as ``20G``, ``512MiB`` or ``1.5T``.

    Raises:
        ConfigError: not a positive finite size.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise ConfigError(f"cache size {value!r}: give bytes or a size such as 20G or 512M")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ConfigError(f"cache size {value!r}: must be > 0 bytes")
    return n


def _not_a_directory(directory: Path) -> str | None:
    """Why ``directory`` cannot be created as a directory when it, or the nearest of its
    parents that exists, is not one: a file, a link to a file or to nothing, a socket...
    (the rest of a one-line message: what is in the way and the fix), or None where that
    is not why."""
    for p in (directory, *directory.parents):
        if not os.path.lexists(p):
            continue
        if p.is_dir():
            return None
        where = "" if p == directory else f"{p} "
        other = "or give cache_dir another path"
        if p.is_symlink():
            target = os.readlink(p)
            if not p.exists():
                return (f"{where}is a link to {target}, which does not exist; create that "
                        f"directory {other}")
            return (f"{where}is a link to the file {target}, not a directory; remove the link "
                    f"{other}")
        if p.is_file():
            return f"{where}is a file, not a directory; move the file away {other}"
        return f"{where}exists and is not a directory; move it away {other}"
    return None


class ShardCache:
    """Whole shard files in ``directory``, at most ``max_bytes`` in all (see the module docstring).

    Args:
        directory: the cache directory (created when missing).
        max_bytes: the cap, an int or a size string (``20G``).

    Raises:
        ConfigError: a bad size, or a directory that cannot be created or written (a read-only
            mount, no write permission: a probe file is created and removed here, so the first
            read does not fail on the shard's lock file); a path that is a file, lies under a
            file, or is a link to a file or to nothing names that file or link and the fix.
    """

    def __init__(self, directory: "str | os.PathLike", max_bytes: "int | str") -> None:
        self.directory = Path(directory)
        self.max_bytes = parse_bytes(max_bytes)
        doing = "created"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            doing = "written"
            probe = self.directory / f".probe.{uuid.uuid4().hex}"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        except OSError as exc:
            blocked = _not_a_directory(self.directory) if doing == "created" else None
            if blocked is not None:
                raise ConfigError(f"cache directory {self.directory}: {blocked}") from None
            raise ConfigError(f"cache directory {self.directory}: cannot be {doing} "
                              f"({exc.strerror or exc}); choose a writable directory") from None

    def __repr__(self) -> str:
        return f"ShardCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    def path_for(self, sha256: str) -> Path:
        """Where the copy of the shard of this sha256 lives (present or not)."""
        return self.directory / f"{sha256}.parquet"

    def used_bytes(self) -> int:
        """Bytes of the cached files and the downloads in flight."""
        return sum(size for _, size, _ in self._files())

    def _files(self):
        """(path, size, mtime_ns) of every cached file and ``.part`` download."""
        out = []
        try:
            it = os.scandir(self.directory)
        except FileNotFoundError:
            return out
        with it:
            for e in it:
                if _ENTRY.match(e.name) or _PART.match(e.name):
                    try:
                        st = e.stat()
                    except FileNotFoundError:
                        continue
                    out.append((Path(e.path), st.st_size, st.st_mtime_ns))
        return out

    def _touch(self, path: Path) -> None:
        try:
            os.utime(path)
        except OSError:
            pass

    def fetch(self, source, sha256: str, size: int) -> Path | None:
        """A local copy of the shard at ``source``, downloading it when not cached.

        Args:
            source: the shard's :class:`~packtool.location.Location` (a store URI).
            sha256: its sha256 from the manifest (the cache key, checked on download).
            size: its size in bytes from the manifest.

        Returns:
            The cached file's path, or None when the shard cannot fit under the cap (read it
            from the store instead).

        Raises:
            ManifestError: the downloaded bytes differ from the manifest (size or sha256).
            OSError: the store cannot be read or the cache directory written.
        """
        final = self.path_for(sha256)
        if self._ready(final, size):
            return final
        if size > self.max_bytes:
            return None
        with FileLock(self.directory / f".{sha256}.lock"):
            if self._ready(final, size):
                return final
            part = self._reserve(sha256, size)
            if part is None:
                return None
            try:
                self._download(source, part, sha256, size)
                os.replace(part, final)
            finally:
                part.unlink(missing_ok=True)
        return final

    def open(self, source, sha256: str, size: int, opener):
        """The shard's cached copy opened with ``opener(path)`` (:meth:`fetch`, then open): a
        reader holds the copy from then on, whatever another process evicts. A copy evicted
        between the fetch and the open (``opener`` raises FileNotFoundError) is fetched again,
        up to ``_OPEN_TRIES`` times.

        Returns:
            What ``opener`` returned, or None: the shard cannot fit under the cap, or other
            processes evicted it each time (read it from the store instead).

        Raises:
            ManifestError, OSError: as :meth:`fetch` (the store's shard, the cache directory);
                OSError other than FileNotFoundError from ``opener``.
        """
        for _ in range(_OPEN_TRIES):
            path = self.fetch(source, sha256, size)
            if path is None:
                return None
            try:
                return opener(path)
            except FileNotFoundError:
                continue  # evicted by another process since the fetch found it
        return None

    def discard(self, sha256: str) -> bool:
        """Remove the cached copy of the shard of this sha256 (one found damaged on this disk:
        the next :meth:`fetch` downloads it again); True when there was one."""
        with FileLock(self.directory / f".{sha256}.lock"):
            try:
                self.path_for(sha256).unlink()
            except FileNotFoundError:
                return False
        return True

    def _ready(self, final: Path, size: int) -> bool:
        try:
            ok = final.stat().st_size == size
        except FileNotFoundError:
            return False
        if ok:
            self._touch(final)
        return ok

    def _reserve(self, sha256: str, size: int) -> Path | None:
        """Make room for ``size`` bytes (least recently used first) and create the ``.part``
        file at that size; None when the downloads in flight leave no room."""
        with FileLock(self.directory / ".cache.lock"):
            files = self._files()
            for path, _, _ in [f for f in files if _PART.match(f[0].name)]:
                # a part of this shard is stale: this process holds the shard's lock
                if _PART.match(path.name).group(1) == sha256 or self._stale_part(path):
                    path.unlink(missing_ok=True)
            files = sorted(self._files(), key=lambda f: f[2])  # oldest first
            total = sum(f[1] for f in files)
            for path, fsize, _ in files:
                if total + size <= self.max_bytes:
                    break
                if _ENTRY.match(path.name):
                    path.unlink(missing_ok=True)
                    total -= fsize
            if total + size > self.max_bytes:
                return None
            part = self.directory / f".{sha256}.{uuid.uuid4().hex}.part"
            with open(part, "wb") as f:
                f.truncate(size)  # counts at its full size from now on
            return part

    def _stale_part(self, part: Path) -> bool:
        """True for a ``.part`` whose downloader is gone (its lock is free)."""
        sha = _PART.match(part.name).group(1)
        try:
            with FileLock(self.directory / f".{sha}.lock", timeout=0):
                return True
        except Timeout:
            return False

    def _download(self, source, part: Path, sha256: str, size: int) -> None:
        fs, inner = source.filesystem()
        h = hashlib.sha256()
        n = 0
        with fs.open_input_stream(inner) as src, open(part, "r+b") as dst:
            while block := src.read(_CHUNK):
                h.update(block)
                dst.write(block)
                n += len(block)
            dst.truncate(n)
            dst.flush()
            os.fsync(dst.fileno())
        if n != size or h.hexdigest() != sha256:
            what = f"{n} bytes, the manifest says {size}" if n != size else \
                "sha256 differs from the manifest"
            raise ManifestError(f"{source.display}: {what}: the shard was modified; rerun the "
                                "same packtool pack with --overwrite")
