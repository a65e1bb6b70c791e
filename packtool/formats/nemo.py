"""``packtool export --to nemo``: packed rows in the packed Parquet layout NeMo and Megatron-Bridge
train from (``GPTSFTPackedParquetDataset``, a subclass of ``GPTSFTPackedDataset`` that reads
Parquet row groups lazily).

What their reader and collate function do with a row (read from their source, not imported):

- a row holds ``input_ids`` (``list<int32>``, the packed sequences back to back, no padding),
  ``loss_mask`` (``list<int8>``, one entry per token) and ``seq_start_id`` (``list<int32>``, the
  offset of each sequence's first token, starting at 0); the sequences end where the next one
  starts, the last at ``len(input_ids)``;
- for a sequence ``[s, e)`` the model is fed ``input_ids[s:e-1]`` at positions ``0..e-s-2``
  and trained to predict ``input_ids[s+1:e]``, where ``loss_mask[s:e-1]`` is 1 (their packer
  stores the mask already rolled by one: entry ``i`` says whether the token at ``i + 1`` is a
  target, and the last entry of every sequence is 0); ``cu_seqlens`` counts ``e - s - 1`` per
  sequence; the batch is padded after the last sequence;
- their writer puts 500 rows in a row group, the reader decodes one row group per random row,
  and their default file names are ``training_{size}.idx.parquet`` and
  ``validation_{size}.idx.parquet`` beside ``{size}_metadata.jsonl`` (a JSON list, one dict
  per split, read for ``pad_cu_seqlens``).

So a packtool row maps exactly: each segment of length L is one sequence (L - 1 inputs and L - 1
predictions in both, the same effective targets), the padding tail is dropped, and
``loss_mask[i]`` is 1 where packtool's shifted label at ``i`` is not -100 (the next token is in
the same segment and was not an input label -100). No target crosses a document, and SFT prompt
masks survive. A one-token segment (the last piece of a split document, say) is left out: it
would be a zero-length sequence to their collate function (a repeated ``cu_seqlens`` boundary,
which varlen kernels mishandle) that feeds nothing and predicts nothing, and in packtool too it
has no target; a row of nothing else is left out whole, and the export counts both. Train with ``answer_only_loss=True`` (their default): with ``False`` their
collate function recomputes the mask from the tokens (0 on every EOS input) and ignores this
column. A row of capacity C feeds at most C - k tokens (k segments) to a model of
``seq_length`` C. ``doc_ids`` and ``doc_offsets`` are stored too (their reader reads only its
three columns), so every exported sequence names its document.

Except around an EOS inside a sequence: their collate function
(``GPTSFTPackedDataset.collate_fn``) treats a fed token equal to the tokenizer's EOS id as
padding, in releases up to 0.6.0 by setting ``loss_mask`` to 0 on it (the target after it is
not trained), and with ``pad_seq_to_mult`` > 1 by ending ``cu_seqlens_q`` at a sequence's last
fed token that is not EOS. So the mapping is exact when no document holds the EOS id before its
last token, or when no such EOS precedes a target or is a sequence's next-to-last token;
:class:`_EosScan` counts them for the EOS id the export knows and :func:`eos_warnings` says so.
The padding inside the spans of a ``--segment-multiple`` output is dropped too
(:func:`export_notes`): its sequences are not padded to multiples of N.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock, Timeout

from packtool._version import __version__
from packtool.errors import (ConfigError, OutputError, PacktoolError, inodes_exhausted,
                             inodes_note, shortage_error)
from packtool.formats.manifest import output_around, output_words, stale_holdout
from packtool.location import Location, make_dirs, remove_made
from packtool.signals import check, hold, interruptible, test_pause
from packtool.types import IGNORE_INDEX
from packtool.stats import plural

__all__ = ["NEMO_ROWS_PER_GROUP", "NEMO_SPLITS", "nemo_schema", "nemo_file_name",
           "to_nemo_batch", "export_nemo", "export_warnings", "export_notes", "eos_warnings",
           "output_eos", "recorded_eos",
           "NemoExport", "EXPORT_KEY", "EXPORT_LOCK_NAME"]

#: What an export's "packed again since it was opened" line (the output re-packed while it was
#: read; :meth:`~packtool.formats.packed.PackedOutput.open`'s ``reopen``) tells to do.
REOPEN_FIX = "rerun the same packtool export"
#: Rows per Parquet row group, as NeMo / Megatron-Bridge's packed Parquet writer sets it.
NEMO_ROWS_PER_GROUP = 500
#: The split names of their default file names.
NEMO_SPLITS = ("training", "validation")
_COLUMNS = ["input_ids", "segment_ids", "labels", "cu_seqlens", "doc_ids", "doc_offsets"]
#: What an export with ``--no-hash`` still checks of the shards it reads: their sizes and
#: footers, and the page checksums of the columns it decodes (``labels`` when stored); a
#: changed page of any other column goes unseen (``--no-hash``'s help says so).
HASHLESS_CHECKED = tuple(_COLUMNS)


def nemo_schema() -> pa.Schema:
    """``input_ids`` list<int32>, ``loss_mask`` list<int8>, ``seq_start_id`` list<int32> (what
    their reader requires), ``doc_ids`` / ``doc_offsets`` list<int64> (provenance); none
    nullable."""
    def lst(t):
        return pa.list_(pa.field("element", t, nullable=False))

    return pa.schema([pa.field("input_ids", lst(pa.int32()), nullable=False),
                      pa.field("loss_mask", lst(pa.int8()), nullable=False),
                      pa.field("seq_start_id", lst(pa.int32()), nullable=False),
                      pa.field("doc_ids", lst(pa.int64()), nullable=False),
                      pa.field("doc_offsets", lst(pa.int64()), nullable=False)])


def nemo_file_name(split: str, capacity: int) -> str:
    """``training_2048.idx.parquet``: their default name for a split packed to ``capacity``."""
    return f"{split}_{capacity}.idx.parquet"


def _list(values: np.ndarray, lengths: np.ndarray, typ: pa.DataType) -> pa.Array:
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)  # shape: (rows + 1,)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                    pa.array(values, typ.value_type), type=typ)


def to_nemo_batch(cols: dict, convention: str) -> pa.RecordBatch:
    """One block of packed rows in the NeMo layout.

    Args:
        cols: ``input_ids``, ``segment_ids``, ``labels`` int[R, C] (labels stored or derived, in
            ``convention``); ``cu_seqlens``, ``doc_ids``, ``doc_offsets``: lists of R 1-D arrays.
        convention: ``unshifted`` or ``shifted``.

    Returns:
        The rows of :func:`nemo_schema`: each row's real tokens (padding dropped, also the
        padding inside the spans of a ``--segment-multiple`` output), ``loss_mask[i]`` = the
        shifted label at ``i`` is not -100, ``seq_start_id`` = where each of the k segments
        starts among the real tokens (the first k entries of ``cu_seqlens`` when padding lies
        only at the tail). One-token segments are left out: their collate function counts
        ``L - 1`` tokens a sequence, so one would be a zero-length ``cu_seqlens`` entry (a
        repeated boundary, which varlen kernels mishandle), and it feeds nothing and predicts
        nothing (no target in packtool either); a row of nothing else is left out whole, so
        fewer than R rows may come back.

    Raises:
        ValueError: an unknown convention.
    """
    ids = np.asarray(cols["input_ids"])
    seg = np.asarray(cols["segment_ids"])
    lab = np.asarray(cols["labels"])
    R, C = ids.shape
    if convention == "unshifted":  # shifted[i] = unshifted[i + 1] inside the segment
        shifted = np.full((R, C), IGNORE_INDEX, dtype=np.int64)  # shape: (R, C)
        same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] != 0)
        shifted[:, :-1] = np.where(same, lab[:, 1:], IGNORE_INDEX)
    elif convention == "shifted":
        shifted = lab
    else:
        raise ValueError(f"labels convention {convention!r}: choose unshifted or shifted")
    # real tokens: segment ids 1..k; 0 is padding, at the row's tail and, with
    # --segment-multiple, after each document inside its span
    k = np.array([len(d) for d in cols["doc_ids"]], dtype=np.int64)  # shape: (R,)
    lens = segment_lengths(seg, k)  # per row: real tokens of each segment
    kept = [x >= 2 for x in lens]  # per row: the segments stored (one-token ones left out)
    in_row = np.zeros((R, C), dtype=bool)  # shape: (R, C)
    for r in range(R):  # the tokens of the kept segments (segment id s is kept[r][s - 1])
        in_row[r] = np.concatenate([[False], kept[r]])[seg[r]]
    rows = np.array([bool(m.any()) for m in kept], dtype=bool)  # shape: (R,)
    real = np.count_nonzero(in_row, axis=1).astype(np.int64)[rows]  # shape: (rows,)
    n = np.array([int(m.sum()) for m in kept], dtype=np.int64)[rows]  # shape: (rows,)
    starts = [np.cumsum(x[m]) - x[m] for x, m in zip(lens, kept)]  # among the stored tokens

    def per_segment(values: list) -> np.ndarray:
        chosen = [np.asarray(v)[m] for v, m in zip(values, kept)]
        return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)

    schema = nemo_schema()
    arrays = [
        _list(ids[in_row].astype(np.int32), real, schema.field("input_ids").type),
        _list((shifted[in_row] != IGNORE_INDEX).astype(np.int8), real,
              schema.field("loss_mask").type),
        _list((np.concatenate(starts) if starts else np.zeros(0)).astype(np.int32), n,
              schema.field("seq_start_id").type),
        _list(per_segment(cols["doc_ids"]).astype(np.int64), n, schema.field("doc_ids").type),
        _list(per_segment(cols["doc_offsets"]).astype(np.int64), n,
              schema.field("doc_offsets").type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def segment_lengths(seg: np.ndarray, k: np.ndarray) -> list[np.ndarray]:
    """Real tokens of each of a row's ``k[r]`` segments: int64[k[r]] per row of ``seg``
    (int[R, C] segment ids 1..k, 0 on padding wherever it lies)."""
    return [np.bincount(row, minlength=n + 1)[1:n + 1].astype(np.int64)
            for row, n in zip(np.asarray(seg), np.asarray(k))]


def _packed_blocks(out_dir, check_hashes: bool = True
                   ) -> tuple[int, str, str, Iterator[dict], str, object, str]:
    """(capacity, labels convention, the output's fingerprint, blocks of NumPy columns, the
    split it holds: ``validation`` for the held-out output of ``pack --holdout``, else
    ``training``, its :class:`~packtool.formats.manifest.Manifest`, its display name) of a
    packed OUTPUT (path or URI), read through the one reader
    (:class:`packtool.formats.packed.PackedOutput`; every shard's sha256 checked first when
    ``check_hashes``, as ``stats`` and ``verify`` do), labels asked for already shifted
    (derived by its read-side rule when not stored). The reader is closed when the blocks are
    exhausted or closed."""
    from packtool.formats.packed import PackedOutput

    # packed again while read: the fix is the export's, not a loader's "open it again"
    reader = PackedOutput.open(out_dir, integrity="sha256" if check_hashes else "footer",
                               reopen=REOPEN_FIX)

    def blocks():
        try:
            for b in reader.iter_blocks(_COLUMNS, labels="shifted"):
                yield {**b.tokens, **{c: b.ragged_rows(c) for c in _COLUMNS if c in b.ragged}}
        finally:
            reader.close()

    held = reader.manifest.options.get("holdout_part") == "holdout"
    return (reader.capacity, "shifted", reader.manifest.fingerprint, blocks(),
            "validation" if held else "training", reader.manifest, reader.location.display)


def export_warnings(manifest, where: str) -> list[str]:
    """The loud lines an export of the packed output ``where`` (its ``manifest``) prints, as
    ``packtool stats`` prints them for it: an output of 0 rows exports a file of no sequence,
    said with the lines ``pack`` gave for it (what ``--overflow`` or ``--min-fill`` left out);
    rows without one effective target, the no-targets line (a loss over them divides by 0);
    a BOS/EOS id outside the recorded tokenizer's vocabulary
    (:meth:`~packtool.formats.manifest.Manifest.output_warnings`; not the padding id: the
    export writes no padding)."""
    empty = [f"{where} holds 0 rows: the export holds no sequence to train on"] \
        if manifest.num_rows == 0 else []
    return empty + manifest.output_warnings(padding=False)


def export_notes(manifest, eos_id: int | None = None) -> list[str]:
    """The lines an export prints after its summary for the packed output of ``manifest``:
    packed with ``--segment-multiple N`` (N > 1), that the padding inside each span is
    dropped, so the sequences are not multiples of N (the context-parallel layout is lost);
    then, for each EOS id the manifest records as appended to the documents (pack's
    ``--append-eos``, the ``--append-eos`` of the ``packtool tokenize`` it was packed from:
    :func:`recorded_eos`) other than ``eos_id`` (the one the export looked for; None: none),
    who appended it and how to look for it instead (``--eos-id``): only the trainer's
    tokenizer knows which one its collate treats as EOS."""
    n = int(manifest.options.get("segment_multiple", 1) or 1)
    notes = [] if n <= 1 else [
        f"packed with --segment-multiple {n}: the export drops the padding inside each "
        f"span, so its sequences keep their real lengths, not padded to multiples of "
        f"{n}: the context-parallel layout is not kept (docs/python-and-text.md)"]
    if eos_id is None:  # none recorded (else the export looks for one): nothing else to name
        return notes
    said = {"pack": "pack --append-eos appended the EOS id {} to the documents",
            "tokenize": "packtool tokenize appended the EOS id {} to the documents (the "
                        "manifest's tokenized.append_eos)"}
    for by, other in recorded_eos(manifest):
        if other != int(eos_id):
            notes.append(said[by].format(other) + ", and this export "
                         f"looked for {int(eos_id)} only: if {other} is the trainer's "
                         f"tokenizer's EOS id, rerun with --eos-id {other} (Python: "
                         f"eos_id={other}) to count the documents holding it before their last "
                         "token (docs/python-and-text.md)")
    return notes


class _EosScan:
    """Where NeMo rows hold the EOS id ``eos`` before a sequence's last token, block by block:
    the fed EOS that Megatron-Bridge's packed collate treats as padding (module docstring).
    ``eos`` None: nothing is looked for."""

    def __init__(self, eos: int | None):
        self.eos = eos
        self.docs: list[np.ndarray] = []  # per block: distinct documents with such an EOS
        self.targets = 0  # loss-mask ones on such an EOS: the target right after it
        self.cut = 0  # sequences whose last fed token is EOS
        self.first: int | None = None  # the first such document in row order

    def add(self, batch: pa.RecordBatch) -> None:
        """Scan one block of :func:`nemo_schema` rows (each row holding >= 1 sequence of >= 2
        tokens, as the export writes them)."""
        if self.eos is None or batch.num_rows == 0:
            return

        def flat(name: str) -> np.ndarray:
            return np.asarray(batch.column(name).flatten().to_numpy(zero_copy_only=False))

        ids = flat("input_ids")  # shape: (tokens,)
        lengths = np.diff(batch.column("input_ids").offsets.to_numpy()).astype(np.int64)
        k = np.diff(batch.column("seq_start_id").offsets.to_numpy()).astype(np.int64)
        row_base = np.cumsum(lengths) - lengths  # shape: (rows,)
        starts = flat("seq_start_id").astype(np.int64) + np.repeat(row_base, k)  # (seqs,)
        ends = np.append(starts[1:], ids.size)  # a row's last sequence ends where the next starts
        inner = ids == self.eos  # shape: (tokens,)
        inner[ends - 1] = False  # a sequence's last token is never fed
        if not inner.any():
            return
        seq_of = np.repeat(np.arange(starts.size), ends - starts)  # shape: (tokens,)
        held = np.zeros(starts.size, dtype=bool)  # shape: (seqs,)
        held[seq_of[inner]] = True
        docs = flat("doc_ids")[held]
        if self.first is None:
            self.first = int(docs[0])
        self.docs.append(np.unique(docs))
        self.targets += int(flat("loss_mask")[inner].astype(np.int64).sum())
        self.cut += int(np.count_nonzero(ids[ends - 2] == self.eos))

    def found(self) -> dict:
        """``eos_id``, ``documents`` (distinct), ``targets``, ``cut``, ``first_doc``."""
        docs = np.unique(np.concatenate(self.docs)).size if self.docs else 0
        return {"eos_id": self.eos, "documents": int(docs), "targets": self.targets,
                "cut": self.cut, "first_doc": self.first}


def _eos_of_file(path: Path, eos: int | None) -> dict:
    """:meth:`_EosScan.found` of an exported file (a rerun told another EOS id)."""
    scan = _EosScan(eos)
    if eos is not None:
        for batch in pq.ParquetFile(path).iter_batches(
                columns=["input_ids", "loss_mask", "seq_start_id", "doc_ids"]):
            check()
            scan.add(batch)
    return scan.found()


def eos_warnings(manifest, done: "NemoExport") -> list[str]:
    """The line an export prints when documents hold its EOS id before their last token and
    Megatron-Bridge's packed collate would train them otherwise than packtool: a target right
    after such an EOS (releases up to 0.6.0 zero ``loss_mask`` on every EOS fed) or a sequence
    whose last fed token is EOS (with ``pad_seq_to_mult`` > 1 it ends at its last fed token
    that is not EOS). Empty when neither happens (the mapping is exact) or no EOS id is
    known."""
    if not (done.eos_targets or done.eos_cut):
        return []
    said = []
    if done.eos_targets:
        said.append(f"Megatron-Bridge releases up to 0.6.0 set loss_mask 0 on every EOS their "
                    f"collate feeds, so {done.eos_targets:,} of the {done.targets:,} targets "
                    "(each the token right after such an EOS) are not trained")
    if done.eos_cut:
        said.append(f"with pad_seq_to_mult > 1 their collate ends "
                    f"{plural(done.eos_cut, 'sequence')} at the last fed token that is not EOS, "
                    "the EOS after it taken for padding")
    one = done.eos_documents == 1
    holds = plural(done.eos_documents, "document holds", "documents hold")
    return [f"{holds} the EOS id {done.eos_id} before {'its' if one else 'their'} last token "
            f"(first: {manifest.input_row(done.eos_first_doc)}): "
            + "; ".join(said) + " (docs/python-and-text.md)"]


@dataclass(frozen=True)
class NemoExport:
    """What :func:`export_nemo` wrote."""

    path: str  #: the Parquet file
    metadata: str  #: the metadata file (JSON list, one entry per split)
    rows: int  #: packed rows
    sequences: int  #: sequences (segments)
    tokens: int  #: tokens stored (real tokens of the rows)
    targets: int  #: loss_mask ones: the effective targets
    #: one-token segments not stored (a zero-length sequence to their collate; no target)
    one_token_sequences_left_out: int = 0
    #: packed rows not stored: they held one-token segments only
    rows_left_out: int = 0
    #: the file was already this export (an earlier run stopped before its metadata entry was
    #: written); only the entry was written now
    completed_entry: bool = False
    #: DEST already held this very export, file and entry (the same packed output, split, rows
    #: per group and packtool version): nothing was written, as a rerun of a finished pack
    already_complete: bool = False
    #: loud lines, as ``packtool stats`` gives them for the output (:func:`export_warnings`):
    #: 0 rows, or no effective target; and :func:`eos_warnings`
    warnings: tuple = ()
    #: lines said after the summary (:func:`export_notes`): the ``--segment-multiple`` layout
    #: not kept; an EOS id the manifest records that the export did not look for
    notes: tuple = ()
    #: the EOS id looked for (``eos_id`` of :func:`export_nemo`, else the output's own:
    #: :func:`output_eos`); None: unknown, not looked for
    eos_id: int | None = None
    #: documents holding ``eos_id`` before the last token of an exported sequence
    eos_documents: int = 0
    #: loss-mask ones on such an EOS: targets Megatron-Bridge releases up to 0.6.0 do not train
    eos_targets: int = 0
    #: sequences whose last fed token is ``eos_id`` (cut short with ``pad_seq_to_mult`` > 1)
    eos_cut: int = 0
    #: the first such document (its ``doc_ids`` entry) in row order; None when none
    eos_first_doc: int | None = None
    #: shards whose sha256 was checked against the manifest before the export (0: ``--no-hash``,
    #: ``check_hashes`` False)
    shards_hashed: int = 0


#: Key of the file's Parquet key-value metadata that records which export wrote it (the packed
#: output's fingerprint, split, rows per group, packtool version) with its counts and metadata
#: entry, so a rerun recognises its own finished file (their reader ignores it).
EXPORT_KEY = "packtool.export"
#: The lock file an export holds in DEST while it writes there (removed when it ends).
EXPORT_LOCK_NAME = ".packtool-export.lock"


def _read_metadata(path: Path) -> list:
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())
    except ValueError:
        entries = None
    if not isinstance(entries, list):
        raise OutputError(f"{path}: not a JSON list of packing metadata; move it away or "
                          "pass another DEST")
    return entries


def _update_metadata(path: Path, split: str, entry: dict) -> None:
    """Make ``entry`` the split's entry of the metadata file ``path`` (written whole: temporary
    name, then a rename)."""
    entries = [e for e in _read_metadata(path)
               if not (isinstance(e, dict) and e.get("split") == split)]
    entries.append({"split": split, **entry})
    Location.parse(path).publish_bytes((json.dumps(entries, indent=2) + "\n").encode())


def _has_entry(path: Path, split: str, entry: dict) -> bool:
    return {"split": split, **entry} in _read_metadata(path)


def _written_by(final: Path, identity: dict) -> dict | None:
    """What the export ``identity`` recorded in ``final`` when that file is its finished
    output (counts and metadata entry), else None."""
    try:
        kv = pq.read_metadata(final).metadata or {}
        record = json.loads(kv[EXPORT_KEY.encode()])
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None
    return record if isinstance(record, dict) and record.get("identity") == identity else None


def _check_dest(out_dir, dest) -> None:
    """Refuse a DEST in a store, or one that is OUTPUT, lies inside it or contains it, or is,
    lies inside or contains any other packtool output, finished or being written
    (:func:`~packtool.formats.manifest.output_around`: the files would join that output's
    dataset, and its next ``pack --overwrite`` would refuse the entries it did not write),
    before anything is written."""
    where, out = Location.parse(dest), Location.parse(out_dir)
    if not where.is_local:
        raise OutputError(f"{where.display}: DEST must be a local directory; export into one, "
                          "then copy its files to the store")
    if out.overlaps(where):
        raise OutputError(f"{where.display}: DEST overlaps the packed OUTPUT {out.display} (is "
                          "it, lies inside it or contains it); choose a directory outside it")
    around = output_around(where)  # any other packtool output, finished or being written
    if around is not None:
        how, other = around
        raise OutputError(f"{where.display}: DEST {how} the {output_words(other)} "
                          f"{other.display}: the export's files and that output's would mix in "
                          "one Parquet dataset; choose a directory outside every packtool output")


def _dest_error(dest: Path, exc: OSError, state: str) -> PacktoolError:
    """One line for a DEST that cannot be written: where, the cause, what was left, the fix;
    a machine short of open files or memory is said to be (the shortage line), not DEST."""
    short = shortage_error(exc, state=state, where=str(dest))
    if short is not None:
        return short
    cause = exc.strerror or str(exc) or type(exc).__name__
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if exc.errno == errno.ENOSPC and inodes_exhausted(dest):
        return OutputError(f"{dest}: DEST cannot be written ({inodes_note(dest, _free(dest))}); "
                           f"{state}; remove files on it that are not needed, or choose another "
                           "DEST, on a filesystem with more inodes")
    fix = "free space or choose another DEST" if full else "choose a writable DEST"
    return OutputError(f"{dest}: DEST cannot be written ({cause}); {state}; {fix}")


def _free(dest: Path) -> int:
    """Bytes free on the filesystem of ``dest`` (or the nearest folder above it); 0 when it
    cannot be asked."""
    import shutil

    for at in (dest, *dest.parents):
        try:
            return shutil.disk_usage(at).free
        except OSError:
            continue
    return 0


def _lock_dest(dest: Path) -> FileLock:
    lock = FileLock(dest / EXPORT_LOCK_NAME)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise OutputError(f"{dest}: another packtool export is writing into this DEST (lock "
                          f"{EXPORT_LOCK_NAME} is held); wait for it to end or choose another "
                          "DEST") from None
    return lock


def _unlock_dest(dest: Path, lock: FileLock) -> None:
    (dest / EXPORT_LOCK_NAME).unlink(missing_ok=True)  # still held: nobody waits on it
    lock.release()


def _remove_stale_temps(dest: Path, *names: str) -> None:
    """Remove the temporary files a killed export (SIGKILL, a lost machine) left beside
    ``names`` in DEST; the lock says no other export is writing them."""
    for name in names:
        for stale in dest.glob(f".{name}.*.tmp"):
            stale.unlink(missing_ok=True)


def export_nemo(out_dir: str | os.PathLike, dest: str | os.PathLike, *,
                split: str | None = None, overwrite: bool = False,
                rows_per_group: int = NEMO_ROWS_PER_GROUP,
                eos_id: int | None = None, check_hashes: bool = True) -> NemoExport:
    """``packtool export --to nemo OUTPUT DEST`` as a function: write the rows of a packed
    OUTPUT as ``DEST/{split}_{C}.idx.parquet`` in the NeMo / Megatron-Bridge packed layout
    (module docstring), and its entry in ``DEST/{C}_metadata.jsonl``.

    The file holds one Parquet row per packed row that keeps a sequence (:func:`nemo_schema`):
    ``input_ids`` list<int32>[n] (the row's real tokens, n <= C, padding dropped),
    ``loss_mask`` list<int8>[n] (1 where the token after it is a target of the same
    sequence), ``seq_start_id`` list<int32>[k] (each sequence's first offset in the row, from
    0), ``doc_ids`` and ``doc_offsets`` list<int64>[k] (each sequence's document and its
    offset in it, in tokens); ``rows_per_group`` rows per row group, zstd-compressed. The
    metadata file is a JSON list of one entry per split (``pack_size`` C in tokens,
    ``max_samples_per_bin``, ``dataset_max_seqlen`` and ``min_packed_seqlen`` in tokens fed,
    ``packing_factor``, ``packing_efficiency`` in percent).

    The file is written under a unique temporary name in DEST, one block of row groups in
    memory at a time (rows keep the output's order), then renamed and its metadata entry
    written, with SIGINT and SIGTERM held over those two steps. DEST is locked meanwhile (a
    second export into it is refused), and temporary files a killed export left there are
    removed first. Ctrl-C or SIGTERM (:func:`packtool.signals.interruptible`) removes the
    temporary file and leaves DEST as it was. The file records which export wrote it
    (:data:`EXPORT_KEY`), so a rerun finding this very export without its metadata entry (a
    process killed between the two steps) writes the entry and is done.

    Args:
        out_dir: a packed OUTPUT: a directory path (``str`` or ``os.PathLike``), a ``file:``
            or store URI.
        dest: the local directory to write into (created), outside ``out_dir``.
        split: ``training`` or ``validation`` (the file name); None: ``validation`` for the
            held-out output of ``pack --holdout`` (its manifest says so), else ``training``.
        overwrite: replace an existing file of that name (``True``/``False``).
        rows_per_group: rows per Parquet row group, an ``int`` >= 1 (NumPy integers taken).
        eos_id: the EOS token id of the trainer's tokenizer, an ``int`` >= 0; None: the
            output's own (:func:`output_eos`: pack's ``--append-eos``, else the
            ``--append-eos`` of the ``packtool tokenize`` it was packed from; none: nothing is
            looked for). Documents holding it before the last token of an exported sequence
            are counted (``eos_documents``, ...) and said in a warning when Megatron-Bridge's
            packed collate trains them otherwise than packtool (:func:`eos_warnings`); the file
            is written all the same. Another EOS id the manifest records (:func:`recorded_eos`)
            is named in a note, with how to look for it instead (:func:`export_notes`).
        check_hashes: check every shard's sha256 against the manifest before anything is
            written, as ``stats`` and ``verify`` do (it reads every byte; ``--no-hash``:
            False). Without it the sizes, footers and the page checksums of the columns the
            export decodes (:data:`HASHLESS_CHECKED`) are checked, and a changed page of any
            other column goes unseen.

    Returns:
        :class:`NemoExport`: the file's and the metadata file's paths, its counts (``rows``,
        ``sequences``, ``tokens``, ``targets``: loss-mask ones; the one-token sequences and
        rows left out), the EOS counts; its ``warnings`` are those ``packtool stats`` gives
        for ``out_dir`` (:func:`export_warnings`: an output of 0 rows is exported, a file of
        no row and its entry, and said so; a held-out output its training output no longer
        pairs with is stale: :func:`~packtool.formats.manifest.stale_holdout`), then the EOS
        line; its ``notes`` say a ``--segment-multiple`` layout is not kept and name an EOS
        id the manifest records that was not looked for (:func:`export_notes`).

    Raises:
        ConfigError: an argument of another type or range, checked as :func:`packtool.pack`
            checks its own (:func:`packtool.config.option_value`: a bool or a float is no
            integer), in one line naming its keyword: ``eos_id=True: must be an integer, not
            bool``, ``rows_per_group=0: must be >= 1``, ``split='train': choose training or
            validation``. Nothing is read or written then.
        ManifestError: ``out_dir`` is not a complete packed output (a tokenized output is
            refused: pack it first), a shard differs from its manifest (missing, resized, its
            sha256 with ``check_hashes``), its shards' rows do not add up to its totals
            (:func:`~packtool.formats.manifest.check_rows_add_up`), or it was packed again
            while read (``rerun the same packtool export``). Nothing is written then.
        OutputError: the file exists (without ``overwrite``), written by another export (this
            very export, finished, is nothing to do: ``already_complete``; missing its metadata
            entry, the entry is added: ``completed_entry``), DEST is a file, a store URI, or is
            ``out_dir``, lies inside it or contains it, or is, lies inside or contains another
            packtool output (finished, or a run's lock, marker or scratch), the metadata file is
            not a JSON list, another export holds DEST, or DEST cannot be written (read-only,
            full). Nothing is written then, or DEST is left as it was.
        KeyboardInterrupt: Ctrl-C or SIGTERM; DEST is left as it was (its message says so).
    """
    out_dir, dest, split, overwrite, rows_per_group, eos_id, check_hashes = _checked_arguments(
        out_dir, dest, split, overwrite, rows_per_group, eos_id, check_hashes)
    _check_dest(out_dir, dest)
    dest = Location.parse(dest).path  # local (checked): a file: URI is its path
    if dest.exists() and not dest.is_dir():
        raise OutputError(f"{dest}: exists and is a file; DEST must be a directory")
    with interruptible():
        try:
            capacity, convention, source, blocks, holds, manifest, where = \
                _packed_blocks(out_dir, check_hashes)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"nothing was written into {dest}") from None
        eos = eos_id if eos_id is not None else output_eos(manifest)
        try:
            done = _export(blocks, convention, capacity, dest, split or holds, overwrite,
                           rows_per_group, source, None if eos is None else int(eos))
        finally:
            blocks.close()
    stale = stale_holdout(manifest, out_dir)  # a held-out output left unpaired
    return dataclasses.replace(
        done, shards_hashed=len(manifest.shards) if check_hashes else 0,
        warnings=tuple(export_warnings(manifest, where) + ([stale] if stale else [])
                       + eos_warnings(manifest, done)),
        notes=tuple(export_notes(manifest, eos)))


def recorded_eos(manifest) -> list[tuple[str, int]]:
    """``(what appended it, id)`` of each EOS id a packed output's manifest records as appended
    to its documents, in the order :func:`output_eos` chooses from: ``pack`` (its
    ``--append-eos``), then ``tokenize`` (the ``--append-eos`` every ``packtool tokenize``
    output it was packed from added:
    :attr:`~packtool.formats.manifest.Manifest.tokenized`); an id recorded by both once."""
    found = []
    eos = manifest.options.get("append_eos")
    if eos is not None:
        found.append(("pack", int(eos)))
    if manifest.tokenized is not None and manifest.tokenized.append_eos is not None:
        eos = int(manifest.tokenized.append_eos)
        if all(eos != known for _, known in found):
            found.append(("tokenize", eos))
    return found


def _checked_arguments(out_dir, dest, split, overwrite, rows_per_group, eos_id, check_hashes
                       ) -> tuple:
    """:func:`export_nemo`'s arguments, each checked as :func:`packtool.pack` checks its own
    (:func:`packtool.config.option_value`: a bool is no integer, a float is refused, a NumPy
    integer is the equal ``int``, a path may be an ``os.PathLike``) and returned plain.

    Raises:
        ConfigError: one line naming the keyword and the value (``eos_id=True: must be an
            integer, not bool``; ``split='train': choose training or validation``).
    """
    from packtool.config import option_value

    split = option_value("split", split, "str | None", python=True)
    if split is not None and split not in NEMO_SPLITS:
        raise ConfigError(f"split={split!r}: choose {' or '.join(NEMO_SPLITS)}")
    return (option_value("out_dir", out_dir, "str", python=True),
            option_value("dest", dest, "str", python=True), split,
            option_value("overwrite", overwrite, "bool", python=True),
            option_value("rows_per_group", rows_per_group, "int", minimum=1, python=True),
            option_value("eos_id", eos_id, "int | None", minimum=0, python=True),
            option_value("check_hashes", check_hashes, "bool", python=True))


def output_eos(manifest) -> int | None:
    """The EOS id a packed output's documents end with, as its manifest says: pack's
    ``--append-eos``, else the ``--append-eos`` every ``packtool tokenize`` output it was packed
    from added (:attr:`~packtool.formats.manifest.Manifest.tokenized`); None when neither is
    recorded (:func:`recorded_eos`, the first)."""
    found = recorded_eos(manifest)
    return found[0][1] if found else None


def _eos_fields(found: dict) -> dict:
    """:class:`NemoExport`'s EOS fields of an :meth:`_EosScan.found`."""
    return {"eos_id": found["eos_id"], "eos_documents": found["documents"],
            "eos_targets": found["targets"], "eos_cut": found["cut"],
            "eos_first_doc": found["first_doc"]}


def _export(blocks, convention: str, capacity: int, dest: Path, split: str, overwrite: bool,
            rows_per_group: int, source: str, eos: int | None) -> NemoExport:
    """:func:`export_nemo` once the packed output is open (inside ``interruptible``)."""
    made: tuple = ()  # the folders this export created (DEST and its parents)
    final = dest / nemo_file_name(split, capacity)
    meta = dest / f"{capacity}_metadata.jsonl"
    existed = final.exists()
    as_before = (f"the existing {final.name} is unchanged" if existed
                 else f"nothing was written into {dest}")
    lock = None
    try:
        try:
            made = make_dirs(dest)
            lock = _lock_dest(dest)
            _remove_stale_temps(dest, final.name, meta.name)
        except OSError as exc:
            raise _dest_error(dest, exc, "nothing was written") from None
        identity = {"output_fingerprint": source, "split": split,
                    "rows_per_group": rows_per_group, "packtool": __version__}
        if existed and not overwrite:
            done = _written_by(final, identity)
            if done is None:
                raise OutputError(f"{final}: exists; pass --overwrite to replace it or choose "
                                  "another DEST")
            found = done.get("eos")  # what the export found, for the EOS id it was told
            if not isinstance(found, dict) or found.get("eos_id") != eos:
                found = _eos_of_file(final, eos)
            if _has_entry(meta, split, done["entry"]):  # this very export, finished: as pack
                return NemoExport(str(final), str(meta), **done["counts"], already_complete=True,
                                  **_eos_fields(found))
            release = hold()  # the file is complete: its entry is written whatever comes
            try:
                _update_metadata(meta, split, done["entry"])
            finally:
                release()
            return NemoExport(str(final), str(meta), **done["counts"], completed_entry=True,
                              **_eos_fields(found))
        _read_metadata(meta)  # a metadata file that is not a JSON list: refused before writing
        tmp = dest / f".{final.name}.{uuid.uuid4().hex}.tmp"
        try:
            counts, entry, found = _write(blocks, convention, capacity, tmp, rows_per_group,
                                          identity, eos)
            check()
            release = hold()  # the file and its entry are published together
            try:
                os.replace(tmp, final)
                as_before = (f"{final.name} was written but not its entry in {meta.name}: "
                             "rerun the same command to add it")
                _update_metadata(meta, split, entry)
            finally:
                release()
        except OSError as exc:
            raise _dest_error(dest, exc, as_before) from None
        finally:
            release_tmp = hold()  # a second Ctrl-C never leaves the temporary file behind
            try:
                tmp.unlink(missing_ok=True)
            finally:
                release_tmp()
    except BaseException as exc:
        if lock is not None:
            _unlock_dest(dest, lock)
            lock = None
        # each only when empty: an export that wrote nothing leaves no DEST, nor the parents
        # it created for it
        remove_made(made)
        if isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt(as_before) from None
        raise
    finally:
        if lock is not None:
            _unlock_dest(dest, lock)
    return NemoExport(str(final), str(meta), **counts, **_eos_fields(found))


def _write(blocks, convention: str, capacity: int, tmp: Path, rows_per_group: int,
           identity: dict, eos: int | None) -> tuple[dict, dict, dict]:
    """Write every block to ``tmp``; return (the :class:`NemoExport` counts, the metadata
    entry, what :class:`_EosScan` found for ``eos``), all three also recorded in the file under
    :data:`EXPORT_KEY`."""
    rows = seqs = tokens = targets = left_rows = left_seqs = 0
    max_k, max_len, min_fed = 0, 0, None
    pending: list[pa.RecordBatch] = []
    scan = _EosScan(eos)
    with pq.ParquetWriter(tmp, nemo_schema(), compression="zstd") as w:
        def flush(all_rows: bool) -> None:
            table = pa.Table.from_batches(pending, schema=nemo_schema())
            n = table.num_rows if all_rows else table.num_rows // rows_per_group * \
                rows_per_group
            if n:
                w.write_table(table.slice(0, n), row_group_size=rows_per_group)
            pending[:] = table.slice(n).to_batches()

        for n, cols in enumerate(blocks):
            test_pause("export-block", n)
            check()
            batch = to_nemo_batch(cols, convention)
            pending.append(batch)
            scan.add(batch)
            # the stored rows' figures: tokens and sequences a row, each sequence's length
            stored = np.diff(batch.column(0).offsets.to_numpy()).astype(np.int64)
            k = np.diff(batch.column(2).offsets.to_numpy()).astype(np.int64)
            starts = batch.column(2).values.to_numpy().astype(np.int64)
            ends = np.concatenate([np.append(s[1:], t) for s, t in zip(
                np.split(starts, np.cumsum(k)[:-1]), stored)]) if k.size else starts
            fed = stored - k  # what their collate feeds: L - 1 a sequence
            in_block = sum(len(d) for d in cols["doc_ids"])
            left_rows += len(cols["doc_ids"]) - batch.num_rows
            left_seqs += in_block - int(k.sum())
            rows += batch.num_rows
            seqs += int(k.sum())
            tokens += int(stored.sum())
            targets += int(_ones(batch.column(1)))
            max_k = max(max_k, int(k.max(initial=0)))
            max_len = max(max_len, int((ends - starts).max(initial=1)) - 1)
            if fed.size:
                min_fed = int(fed.min()) if min_fed is None else min(min_fed, int(fed.min()))
            if sum(b.num_rows for b in pending) >= rows_per_group:
                flush(False)
        if pending:
            flush(True)
        fed_total = tokens - seqs
        entry = {"dataset_max_seqlen": max_len, "max_samples_per_bin": max_k,
                 "packing_factor": round(seqs / rows, 2) if rows else 0.0,
                 "packing_efficiency": round(100 * fed_total / (rows * capacity), 2)
                 if rows else 0.0,
                 "pack_size": capacity, "min_packed_seqlen": min_fed or 0}
        counts = {"rows": rows, "sequences": seqs, "tokens": tokens, "targets": targets,
                  "one_token_sequences_left_out": left_seqs, "rows_left_out": left_rows}
        found = scan.found()
        w.add_key_value_metadata({EXPORT_KEY: json.dumps(
            {"identity": identity, "counts": counts, "entry": entry, "eos": found})})
    return counts, entry, found


def _ones(arr: pa.Array) -> int:
    """Sum of the values of a list array (the loss_mask ones)."""
    return int(np.asarray(arr.flatten().to_numpy(zero_copy_only=False), dtype=np.int64).sum())
