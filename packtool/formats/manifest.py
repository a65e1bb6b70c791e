"""The manifest: written last, atomically; its presence means the output is complete.

It records the packtool version, the full options, the input files (path, rows, bytes), every
output shard (file, rows, bytes, sha256), the columns, the labels convention and the totals.
Readers (``stats``, ``verify``, the loaders) call :func:`load_manifest`, which refuses
incomplete, edited or extra shards.

**A directory that is a dataset.** OUTPUT must open as it is, as a directory, in every common
Parquet reader. Measured with pyarrow 26, polars 2.1, duckdb 2.0 and datasets 5.2:

==================================  ==========  =======  ======  ============================
extra file beside the shards        pyarrow     polars   duckdb  ``load_dataset("parquet",
                                    dataset,                     data_dir=...)``
                                    read_table
==================================  ==========  =======  ======  ============================
``manifest.json``                   fails       fails    ok      fails
``_manifest.json``, ``_x/m.json``   skips       fails    ok      fails
``.manifest.json``, ``.x/m.json``   skips       fails    ok      skips
``_manifest.parquet`` (0 rows)      skips       0 rows   0 rows  fails (batch size 0)
``.packtool-manifest.parquet``      skips       0 rows   0 rows  skips
(0 rows, the shards' schema)
==================================  ==========  =======  ======  ============================

polars refuses any directory holding a file of another extension, hidden or not, so no JSON
name works for every reader. The manifest is therefore a hidden Parquet file with the shards'
schema and no rows, its JSON in the key-value metadata (:data:`MANIFEST_META_KEY`), the way
Parquet's own ``_common_metadata`` file carries a schema: pyarrow and datasets skip it (leading
``.``), polars and duckdb add zero rows. :func:`read_manifest` returns the JSON as a dict.

While ``pack`` runs, OUTPUT also holds :data:`IN_PROGRESS_NAME` and :data:`TMP_DIR_NAME`
(removed when the manifest is written); an output with them is incomplete anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packtool.errors import ManifestError

__all__ = ["MANIFEST_NAME", "MANIFEST_META_KEY", "IN_PROGRESS_NAME", "TMP_DIR_NAME", "LOCK_NAME",
           "SHARD_GLOB", "FORMAT_VERSION", "sha256_file", "write_json_atomic", "write_manifest_file",
           "manifest_bytes", "manifest_from_bytes", "manifest_kind",
           "read_manifest", "load_manifest", "shard_name"]

#: File name of the manifest inside OUTPUT (a zero-row Parquet file, see the module docstring).
MANIFEST_NAME = ".packtool-manifest.parquet"
#: Key-value metadata key of the manifest file holding the manifest JSON.
MANIFEST_META_KEY = b"packtool.manifest"
#: Marker of a pack in progress (its input fingerprint), removed when the manifest is written.
IN_PROGRESS_NAME = ".packtool-in-progress.json"
#: Scratch directory of a pack in progress (the token spill file, window markers).
TMP_DIR_NAME = ".packtool-tmp"
#: Lock file held by the one ``pack`` writing OUTPUT (removed when it ends).
LOCK_NAME = ".packtool.lock"
#: Glob of the output shards at OUTPUT's top level.
SHARD_GLOB = "part-*.parquet"
FORMAT_VERSION = 2


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


def _publish_atomic(path: Path, write) -> None:
    """Call ``write(tmp)`` on a unique temporary name beside ``path``, fsync it, then
    ``os.replace`` it onto ``path``; on any failure (Ctrl-C included) the temporary is removed, so
    two writers never share a temporary and an interrupted write leaves nothing behind."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (unique temporary name, fsync, rename)."""
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    _publish_atomic(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _manifest_table(manifest: dict, schema: pa.Schema) -> pa.Table:
    meta = dict(schema.metadata or {})
    meta[MANIFEST_META_KEY] = json.dumps(manifest, sort_keys=True).encode()
    return schema.with_metadata(meta).empty_table()


def manifest_bytes(manifest: dict, schema: pa.Schema) -> bytes:
    """The bytes :func:`write_manifest_file` writes, for a store (one PUT)."""
    sink = pa.BufferOutputStream()
    pq.write_table(_manifest_table(manifest, schema), sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def write_manifest_file(directory: Path, manifest: dict, schema: pa.Schema) -> Path:
    """Write ``manifest`` as ``directory/.packtool-manifest.parquet``: zero rows of ``schema`` (the
    shards' schema), the JSON under :data:`MANIFEST_META_KEY`; temporary name, fsync, rename.

    Returns:
        The manifest's path.
    """
    table = _manifest_table(manifest, schema)
    path = Path(directory) / MANIFEST_NAME
    _publish_atomic(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return path


def manifest_from_bytes(data: bytes, where) -> dict:
    """The manifest JSON held by a manifest file's bytes (``where`` names it in errors).

    Raises:
        ManifestError: not a readable manifest.
    """
    try:
        meta = pq.read_schema(pa.BufferReader(data)).metadata or {}
        manifest = json.loads(meta[MANIFEST_META_KEY])
        manifest["outputs"]
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{where}: unreadable manifest ({exc}); rerun the same packtool pack "
                            "with --overwrite") from None
    return manifest


def manifest_kind(directory: str | os.PathLike) -> str | None:
    """``packed`` (``packtool pack``), ``tokenized`` (``packtool tokenize``), or None when
    ``directory`` holds no readable manifest."""
    try:
        return read_manifest(directory).get("kind", "packed")
    except ManifestError:
        return None


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest JSON of a packed OUTPUT directory, without checking the shards.

    Raises:
        ManifestError: no manifest, or one that is not readable.
    """
    d = Path(directory)
    mpath = d / MANIFEST_NAME
    if not mpath.is_file():
        raise ManifestError(f"{d}: no {MANIFEST_NAME}: not a packtool output or an interrupted "
                            "pack; rerun packtool pack to finish it")
    try:
        data = mpath.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{mpath}: unreadable manifest ({exc}); rerun the same packtool pack "
                            "with --overwrite") from None
    return manifest_from_bytes(data, mpath)


#: ``scheme:/`` or ``scheme://`` at the start of a path (pathlib folds ``//`` into ``/``)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/+")


#: a ``file:`` URI's scheme (and empty host), before the absolute path it names
FILE_URI = re.compile(r"^file:(?://)?(?=/)", re.IGNORECASE)


def output_dir(directory: str | os.PathLike) -> Path:
    """The local directory of a packed OUTPUT given as a path or a ``file:`` URI
    (``file:///abs/out``, or ``file:/abs/out`` as pathlib folds it).

    Raises:
        ManifestError: a location in an object store (``s3://...``): readers take a local copy.
    """
    uri = _store_uri(directory)
    if uri:
        raise ManifestError(f"{uri}: a packed output in an object store is read from a local "
                            "copy; copy it to a directory first (e.g. `aws s3 sync URI DIR`) "
                            "and pass DIR")
    text = os.fspath(directory)
    m = FILE_URI.match(text)
    return Path(text[m.end():] if m else text)


def _store_uri(directory) -> str | None:
    """``directory`` as a URI when it names a location in a store (``s3://b/p``, or ``s3:/b/p``
    as pathlib folds it), else None (local paths and ``file:`` URIs)."""
    text = os.fspath(directory)
    m = _SCHEME.match(text)
    if m is None or m.group(1).lower() == "file":
        return None
    return f"{m.group(1)}://{text[m.end():]}"


def load_manifest(directory: str | os.PathLike, *, check_hashes: bool = False) -> dict:
    """Read and check a packed directory's manifest.

    Checks that every listed shard exists with its recorded size (and sha256 when
    ``check_hashes``), and that no unlisted ``part-*.parquet`` is present.

    Raises:
        ManifestError: no manifest (incomplete or not a packtool output), unreadable manifest,
            missing, resized, edited or extra shard; a URI (``s3://...``): readers take a local
            copy of the output.
    """
    d = output_dir(directory)
    if not d.is_dir():
        raise ManifestError(f"{d}: not a directory; pass the OUTPUT directory of packtool pack")
    manifest = read_manifest(d)
    mpath = d / MANIFEST_NAME
    outputs = manifest["outputs"]
    if manifest.get("kind", "packed") != "packed":  # packtool tokenize: documents, not rows
        raise ManifestError(f"{d}: a packtool {manifest['kind']} output (one document per row, "
                            f"not packed rows); pack it first: packtool pack {d} OUTPUT")
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
                                " the shard was modified; rerun the same packtool pack with --overwrite")
        if check_hashes and sha256_file(p) != o["sha256"]:
            raise ManifestError(f"{p}: sha256 differs from the manifest: the shard was modified;"
                                " rerun the same packtool pack with --overwrite")
    extra = sorted(q.name for q in d.glob(SHARD_GLOB) if q.name not in listed)
    if extra:
        raise ManifestError(f"{d / extra[0]}: shard not listed in the manifest; remove it or "
                            "rerun the same packtool pack with --overwrite")
    return manifest
