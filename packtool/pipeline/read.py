"""Read: cut the input into read parts and spill each part's documents, validated, to a file.

**Pieces and parts.** Input files are taken in the sorted order that defines the global document
index. Each file is cut, at row-group boundaries (Arrow IPC: record batches), into *pieces* of
at most a part's budget of stored input (a row group larger than :data:`READ_PART_BYTES` is
cut into equal row ranges); consecutive pieces, of one file or several small ones, form a *read part* within the
budget (and :data:`MAX_PART_PIECES` pieces). The budget is the input's size over
:data:`TARGET_PARTS`, at least :data:`MIN_PART_BYTES` and at most :data:`READ_PART_BYTES`
(64 MB), so a small corpus is still read by several tasks at once. The cut depends only on the
footers, never on the engine or the number of workers.

**A read part** is one engine task (:func:`read_part`): it streams its pieces' documents
through :func:`iter_documents`, the one read path of ``pack`` and ``compare`` (the columns read
and checked by :func:`packtool.formats.reader.iter_token_batches`, then masks, the ``--holdout``
split and BOS/EOS applied by :func:`packtool.core.masks.prepare_documents`), appends their
tokens, document starts, target flags and ``--source-column`` ids to the part's spill files
(:mod:`packtool.pipeline.spill`) and publishes the part when all its pieces are read.

**Progress is kept piece by piece**: after each piece of a part of several pieces the spill
files are flushed and ``progress.json`` records how far they are valid. A run killed (or
stopped by Ctrl-C) in the middle of a part leaves that work directory in the scratch directory;
the rerun's task claims it (:func:`packtool.output.claim_partial`: one rename, so two attempts
never share it), cuts the files back to the recorded sizes and goes on with the next piece. So
no more than one piece per running task (at most :data:`READ_PART_BYTES` of input, and never
more than one input file) is read again. With the scratch in an object store a part is the unit
(its work directory is on the task's own disk: :attr:`packtool.location.Location.stages_found_again`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from packtool.core.masks import TokenBatch, prepare_documents
from packtool.errors import InputError, PackingError, SchemaError, raise_if_shortage, row_ref
from packtool.formats.reader import (InputFile, check_token_columns_agree, iter_token_batches,
                                     open_input, reads_labels)
from packtool.location import Location, shared_storage_fix, task_node
from packtool.output import (PARTIAL_PROGRESS, READ_DIR_PREFIX, WINDOW_DONE,
                             check_scratch_seen, claim_partial, keeps_stages, publish_window,
                             window_done, window_file, window_workdir)
from packtool.pipeline import progress
from packtool.pipeline.spill import DOC_SOURCES, STARTS, TARGETS, TOKENS, spill_writer
from packtool.signals import check, test_pause
from packtool.stats import PackStats
from packtool.types import LabelMode, Overflow

__all__ = ["ReadPiece", "ReadPart", "PartInfo", "READ_PART_BYTES", "MAX_PART_PIECES",
           "TARGET_PARTS", "MIN_PART_BYTES", "PARTIAL", "plan_reads", "read_part", "part_dir",
           "file_rows", "input_labels_config", "iter_documents", "require_tokens",
           "check_overflow"]

#: Stored input bytes of a read part at most (and of a piece: a larger row group is cut).
READ_PART_BYTES = 64 << 20
#: A corpus is cut into about this many read parts at least (parallel reading of a small
#: corpus), each of :data:`MIN_PART_BYTES` at least.
TARGET_PARTS = 16
MIN_PART_BYTES = 64 << 10
#: Pieces of one read part at most (many small files).
MAX_PART_PIECES = 256
#: The progress record of a read part's work directory (pieces done, valid file sizes).
PARTIAL = PARTIAL_PROGRESS


@dataclass(frozen=True)
class ReadPiece:
    """Rows ``first_row .. first_row + docs - 1`` of one input file: the unit of progress."""

    file: int  #: index of the file in the input list
    path: str  #: the input file (path or URI)
    format: str  #: ``parquet`` or ``arrow``
    first_row: int  #: row index in the file of the piece's first document
    docs: int  #: documents (rows)
    first_doc: int  #: global index of its first document
    bytes: int  #: stored input bytes (from the footer)
    tokens: int  #: token values per the footer (an estimate before masks and EOS)
    file_bytes: int = -1  #: the file's size when discovered (-1: not known)
    mtime_ns: int = 0  #: its modification time then (0: not known)


@dataclass(frozen=True)
class ReadPart:
    """Consecutive pieces read by one task into one set of spill files."""

    index: int  #: part number, from 0, in input order
    pieces: tuple[ReadPiece, ...]

    @property
    def first_doc(self) -> int:
        return self.pieces[0].first_doc if self.pieces else 0

    @property
    def docs(self) -> int:
        return sum(p.docs for p in self.pieces)

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.pieces)


@dataclass(frozen=True)
class PartInfo:
    """What :func:`read_part` returns (small: it crosses processes)."""

    index: int  #: part number
    directory: str  #: where its spill files are
    docs: int  #: documents read
    tokens: int  #: tokens spilled (after masks and BOS/EOS)
    targets: bool  #: input target flags were spilled (a labels column)
    counts: PackStats  #: the mask and BOS/EOS counts of its documents
    reused: bool = False  #: found finished in the scratch directory, not read again
    resumed_docs: int = 0  #: documents a killed run had read into its work directory
    #: ``--source-column``: the part's own id -> value table (in order of first appearance;
    #: each document's id in :data:`~packtool.pipeline.spill.DOC_SOURCES`), else empty
    sources: tuple = ()
    #: documents of this side that held no token as read (the others read empty lost their
    #: tokens to the attention mask)
    docs_empty_read: int = 0
    #: the other side of a ``--holdout`` split: (documents empty as read, tokens left after
    #: the attention mask), what tells whether that side has a token to pack
    other_packed: tuple = (0, 0)


def _row_group_bytes(f: InputFile, md) -> list[int]:
    """Stored bytes of each row group (all columns; Arrow IPC: the file size spread by rows)."""
    n = md.num_row_groups
    if f.format == "parquet" and hasattr(md, "schema"):
        sizes = []
        for g in range(n):
            rg = md.row_group(g)
            sizes.append(sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)))
        return sizes
    rows = [md.row_group(g).num_rows for g in range(n)]
    total = max(sum(rows), 1)
    return [f.bytes * r // total for r in rows]


def _row_group_tokens(f: InputFile, md, column: str) -> list[int]:
    """Token values of each row group: the Parquet footer's value count of the token column,
    else an estimate from the stored bytes."""
    n = md.num_row_groups
    if f.format == "parquet" and hasattr(md, "schema"):
        leaf = [i for i in range(md.num_columns)
                if md.schema.column(i).path.split(".")[0] == column]
        if leaf:
            return [md.row_group(g).column(leaf[0]).num_values for g in range(n)]
    return [b // 2 for b in _row_group_bytes(f, md)]


def _file_pieces(i: int, f: InputFile, column: str, first_doc: int,
                 part_bytes: int) -> list[ReadPiece]:
    md = open_input(f.path, column, f.format).metadata
    rows = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    sizes = _row_group_bytes(f, md)
    toks = _row_group_tokens(f, md, column)
    pieces: list[ReadPiece] = []
    row = 0
    acc = [0, 0, 0]  # rows, bytes, tokens of the piece being formed

    def flush():
        if acc[0]:
            pieces.append(ReadPiece(i, str(f.path), f.format, row - acc[0], acc[0],
                                    first_doc + row - acc[0], acc[1], acc[2], f.bytes,
                                    f.mtime_ns))
        acc[:] = [0, 0, 0]

    for n, b, t in zip(rows, sizes, toks):
        if acc[0] and acc[1] + b > part_bytes:
            flush()
        if b > READ_PART_BYTES and n > 1:
            # a row group over the most a part may hold: equal row ranges (each piece decodes
            # the rows of the group before its own, so smaller budgets never cut a group)
            k = min(n, -(-b // READ_PART_BYTES))
            cuts = [n * j // k for j in range(k + 1)]
            for a, z in zip(cuts, cuts[1:]):
                row += z - a
                acc[:] = [z - a, b * (z - a) // n, t * (z - a) // n]
                flush()
            continue
        row += n
        acc[0] += n
        acc[1] += b
        acc[2] += t
    flush()
    return pieces


def plan_reads(files: list[InputFile], column: str,
               part_bytes: int | None = None) -> list[ReadPart]:
    """Cut the input into read parts (module docstring). Reads only the footers (and checks
    the token column of every file).

    Args:
        files: input files in global document order (from ``discover_inputs``).
        column: token column name.
        part_bytes: stored input bytes of a part at most (>= 1); None: the input's bytes over
            :data:`TARGET_PARTS`, within :data:`MIN_PART_BYTES` .. :data:`READ_PART_BYTES`
            (a function of the input alone, so a rerun cuts the same parts).

    Returns:
        Parts in order (none when the input has no rows);
        ``parts[i].first_doc + parts[i].docs == parts[i+1].first_doc``.

    Raises:
        InputError, SchemaError: a file is not readable or lacks the token column.
    """
    if part_bytes is None:
        total = sum(f.bytes for f in files)
        part_bytes = min(READ_PART_BYTES, max(MIN_PART_BYTES, total // TARGET_PARTS))
    pieces: list[ReadPiece] = []
    first = 0
    for i, f in enumerate(files):
        try:
            got = _file_pieces(i, f, column, first, max(1, part_bytes))
        except SchemaError:
            # a file without the column: when the files name it differently, say so of them
            # all (the --column its own message suggests would fail on the others)
            check_token_columns_agree(files, column)
            raise
        pieces += got
        first += sum(p.docs for p in got)
    parts: list[ReadPart] = []
    run: list[ReadPiece] = []
    for p in pieces:
        if run and (sum(q.bytes for q in run) + p.bytes > part_bytes
                    or len(run) >= MAX_PART_PIECES):
            parts.append(ReadPart(len(parts), tuple(run)))
            run = []
        run.append(p)
    if run:
        parts.append(ReadPart(len(parts), tuple(run)))
    return parts


def require_tokens(files: list[InputFile], docs: int, tokens: int, column: str, *,
                   masked: int = 0, empty_read: int = 0) -> None:
    """Refuse an input with nothing to pack (``pack`` after reading it, ``compare`` likewise).

    Args:
        files: the input files read.
        docs: documents read (empty ones included).
        tokens: tokens read (after masks and BOS/EOS).
        column: the token column.
        masked: tokens the attention mask removed (``tokens_attention_masked``).
        empty_read: documents that held no token as read (before the attention mask): the
            others lost every token to the mask.

    Raises:
        InputError: ``tokens`` is 0: no documents, or only empty ones, or only documents
            whose tokens the attention mask removed (said as such: "masked", not "empty"),
            the file, or the number of files, named.
    """
    if tokens:
        return
    where = files[0].path if len(files) == 1 else f"{len(files)} input files"
    fix = "check the INPUT and --column"
    if not docs:
        what = "no documents (empty shards)"
    elif not masked:
        what = f"all {docs:,} documents in column {column!r} are empty"
    else:
        what = f"all {docs:,} documents in column {column!r} are masked" + (
            f" (their {masked:,} tokens all have attention mask 0)" if not empty_read else
            f" or empty ({empty_read:,} empty; the {masked:,} tokens of the other "
            f"{docs - empty_read:,} all have attention mask 0)")
        fix = "check the attention mask in the INPUT and --attention-mask-column"
    raise InputError(f"{where}: no tokens to pack: {what}; {fix}")


def file_rows(parts: list[ReadPart], n_files: int) -> list[int]:
    """Documents read from each input file (int per file, in file order)."""
    out = [0] * n_files
    for part in parts:
        for p in part.pieces:
            out[p.file] += p.docs
    return out


def iter_documents(path, column: str, *, fmt: str | None = None,
                   row_range: tuple[int, int] | None = None, batch_rows: int = 8192,
                   attention_mask: str | None = None, labels: str | None = None,
                   loss_mask: str | None = None, bos: int | None = None,
                   eos: int | None = None, source: str | None = None,
                   keep_docs: Callable[[int, int], np.ndarray] | None = None,
                   measure_other: bool = False) -> Iterator[TokenBatch]:
    """One file's documents as they are packed: the one read path of ``pack`` and ``compare``.

    The file's columns are read and checked by
    :func:`packtool.formats.reader.iter_token_batches`, then the masks and BOS/EOS are applied
    by :func:`packtool.core.masks.prepare_documents`, batch by batch.

    Args:
        path: the file (local path or URI); fmt: its format (None: from the name).
        column: token column; row_range: ``(start, stop)`` file rows, or None for all.
        attention_mask, labels, loss_mask: mask columns (a name, ``"auto"`` or None).
        bos, eos: ``--prepend-bos`` / ``--append-eos`` ids or None.
        source: ``--source-column``: each batch carries its documents' values
            (:attr:`TokenBatch.sources`), or None.
        keep_docs: ``keep_docs(first_row, n)`` -> bool[n] for file rows ``first_row ..
            first_row + n - 1`` (``--holdout``): a row it marks False is read and checked like
            the others but left out whole before the masks and BOS/EOS apply (length 0,
            counted in ``TokenBatch.other_split``); None keeps every document.
        measure_other: each batch also gives the longest document left out, as its own side
            would pack it (``TokenBatch.other_longest``).

    Raises:
        InputError, SchemaError: as :func:`~packtool.formats.reader.iter_token_batches`.
    """
    for raw in iter_token_batches(path, column, batch_rows, row_range=row_range, fmt=fmt,
                                  attention_mask=attention_mask, labels=labels,
                                  loss_mask=loss_mask, source=source):
        kept = None if keep_docs is None else keep_docs(raw.first_row, raw.lengths.size)
        batch = prepare_documents(raw.first_row, raw.lengths, raw.tokens, keep=raw.keep,
                                  labels=raw.labels, loss_masks=raw.loss_masks, bos=bos, eos=eos,
                                  keep_docs=kept, measure_other=measure_other)
        yield batch if raw.sources is None else dataclasses.replace(batch, sources=raw.sources)


def part_dir(tmp: str | os.PathLike, index: int) -> str:
    """Directory of read part ``index``'s spill files inside the scratch directory ``tmp``."""
    return window_file(str(tmp), f"{READ_DIR_PREFIX}{index:05d}")


def _info(part: ReadPart, final: str, done: dict, reused: bool, resumed: int = 0) -> PartInfo:
    counts = PackStats.from_dict(done["counts"])
    return PartInfo(part.index, final, int(done["docs"]), int(done["tokens"]),
                    bool(done["targets"]), counts, reused, resumed,
                    tuple(done.get("sources") or ()), int(done.get("empty_read", 0)),
                    # a record without them: the other side's tokens as read
                    tuple(done.get("other_packed") or (0, counts.tokens_other_split)))


def _fresh_state() -> dict:
    return {"pieces": 0, "docs": 0, "tokens": 0, "targets": False,
            "counts": PackStats().to_dict(), "sources": [], "empty_read": 0,
            "other_packed": [0, 0]}


def _resume_state(work: Path, with_sources: bool) -> dict:
    """The progress of a claimed work directory, its files cut back to the recorded sizes
    (an empty state when there is none or the files are shorter than recorded)."""
    fresh = _fresh_state()
    try:
        state = json.loads((work / PARTIAL).read_text())
        sizes = {TOKENS: 4 * state["tokens"], STARTS: 8 * (state["docs"] + 1),
                 TARGETS: state["tokens"] if state["targets"] else 0,
                 DOC_SOURCES: 4 * state["docs"] if with_sources else 0}
        if with_sources and not isinstance(state.get("sources"), list):
            raise ValueError("no source table in the progress record")
        for name, size in sizes.items():
            p = work / name
            if size and p.stat().st_size < size:
                raise ValueError(f"{p} is shorter than its progress record")
        for name, size in sizes.items():
            if (work / name).exists():
                os.truncate(work / name, size)
        state.setdefault("sources", [])
        state.setdefault("empty_read", 0)
        state.setdefault("other_packed", [0, state["counts"].get("tokens_other_split", 0)])
        return state
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise_if_shortage(exc, str(work))  # the progress is fine: keep it for the rerun
        for p in work.iterdir():
            p.unlink()
        return fresh


def read_part(cfg, part: ReadPart, tmp: str) -> PartInfo:
    """Read, validate and spill one read part into ``part_dir(tmp, part.index)``.

    A part finished in ``tmp`` (kept from an identical run that was killed) is not read again;
    a part a killed run had begun goes on from its last finished piece (module docstring).

    Args:
        cfg: :class:`packtool.config.PackConfig` (column, masks, BOS/EOS, the ``--holdout``
            split, ``--source-column``).
        part: from :func:`plan_reads`.
        tmp: the scratch directory of OUTPUT (a path, or a prefix in an object store).

    Returns:
        :class:`PartInfo` (counts only, and the part's source table).

    Raises:
        InputError, SchemaError: bad input (file and row named); a file holding another number
            of rows than its footer said when the parts were cut.
        OutputError: on a node of a joined Ray cluster, ``tmp`` is not the scratch the
            driver made (:func:`packtool.output.check_scratch_seen`).
        OSError: a spill file cannot be written (e.g. a full disk).
        KeyboardInterrupt: the run was told to stop (:func:`packtool.signals.check`).
    """
    check_scratch_seen(tmp)  # a node of a joined cluster with OUTPUT on a disk of its own
    final = part_dir(tmp, part.index)
    done = window_done(final)
    if done is not None:  # finished by an identical run that was killed
        return _info(part, final, done, True)
    name = Location.parse(final).name  # read-NNNNN (a store URI's query is no part of it)
    work = claim_partial(str(tmp), name, PARTIAL)
    resumed = work is not None
    if work is None:
        work = window_workdir(str(tmp), name)
    with_sources = cfg.source_column is not None
    split = cfg.holdout_split()
    # --overflow error: a too-long document of the other side is refused here, before this
    # side's output is written (its own pack would find it only after this one is finished)
    measure_other = split is not None and cfg.overflow == Overflow.ERROR
    keep = False
    try:
        state = _resume_state(work, with_sources) if resumed else _fresh_state()
        resumed_docs = state["docs"]
        if state["pieces"]:
            progress.advance(state["docs"], state["tokens"])
        counts = PackStats.from_dict(state["counts"])
        docs, tokens, flags = state["docs"], state["tokens"], state["targets"]
        empty_read, other_packed = state["empty_read"], list(state["other_packed"])
        table = {v: i for i, v in enumerate(state["sources"])}  # value -> id, first seen first
        with spill_writer(work / TOKENS, append=True) as tok_f, \
                spill_writer(work / STARTS, append=True) as start_f:
            if not docs:
                start_f.write(memoryview(np.zeros(1, dtype=np.int64)))
            tgt_f = open(work / TARGETS, "ab") if flags else None
            src_f = open(work / DOC_SOURCES, "ab") if with_sources else None
            try:
                for k in range(state["pieces"], len(part.pieces)):
                    piece = part.pieces[k]
                    if task_node() is not None and Location.parse(piece.path).is_local:
                        _check_unchanged(piece)  # a node that does not see the file: at once
                    test_pause("read-piece", k)
                    keep_docs = None
                    if split is not None:  # file row -> global document index
                        def keep_docs(row, count, base=piece.first_doc - piece.first_row):
                            return split.keep(base + row, count)
                    n = 0
                    for batch in iter_documents(
                            piece.path, cfg.column, fmt=piece.format,
                            row_range=(piece.first_row, piece.first_row + piece.docs),
                            keep_docs=keep_docs, measure_other=measure_other,
                            **cfg.read_options()):
                        check()
                        if batch.other_longest[1] > cfg.capacity:
                            _refuse_other_side(cfg.capacity, piece, batch,
                                               added_by(cfg.prepend_bos, cfg.append_eos))
                        # the buffer itself, no bytes copy
                        tok_f.write(memoryview(np.ascontiguousarray(batch.tokens,
                                                                    dtype=np.int32)))
                        ends = np.cumsum(batch.lengths, dtype=np.int64)
                        start_f.write(memoryview(ends + tokens))
                        if batch.targets is not None and tgt_f is None:
                            tgt_f = open(work / TARGETS, "ab")
                            flags = True
                            if tokens:  # earlier tokens: all targets
                                tgt_f.write(memoryview(np.ones(tokens, np.uint8)))
                        if tgt_f is not None:
                            t = (batch.targets if batch.targets is not None
                                 else np.ones(batch.tokens.size, np.uint8))
                            tgt_f.write(memoryview(np.ascontiguousarray(t, dtype=np.uint8)))
                        if src_f is not None:
                            src_f.write(memoryview(_source_ids(batch.sources, table)))
                        tokens += int(batch.tokens.size)
                        n += int(batch.lengths.size)
                        counts = counts + PackStats(**batch.mask_counts())
                        empty_read += batch.docs_empty_read
                        other_packed = [a + b for a, b in zip(other_packed, batch.other_packed)]
                        progress.advance(int(batch.lengths.size), int(batch.tokens.size))
                        test_pause("read", part.index)
                    if n != piece.docs:
                        raise InputError(
                            f"{piece.path}: {n} rows read from row {piece.first_row}, "
                            f"{piece.docs} expected; the file changed during the pack: rerun "
                            "the same packtool pack with --overwrite")
                    _check_unchanged(piece)
                    docs += n
                    if k + 1 < len(part.pieces):  # a record to resume from
                        for f in (tok_f, start_f, tgt_f, src_f):
                            if f is not None:
                                f.flush()
                        _write_progress(work, {"pieces": k + 1, "docs": docs, "tokens": tokens,
                                               "targets": flags, "counts": counts.to_dict(),
                                               "sources": list(table),
                                               "empty_read": empty_read,
                                               "other_packed": other_packed})
            finally:
                for f in (tgt_f, src_f):
                    if f is not None:
                        f.close()
        result = {"docs": docs, "tokens": tokens, "targets": flags, "counts": counts.to_dict(),
                  "sources": list(table), "empty_read": empty_read,
                  "other_packed": other_packed}
        (work / PARTIAL).unlink(missing_ok=True)
        (work / WINDOW_DONE).write_text(json.dumps(result))
        publish_window(work, final)
    except KeyboardInterrupt:
        # stopped: a work directory with a progress record stays for the rerun (where a rerun
        # finds it again)
        keep = keeps_stages(tmp) and (work / PARTIAL).is_file()
        raise
    finally:
        if not keep and work.exists() and not (work / WINDOW_DONE).is_file():
            shutil.rmtree(work, ignore_errors=True)
    return _info(part, final, result, False, resumed_docs)


def added_by(bos, eos) -> str:
    """The options that lengthen a document (``--prepend-bos``, ``--append-eos``), in words,
    for the overflow messages; empty when neither is given."""
    return " and ".join(o for o, v in (("--prepend-bos", bos), ("--append-eos", eos))
                        if v is not None)


def check_overflow(capacity: int, lengths: np.ndarray, docs: np.ndarray, locate,
                   added: str = "") -> None:
    """Refuse the first document longer than ``capacity`` (``--overflow error``; ``pack`` per
    window, ``compare`` in the same order), naming its file and row.

    Args:
        capacity: tokens per row (C).
        lengths: int[n], document lengths in tokens, in the order they are planned.
        docs: int[n], their global document numbers.
        locate: ``locate(doc) -> (path, row)``: the input file of global document ``doc`` and
            its 0-based row there.
        added: :func:`added_by`: the options whose tokens the lengths count (named, since the
            input row itself holds fewer).

    Raises:
        PackingError: a document over ``capacity`` (file, row, document, length and fix named).
    """
    if lengths.size and lengths.max() > capacity:
        bad = int(np.argmax(lengths > capacity))
        doc = int(docs[bad])
        path, row = locate(doc)
        counted = (f" (counting what {added} add{'' if ' and ' in added else 's'})"
                   if added else "")
        raise PackingError(f"{path}: {row_ref(row)}: document {doc} has "
                           f"{int(lengths[bad])} tokens{counted}, longer than --capacity "
                           f"{capacity}; use --overflow split|truncate|drop or a larger "
                           "--capacity")


def _refuse_other_side(capacity: int, piece: "ReadPiece", batch: TokenBatch,
                       added: str = "") -> None:
    """``--overflow error`` with ``--holdout``: refuse the longest document of the other side
    of the split found in ``batch``, in the words of the plan's refusal.

    Raises:
        PackingError: file, row, document, length and fix named.
    """
    row = batch.first_row + batch.other_longest[0]
    doc = piece.first_doc - piece.first_row + row
    check_overflow(capacity, np.array([batch.other_longest[1]]), np.array([doc]),
                   lambda _: (piece.path, row), added)


def _check_unchanged(piece: ReadPiece) -> None:
    """Refuse a piece whose file is no longer the one discovered (another size or modification
    time): a file replaced during the pack by one of as many rows or more was read in part, its
    rows counted right, under the old file's fingerprint.

    In a task on a node of a joined Ray cluster (:func:`packtool.location.task_node`), a local
    file not found, or another one found, is said to be as that node sees it: INPUT may be on a
    disk the driver's node does not share with it (:func:`read_part` checks that before reading
    each piece there, one stat).

    Raises:
        InputError: names the file and the fix.
    """
    from packtool.location import Location, display

    if piece.file_bytes < 0:
        return
    loc = Location.parse(piece.path)
    now = loc.entry()
    if now is None or now.size != piece.file_bytes or (
            piece.mtime_ns and now.mtime_ns and now.mtime_ns != piece.mtime_ns):
        node = task_node() if loc.is_local else None
        if node is not None:  # a node of a joined cluster: maybe not the driver's disk
            seen, since = (("not found", "deleted or moved") if now is None else
                           (f"another file found ({now.size:,} bytes, {piece.file_bytes:,} "
                            "listed, or another modification time)", "changed"))
            raise InputError(f"{display(piece.path)}: {seen} by the Ray worker on node {node}, "
                             f"though the driver listed it: {shared_storage_fix('INPUT')}; "
                             f"else it was {since} since INPUT was listed: rerun then")
        raise InputError(f"{display(piece.path)}: the file changed during the "
                         f"pack (size {piece.file_bytes:,} -> "
                         f"{'gone' if now is None else f'{now.size:,}'} bytes, or its "
                         "modification time); rerun the same packtool pack when no one writes "
                         "INPUT")


def _source_ids(values: np.ndarray | None, table: dict) -> np.ndarray:
    """int32[docs]: each document's id in the part's ``table`` (value -> id), new values added
    in order of first appearance; -1 for a document without one (None: a null source of a
    document that is not packed, :func:`packtool.formats.reader.iter_token_batches`), which no
    segment refers to."""
    if values is None or not len(values):
        return np.zeros(0, dtype=np.int32)
    if values.dtype == object:
        absent = np.equal(values, None)
        if absent.any():
            ids = np.full(values.size, -1, dtype=np.int32)
            ids[~absent] = _source_ids(np.asarray(values[~absent].tolist()), table)
            return ids
    uniq, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    ids = np.empty(uniq.size, dtype=np.int32)
    for u in np.argsort(first, kind="stable").tolist():  # in order of first appearance
        v = uniq[u]
        ids[u] = table.setdefault(v.item() if hasattr(v, "item") else v, len(table))
    return np.ascontiguousarray(ids[inverse.reshape(-1)])


def _write_progress(work: Path, state: dict) -> None:
    tmp = work / f".{PARTIAL}.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, work / PARTIAL)


def input_labels_config(cfg, files: list[InputFile]):
    """The config a pack runs with: when a labels column or a loss mask will be read (SFT
    prompt masking), the labels carry real information and are stored, so ``--labels none``
    becomes ``unshifted`` (the shards' schema and the manifest say so), and the rows per row
    group derived from ``--row-group-mb`` count the labels column too.

    Raises:
        InputError, SchemaError: as :func:`packtool.formats.reader.reads_labels`.
    """
    from packtool.config import rows_per_group_for

    if cfg.labels is LabelMode.NONE and reads_labels(files, cfg.column, cfg.labels_column,
                                                     cfg.loss_mask_column):
        derived = cfg.rows_per_group == rows_per_group_for(cfg.row_group_mb, cfg.capacity, 3)
        cfg = dataclasses.replace(cfg, labels=LabelMode.UNSHIFTED,
                                  rows_per_group=None if derived else cfg.rows_per_group)
    return cfg
