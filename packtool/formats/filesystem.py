"""The pyarrow filesystem calls behind :mod:`packtool.location` (local files and stores).

:class:`packtool.location.Location` decides what a path names and what each operation means;
this module alone talks to ``pyarrow.fs``, so the location type itself imports no pyarrow. It
knows nothing of locations: every function takes a pyarrow filesystem and a path inside it (or
a local path) and returns plain values.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs

from packtool.errors import raise_if_shortage

__all__ = ["local_filesystem", "open_local", "from_uri", "file_info", "list_dir", "upload"]


def local_filesystem(path: str | os.PathLike) -> tuple[pafs.FileSystem, str]:
    """(this machine's filesystem, the absolute path of ``path``)."""
    return pafs.LocalFileSystem(), os.path.abspath(path)


def open_local(path: str | os.PathLike) -> pa.NativeFile:
    """A random-access file on the local file ``path`` (``read_at``, ``size``); the caller
    closes it.

    Raises:
        OSError: it cannot be opened.
    """
    return pa.OSFile(os.fspath(path), "r")


def from_uri(root: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) of the store URI ``root`` (``scheme://bucket?options``).

    Raises:
        ValueError: pyarrow cannot open it (unknown scheme, bad options, no credentials); the
            message is pyarrow's.
    """
    try:
        return pafs.FileSystem.from_uri(root)
    except pa.ArrowException as exc:
        raise_if_shortage(exc)
        raise ValueError(str(exc)) from None


def file_info(fs: pafs.FileSystem, path: str) -> tuple[bool, int, int] | None:
    """(is a folder, size in bytes, mtime in ns; 0 when unknown) of ``path``, None when absent."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None
    is_dir = info.type == pafs.FileType.Directory
    return is_dir, 0 if is_dir else int(info.size or 0), int(info.mtime_ns or 0)


def file_version(fs: pafs.FileSystem, path: str) -> tuple | None:
    """A value that changes whenever the file at ``path`` is replaced or rewritten: its size and
    what the store says of this version of it (S3: ``ETag``, ``Last-Modified``), else its mtime;
    None when there is no file. One request on a store (S3: the HEAD that opening makes).

    Raises:
        OSError: the store cannot be asked (for :meth:`~packtool.location.Location.store_error`).
    """
    try:
        f = fs.open_input_file(path)
    except (FileNotFoundError, IsADirectoryError):
        return None
    try:
        said = tuple(sorted((str(k), bytes(v)) for k, v in (f.metadata() or {}).items()))
        size = f.size()
    finally:
        f.close()
    if not said:  # a store that says nothing of the version: its mtime
        info = fs.get_file_info(path)
        said = (int(info.mtime_ns or 0),)
    return (size, *said)


def list_dir(fs: pafs.FileSystem, path: str) -> list[tuple[str, bool, int, int]]:
    """(name, is a folder, size in bytes, mtime in ns) of each entry directly inside ``path``;
    empty when it does not exist."""
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    out = []
    for i in infos:
        is_dir = i.type == pafs.FileType.Directory
        out.append((i.path.rstrip("/").rsplit("/", 1)[-1], is_dir,
                    0 if is_dir else int(i.size or 0), int(i.mtime_ns or 0)))
    return out


def upload(src: str | os.PathLike, fs: pafs.FileSystem, path: str) -> None:
    """Copy the local file ``src`` to ``path`` on ``fs`` in one native call."""
    pafs.copy_files(os.fspath(src), path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)
