"""``manifest.json``: written last, atomically; its presence means the output is complete.

It records the packtool version, the full options, the input files (path, rows, bytes), every
output shard (file, rows, bytes, sha256) and the totals. Readers (``stats``, ``verify``, the
torch loader) call :func:`load_manifest`, which refuses incomplete, edited or extra shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from packtool.errors import ManifestError

__all__ = ["MANIFEST_NAME", "FORMAT_VERSION", "sha256_file", "write_json_atomic",
           "load_manifest", "shard_name"]

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


def shard_name(index: int) -> str:
    """File name of output shard ``index`` (``part-00000.parquet``)."""
    return f"part-{index:05d}.parquet"


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks of ``chunk_bytes``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file, fsync and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_manifest(directory: str | os.PathLike, *, check_hashes: bool = False) -> dict:
    """Read and check a packed directory's manifest.

    Checks that every listed shard exists with its recorded size (and sha256 when
    ``check_hashes``), and that no unlisted ``part-*.parquet`` is present.

    Raises:
        ManifestError: no manifest (incomplete or not a packtool output), unreadable manifest,
            missing, resized, edited or extra shard.
    """
    d = Path(directory)
    if not d.is_dir():
        raise ManifestError(f"{d}: not a directory; pass the OUTPUT directory of packtool pack")
    mpath = d / MANIFEST_NAME
    if not mpath.is_file():
        raise ManifestError(f"{d}: no {MANIFEST_NAME}: not a packtool output or an interrupted "
                            "pack; rerun packtool pack to finish it")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        outputs = manifest["outputs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{mpath}: unreadable manifest ({exc}); rerun packtool pack") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ManifestError(f"{mpath}: format_version {manifest.get('format_version')!r}, this "
                            f"packtool reads {FORMAT_VERSION}; repack with this version")
    listed = {o["file"] for o in outputs}
    for o in outputs:
        p = d / o["file"]
        if not p.is_file():
            raise ManifestError(f"{p}: shard listed in the manifest is missing; rerun packtool "
                                "pack")
        if p.stat().st_size != o["bytes"]:
            raise ManifestError(f"{p}: size {p.stat().st_size} bytes, manifest says {o['bytes']}:"
                                " the shard was modified; rerun packtool pack")
        if check_hashes and sha256_file(p) != o["sha256"]:
            raise ManifestError(f"{p}: sha256 differs from the manifest: the shard was modified;"
                                " rerun packtool pack")
    extra = sorted(q.name for q in d.glob("part-*.parquet") if q.name not in listed)
    if extra:
        raise ManifestError(f"{d / extra[0]}: shard not listed in the manifest; remove it or "
                            "rerun packtool pack")
    return manifest
