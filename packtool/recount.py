"""The recount of a packed output's manifest totals from its shards, row group by row group.

One owner for the figures a trainer takes from the manifest (the loss denominator among them):
``packtool stats`` reports them and ``packtool verify``'s column scan fails when they differ from
the manifest. Both feed every decoded row group (a :class:`~packtool.formats.packed.Block`) to
one :class:`Recount` and ask it for :meth:`Recount.figures` and :meth:`Recount.mismatches`.

Vectorised per row group (NumPy, no loop over rows or tokens): time is linear in rows and
segments; memory is O(C) for the fill and segment-length counts plus two bits per document id
(the documents seen, and those held by more than one segment).
"""

from __future__ import annotations

import numpy as np

from packtool.types import IGNORE_INDEX

__all__ = ["RECOUNTED", "Recount", "mark_ids"]

#: PackStats fields that can be recounted from the shards (the others only the manifest knows).
RECOUNTED = ("rows", "segments", "real_tokens", "padding_tokens", "effective_targets",
             "attention_work", "docs_cut")


def mark_ids(bits: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Set one bit per id of ``ids`` in the bitset ``bits`` (bit ``i & 7`` of byte ``i >> 3``,
    NumPy's ``bitorder="little"``), growing it as needed.

    Args:
        bits: uint8[n], the bitset so far.
        ids: int[k], k >= 1 non-negative ids (repeats allowed).

    Returns:
        ``(bits, distinct, again)``: the bitset (a new array when it grew), the distinct ids
        (int[d], sorted) and bool[d], True for an id already set before or given more than once
        now.
    """
    distinct, count = np.unique(ids, return_counts=True)  # shape: (d,)
    need = int(distinct[-1]) // 8 + 1
    if need > bits.size:
        bits = np.concatenate([bits, np.zeros(need - bits.size, dtype=np.uint8)])
    byte, bit = distinct >> 3, (1 << (distinct & 7)).astype(np.uint8)
    again = ((bits[byte] & bit) != 0) | (count > 1)
    np.bitwise_or.at(bits, byte, bit)
    return bits, distinct, again


class Recount:
    """Figures of a packed output recounted block by block (module docstring).

    Segment lengths come from ``cu_seqlens`` (the first k differences, k = len(doc_ids); with
    ``--segment-multiple`` the real lengths from ``cu_seqlens_unpadded``); effective targets are
    sum(len - 1) (less the stored labels an input labels column set to -100), checked against
    the ``num_targets`` column row by row; a document is cut when more than one segment holds it
    (its ``doc_ids``): so a duplicated row shows as documents cut that the manifest does not
    count.

    Args:
        capacity: C.
        padded: the output has ``cu_seqlens_unpadded`` (``--segment-multiple`` N > 1).
        label_masked: an input labels column masked targets and the labels are stored: the
            blocks then hold ``labels`` and the targets are counted from them.
        num_sources: size of the manifest's source table (0: no ``source_ids``); per source the
            rows, segments, real tokens, padding and targets are counted too.
        per_bin_limit: list per row its targets and each segment's for at most this many rows
            (None: all; 0: none).
    """

    def __init__(self, capacity: int, *, padded: bool = False, label_masked: bool = False,
                 num_sources: int = 0, per_bin_limit: int | None = 0) -> None:
        self.C = int(capacity)
        self.padded = padded
        self.label_masked = label_masked
        self.n_src = int(num_sources)
        self.per_bin_limit = per_bin_limit
        #: per source id: rows holding it, segments, real tokens, padding, effective targets
        self.by_src = np.zeros((5, self.n_src), dtype=np.int64)  # shape: (5, sources)
        self.rows = self.segs = self.real = self.targets = self.work = 0
        self.bad_num_targets = self.seg_pad = 0
        self.fill_counts = np.zeros(self.C + 1, dtype=np.int64)  # shape: (C + 1,)
        self.seg_counts = np.zeros(self.C + 1, dtype=np.int64)  # shape: (C + 1,)
        # one bit per document id: seen in a segment, seen in more than one (``--min-fill`` can
        # leave a document's later pieces without its first, so offsets alone do not tell)
        self.seen_bits = np.zeros(0, dtype=np.uint8)
        self.cut_bits = np.zeros(0, dtype=np.uint8)
        self.bins: list = []

    def columns(self) -> list[str]:
        """The columns :meth:`add` reads from a block."""
        cols = ["cu_seqlens", "doc_ids", "num_targets"]
        if self.padded:
            cols.append("cu_seqlens_unpadded")
        if self.label_masked:
            cols.append("labels")
        if self.n_src:
            cols.append("source_ids")
        return cols

    def add(self, block) -> None:
        """Count one decoded row group (a :class:`~packtool.formats.packed.Block` holding
        :meth:`columns`)."""
        C, n = self.C, block.num_rows
        cu, cu_off = block.ragged["cu_seqlens"]
        doc, k_off = block.ragged["doc_ids"]
        k = np.diff(k_off)  # shape: (n,), real segments per row
        # index in cu of each real segment's start: row r's segments are cu[o_r .. o_r+k_r]
        start = np.repeat(cu_off[:-1] - k_off[:-1], k) + np.arange(k_off[-1])
        cu64 = cu.astype(np.int64)
        lens = cu64[start + 1] - cu64[start]  # shape: (segments,)
        real_R = cu64[cu_off[:-1] + k]  # shape: (n,), end of the last real segment
        span_end = real_R  # shape: (n,), end of the last segment's span (padding included)
        spans = lens
        if self.padded:  # same offsets as cu_seqlens; spans minus real lengths is the padding
            un64 = block.ragged["cu_seqlens_unpadded"][0].astype(np.int64)
            lens = un64[start + 1] - un64[start]
            real_R = un64[cu_off[:-1] + k]
            self.seg_pad += int((spans - lens).sum())
        seg_t = lens - 1  # shape: (segments,), targets per segment (boundary rule)
        if self.label_masked:
            lab = block.tokens["labels"].reshape(-1)  # shape: (n * C,)
            # shape: (n * C + 1,), targets before each flat position
            cs = np.concatenate([[0], np.cumsum(lab != IGNORE_INDEX, dtype=np.int64)])
            seg_row = np.repeat(np.arange(n, dtype=np.int64) * C, k)
            kept = cs[seg_row + cu64[start + 1]] - cs[seg_row + cu64[start]]
            self.bad_num_targets += int(np.count_nonzero(kept > seg_t))
            seg_t = np.minimum(kept, seg_t)
        row_t = np.add.reduceat(seg_t, k_off[:-1]) if lens.size else np.zeros(n, np.int64)
        row_t[k == 0] = 0  # reduceat's value for empty rows is not a sum
        if self.n_src:
            n_src = self.n_src
            src = block.ragged["source_ids"][0].astype(np.int64)  # shape: (segments,)
            row_of = np.repeat(np.arange(n, dtype=np.int64), k)
            held = np.unique(row_of * n_src + src) % n_src  # one per (row, source) pair
            last = k_off[1:][k > 0] - 1  # each non-empty row's last segment
            self.by_src += np.stack([
                np.bincount(held, minlength=n_src),
                np.bincount(src, minlength=n_src),
                np.bincount(src, weights=lens, minlength=n_src).astype(np.int64),
                (np.bincount(src[last], weights=(C - span_end)[k > 0], minlength=n_src)
                 + np.bincount(src, weights=spans - lens, minlength=n_src)).astype(np.int64),
                np.bincount(src, weights=seg_t, minlength=n_src).astype(np.int64)])
        nt = block.scalars["num_targets"]
        self.bad_num_targets += int(np.count_nonzero(nt != row_t))
        self.rows += n
        self.segs += int(k.sum())
        self.real += int(real_R.sum())
        self.targets += int(row_t.sum())
        self.work += int((lens * lens).sum())
        self.fill_counts += np.bincount(real_R, minlength=C + 1)[:C + 1]
        self.seg_counts += np.bincount(lens, minlength=C + 1)[:C + 1]
        if doc.size:
            self.seen_bits, ids, again = mark_ids(self.seen_bits, doc)
            if again.any():
                self.cut_bits = mark_ids(self.cut_bits, ids[again])[0]
        limit = self.per_bin_limit
        room = n if limit is None else min(n, limit - len(self.bins))
        if room > 0:
            seg_t = np.split(seg_t, k_off[1:-1])
            self.bins.extend({"shard": block.shard, "row": block.shard_row0 + i,
                              "segments": int(k[i]), "real_tokens": int(real_R[i]),
                              "targets": int(row_t[i]), "segment_targets": seg_t[i].tolist()}
                             for i in range(room))

    @property
    def documents(self) -> int:
        """Distinct document ids seen in any segment."""
        return int(np.unpackbits(self.seen_bits).sum())

    def figures(self, totals: dict | None = None) -> dict:
        """The recounted figures (:data:`RECOUNTED`, and ``segment_padding_tokens`` for a
        ``--segment-multiple`` output or when ``totals`` lists it), by ``PackStats`` field."""
        out = {"rows": self.rows, "segments": self.segs, "real_tokens": self.real,
               "padding_tokens": self.rows * self.C - self.real,
               "effective_targets": self.targets, "attention_work": self.work,
               "docs_cut": int(np.unpackbits(self.cut_bits).sum())}
        if self.padded or (totals is not None and "segment_padding_tokens" in totals):
            out["segment_padding_tokens"] = self.seg_pad
        return out

    def mismatches(self, totals: dict) -> dict:
        """``{field: (recounted, manifest)}`` for every recounted figure that differs from the
        manifest's ``totals`` (a dict of the manifest's totals), plus
        ``num_targets_rows_wrong: (rows, 0)`` when some rows' ``num_targets`` column disagrees
        with their segments."""
        out = {k: (v, int(totals[k])) for k, v in self.figures(totals).items()
               if k in totals and int(totals[k]) != v}
        if self.bad_num_targets:
            out["num_targets_rows_wrong"] = (self.bad_num_targets, 0)
        return out
