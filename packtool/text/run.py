"""``packtool tokenize``: text to the tokenized Parquet ``packtool pack`` reads.

1. The inputs are found as ``pack`` finds its own (:func:`packtool.formats.reader.discover` with
   ``text=True``: files and directories, local or in a store, hidden and ``_`` entries skipped,
   the same file twice refused); the tokenizer is loaded from its local file
   (:func:`packtool.text.tokenizer.load_tokenizer`).
2. OUTPUT is owned by :class:`packtool.output.Output`, as for ``pack``: lock, fingerprint (the
   options, the tokenizer file's sha256, the library versions and the inputs), in-progress
   marker, temporary names, the typed manifest last (:class:`~packtool.formats.manifest.Manifest`
   of kind ``tokenized``: one :class:`~packtool.formats.manifest.ShardEntry` per shard, totals
   ``docs_in``, ``tokens_in`` and the BOS/EOS counts).
3. Each input file is read ``batch_docs`` documents at a time (a reader thread parses the next
   batch while this one is encoded), encoded on ``--workers`` threads, BOS/EOS added
   by id (:func:`packtool.core.masks.add_boundary_tokens`: never doubled), and written as one
   Parquet row group; every ``rows_per_shard`` documents of a file make one shard
   ``part-FFFFF-KKKKK.parquet`` (file F, shard K), so the shards in name order hold the documents
   in input order and the global document index ``pack`` assigns is the input's.
4. OUTPUT is changed only when the first shard is ready (a bad document in it leaves OUTPUT as
   it was); after that a failure keeps the finished shards. With ``--overwrite`` a finished
   output found there stays whole and readable until the commit (the new shards wait beside it
   under pending names, :attr:`packtool.output.Output.keeps_finished`): a failure removes this
   run's shards and marker (OUTPUT exactly as before), Ctrl-C keeps them for the rerun. A rerun
   of an interrupted tokenize keeps the finished shards (a shard is published whole) and reads on from the first
   document they do not hold, without encoding the kept ones; a kept shard's counts come from
   the in-progress marker, or are read back from the shard (a shard whose BOS/EOS counts the
   marker lost is written again: the same bytes); a rerun of a finished one does nothing.

Memory: a few batches of texts and their ids (``batch_docs`` documents each), whatever the size
of the input.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from packtool._version import __version__
from packtool.formats.manifest import (FORMAT_VERSION, IN_PROGRESS_NAME, TOKENIZED_KIND,
                                       InputEntry, Manifest, ShardEntry, shard_files)
from packtool.formats.object_store import STORE_ERRORS
from packtool.errors import InputError
from packtool.formats.reader import discover
from packtool.formats.text import (TextBatch, common_tokenized_schema, iter_texts,
                                   tokenized_counts, write_tokenized_shard)
from packtool.location import Location
from packtool.output import REPLACED_RERUN, Output, discard_shard_temp, finished_shard, \
    fingerprint, held_words, kept_shard, publish_shard, shard_temp
from packtool.signals import check, interruptible, test_pause
from packtool.stats import PackStats
from packtool.text.tokenizer import load_tokenizer

__all__ = ["run_tokenize", "TokenizeResult", "tokenized_shard_name"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizeResult:
    """What :func:`run_tokenize` did."""

    documents: int  #: documents in OUTPUT (all shards)
    tokens: int  #: tokens in OUTPUT
    shards: int  #: shards in OUTPUT
    shards_reused: int  #: kept from an interrupted identical run
    seconds: float  #: wall time
    #: the manifest written (or found); ``manifest.totals`` holds the BOS/EOS counts
    manifest: Manifest
    already_complete: bool = False  #: OUTPUT already held this tokenization
    #: entries under INPUT not read, as ``"path (reason)"`` (:class:`~packtool.formats.reader.Discovery`)
    skipped: list = field(default_factory=list)
    skipped_note: str = ""  #: one line naming them (empty when every file was read)
    #: what the caller should warn of, one line each: an interrupted tokenize run of other
    #: options that OUTPUT held, replaced by this run (:meth:`packtool.output.Output.replaced_note`)
    warnings: list = field(default_factory=list)
    #: the ``warnings`` already logged as the run went (said before anything was replaced)
    said: tuple = ()


#: Revision of how a tokenized shard's rows are laid out (in the fingerprint, so a rerun never
#: keeps shards of another layout). 2: row groups of ``batch_docs`` documents counted from the
#: shard's first document, whatever batch the run or the reader began with. 3: a kept column
#: dictionary-encoded in the text input (a pandas Categorical) is written as its values.
SHARD_LAYOUT = 3


def tokenized_shard_name(file_index: int, shard: int, width: int = 5) -> str:
    """``part-00003-00000.parquet``: shard ``shard`` of input file ``file_index``."""
    return f"part-{file_index:0{width}d}-{shard:05d}.parquet"


class _Prefetch:
    """Iterate ``it`` in a background thread, ``depth`` items ahead (reading and JSON parsing
    overlap the encoding, which releases the GIL); errors are raised in the consumer."""

    _END = object()

    def __init__(self, it, depth: int = 2) -> None:
        self._q: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._done = False
        self._t = threading.Thread(target=self._run, args=(it,), daemon=True)
        self._t.start()

    def _run(self, it) -> None:
        try:
            for item in it:
                while not self._stop.is_set():
                    try:
                        self._q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._q.put((self._END, None))
        except BaseException as exc:  # handed to the consumer
            self._q.put((self._END, exc))

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        while True:
            try:
                item, exc = self._q.get(timeout=0.2)
                break
            except queue.Empty:
                check()  # Ctrl-C while waiting for the reader
        if exc is not None:
            self._done = True
            raise exc
        if item is self._END:
            self._done = True
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()


def _counts(entry: ShardEntry, promised: dict | None) -> PackStats | None:
    """The counts a finished run recorded beside shard ``entry`` in its marker, or None."""
    if not promised or promised.get("sha256") != entry.sha256 or "counts" not in promised:
        return None
    try:
        return PackStats.from_dict(promised["counts"])
    except (TypeError, ValueError, KeyError):
        return None


def _file_shards(out: Output, file_index: int, width: int,
                 boundary: bool) -> list[tuple[ShardEntry, PackStats]]:
    """The shards of input file ``file_index`` an interrupted identical run finished, in order,
    with their counts (a rerun keeps them; the first missing one ends the list, and so does one
    whose BOS/EOS counts (``boundary``: --prepend-bos or --append-eos) only its marker knew)."""
    kept = []
    k = 0
    while out.resume:
        name = tokenized_shard_name(file_index, k, width)
        promised = out.promised(name)
        entry = kept_shard(out.path, name, promised, not out.keeps_finished)
        if entry is None:
            break
        counts = _counts(entry, promised)
        if counts is None:
            if boundary:  # written again, same bytes, so its BOS/EOS are counted
                break
            docs, tokens = tokenized_counts(finished_shard(out.path, name,
                                                           not out.keeps_finished))
            counts = PackStats(docs_in=docs, tokens_in=tokens)
        kept.append((entry, counts))
        k += 1
    return kept


def _marker_counts(c: PackStats) -> dict:
    """The counts of a tokenized shard as kept in the in-progress marker."""
    return {"counts": {f.name: getattr(c, f.name) for f in dataclasses.fields(c)
                       if getattr(c, f.name)}}


def run_tokenize(cfg, *, progress: bool = True) -> TokenizeResult:
    """Tokenize ``cfg.inputs`` into ``cfg.output`` (steps in the module docstring).

    Args:
        cfg: :class:`packtool.config.TokenizeConfig`.
        progress: a progress bar on stderr when it is a terminal.

    Returns:
        :class:`TokenizeResult`.

    Raises:
        InputError, SchemaError: bad input (file and row or line named); OUTPUT left resumable
            (finished shards kept) or as before (always with ``--overwrite`` of a finished
            output: it is removed at the commit only, and the run's own shards go).
        ConfigError: a BOS/EOS that is neither an id of the tokenizer's vocabulary nor one of
            its special tokens; an invalid ``--tokenizer-pattern``.
        OutputError: OUTPUT cannot be used (another run holds it, not empty, full disk...).
        MissingDependencyError: ``tokenizers`` / ``tiktoken`` missing.
        KeyboardInterrupt: Ctrl-C or SIGTERM; rerunning the same command resumes. Its message
            says what OUTPUT holds: no manifest and the finished shards kept, or its earlier
            finished output untouched (``--overwrite``) with the shards kept beside it (empty:
            OUTPUT is as before the run).
    """
    t0 = time.perf_counter()
    tok = load_tokenizer(cfg.tokenizer, pattern=cfg.tokenizer_pattern,
                         add_special_tokens=cfg.add_special_tokens, threads=cfg.workers)
    bos = tok.token_id(cfg.prepend_bos, "--prepend-bos") if cfg.prepend_bos is not None else None
    eos = tok.token_id(cfg.append_eos, "--append-eos") if cfg.append_eos is not None else None
    found = discover(list(cfg.inputs), text=True, skip_unsupported=cfg.skip_unsupported,
                     outputs=((cfg.output, "OUTPUT"),))
    files = found.files
    options = {**cfg.layout_options(), "prepend_bos": bos, "append_eos": eos,
               "shard_layout": SHARD_LAYOUT,
               "tokenizer": {"kind": tok.kind, "file": Path(tok.path).name,
                             "sha256": tok.sha256, "vocab_size": tok.recorded_vocab_size,
                             "library_version": tok.version,
                             # special-token strings in the text are encoded as text
                             "special_tokens_in_text": "text"}}
    fp = fingerprint(options, files)
    width = max(5, len(str(max(len(files) - 1, 0))))
    show = progress and sys.stderr.isatty()
    found_info = {"skipped": found.skipped, "skipped_note": found.skipped_note()}
    # one schema for every shard: each kept column in the type all the files' types promote to
    schema = common_tokenized_schema([(f.path, f.format) for f in files], cfg.keep_columns)
    out = None
    try:
        with interruptible(), Output(cfg.output, cfg.inputs, fp, overwrite=cfg.overwrite,
                                     options=options, kind=TOKENIZED_KIND,
                                     files=files) as out:
            return _tokenize(cfg, out, tok, bos, eos, files, fp, options, width, schema, show,
                             t0, found_info)
    except KeyboardInterrupt:
        stop = KeyboardInterrupt(_kept(out, cfg.output))
        if out is not None and out.replaced_untouched():
            stop.rerun = REPLACED_RERUN  # the same command would replace what is kept
        raise stop from None


def _kept(out: Output | None, path) -> str:
    """What a stopped run left in OUTPUT for the rerun, in words, read from OUTPUT once it is
    released: ``OUT has no manifest; kept for the rerun: N finished shards`` when the
    in-progress marker is there (this run's, or the earlier run's it had not yet taken over),
    ``OUT still holds an interrupted tokenize run of other options (...), untouched``
    (:meth:`Output.replaced_untouched`) when this run was to replace that one and had not begun,
    ``OUT still holds its earlier finished tokenize run, untouched`` (and what is kept beside
    it) for an ``--overwrite`` stopped before its commit; empty when OUTPUT is as it was before
    the run (absent, when the run created it). ``out`` None: the run had not entered OUTPUT,
    which is as it found it: what an earlier stopped run kept there
    (:func:`packtool.output.held_words`), else empty."""
    if out is None:
        return held_words(path) or ""
    untouched = out.replaced_untouched()
    if untouched:  # an interrupted run of other options, which this run had not yet replaced
        return untouched
    try:
        found = out.path.listdir()
    except STORE_ERRORS:
        return ""
    if out.keeps_finished:
        return out.stopped_words()
    if IN_PROGRESS_NAME not in found:
        return ""
    n = len(shard_files(found))
    return (f"{out.path.display} has no manifest; kept for the rerun: {n} finished "
            f"shard{'s' * (n != 1)}")


def _tokenize(cfg, out: Output, tok, bos, eos, files, fp: str, options: dict, width: int,
          schema, show: bool, t0: float, found_info: dict) -> TokenizeResult:
    """The body of :func:`run_tokenize` inside its entered OUTPUT ``out``."""
    if out.complete:
        m = out.manifest
        return TokenizeResult(m.totals.docs_in, m.totals.tokens_in, len(m.shards),
                              len(m.shards), time.perf_counter() - t0, m, True, **found_info)
    from tqdm import tqdm

    # said now, before a shard of the run it replaces goes (only once this run's first shard is
    # ready): a run stopped here leaves them, for a rerun with the earlier options
    note = out.replaced_note()
    if note:
        log.warning(note)
    said = (note,) if note else ()
    outputs: list[ShardEntry] = []
    inputs: list[InputEntry] = []
    total, reused = PackStats(), 0
    writing = False
    if bos is not None or eos is not None:  # numba only when it has work to do
        from packtool.core.masks import BoundaryCounts, add_boundary_tokens

    def begin() -> None:  # OUTPUT is changed only once a shard is ready to be published
        nonlocal writing
        if not writing:
            out.begin_write()
            writing = True

    with tqdm(desc="tokenize", unit=" doc", unit_scale=True, disable=not show,
              file=sys.stderr, leave=False) as bar:
        for i, f in enumerate(files):
            kept = _file_shards(out, i, width, bos is not None or eos is not None)
            for entry, counts in kept:
                begin()
                out.shard_written(entry, _marker_counts(counts))
                outputs.append(entry)
                total = total + counts
            reused += len(kept)
            skip = sum(c.docs_in for _, c in kept)
            bar.update(skip)
            texts = _Prefetch(iter_texts(f.path, f.format, cfg.text_column,
                                         batch_docs=cfg.batch_docs, skip=skip,
                                         keep=cfg.keep_columns))
            none = (None, TextBatch([]))
            try:
                n, k, carry = skip, len(kept), TextBatch([])
                while True:
                    if not carry:
                        carry = next(texts, none)[1]
                        if not carry:
                            break
                    added = [BoundaryCounts()] if bos is not None or eos is not None \
                        else None

                    def take(want: int) -> TextBatch:  # the next documents (fewer at the end)
                        nonlocal carry
                        parts, got = [], 0
                        while got < want:
                            if not carry:
                                carry = next(texts, none)[1]
                                if not carry:
                                    break
                            part, carry = carry.split(want - got)
                            parts.append(part)
                            got += len(part)
                        return TextBatch.concat(parts) if parts else TextBatch([])

                    def batches(limit=cfg.rows_per_shard):
                        # row groups of batch_docs documents counted from the shard's first:
                        # a shard's bytes never depend on where the run (or the reader's
                        # batches) began
                        done = 0
                        while done < limit:
                            part = take(min(cfg.batch_docs, limit - done))
                            if not part:
                                return
                            check()
                            lengths, ids = tok.encode(part.texts)
                            if added is not None:
                                lengths, ids, _, b = add_boundary_tokens(
                                    lengths, ids, None, bos=bos, eos=eos)
                                added[0] = added[0] + b
                            done += len(part)
                            bar.update(len(part))
                            yield lengths, ids, part.kept

                    test_pause("tokenize-shard", len(outputs))
                    name = tokenized_shard_name(i, k, width)
                    tmp = shard_temp(out.tmp, name)
                    try:
                        entry, tokens = write_tokenized_shard(tmp, batches(), schema, f.path,
                                                               name=name)
                        check()
                        begin()
                        publish_shard(tmp, out.path, name)
                    finally:
                        discard_shard_temp(tmp, out.tmp)
                    counts = PackStats(
                        docs_in=entry.rows, tokens_in=tokens,
                        **({} if added is None else {
                            "docs_bos_added": added[0].bos_added,
                            "docs_bos_present": added[0].bos_present,
                            "docs_eos_added": added[0].eos_added,
                            "docs_eos_present": added[0].eos_present}))
                    out.shard_written(entry, _marker_counts(counts))
                    outputs.append(entry)
                    total = total + counts
                    n += entry.rows
                    k += 1
            finally:
                texts.close()
            inputs.append(InputEntry(Location.parse(f.path).display, n, f.bytes))
    if not total.docs_in:  # as pack refuses an input of no documents
        shown = ", ".join(Location.parse(p).display for p in cfg.inputs)
        raise InputError(f"{shown}: no text to tokenize: no documents (empty files or blank "
                         "lines only); check the INPUT and --text-column")
    manifest = Manifest(format_version=FORMAT_VERSION, packtool_version=__version__,
                        fingerprint=fp, options=options, inputs=tuple(inputs),
                        shards=tuple(outputs), totals=total, kind=TOKENIZED_KIND)
    begin()
    out.commit(manifest, schema)
    return TokenizeResult(total.docs_in, total.tokens_in, len(outputs), reused,
                          time.perf_counter() - t0, manifest, False, **found_info,
                          warnings=list(said), said=said)
