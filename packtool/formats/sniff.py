"""What a file is, by its first bytes: the one owner of that reading, below the readers of
inputs (:mod:`packtool.formats.reader`) and of packed outputs (:mod:`packtool.formats.manifest`,
:mod:`packtool.formats.packed`), which name the fix it gives in their messages.

A file's name says its format; its first bytes may say otherwise: a Git LFS pointer (a clone
made without ``git lfs pull``: the data was never fetched), Parquet (``PAR1``) or Arrow IPC
(``ARROW1``, or a stream's continuation marker) under another name, or a compressed file
(gzip, zstd, bzip2, ...) under a plain name, or a plain one under a compressed name.
"""

from __future__ import annotations

import pyarrow as pa

from packtool.errors import PacktoolError, raise_if_shortage
from packtool.location import Location

__all__ = ["LFS_POINTER", "IPC_FILE_MAGIC", "COMPRESSED_MAGIC", "compression_of", "content_fix",
           "table_format_of", "shard_content_fix"]

#: The first bytes of a Git LFS pointer: what a clone made without ``git lfs pull`` holds in
#: place of each data file.
LFS_POINTER = b"version https://git-lfs"
#: The first bytes of an Arrow IPC file (a stream starts with ``0xFFFFFFFF`` instead).
IPC_FILE_MAGIC = b"ARROW1"
#: (leading bytes, tool, command that decompresses, file suffix) of compressed files.
COMPRESSED_MAGIC = ((b"\x1f\x8b", "gzip", "gunzip", ".gz"),
                    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d", ".zst"),
                    (b"BZh", "bzip2", "bunzip2", ".bz2"), (b"\xfd7zXZ\x00", "xz", "unxz", ".xz"),
                    (b"\x04\x22\x4d\x18", "lz4", "lz4 -d", ".lz4"),
                    (b"PK\x03\x04", "zip", "unzip", ".zip"))


def compression_of(head: bytes) -> tuple[str, str, str] | None:
    """(tool, command that decompresses, file suffix) of the compression a file's first bytes
    ``head`` say it is in (``("gzip", "gunzip", ".gz")``); None for bytes of no compression
    :data:`COMPRESSED_MAGIC` knows."""
    for magic, tool, command, suffix in COMPRESSED_MAGIC:
        if head.startswith(magic):
            return tool, command, suffix
    return None


#: How :func:`content_fix` names the format a file's name says.
_NAMED_LIKE = {"Parquet": "a Parquet file", "Arrow IPC": "an Arrow IPC file",
               "JSON Lines": "JSON Lines"}


def table_format_of(head: bytes) -> str | None:
    """``Parquet`` or ``Arrow IPC`` when a file's first bytes ``head`` are that format's magic
    (``PAR1``; ``ARROW1``, or an IPC stream's continuation marker); None otherwise."""
    if head.startswith(b"PAR1"):
        return "Parquet"
    if head.startswith((IPC_FILE_MAGIC, b"\xff\xff\xff\xff")):
        return "Arrow IPC"
    return None


def content_fix(head: bytes, named: str | None = None) -> str | None:
    """What a file is, by its first bytes ``head``, and the fix, when that is not what its
    name says (``named``: ``Parquet``, ``Arrow IPC`` or ``JSON Lines``, the format its name
    says; None: a name of no format packtool reads); None when the bytes say nothing more.
    """
    if head.startswith(LFS_POINTER):
        return ("is a Git LFS pointer, not the data (the repository was cloned without its "
                "LFS files): run git lfs pull in that repository")
    found = table_format_of(head)
    if found is not None and found != named:
        other = _NAMED_LIKE.get(named, "no format packtool reads")
        article = "a" if found == "Parquet" else "an"
        suffix = ".parquet" if found == "Parquet" else ".arrow"
        return f"is {article} {found} file named like {other}; rename it to *{suffix}"
    return None


def shard_content_fix(shown) -> str | None:
    """What a packed shard ``shown`` (a path, URI or :class:`~packtool.location.Location`)
    whose size differs from its manifest's is instead, by its first 32 bytes
    (:func:`content_fix`): ``is a Git LFS pointer, ...: run git lfs pull ...`` for a clone
    made without its LFS files; None when they say nothing more or cannot be read."""
    try:
        f = Location.parse(shown).open_input()
        try:
            head = f.read_at(min(32, f.size()), 0)
        finally:
            f.close()
    except (PacktoolError, pa.ArrowException, OSError) as exc:
        raise_if_shortage(exc, str(shown))
        return None
    return content_fix(bytes(head), "Parquet")
