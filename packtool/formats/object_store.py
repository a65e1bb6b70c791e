"""OUTPUT in an object store (``s3://bucket/prefix``, ...): stage locally, then publish.

An object store has no rename, no hard links and no atomic "create if absent", which the local
OUTPUT relies on (temporary names, ``os.replace``, a lock file). The guarantees are kept this
way:

1. **Stage.** The pack runs unchanged into a local staging directory named after the OUTPUT
   URI (under ``$PACKTOOL_STAGING_DIR``, default the system temporary directory), with every
   local rule: temporary names, rename, lock, resume of an interrupted identical pack. It needs
   local disk for the whole output.
2. **Publish.** An in-progress marker object is written first, then each shard with one PUT to
   its final key: a PUT is atomic (an object appears whole or not at all), so no temporary name
   is needed. The manifest is written last, then the marker is deleted, so a reader never
   sees a manifest before every shard it lists. The marker lists the sha256 of every shard to
   be published; a rerun after a kill keeps an object that an earlier marker promised with the
   same sha256 and that has the right size (a PUT is all or nothing), and uploads the rest.
3. **Lock.** A lock object (``.packtool-lock.json``: run id, host, pid) is written before
   anything else and read back; another live run's lock refuses the run with its id and host.
   A lock whose process is gone from this host (a killed run) is taken over, so a plain rerun
   resumes; a lock from another host is honoured until ``--overwrite``. Without an atomic create
   this is advisory: two runs started within the same moment could both pass, as pyarrow
   exposes no conditional PUT. The lock is removed at the end.

The staging directory is removed once the manifest is published.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from packtool.errors import ManifestError, OutputError
from packtool.formats.manifest import IN_PROGRESS_NAME, MANIFEST_NAME, read_manifest
from packtool.formats.reader import discover_inputs, filesystem_of

__all__ = ["staging_dir", "pack_to_store", "LOCK_NAME", "MARKER_NAME"]

log = logging.getLogger(__name__)

LOCK_NAME = ".packtool-lock.json"
MARKER_NAME = IN_PROGRESS_NAME  # the in-progress marker, as in a local OUTPUT
_PAUSE_ENV = "PACKTOOL_TEST_PAUSE_AT"  # the pipeline's test hook, here for the publish phase


def _test_pause(phase: str, index: int) -> None:
    want = os.environ.get(_PAUSE_ENV)
    if want and want.partition(":")[0] == phase and int(want.partition(":")[2] or 0) == index:
        print(f"packtool: test pause at {want}", file=sys.stderr, flush=True)
        time.sleep(3600)


def staging_dir(output_uri: str) -> Path:
    """The local staging directory of OUTPUT ``output_uri`` (stable across reruns)."""
    root = Path(os.environ.get("PACKTOOL_STAGING_DIR") or tempfile.gettempdir())
    return root / f"packtool-stage-{hashlib.sha256(output_uri.encode()).hexdigest()[:16]}"


def _read_json(fs: pafs.FileSystem, path: str) -> dict | None:
    try:
        with fs.open_input_stream(path) as fh:
            doc = json.loads(fh.read())
    except (OSError, ValueError, pa.ArrowException):
        return None
    return doc if isinstance(doc, dict) else None


def _write_bytes(fs: pafs.FileSystem, path: str, data: bytes, metadata=None) -> None:
    with fs.open_output_stream(path, metadata=metadata) as fh:
        fh.write(data)


def _listing(fs: pafs.FileSystem, base: str) -> dict[str, pafs.FileInfo]:
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=False, allow_not_found=True))
    except (OSError, pa.ArrowException) as exc:
        raise OutputError(f"{base}: cannot list OUTPUT ({exc}); check the URI and the "
                          "credentials") from None
    return {i.path.rsplit("/", 1)[-1]: i for i in infos}


def _stale(lock: dict) -> bool:
    """True for a lock left by a process of this machine that no longer runs (killed)."""
    if lock.get("host") != socket.gethostname():
        return False  # another machine's run: cannot be told dead from alive
    try:
        os.kill(int(lock.get("pid", -1)), 0)
    except (OSError, ValueError, OverflowError):
        return True
    return False


def _stage_is_complete(stage: Path, cfg) -> dict | None:
    """The staged manifest when it is a finished pack of these inputs and options."""
    try:
        m = read_manifest(stage)
    except ManifestError:
        return None
    if m.get("options") != json.loads(json.dumps(cfg.layout_options())):
        return None
    files = discover_inputs(list(cfg.inputs))
    if [(i.get("path"), i.get("bytes")) for i in m.get("inputs", [])] != [
            (str(f.path), f.bytes) for f in files]:
        return None
    return m


def pack_to_store(cfg, *, progress: bool = True):
    """Run ``packtool pack`` with OUTPUT in an object store (the rules in the module doc).

    Args:
        cfg: :class:`packtool.config.PackConfig` whose ``output`` is a URI.
        progress: progress bars on stderr.

    Returns:
        :class:`packtool.pipeline.PackResult` (its manifest is the one published).

    Raises:
        OutputError: OUTPUT holds other data or a complete pack (without ``--overwrite``),
            another run holds its lock, or it cannot be written.
        InputError, SchemaError, PackingError: as :func:`packtool.pipeline.run_pack`.
    """
    from packtool.pipeline import PackResult, run_pack
    from packtool.stats import PackStats

    uri = cfg.output.rstrip("/")
    fs, base, _ = filesystem_of(uri)
    t0 = time.perf_counter()
    found = _listing(fs, base)
    lock = _read_json(fs, f"{base}/{LOCK_NAME}") if found.pop(LOCK_NAME, None) else None
    ours = MARKER_NAME in found and MANIFEST_NAME not in found
    if lock is not None and not cfg.overwrite and not _stale(lock):
        raise OutputError(f"{uri}: another pack (run {lock.get('run', '?')} on "
                          f"{lock.get('host', '?')}) holds {LOCK_NAME}; wait for it, or pass "
                          "--overwrite if it was killed")
    if found and not ours and not (lock is not None and set(found) <= {MARKER_NAME}) \
            and not cfg.overwrite:
        raise OutputError(f"{uri}: OUTPUT is not empty; pass --overwrite to replace it or choose "
                          "another prefix")
    run_id = uuid.uuid4().hex
    mine = {"run": run_id, "host": socket.gethostname(), "pid": os.getpid()}
    try:
        _write_bytes(fs, f"{base}/{LOCK_NAME}", json.dumps(mine).encode())
        if _read_json(fs, f"{base}/{LOCK_NAME}") != mine:
            raise OutputError(f"{uri}: another pack took {LOCK_NAME} at the same time; retry")
    except (OSError, pa.ArrowException) as exc:
        raise OutputError(f"{uri}: cannot write ({exc}); check the URI and the "
                          "credentials") from None
    try:
        stage = staging_dir(uri)
        manifest = _stage_is_complete(stage, cfg)
        reused = 0
        if manifest is None:
            # the pack itself: local rules (temporary names, rename, resume) in the stage
            local = dataclasses.replace(cfg, output=str(stage), overwrite=True)
            result = run_pack(local, progress=progress)
            manifest, reused = result.manifest, result.shards_reused
        if not ours:
            # replacing a finished pack: its manifest goes first, so it never looks complete
            for name, info in found.items():
                if name == MANIFEST_NAME:
                    fs.delete_file(info.path)
            for name, info in found.items():
                if info.type == pafs.FileType.File and name.startswith("part-"):
                    fs.delete_file(info.path)
        # the marker lists the sha256 of every shard this publish puts there: a rerun keeps an
        # object only when an earlier marker promised the same bytes under that name
        before = (_read_json(fs, f"{base}/{MARKER_NAME}") or {}) if ours else {}
        promised = before.get("sha256", {}) if isinstance(before.get("sha256"), dict) else {}
        shas = {e["file"]: e["sha256"] for e in manifest["outputs"]}
        _write_bytes(fs, f"{base}/{MARKER_NAME}",
                     json.dumps({"run": run_id, "sha256": shas}).encode())
        found = _listing(fs, base)
        for k, entry in enumerate(manifest["outputs"]):
            _test_pause("upload", k)
            key = f"{base}/{entry['file']}"
            have = found.get(entry["file"])
            if (have is not None and have.size == entry["bytes"]
                    and promised.get(entry["file"]) == entry["sha256"]):
                reused += 1
                continue
            with open(stage / entry["file"], "rb") as src, fs.open_output_stream(key) as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        with open(stage / MANIFEST_NAME, "rb") as src, \
                fs.open_output_stream(f"{base}/{MANIFEST_NAME}") as dst:
            shutil.copyfileobj(src, dst)
        fs.delete_file(f"{base}/{MARKER_NAME}")
    except (OSError, pa.ArrowException) as exc:
        raise OutputError(f"{uri}: cannot write ({exc}); rerun the same command to resume") \
            from None
    finally:
        try:
            if _read_json(fs, f"{base}/{LOCK_NAME}") == mine:
                fs.delete_file(f"{base}/{LOCK_NAME}")
        except (OSError, pa.ArrowException):
            pass
    shutil.rmtree(stage, ignore_errors=True)
    total = PackStats.from_dict(manifest["totals"])
    return PackResult(total, manifest, time.perf_counter() - t0, reused)
