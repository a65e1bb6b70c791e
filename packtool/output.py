"""The one owner of OUTPUT: lock, fingerprint, scratch, resume, manifest last, cleanup.

A pack goes through :class:`Output` and nothing else writes into OUTPUT. ``Output(path, ...)``
is a :class:`LocalOutput` for a directory and a :class:`StoreOutput` for a store URI
(``s3://bucket/prefix``); both follow one set of rules, written once here, over the operations of
:class:`packtool.location.Location` (list, read, publish whole, delete). They differ only where
a store offers less: the lock, the disk-space check and the cleanup of unfinished uploads.

1. Entry (``with``) refuses an OUTPUT that overlaps INPUT, is a file, or lies inside another
   packed output, takes the lock (a second ``pack`` into the same OUTPUT is refused at once),
   then decides from one listing of OUTPUT (:meth:`Output._decide`, one table for both kinds):
   a complete output with the same fingerprint and intact shards is *complete* (the run is a
   no-op); an interrupted one with the same fingerprint is *resumed* (its finished shards are
   kept); a foreign or different non-empty OUTPUT is refused unless ``--overwrite``; an OUTPUT
   holding files packtool did not write is always refused (they would break the directory as a
   Parquet dataset).
2. While the input is read and planned only the scratch (:data:`~packtool.formats.manifest.TMP_DIR_NAME`)
   is written; an existing output is left as it was. :meth:`Output.begin_write` then removes what
   ``--overwrite`` replaces (manifest first) and writes the in-progress marker.
3. Shards are written in a staging directory (:meth:`packtool.location.Location.stage`) and
   published whole under their pending name (:func:`publish_shard`: a rename, or one upload;
   :func:`~packtool.formats.manifest.pending_name`, a name no Parquet reader of the folder
   takes); the marker lists the finished shards with their manifest entries (rewritten at most
   every :data:`MARKER_EVERY_S` seconds and when the run fails), so a rerun keeps them without
   reading them again.
4. :meth:`Output.commit` moves every shard to its final name (a rename; a server-side copy in a
   store), writes the manifest right after, and removes the marker, scratch and lock.

Every failure leaves through :meth:`Output.__exit__`, the one cleanup path. With OUTPUT in a
store the tasks stage their files in their own ``TMPDIR``; a task that fails or is stopped
removes its staging directory, and those of killed runs (SIGKILL, the OOM killer) are removed by
the next run on that host (:func:`packtool.location.sweep_stages`, at entry and at a process's
first stage). Ctrl-C leaves what
SIGKILL would, tidied: the scratch keeps its finished read parts (token spills), the staging
directories of read parts begun with their progress records (where a rerun finds them again:
:meth:`packtool.location.Location.claim_stage`), its finished windows (plans) and fingerprint;
other staged files go, and the lock is released, so rerunning the same command reads only what
was not read and plans only the windows not planned (:class:`ScratchKept` says what was kept; a
Ctrl-C before anything was kept keeps no scratch). Any other failure removes the scratch, so a
full disk is never left full. A failure
before writing began leaves OUTPUT as it was (a new OUTPUT is removed); after that the finished
shards and the marker stay, and rerunning the same command finishes the output
byte-identically. In a store, every cleanup and every rerun also abort the unfinished multipart
uploads under OUTPUT (:func:`packtool.formats.object_store.abort_uploads`). ``OSError`` becomes
one :class:`~packtool.errors.OutputError` line naming the path and the cause, and a machine
running short (memory, open files) one :class:`~packtool.errors.ResourceError` line naming the
fixes of the phase it ran short in (:attr:`Output.phase`); each ends with what OUTPUT holds.

A complete identical output is recognised from a listing and its manifest before anything is
written (no lock is taken when no pack holds OUTPUT), so rerunning a finished pack on read-only
storage answers "nothing to do" as on any other. When a run killed after writing its manifest
left its marker, scratch or lock file beside it, a rerun that may write takes the lock instead,
finds the output complete all the same and removes them.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from importlib import metadata
from pathlib import Path

from filelock import FileLock, Timeout

from packtool import signals
from packtool.errors import (ManifestError, OutputError, first_line, inodes_exhausted,
                             inodes_note, is_full_disk, is_read, raise_if_shortage,
                             shortage_error)
from packtool.formats import object_store as store
from packtool.formats.manifest import (HELD_HERE, IN_PROGRESS_NAME, LOCK_NAME,
                                       enclosing_output, output_words, MANIFEST_NAME, TMP_DIR_NAME,
                                       PACKED_KIND, TOKENIZED_KIND, HoldoutPairing,
                                       Manifest, ShardEntry,
                                       footer_sha256, input_display, is_pending_name,
                                       is_shard_name, IN_MEMORY_INPUT,
                                       manifest_bytes, marker_kind, pack_running,
                                       pending_name, publish_manifest, read_manifest,
                                       shard_files,
                                       run_words, shard_entry_of,
                                       V1_MANIFEST_NAME, version_1_shards)
from packtool.formats.schema import written_as_shard
from packtool.location import (Location, StoreError, display, published_temp_of,
                               remove_made, shared_storage_fix, sweep_stages, task_node)
from packtool.stats import plural

__all__ = ["Output", "LocalOutput", "StoreOutput", "fingerprint", "footer_sha256", "pack_running",
           "BYTE_DECIDING_PACKAGES", "WINDOW_DIR_PREFIX", "READ_DIR_PREFIX", "SCRATCH_UNITS",
           "PARTIAL_PROGRESS", "ScratchKept", "claim_partial", "keeps_stages", "WINDOW_DONE",
           "SCRATCH_FINGERPRINT", "LAYOUT_REVISION", "window_done", "window_workdir",
           "publish_window", "window_file", "shard_temp", "discard_shard_temp", "publish_shard",
           "kept_shard", "finished_shard", "MARKER_EVERY_S", "MEMORY_FIXES", "FILES_FIX",
           "holding_lock", "held_words", "untouched_words", "check_scratch_seen", "NOTHING_KEPT",
           "REPLACED_RERUN"]

#: Seconds a starting pack waits for OUTPUT's lock before refusing: ``stats``, ``verify`` and
#: the loader probe it (:func:`packtool.formats.manifest.pack_running`) by taking it for a
#: moment, which must not make a pack that starts at that instant fail.
LOCK_WAIT_S = 1.0

#: A window's plan lives in ``<scratch>/window-NNNNN/``, complete once ``done.json`` is there
#: (it is written before the directory is renamed into place, or uploaded last).
WINDOW_DIR_PREFIX = "window-"
#: A read part's spill lives in ``<scratch>/read-NNNNN/``, complete like a window.
READ_DIR_PREFIX = "read-"
#: Finished units of a scratch that a rerun of the same pack keeps.
SCRATCH_UNITS = (WINDOW_DIR_PREFIX, READ_DIR_PREFIX)
#: The progress record of a read part's staging directory that a killed run left half done
#: (:mod:`packtool.pipeline.read`): such a directory is kept for the rerun too.
PARTIAL_PROGRESS = "progress.json"
WINDOW_DONE = "done.json"
#: The fingerprint of the run that created the scratch directory (a file inside it).
SCRATCH_FINGERPRINT = "fingerprint"
#: Seconds between two rewrites of the marker listing the finished shards.
MARKER_EVERY_S = 10.0
#: The phases of a pack (:attr:`Output.phase`) -> what lowers the memory the phase holds, for
#: an out-of-memory message (after "run with more memory"; see :mod:`packtool.pipeline`).
MEMORY_FIXES = {
    None: "or fewer --workers",
    "read": "or fewer --workers (each read task holds one record batch of its input file)",
    "plan": "fewer --workers, or --window-docs N to bound each plan task's memory (about 80 "
            "bytes per document of its window)",
    "write": "or fewer --workers, or a smaller --row-group-mb (each writing task holds one row "
             "group)",
    "manifest": "",
}
#: What needs fewer open files, for a too-many-open-files message (after raising the limit).
FILES_FIX = "use fewer --workers"

#: Distributions whose version can change the output bytes (recorded in the fingerprint).
BYTE_DECIDING_PACKAGES = ("packtool", "pyarrow", "numpy", "numba")
#: Revision of how packtool lays out and orders the rows of given options and inputs (and of
#: the scratch files a killed run leaves for its rerun); recorded in the fingerprint, so a
#: change between two runs of one packtool version never mixes their shards or windows.
#: 3: shards carry page checksums (format version 3). 4: read parts spilled in input order and
#: resumable piece by piece, windows dealt in blocks across the input, plans as segments
#: pointing into the read parts' spills.
LAYOUT_REVISION = 4


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


def _resolved(path) -> str:
    """A local path made absolute with links resolved; a store URI without its options (the
    endpoint and scheme say how the store is reached, not which file it is: the same input
    named with ``?endpoint_override=`` or with ``AWS_ENDPOINT_URL`` is one input, and its size,
    mtime and footer sha256 beside it say what it holds)."""
    loc = Location.parse(path)
    return str(loc.path.resolve()) if loc.is_local else loc.display.partition("?")[0]


def fingerprint(options: dict, files, inputs_digest: str | None = None) -> str:
    """sha256 that changes whenever the output bytes could.

    Args:
        options: the options that decide the bytes (``PackConfig.layout_options()``).
        files: :class:`~packtool.formats.reader.InputFile` list in document order; each is
            recorded by resolved path (``in/`` and ``./in/`` agree; a store URI without its
            options), size, mtime and the sha256 of its Parquet footer.
        inputs_digest: the sha256 of the inputs' content where the caller knows it
            (``PackConfig.inputs_digest``): recorded instead of ``files``, so the same
            content written anew elsewhere keeps the fingerprint.

    Returns:
        64 hex characters; also covers the versions of :data:`BYTE_DECIDING_PACKAGES`.
    """
    inputs = ({"content_sha256": inputs_digest} if inputs_digest is not None else
              [[_resolved(f.path), f.bytes, f.mtime_ns, footer_sha256(f.path)] for f in files])
    blob = json.dumps({
        "options": options,
        "versions": _versions(),
        "layout_revision": LAYOUT_REVISION,
        "inputs": inputs,
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


#: What a pack killed after writing its manifest (SIGKILL, a lost machine) leaves beside it: a
#: rerun that finds the output complete removes them, under the lock.
_LEFTOVERS = (LOCK_NAME, TMP_DIR_NAME, IN_PROGRESS_NAME)


def _read_json(loc: Location) -> dict | None:
    try:
        doc = json.loads(loc.read_bytes())
    except (*store.STORE_ERRORS, ValueError, UnicodeDecodeError) as exc:
        raise_if_shortage(exc, loc.display)  # never "no marker" (a resume lost) for that
        return None
    return doc if isinstance(doc, dict) else None


class Output:
    """OUTPUT of one pack; use as a context manager (see the module docstring).

    ``Output(path, ...)`` builds a :class:`LocalOutput` or a :class:`StoreOutput` from ``path``.

    Args:
        path: the OUTPUT directory, or a URI in a store (``s3://bucket/prefix``).
        inputs: INPUT paths as given (OUTPUT may not lie inside one, nor contain one).
        fingerprint: from :func:`fingerprint`.
        overwrite: replace a non-empty OUTPUT that is not an interrupted identical pack.
        options: the options in the fingerprint (``PackConfig.layout_options()``): a finished
            output of other options is refused naming the options that differ.
        kind: what this run writes (:data:`~packtool.formats.manifest.PACKED_KIND`, or
            ``TOKENIZED_KIND`` for ``packtool tokenize``), recorded in the in-progress marker so
            messages say what a run found there (a pack, a tokenize).
        role: how messages name it (``OUTPUT``, ``--holdout-output``).
        pairing: one output of ``pack --holdout``: the pairing its manifest records; a finished
            identical pack recording another pairing is not complete (it is packed again, to
            record this one).
        files: the input files read now, in order (``InputFile``): a finished pack of other
            inputs is refused naming the files added, removed or changed; None: not named (the
            Python API's documents, recorded by their content).

    Attributes after entry: ``path`` and ``tmp`` (:class:`~packtool.location.Location` of OUTPUT
    and of its scratch), ``complete`` (a finished identical output is there: nothing to do),
    ``resume`` (an interrupted identical pack is there: keep its shards), ``replaced`` (an
    interrupted pack of other options was there and is replaced: what it was, in words),
    ``previous`` (the manifest of the finished pack found there, None when none),
    ``windows_kept`` (units kept in the scratch from an identical run that was killed: windows, read parts,
    read parts begun; what they are in ``kept``), ``shards_done`` (shards finished, written or
    kept, in this run), ``manifest`` (the :class:`~packtool.formats.manifest.Manifest` found
    when ``complete``, or written).
    """

    def __new__(cls, path, *args, **kwargs):
        if cls is Output:
            cls = LocalOutput if Location.parse(path).is_local else StoreOutput
        return super().__new__(cls)

    def __init__(self, path, inputs, fingerprint: str, *, overwrite: bool = False,
                 options: dict | None = None, kind: str = PACKED_KIND, role: str = "OUTPUT",
                 pairing: HoldoutPairing | None = None, files=None):
        self.path = Location.parse(path)
        #: the input files read now (:class:`~packtool.formats.reader.InputFile`), to name
        #: what changed against a finished pack's recorded inputs; None: not named
        self.files = files
        #: how messages name this output: ``OUTPUT``, or the option that named it
        #: (``--holdout-output``)
        self.role = role
        self.options = options
        self.kind = kind
        self.replaced: str | None = None  #: what of another run this one replaced, in words
        #: the work an interrupted run of other options kept in the scratch alone (no marker:
        #: stopped before it wrote a shard), removed when this run opened it, in words
        self.scratch_replaced: str | None = None
        self.tmp = self.path.join(TMP_DIR_NAME)
        self.inputs = [Location.parse(p) for p in inputs]
        self.fingerprint = fingerprint
        #: the pairing this run records (one output of ``pack --holdout``), or None
        self.pairing = pairing
        #: the manifest of the finished pack found at entry (None: none), once decided
        self.previous: Manifest | None = None
        self.overwrite = overwrite
        self.complete = False
        self.resume = False
        self.manifest: Manifest | None = None
        self.bytes_needed = 0  #: what the current phase still has to write (ENOSPC message)
        #: set by :meth:`check_space` when the pack may not fit (a warning, not a refusal)
        self.space_note: str | None = None
        self.windows_kept = 0  #: finished scratch units kept from a killed identical run
        self.kept = ScratchKept()  #: what the scratch holds for a rerun (after a trim)
        self.shards_done = 0  #: shards finished (written or kept) in this run
        self._created: tuple = ()  # the local folders entering created (OUTPUT, its parents)
        self._writing = False
        #: the phase under way (``read``, ``plan``, ``write``, ``manifest``; None before), set
        #: by the pipeline: it words a failure's fixes
        self.phase: str | None = None
        self._untouched = False  # complete, recognised without the lock: nothing to clean up
        self._release_sigint = None  # set by commit(): Ctrl-C held until __exit__ ends
        #: SIGINT or SIGTERM that came while the manifest was committed (held then: the output
        #: is complete); None when none did. A caller with more to do decides whether it stops
        self.stop_noted: int | None = None
        self._found_finished = False  # a finished pack (a manifest) was there at entry
        self._began = False  # begin_write() ran: OUTPUT is marked in progress
        self._replaced_gone = False  # the finished pack this run replaces was removed
        self._committed = False  # commit() wrote the manifest
        #: a shard of the manifest was not in OUTPUT at the commit (:meth:`_check_shards`)
        self._lost = False
        self._tied: list[Output] = []  # outputs whose replaced pack goes when this one writes
        self._scratch_needed = 0  # bytes of scratch the run asked for (check_space)
        self._promised: dict = {}  # shard -> manifest entry dict from an interrupted run's marker
        self._written: dict = {}  # shard -> manifest entry dict finished in this run
        self._marker_at = 0.0  # when the marker last listed the finished shards
        #: a full disk too small to hold the scratch beside the shards kept (no rerun fits)
        self._disk_too_small = False
        self._inodes_out = False  # a full disk found out of inodes when the run failed
        #: bytes a packed row counts in the shards' bound (set by the pipeline): with the
        #: rows of the finished shards, how much the shards compress (a full disk's advice)
        self.row_bytes = 0

    # -- what differs between a directory and a store -------------------------------------------
    def _lock(self) -> None:
        raise NotImplementedError

    def _unlock(self) -> None:
        raise NotImplementedError

    def _tidy_store(self) -> None:
        """Store only: abort unfinished uploads under OUTPUT."""

    def _remove_created(self) -> None:
        """Remove OUTPUT, and the parents entering it created, when this run created them and
        they are empty again."""

    def check_space(self, shards: int, scratch: int, *, scratch_written: bool = False) -> None:
        """Check OUTPUT's free space (a store: not checked) against what the pack still writes:
        ``scratch`` bytes of scratch (spills stored uncompressed: exact, unless
        ``scratch_written``) and at most ``shards`` bytes of shards (an upper bound: the ids
        counted uncompressed; real ids compress to about a quarter of it).

        Refuses only a pack that cannot fit: less free than the scratch. Less free than the
        scratch and the shards' bound sets :attr:`space_note` (a warning: the pack may fill the
        disk; it then stops cleanly and the same command resumes). A refusal would otherwise
        turn away packs that fit, since the compressed size is known only once written. A
        full-disk message asks for the scratch and the shards' bound (a failed run's scratch is
        removed, and its rerun writes it again).

        Raises:
            OSError: ``ENOSPC``, worded by the cleanup path as every full disk.
        """
        self.bytes_needed, self._scratch_needed = shards, scratch

    @property
    def kept_rows(self) -> int:
        """Rows of the shards an interrupted identical run finished (from its marker): already
        on the disk, so not asked for again."""
        if not self.resume:
            return 0
        try:
            return sum(int(e.get("rows", 0)) for e in self._promised.values())
        except (TypeError, ValueError, AttributeError):
            return 0

    def _full_disk_note(self, exc: OSError) -> str | None:
        return None

    # -- entry: checks, lock, decision ---------------------------------------------------------
    def __enter__(self) -> "Output":
        out = self.path
        sweep_stages()  # what killed store runs of this host left in TMPDIR (never raises)
        for src in self.inputs:
            if out.overlaps(src):
                raise OutputError(f"{out.display}: {self.role} overlaps INPUT {src.display}; "
                                  "choose a location outside the input")
        try:
            e = out.entry()
            if e is not None and not e.is_dir:
                raise OutputError(f"{out.display}: exists and is a file; {self.role} must be a "
                                  "directory")
            # shards of another schema would break its dataset; an output being written (its
            # lock or scratch only) too
            parent = enclosing_output(out)
            if parent is not None:
                raise OutputError(f"{out.display}: {self.role} is inside the "
                                  f"{output_words(parent)} {parent.display}; choose a location "
                                  "outside it")
            if e is not None and not self.overwrite and self._complete_as_found():
                return self
        except store.STORE_ERRORS as exc:
            raise self._os_error(exc, f"cannot list {self.role}") from None
        # a Ctrl-C or SIGTERM while OUTPUT is made and locked waits until both are recorded
        # (at most the lock's wait, LOCK_WAIT_S), so the cleanup below takes away exactly what
        # this run made: never an empty OUTPUT or a lock file left behind a run that says
        # nothing was kept. A store's lock (a request) is not held up.
        held = signals.signals_held() if out.is_local else nullcontext()
        try:
            with held:
                self._make()
                self._lock()
        except KeyboardInterrupt:
            self._unlock()
            self._remove_created()
            raise
        try:
            self._tidy_store()
            self._decide()
            if not self.complete:
                self._open_scratch()
        except BaseException as exc:
            self._cleanup(exc)
            if isinstance(exc, store.STORE_ERRORS):
                raise self._os_error(exc) from None
            raise
        return self

    def _make(self) -> None:
        """Create OUTPUT and its missing parents, recording what was made (:attr:`_created`)."""
        out = self.path
        try:
            self._created = out.makedirs()
        except store.STORE_ERRORS as exc:
            told = out.store_error(exc, "cannot write")
            if isinstance(told, StoreError):
                raise OutputError(str(told)) from None
            cause = getattr(exc, "strerror", None) or first_line(exc)
            raise OutputError(f"{out.display}: cannot write ({cause}); choose a writable "
                              f"{self.role}") from None

    def _manifest_of(self, found: dict) -> tuple[Manifest | None, bool]:
        """OUTPUT's manifest (None: none, or unreadable) and whether it is this very pack's
        with every shard at its recorded size, from the listing ``found``."""
        if MANIFEST_NAME not in found:
            return None, False
        try:
            m = read_manifest(self.path)
        except ManifestError:
            return None, False
        # a pairing recorded with another held-out or training output (``--holdout-output``
        # changed): the same rows, but not this run's pair (an output packed before pairings
        # were recorded is taken as it is)
        ours = m.fingerprint == self.fingerprint and all(
            s.file in found and found[s.file].size == s.bytes for s in m.shards) and (
            m.holdout_pair is None or m.holdout_pair == self.pairing)
        return m, ours

    def _complete_as_found(self) -> bool:
        """A finished identical pack is in OUTPUT and no pack holds its lock: the run is a
        no-op, decided from a listing and the manifest with nothing written (no lock taken), so
        a finished output on read-only storage is recognised too. A lock that is held (or any
        lock object in a store) leaves the decision to the locked path."""
        found = self.path.listdir()
        if LOCK_NAME in found and (not self.path.is_local or pack_running(self.path)):
            return False
        m, ours = self._manifest_of(found)
        if not ours:
            return False
        if any(n in found for n in _LEFTOVERS) and self._writable():
            return False  # what a killed run left beside its manifest: tidied under the lock
        self.complete, self.manifest, self._untouched = True, m, True
        return True

    def _writable(self) -> bool:
        """Whether this run may write into OUTPUT (a local directory it may write into; a
        store: assumed), to tidy what a killed run left there."""
        return not self.path.is_local or os.access(self.path.path, os.W_OK | os.X_OK)

    def _decide(self) -> None:
        """The decision table over one listing of OUTPUT (module docstring, step 1)."""
        out = self.path
        found = {n: e for n, e in out.listdir().items() if n != LOCK_NAME}
        # a run killed between writing its manifest or marker and renaming it left the
        # temporary (this run holds the lock: no live run's): packtool's own, removed
        for name in [n for n, e in found.items() if not e.is_dir
                     and published_temp_of(n) in (MANIFEST_NAME, IN_PROGRESS_NAME)]:
            if self._writable():
                out.join(name).delete()
            del found[name]
        m, ours = self._manifest_of(found)
        self._found_finished = m is not None
        self.previous = m
        if m is not None:
            if m.fingerprint == self.fingerprint and not ours:
                self.overwrite = True  # this very pack, damaged since: ours to redo
            elif ours and not self.overwrite:  # --overwrite asks for the shards anew
                self.complete, self.manifest = True, m
                # a run killed once its manifest was written left its marker (and its scratch
                # and lock file, removed on the way out): stale beside the manifest; so are
                # the pending shards of an interrupted --overwrite of other options
                if IN_PROGRESS_NAME in found:
                    out.join(IN_PROGRESS_NAME).delete()
                    for name, e in found.items():
                        if not e.is_dir and is_pending_name(name):
                            out.join(name).delete()
                return
            if self.overwrite and IN_PROGRESS_NAME in found:
                # an --overwrite of this very pack was stopped before its commit: the finished
                # pack it replaces is still there, its finished shards wait beside it
                marker = _read_json(out.join(IN_PROGRESS_NAME)) or {}
                self.resume = (marker.get("fingerprint") == self.fingerprint
                               and marker.get("kind") in (None, self.kind))
                if self.resume and isinstance(marker.get("shards"), dict):
                    self._promised = dict(marker["shards"])
        elif IN_PROGRESS_NAME in found:
            marker = _read_json(out.join(IN_PROGRESS_NAME)) or {}
            kind = marker.get("kind")  # markers before this version name no kind
            if kind not in (None, self.kind) and not self.overwrite:  # the other command's
                raise OutputError(f"{out.display}: {self.role} holds an interrupted "
                                  f"{_run_word(kind)} ({_kind_words(kind)}), not "
                                  f"{_kind_words(self.kind)}; choose another location "
                                  f"(--overwrite would delete that {_run_word(kind)})")
            self.resume = marker.get("fingerprint") == self.fingerprint
            if not self.resume:
                self.overwrite = True  # an interrupted pack of other options: ours to replace
                done = len(shard_files(found))
                self.replaced = (f"an interrupted {_run_word(marker.get('kind'))} of "
                                 f"{_differences(marker.get('options'), self.options)} "
                                 f"({done} finished shard{'' if done == 1 else 's'})")
            elif isinstance(marker.get("shards"), dict):
                self._promised = dict(marker["shards"])
            return
        others = [n for n in found if n != TMP_DIR_NAME]
        own = (MANIFEST_NAME, IN_PROGRESS_NAME)
        listed = {s.file for s in m.shards} if m is not None else set()
        old = (version_1_shards(out) if m is None and V1_MANIFEST_NAME in found
               and not found[V1_MANIFEST_NAME].is_dir else None)
        if old is not None:  # an output of format version 1: its manifest and shards are ours
            own, listed = own + (V1_MANIFEST_NAME,), set(old)
        # a shard's name is not enough (pyarrow's write_dataset names files part-0.parquet):
        # it is packtool's when the manifest lists it or its footer names it
        foreign = sorted(n for n in others if n not in own
                         and not (not found[n].is_dir and is_pending_name(n))
                         and not (not found[n].is_dir and is_shard_name(n)
                                  and (n in listed or written_as_shard(out.join(n)))))
        if foreign:  # never deleted, and beside the shards they would break Parquet readers
            raise OutputError(f"{out.display}: {self.role} holds {len(foreign)} entr"
                              f"{'y' if len(foreign) == 1 else 'ies'} packtool did not write "
                              f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                              "move them away or choose another location (--overwrite replaces "
                              "only what packtool wrote)")
        if others and not self.overwrite:
            if m is not None and (m.kind or PACKED_KIND) != self.kind:  # the other command's
                raise OutputError(f"{out.display}: {self.role} holds a finished "
                                  f"{_run_word(m.kind)} ({_kind_words(m.kind)}), not "
                                  f"{_kind_words(self.kind)}; choose another location "
                                  f"(--overwrite would delete that {_run_word(m.kind)})")
            if m is not None:  # a finished pack of other options or inputs
                was = dict(m.options)
                if m.labels is not None:  # recorded apart as the labels fact
                    was["labels"] = m.labels.convention if m.labels.stored else "none"
                differs = _differences(was, self.options)
                if differs.startswith("other inputs") and self.files is not None:
                    at = None
                    if out.is_local:
                        try:
                            at = os.stat(out.path / MANIFEST_NAME).st_mtime
                        except OSError:
                            pass
                    differs = f"other inputs ({_input_changes(m, self.files, at)})"
                raise OutputError(f"{out.display}: {self.role} holds a finished "
                                  f"{_run_word(m.kind)} of {differs}; pass --overwrite "
                                  "to replace it or choose another location")
            if old is not None:
                raise OutputError(f"{out.display}: {self.role} holds a pack of format version 1 "
                                  f"(its {V1_MANIFEST_NAME}), which this packtool does not read; "
                                  "pass --overwrite to replace it or choose another location")
            raise OutputError(f"{out.display}: {self.role} is not empty; pass --overwrite to replace "
                              "it or choose another location")

    def _open_scratch(self) -> None:
        """Open the scratch, keeping the finished units of a killed identical run.

        A run killed without cleanup (SIGKILL, a lost machine) leaves its scratch behind. When
        that scratch carries this run's fingerprint, the read part and window directories
        published whole (``done.json`` written before the rename, or uploaded last) are kept and
        not read or planned again, and so are the staging directories of read parts begun that
        hold a progress record (:data:`PARTIAL_PROGRESS`); everything else (half-written units,
        staged shards) is removed. Any other scratch is removed whole.
        """
        if not self._scratch_is_ours():
            if not self.replaced:  # a marker would have said it: the scratch alone held it
                try:
                    kept = _scratch_units(self.tmp)[0].describe()
                except store.STORE_ERRORS:
                    kept = ""
                if kept:
                    self.scratch_replaced = (f"the kept work of an interrupted "
                                             f"{_run_word(self.kind)} of other options or "
                                             f"inputs ({kept})")
            self.tmp.delete_tree()
            self.tmp.makedirs()
            self.tmp.join(SCRATCH_FINGERPRINT).publish_bytes(self.fingerprint.encode())
            return
        self.windows_kept = self._trim_scratch()

    def _scratch_is_ours(self) -> bool:
        """The scratch carries this run's fingerprint."""
        try:
            return self.tmp.join(SCRATCH_FINGERPRINT).read_bytes().decode() == self.fingerprint
        except (*store.STORE_ERRORS, UnicodeDecodeError):
            return False

    def _trim_scratch(self) -> int:
        """Remove from the scratch everything but its fingerprint, the finished units (windows
        and read parts: ``done.json`` in them) and the staging directories of read parts begun
        (a :data:`PARTIAL_PROGRESS` record in them: in a store none, staging is on the tasks'
        own disks); return how many of those are there (what they are: :attr:`kept`)."""
        kept, others = _scratch_units(self.tmp)
        for where, is_dir in others:
            where.delete_tree() if is_dir else where.delete()
        self.kept = kept
        return kept.units

    # -- writing -------------------------------------------------------------------------------
    def tie(self, other: "Output") -> None:
        """Make the entered output ``other`` (the held-out output of ``--holdout``) lose the
        finished pack it will replace as soon as this one begins writing (:meth:`invalidate`),
        so that this output's new pack is never readable beside ``other``'s old one."""
        self._tied.append(other)

    def invalidate(self) -> None:
        """When this output still holds a finished pack that this run replaces
        (:attr:`keeps_finished`), remove it now, marking the output as in progress first
        (:meth:`begin_write`): readers then refuse it as a pack being written (or, once the run
        has stopped, an interrupted one to rerun). A finished pack this run keeps
        (``complete``) and an output holding no finished pack are left as they are."""
        if self.keeps_finished:
            self.begin_write()
            self._remove_replaced(())

    @property
    def keeps_finished(self) -> bool:
        """A finished pack found at entry, which this run replaces, is still in OUTPUT, whole
        and readable: it goes only at :meth:`commit`, just before the new shards take their
        final names (they wait beside it under pending names), so a file under a shard's final
        name is the old pack's, never this run's."""
        return self._found_finished and not (self.complete or self._replaced_gone)

    def begin_write(self) -> None:
        """Mark OUTPUT as in progress, removing first what an interrupted run of other options
        left (its pending shards; with no finished pack there, its shards and an unreadable or
        format-version-1 manifest too). A finished pack this run replaces stays, whole and
        readable, until :meth:`commit` (:attr:`keeps_finished`). Other files stay."""
        out = self.path
        if not self.resume:  # packtool's own files only; anything else is left alone
            keep = self.keeps_finished
            if not keep:
                out.join(MANIFEST_NAME).delete()
            found = out.listdir()
            if not keep and V1_MANIFEST_NAME in found and version_1_shards(out) is not None:
                out.join(V1_MANIFEST_NAME).delete()  # a replaced output of format version 1
            for name, e in found.items():
                if not e.is_dir and (is_pending_name(name) or (not keep and is_shard_name(name))):
                    out.join(name).delete()
        self._write_marker()
        self._writing = self._began = True
        self.phase = "write"

    def _remove_replaced(self, names) -> None:
        """Remove the finished pack this run replaces, the manifest first (a replaced pack never
        looks complete), then every file under a shard's final name that is not one of this
        run's shards ``names`` (those are replaced by the moves). Run at the commit, after the
        marker lists every new shard: a run killed in it is resumed, finding each new shard
        under its pending name (preferred) or its final one."""
        out = self.path
        found = out.listdir()
        if MANIFEST_NAME in found:
            out.join(MANIFEST_NAME).delete()
        names = set(names)
        for name, e in found.items():
            if not e.is_dir and is_shard_name(name) and name not in names:
                out.join(name).delete()
        self._replaced_gone = True

    def shards_kept(self) -> int:
        """Finished shards in OUTPUT now, for an interrupted run's message: the files at a
        shard's final name once this run writes (a shard is published whole, and tasks may have
        published some whose results this process had not yet taken when it was interrupted),
        else the shards recorded as finished."""
        if not self._writing:
            return self.shards_done
        try:
            found = self.path.listdir()
        except OSError:
            return self.shards_done
        if self.keeps_finished:  # the final names hold the replaced pack's shards
            return sum(1 for n, e in found.items() if not e.is_dir and is_pending_name(n))
        return len(shard_files(found))

    def replaced_note(self) -> str | None:
        """The warning that this run replaces what an interrupted run of other options left in
        OUTPUT (:attr:`replaced`), the options that differ named as the command line spells
        them: ``OUTPUT held an interrupted pack of other options (--capacity 4096 -> 2048) (8
        finished shards): replaced by this pack``, or the work such a run kept in the scratch
        alone (:attr:`scratch_replaced`: stopped before its first shard); None when it replaces
        nothing."""
        held = self.replaced or self.scratch_replaced
        if not held:
            return None
        return f"OUTPUT held {held}: replaced by this {_run_word(self.kind)}"

    def replaced_untouched(self) -> str | None:
        """What OUTPUT holds when this run stopped before it began to replace the interrupted
        run of other options there (:attr:`replaced`; its shards go when this run's first
        shard is ready): ``OUT still holds an interrupted tokenize run of other options
        (--batch-docs 7 -> 8) (3 finished shards), untouched``, for the interrupted message,
        whose advice is then :data:`REPLACED_RERUN` (a rerun of this command replaces those
        shards, it does not resume them); None when this run replaces nothing or had begun
        writing."""
        if not self.replaced or self._began:
            return None
        return f"{self.path.display} still holds {self.replaced}, untouched"

    def promised(self, name: str) -> dict | None:
        """The manifest entry (dict) of shard ``name`` as an interrupted identical run finished
        it (from its marker), None when it is not known."""
        return self._promised.get(name) if self.resume else None

    def shard_written(self, entry, extra: dict | None = None) -> None:
        """Record a finished shard (its :class:`~packtool.formats.manifest.ShardEntry`; ``extra``:
        JSON values the writer also knows of it, kept beside the entry and handed back by
        :meth:`promised`); the marker lists the finished shards, rewritten at most every
        :data:`MARKER_EVERY_S` s."""
        self.shards_done += 1
        self._written[entry.file] = {**entry.to_dict(), **(extra or {})}
        if time.monotonic() - self._marker_at >= MARKER_EVERY_S:
            self._write_marker()

    def _write_marker(self) -> None:
        self.path.join(IN_PROGRESS_NAME).publish_bytes(json.dumps(
            {"fingerprint": self.fingerprint, "shards": {**self._promised, **self._written},
             **({"options": self.options} if self.options is not None else {}),
             "kind": self.kind},
            sort_keys=True).encode())
        self._marker_at = time.monotonic()

    def commit(self, manifest: Manifest, schema) -> None:
        """Move every shard of ``manifest`` from its pending name to its final one, write the
        manifest (whole, last; ``schema``: the shards' schema), then drop the marker and the
        scratch.

        Until the first move no Parquet reader of the folder sees a row of this pack; the
        manifest's bytes are made and the marker lists every shard before it, so only the moves
        (renames; in a store a server-side copy each, :meth:`packtool.location.Location.move_to`)
        and the manifest's write lie between the first shard readable under its final name and
        the manifest. A run killed in between leaves the marker: its rerun keeps every shard,
        under either name, moves the rest and writes the manifest.

        From here to the end of :meth:`__exit__` Ctrl-C is held (:func:`packtool.signals.hold`):
        once the manifest is written the pack is complete, so the marker, scratch and lock are
        removed and the run ends as a success, never as "interrupted" beside a manifest."""
        if self._release_sigint is None:
            self._release_sigint = signals.hold()
        self.phase = "manifest"
        self._check_shards(manifest)  # before anything is removed or the manifest written
        data = manifest_bytes(manifest, schema)
        self._write_marker()  # every shard listed: a rerun after a kill below keeps them all
        for other in self._tied:  # their replaced packs go before this one's rows show
            other.invalidate()
        self._remove_replaced([s.file for s in manifest.shards])
        self._move_pending([s.file for s in manifest.shards])
        publish_manifest(self.path, manifest, schema, data=data)
        self._writing = False
        self._committed = True
        self.manifest = manifest
        self.path.join(IN_PROGRESS_NAME).delete()
        self.tmp.delete_tree()

    def _check_shards(self, manifest: Manifest) -> None:
        """Refuse to commit unless every shard of ``manifest`` is in OUTPUT, as its driver sees
        it, under its pending name (or its final one, unless those hold the finished pack this
        run replaces: :attr:`keeps_finished`) with the size its task recorded: one listing.

        A shard is missing when someone removed it during the run, or when the tasks wrote it
        somewhere else: Ray workers on other nodes writing OUTPUT on their own disks. Nothing
        has been removed yet, so the run's own files are discarded on the way out
        (:meth:`_discard_own`) and OUTPUT is left as it was before the run.

        Raises:
            OutputError: the first shard missing or of another size, with the fix.
        """
        found = self.path.listdir()
        final = not self.keeps_finished
        for s in manifest.shards:
            names = (pending_name(s.file), s.file)[:2 if final else 1]
            sizes = [found[n].size for n in names if n in found and not found[n].is_dir]
            if s.bytes in sizes:
                continue
            self._lost = True
            seen = (f"{sizes[0]:,} bytes there, {s.bytes:,} written" if sizes else
                    f"{s.bytes:,} bytes, as {names[0]}")
            state = (f"{self.role} is as it was before the run" if not self.resume else
                     f"the unfinished pack in {self.role} is removed")
            raise OutputError(
                f"{self.path.display}: shard {s.file} was not found where its task wrote it "
                f"({seen}): it was removed during the run, or the tasks wrote {self.role} "
                f"somewhere else; {shared_storage_fix(self.role)}; {state}")

    def _move_pending(self, names) -> None:
        """Move each shard of ``names`` still under its pending name to its final name (one
        kept from an interrupted commit is there already)."""
        found = self.path.listdir()
        moves = [(self.path.join(pending_name(n)), self.path.join(n)) for n in names
                 if pending_name(n) in found]
        if self.path.is_local or len(moves) < 2:
            for src, dest in moves:
                src.move_to(dest)
            return
        # copies inside the store, several at once (the signals are held: commit()); no more
        # than the S3 client's connection pool holds (10), which warns of each one beyond it
        with ThreadPoolExecutor(min(8, len(moves))) as pool:
            for _ in pool.map(lambda move: move[0].move_to(move[1]), moves):
                pass

    # -- exit: the one cleanup path --------------------------------------------------------------
    def __exit__(self, exc_type, exc, tb) -> bool:
        if isinstance(exc, OSError) and is_full_disk(exc) and self.path.is_local:
            # looked at before the cleanup frees the scratch's files: out of inodes now?
            self._inodes_out = inodes_exhausted(self.path.path)
        if not self._untouched:
            try:
                self._cleanup(exc)
            finally:
                if self._release_sigint is not None:
                    # a Ctrl-C after commit() began: this output is complete (noted for a
                    # caller with another output still to write)
                    self.stop_noted = self._release_sigint()
                    self._release_sigint = None
        short = shortage_error(exc, memory=MEMORY_FIXES.get(self.phase, MEMORY_FIXES[None]),
                               files=FILES_FIX, state=self._state()) if exc is not None else None
        if short is not None:
            raise short from None
        if isinstance(exc, store.STORE_ERRORS):
            raise self._os_error(exc) from None
        return False

    @property
    def finished(self) -> bool:
        """This output holds this run's finished pack: found complete, or committed."""
        return self.complete or self._committed

    def stopped_words(self) -> str:
        """What this output holds once a run stopped by Ctrl-C or SIGTERM has left it
        (after :meth:`__exit__`), in words for the interrupted message: finished; its earlier
        finished pack, untouched (``--overwrite`` stopped before writing); or no manifest, with
        what the scratch and the finished shards keep for the rerun of the same command."""
        d = self.path.display
        if self.finished:
            return f"{d} is finished"
        kept = self.kept.describe(self.shards_kept())
        untouched = self.replaced_untouched()
        if untouched:  # what this run kept (its scratch) is resumed by its own command
            return untouched + (f"; kept for a rerun of this command: {kept}" if kept else "")
        if self.keeps_finished:
            return _kept_words(d, kept, replaced=True, kind=self.previous.kind)
        if self._began or kept:
            return _kept_words(d, kept)
        return f"{d} has no manifest; {NOTHING_KEPT} ({self.role} is as before the run)"

    def _state(self, rerun: bool = True) -> str:
        """What OUTPUT holds after a failed run, in words, true in every phase: as before
        (nothing written outside the scratch, which is gone), or the marker with the shards
        finished so far (none, some, all but the manifest) and how to finish (not said when
        ``rerun`` is False: a disk no rerun fits on, said by the message)."""
        if self._untouched or not self._writing:
            return f"{self.role} is as it was before the run"
        done = self.shards_kept()
        how = ": rerun the same command to finish" if rerun else ""
        if self.phase == "manifest":
            return f"every shard is finished and kept, only the manifest is missing{how}"
        if done == 0:
            return f"no shard was finished ({self.role} holds only the in-progress marker){how}"
        return f"the finished shards are kept ({done}){how}"

    def _keeps_windows(self, exc: BaseException | None) -> bool:
        """Ctrl-C leaves what a rerun of the same command resumes from, as SIGKILL would: the
        scratch stays when it is this run's and holds at least one finished window or read part,
        or a read part's staging directory with a progress record, trimmed to those and its
        fingerprint (half-written units and staged shards go; what stays is in :attr:`kept`).
        Any other failure (bad input, full disk, a failed task) removes it."""
        if not isinstance(exc, KeyboardInterrupt):
            return False
        try:
            return self._scratch_is_ours() and self._trim_scratch() > 0
        except store.STORE_ERRORS:
            return False

    def _cleanup(self, exc: BaseException | None) -> None:
        """Release OUTPUT after the run; on failure restore it or leave it resumable."""
        keep = False
        try:
            try:
                keep = self._keeps_windows(exc)
                if not keep:
                    self.tmp.delete_tree()
                if exc is not None and self._writing:
                    if (self.keeps_finished or self._lost) and \
                            not isinstance(exc, KeyboardInterrupt):
                        self._discard_own()  # the replaced pack is left exactly as it was
                    else:
                        self._write_marker()  # every shard finished, for the rerun
                self._tidy_store()
            except store.STORE_ERRORS:
                pass
        finally:
            self._unlock()
            if exc is not None and not self._writing and not keep:
                self._remove_created()

    def _discard_own(self) -> None:
        """Remove this run's pending shards and marker beside the finished pack it was to
        replace (:attr:`keeps_finished`), after a failure other than Ctrl-C or SIGTERM, or
        after a shard was found missing at the commit (:meth:`_check_shards`): OUTPUT is then
        exactly as it was before the run (the same command, once the fault is fixed, writes
        them again)."""
        for name, e in self.path.listdir().items():
            if not e.is_dir and is_pending_name(name):
                self.path.join(name).delete()
        self.path.join(IN_PROGRESS_NAME).delete()
        self._writing = False

    def _os_error(self, exc: BaseException, what: str = "cannot write") -> OutputError:
        if what == "cannot write" and is_read(exc):  # a scratch file gone or truncated
            what = "cannot read"
        where = getattr(exc, "filename", None) or self.path.display
        told = self.path.store_error(exc, what)
        if isinstance(told, StoreError):  # credentials, bucket, endpoint: one wording
            return OutputError(f"{told} ({self._state()})")
        note = self._full_disk_note(exc) if isinstance(exc, OSError) else None
        # a disk no rerun fits on: what is kept is said, never "rerun the same command"
        state = self._state(rerun=not self._disk_too_small)
        if note:
            return OutputError(f"{where}: {note} ({state})")
        cause = (exc.strerror if isinstance(exc, OSError) else None) or first_line(exc)
        return OutputError(f"{where}: {what} ({cause}); {state}")


class LocalOutput(Output):
    """OUTPUT in a local directory: an exclusive lock file (``filelock``: released by the
    kernel when the process dies), renames, a disk-space check."""

    def _lock(self) -> None:
        lock = FileLock(self.path.join(LOCK_NAME).path)
        try:
            lock.acquire(timeout=LOCK_WAIT_S, poll_interval=0.02)
        except Timeout:
            self._remove_created()
            raise OutputError(f"{self.path.display}: another packtool "
                              f"{run_words(self._holder_kind())} is writing this {self.role} "
                              f"(lock {LOCK_NAME} is held); wait for it to end or choose "
                              f"another {self.role}") from None
        except OSError as exc:
            self._remove_created()
            raise OutputError(f"{self.path.display}: cannot write ({exc.strerror}); choose a "
                              f"writable {self.role}") from None
        self._file_lock = lock

    def _holder_kind(self) -> str | None:
        """What the run holding OUTPUT's lock writes, from what it wrote: its in-progress
        marker's kind, else this run's kind when the scratch carries this run's fingerprint
        (the same command started twice, before its first shard); None when nothing says."""
        kind = marker_kind(self.path)
        if kind is None and self._scratch_is_ours():
            kind = self.kind
        return kind

    def _unlock(self) -> None:
        lock = getattr(self, "_file_lock", None)
        if lock is not None:
            self.path.join(LOCK_NAME).delete()  # still held: nobody waits on it
            lock.release()
            self._file_lock = None

    def _remove_created(self) -> None:
        # each only when empty: never removes something not ours
        remove_made(self._created)
        self._created = ()

    def check_space(self, shards: int, scratch: int, *, scratch_written: bool = False) -> None:
        super().check_space(shards, scratch, scratch_written=scratch_written)
        try:  # a read-only mount: its one line now, never a free-space warning before it
            read_only = bool(os.statvfs(self.path.path).f_flag & getattr(os, "ST_RDONLY", 0))
        except (AttributeError, OSError):
            read_only = False
        if read_only:
            raise OSError(errno.EROFS, "Read-only file system", str(self.path))
        certain = 0 if scratch_written else scratch
        free = shutil.disk_usage(self.path.path).free
        if free < certain:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        if free < certain + shards:
            self.space_note = (f"{self.path.display}: {free:,} bytes free, and this pack may "
                               f"need up to {certain + shards:,} (its shards counted "
                               "uncompressed); if the disk fills, the pack stops and the same "
                               "command resumes once space is freed")

    def _full_disk_note(self, exc: OSError) -> str | None:
        """The words of a full disk (or quota) while this run wrote, with the fix its figures
        allow: out of inodes (files) when the filesystem has none free or as many bytes are
        free as the run needs; a pack's scratch (exact) and shards' bound (counted
        uncompressed) against the bytes free, and, when the disk cannot hold what a rerun
        writes beside the finished shards kept, another OUTPUT rather than a rerun
        (:attr:`_disk_too_small`); a tokenize run's free bytes (it counts no need ahead).
        None when ``exc`` is no full disk."""
        if not is_full_disk(exc):
            return None
        at = self.path.path if self.path.path.exists() else self.path.path.parent
        try:
            usage = shutil.disk_usage(at)
            free, total = usage.free, usage.total
        except OSError:
            free = total = 0
        scratch, shards = self._scratch_needed, self.bytes_needed
        kept, n = self._kept_shard_bytes() if self._writing else (0, 0)
        left = self._shards_left_estimate(shards, kept)
        counted = self.kind != TOKENIZED_KIND and scratch + shards > 0
        # the bytes free now (the scratch removed) against what the phase that failed writes
        # (the scratch while reading and planning; the shards left beside it while writing):
        # enough, and the disk said full, is inodes. Not for a quota (EDQUOT): its limit is
        # not the disk's free bytes
        asked = scratch + (left if self._writing else 0)
        if self._inodes_out or inodes_exhausted(at, bytes_suffice=(
                counted and getattr(exc, "errno", None) == errno.ENOSPC and free >= asked)):
            return (f"{inodes_note(at, free)}: remove files on it that are not "
                    f"needed, or choose another {self.role}, on a filesystem with more inodes")
        if not counted:  # a tokenize run: what it writes is known only once written
            need = (f"no space left on device: this {_run_word(self.kind)} filled the disk "
                    f"while writing {self.role} ({free:,} bytes free)")
        else:
            # while shards are written, bytes_needed counts the shards left; the scratch (the
            # window spills, removed on the way out) is written again by the rerun. The scratch
            # is exact (uncompressed), the shards an upper bound (counted uncompressed): said
            # apart, so that a user frees what is needed, knowing what may be
            need = (f"no space left on device: this pack needs {scratch:,} bytes for its "
                    f"scratch and up to {shards:,} more for its shards (counted uncompressed; "
                    f"{free:,} free)")
        if self.keeps_finished:  # removed at the commit only: both must fit until then
            return (f"{need}; the finished {_run_word(self.previous.kind)} this run replaces "
                    f"stays in {self.role} until the new one is complete, so both must fit: "
                    f"free space, choose another {self.role}, or remove the old one first")
        if not counted:
            return f"{need}; free space or choose another {self.role}"
        # the rerun writes the whole scratch again beside the shards kept: a disk smaller than
        # both cannot finish this OUTPUT whatever is freed (removing OUTPUT only makes the
        # pack write those shards again)
        if kept and total and scratch + kept > total:
            self._disk_too_small = True
            return (f"{need}; this disk ({total:,} bytes) cannot hold the scratch a rerun writes "
                    f"again beside the {kept:,} bytes of the {n} finished shard"
                    f"{'s' * (n != 1)} kept in {self.role}: choose another {self.role}, on a "
                    "larger disk")
        # what a rerun writes: the scratch again and the shards left, at the finished shards'
        # compression when some are kept (else the bound)
        rerun = (f"about {scratch + left:,} bytes (the scratch again and the shards left, at "
                 "the compression of the shards kept)" if left != shards else
                 f"up to {scratch + shards:,} bytes (the scratch again and the shards left)")
        if self._writing and total and scratch + left > total - kept:
            # the most this disk can give a rerun, all else freed, is less than it writes
            self._disk_too_small = True
            return (f"{need}; this disk ({total:,} bytes) has room for at most "
                    f"{total - kept:,} beside the {kept:,} bytes of the "
                    f"{plural(n, 'finished shard')} kept in {self.role}, and a rerun writes "
                    f"{rerun}: choose another {self.role}, on a larger disk")
        if self._writing and scratch + left > free:
            return (f"{need}; a rerun writes {rerun}: free {scratch + left - free:,} more bytes "
                    f"before it, or choose another {self.role}")
        return f"{need}; free space or choose another {self.role}"

    def _shards_left_estimate(self, shards: int, kept: int) -> int:
        """The bytes of the shards left (``shards``: their bound, counted uncompressed) at the
        compression of the ``kept`` bytes of finished shards (bytes per row of bound over
        bytes on disk); ``shards`` when none is kept or the rows are not known."""
        entries = {**self._promised, **self._written}.values()
        try:
            rows = sum(int(e.get("rows", 0)) for e in entries)
        except (TypeError, ValueError, AttributeError):
            rows = 0
        bound = rows * self.row_bytes
        if not kept or not bound or kept >= bound:
            return shards
        return -(-shards * kept // bound)

    def _kept_shard_bytes(self) -> tuple[int, int]:
        """(bytes, count) of the finished shards in OUTPUT now; (0, 0) when it cannot be
        listed."""
        try:
            sizes = [e.size or 0 for n, e in self.path.listdir().items()
                     if not e.is_dir and (is_shard_name(n) or is_pending_name(n))]
        except OSError:
            return 0, 0
        return sum(sizes), len(sizes)


class StoreOutput(Output):
    """OUTPUT under a store prefix: the lock is an object naming its holder (advisory, see
    :func:`packtool.formats.object_store.take_lock`), objects appear whole when put, and
    unfinished multipart uploads under OUTPUT are aborted on entry and on the way out."""

    _store_lock: dict | None = None

    def _lock(self) -> None:
        self._store_lock = store.take_lock(self.path, overwrite=self.overwrite, kind=self.kind)

    def _unlock(self) -> None:
        if self._store_lock is not None:
            store.release_lock(self.path, self._store_lock)
            self._store_lock = None

    def _tidy_store(self) -> None:
        store.abort_uploads(self.path)


@contextmanager
def holding_lock(path, command: str):
    """Hold OUTPUT's lock (:data:`~packtool.formats.manifest.LOCK_NAME`, the one every ``pack``
    and ``tokenize`` writing OUTPUT holds) while ``command`` (``upgrade``) rewrites what is
    there: a run writing OUTPUT refuses ``command``, and a run started meanwhile is refused
    (another packtool run holds the lock). A local lock is released by the kernel when the
    process dies (its file records nothing: what holds it is named by OUTPUT's in-progress
    marker, else as another packtool run); a store's is an object naming its holder and
    ``command`` (:func:`packtool.formats.object_store.take_lock`).

    Args:
        path: the OUTPUT directory or store URI.
        command: the packtool command, for the message.

    Raises:
        OutputError: a run holds the lock (one line naming what it writes and the fix), or
            OUTPUT cannot be written.
    """
    loc = Location.parse(path)
    key = loc.join(LOCK_NAME).display
    if not loc.is_local:
        try:  # the lock object names this command to the runs it holds off
            mine = store.take_lock(loc, overwrite=False, kind=None, command=command)
        except OutputError as exc:
            raise OutputError(f"{exc}; then rerun packtool {command}") from None
        HELD_HERE.add(key)
        try:
            yield
        finally:
            HELD_HERE.discard(key)
            store.release_lock(loc, mine)
        return
    lock = FileLock(loc.join(LOCK_NAME).path)
    try:
        lock.acquire(timeout=LOCK_WAIT_S, poll_interval=0.02)
    except Timeout:
        # what the run writes, as its marker says; before its marker (or an upgrade, which
        # writes none) nothing says which command holds it: another packtool run
        raise OutputError(f"{loc.display}: another packtool {run_words(marker_kind(loc))} is "
                          f"writing OUTPUT now (its lock {LOCK_NAME} is held); wait for it to "
                          f"end, then rerun packtool {command}") from None
    except OSError as exc:
        raise OutputError(f"{loc.display}: cannot write ({exc.strerror}); packtool {command} "
                          "rewrites OUTPUT's manifest, so it needs write access") from None
    HELD_HERE.add(key)
    try:
        yield
    finally:
        HELD_HERE.discard(key)
        loc.join(LOCK_NAME).delete()  # still held: nobody waits on it
        lock.release()


def _scratch_units(tmp: Location) -> "tuple[ScratchKept, list[tuple[Location, bool]]]":
    """What the scratch ``tmp`` keeps for a rerun: its finished units (windows and read parts:
    ``done.json`` in them) and the staging directories of read parts begun (a
    :data:`PARTIAL_PROGRESS` record in them), as a :class:`ScratchKept`; and ``(location,
    is a directory)`` of everything else in it but its fingerprint (what a trim removes).
    Reads only."""
    kept, others = ScratchKept(), []
    for name, e in tmp.listdir().items():
        if name == SCRATCH_FINGERPRINT:
            continue
        where = tmp.join(name)
        if e.is_dir and name.startswith(SCRATCH_UNITS):
            done = _read_json(where.join(WINDOW_DONE))
            if done is not None:
                kept.add(name, done)
                continue
        elif e.is_dir and f"-{READ_DIR_PREFIX}" in name:
            record = _read_json(where.join(PARTIAL_PROGRESS))
            if record is not None:
                kept.add(name, record, partial=True)
                continue
        others.append((where, e.is_dir))
    return kept, others


#: The words of an output a stopped run left nothing in for its rerun (:meth:`Output.stopped_words`,
#: :func:`held_words`, :func:`untouched_words`): a stop whose every output says them has nothing
#: to resume.
NOTHING_KEPT = "nothing was kept"


#: The advice of an interrupted message after :meth:`Output.replaced_untouched` words, in place of
#: "rerun the same command": that command replaces what OUTPUT keeps, the earlier one resumes it.
REPLACED_RERUN = "rerun the command of those options to resume it, or this one to replace it"


def held_words(path) -> str | None:
    """What the local output ``path`` keeps of a run stopped before its end (Ctrl-C, SIGTERM,
    SIGKILL), in the words of :meth:`Output.stopped_words`, for a run stopped before it entered
    that output (which is then as the run found it): ``OUT has no manifest; kept for the rerun:
    ...`` (the read parts, read parts begun and planned windows of its scratch, the finished
    shards), ``OUT has no manifest (its in-progress marker only; nothing was kept)``, or ``OUT
    still holds its earlier finished pack, untouched; kept for the rerun: ...`` (an
    ``--overwrite`` stopped before its commit). Whose options that work is of is not known
    here: the rerun of the command that left it reuses it.

    Returns:
        the words; None when the output keeps nothing of such a run (absent, empty, a finished
        output alone, a scratch with no finished unit), cannot be listed, or is in a store
        (not listed for a message: a request, which may wait long on a store out of reach).
    """
    loc = Location.parse(path)
    if not loc.is_local:
        return None
    try:
        found = loc.listdir()
        if IN_PROGRESS_NAME not in found and TMP_DIR_NAME not in found:
            return None
        kept = (_scratch_units(loc.join(TMP_DIR_NAME))[0] if TMP_DIR_NAME in found
                else ScratchKept())
    except OSError:
        return None
    d = loc.display
    if MANIFEST_NAME in found:  # the new shards wait under their pending names
        what = kept.describe(sum(1 for n, e in found.items()
                                 if not e.is_dir and is_pending_name(n)))
        if not what:
            return None
        try:
            kind = read_manifest(loc).kind
        except ManifestError:
            kind = None
        return _kept_words(d, what, replaced=True, kind=kind)
    what = kept.describe(len(shard_files(found)))
    if what or IN_PROGRESS_NAME in found:
        return _kept_words(d, what)
    return None


def _kept_words(d: str, kept: str, *, replaced: bool = False, kind: str | None = None) -> str:
    """The words of an interrupted message for output ``d`` (as displayed) stopped before its
    commit, keeping ``kept`` (:meth:`ScratchKept.describe`; empty: nothing) for the rerun: beside
    the earlier finished pack (of ``kind``) it replaces, when ``replaced``, else without a
    manifest (its in-progress marker at least). One wording for :meth:`Output.stopped_words`
    and :func:`held_words`."""
    if replaced:
        return (f"{d} still holds its earlier finished {_run_word(kind)}, untouched"
                + (f"; kept for the rerun: {kept}" if kept else ""))
    return (f"{d} has no manifest; kept for the rerun: {kept}" if kept else
            f"{d} has no manifest (its in-progress marker only; {NOTHING_KEPT})")


def untouched_words(path) -> str:
    """What the output ``path`` of a run stopped before it entered it holds, in words for the
    interrupted message: :func:`held_words`, else ``nothing was kept (OUT is as it was before
    the run)``; for a store output, which is not listed for a message, ``OUT is as it was
    before the run (...: a rerun of the same command resumes what a stopped run kept there)``,
    since it may hold an earlier stopped run's work."""
    said = held_words(path)
    if said:
        return said
    if not Location.parse(path).is_local:
        return (f"{display(path)} is as it was before the run (a store output, not listed "
                "here: a rerun of the same command resumes what a stopped run kept there)")
    return f"{NOTHING_KEPT} ({display(path)} is as it was before the run)"


class ScratchKept:
    """What a scratch holds for a rerun: finished windows and read parts, and read parts begun
    (with the documents and tokens their records count)."""

    def __init__(self) -> None:
        self.windows = 0  #: finished windows (plans)
        self.parts = 0  #: finished read parts
        self.partial = 0  #: read parts begun, with a progress record
        self.docs = 0  #: documents in the kept read parts, finished or begun
        self.tokens = 0  #: their tokens

    @property
    def units(self) -> int:
        return self.windows + self.parts + self.partial

    def add(self, name: str, record: dict, partial: bool = False) -> None:
        """Count unit ``name`` (a directory of the scratch) whose ``done.json`` or progress
        record is ``record``."""
        if partial:
            self.partial += 1
        elif name.startswith(WINDOW_DIR_PREFIX):
            self.windows += 1
            return
        else:
            self.parts += 1
        try:
            self.docs += int(record.get("docs", 0))
            self.tokens += int(record.get("tokens", 0))
        except (TypeError, ValueError):
            pass

    def describe(self, shards: int = 0) -> str:
        """One phrase for the interrupted message (empty when nothing is kept), ``shards``
        output shards finished included."""
        bits = []
        if self.parts or self.partial:
            what = f"{self.parts} read part{'s' * (self.parts != 1)}"
            if self.partial:
                what += f" and {self.partial} begun"
            if self.docs:
                what += f" ({self.docs:,} documents, {self.tokens:,} tokens read)"
            bits.append(what)
        if self.windows:
            bits.append(f"{self.windows} planned window{'s' * (self.windows != 1)}")
        if shards:
            bits.append(f"{shards} finished shard{'s' * (shards != 1)}")
        return ", ".join(bits)


# -- the I/O of the pack's tasks: a scratch directory or prefix, shards, on any node --------------

#: The local scratches this process found where the driver made them (:func:`check_scratch_seen`).
_SCRATCH_SEEN: set = set()


def check_scratch_seen(tmp) -> None:
    """Refuse at once, in a task on a node of a joined Ray cluster
    (:func:`packtool.location.task_node`), a local scratch ``tmp`` this node does not see.

    The driver makes the scratch (its :data:`SCRATCH_FINGERPRINT`) before any task runs, so a
    node that does not find it sees another OUTPUT at that path (its own disk): without this the
    tasks would do all the work there. One stat per process and scratch; nothing in the driver's
    own processes or for a store (every node reaches the one store).

    Raises:
        OutputError: the scratch is not there; one line naming OUTPUT, the node and the fix.
    """
    node = task_node()
    if node is None or tmp in _SCRATCH_SEEN:
        return
    loc = Location.parse(tmp)
    if loc.is_local and loc.join(SCRATCH_FINGERPRINT).size() is None:
        raise OutputError(f"{loc.parent.display}: the Ray worker on node {node} does not see "
                          f"OUTPUT as the driver made it (no {TMP_DIR_NAME}/"
                          f"{SCRATCH_FINGERPRINT} there): {shared_storage_fix('OUTPUT')}")
    _SCRATCH_SEEN.add(tmp)


def claim_partial(tmp, name: str, record: str = PARTIAL_PROGRESS) -> Path | None:
    """Take over the staging directory a killed run left for unit ``name`` (one holding
    ``record``), so that only one task resumes it (:meth:`packtool.location.Location.claim_stage`);
    None when there is none (always in a store: staging is on the tasks' own disks, where a
    killed run's is removed instead, :func:`packtool.location.sweep_stages`)."""
    return Location.parse(tmp).claim_stage(name, record)


def keeps_stages(tmp) -> bool:
    """True when a staging directory of the scratch ``tmp`` left behind is found again by a
    rerun (a local scratch), so a task stopped half-way may leave its progress there."""
    return Location.parse(tmp).stages_found_again

def window_done(final) -> dict | None:
    """The saved counts of a finished window (its ``done.json``), None when not finished."""
    return _read_json(Location.parse(final).join(WINDOW_DONE))


def window_workdir(tmp, name: str) -> Path:
    """A new empty local directory where a window task writes ``name``'s files before
    :func:`publish_window` (:meth:`packtool.location.Location.stage` of the scratch); ``name``
    is the unit's own name (``window-00004``: :attr:`packtool.location.Location.name` of its
    final location, never a URI's tail, which carries the store's query)."""
    return Location.parse(tmp).stage(name)


def publish_window(work: Path, final) -> None:
    """Make a finished window directory ``work`` (``done.json`` in it) the window ``final``:
    renamed into place, or uploaded with ``done.json`` last; a window whose ``done.json`` is
    there is complete."""
    Location.parse(final).publish_dir(work, WINDOW_DONE)


def window_file(directory, name: str) -> str:
    """Location of file ``name`` of a window directory, as a string (path or URI)."""
    return str(Location.parse(directory).join(name))


#: The suffix of a shard being written in its staging directory (:func:`shard_temp`): not
#: ``.parquet``, so polars and duckdb, which scan hidden folders too, never read it as rows.
PARTIAL_SUFFIX = ".partial"


def shard_temp(tmp, name: str) -> Path:
    """A unique local path where a shard task writes shard ``name`` before publishing it, in a
    new staging directory of the scratch named after it (:meth:`packtool.location.Location.stage`),
    ``name`` with :data:`PARTIAL_SUFFIX` added; :func:`discard_shard_temp` removes what is left
    of it."""
    return Location.parse(tmp).stage(name) / f"{name}{PARTIAL_SUFFIX}"


def discard_shard_temp(path: Path, tmp=None) -> None:
    """Remove a shard task's staging directory and whatever is left in it."""
    shutil.rmtree(path.parent, ignore_errors=True)


def publish_shard(written: Path, output, name: str) -> None:
    """Publish the finished shard file ``written`` as shard ``name`` of ``output``, whole (a
    rename locally, one upload to a store), under its pending name
    (:func:`~packtool.formats.manifest.pending_name`): :meth:`Output.commit` gives it its final
    name just before the manifest is written."""
    Location.parse(output).join(pending_name(name)).publish_file(written)


def finished_shard(output, name: str, final: bool = True) -> Location | None:
    """Where finished shard ``name`` of ``output`` is now: under its pending name (published by
    this or an interrupted run), or under its final name (moved by an interrupted commit; not
    looked at when ``final`` is False: the final names hold the finished pack this run
    replaces, :attr:`Output.keeps_finished`); None when it is under neither."""
    out = Location.parse(output)
    for loc in (out.join(pending_name(name)), out.join(name))[:2 if final else 1]:
        if loc.size() is not None:
            return loc
    return None


def kept_shard(output, name: str, promised: dict | None, final: bool = True
               ) -> ShardEntry | None:
    """The manifest entry of shard ``name`` already in OUTPUT from an interrupted identical run
    (:func:`finished_shard`), or None when it must be written.

    A shard is published whole (a rename, or one put), so a file at its pending or final name is
    complete: its entry is the one the marker ``promised`` when the size agrees, else it is read
    back (sha256 and footer) from the file (:func:`~packtool.formats.manifest.shard_entry_of`).
    """
    loc = finished_shard(output, name, final)
    if loc is None:
        return None
    size = loc.size()
    if promised and promised.get("bytes") == size and promised.get("footer_sha256"):
        return ShardEntry(name, int(promised["rows"]), size, str(promised["sha256"]),
                          promised["footer_sha256"],
                          tuple((int(r), int(n)) for r, n in promised.get("row_groups") or ()))
    return dataclasses.replace(shard_entry_of(loc), file=name)


def _run_word(kind: str | None) -> str:
    """``pack`` or ``tokenize run``: what wrote an output of manifest kind ``kind`` (None: a
    marker written before kinds were recorded, a pack's)."""
    return run_words(kind or PACKED_KIND)


def _kind_words(kind: str | None) -> str:
    """What an output of manifest kind ``kind`` holds, for a message."""
    return "tokenized documents" if kind == TOKENIZED_KIND else "packed rows"


#: Recorded options no flag sets: they follow from others (``rows_per_group`` from
#: ``--row-group-mb`` and ``--capacity``, ``holdout_part`` from ``--holdout``), so a message
#: names them only when nothing else differs.
_DERIVED_OPTIONS = frozenset({"rows_per_group", "holdout_part"})
#: Recorded options whose flag is not their name in dashes.
_FLAG_NAMES = {"shuffle": "--no-shuffle", "keep_columns": "--keep-column"}


#: The options that read input labels: with one read, ``--labels none`` is recorded as
#: ``unshifted`` (:func:`packtool.pipeline.read.input_labels_config`), so a recorded ``labels``
#: of ``none`` against ``unshifted`` may follow from them, or from the inputs (a labels column
#: or loss mask present in one and not the other), not from ``--labels``.
_LABEL_SOURCES = ("labels_column", "loss_mask_column")


def _differences(was, now) -> str:
    """What differs between a finished pack's recorded options and this run's, for a message:
    ``other options (compression: default -> lz4)``, or other inputs when the options agree.
    A recorded ``labels`` of ``none`` against ``unshifted`` is named only when no other option
    explains it, and then as the labels stored, which the inputs decide too."""
    if now is None:
        return "other options or inputs"
    was, now = dict(was or {}), json.loads(json.dumps(now))  # as recorded (tuples as lists)
    keys = [k for k in dict.fromkeys([*now, *was]) if was.get(k) != now.get(k)]
    if not keys:
        return "other inputs (or another packtool version)"
    implied = {str(was.get("labels", "none")), str(now.get("labels", "none"))} == \
        {"none", "unshifted"}
    if implied and any(k in keys for k in _LABEL_SOURCES):
        keys.remove("labels")  # what the labels/loss-mask column option changed implies
    elif implied and not [k for k in keys if k not in _DERIVED_OPTIONS and k != "labels"]:
        return (f"other options or inputs (labels stored: {was.get('labels', 'none')!r} -> "
                f"{now.get('labels', 'none')!r}: --labels, or a labels column or loss mask "
                "read in one pack and not in the other)")
    chosen = [k for k in keys if k not in _DERIVED_OPTIONS]
    keys = chosen or keys  # what follows from a chosen option is not news
    changes = ", ".join(_option_change(k, was, now) for k in keys[:4])
    return f"other options ({changes}{', ...' if len(keys) > 4 else ''})"


def _option_change(key: str, was: dict, now: dict) -> str:
    """One recorded option that differs, as the command line spells it: ``--rows-per-shard
    8192 -> 100``, ``--no-shuffle not given -> given``, ``--compression default -> lz4``; an
    option no flag sets (``rows_per_group``, which ``--row-group-mb`` and ``--capacity``
    decide) by its recorded name."""
    def show(d):
        if key not in d:
            return "default"
        v = d[key]
        if isinstance(v, bool):  # a flag; --no-shuffle records shuffle: True when not given
            return "not given" if v == (key == "shuffle") else "given"
        if v is None or v == []:
            return "none"
        if isinstance(v, list):  # a repeatable option (--keep-column): every value given
            return ",".join(map(str, v))
        if isinstance(v, dict):  # the tokenizer: its file
            return str(v.get("file") or "another") + (
                f" (sha256 {str(v['sha256'])[:12]})" if v.get("sha256") else "")
        return str(v)

    if key in _FLAG_NAMES:
        name = _FLAG_NAMES[key]
    elif key in _DERIVED_OPTIONS or key == "shard_layout":
        name = key.replace("_", " ")
    else:
        name = "--" + key.replace("_", "-")
    return f"{name} {show(was)} -> {show(now)}"


def _input_changes(manifest: Manifest, files, found_at: float | None) -> str:
    """What differs between the inputs ``manifest`` records and ``files`` (the
    :class:`~packtool.formats.reader.InputFile` list read now), for a message: files added,
    removed or of another size (the first two of each and a count); with none of those, the
    files whose mtime is after the manifest was written (``found_at``, its mtime in seconds;
    the fingerprint records each file's mtime, docs/robustness.md), or that the content or
    mtime changed in place, or another version packed it."""
    def key(path) -> str:
        if path == IN_MEMORY_INPUT:  # no file: never resolved as a path
            return path
        return _resolved(path) if Location.parse(path).is_local else display(path)

    was = {key(e.path): e for e in manifest.inputs}
    now = {key(f.path): f for f in files}

    def some(names, what) -> str:
        shown = ", ".join(input_display(n) for n in names[:2])
        more = f" and {len(names) - 2} more" if len(names) > 2 else ""
        noun = "input" if IN_MEMORY_INPUT in names else "file"  # documents are no file
        return f"{plural(len(names), noun)} {what}: {shown}{more}"

    added = [n for n in now if n not in was]
    removed = [n for n in was if n not in now]
    resized = [n for n in now if n in was and was[n].bytes != now[n].bytes]
    said = [some(names, what) for names, what in ((added, "added"), (removed, "removed"),
                                                  (resized, "modified, another size"))
            if names]
    if said:
        return "; ".join(said)
    touched = [n for n in now if found_at is not None and now[n].mtime_ns / 1e9 > found_at]
    run = _run_word(manifest.kind)  # the run that wrote it: "pack", "tokenize run"
    verb = "tokenized" if manifest.kind == TOKENIZED_KIND else "packed"
    version = ("" if manifest.packtool_version == _versions()["packtool"] else
               f"; packtool {manifest.packtool_version} {verb} it, this is "
               f"{_versions()['packtool']}")
    if touched:
        return (some(touched, f"touched or changed in place since the {run}, same size, later "
                     "mtime (the fingerprint includes each file's mtime)") + version)
    return ("the same files and sizes, so a file changed in place or only its mtime did (the "
            "fingerprint includes each file's mtime), or another version of packtool or of "
            f"pyarrow or numpy {verb} it" + version)
