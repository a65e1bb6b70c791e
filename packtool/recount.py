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

from packtool.errors import ManifestError, row_ref
from packtool.stats import plural
from packtool.types import IGNORE_INDEX

__all__ = ["RECOUNTED", "TIED", "Recount", "mark_ids", "ragged_faults"]

#: PackStats fields that can be recounted from the shards (the others only the manifest knows).
RECOUNTED = ("rows", "segments", "real_tokens", "padding_tokens", "effective_targets",
             "attention_work", "docs_cut")
#: manifest figures no row holds, checked through an identity with recounted figures
#: (:meth:`Recount.mismatches`): ``split_fragments`` and ``docs_split`` from the segments and
#: documents (exact, or bounds when ``--min-fill`` left rows out), ``tokens_in`` and
#: ``docs_empty`` from the tokens and documents written plus those the manifest says were
#: dropped (``tokens_dropped``: every token not written) or held out, ``docs_truncated``
#: against ``tokens_truncated``
TIED = ("split_fragments", "docs_split", "tokens_in", "docs_empty", "docs_truncated",
        "docs_dropped")


def _rows_of(bad: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64[]: the distinct rows (by ``offsets``, int64[R + 1]) holding a True of ``bad``."""
    if not bad.any():
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.searchsorted(offsets, np.flatnonzero(bad), side="right") - 1)


def _show(values: np.ndarray, offsets: np.ndarray, r: int) -> str:
    v = values[offsets[r]:offsets[r + 1]].tolist()
    return f"{v[:8]}{'...' if len(v) > 8 else ''}"


def ragged_faults(ragged: dict, capacity: int, *, num_docs: int | None = None,
                  num_sources: int = 0) -> list[tuple[int, str, str]]:
    """Rows of a block whose ragged columns cannot be counted on: lengths and ranges checked
    before any of them indexes or sizes anything (vectorised over the block).

    Checked for each column present in ``ragged``:

    * ``cu_seqlens``: k + 1 or k + 2 entries (k = ``len(doc_ids)``: the documents, then the
      padding tail), 0 first, C last, strictly increasing;
    * ``cu_seqlens_unpadded``: as many entries as ``cu_seqlens``, 0 first, strictly increasing,
      each real length at most its span of ``cu_seqlens`` (checked when every row of the block
      has the right number of entries);
    * ``doc_ids``: each id in 0 .. ``num_docs`` - 1 (a document of the input);
    * ``doc_offsets``: k entries;
    * ``source_ids``: k entries, each in 0 .. ``num_sources`` - 1 (checked with
      ``num_sources`` > 0).

    Args:
        ragged: name -> (values int[n], offsets int64[R + 1] from 0), holding ``doc_ids``
            (a :class:`~packtool.formats.packed.Block`'s ``ragged``).
        capacity: C.
        num_docs: documents read by the pack (the manifest's ``docs_in``: ``doc_ids`` are
            global input indices, both parts of a ``--holdout`` counted); None: ids only
            checked to be >= 0.
        num_sources: size of the manifest's source table (0: ``source_ids`` not checked).

    Returns:
        ``[(row in block, column, message)]`` sorted by row, at most one per (row, column);
        empty when every row can be counted.
    """
    C = int(capacity)
    doc, k_off = ragged["doc_ids"]
    k = np.diff(k_off)  # shape: (R,)
    out: list[tuple[int, str, str]] = []

    def add(rows, column, msg_fn):
        out.extend((int(r), column, msg_fn(int(r))) for r in rows)

    if doc.size:
        bad = doc < 0 if num_docs is None else (doc < 0) | (doc >= num_docs)
        add(_rows_of(bad, k_off), "doc_ids", lambda r: (
            f"doc_ids {_show(doc, k_off, r)}: each id must be a document of the input, "
            + ("non-negative" if num_docs is None else
               f"0..{int(num_docs) - 1} (the manifest's docs_in)")))
    for name in ("doc_offsets", "source_ids"):
        if name not in ragged or (name == "source_ids" and not num_sources):
            continue
        vals, off = ragged[name]
        n = np.diff(off)
        wrong = n != k
        if name == "source_ids" and vals.size:
            wrong[_rows_of((vals < 0) | (vals >= num_sources), off)] = True
        tail = (f"one id in 0..{int(num_sources) - 1} (the manifest's source table) per entry"
                if name == "source_ids" else "one offset per entry")
        add(np.flatnonzero(wrong), name, lambda r, vals=vals, off=off, tail=tail: (
            f"{name} {_show(vals, off, r)} for {int(k[r])} doc_ids: {tail}"))
    if "cu_seqlens" in ragged:
        cu, cu_off = ragged["cu_seqlens"]
        n = np.diff(cu_off)  # shape: (R,)
        bad = (n - 1 < k) | (n - 1 > k + 1) | (n < 2)
        ok = ~bad
        cu64 = cu.astype(np.int64)
        inside = np.ones(cu64.size, dtype=bool)  # entry i and i + 1 in the same row
        inside[cu_off[1:][n > 0] - 1] = False
        bad[ok] |= (cu64[cu_off[:-1][ok]] != 0) | (cu64[cu_off[1:][ok] - 1] != C)
        if cu64.size > 1:
            bad[_rows_of((np.diff(cu64) <= 0) & inside[:-1], cu_off)] = True
        add(np.flatnonzero(bad), "cu_seqlens", lambda r: (
            f"cu_seqlens {_show(cu, cu_off, r)} for {int(k[r])} doc_ids: one entry per document "
            f"and at most the padding tail, 0 < ... < C={C} strictly increasing"))
        if "cu_seqlens_unpadded" in ragged:
            un, un_off = ragged["cu_seqlens_unpadded"]
            ubad = np.diff(un_off) != n
            if not ubad.any() and un.size:
                un64 = un.astype(np.int64)
                ubad[n > 0] |= un64[un_off[:-1][n > 0]] != 0
                if un.size > 1:
                    du = np.diff(un64)
                    ubad[_rows_of(((du <= 0) | (du > np.diff(cu64))) & inside[:-1],
                                  un_off)] = True
            add(np.flatnonzero(ubad), "cu_seqlens_unpadded", lambda r: (
                f"cu_seqlens_unpadded {_show(un, un_off, r)}: one entry per entry of "
                "cu_seqlens, 0 first, strictly increasing, each real length at most its span"))
    out.sort(key=lambda t: t[0])
    return out


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
        num_docs: documents read by the pack (the manifest's ``docs_in``): every ``doc_ids``
            entry must be below it (None: only >= 0); the bitsets are sized by the ids.
        concat: the output was packed with ``--strategy concat`` (its stream cuts documents
            without counting them split: ``docs_split`` and ``split_fragments`` are 0).
        location: the OUTPUT (a :class:`~packtool.location.Location`): messages name a shard
            by its full path or URI; None: by its file name.

    Raises:
        ManifestError: from :meth:`add`, a row whose ragged columns cannot be counted on
            (:func:`ragged_faults`), naming the shard and row.
    """

    def __init__(self, capacity: int, *, padded: bool = False, label_masked: bool = False,
                 num_sources: int = 0, per_bin_limit: int | None = 0,
                 num_docs: int | None = None, concat: bool = False, location=None) -> None:
        self.C = int(capacity)
        self.location = location
        self.num_docs = num_docs
        self.concat = concat
        self.padded = padded
        self.label_masked = label_masked
        self.n_src = int(num_sources)
        self.per_bin_limit = per_bin_limit
        #: per source id: rows holding it, segments, real tokens, padding, effective targets
        self.by_src = np.zeros((5, self.n_src), dtype=np.int64)  # shape: (5, sources)
        self.rows = self.segs = self.real = self.targets = self.work = 0
        self.bad_num_targets = self.seg_pad = 0
        #: where ``num_targets`` (or a segment's labels) first disagrees with the segments:
        #: (shard, row in the shard, what it holds against what they give); None while none
        self.first_bad_num_targets: tuple | None = None
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
        :meth:`columns`).

        Raises:
            ManifestError: a row whose ``cu_seqlens``, ``cu_seqlens_unpadded``, ``doc_ids`` or
                ``source_ids`` break the contract (:func:`ragged_faults`): nothing of the block
                is counted. ``doc_ids`` and ``source_ids`` are held to the manifest's
                ``docs_in`` and source table, so for them the message says the manifest or the
                shards changed.
        """
        faults = ragged_faults(block.ragged, self.C, num_docs=self.num_docs,
                               num_sources=self.n_src)
        if faults:
            r, column, msg = faults[0]
            changed = {"doc_ids": "the manifest's totals or the shards were",
                       "source_ids": "the manifest's source table or the shards were"
                       }.get(column, "the shards were")
            shard = (block.shard if self.location is None
                     else self.location.join(block.shard).display)
            raise ManifestError(f"{shard}: {row_ref(block.shard_row0 + r)}: {msg}; {changed} "
                                "changed after packing: rerun the same packtool pack with "
                                "--overwrite")
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
            over = kept > seg_t  # shape: (segments,): more labels than len - 1
            self.bad_num_targets += int(np.count_nonzero(over))
            if over.any() and self.first_bad_num_targets is None:
                j = int(np.argmax(over))
                i = int(np.searchsorted(k_off, j, side="right") - 1)
                self.first_bad_num_targets = (
                    block.shard, block.shard_row0 + i,
                    f"segment {j - int(k_off[i]) + 1} holds {plural(int(kept[j]), 'label')} "
                    f"!= -100, more than its {plural(int(seg_t[j]) + 1, 'token')} less one")
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
        wrong = nt != row_t  # shape: (n,)
        self.bad_num_targets += int(np.count_nonzero(wrong))
        if wrong.any() and self.first_bad_num_targets is None:
            i = int(np.argmax(wrong))
            self.first_bad_num_targets = (
                block.shard, block.shard_row0 + i, f"num_targets {int(nt[i])}, its segments "
                f"give {int(row_t[i])} (sum(len - 1)"
                + (", less the labels an input labels column set to -100)" if self.label_masked
                   else ")"))
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
        manifest's ``totals`` (a dict of the manifest's totals), then every figure of
        :data:`TIED` that breaks its identity (:meth:`tied`), plus
        ``num_targets_rows_wrong: (rows, 0)`` when some rows' ``num_targets`` column disagrees
        with their segments."""
        out = {k: (v, int(totals[k])) for k, v in self.figures(totals).items()
               if k in totals and int(totals[k]) != v}
        out.update(self.tied(totals))
        if self.bad_num_targets:
            out["num_targets_rows_wrong"] = (self.bad_num_targets, 0)
        return out

    def mismatch_where(self) -> dict:
        """``{name: text}``: where a mismatch of :meth:`mismatches` that rows hold first shows
        (``num_targets_rows_wrong``: how many, and the first shard and row with what it
        stores against what its segments give); empty when there is none."""
        if self.first_bad_num_targets is None:
            return {}
        shard, row, what = self.first_bad_num_targets
        return {"num_targets_rows_wrong": f"the first at {shard} row {row}: {what}"}

    def tied(self, totals: dict) -> dict:
        """``{name: (expected, manifest)}`` for each manifest figure of :data:`TIED` that breaks
        its identity with the rows recounted (a name says the identity; ``expected`` is the
        figure it gives, or the bound crossed). Figures an older manifest lacks are skipped.

        * ``split_fragments`` = segments - documents (every piece of a split document beyond
          its first in the rows; 0 with ``--strategy concat``, whose cuts are ``docs_cut``);
        * ``docs_split`` = documents in more than one segment (``docs_cut``) when no planned row
          was left out; with ``--min-fill`` rows left out, between that and the documents seen
          (a split document may keep one piece); 0 with ``concat``;
        * ``tokens_in`` = real tokens + ``tokens_dropped`` (every token not written: the
          truncated tails, the dropped documents' tokens and the rows under ``--min-fill``;
          the tokens of the other ``--holdout`` part are not in ``tokens_in``);
        * ``docs_empty`` = ``docs_in`` - ``docs_other_split`` - ``docs_dropped`` - documents
          seen (empty documents leave no row: this ties the four, it does not count them);
        * ``docs_truncated``: at most ``tokens_truncated``, and > 0 when they are;
          ``docs_dropped``: at most the tokens they and the rows under ``--min-fill`` held
          (``tokens_dropped`` - ``tokens_truncated``, which is at least 0).
        """
        need = ("segments", "docs_in", "docs_empty", "docs_split", "split_fragments",
                "docs_truncated", "tokens_truncated", "docs_dropped", "tokens_dropped",
                "tokens_in", "docs_other_split")
        if any(k not in totals for k in need):
            return {}
        t = {k: int(totals[k]) for k in need}
        docs, real = self.documents, self.real
        cut = int(np.unpackbits(self.cut_bits).sum())
        out = {}
        frag = 0 if self.concat else self.segs - docs
        if t["split_fragments"] != frag:
            out["split_fragments (= segments - documents)"] = (frag, t["split_fragments"])
        split = t["docs_split"]
        lossy = int(totals.get("rows_dropped", 0)) > 0
        if self.concat:
            if split:
                out["docs_split (0 with --strategy concat)"] = (0, split)
        elif not lossy and split != cut:
            out["docs_split (= docs_cut)"] = (cut, split)
        elif lossy and not cut <= split <= docs:
            out["docs_split (>= docs_cut, <= documents)"] = (cut if split < cut else docs, split)
        tok = real + t["tokens_dropped"]
        if t["tokens_in"] != tok:
            out["tokens_in (= real_tokens + tokens_dropped)"] = (tok, t["tokens_in"])
        if t["tokens_dropped"] < t["tokens_truncated"]:
            out["tokens_dropped (>= tokens_truncated, which it counts)"] = (
                t["tokens_truncated"], t["tokens_dropped"])
        empty = t["docs_in"] - t["docs_other_split"] - t["docs_dropped"] - docs
        if t["docs_empty"] != empty:
            out["docs_empty (= docs_in - docs_other_split - docs_dropped - documents)"] = (
                empty, t["docs_empty"])
        of_docs = max(t["tokens_dropped"] - t["tokens_truncated"], 0)
        for what, n, says in (("truncated", t["tokens_truncated"], "tokens_truncated"),
                              ("dropped", of_docs, "tokens_dropped - tokens_truncated")):
            d = t[f"docs_{what}"]
            if d > n or (n and not d and what == "truncated"):
                out[f"docs_{what} (<= {says}"
                    + (", > 0 when they are)" if what == "truncated" else ")")] = (
                    min(d, n) if d > n else 1, d)
        return out
