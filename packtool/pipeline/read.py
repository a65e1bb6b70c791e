"""Read: cut the input into windows of documents and stream a window's tokens to a spill file.

Windows. Input files are taken in the sorted order that defines the global document index.
With a window size N the corpus is cut into consecutive runs of exactly N documents (the last
one shorter), whatever the files and row groups: a window may span several files, and a row
group is cut at record batches (see :func:`packtool.formats.reader.iter_token_batches`). Without
a window size the whole corpus is one window. The cut depends only on the row counts in the
Parquet footers, never on the engine or the number of workers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from packtool.core.masks import TokenBatch, prepare_documents
from packtool.errors import InputError
from packtool.formats.reader import InputFile, iter_token_batches, open_input, reads_labels
from packtool.signals import check, test_pause
from packtool.stats import PackStats
from packtool.types import LabelMode

__all__ = ["WindowPart", "Window", "plan_windows", "read_window", "file_rows",
           "input_labels_config", "iter_documents"]


@dataclass(frozen=True)
class WindowPart:
    """Rows ``first_row .. first_row + docs - 1`` of one input file."""

    file: int  #: index of the file in the input list
    path: str  #: the input file
    first_row: int  #: row index in the file of the part's first document
    docs: int  #: documents (rows) in the part
    format: str = "parquet"  #: input format (``parquet`` or ``arrow``)


@dataclass(frozen=True)
class Window:
    """A run of consecutive documents planned on its own."""

    index: int  #: window number, from 0, in input order
    first_doc: int  #: global index of the window's first document
    docs: int  #: documents in the window (empty ones included)
    parts: tuple[WindowPart, ...]  #: where they are, in input order
    tokens: int = 0  #: token values of the window per the footers (an estimate before EOS)


def _token_estimate(f: InputFile, md, column: str) -> int:
    """Token values of a file: the Parquet footer's value count of the token column, else an
    upper estimate from the file size."""
    if f.format != "parquet" or not hasattr(md, "schema"):
        return f.bytes // 2
    leaf = [i for i in range(md.num_columns)
            if md.schema.column(i).path.split(".")[0] == column]
    if not leaf:
        return 0
    return sum(md.row_group(g).column(leaf[0]).num_values for g in range(md.num_row_groups))


def plan_windows(files: list[InputFile], column: str, window_docs: int | None) -> list[Window]:
    """Cut the input into windows of ``window_docs`` documents (None: one window of all).

    Reads only the Parquet footers (and checks the token column of every file).

    Args:
        files: input files in global document order (from ``discover_inputs``).
        column: token column name.
        window_docs: documents per window (>= 1), or None.

    Returns:
        Windows in order, never empty (an input without rows is one window of 0 documents);
        ``windows[i].first_doc + windows[i].docs == windows[i+1].first_doc``.

    Raises:
        InputError, SchemaError: a file is not readable Parquet or lacks the token column.
        ValueError: ``window_docs`` < 1.
    """
    if window_docs is not None and window_docs < 1:
        raise ValueError(f"window_docs must be >= 1, got {window_docs}")
    rows, tokens_per_row = [], []
    for f in files:
        md = open_input(f.path, column, f.format).metadata
        rows.append(md.num_rows)
        tokens_per_row.append((_token_estimate(f, md, column), md.num_rows))
    total = sum(rows)
    n = total if window_docs is None else window_docs
    windows: list[Window] = []
    start = 0
    while start < total or not windows:
        stop = min(start + max(n, 1), total)
        parts, tok, first = [], 0, 0
        for i, (f, r) in enumerate(zip(files, rows)):
            lo, hi = max(start - first, 0), min(stop - first, r)
            if lo < hi:
                parts.append(WindowPart(i, str(f.path), lo, hi - lo, f.format))
                t, nr = tokens_per_row[i]
                tok += t * (hi - lo) // max(nr, 1)
            first += r
        windows.append(Window(len(windows), start, stop - start, tuple(parts), tok))
        start = stop
        if total == 0:
            break
    return windows


def file_rows(windows: list[Window], n_files: int) -> list[int]:
    """Documents read from each input file (int per file, in file order)."""
    out = [0] * n_files
    for w in windows:
        for p in w.parts:
            out[p.file] += p.docs
    return out


def iter_documents(path, column: str, *, fmt: str | None = None,
                   row_range: tuple[int, int] | None = None, batch_rows: int = 8192,
                   attention_mask: str | None = None, labels: str | None = None,
                   loss_mask: str | None = None, bos: int | None = None,
                   eos: int | None = None, source: str | None = None,
                   keep_docs: Callable[[int, int], np.ndarray] | None = None
                   ) -> Iterator[TokenBatch]:
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

    Raises:
        InputError, SchemaError: as :func:`~packtool.formats.reader.iter_token_batches`.
    """
    for raw in iter_token_batches(path, column, batch_rows, row_range=row_range, fmt=fmt,
                                  attention_mask=attention_mask, labels=labels,
                                  loss_mask=loss_mask, source=source):
        kept = None if keep_docs is None else keep_docs(raw.first_row, raw.lengths.size)
        batch = prepare_documents(raw.first_row, raw.lengths, raw.tokens, keep=raw.keep,
                                  labels=raw.labels, loss_masks=raw.loss_masks, bos=bos, eos=eos,
                                  keep_docs=kept)
        yield batch if raw.sources is None else dataclasses.replace(batch, sources=raw.sources)


def read_window(column: str, append_eos_id: int | None, window: Window, spill: BinaryIO,
                options: dict | None = None, targets: BinaryIO | None = None,
                split=None, sources: list | None = None) -> tuple[np.ndarray, PackStats]:
    """Validate a window's documents and append their tokens to ``spill`` as raw int32.

    Only the lengths are kept here; tokens go to ``spill`` one record batch (whole documents)
    at a time. When a batch carries input target flags (a labels column,
    :mod:`packtool.core.masks`), the flags of the whole window go to ``targets`` as raw uint8
    (1 for tokens of files without labels), from its first token on; without any, nothing is
    written to ``targets``.

    Args:
        column: token column.
        append_eos_id: if not None, appended to every non-empty document not ending with it
            (used when ``options`` is None).
        window: from :func:`plan_windows`.
        spill: where the tokens go (``write(buffer)``: a binary file or a
            :class:`packtool.pipeline.spill.DocSpill`).
        options: mask columns and BOS/EOS (:meth:`packtool.config.PackConfig.read_options`).
        targets: where the target flags go, if any (like ``spill``).
        sources: with ``options["source"]`` (``--source-column``), a list that gets each
            batch's per-document source values, in document order (a document ``split`` leaves
            out keeps its value, unused).
        split: a :class:`packtool.core.holdout.HoldoutSplit`: the documents it does not keep
            are read and validated but get length 0 and no tokens (``--holdout``); None keeps
            every document.

    Returns:
        (int64[window.docs] tokens per document after masks and BOS/EOS, the mask counts as
        a :class:`PackStats`).

    Raises:
        InputError, SchemaError: bad input (file and row named); a file holding a different
            number of rows than its footer said when the windows were cut.
        KeyboardInterrupt: the run was told to stop (:func:`packtool.signals.check`).
    """
    options = {"eos": append_eos_id} if options is None else options
    parts, counts, written, flags = [], PackStats(), 0, False
    first_doc = window.first_doc  # global index of the part's first document
    for part in window.parts:
        n = 0
        keep = None
        if split is not None:  # file row -> global document index
            def keep(row, count, base=first_doc - part.first_row):
                return split.keep(base + row, count)
        for batch in iter_documents(
                Path(part.path), column, fmt=part.format,
                row_range=(part.first_row, part.first_row + part.docs), keep_docs=keep,
                **options):
            check()
            # the buffer itself, no bytes copy (a 200 MB corpus spent 0.06 s in tobytes)
            spill.write(memoryview(np.ascontiguousarray(batch.tokens, dtype=np.int32)))
            if batch.targets is not None and not flags and targets is not None:
                flags = True
                if written:  # earlier tokens: all targets
                    targets.write(memoryview(np.ones(written, np.uint8)))
            if flags:
                t = (batch.targets if batch.targets is not None
                     else np.ones(batch.tokens.size, np.uint8))
                targets.write(memoryview(np.ascontiguousarray(t, dtype=np.uint8)))
            written += batch.tokens.size
            parts.append(batch.lengths)
            if sources is not None and batch.sources is not None:
                sources.append(batch.sources)
            counts = counts + PackStats(**batch.mask_counts())
            n += batch.lengths.size
            test_pause("read")
        if n != part.docs:
            raise InputError(f"{part.path}: {n} rows read from row {part.first_row}, "
                             f"{part.docs} expected; the file changed during the pack: "
                             "rerun the same packtool pack with --overwrite")
        first_doc += part.docs
    lengths = (np.concatenate(parts) if parts else np.zeros(0, np.int64)).astype(np.int64,
                                                                                   copy=False)
    return lengths, counts


def input_labels_config(cfg, files: list[InputFile]):
    """The config a pack runs with: when a labels column or a loss mask will be read (SFT
    prompt masking), the labels carry real information and are stored, so ``--labels none`` becomes
    ``unshifted`` (the shards' schema and the manifest say so).

    Raises:
        InputError, SchemaError: as :func:`packtool.formats.reader.reads_labels`.
    """
    if cfg.labels is LabelMode.NONE and reads_labels(files, cfg.column, cfg.labels_column,
                                                     cfg.loss_mask_column):
        cfg = dataclasses.replace(cfg, labels=LabelMode.UNSHIFTED)
    return cfg
