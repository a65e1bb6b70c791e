"""``packtool upgrade``: an older output's manifest (format version 2 or 3) rewritten as this
version's, its shards untouched, once every shard's sha256 is checked and every reader would
open it. A packed output and a ``tokenize`` output alike: version 4 changed only what the
totals' ``tokens_dropped`` counts, which is 0 in a tokenized output, so its rewrite changes
its version and fills in the row groups and footer sha256 a version-2 manifest lacks."""

from __future__ import annotations

from typing import Callable

import pyarrow as pa

from packtool.errors import ManifestError
from packtool.formats.manifest import (FORMAT_VERSION, PACKED_KIND, Manifest, ShardEntry,
                                       check_rows_add_up, check_shards, publish_manifest,
                                       read_manifest_and_schema, shard_entry_of)
from packtool.formats.packed import PackedOutput
from packtool.location import Location
from packtool.output import holding_lock
from packtool.signals import hold, interruptible, test_pause

__all__ = ["upgrade_manifest"]


def upgrade_manifest(output, *, progress: Callable[[int, int], None] | None = None) -> bool:
    """Rewrite an older output's manifest (format version 2 or 3; a packed or a tokenized
    output) as :data:`~packtool.formats.manifest.FORMAT_VERSION`, shards untouched.

    Every shard's sha256 is checked against the old manifest first (the new one vouches for
    them), then each shard's footer is read for its row groups and footer sha256 (a tokenized
    output's footers must say what its manifest does: rows, and the footer sha256 and row
    groups where recorded; its shards must add up to its ``docs_in``). The shards
    keep what their version wrote (version 2: no page checksums; readers check their size,
    footer and sha256). The totals are written in this version's meaning, as reading the old
    manifest converted them (``tokens_dropped`` counts the truncated tails too).

    OUTPUT's lock (the one ``pack`` and ``tokenize`` hold while they write it) is held from
    the checks to the rewrite (:func:`packtool.output.holding_lock`): a run writing OUTPUT
    refuses the upgrade, and a run started meanwhile is refused.

    Ctrl-C or SIGTERM (:func:`packtool.signals.interruptible`, entered here) stops the checks
    with the output unchanged (``KeyboardInterrupt``); from the rewrite on they are held until
    it is done, and one after it finds the upgrade finished.

    Returns:
        True when the manifest was rewritten, False when it already was this version.

    Raises:
        ManifestError: not a complete output, a shard that differs from the manifest, or a
            manifest every reader refuses (its capacity, labels or row counts contradict the
            shards' footers and schema metadata; a tokenized output's documents likewise).
        OutputError: another packtool run (``pack``, ``tokenize``, ``upgrade``) holds OUTPUT's
            lock now (named by its in-progress marker or a store's lock object, else as another
            packtool run), or OUTPUT cannot be written.
        OSError: the manifest cannot be written.
    """
    out = Location.parse(output)
    with interruptible():  # left once the rewrite is done: a later signal finds it finished
        manifest, schema = read_manifest_and_schema(out)
        if manifest.format_version == FORMAT_VERSION:
            return False  # nothing written: no lock asked for (a read-only output is fine)
        with holding_lock(out, "upgrade"):
            return _upgrade(out, progress)


def _upgrade(out: Location, progress) -> bool:
    """:func:`upgrade_manifest` once OUTPUT's lock is held: the manifest read again under it."""
    manifest, schema = read_manifest_and_schema(out)
    if manifest.format_version == FORMAT_VERSION:
        return False
    test_pause("upgrade")
    check_shards(out, manifest, hashes=True, progress=progress)
    packed = manifest.kind == PACKED_KIND
    if packed:
        _check_readable(out, manifest, schema)
    shards = [shard_entry_of(out.join(s.file), sha256=s.sha256) for s in manifest.shards]
    if not packed:  # documents, read by pack as its input: as that reader checks them
        _check_documents(out, manifest, shards)
    release = hold()  # once begun, the rewrite ends (whole: a rename or one put)
    try:
        publish_manifest(out, manifest.replace_shards(shards), schema)
    finally:
        release()
    return True


def _check_readable(out: Location, manifest: Manifest, schema: pa.Schema) -> None:
    """Refuse, as every reader would, a manifest whose shards' footers, schema metadata, columns
    or row counts contradict it (capacity, labels, rows edited): an upgrade must not vouch for
    an output no reader opens, nor replace its counts by the footers' in silence.

    Raises:
        ManifestError: what the readers would say, naming the output and the shard.
    """
    reader = PackedOutput(out, manifest, schema, integrity="footer")
    try:
        for s in range(len(reader.shards)):
            reader._open_checked(s)[1].close()
        check_rows_add_up(manifest, out.display)
    finally:
        reader.close()


def _check_documents(out: Location, manifest: Manifest, found: list[ShardEntry]) -> None:
    """Refuse a tokenized output's manifest that its shards' footers contradict (``found``:
    their entries as read, :func:`~packtool.formats.manifest.shard_entry_of`, in the
    manifest's order): a shard's documents, its footer sha256 or row groups where recorded,
    and the shards' documents against the totals' ``docs_in``; an upgrade must not replace
    them by the footers' in silence.

    Raises:
        ManifestError: names the shard (or the output), both counts and the fix.
    """
    fix = ("the manifest of this tokenized output was edited or damaged; rerun the same packtool "
           "tokenize command with --overwrite")
    for was, now in zip(manifest.shards, found):
        shown = out.join(was.file).display
        if was.rows != now.rows:
            raise ManifestError(f"{shown}: its Parquet footer holds {now.rows:,} documents, the "
                                f"manifest says {was.rows:,}: {fix}")
        if (was.footer_sha256 and was.footer_sha256 != now.footer_sha256) or (
                was.row_groups and tuple(was.row_groups) != tuple(now.row_groups)):
            raise ManifestError(f"{shown}: its Parquet footer differs from the manifest's record "
                                f"of it (footer sha256 or row groups): {fix}")
    check_rows_add_up(manifest, out.display)
