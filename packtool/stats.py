"""Packing statistics: plain counts that merge with ``+``; ratios are derived.

``effective_targets`` is the number of labels != -100, i.e. sum over segments of (len - 1), less
the tokens an input labels column set to -100 (SFT prompts): the denominator of a token-mean
loss. It differs from real tokens (one per segment less) and from
the tensor size (rows * C).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import numpy as np

__all__ = ["PackStats", "split_warning", "COUNTS_REVISION", "RATIO_DECIMALS", "json_ratio",
           "json_percent", "percent", "plural"]

#: What the saved counts mean (recorded beside them where a later packtool reads them back:
#: the manifest, through its format version, and a killed pack's finished windows).
#: 1: ``tokens_dropped`` left out the tails ``--overflow truncate`` cut (only in
#: ``tokens_truncated``). 2: ``tokens_dropped`` counts every token read and not written.
COUNTS_REVISION = 2

#: Decimals every ratio of a JSON report keeps (``stats``, ``compare``, ``pack --json`` and the
#: manifest's totals): no float noise, one rule everywhere. A percentage keeps two fewer, the
#: same precision of the whole. Counts are never rounded: they stay exact integers.
RATIO_DECIMALS = 6


def json_ratio(value: float) -> float:
    """A ratio (a fraction such as a fill, or a quotient such as targets per token) as every
    JSON report writes it: a float rounded to :data:`RATIO_DECIMALS` decimals."""
    return round(float(value), RATIO_DECIMALS)


def json_percent(value: float) -> float:
    """A percentage (0 .. 100) as every JSON report writes it: rounded to
    :data:`RATIO_DECIMALS` - 2 decimals, the precision :func:`json_ratio` gives its fraction."""
    return round(float(value), RATIO_DECIMALS - 2)


def percent(part: float, whole: float, decimals: int = 1) -> str:
    """``part`` of ``whole`` as every text report prints a percentage: ``"12.3%"`` with
    ``decimals`` decimals, never rounded to 0 or 100 when it is not exactly that (13,193 of
    13,197 is ``">99.9%"``, 1 of 100,000 ``"<0.1%"``). ``whole`` 0 gives ``"0.0%"``."""
    if not whole:
        return f"{0:.{decimals}f}%"
    value = 100 * part / whole
    shown = f"{value:.{decimals}f}"
    step = 10.0 ** -decimals
    if 0 < part < whole:
        if float(shown) >= 100:
            return f">{100 - step:.{decimals}f}%"
        if float(shown) <= 0:
            return f"<{step:.{decimals}f}%"
    return shown + "%"


def plural(count: int, noun: str, nouns: str | None = None, *, signed: bool = False) -> str:
    """``count`` with thousands separators and ``noun``, or ``nouns`` (default ``noun + "s"``)
    when ``count`` is not 1 nor -1: ``"1 row"``, ``"2 rows"``, ``"1,000 documents"``; with
    ``signed``, the count's sign always shown (a difference): ``"+1 row"``, ``"-3 rows"``,
    ``"+0 rows"``. Every report that prints a count before its noun takes the noun from here."""
    return (f"{count:{'+' if signed else ''},} "
            f"{noun if abs(count) == 1 else nouns or noun + 's'}")


#: ``--overflow split`` warns when it splits more than this fraction of the non-empty
#: documents: most documents then lose their context at a cut (and a target per piece).
SPLIT_WARNING_FRACTION = 0.5


#: pack warns when padding is more than this fraction of the rows' tokens (rows x C).
PADDING_WARNING_FRACTION = 0.5


def split_warning(docs_split: int, docs_nonempty: int, capacity: int,
                  threshold: float = SPLIT_WARNING_FRACTION) -> str | None:
    """A loud line when ``--overflow split`` cut more than ``threshold`` (a fraction, default
    one half) of the non-empty documents into pieces of ``capacity`` tokens; None otherwise."""
    if not docs_nonempty or docs_split <= threshold * docs_nonempty:
        return None
    return (f"--overflow split cut {percent(docs_split, docs_nonempty)} of the documents "
            f"({docs_split:,} of {docs_nonempty:,}) into pieces of --capacity {capacity}: "
            "each piece trains without the context before it; a larger --capacity keeps them "
            "whole")


@dataclass(frozen=True)
class PackStats:
    """Counts of one pack (or one shard); merge shards with ``+``."""

    capacity: int = 0  #: tokens per row (C); equal for merged stats
    rows: int = 0  #: packed rows
    segments: int = 0  #: document pieces laid out (a split document counts once per chunk)
    docs_in: int = 0  #: documents read (including empty ones)
    docs_empty: int = 0  #: empty documents, skipped
    docs_split: int = 0  #: documents over capacity split into chunks
    split_fragments: int = 0  #: chunks beyond the first of split documents (each costs a target)
    docs_truncated: int = 0  #: documents cut to capacity (--overflow truncate)
    #: tokens removed by truncation, the tails past C (counted in ``tokens_dropped`` too)
    tokens_truncated: int = 0
    #: documents left out: over capacity (--overflow drop), or every piece in a row under
    #: --min-fill
    docs_dropped: int = 0
    #: every token read that is not written: the truncated tails (``tokens_truncated``), the
    #: tokens of dropped documents and those of the rows under --min-fill
    #: (``tokens_under_min_fill``); ``tokens_in`` = ``real_tokens`` + ``tokens_dropped``
    tokens_dropped: int = 0
    docs_cut: int = 0  #: documents spread over more than one segment
    #: tokens read (after attention-mask removal and --prepend-bos/--append-eos)
    tokens_in: int = 0
    tokens_attention_masked: int = 0  #: input tokens whose attention mask was 0, removed
    tokens_label_masked: int = 0  #: tokens whose input label was -100 (never targets)
    docs_bos_added: int = 0  #: documents given a BOS (--prepend-bos)
    docs_bos_present: int = 0  #: documents already starting with it (not doubled)
    docs_eos_added: int = 0  #: documents given an EOS (--append-eos)
    docs_eos_present: int = 0  #: documents already ending with it (not doubled)
    #: documents of the other part of a ``--holdout`` split, left out of this output (the
    #: held-out ones in the training output, the training ones in the held-out output)
    docs_other_split: int = 0
    tokens_other_split: int = 0  #: their tokens (not counted in ``tokens_in``)
    real_tokens: int = 0  #: non-padding tokens written
    padding_tokens: int = 0  #: padding tokens written
    effective_targets: int = 0  #: labels != -100 (sum of segment_len - 1, less input labels -100)
    attention_work: int = 0  #: sum over segments of len**2: attention score entries with document masking
    #: padding inside rows, after segments (``--segment-multiple`` N > 1; part of padding_tokens)
    segment_padding_tokens: int = 0
    #: rows the same documents take with ``--segment-multiple 1`` (the plan's rows when N = 1)
    rows_without_segment_padding: int = 0
    #: planned rows left out for holding fewer real tokens than ``--min-fill`` asks
    rows_dropped: int = 0
    #: the real tokens of those rows (counted in ``tokens_dropped`` too)
    tokens_under_min_fill: int = 0
    #: documents every piece of which was in those rows, so left out whole (counted in
    #: ``docs_dropped`` too; the others of ``docs_dropped`` are ``--overflow drop``'s)
    docs_under_min_fill: int = 0
    #: those documents' tokens in the rows (part of ``tokens_under_min_fill``; the rest are
    #: pieces of documents written in part)
    doc_tokens_under_min_fill: int = 0

    def __add__(self, other: "PackStats") -> "PackStats":
        if not isinstance(other, PackStats):
            return NotImplemented
        if self.capacity and other.capacity and self.capacity != other.capacity:
            raise ValueError(f"cannot merge stats of capacity {self.capacity} and {other.capacity}")
        merged = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        merged["capacity"] = self.capacity or other.capacity
        return PackStats(**merged)

    @property
    def tokens_lost(self) -> int:
        """Tokens read but not written: :attr:`tokens_dropped` (kept under this name for the
        readers of ``to_dict()`` that know it)."""
        return self.tokens_dropped

    @property
    def tokens_of_dropped_docs(self) -> int:
        """The part of :attr:`tokens_dropped` that dropped documents held (``--overflow drop``;
        not the truncated tails nor the rows under ``--min-fill``)."""
        return self.tokens_dropped - self.tokens_truncated - self.tokens_under_min_fill

    @property
    def docs_dropped_by_overflow(self) -> int:
        """The documents ``--overflow drop`` left out (:attr:`docs_dropped` less those of the
        rows under ``--min-fill``)."""
        return self.docs_dropped - self.docs_under_min_fill

    @property
    def docs_written(self) -> int:
        """Documents with a token in the rows: those read for this output less the empty and
        the dropped ones."""
        return self.docs_in - self.docs_other_split - self.docs_empty - self.docs_dropped

    def dropped_words(self, recorded: bool = True) -> str:
        """The documents left out and their tokens, one set, by cause: ``"6 documents, 13,197
        tokens: 4 documents (13,193 tokens) by --overflow drop, 2 documents (4 tokens) in rows
        under --min-fill"``. ``recorded`` False (a manifest written before the documents of
        the rows under ``--min-fill`` were counted apart): says which part is not known."""
        over, over_tok = self.docs_dropped_by_overflow, self.tokens_of_dropped_docs
        fill, fill_tok = self.docs_under_min_fill, self.doc_tokens_under_min_fill
        if self.rows_dropped and not recorded:
            return (f"{plural(self.docs_dropped, 'document')} (by --overflow drop and in the "
                    f"rows under --min-fill, not counted apart in this output's manifest); "
                    f"{plural(over_tok, 'token')} of them by --overflow drop")
        words = f"{plural(self.docs_dropped, 'document')}, {plural(over_tok + fill_tok, 'token')}"
        if over and fill:
            return (f"{words}: {plural(over, 'document')} ({plural(over_tok, 'token')}) by "
                    f"--overflow drop, {plural(fill, 'document')} ({plural(fill_tok, 'token')}) "
                    "in rows under --min-fill")
        if fill:
            return f"{words}, in rows under --min-fill"
        return words

    def under_min_fill_words(self, recorded: bool = True) -> str:
        """The rows ``--min-fill`` left out and what their tokens were, each count with its
        unit: ``"1 planned row left out, 909 tokens: 4 tokens of the 2 documents dropped, 905
        tokens of documents written in part"`` (``recorded`` False: the first part alone)."""
        words = (f"{plural(self.rows_dropped, 'planned row')} left out, "
                 f"{plural(self.tokens_under_min_fill, 'token')}")
        if not recorded:
            return words
        return (f"{words}: {plural(self.doc_tokens_under_min_fill, 'token')} of the "
                f"{plural(self.docs_under_min_fill, 'document')} dropped, "
                f"{plural(self.tokens_under_min_fill - self.doc_tokens_under_min_fill, 'token')}"
                " of documents written in part")

    def split_words(self, concat: bool) -> str:
        """What ``docs_split`` and ``split_fragments`` count, in words: the plan's split
        documents (after ``--min-fill``: those with a piece written) and the pieces written
        beyond their first; with ``--strategy concat``, that it splits none (its stream is cut
        at row ends: ``docs_cut``)."""
        if concat:
            return ("none: --strategy concat cuts the stream at row ends, it splits no document "
                    "(the documents it cuts are counted as cut across segments)")
        if self.rows_dropped:
            return (f"{plural(self.docs_split, 'document')} in the plan, a piece of each "
                    f"written (+{plural(self.split_fragments, 'piece')} written beyond their "
                    "first)")
        return (f"{plural(self.docs_split, 'document')} (+{plural(self.split_fragments, 'piece')} "
                "beyond their first)")

    def input_note(self) -> str:
        """One line on what masks and BOS/EOS did to the input (empty when none was in
        effect): the tokens an attention mask removed, those input labels and loss masks kept
        out of the targets, and the documents given a BOS or EOS."""
        parts = []
        if self.tokens_attention_masked:
            parts.append(f"attention mask removed {plural(self.tokens_attention_masked, 'token')}")
        if self.tokens_label_masked:
            parts.append(f"input labels -100 and loss masks kept "
                         f"{plural(self.tokens_label_masked, 'token')} out of the targets")
        for what, added, present in (("BOS", self.docs_bos_added, self.docs_bos_present),
                                     ("EOS", self.docs_eos_added, self.docs_eos_present)):
            if added or present:
                parts.append(f"{what} added to {plural(added, 'document')} ({present:,} had it "
                             "already)")
        return "; ".join(parts)

    @property
    def lower_bound_rows(self) -> int:
        """ceil(real_tokens / C): the fewest rows any packer could use."""
        return -(-self.real_tokens // self.capacity) if self.capacity else 0

    @property
    def extra_rows(self) -> int:
        """Rows over :attr:`lower_bound_rows`."""
        return self.rows - self.lower_bound_rows

    @property
    def padding_fraction(self) -> float:
        """padding_tokens / (rows * C)."""
        slots = self.rows * self.capacity
        return self.padding_tokens / slots if slots else 0.0

    @property
    def fill(self) -> float:
        """real_tokens / (rows * C)."""
        slots = self.rows * self.capacity
        return self.real_tokens / slots if slots else 0.0

    @property
    def targets_per_token(self) -> float:
        """effective_targets / real_tokens."""
        return self.effective_targets / self.real_tokens if self.real_tokens else 0.0

    @property
    def full_attention_work(self) -> int:
        """Attention score entries of full rows without document masking: rows * C**2."""
        return self.rows * self.capacity**2

    def to_dict(self) -> dict:
        """Counts (ints) plus derived figures, JSON-ready: the ratios ``padding_fraction``,
        ``fill`` and ``targets_per_token`` rounded by :func:`json_ratio` (the properties keep
        every digit)."""
        d = asdict(self)
        d.update(
            lower_bound_rows=self.lower_bound_rows,
            extra_rows=self.extra_rows,
            padding_fraction=json_ratio(self.padding_fraction),
            fill=json_ratio(self.fill),
            targets_per_token=json_ratio(self.targets_per_token),
            tokens_lost=self.tokens_lost,
            full_attention_work=self.full_attention_work,
        )
        return d

    @classmethod
    def from_plan(cls, plan) -> "PackStats":
        """Every count of a whole plan, from the plan alone (no tokens needed).

        Args:
            plan: a :class:`packtool.core.packing.PackPlan` (capacity C, ``seg_len`` int64[S],
                ``counts``: documents/tokens read, skipped, split, truncated, dropped, cut).

        Returns:
            The plan's counts: rows, segments, real and padding tokens, effective targets
            (sum of len - 1), attention work (sum of len**2) and the padding inside rows
            (``plan.segment_multiple`` > 1; ``rows_without_segment_padding`` is then left 0 for
            the caller to fill), plus ``plan.counts``.
        """
        seg_len = plan.seg_len
        real = int(seg_len.sum())
        padded = getattr(plan, "segment_multiple", 1) > 1
        return cls(capacity=plan.capacity, rows=plan.num_rows, segments=plan.num_segments,
                   real_tokens=real, padding_tokens=plan.num_rows * plan.capacity - real,
                   effective_targets=real - plan.num_segments,
                   attention_work=int(np.dot(seg_len, seg_len)),
                   segment_padding_tokens=plan.segment_padding() if padded else 0,
                   rows_without_segment_padding=0 if padded else plan.num_rows,
                   ) + cls.from_dict(plan.counts)

    def segment_padding_note(self, multiple: int) -> str:
        """One line: what ``--segment-multiple multiple`` costs against N = 1 (the padding inside
        rows, and the rows over those the same documents take with N = 1, when known)."""
        slots = self.rows * self.capacity
        line = (f"segment padding (--segment-multiple {multiple}): "
                f"{plural(self.segment_padding_tokens, 'token')} inside rows "
                f"({percent(self.segment_padding_tokens, slots, 2)} of rows * C)")
        if self.rows_without_segment_padding:
            more = self.rows - self.rows_without_segment_padding
            line += (f"; {plural(self.rows, 'row')} against "
                     f"{self.rows_without_segment_padding:,} with N = 1 "
                     f"({plural(more, 'row', signed=True)}, "
                     f"{plural(more * self.capacity, 'token', signed=True)} per epoch)")
        return line

    def overflow_warning(self, overflow: str, threshold: float = 0.01) -> str | None:
        """A loud line when ``--overflow drop|truncate`` removed more than ``threshold`` (a
        fraction, default 1 %) of the tokens read, or when ``--overflow split`` split most
        documents (:func:`split_warning`); None otherwise."""
        if str(overflow) == "split":
            # this output's non-empty documents (docs_in counts both sides of a --holdout)
            return split_warning(self.docs_split,
                                 self.docs_in - self.docs_other_split - self.docs_empty,
                                 self.capacity)
        lost = self.tokens_dropped - self.tokens_under_min_fill  # --overflow's own
        if not self.tokens_in or lost <= threshold * self.tokens_in:
            return None
        # with --min-fill some dropped documents are its own, not long: only --overflow's
        docs = plural(self.docs_dropped_by_overflow + self.docs_truncated, "document")
        if self.rows_dropped and not (self.docs_under_min_fill or self.doc_tokens_under_min_fill):
            docs = "documents"  # counts of an older manifest: the documents of each cause not apart
        return (f"--overflow {overflow} removed {percent(lost, self.tokens_in)} "
                f"of the tokens ({lost:,} of {self.tokens_in:,}, {docs} "
                "over --capacity); use --overflow split or a larger --capacity to keep them")

    def min_fill_warning(self, min_fill: float, threshold: float = 0.01) -> str | None:
        """A loud line when the rows ``--min-fill`` left out held more than ``threshold`` (a
        fraction, default 1 %) of the tokens read; None otherwise."""
        lost = self.tokens_under_min_fill
        if not self.tokens_in or lost <= threshold * self.tokens_in:
            return None
        return (f"--min-fill {min_fill:g} left out {plural(self.rows_dropped, 'planned row')}: "
                f"{percent(lost, self.tokens_in)} "
                f"of the tokens read ({lost:,} of {self.tokens_in:,}) are not written; lower "
                "--min-fill to keep them")

    def padding_warning(self, threshold: float = PADDING_WARNING_FRACTION) -> str | None:
        """A loud line when padding is more than ``threshold`` (a fraction, default one half)
        of the rows' tokens (rows x C): most of every step is then spent on padding, as when C
        is larger than the documents can fill (one row of 82 % padding, C above the whole
        input); None otherwise."""
        slots = self.rows * self.capacity
        if not slots or self.padding_tokens <= threshold * slots:
            return None
        return (f"padding is {percent(self.padding_tokens, slots)} of the rows' tokens "
                f"({self.padding_tokens:,} of {slots:,} in {plural(self.rows, 'row')} of "
                f"--capacity {self.capacity}): the documents fill rows of this size poorly; a "
                "smaller --capacity wastes less (packtool compare shows the padding of each "
                "capacity before packing)")

    def warnings(self, overflow: str, min_fill: float) -> list[str]:
        """The loud lines ``pack --overflow overflow --min-fill min_fill`` prints for these
        counts (:meth:`overflow_warning`, then :meth:`min_fill_warning`, then
        :meth:`padding_warning`, then :meth:`no_targets_warning`); ``compare`` prints the same
        for each strategy's dry run (its counts with the targets and ``tokens_label_masked`` of
        the input)."""
        return [w for w in (self.overflow_warning(str(overflow)),
                            self.min_fill_warning(min_fill), self.padding_warning(),
                            self.no_targets_warning()) if w]

    def output_warnings(self, options) -> list[str]:
        """The loud lines a reader of a packed output with these totals prints (``stats``,
        ``export``): :meth:`no_targets_warning`, and for an output of 0 rows the lines its pack
        gave (:meth:`warnings` with the ``overflow`` and ``min_fill`` of ``options``, the
        manifest's options), which say why nothing was written."""
        if self.rows == 0:  # no row, no token: no_targets_warning says nothing of it
            return self.warnings(str(options.get("overflow", "split")),
                                 float(options.get("min_fill") or 0.0))
        return [w for w in (self.no_targets_warning(),) if w]

    def no_targets_warning(self) -> str | None:
        """A loud line when the rows hold tokens but not one effective target (every label
        -100): the denominator of a token-mean loss is 0, so training on them divides by zero
        or learns nothing. Names why: the input labels and loss masks, or segments of one token
        (each segment has one target fewer than its tokens). None otherwise, and for an output
        of no tokens (the overflow and min-fill warnings speak of those)."""
        if self.effective_targets or not self.real_tokens:
            return None
        if self.tokens_label_masked >= self.tokens_in:
            why = ("every token read has input label -100 or loss mask 0; check the labels and "
                   "loss-mask columns (--labels-column / --loss-mask-column none ignores one)")
        elif self.tokens_label_masked:
            why = (f"input labels -100 and loss masks kept {self.tokens_label_masked:,} of the "
                   f"{plural(self.tokens_in, 'token')} read out of the targets, and each segment "
                   "has one target fewer than its tokens; check the labels and loss-mask "
                   "columns")
        else:
            why = ("every segment holds one token, and each segment has one target fewer than "
                   "its tokens")
        return (f"no effective targets: all {self.real_tokens:,} packed tokens have label -100, "
                f"so a token-mean loss over them divides by 0; {why}")

    @classmethod
    def from_dict(cls, d: dict, revision: int = COUNTS_REVISION) -> "PackStats":
        """Inverse of :meth:`to_dict` (derived figures are ignored).

        Args:
            d: counts by field name (ints; missing ones are 0).
            revision: the :data:`COUNTS_REVISION` the counts were saved under; counts of
                revision 1 (``tokens_dropped`` without the truncated tails) are converted.
        """
        stats = cls(**{f.name: int(d[f.name]) for f in fields(cls) if f.name in d})
        if revision < 2:
            stats = replace(stats, tokens_dropped=stats.tokens_dropped + stats.tokens_truncated)
        return stats
