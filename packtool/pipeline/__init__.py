"""``packtool pack``: the one driver. Every run is three phases of tasks mapped by an engine.

    read (pipeline/read.py) -> plan (pipeline/plan.py) -> layout (pipeline/layout.py)
        -> write (pipeline/write.py), engines (packtool/engines/) beside, OUTPUT owned by
        packtool/output.py

1. The inputs are listed and their footers read: the corpus is cut into read parts (at most
   64 MB of stored input each) and its documents are dealt to windows (no ``--window-docs``:
   one window of the whole corpus).
2. The engine maps :func:`~packtool.pipeline.read.read_part` over the read parts: each part's
   documents are read as ``pack`` and ``compare`` read them
   (:func:`~packtool.pipeline.read.iter_documents`: masks, the ``--holdout`` split, BOS/EOS),
   validated and spilled to OUTPUT's scratch directory in input order, keeping progress piece
   by piece (a file, or at most 64 MB of one). A bad value in any part stops the run here,
   before anything outside the scratch directory is written.
3. The engine maps :func:`~packtool.pipeline.plan.plan_window` over the windows: each window's
   rows are planned from the lengths alone and written, as segments pointing into the read
   parts' spills, in the window's (seeded, shuffled) row order. Only counts come back.
4. :func:`~packtool.pipeline.plan.merge_windows` decides which window every output row comes
   from (a seeded shuffle of the window labels: as mixed as one permutation of all rows), and
   the engine maps :func:`~packtool.pipeline.write.write_shard_task` over the output shards;
   each reads its rows' segments straight from the spills into the rows it lays out.
5. The manifest (:data:`~packtool.formats.manifest.MANIFEST_NAME`) is written last
   (:meth:`packtool.output.Output.commit`).

``--holdout`` runs all of it twice, once per side of the split (:mod:`packtool.pipeline.holdout`).

Every token is written once outside Parquet (the read parts' spill) and read back once, into
the row being laid out. Memory: one record batch per read task; a window's lengths and plan
(about 80 bytes per document piece) per plan task; one row group and its shard's segments per
writing task. Spills are read with ``pread``, never memory-mapped (see
:mod:`packtool.pipeline.layout`).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from packtool._version import __version__
from packtool.config import PackConfig
from packtool.engines import make_engine
from packtool.errors import InputError, shortage_error
from packtool.formats.manifest import (FORMAT_VERSION, HoldoutPairing, InputEntry,
                                       LabelsInfo, Manifest, Tokenization, WindowEntry,
                                       Windowing, dropped_holdout, shard_name)
from packtool.formats.reader import discover_inputs, reads_labels
from packtool.location import Location, display, for_tasks
from packtool.formats.schema import labels_convention, packed_schema
from packtool.output import (FILES_FIX, MEMORY_FIXES, NOTHING_KEPT, REPLACED_RERUN, Output,
                             fingerprint, untouched_words)
from packtool.pipeline import progress as _progress_mod
from packtool.pipeline.layout import ShardSources
from packtool.pipeline.plan import (PartIndex, WindowInfo, Windows, merge_windows, plan_window,
                                    plan_windows)
from packtool.pipeline.read import (PartInfo, ReadPart, file_rows, input_labels_config,
                                    plan_reads, read_part, require_tokens)
from packtool.pipeline.write import ShardJob, write_shard_task
from packtool.signals import interruptible, test_pause
from packtool.stats import PackStats

__all__ = ["run_pack", "PackResult", "disk_peak", "plan_windows", "plan_reads", "Windows", "ReadPart"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackResult:
    """What :func:`run_pack` did."""

    stats: PackStats  #: counts of the whole output
    manifest: Manifest  #: the manifest written (or found, when ``already_complete``)
    seconds: float  #: wall time, engine start-up included
    shards_reused: int  #: shards kept from an interrupted identical run
    already_complete: bool = False  #: OUTPUT already held this pack: nothing was done
    warnings: list = field(default_factory=list)  #: loud notes (e.g. many tokens dropped)
    windows_reused: int = 0  #: windows kept finished from an identical run that was killed
    parts_reused: int = 0  #: read parts kept finished from an identical run that was killed
    docs_reused: int = 0  #: documents not read again (kept parts, and parts begun)
    holdout: "PackResult | None" = None  #: the held-out pack of ``--holdout``, when asked for
    #: the ``warnings`` already logged as the run went (the low-space note, said before the
    #: disk may fill): a caller printing ``warnings`` leaves these out
    said: tuple = ()


def _progress(total, desc, unit, enabled):
    """A tqdm bar on stderr; counts stay integers (``3/33 shard``), only an open-ended count
    (``total=None``) is abbreviated (``1.2M doc``)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=f" {unit}", unit_scale=total is None, leave=False,
                disable=not enabled, file=sys.stderr)


def _window_record(w: int, info: WindowInfo) -> WindowEntry:
    s = info.stats
    return WindowEntry(w, info.docs, s.tokens_in, s.real_tokens, s.rows, s.lower_bound_rows,
                       s.extra_rows)


def _warnings(cfg: PackConfig, stats: PackStats,
              tokenized: Tokenization | None = None) -> list[str]:
    """The ``WARNING:`` lines of a pack: :meth:`PackStats.warnings` (``--overflow``,
    ``--min-fill``, padding, no effective targets), then each of ``--pad-id``,
    ``--append-eos`` and ``--prepend-bos`` outside the vocabulary (``--pad-id`` only when
    padding tokens were written) of the tokenizer the inputs
    were tokenized with (:meth:`Tokenization.vocabulary_warnings`; ``tokenized``: the record,
    None when none)."""
    notes = stats.warnings(cfg.overflow, cfg.min_fill)
    if tokenized is not None:
        notes += tokenized.vocabulary_warnings(cfg.layout_options(),
                                               padding_tokens=stats.padding_tokens)
    return notes


def _source_table(column: str | None, pinfos: list[PartInfo], files):
    """``--source-column``: the output's id -> value table (the sorted values of every read
    part) and, per part, its own ids -> the table's ids (tuples of ints); ``((), None)`` without
    the option.

    Raises:
        InputError: the column holds strings in some files and integers in others.
    """
    if column is None:
        return (), None
    kinds = {type(v) is str for i in pinfos for v in i.sources}
    if len(kinds) > 1:
        names = ", ".join(str(f.path) for f in files[:3]) + (", ..." if len(files) > 3 else "")
        raise InputError(f"{names}: --source-column {column!r} holds strings in some input "
                         "files and integers in others; cast it to one type before packing")
    table = tuple(sorted({v for i in pinfos for v in i.sources}))
    index = {v: k for k, v in enumerate(table)}
    return table, tuple(tuple(index[v] for v in i.sources) for i in pinfos)


def _shard_jobs(labels: np.ndarray, n_windows: int, per: int, out: Output,
                paths=str) -> list[ShardJob]:
    """One job per ``per`` output rows: the window of each row and, per window present, the
    position in its row order of its first row in the shard (the rows it took before);
    ``paths``: how OUTPUT and its scratch are handed to the tasks (:func:`_task_paths`)."""
    taken = np.zeros(n_windows, dtype=np.int64)  # rows of each window in earlier shards
    jobs = []
    output, tmp = paths(out.path), paths(out.tmp)
    for s in range(-(-labels.size // per)):
        windows = labels[s * per:(s + 1) * per]
        present, counts = np.unique(windows, return_counts=True)
        jobs.append(ShardJob(s, shard_name(s), windows, taken[present].copy(), output,
                             tmp, out.resume, out.promised(shard_name(s)),
                             not out.keeps_finished))
        taken[present] += counts
    return jobs


def _task_paths(engine):
    """How local paths are handed to ``engine``'s tasks: as given (``str``) to the threads of
    this process; made absolute (:func:`~packtool.location.for_tasks`) for tasks in other
    processes, which resolve a relative path in their own working directory (a joined Ray
    cluster's: where its ``ray start`` ran), never in this one's. The manifest and the bytes
    written do not depend on it."""
    return str if engine.name == "local" else for_tasks


def _parts_for_tasks(parts: list[ReadPart], paths) -> list[ReadPart]:
    """``parts`` with each piece's file named as ``paths`` hands it to the tasks."""
    if paths is str:
        return parts
    return [dataclasses.replace(p, pieces=tuple(dataclasses.replace(q, path=paths(q.path))
                                                for q in p.pieces)) for p in parts]


@dataclass(frozen=True)
class _Run:
    """One pack's inputs, read from the footers before OUTPUT is touched."""

    cfg: PackConfig  #: with the labels an input labels column implies
    files: list
    parts: list
    windows: Windows
    fp: str  #: the output's fingerprint
    #: what the tokenize outputs read agree on (:func:`tokenized_record`), None: nothing
    tokenized: Tokenization | None = None
    #: the pack's warning that the inputs hold the ids of different tokenizers, or None
    tokenizers_note: str | None = None
    #: one output of ``pack --holdout``: its pairing with the other (set by
    #: :mod:`packtool.pipeline.holdout`), None otherwise
    pairing: HoldoutPairing | None = None
    #: the held-out pack of ``--holdout``: ``(documents, tokens)`` of its side as the training
    #: pack's read counted them (tokens as read), so that its disk check counts its own
    #: documents, not the whole input's; None: this pack's read parts say
    side: tuple[int, int] | None = None
    #: how messages name this pack's output; None: ``OUTPUT``, or ``--holdout-output`` for
    #: the held-out pack (:mod:`packtool.pipeline.holdout` says ``held-out output`` when
    #: packtool named it beside OUTPUT)
    role: str | None = None

    def output(self) -> Output:
        """OUTPUT of this pack, not entered yet (entering it runs every check on OUTPUT)."""
        cfg = self.cfg
        role = self.role or ("--holdout-output" if cfg.holdout_part == "holdout" else "OUTPUT")
        named = cfg.inputs_digest is None and cfg.inputs_name is None  # files, not documents
        return Output(cfg.output, cfg.inputs, self.fp, overwrite=cfg.overwrite,
                      options=cfg.layout_options(), role=role, pairing=self.pairing,
                      files=self.files if named else None)


def _prepare(cfg: PackConfig) -> _Run:
    """List the inputs and read their footers; nothing is written."""
    files = discover_inputs(list(cfg.inputs), skip_unsupported=cfg.skip_unsupported,
                            outputs=cfg.own_outputs())
    cfg = input_labels_config(cfg, files)  # an input labels column: labels are stored
    parts = plan_reads(files, cfg.column)  # footers only
    windows = plan_windows(sum(p.docs for p in parts), cfg.window_docs)
    tokenized, note = tokenized_record(files)
    if cfg.holdout_part == "holdout":  # said once, by the training pack of the same input
        note = None
    return _Run(cfg, files, parts, windows,
                fingerprint(cfg.layout_options(), files, cfg.inputs_digest), tokenized, note)


def tokenized_record(files) -> tuple[Tokenization | None, str | None]:
    """What a pack of ``files`` records of the tokenize outputs it reads, and its warning.

    The record (:meth:`Tokenization.common`) is the one tokenizer of every input file's
    tokenize manifest and each EOS or BOS id tokenize added that they agree on: nothing when
    some file is not a shard of a finished tokenize output (plain Parquet: nothing is known of
    it) or the files come from different tokenizers (an id means nothing without its
    tokenizer).

    Inputs tokenized by different tokenizers (by kind and sha256 of the tokenizer file) are
    warned of, not refused: the ids of two tokenizers in one output are almost surely a mistake
    (id 1000 is one token in the first and another in the second), but pack cannot tell it
    from two files whose ids are the same (a ``tokenizer.json`` saved again with another layout
    or metadata, or with special tokens appended after the vocabulary), and it lays out ids
    without reading them; a refusal would need an option to override it. So it packs them,
    says so in one line naming two of the outputs and their tokenizers, and records no
    tokenizer, so that nothing downstream vouches for the ids. A mix of tokenize outputs and
    other files is not warned of (nothing says the other files' tokenizer).

    Args:
        files: the :class:`~packtool.formats.reader.InputFile` list of the pack, in order.

    Returns:
        ``(record, warning)``: the :class:`Tokenization` (None: nothing recorded) and the
        warning's line (None: no two tokenizers).
    """
    record = Tokenization.common(f.tokenization for f in files)
    seen: list = []  # (tokenizer, first file) of each tokenizer, in input order
    for f in files:
        t = f.tokenization
        if t is not None and not any(t.tokenizer.same_ids(s) for s, _ in seen):
            seen.append((t.tokenizer, f))
    if len(seen) < 2:
        return record, None
    (a, fa), (b, fb) = seen[:2]
    more = f" and {len(seen) - 2} more" if len(seen) > 2 else ""
    made_a, made_b = (Location.parse(f.path).parent.display for f in (fa, fb))  # the outputs
    note = (f"INPUT holds the ids of different tokenizers: {made_a} was tokenized with "
            f"{a.describe()}, {made_b} with {b.describe()}{more}; an id means another token in "
            "each, so the rows mix vocabularies and the manifest records no tokenizer; "
            "tokenize every input with one tokenizer (packtool tokenize --tokenizer FILE), "
            "then pack again with --overwrite")
    return record, note


def _prepared(cfg: PackConfig) -> _Run:
    """:func:`_prepare`, a machine running short while it lists and reads footers reported as
    such (:class:`~packtool.errors.ResourceError`), never as a bad file."""
    try:
        return _prepare(cfg)
    except Exception as exc:
        short = shortage_error(exc, memory=MEMORY_FIXES[None], files=FILES_FIX,
                               state="OUTPUT is as it was before the run")
        if short is not None:
            raise short from None
        raise


#: Bytes a slot of a per-token column may take in a shard, at most: int32 ids that do not
#: compress (compression never grows a page by more than a fraction of a percent); the
#: structural columns (``segment_ids``, ``position_ids``) are counted at this width too.
SLOT_BYTES = 4
#: Bytes of one document piece in the shards' ragged columns (``cu_seqlens`` and
#: ``cu_seqlens_unpadded`` int32, ``doc_ids`` and ``doc_offsets`` int64, ``source_ids``
#: int32) and of one row's scalars and list offsets, uncompressed.
PIECE_BYTES, ROW_BYTES = 28, 32
#: Parquet footers, page headers and the manifest: a fixed allowance per shard.
SHARD_OVERHEAD = 64 * 1024


def disk_peak(cfg: PackConfig, tokens: int, docs: int, windows: int,
              rows: int | None = None, *, flags: bool = True) -> tuple[int, int]:
    """Bytes a pack writes on OUTPUT's disk at its peak (just before the manifest, when every
    shard is written and the scratch not yet removed), as (scratch, shards): an upper bound
    under the assumptions below, checked before reading and again before writing.

    Args:
        cfg: the pack's options (capacity, labels, ``--segment-multiple``, BOS/EOS, source
            column, ``--rows-per-shard``).
        tokens: input tokens (from the footers: before masks drop any).
        docs: input documents.
        windows: planning windows.
        rows: the exact number of output rows once planned; None before planning, when full
            rows are assumed (``ceil(tokens / capacity)`` plus one per window), so the
            estimate before reading can be under the real need by the padding of the rows;
            the check before writing uses the exact count.
        flags: target flags are spilled (a labels column or loss mask is read:
            :func:`~packtool.formats.reader.reads_labels`); False counts none.

    Returns:
        ``scratch``: the read parts' spills (4 bytes a token, 1 of target flags when
        ``flags``, 8 + 4 a
        document) and the plans (32 + 4 bytes a document piece, 8 a row), where pieces are at
        most ``docs + tokens / capacity`` (a document over capacity is cut into pieces of at
        most ``capacity``); ``shards``: :data:`SLOT_BYTES` per slot of every per-token column
        (``input_ids``, ``segment_ids``, ``position_ids``, ``labels`` when stored),
        :data:`PIECE_BYTES` per piece, :data:`ROW_BYTES` per row and :data:`SHARD_OVERHEAD`
        per shard. Compression only makes the real shards smaller (real ids: about 1 byte
        a token for ``input_ids`` and 0.024 for every structural column together,
        :mod:`packtool.formats.writer`).
    """
    per_doc = int(cfg.append_eos is not None) + int(cfg.prepend_bos is not None)
    tokens_eff = tokens + per_doc * docs + (cfg.segment_multiple - 1) * docs  # padded pieces
    c = cfg.capacity
    pieces = docs + -(-tokens_eff // c)
    if rows is None:
        rows = -(-tokens_eff // c) + windows
    scratch = (4 + int(flags)) * tokens_eff + 12 * docs + 36 * pieces + 8 * (rows + windows)
    columns = 3 + (cfg.labels.value != "none")
    shards = -(-rows // cfg.rows_per_shard)
    written = (SLOT_BYTES * columns * c * rows + PIECE_BYTES * pieces + ROW_BYTES * rows
               + SHARD_OVERHEAD * (shards + 1))
    return scratch, written


def _run(run: _Run, out: Output, show: bool, t0: float) -> PackResult:
    """The pack ``run`` inside its entered OUTPUT ``out``."""
    said = [run.tokenizers_note] if run.tokenizers_note else []
    if out.complete:
        m = out.manifest
        return PackResult(m.totals, m, time.perf_counter() - t0, len(m.shards), True,
                          said + _warnings(run.cfg, m.totals, run.tokenized))
    done = _pack(run.cfg, run.files, run.parts, run.windows, run.fp, out, show, t0,
                 run.tokenized, run.pairing, run.side)
    return dataclasses.replace(done, warnings=said + done.warnings)


def _interrupted(cfg: PackConfig, outs: "list[Output | None]") -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` to raise once the run has left its outputs: its message says
    what each output of ``cfg`` (OUTPUT, and the held-out output of ``--holdout``) holds now
    (:meth:`Output.stopped_words`: finished, its earlier pack untouched, or no manifest and
    what was kept for the rerun); ``outs``: the outputs entered (None for one that was not,
    which is as the run found it: :func:`~packtool.output.untouched_words`, what an earlier
    stopped run kept there included). Each is found by its location, not by how messages name it
    (a held-out output named after OUTPUT is not the ``--holdout-output`` role)."""
    entered = {o.path.identity(): o for o in outs if o is not None}
    words = []
    for path, _role in cfg.own_outputs():
        out = entered.get(Location.parse(path).identity())
        words.append(out.stopped_words() if out is not None else untouched_words(path))
    stop = KeyboardInterrupt("; ".join(words))
    # whether a rerun finds anything of this run (a finished output, kept read parts, windows
    # or shards): the command line's advice is to resume, else to start again
    stop.kept_any = any(NOTHING_KEPT not in w for w in words)
    if any(o is not None and o.replaced_untouched() for o in outs):
        stop.rerun = REPLACED_RERUN  # the same command would replace what is kept
    return stop


def _refuse_empty_side(cfg, mine: tuple, theirs: tuple) -> None:
    """``--holdout`` whose training or held-out side has documents but not one token to pack
    (every document it got is empty, or its tokens all have attention mask 0), told by the
    training pack's read, which counts both sides' tokens after the attention mask, so before
    either output is written (and by the held-out pack's read alike).

    Args:
        cfg: the pack's :class:`~packtool.config.PackConfig` (``holdout_part`` says which side
            ``mine`` is).
        mine, theirs: ``(documents, tokens to pack, tokens the attention mask removed,
            documents empty as read)`` of this pack's side and of the other side.

    Raises:
        InputError: one side has no token to pack (the split, the counts, whether its documents
            are empty or masked, and the fix named).
    """
    if bool(mine[1]) == bool(theirs[1]):  # both have tokens, or neither: require_tokens
        return
    names = {"train": "training side", "holdout": "held-out side"}
    this = cfg.holdout_part
    that = "holdout" if this == "train" else "train"
    (n, _, masked, empty), (m, *_), side, full = ((mine, theirs, this, that) if not mine[1]
                                                  else (theirs, mine, that, this))
    other = f"the {m:,} held out" if full == "holdout" else f"the {m:,} left for training"
    if not masked:
        what = f"only empty documents ({n:,}, no tokens; the tokens are all in {other})"
    elif not empty:
        what = (f"only masked documents ({n:,}: their {masked:,} tokens all have attention "
                f"mask 0; the tokens to pack are all in {other})")
    else:
        what = (f"only masked or empty documents ({n:,}: {empty:,} empty, the {masked:,} "
                f"tokens of the other {n - empty:,} all have attention mask 0; the tokens to "
                f"pack are all in {other})")
    fix = ("choose another --seed or fraction" if not masked else
           "check the attention mask in the INPUT and --attention-mask-column, or choose "
           "another --seed or fraction")
    raise InputError(f"--holdout {cfg.holdout} --seed {cfg.seed}: the {names[side]} gets "
                     f"{what}; {fix}")


def run_pack(cfg: PackConfig, *, progress: bool = True) -> PackResult:
    """Pack ``cfg.inputs`` into ``cfg.output`` (phases in the module docstring); with
    ``cfg.holdout``, also the held-out documents into ``cfg.holdout_output``
    (:mod:`packtool.pipeline.holdout`: both outputs are checked before either is written).

    Returns:
        :class:`PackResult` with the merged :class:`PackStats` and the manifest.

    Raises:
        InputError, SchemaError: bad input (file, row and fix named); OUTPUT is as before.
        OutputError: OUTPUT cannot be used (another pack holds it, not empty, full disk...).
        PackingError: a document over capacity with ``--overflow error``.
        EngineError: a Ray task failed (OUTPUT is left resumable).
        ResourceError: the machine ran out of memory (:class:`~packtool.errors.OutOfMemoryError`)
            or open files; the message names the fixes of the phase, OUTPUT is as before or
            resumable.
        MissingDependencyError: ``--engine ray`` without Ray installed.
        KeyboardInterrupt: Ctrl-C or SIGTERM; each output is as before, finished, or resumable
            by the same command, and the exception's message says which, with what was kept
            for the rerun.
    """
    if cfg.holdout is not None and cfg.holdout_part is None:  # two packs, one per side
        from packtool.pipeline.holdout import run_holdout

        return run_holdout(cfg, _prepared, _run, _interrupted, progress=progress)
    t0 = time.perf_counter()
    show = progress and sys.stderr.isatty()
    run = _prepared(cfg)
    out = None
    try:
        with interruptible(), run.output() as out:
            return _run(run, out, show, t0)
    except KeyboardInterrupt:
        raise _interrupted(cfg, [out]) from None


def _pack(cfg: PackConfig, files, parts: list[ReadPart], windows: Windows, fp: str,
          out: Output, show: bool, t0: float,
          tokenized: Tokenization | None = None,
          pairing: HoldoutPairing | None = None,
          side: tuple[int, int] | None = None) -> PackResult:
    """The phases of :func:`run_pack` inside OUTPUT."""
    est_tokens = sum(p.tokens for p in parts) + (sum(p.docs for p in parts)
                                                   if cfg.append_eos is not None else 0)
    # the read parts' token spills (4 bytes a token, 1 more for target flags at most) and the
    # plans (about 2 segments of 32 bytes per 300 tokens); checked on a local disk only
    out.phase = "read"
    # this pack's documents and tokens: the held-out pack's side as the training pack's read
    # counted it; else the read parts' (a training side's share is known only once read)
    docs, tokens = side if side is not None else (sum(p.docs for p in parts),
                                                  sum(p.tokens for p in parts))
    flags = reads_labels(files, cfg.column, cfg.labels_column, cfg.loss_mask_column)
    scratch, shards = disk_peak(cfg, tokens, docs, windows.count, flags=flags)
    c_row = SLOT_BYTES * cfg.capacity * (3 + (cfg.labels.value != "none"))
    out.check_space(max(0, shards - c_row * out.kept_rows), scratch)  # a local disk only
    space_note = out.space_note
    if space_note:
        log.warning(space_note)
    with make_engine(cfg.engine.value, workers=cfg.workers,
                     ray_address=cfg.ray_address) as engine:
        local = engine.name == "local"
        paths = _task_paths(engine)
        tmp = paths(out.tmp)
        pinfos: list[PartInfo] = []
        with _progress_mod.phase("read", est_tokens, windows.docs, show) as bar:
            for info in engine.map(read_part, [(cfg, part, tmp)
                                               for part in _parts_for_tasks(parts, paths)]):
                pinfos.append(info)
                if info.reused or not local:  # local tasks report as they read
                    bar.advance(info.docs, info.tokens)
        total = PackStats(capacity=cfg.capacity)
        for info in pinfos:
            total = total + info.counts
        bases = np.zeros(len(pinfos) + 1, dtype=np.int64)
        np.cumsum([i.tokens for i in pinfos], out=bases[1:])
        firsts = [p.first_doc for p in parts] + [windows.docs]
        source_values, source_maps = _source_table(cfg.source_column, pinfos, files)
        index = PartIndex(tuple(i.directory for i in pinfos), tuple(firsts),
                          tuple(int(x) for x in bases), tuple(i.targets for i in pinfos),
                          tuple(parts), source_maps)
        # (documents, tokens after the masks, tokens the attention mask removed, documents
        # empty as read) of this pack's side
        mine = (windows.docs - total.docs_other_split, int(bases[-1]),
                total.tokens_attention_masked, sum(i.docs_empty_read for i in pinfos))
        if cfg.holdout_part is not None:  # the training pack: before either output is written
            empty, packed = (sum(x) for x in zip((0, 0), *(i.other_packed for i in pinfos)))
            theirs = (total.docs_other_split, packed, total.tokens_other_split - packed, empty)
            _refuse_empty_side(cfg, mine, theirs)
            if not mine[1]:  # neither side has a token: the whole input is said so
                mine = tuple(a + b for a, b in zip(mine, theirs))
        require_tokens(files, mine[0], mine[1], cfg.column, masked=mine[2], empty_read=mine[3])
        infos: list[WindowInfo] = []
        sizes = windows.sizes()
        out.phase = "plan"
        with _progress_mod.phase("plan", int(bases[-1]), windows.docs, show) as bar:
            for info in engine.map(plan_window, [(cfg, windows, w, index, tmp)
                                                 for w in range(windows.count)]):
                infos.append(info)
                share = int(bases[-1]) * int(sizes[info.index]) // max(windows.docs, 1)
                bar.advance(int(sizes[info.index]), share)
        for info in infos:
            total = total + info.stats
        log.info("read %d parts, planned %d windows, %d rows", len(pinfos), len(infos),
                 total.rows)
        labels = merge_windows([i.rows for i in infos], seed=cfg.seed, shuffle=cfg.shuffle)
        sources = ShardSources(tuple(i.directory for i in infos),
                               tuple(i.row_spill for i in infos),
                               tuple(i.targets for i in infos), index.dirs, index.token_bases,
                               index.targets, cfg.capacity, cfg.segment_multiple,
                               cfg.source_column is not None)
        jobs = _shard_jobs(labels, len(infos), cfg.rows_per_shard, out, paths)
        # the rows are known: the shards' bound with them, against what is free now
        _, shards = disk_peak(cfg, mine[1], mine[0], windows.count, rows=int(labels.size),
                              flags=flags)
        asked = out.bytes_needed  # before reading: what a rerun's own first check asks
        out.check_space(max(0, shards - c_row * out.kept_rows), scratch, scratch_written=True)
        if out.space_note and not space_note:  # the exact rows can tip it
            space_note = out.space_note
            log.warning(space_note)
        out.begin_write()
        # a full disk while writing asks for the shards' bound left, never less than a rerun's
        # first check will want (it counts rows as full)
        out.bytes_needed = max(out.bytes_needed, asked)
        per_row = c_row  # what a rerun's check takes off for a kept row
        out.row_bytes = per_row  # a full disk's advice: how much the shards compress
        outputs, reused, targets = [], 0, 0
        with _progress(len(jobs), "write", "shard", show) as bar:
            for entry, was_reused, shard_targets in engine.map(
                    write_shard_task, [(cfg, j, sources) for j in jobs]):
                outputs.append(entry)
                out.shard_written(entry)
                reused += was_reused
                targets += shard_targets
                if not was_reused:  # kept shards were not counted
                    out.bytes_needed = max(0, out.bytes_needed - per_row * entry.rows)
                bar.update(1)
    if sources.any_targets:  # input label masks: what the rows hold, counted while writing
        total = dataclasses.replace(total, effective_targets=targets)
    out.phase = "manifest"
    test_pause("manifest")
    labels_mode = cfg.labels.value
    windowed = cfg.window_docs is not None
    manifest = Manifest(
        format_version=FORMAT_VERSION, packtool_version=__version__, fingerprint=fp,
        capacity=cfg.capacity,
        labels=LabelsInfo(labels_mode != "none", labels_convention(labels_mode)),
        options={k: v for k, v in cfg.layout_options().items() if k != "labels"},
        inputs=tuple(InputEntry(cfg.inputs_name or display(f.path), r, f.bytes)
                     for f, r in zip(files, file_rows(parts, len(files)))),
        shards=tuple(outputs), totals=total,
        windows=tuple(_window_record(w, i) for w, i in enumerate(infos)) if windowed else (),
        windowing=Windowing(windows.count, windows.block) if windowed else None,
        source_column=cfg.source_column, source_values=source_values, tokenized=tokenized,
        holdout_pair=pairing)
    out.commit(manifest, packed_schema(cfg.capacity, labels_mode, cfg.segment_multiple,
                                       sources=cfg.source_column is not None))
    notes = _warnings(cfg, total, tokenized) + ([space_note] if space_note else [])
    replaced = out.replaced_note()
    if replaced:
        notes.insert(0, replaced)
    stale = dropped_holdout(out.previous, out.path, pairing)
    if stale:
        notes.insert(0, stale)
    return PackResult(total, manifest, time.perf_counter() - t0, reused, False,
                      notes, windows_reused=sum(i.reused for i in infos),
                      parts_reused=sum(i.reused for i in pinfos),
                      docs_reused=sum(i.docs if i.reused else i.resumed_docs for i in pinfos),
                      said=(space_note,) if space_note else ())
