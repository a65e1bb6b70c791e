"""``packtool stats``: the figures that decide a packing set-up, recounted from the data.

On a packed output, every figure is recounted from the shards (not copied from the manifest) and
compared with the manifest totals; a disagreement is reported, never hidden (B15). On raw input,
a dry run on document lengths alone puts ``concat``, ``ordered`` and ``obfd`` side by side.

Figures: rows, documents, segments, split/truncated/dropped documents and tokens, real and padding
tokens, effective targets (labels != -100 = sum over segments of len - 1, the loss denominator,
B21) and targets per token, extra rows over ceil(tokens / C), the fill distribution, and attention
work: sum over segments of len**2 with document masking against rows * C**2 for full causal rows.

Reports are made to be compared across strategies: absolute units (rows, tokens, token^2), never
a ratio whose denominator differs per strategy; JSON figures are integers, or ratios rounded by
one rule (:func:`packtool.stats.json_ratio`).
"""

from __future__ import annotations

import json
import os
import unicodedata
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from packtool.errors import OutputError, install_hint
from packtool.recount import RECOUNTED, Recount
from packtool.stats import PackStats, json_percent, json_ratio, percent, plural
from packtool.types import Overflow, Strategy

__all__ = ["PackedAnalysis", "analyze_packed", "compare_strategies", "input_lengths",
           "input_documents", "InputDocuments",
           "format_packed", "format_compare", "plot_packed", "plot_compare", "require_matplotlib",
           "least_waste", "overflow_kept", "RECOUNTED"]

_FILL_EDGES = np.arange(11) / 10  # 0.0, 0.1, ..., 1.0, each the double nearest the decimal


@dataclass
class PackedAnalysis:
    """Recount of a packed output, next to its manifest totals.

    The per-row and per-segment figures are kept as counts over 0..C (memory O(C), independent
    of the number of rows and segments); :attr:`row_fill` and :attr:`segment_lengths` expand
    them (sorted, not in row order) for a caller that wants the values.
    """

    path: str
    stats: PackStats  #: recounted figures; fields not recountable taken from the manifest
    manifest_totals: dict  #: the manifest's ``totals``
    mismatches: dict  #: field -> (recounted, manifest) where they differ
    fill_hist: list  #: rows per fill decile [0-10%, ..., 90-100%]
    fill_counts: np.ndarray  #: int64[C + 1], rows holding exactly i real tokens
    segment_length_counts: np.ndarray  #: int64[C + 1], real segments of exactly i tokens
    per_bin: list = field(default_factory=list)  #: per row: shard, row, targets, segment targets
    documents: int = 0  #: distinct documents in the shards (document ids in any segment)
    per_bin_limit: int | None = None  #: rows listed at most in ``per_bin`` (None: all)
    #: shards and bytes whose sha256 was checked against the manifest, and the seconds it took
    #: (0 shards: skipped with ``check_hashes=False``)
    hashed: tuple = (0, 0, 0.0)
    #: the shards' columns whose pages the recount decoded (their page checksums checked) and
    #: the others, never read: without the sha256 (``check_hashes=False``) a changed page of
    #: one of those goes unseen
    columns_read: tuple = ()
    columns_unread: tuple = ()
    segment_multiple: int = 1  #: N of ``--segment-multiple`` the output was packed with
    #: ``pack --source-column``: the column, and per source present in the rows (one segment
    #: or more; by id) a dict of ``source_id`` (its index in the manifest's table),
    #: ``source`` (its value), ``rows`` (rows holding one of its segments), ``segments``,
    #: ``real_tokens``, ``padding_tokens`` (its segments' own padding with
    #: ``--segment-multiple``, and the padding tail of rows whose last segment is of this
    #: source) and ``effective_targets``; tokens, padding, targets and segments sum to the
    #: totals. A source of the table with no segment here (the table is shared by both outputs
    #: of a ``--holdout``; or its documents were empty or dropped) is left out:
    #: ``sources_in_table`` counts them all
    source_column: str | None = None
    per_source: list = field(default_factory=list)
    sources_in_table: int = 0  #: values in the manifest's source table (``source_values``)
    #: ``per_bin`` was asked for (its list and ``targets_total`` are reported, even empty)
    per_bin_asked: bool = False
    #: the ``WARNING:`` lines of this output (:meth:`~packtool.stats.PackStats.output_warnings`)
    warnings: list = field(default_factory=list)
    #: an output packed from ``packtool tokenize`` outputs of one tokenizer: that tokenizer and
    #: the BOS/EOS ids tokenize added (:class:`~packtool.formats.manifest.Tokenization`, the
    #: manifest's); None when not recorded
    tokenized: object = None
    #: field of :attr:`mismatches` -> where rows show it first (the shard and row of the first
    #: row whose ``num_targets`` disagrees with its segments), for those rows hold
    mismatch_where: dict = field(default_factory=dict)
    #: one line per fault of the rows that no total shows, each naming its shard and row: a
    #: document whose pieces carry two ``source_ids`` (the per-source figures are then wrong)
    faults: list = field(default_factory=list)
    concat: bool = False  #: packed with ``--strategy concat`` (it splits no document)
    #: the manifest counts apart the documents the rows under ``--min-fill`` left out whole
    #: (:attr:`packtool.formats.manifest.Manifest.min_fill_docs_recorded`)
    min_fill_docs_recorded: bool = True

    @property
    def row_fill(self) -> np.ndarray:
        """float64[rows]: real tokens / C of every row, ascending (expanded from the counts)."""
        c = self.fill_counts.size - 1
        return np.repeat(np.arange(c + 1, dtype=np.float64) / max(c, 1), self.fill_counts)

    @property
    def segment_lengths(self) -> np.ndarray:
        """int64[segments]: every real segment's length, ascending (expanded from the counts)."""
        return np.repeat(np.arange(self.segment_length_counts.size, dtype=np.int64),
                         self.segment_length_counts)

    def to_dict(self) -> dict:
        """The analysis as ``stats --json`` prints it (JSON-ready: plain ints, floats, lists
        and dicts). It holds no timing (``hashed``'s seconds are left out), so the same output
        gives the same dict on every run."""
        d = {"path": self.path, "stats": self.stats.to_dict(), "documents": self.documents,
             "manifest_totals": self.manifest_totals,
             "mismatches": {k: {"recounted": a, "manifest": b,
                                **({"where": self.mismatch_where[k]}
                                   if k in self.mismatch_where else {})}
                            for k, (a, b) in self.mismatches.items()},
             "faults": list(self.faults),
             "fill_histogram": {"edges": _FILL_EDGES.tolist(), "rows": self.fill_hist},
             "fill_quantiles": _count_quantiles(self.fill_counts),
             # no timing: an unchanged output gives the same JSON on every run (the text
             # says how long the sha256 took)
             "integrity": {"shards_hashed": self.hashed[0], "bytes_hashed": self.hashed[1]}}
        if self.tokenized is not None:  # as the manifest records it (an id absent: differs)
            d["tokenized"] = self.tokenized.to_dict()
        if self.source_column is not None:
            d["source_column"] = self.source_column
            d["sources_in_table"] = self.sources_in_table
            d["per_source"] = self.per_source
        if self.per_bin_asked:
            d["per_bin"] = self.per_bin
            d["per_bin_rows_listed"] = len(self.per_bin)
            d["per_bin_limit"] = self.per_bin_limit
            d["targets_total"] = int(self.stats.effective_targets)  # every row, listed or not
        return d


#: the quantiles of the fill that ``stats --json`` reports (``fill_quantiles``), always all of
#: them: an output of 0 rows gives 0.0 for each, as its ``fill`` is 0.0
_QUANTILES = (("min", 0.0), ("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))


def _quantiles(x: np.ndarray) -> dict:
    """float[n] -> {"min", "p10", "p50", "p90", "max"}: ratios rounded by
    :func:`~packtool.stats.json_ratio`; every key 0.0 when ``x`` is empty."""
    if x.size == 0:
        return {k: 0.0 for k, _ in _QUANTILES}
    q = np.quantile(x, [p for _, p in _QUANTILES])
    return {k: json_ratio(v) for (k, _), v in zip(_QUANTILES, q)}


def _count_quantiles(counts: np.ndarray) -> dict:
    """:func:`_quantiles` of the fill values ``i / C`` repeated ``counts[i]`` times, without
    expanding them (same linear interpolation as ``np.quantile``); every key 0.0 when no
    count is positive (an output of 0 rows)."""
    n = int(counts.sum())
    if n == 0:
        return {k: 0.0 for k, _ in _QUANTILES}
    c = max(counts.size - 1, 1)
    ends = np.cumsum(counts)  # sorted value at position j is the i with ends[i-1] <= j < ends[i]
    pos = np.array([p for _, p in _QUANTILES]) * (n - 1)
    lo, hi = np.floor(pos).astype(np.int64), np.ceil(pos).astype(np.int64)
    vlo = np.searchsorted(ends, lo, side="right") / c
    vhi = np.searchsorted(ends, hi, side="right") / c
    q = vlo + (vhi - vlo) * (pos - lo)
    return {k: json_ratio(v) for (k, _), v in zip(_QUANTILES, q)}


def analyze_packed(path, *, per_bin: bool = False, per_bin_limit: int | None = None,
                   check_hashes: bool = True, progress=None) -> PackedAnalysis:
    """Recount the figures of a packed output from its shards (read through the one reader,
    :class:`packtool.formats.packed.PackedOutput`).

    The recount reads only the structural columns (``cu_seqlens``, ``doc_ids``,
    ``num_targets``; ``labels`` too when an input labels column masked some
    targets) row group by row group, vectorised per group (NumPy), so time is linear in rows and
    segments and memory does not grow with them: O(C) for the fill and segment-length counts, plus
    two bits per document id, for the documents seen and those cut (docs/benchmarks.md,
    "stats"). An output packed with ``--source-column`` also has its ``doc_offsets`` read and
    the pieces that can be followed kept (:class:`packtool.verify.contract.DocumentPieces`: at
    most rows + split pieces, 40 bytes each), so a document whose pieces carry two
    ``source_ids`` is reported in ``faults``.
    Segment lengths come from ``cu_seqlens`` (the first k differences, k = len(doc_ids));
    effective targets are sum(len - 1) (B21), checked against the ``num_targets`` column row by
    row; a document is cut when more than one segment holds it (its ``doc_ids``).

    Args:
        path: the packed output: a directory, a ``file:`` URI or a store URI.
        per_bin: also list, per row, its target count and each segment's (B19, B20); this list
            grows with the rows.
        per_bin_limit: list at most this many rows (the first in manifest order); None lists
            all. Totals still count every row.
        check_hashes: compare every shard's sha256 with the manifest first (reads every byte;
            False checks sizes, footers and the page checksums of the columns the recount
            decodes, ``columns_read``: a changed page of ``columns_unread`` goes unseen).
        progress: ``callable(done, total)`` told about the sha256 of each shard.

    Returns:
        :class:`PackedAnalysis`; ``mismatches`` lists recounted fields that differ from the
        manifest totals (and ``num_targets`` when the column disagrees with the segments,
        its first shard and row in ``mismatch_where``); ``faults`` the faults of the rows no
        total shows (a document of two sources), one line each naming shard and row.
        ``warnings`` also say a held-out output of ``pack --holdout`` that its training output
        no longer pairs with is stale (:func:`~packtool.formats.manifest.stale_holdout`).

    Raises:
        ManifestError: not a complete packed output, or a shard that differs from its manifest
            (missing, extra, resized, edited; the message names it).
    """
    import time

    from packtool.formats.manifest import stale_holdout
    from packtool.formats.packed import PackedOutput

    t0 = time.perf_counter()
    # rows_add_up=False: the recount below names every total that differs (rows included)
    reader = PackedOutput.open(path, integrity="sha256" if check_hashes else "footer",
                               progress=progress, rows_add_up=False,
                               reopen="rerun the same packtool stats")
    hashed = ((len(reader.shards), sum(s.bytes for s in reader.manifest.shards),
               time.perf_counter() - t0) if check_hashes else (0, 0, 0.0))
    C = reader.capacity
    # an input labels column (SFT prompt masking) left some tokens -100 on purpose: the targets
    # are then the stored labels != -100, at most sum(len - 1) per segment
    recount = Recount(C, padded="cu_seqlens_unpadded" in reader.columns,
                      label_masked=reader.manifest.label_masked and reader.labels.stored,
                      num_sources=len(reader.manifest.source_values)
                      if reader.manifest.source_column is not None else 0,
                      per_bin_limit=per_bin_limit if per_bin else 0,
                      num_docs=reader.manifest.totals.docs_in,
                      concat=reader.manifest.options.get("strategy") == "concat",
                      location=reader.location)
    cols = recount.columns()
    pieces = None  # a document comes from one source: its pieces' source_ids must agree
    if recount.n_src and "doc_offsets" in reader.columns:
        from packtool.verify.contract import DocumentPieces

        pieces = DocumentPieces(C)
        cols.append("doc_offsets")
        if "cu_seqlens_unpadded" in reader.columns and "cu_seqlens_unpadded" not in cols:
            cols.append("cu_seqlens_unpadded")
    read = reader.columns_read(cols)
    for block in reader.iter_blocks(cols):
        recount.add(block)  # refuses rows whose ragged columns cannot be counted on
        if pieces is not None:
            pieces.add(block)
    reader.close()

    def name(g):
        s, r = reader.locate(g)
        return f"{reader.shards[s]} row {r}"

    mixed = pieces.source_problem(name) if pieces is not None else None
    faults = [mixed[2]] if mixed is not None else []
    totals = reader.manifest.totals.to_dict()
    figures = recount.figures(totals)
    base = {k: v for k, v in totals.items() if k in PackStats.__dataclass_fields__}
    base.update(figures, capacity=C)
    stats = PackStats.from_dict(base)
    mismatches = recount.mismatches(totals)
    fill_counts, by_src = recount.fill_counts, recount.by_src
    fill = np.arange(C + 1) / C
    hist = np.histogram(fill, bins=_FILL_EDGES, weights=fill_counts)[0].astype(np.int64).tolist()
    table = reader.manifest.source_values
    per_source = [{"source_id": i, "source": v, "rows": int(by_src[0, i]),
                   "segments": int(by_src[1, i]), "real_tokens": int(by_src[2, i]),
                   "padding_tokens": int(by_src[3, i]), "effective_targets": int(by_src[4, i])}
                  for i, v in enumerate(table) if by_src[1, i]]  # the sources in these rows
    multiple = int(reader.manifest.options.get("segment_multiple", 1))
    stale = stale_holdout(reader.manifest, reader.location)  # a held-out output left unpaired
    tok = reader.manifest.tokenized  # ids the pack wrote outside its tokenizer's vocabulary
    vocab = tok.vocabulary_warnings(reader.manifest.options, repack=True,
                                    padding_tokens=stats.padding_tokens) if tok else []
    return PackedAnalysis(reader.location.display, stats, totals, mismatches, hist, fill_counts,
                          recount.seg_counts, recount.bins, recount.documents,
                          per_bin_limit if per_bin else None,
                          hashed=hashed, segment_multiple=multiple,
                          columns_read=tuple(read),
                          columns_unread=tuple(c for c in reader.columns if c not in read),
                          source_column=reader.manifest.source_column,
                          per_source=per_source, sources_in_table=len(table),
                          per_bin_asked=per_bin,
                          warnings=stats.output_warnings(reader.manifest.options) + vocab + (
                              [stale] if stale else []),
                          tokenized=reader.manifest.tokenized,
                          mismatch_where=recount.mismatch_where(), faults=faults,
                          concat=reader.manifest.options.get("strategy") == "concat",
                          min_fill_docs_recorded=reader.manifest.min_fill_docs_recorded)


@dataclass(frozen=True)
class InputDocuments:
    """Raw INPUT as ``pack`` would see it before planning (masks and BOS/EOS applied)."""

    lengths: np.ndarray  #: int64[num_docs], tokens per document
    #: uint8[sum(lengths)] input target flags; None: no labels column and no loss mask read
    targets: np.ndarray | None
    masked_tokens: int  #: tokens removed by an attention mask
    boundary: object  #: :class:`packtool.core.masks.BoundaryCounts`
    #: :class:`packtool.formats.reader.Discovery`: the files read, the entries not read
    discovery: object = None
    #: :class:`packtool.formats.reader.InputColumns`: mask-like columns not used
    columns: object = None
    #: int64[files + 1]: global number of each file's first document, then the total
    first_docs: np.ndarray | None = None
    #: the options whose tokens the lengths count (``--prepend-bos and --append-eos``)
    added: str = ""
    #: documents that held no token as read (the other empty ones lost theirs to the mask)
    docs_empty_read: int = 0

    def locate(self, doc: int) -> tuple[str, int]:
        """The input file of global document ``doc`` and its row there (0-based)."""
        f = int(np.searchsorted(self.first_docs, doc, side="right") - 1)
        return self.discovery.files[f].path, int(doc - self.first_docs[f])

    def refuse_as_pack(self, capacity: int, overflow, column: str,
                       window_docs: int | None = None) -> None:
        """Refuse these documents as ``pack`` with the same options refuses them after reading,
        through the same code (the same one-line messages, the same exit).

        Raises:
            InputError: no tokens (:func:`packtool.pipeline.read.require_tokens`).
            PackingError: ``overflow`` is ``error`` and a document is longer than ``capacity``:
                the first in the order pack plans them (window by window with
                ``window_docs``), its file and row named
                (:func:`packtool.pipeline.read.check_overflow`).
        """
        from packtool.core.windows import plan_windows
        from packtool.pipeline.read import check_overflow
        from packtool.pipeline.read import require_tokens

        n = int(self.lengths.size)
        require_tokens(self.discovery.files, n, int(self.lengths.sum()), column,
                       masked=self.masked_tokens, empty_read=self.docs_empty_read)
        if Overflow(overflow) is not Overflow.ERROR:
            return
        order = np.arange(n, dtype=np.int64)  # shape: (num_docs,)
        if window_docs is not None:
            ws = plan_windows(n, window_docs)
            order = np.concatenate([order[:0]] + [ws.members(w) for w in range(ws.count)])
        check_overflow(capacity, self.lengths[order], order, self.locate, self.added)

    @property
    def label_masked(self) -> int:
        """Tokens kept out of the targets by input labels or loss masks."""
        return 0 if self.targets is None else int(self.targets.size
                                                  - np.count_nonzero(self.targets))


def input_documents(inputs, column: str = "input_ids", *, attention_mask: str | None = None,
                    labels: str | None = None, loss_mask: str | None = None,
                    bos: int | None = None, eos: int | None = None,
                    skip_unsupported: bool = False) -> InputDocuments:
    """Document lengths (and input target flags) of raw INPUT, in global document order,
    read through the same path as ``pack`` (:func:`packtool.pipeline.read.iter_documents`:
    the same discovery, mask columns and BOS/EOS).

    Args:
        inputs: INPUT paths.
        column: token column.
        attention_mask, labels, loss_mask: mask columns (a name, ``"auto"`` or None), as
            ``pack``.
        bos, eos: ``--prepend-bos`` / ``--append-eos`` ids or None.
        skip_unsupported: as ``pack --skip-unsupported``.

    Memory: 8 bytes per document, plus 1 byte per token when target flags are read.

    Raises:
        InputError, SchemaError: as :func:`packtool.formats.reader.discover` and
            :func:`packtool.pipeline.read.iter_documents`.
    """
    from packtool.core.masks import BoundaryCounts
    from packtool.formats.reader import discover, input_columns
    from packtool.pipeline.read import added_by, iter_documents

    found = discover(list(inputs), skip_unsupported=skip_unsupported)
    cols = input_columns(found.files, column, attention_mask, labels, loss_mask)
    lengths, flags, masked, counts, empty_read = [], [], 0, BoundaryCounts(), 0
    any_flags = False
    first_docs = np.zeros(len(found.files) + 1, dtype=np.int64)  # shape: (files + 1,)
    for i, f in enumerate(found.files):
        for tb in iter_documents(f.path, column, fmt=f.format, attention_mask=attention_mask,
                                 labels=labels, loss_mask=loss_mask, bos=bos, eos=eos):
            any_flags |= tb.targets is not None
            lengths.append(tb.lengths)
            flags.append(tb.targets if tb.targets is not None
                         else np.ones(tb.tokens.size, dtype=np.uint8))
            masked += tb.masked_tokens
            empty_read += tb.docs_empty_read
            counts = counts + tb.boundary
            first_docs[i + 1:] += tb.lengths.size
    cat = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    targets = (np.concatenate(flags) if flags else np.zeros(0, np.uint8)) if any_flags else None
    return InputDocuments(cat, targets, masked, counts, found, cols, first_docs,
                          added_by(bos, eos), empty_read)


def input_lengths(inputs, column: str = "input_ids") -> np.ndarray:
    """Document lengths of raw tokenized INPUT paths, in global document order (no masks).

    Returns:
        int64[num_docs].

    Raises:
        InputError, SchemaError: as :func:`input_documents`.
    """
    return input_documents(inputs, column).lengths


def compare_strategies(lengths: np.ndarray, capacity: int, *,
                       overflow: str = Overflow.SPLIT,
                       strategies=(Strategy.CONCAT, Strategy.ORDERED, Strategy.OBFD),
                       targets: np.ndarray | None = None,
                       window_docs: int | None = None, min_fill: float = 0.0,
                       segment_multiple: int = 1) -> list:
    """Dry-run each strategy on document lengths alone.

    Every figure is in absolute units, so the dicts compare directly across strategies.

    Args:
        lengths: int[num_docs] document lengths in tokens.
        capacity: tokens per row (C).
        overflow: long-document policy for ``ordered`` and ``obfd``.
        targets: optional uint8[sum(lengths)] input target flags (0: input label -100); the
            effective targets then leave those tokens out, as ``pack`` does.
        window_docs: also dry-run each of ``strategies`` in windows of this many documents,
            dealt and planned as ``pack --strategy S --window-docs`` deals and plans them
            (:mod:`packtool.core.windows`): one more dict per strategy, after the others,
            named ``"S, windows of N"``, with ``window_docs`` and ``windows`` set (None in the
            others; they take no part in :func:`least_waste`).
        min_fill: as ``pack --min-fill``: each plan without its rows under
            ``ceil(min_fill * capacity)`` real tokens (:func:`packtool.core.packing.pack_lengths`),
            counted in ``rows_dropped`` and ``tokens_under_min_fill`` (those rows' real tokens,
            counted in ``tokens_dropped`` too; both 0 without it).
        segment_multiple: as ``pack --segment-multiple N``: every piece planned to take a
            multiple of N slots of its row; ``padding_tokens`` then counts the padding inside
            rows too (``segment_padding_tokens``), and ``rows_without_segment_padding`` the
            rows of the same plan with N = 1 (equal to ``rows`` when N is 1).

    Returns:
        One dict per strategy, every dict with the same keys whatever the options (0, or None
        for ``window_docs`` and ``windows``, where one does not apply), its counts those
        ``pack --strategy S`` with the same options records
        (:meth:`packtool.stats.PackStats.from_plan`): ``strategy``, ``rows``,
        ``lower_bound_rows`` (ceil(tokens written / C)), ``extra_rows``, ``docs_truncated``,
        ``tokens_truncated`` (``--overflow truncate``), ``docs_dropped``, ``tokens_dropped``
        (every token not written: the truncated tails, ``--overflow drop``'s documents and the
        rows under ``min_fill``), ``warnings`` (the lines
        ``pack`` prints for these counts, :meth:`packtool.stats.PackStats.warnings`),
        ``rows_dropped``, ``tokens_under_min_fill``, ``segment_padding_tokens``,
        ``rows_without_segment_padding``,
        ``tokens_processed`` (rows * C, what a training step computes on),
        ``padding_tokens``, ``padding_pct`` (of ``tokens_processed``), ``docs_cut``
        (documents written in pieces, whatever the strategy: spread over several segments, or
        a piece kept of a document whose other rows ``min_fill`` left out, which
        :attr:`packtool.stats.PackStats.docs_cut` does not count),
        ``docs_cut_below_capacity`` (cut although they fit in one row; after ``--overflow truncate`` every document does), ``docs_split``,
        ``segments``, ``effective_targets``, ``targets_per_token``, ``attention_work``
        (token^2: sum of segment_len^2,
        the score entries of document-masked attention), ``attention_work_full_rows``
        (token^2: rows * C^2, the same rows without document masking) and
        ``attention_work_vs_least`` (``attention_work`` over the smallest of the strategies
        compared that write rows; None for a strategy that writes none). Ratios are rounded
        as in every JSON report (:func:`packtool.stats.json_ratio`; ``padding_pct``:
        :func:`~packtool.stats.json_percent`); a strategy that writes no row has
        ``padding_pct`` and ``targets_per_token`` 0.0 (no padding, no target, of no token), as
        the figures of an output of 0 rows are.

    Raises:
        ConfigError, PackingError: as :func:`packtool.core.pack_lengths` (``segment_multiple``
            under 1 or not a divisor of ``capacity`` included).
    """
    return _compare(lengths, capacity, overflow, strategies, targets, window_docs, min_fill,
                    segment_multiple)[0]


def _compare(lengths: np.ndarray, capacity: int, overflow, strategies, targets, window_docs,
             min_fill, segment_multiple: int = 1) -> tuple:
    """:func:`compare_strategies`' dicts and, beside each, the plan it counts."""
    from packtool.core.masks import plan_segment_targets
    from packtool.core.packing import pack_lengths
    from packtool.core.windows import plan_windows

    lengths = np.ascontiguousarray(lengths, dtype=np.int64)  # shape: (num_docs,)
    doc_starts = np.zeros(lengths.size, dtype=np.int64)  # shape: (num_docs,)
    if lengths.size:
        np.cumsum(lengths[:-1], out=doc_starts[1:])
    # documents that fit in one row as the plan sees them: after --overflow truncate, all
    fits = (np.ones(lengths.size, dtype=bool) if Overflow(overflow) is Overflow.TRUNCATE
            else lengths <= capacity)  # shape: (num_docs,)
    # tokens of each document a plan writes when it cuts none: after --overflow truncate, C at
    # most (a truncated document is not cut)
    written = (np.minimum(lengths, capacity) if Overflow(overflow) is Overflow.TRUNCATE
               else lengths)  # shape: (num_docs,)
    # tokens read kept out of the targets by input labels and loss masks (pack's count: its
    # no-effective-targets warning names them)
    label_masked = 0 if targets is None else int(targets.size - np.count_nonzero(targets))
    out, plans = [], []
    runs = [(str(s), s, None) for s in strategies]
    if window_docs is not None:  # pack --strategy S --window-docs N plans every window alone
        runs += [(f"{s}, windows of {window_docs:,}", s, window_docs) for s in strategies]
    for label, strategy, wd in runs:
        def plan_of(multiple, strategy=strategy, wd=wd):
            return (pack_lengths(lengths, capacity, strategy=strategy, overflow=overflow,
                                 min_fill=min_fill, segment_multiple=multiple)
                    if wd is None else _windowed_plan(lengths, capacity, wd, overflow, min_fill,
                                                      multiple, strategy))

        plan = plan_of(segment_multiple)
        plans.append(plan)
        s = PackStats.from_plan(plan)  # the counts pack records for this plan
        if segment_multiple > 1:  # and what the padding inside rows costs: the rows without it
            s = replace(s, rows_without_segment_padding=plan_of(1).num_rows)
        effective = int(plan_segment_targets(plan, doc_starts, targets).sum())
        # what pack records with the input's labels: its warnings follow from these counts
        s = replace(s, effective_targets=effective, tokens_label_masked=label_masked)
        real, rows = s.real_tokens, s.rows
        cut = _docs_cut(plan, written, lengths.size)
        slots = rows * capacity
        out.append({
            # one key set whatever the options: None, or 0, where one does not apply
            "window_docs": wd,
            "windows": None if wd is None else plan_windows(lengths.size, wd).count,
            "strategy": label, "rows": rows, "lower_bound_rows": s.lower_bound_rows,
            "extra_rows": s.extra_rows,
            "docs_truncated": s.docs_truncated, "tokens_truncated": s.tokens_truncated,
            "docs_dropped": s.docs_dropped, "tokens_dropped": s.tokens_dropped,
            "rows_dropped": s.rows_dropped, "tokens_under_min_fill": s.tokens_under_min_fill,
            "tokens_processed": slots,
            "padding_tokens": s.padding_tokens,
            "segment_padding_tokens": s.segment_padding_tokens,
            "rows_without_segment_padding": s.rows_without_segment_padding,
            "padding_pct": json_percent(100.0 * s.padding_tokens / slots) if rows else 0.0,
            "docs_cut": int(cut.sum()),
            "docs_cut_below_capacity": int((cut & fits).sum()),
            "docs_split": s.docs_split,
            "segments": s.segments,
            "effective_targets": effective,
            "targets_per_token": json_ratio(effective / real) if real else 0.0,
            "attention_work": s.attention_work,
            "attention_work_full_rows": s.full_attention_work,
            "warnings": s.warnings(overflow, min_fill),
        })
    # the least of the strategies that write rows: one that writes none has no attention work
    # to compare (0, no ratio: None), and is no least to divide by
    least = min((r["attention_work"] for r in out if r["rows"]), default=0)
    for r in out:
        r["attention_work_vs_least"] = (json_ratio(r["attention_work"] / least)
                                        if r["rows"] else None)
    return out, plans


def _docs_cut(plan, written: np.ndarray, num_docs: int) -> np.ndarray:
    """Which documents ``plan`` writes cut, shape (num_docs,), bool: those with a piece in the
    rows that is not the whole document (beginning past its start, or ending before the
    ``written`` tokens it would have uncut), or with several pieces. Whatever the strategy
    (ordered and obfd split documents longer than C, concat's stream cuts any document at a row
    end), and after ``--min-fill`` left rows out: a document whose other piece was in a row
    left out is still cut (its kept piece is part of it), one left out whole is dropped, not
    cut.

    Args:
        plan: a :class:`packtool.core.packing.PackPlan` (after ``--min-fill``).
        written: int64, shape (num_docs,): each document's tokens when not cut (its length, or
            at most C after ``--overflow truncate``).
        num_docs: documents of the input.
    """
    cut = np.zeros(num_docs, dtype=bool)
    if not num_docs:
        return cut
    doc = np.asarray(plan.seg_doc, dtype=np.int64)  # shape: (S,)
    offset = np.asarray(plan.seg_offset, dtype=np.int64)  # shape: (S,)
    end = offset + np.asarray(plan.seg_len, dtype=np.int64)  # shape: (S,)
    cut[doc[(offset > 0) | (end < written[doc])]] = True
    cut |= np.bincount(doc, minlength=num_docs) > 1
    return cut


def _windowed_plan(lengths: np.ndarray, capacity: int, window_docs: int, overflow,
                   min_fill: float = 0.0, segment_multiple: int = 1,
                   strategy: Strategy = Strategy.OBFD):
    """One plan of every window of ``pack --strategy strategy --window-docs``, each window
    planned alone and the plans concatenated (documents numbered globally): what the windowed
    pack's rows hold, without the tokens (a :class:`packtool.core.packing.PackPlan`, its
    pieces planned to multiples of ``segment_multiple``)."""
    from packtool.core.packing import PackPlan, pack_lengths
    from packtool.core.windows import plan_windows

    ws = plan_windows(lengths.size, window_docs)
    plans, counts = [], {}
    for w in range(ws.count):
        docs = ws.members(w)
        p = pack_lengths(lengths[docs], capacity, strategy=strategy, overflow=overflow,
                         min_fill=min_fill, segment_multiple=segment_multiple)
        plans.append((p, docs))
        for k, v in p.counts.items():
            counts[k] = counts.get(k, 0) + v
    offsets = [np.zeros(1, dtype=np.int64)]
    base = 0
    for p, _ in plans:
        offsets.append(p.row_offsets[1:] + base)
        base += p.num_segments
    empty = np.zeros(0, dtype=np.int64)
    return PackPlan(capacity=capacity, row_offsets=np.concatenate(offsets),
                    seg_doc=np.concatenate([d[p.seg_doc] for p, d in plans]) if plans else empty,
                    seg_offset=np.concatenate([p.seg_offset for p, _ in plans]) if plans
                    else empty,
                    seg_len=np.concatenate([p.seg_len for p, _ in plans]) if plans else empty,
                    counts=counts, segment_multiple=segment_multiple)


def least_waste(rows: list) -> dict | None:
    """The strategy that wastes least among :func:`compare_strategies`' results.

    Waste is padding (tokens a step computes on for nothing) plus the tokens
    not written (``tokens_dropped``: by ``--overflow truncate|drop`` and, in a dry run with
    ``min_fill``, by the rows under it); only strategies that cut no
    document that fits in one row compete (cutting such a document costs a target and breaks
    its context); ties go to fewer rows, then to more effective targets (each cut costs one),
    fewer documents cut, fewer segments, and last to the order given.

    Returns:
        The winning dict of ``rows`` among those that write rows, or of all of them when every
        one cuts such documents (after ``--overflow truncate`` every document fits); None when
        no strategy writes a row (every token lost: nothing to choose between).
    """
    rows = [r for r in rows if r.get("window_docs") is None] or rows  # not windowings
    rows = [r for r in rows if r["rows"]]  # one that writes nothing is no choice
    if not rows:
        return None
    whole = [r for r in rows if r["docs_cut_below_capacity"] == 0] or rows
    return min(whole, key=lambda r: (_waste(r), r["rows"], -r.get("effective_targets", 0),
                                     r.get("docs_cut", 0), r.get("segments", 0)))


def _waste(r: dict) -> int:
    """Tokens a strategy of :func:`compare_strategies` wastes: its padding plus the tokens it
    does not write (truncated or dropped: ``tokens_dropped``, which counts the truncated tails
    too)."""
    return r["padding_tokens"] + r.get("tokens_dropped", 0)


def _cut_words(s: PackStats, concat: bool) -> str:
    """What ``docs_cut`` counts, in words: the documents in more than one segment written
    (split by ordered or obfd, or cut by concat's stream). After ``--min-fill`` left rows out,
    ``compare``'s *docs cut* also counts a document with one piece written and its others in
    those rows: the line says so, with its figure when the counts give it (``docs_split``)."""
    words = (f"{plural(s.docs_cut, 'document')} in more than one segment written ("
             + ("cut by the concat stream)" if concat else "split ones)"))
    if not s.rows_dropped:
        return words
    part = s.docs_split - s.docs_cut
    if concat:
        return (words + "; compare's docs cut also counts a document with one piece written, "
                "its others in rows under --min-fill")
    if part > 0:
        return (words + f"; compare's docs cut: {s.docs_split:,}, with the "
                f"{plural(part, 'document')} of one piece written, the others in rows under "
                "--min-fill")
    return words


def _width(values, minimum: int) -> int:
    return max([minimum] + [len(v) for v in values])


def _cell(value) -> str:
    """A source value as the text table shows it: as it is, or quoted with escapes as JSON
    writes it (``""``, ``"a\\tb"``) when it would not show as itself in a column: empty, a
    character that is not printable (a tab, a newline), leading or trailing whitespace, or a
    leading quote."""
    if not isinstance(value, str):
        return str(value)
    if value and value.isprintable() and value == value.strip() and not value.startswith('"'):
        return value
    return json.dumps(value, ensure_ascii=False)


def _display_width(text: str) -> int:
    """Columns ``text`` takes in a terminal: wide East Asian characters two, combining marks
    none."""
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _display_width(text))


def format_packed(a: PackedAnalysis, per_source_limit: int | None = None) -> str:
    """Human table of :func:`analyze_packed` (counts with thousands separators).

    Args:
        per_source_limit: with ``--source-column`` outputs of more sources than this (those
            holding segments in the rows), list only the sources of the most real tokens (the
            rest summed in one line); None: all.
    """
    s = a.stats
    C = s.capacity
    q = _count_quantiles(a.fill_counts)
    # a manifest of before the documents of the rows under --min-fill were counted apart
    recorded = a.min_fill_docs_recorded
    lines = [
        f"packed output {a.path} (capacity {C})",
        f"  rows                      {s.rows:,}  (ceil(tokens/C) = {s.lower_bound_rows:,}, "
        f"extra {s.extra_rows:,})",
        f"  documents                 {a.documents:,} in {plural(s.segments, 'segment')} "
        f"(in: {s.docs_in:,}"
        + (f" read, {s.docs_other_split:,} of them, empty ones included, for the other "
           "--holdout output"
           if s.docs_other_split else "")
        + f", empty skipped {s.docs_empty:,})",
        f"  split                     {s.split_words(a.concat)}",
        f"  cut across segments       {_cut_words(s, a.concat)}",
        f"  tokens dropped            {s.tokens_dropped:,} (every token read and not written: "
        "the truncated tails, the dropped documents' tokens"
        + (", the rows under --min-fill)" if s.rows_dropped else ")"),
        f"  truncated                 {plural(s.docs_truncated, 'document')}, "
        f"{plural(s.tokens_truncated, 'token')} cut",
        f"  dropped                   {s.dropped_words(recorded)}",
        *([f"  rows under --min-fill     {s.under_min_fill_words(recorded)}"]
          if s.rows_dropped else []),
        f"  real tokens               {s.real_tokens:,}",
        f"  padding tokens            {s.padding_tokens:,} "
        f"({percent(s.padding_tokens, s.rows * C, 3)} of rows * C)",
        *([f"  {s.segment_padding_note(a.segment_multiple)}"] if a.segment_multiple > 1 else []),
        f"  effective targets         {s.effective_targets:,} "
        f"({s.targets_per_token:.4f} per real token)",
        *([f"  input                     {s.input_note()}"] if s.input_note() else []),
        f"  attention work (masked)   {s.attention_work:,} token^2 (sum of segment_len^2) = "
        f"{percent(s.attention_work, s.full_attention_work, 2)} "
        f"of the same rows unmasked ({s.full_attention_work:,} = rows * C^2)",
    ]
    if s.rows:  # an output of 0 rows has no fill to show (its JSON quantiles are 0.0)
        lines.append("  fill per row              " + "  ".join(
            f"{k} {percent(q[v], 1)}" for k, v in (("min", "min"), ("p10", "p10"),
                                                   ("median", "p50"), ("max", "max"))))
        lines.append("  rows per fill decile      " + " ".join(
            f"{10 * i}-{10 * i + 10}%:{n:,}" for i, n in enumerate(a.fill_hist)))
    n, nbytes, secs = a.hashed
    if n:
        lines.append(f"  integrity                 sha256 of {plural(n, 'shard')}, "
                     f"{nbytes / 2**20:,.1f} MiB, match the manifest ({secs:.2f} s; --no-hash "
                     "skips it)")
    elif secs or not s.rows:  # hashed, or asked to: an output of no shards has none to check
        lines.append("  integrity                 no shards to check (an output of 0 rows)")
    else:
        lines.append("  integrity                 sha256 not checked (--no-hash): the sizes, "
                     "footers and the page checksums of " + ", ".join(a.columns_read)
                     + " were checked"
                     + (f"; the pages of {', '.join(a.columns_unread)} were not read, so a "
                        "change there goes unseen (verify --no-hash, with its default --scan, "
                        "decodes every column)"
                        if a.columns_unread else ""))
    if a.tokenized is not None:  # packed from packtool tokenize outputs of one tokenizer
        lines.extend(f"  {label:<26}{value}"
                     for label, value in a.tokenized.describe())
    if a.source_column is not None:
        w = max([len("source")] + [_display_width(_cell(p["source"])) for p in a.per_source])
        seg = ", a segment's own padding to its source" if a.segment_multiple > 1 else ""
        held = (f"; {len(a.per_source):,} of the {plural(a.sources_in_table, 'source')} of the "
                "manifest's table hold segments here, the others none"
                if len(a.per_source) < a.sources_in_table else "")
        lines.append(f"  per source ({a.source_column}; rows: those holding one of its segments, "
                     "so a row of several sources counts once for each; a row's padding tail "
                     f"counts to the source of its last segment{seg}){held}")
        lines.append(f"    {_pad('source', w)} {'rows':>10} {'segments':>10} {'real tokens':>14} "
                     f"{'padding':>11} {'targets':>14}")
        shown = a.per_source
        if per_source_limit and len(shown) > per_source_limit:
            shown = sorted(shown, key=lambda p: -p["real_tokens"])[:per_source_limit]
            lines[-2] += f"; the {per_source_limit} of the most real tokens"
        for p in shown:
            lines.append(f"    {_pad(_cell(p['source']), w)} {p['rows']:10,} {p['segments']:10,} "
                         f"{p['real_tokens']:14,} {p['padding_tokens']:11,} "
                         f"{p['effective_targets']:14,}")
        if len(shown) < len(a.per_source):
            rest = [p for p in a.per_source if not any(p is q for q in shown)]
            lines.append(f"    ... {plural(len(rest), 'more source', 'more sources')}, "
                         f"{plural(sum(p['real_tokens'] for p in rest), 'real token')} "
                         "(--per-source-limit 0 lists all; --json holds every one)")
    if a.mismatches:
        for k, (rc, m) in a.mismatches.items():
            where = f"; {a.mismatch_where[k]}" if k in a.mismatch_where else ""
            lines.append(f"  MISMATCH {k}: recounted {rc:,}, manifest {int(m):,}{where}")
    else:
        lines.append("  manifest totals agree with the recount")
    lines.extend(f"  FAULT {f}" for f in a.faults)
    if a.per_bin_asked and not a.per_bin:
        lines.append(f"  total targets {s.effective_targets:,} over {plural(s.rows, 'row')}")
    if a.per_bin:
        w = _width((b["shard"] for b in a.per_bin), len("shard"))
        lines.append(f"  {'shard':{w}} {'row':>7} {'segments':>8} {'real':>7} {'targets':>7}  "
                     "targets per segment")
        for b in a.per_bin:
            lines.append(f"  {b['shard']:{w}} {b['row']:7,} {b['segments']:8,} "
                         f"{b['real_tokens']:7,} {b['targets']:7,}  {b['segment_targets']}")
        listed = len(a.per_bin)
        if listed < s.rows:
            lines.append(f"  (first {listed:,} of {plural(s.rows, 'row')}; --per-bin-limit N "
                         "lists more, 0 lists all)")
        lines.append(f"  total targets {s.effective_targets:,} over {plural(s.rows, 'row')}")
    return "\n".join(lines)


def overflow_kept(rows: list, tokens: int) -> int:
    """Tokens left to pack after ``--overflow truncate|drop`` (the same for every strategy of
    :func:`compare_strategies`; ``--min-fill`` may then leave out more, per strategy)."""
    if not rows:
        return tokens
    r = rows[0]
    return tokens - r["tokens_dropped"] + r.get("tokens_under_min_fill", 0)


def format_compare(rows: list, capacity: int, num_docs: int, tokens: int, *,
                   overflow: str = Overflow.SPLIT, docs_over_capacity: int = 0,
                   docs_empty: int = 0, min_fill: float | None = None,
                   segment_multiple: int = 1) -> str:
    """Human side-by-side table of :func:`compare_strategies`, then which strategy wastes least
    (:func:`least_waste`). Every column is absolute, so rows compare across strategies.

    Args:
        rows: :func:`compare_strategies`' dicts.
        capacity: C.
        num_docs, tokens: documents and tokens read.
        overflow: the ``--overflow`` the dry run planned with (named in the header).
        docs_over_capacity: documents longer than C (named in the header when ``overflow``
            truncates or drops them).
        docs_empty: the documents of ``num_docs`` with no token (named in the header when
            some are: ``pack`` skips them, so ``stats`` counts them apart).
        min_fill: the ``--min-fill`` the dry run planned with (a column of the rows it drops
            when > 0); None: shown when a strategy drops a row.
        segment_multiple: the ``--segment-multiple`` it planned with (named in the header, a
            column of the padding inside rows when > 1).
    """
    min_fill = (any(r["rows_dropped"] for r in rows) if min_fill is None
                else bool(rows) and min_fill > 0)  # a dry run with --min-fill
    truncated = overflow == Overflow.TRUNCATE or any(r["tokens_truncated"] for r in rows)
    dropped = (overflow == Overflow.DROP or min_fill
               or any(r["tokens_dropped"] > r["tokens_truncated"] for r in rows))
    kept = overflow_kept(rows, tokens)
    # millions of token^2 when every figure keeps 3 digits or more there, else exact: a small
    # input's attention work is not shown as 0
    millions = all(r["attention_work"] >= 10**8 for r in rows)
    attention = (("attention M token^2", ",.0f", lambda r: r["attention_work"] / 1e6) if millions
                 else ("attention token^2", ",", lambda r: r["attention_work"]))
    cols = [("strategy", "s", lambda r: r["strategy"]),
            ("rows", ",", lambda r: r["rows"]),
            ("extra rows", ",", lambda r: r["extra_rows"]),
            ("padding tokens", ",", lambda r: r["padding_tokens"]),
            *([("of it in segments", ",", lambda r: r["segment_padding_tokens"])]
              if segment_multiple > 1 else []),
            ("padding %", "s", lambda r: percent(r["padding_tokens"], r["tokens_processed"],
                                                 3)[:-1]),
            ("docs cut", ",", lambda r: r["docs_cut"]),
            ("of them <= C", ",", lambda r: r["docs_cut_below_capacity"]),
            ("effective targets", ",", lambda r: r["effective_targets"]),
            attention]
    lost = []
    if min_fill:
        lost.append(("rows dropped", ",", lambda r: r["rows_dropped"]))
    if truncated:
        lost += [("docs truncated", ",", lambda r: r["docs_truncated"]),
                 ("tokens truncated", ",", lambda r: r["tokens_truncated"])]
    if dropped:
        lost += [("docs dropped", ",", lambda r: r["docs_dropped"])]
    if truncated or dropped:  # every token not written, the truncated ones included
        lost += [("tokens dropped", ",", lambda r: r["tokens_dropped"])]
    at = next(i for i, c in enumerate(cols) if c[0] == "padding %")
    cols[at:at] = lost
    cells = [[format(f(r), spec) for _, spec, f in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(cols)]

    def line(values):
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths)))

    head = (f"dry run: {plural(num_docs, 'document')}, "
            + (f"{docs_empty:,} of them empty, " if docs_empty else "")
            + f"{plural(tokens, 'token')}, capacity {capacity}"
            + (f", each piece padded to a multiple of {segment_multiple} (--segment-multiple "
               f"{segment_multiple})" if segment_multiple > 1 else "") + "; ")
    if kept == tokens:
        head += f"ceil(tokens/C) = {plural(-(-tokens // capacity), 'row')}"
        bound = "ceil(tokens/C)"
    else:
        what = ("cuts {} longer than C to C ({} lost)" if overflow == Overflow.TRUNCATE
                else "leaves out {} longer than C ({})")
        head += (f"--overflow {overflow} " + what.format(plural(docs_over_capacity, "document"),
                                                         plural(tokens - kept, "token"))
                 + f": {plural(kept, 'token')} kept, ceil(tokens kept/C) = "
                 + plural(-(-kept // capacity), "row"))
        bound = "ceil(tokens kept/C)"
    if min_fill:
        bound = "ceil(tokens written/C)"
    out = [head, line([h for h, _, _ in cols])] + [line(c) for c in cells]
    best = least_waste(rows) if rows else None
    if rows and best is None:
        parts = ([f"{plural(tokens - kept, 'token')} lost to --overflow {overflow}"]
                 if tokens > kept else []) + ([f"{plural(kept, 'token')} lost to --min-fill"]
                                              if kept else [])
        out.append(f"no strategy writes a row: {', '.join(parts) or 'no tokens'}; nothing to "
                   "choose between")
    elif best is not None:
        losing = truncated or dropped
        fewest = min(rows, key=_waste)
        # tokens_dropped counts the truncated tails too: named once, with their part
        loss = ((f"{plural(best['tokens_dropped'], 'token')} dropped"
                 + (f" ({best['tokens_truncated']:,} of them truncated), " if truncated else ", "))
                if dropped else f"{plural(best['tokens_truncated'], 'token')} truncated, "
                if truncated else "")
        verdict = (f"least waste: {best['strategy']} "
                   f"({plural(best['padding_tokens'], 'padding token')}, "
                   f"{loss}{plural(best['extra_rows'], 'row')} over {bound}, no document that "
                   "fits in a row cut)" if best["docs_cut_below_capacity"] == 0 else
                   f"least {'waste' if losing else 'padding'}: {best['strategy']} "
                   f"({plural(best['padding_tokens'], 'padding token')}"
                   + (f", {loss[:-2]}" if losing else "")
                   + f", {plural(best['docs_cut_below_capacity'], 'document')} that fit"
                   + ("s" if best['docs_cut_below_capacity'] == 1 else "") + " in a row "
                   "cut)")
        if fewest is not best and _waste(fewest) < _waste(best):
            verdict += (f"; {fewest['strategy']} {'wastes' if losing else 'pads'} less "
                        f"({_waste(fewest):,}) but cuts "
                        f"{plural(fewest['docs_cut_below_capacity'], 'document')} that fit"
                        + ("s" if fewest["docs_cut_below_capacity"] == 1 else "") + " in a row")
        out.append(verdict)
    out.append("padding %: of rows * C; docs cut: documents written in pieces, spread over "
               "several segments" + (" or with a piece in a row under --min-fill" if min_fill
                                     else "")
               + " (of them <= C: ones that fit in one row)"
               + ("; stats' cut across segments counts only those in several segments"
                  if min_fill else "")
               + ";\nattention: sum of segment_len^2 with document masking, in "
               + ("millions of token^2" if millions else "token^2")
               + " (the same units for every strategy)"
               + (f";\nof it in segments: the padding inside rows after each piece "
                  f"(--segment-multiple {segment_multiple}), part of the padding tokens"
                  if segment_multiple > 1 else ""))
    if truncated or dropped:
        out.append("waste: padding plus the tokens truncated or dropped (not written)"
                   + ("; extra rows: over ceil(tokens written/C), each strategy's own (--min-fill "
                      "leaves out different rows)" if min_fill else ""))
    return "\n".join(out)


def require_matplotlib():
    """Import matplotlib with the non-interactive Agg backend and return ``pyplot``.

    Raises:
        MissingDependencyError: matplotlib is not installed (names the extra that brings it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from packtool.errors import MissingDependencyError

        raise MissingDependencyError("--plot needs matplotlib: " + install_hint("plot")) from None
    return plt


def _save(plt, fig, out: str | os.PathLike) -> None:
    """Lay out, render and close a figure, then publish it whole at ``out`` (the format from
    its suffix; a temporary name, then a rename, with Ctrl-C and SIGTERM held meanwhile): a
    stopped or failed save never leaves a partial image or a temporary file. A path that cannot
    be written is an OutputError."""
    import io

    from packtool.location import Location
    from packtool.signals import signals_held

    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=100, format=Path(out).suffix[1:].lower() or None)
    finally:
        plt.close(fig)
    try:
        with signals_held():
            Location.parse(str(out)).publish_bytes(buf.getvalue())
    except OSError as exc:
        raise OutputError(f"{out}: cannot write the plot ({exc.strerror or exc}); choose a "
                          "writable path") from None


def _log_bins(x: np.ndarray, n: int = 50) -> np.ndarray:
    """Log-spaced histogram edges from 1 to max(x) (lengths span several decades)."""
    hi = max(2.0, float(x.max()) if x.size else 2.0)
    return np.unique(np.geomspace(1.0, hi * 1.0001, n + 1))


def _count_scale(ax, any_positive: bool) -> str:
    """Scale the y axis of counts of ``ax``: ``log`` (wide ranges: the few part-filled rows
    show next to the full ones), or, when nothing is positive (no row, no segment), ``linear``
    from 0 to 1: a log axis of no positive value is empty, and matplotlib warns about it.
    Returns the scale set."""
    if any_positive:
        ax.set_yscale("log")
        return "log"
    ax.set_yscale("linear")
    ax.set_ylim(0, 1)
    return "linear"


_STRATEGY_COLORS = {"concat": "tab:gray", "ordered": "tab:orange", "obfd": "tab:blue"}


def plot_packed(a: PackedAnalysis, out: str | os.PathLike) -> None:
    """Write an image (format from the suffix) of a packed output: rows per fill (log count, so
    the few part-filled rows show next to the full ones) and segment lengths (log-spaced bins on
    a log axis, capacity marked). An output of 0 rows gets empty panels on linear axes
    (:func:`_count_scale`), without a matplotlib warning.

    Raises:
        MissingDependencyError: no matplotlib. OutputError: ``out`` cannot be written.
    """
    plt = require_matplotlib()
    s = a.stats
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    fig.suptitle(f"packtool stats {a.path}: {plural(s.rows, 'row')} of C = {s.capacity:,}, "
                 f"{plural(s.padding_tokens, 'padding token')} "
                 f"({percent(s.padding_tokens, s.rows * s.capacity, 2)})")
    ax1.hist(100 * a.row_fill, bins=np.linspace(0, 100, 51), color="tab:blue")
    log = _count_scale(ax1, s.rows > 0)  # no rows: empty axes
    ax1.set(xlabel="row fill: real tokens / C (%)", ylabel=f"rows ({log} scale)",
            title="rows per fill level" if s.rows else "no rows", xlim=(0, 101))
    if a.segment_lengths.size:
        ax2.hist(a.segment_lengths, bins=_log_bins(a.segment_lengths), color="tab:blue")
        ax2.set_xscale("log")
    log = _count_scale(ax2, a.segment_lengths.size > 0)
    ax2.axvline(s.capacity, color="red", ls="--", label=f"capacity {s.capacity:,}")
    ax2.set(xlabel="segment length (tokens" + (", log scale)" if log == "log" else ")"),
            ylabel=f"segments ({log} scale)",
            title="segment lengths (documents and chunks)")
    ax2.legend()
    _save(plt, fig, out)


def plot_compare(lengths: np.ndarray, capacity: int, out: str | os.PathLike,
                 overflow: str = Overflow.SPLIT, *, targets: np.ndarray | None = None,
                 window_docs: int | None = None, min_fill: float = 0.0,
                 segment_multiple: int = 1) -> None:
    """Write an image (format from the suffix) comparing the strategies on the same lengths:
    document lengths (log-spaced bins, log axis, capacity marked); padding tokens per strategy
    (log axis: 0.1 % and 10 % both show, values written on the bars); documents cut that fit in
    one row; rows per fill level per strategy (log count). Every bar and curve is a dict of
    :func:`compare_strategies` with the same options (``window_docs`` adds each strategy in
    windows, in its strategy's colour, its fill curve dashed; ``min_fill`` leaves out the rows
    under it, ``segment_multiple`` pads every piece to a multiple of it), so the image shows
    the figures the
    table prints. When no strategy writes a row the fill panel is empty on a linear axis and
    says so (:func:`_count_scale`), without a matplotlib warning.

    Raises:
        ConfigError, PackingError: as :func:`compare_strategies`. MissingDependencyError: no
        matplotlib. OutputError: ``out`` cannot be written.
    """
    plt = require_matplotlib()
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    res, plans = _compare(lengths, capacity, overflow,
                          (Strategy.CONCAT, Strategy.ORDERED, Strategy.OBFD), targets,
                          window_docs, min_fill, segment_multiple)
    best = least_waste(res)
    verdict = f"least waste: {best['strategy']}" if best else "no strategy writes a row"
    names = [r["strategy"] for r in res]
    # a windowing in the colour of its strategy ("obfd, windows of N": obfd's)
    colors = [_STRATEGY_COLORS.get(n.split(",")[0], "tab:green") for n in names]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    (ax_len, ax_pad), (ax_cut, ax_fill) = axes
    fig.suptitle(f"packtool compare: {plural(lengths.size, 'document')}, "
                 f"{plural(int(lengths.sum()), 'token')}, capacity {capacity:,}; {verdict}")
    pos = lengths[lengths > 0]
    if pos.size:
        ax_len.hist(pos, bins=_log_bins(pos), color="tab:gray")
        ax_len.set_xscale("log")
    ax_len.axvline(capacity, color="red", ls="--", label=f"capacity {capacity:,}")
    ax_len.set(xlabel="document length (tokens" + (", log scale)" if pos.size else ")"),
               ylabel="documents", title="input: document lengths" if pos.size else
               "input: document lengths: every document is empty")
    ax_len.legend()

    pad = [max(r["padding_tokens"], 0) for r in res]
    bars = ax_pad.bar(names, pad, color=colors)
    ax_pad.set_yscale("symlog", linthresh=1)
    ax_pad.set_ylim(0, max(pad + [1]) * 10)
    ax_pad.bar_label(bars, labels=[f"{r['padding_tokens']:,}\n"
                                   f"{plural(r['extra_rows'], 'extra row')}"
                                   for r in res], fontsize=8)
    ax_pad.set(ylabel="padding tokens (log scale)",
               title="waste: padding tokens per strategy (lower is better)")

    cut = [r["docs_cut_below_capacity"] for r in res]
    bars = ax_cut.bar(names, cut, color=colors)
    ax_cut.bar_label(bars, labels=[f"{c:,}" for c in cut], fontsize=8)
    if len(names) > 3:  # the windowings' longer names side by side
        for ax in (ax_pad, ax_cut):
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax_cut.set_ylim(0, max(cut + [1]) * 1.25)
    ax_cut.set(ylabel="documents",
               title="documents cut although they fit in one row (lower is better)")

    edges = np.linspace(0, 100, 51)
    for r, plan, color in zip(res, plans, colors):
        ax_fill.hist(100 * plan.row_lengths() / capacity, bins=edges, histtype="step",
                     color=color, lw=1.5, ls="--" if r["window_docs"] else "-",
                     label=f"{r['strategy']} ({plural(r['rows'], 'row')})")
    log = _count_scale(ax_fill, any(r["rows"] for r in res))  # every row left out: empty axes
    ax_fill.set(xlabel="row fill: real tokens / C (%)", ylabel=f"rows ({log} scale)",
                title="rows per fill level" if log == "log" else
                "rows per fill level: no strategy writes a row", xlim=(0, 101))
    ax_fill.legend(loc="upper left")
    _save(plt, fig, out)
