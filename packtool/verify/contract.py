"""The output contract of a packed row, checked with NumPy alone (no torch, no Numba).

Shape legend: R = rows in a block (one Parquet row group), C = capacity, S = segments of all R
rows together (documents plus one padding segment per padded row, as stored in ``cu_seqlens``).

For every row, ``cu_seqlens`` is taken as the truth (0, strictly increasing, ending at C) and the
other columns are rebuilt from it and compared; its first len(``doc_ids``) spans are the
documents and one more span is the padding tail (``segment_ids`` decide where the padding starts
only on a row whose ``doc_ids`` do not fit its ``cu_seqlens``):

* ``segment_ids``: q on the q-th span while the span starts before the padding, 0 after;
* ``position_ids``: 0..len-1 on every span (the padding tail is one pseudo-segment);
* ``max_seqlen``: the longest span;
* ``doc_ids``: one entry per real span, each a document of the input (0 .. the manifest's
  ``docs_in`` - 1); ``doc_offsets`` and ``source_ids`` (``pack --source-column``), checked
  under the same name: one entry per ``doc_ids`` entry, a source id one of the manifest's table
  (:func:`packtool.recount.ragged_faults`, which also gates the whole-output checks);
* ``labels`` in their convention (stored, or derived by the reader when not stored): unshifted,
  the token except -100 at each span's first token and on padding; shifted, the next token inside
  the span, else -100; so no label pairs the end of one document with the start of the next;
* ``num_targets`` = count(labels != -100) = sum(len - 1) over the real spans.

With ``--segment-multiple N`` (N > 1) the spans of ``cu_seqlens`` are padded documents and
``cu_seqlens_unpadded`` (same number of entries) gives each span's real length a: the first k
spans (k = len(doc_ids)) are documents with a real tokens then span - a padding tokens, span =
ceil(a / N) * N; one more span, the padding tail, may follow (a = span). Every span is a multiple
of N. Segment ids, labels and targets are rebuilt from the real part of each span; positions run
over the whole span (the padding continues its document's positions), so padding inside a row is
never a target and follows its own document only.

Checks run on a whole block at once (one ``np.repeat`` per column, no loop over tokens), so a scan
of every row costs about as much as reading the columns. ``stats`` and ``verify --data-only`` use
this module; it is the only part of verify that works without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packtool.recount import Recount, mark_ids, ragged_faults
from packtool.types import IGNORE_INDEX
from packtool.stats import plural

__all__ = ["CONTRACT_CHECKS", "PADDED_CHECK", "DEFAULT_ROWS", "WHOLE_OUTPUT_CHECKS",
           "ContractScan", "DocumentPieces", "check_block", "check_row_contract",
           "expected_labels", "select_rows", "scan_contract", "segment_multiple_of",
           "NO_SPAN", "pad_target_span", "later_documents"]

#: the column checks, in report order
CONTRACT_CHECKS = ("schema", "input_ids", "cu_seqlens", "cu_seqlens_unpadded", "segment_ids", "position_ids",
                   "max_seqlen", "doc_ids", "labels", "num_targets", "padding", "doc_offsets",
                   "totals")
#: the checks that need every row (the full scan): what one row alone cannot tell
WHOLE_OUTPUT_CHECKS = ("doc_offsets", "totals")
#: the check that applies only to outputs packed with ``--segment-multiple`` N > 1
PADDED_CHECK = "cu_seqlens_unpadded"
#: rows run through the models when ``--rows`` is not given
DEFAULT_ROWS = 8


def select_rows(num_rows: int, n: int | None, seed: int) -> np.ndarray:
    """``n`` distinct row indices spread over ``0..num_rows-1``: one seeded pick per stratum.

    Args:
        num_rows: rows to choose from (>= 0).
        n: how many; ``None`` means :data:`DEFAULT_ROWS`, ``n <= 0`` all rows.
        seed: seeds the pick inside each stratum.

    Returns:
        int64[min(n, num_rows)], sorted ascending.
    """
    n = DEFAULT_ROWS if n is None else n
    if n <= 0 or n >= num_rows:
        return np.arange(num_rows, dtype=np.int64)
    rng = np.random.default_rng(seed)
    edges = np.linspace(0, num_rows, n + 1).astype(np.int64)  # shape: (n + 1,)
    return np.array([rng.integers(edges[i], edges[i + 1]) for i in range(n)], dtype=np.int64)


def expected_labels(input_ids: np.ndarray, span_id: np.ndarray, first: np.ndarray,
                    convention: str) -> np.ndarray:
    """Labels the contract prescribes, from tokens and the spans of ``cu_seqlens``.

    Args:
        input_ids: int[R, C] tokens.
        span_id: int[R, C], the 1-based span of each token, 0 on the padding tail.
        first: bool[R, C], True at the first token of each span.
        convention: ``unshifted`` or ``shifted``.

    Returns:
        int64[R, C] with :data:`~packtool.types.IGNORE_INDEX` where nothing is predicted.

    Raises:
        ValueError: unknown convention.
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    want = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)  # shape: (R, C)
    if convention == "unshifted":
        keep = (span_id != 0) & ~first
        want[keep] = ids[keep]
    elif convention == "shifted":
        nxt = np.zeros(ids.shape, dtype=bool)  # token i+1 is a real token of token i's span
        nxt[:, :-1] = (span_id[:, :-1] != 0) & (span_id[:, 1:] == span_id[:, :-1]) & ~first[:, 1:]
        want[:, :-1][nxt[:, :-1]] = ids[:, 1:][nxt[:, :-1]]
    else:
        raise ValueError(f"labels convention {convention!r}: choose unshifted or shifted")
    return want


def _as_ragged(rows: list) -> tuple[np.ndarray, np.ndarray]:
    """R 1-D arrays as (values int64[n], offsets int64[R + 1] from 0)."""
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))  # shape: (R,)
    vals = (np.concatenate(rows).astype(np.int64, copy=False) if lens.sum()
            else np.zeros(0, dtype=np.int64))
    return vals, np.concatenate([[0], np.cumsum(lens)])


def _first_bad(bad_RC: np.ndarray) -> np.ndarray:
    """int64[R]: first True column per row, -1 where the row has none."""
    any_R = bad_RC.any(axis=1)
    return np.where(any_R, bad_RC.argmax(axis=1), -1)


def check_block(cols: dict, capacity: int, convention: str, label_masked: bool = False,
                segment_multiple: int = 1, *, num_sources: int | None = None,
                pad_id: int | None = None,
                num_docs: int | None = None) -> list[tuple[int, str, int | None, str]]:
    """Contract violations of a block of rows.

    Args:
        cols: ``input_ids``, ``segment_ids``, ``position_ids``, ``labels`` as int[R, C]
            (``labels`` may be absent: then the label check is skipped and ``num_targets`` is
            compared with sum(len - 1) only); ``cu_seqlens``, ``doc_ids`` as lists of R 1-D
            arrays; ``max_seqlen``, ``num_targets`` as int[R].
        capacity: C.
        convention: labels convention, ``unshifted`` or ``shifted``.
        label_masked: the pack read an input labels column (SFT prompt masks), so a label may
            also be -100 where the convention gives a token, never the other way round;
            ``num_targets`` then counts the labels and is at most sum(len - 1).
        segment_multiple: N of ``--segment-multiple``; over 1, ``cols`` must hold
            ``cu_seqlens_unpadded`` (a list of R 1-D arrays) and the padded layout of the module
            docstring is checked.
        num_sources: the size of the manifest's source table when ``cols`` holds
            ``source_ids`` (a list of R arrays): each row needs one id in 0 .. num_sources - 1
            per ``doc_ids`` entry (reported as ``doc_ids``).
        pad_id: the token the pack wrote on padding (the manifest's ``pad_id``): every token
            outside a document's real part (segment 0) must hold it (``padding``); None: not
            checked.
        num_docs: documents read by the pack (the manifest's ``docs_in``): every ``doc_ids``
            entry must be in 0 .. num_docs - 1; None: only >= 0. ``doc_offsets``, when
            ``cols`` holds it (a list of R arrays), needs one entry per ``doc_ids`` entry
            (reported as ``doc_ids``).

    Returns:
        ``[(row in block, check, segment or None, message)]``, at most one per (row, check),
        checks named as in :data:`CONTRACT_CHECKS`.
    """
    C = int(capacity)
    ids = np.asarray(cols["input_ids"]).reshape(-1, C)
    R = ids.shape[0]
    seg = np.asarray(cols["segment_ids"]).reshape(R, C)
    pos = np.asarray(cols["position_ids"]).reshape(R, C)
    cus = [np.asarray(c, dtype=np.int64) for c in cols["cu_seqlens"]]
    N = int(segment_multiple)
    padded = N > 1 or cols.get("cu_seqlens_unpadded") is not None
    curs = ([np.asarray(c, dtype=np.int64) for c in cols["cu_seqlens_unpadded"]] if padded
            else cus)
    out: list[tuple[int, str, int | None, str]] = []
    # token ids: >= 0 everywhere (pack refuses negative ids as input; pad_id is >= 0 too)
    neg = _first_bad(ids < 0)
    for r in np.flatnonzero(neg >= 0):
        j = int(neg[r])
        out.append((int(r), "input_ids", None, f"token {j} holds the negative token id "
                    f"{int(ids[r, j])}; token ids must be >= 0 (pack refuses them as input)"))
    doc_ids = cols.get("doc_ids")
    # provenance lists: lengths and ranges, before any of them is used (reported as doc_ids)
    prov_bad: dict = {}
    if doc_ids is not None:
        ragged = {k: _as_ragged(cols[k]) for k in ("doc_ids", "doc_offsets", "source_ids")
                  if cols.get(k) is not None}
        for r, _, msg in ragged_faults(ragged, C, num_docs=num_docs,
                                       num_sources=num_sources or 0 if "source_ids" in ragged
                                       else 0):
            prov_bad.setdefault(r, msg)
        if "source_ids" in ragged and not num_sources:  # ids but no table to name
            for r in np.flatnonzero(np.diff(ragged["source_ids"][1]) > 0):
                prov_bad.setdefault(int(r), f"source_ids {cols['source_ids'][r].tolist()[:8]}: "
                                    "the manifest has no source table")

    # cu_seqlens: 0 < ... < C strictly increasing; rows that break it are not checked further
    valid = np.array([c.size >= 2 and c[0] == 0 and c[-1] == C and bool(np.all(np.diff(c) > 0))
                      for c in cus], dtype=bool)  # shape: (R,)
    for r in np.flatnonzero(~valid):
        c = cus[r]
        out.append((int(r), "cu_seqlens", None, f"cu_seqlens {c.tolist()[:8]}"
                    f"{'...' if c.size > 8 else ''} must go 0 < ... < C={C} strictly increasing"))
    if padded:
        for r in np.flatnonzero(valid):
            c, u = cus[r], curs[r]
            if N > 1 and np.any(np.diff(c) % N):
                valid[r] = False
                out.append((int(r), "cu_seqlens", None, f"cu_seqlens {c.tolist()[:8]}"
                            f"{'...' if c.size > 8 else ''}: every span must be a multiple of "
                            f"--segment-multiple {N}"))
            elif u.size != c.size or u[0] != 0 or not np.all(np.diff(u) > 0):
                valid[r] = False
                out.append((int(r), "cu_seqlens_unpadded", None, f"cu_seqlens_unpadded "
                            f"{u.tolist()[:8]}{'...' if u.size > 8 else ''} must start at 0 and "
                            f"strictly increase, one entry per entry of cu_seqlens ({c.size})"))
    rows = np.flatnonzero(valid)
    for r in np.flatnonzero(~valid):  # rows with segments are reported below
        if int(r) in prov_bad:
            out.append((int(r), "doc_ids", None, prov_bad[int(r)]))
    if rows.size == 0:
        return out
    starts = [cus[r][:-1] for r in rows]
    n_spans = np.array([s.size for s in starts], dtype=np.int64)  # shape: (Rv,)
    # where the padding tail starts: cu_seqlens decides (its first len(doc_ids) spans are the
    # documents, one more span is the padding), never segment_ids, which are checked against
    # it; only a row whose doc_ids do not fit its cu_seqlens falls back on segment_ids
    real_R = np.count_nonzero(seg[rows], axis=1).astype(np.int64)  # shape: (Rv,)
    # rows whose real tokens are counted from segment_ids (True: compared with cu_seqlens)
    by_seg = np.full(rows.size, doc_ids is None, dtype=bool)  # shape: (Rv,)
    if doc_ids is not None and not padded:  # (padded: the spans of doc_ids, below)
        k_doc = np.array([len(doc_ids[r]) for r in rows], dtype=np.int64)  # shape: (Rv,)
        fits = (n_spans - k_doc >= 0) & (n_spans - k_doc <= 1)
        real_R[fits] = [cus[r][k] for r, k in zip(rows[fits], k_doc[fits])]
        by_seg = ~fits
    starts_S = np.concatenate(starts)  # shape: (S,)
    lens_S = np.concatenate([np.diff(cus[r]) for r in rows])  # shape: (S,)
    row_of_S = np.repeat(np.arange(rows.size), n_spans)  # shape: (S,)
    q_S = np.arange(starts_S.size) - np.repeat(np.cumsum(n_spans) - n_spans, n_spans) + 1
    if not padded:
        real_span_S = starts_S < real_R[row_of_S]  # a span that starts before the padding tail
        real_len_S = np.minimum(starts_S + lens_S, real_R[row_of_S]) - starts_S
    else:  # the first len(doc_ids) spans are documents; a = real tokens of each span
        real_len_S = np.concatenate([np.diff(curs[r]) for r in rows])  # shape: (S,)
        if doc_ids is not None:
            k_doc = np.array([len(doc_ids[r]) for r in rows], dtype=np.int64)
        else:
            k_doc = np.bincount(row_of_S, weights=seg[rows].reshape(-1)[
                np.repeat(np.arange(rows.size) * C, n_spans) + starts_S] != 0,
                minlength=rows.size).astype(np.int64)
        real_span_S = q_S <= k_doc[row_of_S]
        want_span = np.where(real_span_S, -(-real_len_S // N) * N, real_len_S)
        last_S = q_S == n_spans[row_of_S]
        bad_S = (want_span != lens_S) | (~real_span_S & ~last_S)
        seen = set()
        for j in np.flatnonzero(bad_S):
            i = int(row_of_S[j])
            if i in seen:
                continue  # one message per row: its first bad span
            seen.add(i)
            what = ("a document" if real_span_S[j] else "the padding tail" if last_S[j] else
                    "a span after the padding tail")
            out.append((int(rows[i]), "cu_seqlens_unpadded", int(q_S[j]),
                        f"span {int(q_S[j])} ({what}) has {int(real_len_S[j])} real tokens in "
                        f"{int(lens_S[j])} slots; expected {int(want_span[j])} slots (real "
                        f"tokens rounded up to a multiple of {N}, the tail whole)"))
        real_len_S = np.where(real_span_S, np.minimum(real_len_S, lens_S), 0)
    # expected columns, flat over the Rv valid rows (each row's spans cover exactly C tokens)
    span_q = np.repeat(q_S, lens_S).reshape(rows.size, C)
    want_pos = (np.arange(rows.size * C) - np.repeat(
        starts_S + row_of_S * C, lens_S)).reshape(rows.size, C)
    first = want_pos == 0
    in_real = want_pos < np.repeat(real_len_S, lens_S).reshape(rows.size, C)
    span_id = np.where(in_real, np.repeat(np.where(real_span_S, q_S, 0), lens_S).reshape(
        rows.size, C), 0)
    k_R = np.bincount(row_of_S, weights=real_span_S, minlength=rows.size).astype(np.int64)
    span_end_S = starts_S + (real_len_S if padded else lens_S)
    last_real_end = np.zeros(rows.size, dtype=np.int64)
    np.maximum.at(last_real_end, row_of_S[real_span_S], span_end_S[real_span_S])
    if padded:  # real tokens: the sum of the documents' real lengths
        last_real_end = np.bincount(row_of_S, weights=real_len_S,
                                    minlength=rows.size).astype(np.int64)

    def report(check, bad_RC, msg_fn):
        fb = _first_bad(bad_RC)
        for i in np.flatnonzero(fb >= 0):
            j = int(fb[i])
            out.append((int(rows[i]), check, int(span_q[i, j]), msg_fn(i, j)))

    # segment_ids agree with the spans (this also catches a boundary moved in cu_seqlens)
    for i, r in enumerate(rows):
        k = len(doc_ids[r]) if doc_ids is not None else int(k_R[i])
        if k != k_R[i] or (k and by_seg[i] and last_real_end[i] != real_R[i]):
            out.append((int(r), "cu_seqlens", None, f"cu_seqlens {cus[r].tolist()[:10]} does not "
                        f"cut the {int(real_R[i])} real tokens into the {k} documents of "
                        "doc_ids"))
        if doc_ids is not None and len(doc_ids[r]) != k_R[i]:
            out.append((int(r), "doc_ids", None, f"{len(doc_ids[r])} doc_ids for {int(k_R[i])} "
                        "real segments"))
        elif int(r) in prov_bad:
            out.append((int(r), "doc_ids", None, prov_bad[int(r)]))
    seg_v = seg[rows]
    # where each row's padding tail starts by cu_seqlens: the end of its last document's span
    tail_R = np.zeros(rows.size, dtype=np.int64)  # shape: (Rv,)
    np.maximum.at(tail_R, row_of_S[real_span_S], (starts_S + lens_S)[real_span_S])
    first_S = np.cumsum(n_spans) - n_spans  # shape: (Rv,), each row's first span in S

    def seg_message(i, j):
        got, want, q = int(seg_v[i, j]), int(span_id[i, j]), int(span_q[i, j])
        if want == 0 and got != 0:  # padding by cu_seqlens
            if real_span_S[first_S[i] + q - 1]:  # inside a document's span
                return (f"padding token {j} (after the {int(real_len_S[first_S[i] + q - 1])} "
                        f"real tokens of span {q} by cu_seqlens_unpadded) has segment_id {got}, "
                        "must be 0")
            return (f"padding token {j} (after cu_seqlens' last boundary {int(tail_R[i])}) "
                    f"has segment_id {got}, must be 0")
        if got == 0:
            return (f"token {j} is a real token of segment {want} by cu_seqlens, and its "
                    "segment_id 0 marks it as padding")
        return f"segment_id at token {j} is {got}, cu_seqlens says {want}"

    report("segment_ids", seg_v != span_id, seg_message)
    pos_v = pos[rows]
    report("position_ids", pos_v != want_pos,
           lambda i, j: f"position at token {j} is {int(pos_v[i, j])}, expected "
           f"{int(want_pos[i, j])} (positions restart at 0 in every segment"
           + (", padding after a document goes on counting)" if padded else ")"))
    if pad_id is not None:
        ids_v = ids[rows]
        report("padding", (span_id == 0) & (ids_v != pad_id),
               lambda i, j: f"token {j} is padding (segment 0) and holds {int(ids_v[i, j])}; the "
               f"pack wrote pad_id {pad_id} there")
    mx = np.asarray(cols["max_seqlen"]).reshape(-1)[rows].astype(np.int64)
    seg_max = np.zeros(rows.size, dtype=np.int64)
    np.maximum.at(seg_max, row_of_S, lens_S)
    for i in np.flatnonzero(mx != seg_max):
        out.append((int(rows[i]), "max_seqlen", None, f"max_seqlen {int(mx[i])} != longest "
                    f"segment {int(seg_max[i])}"))
    # effective targets: sum(len - 1) over the real part of the real spans
    targets_R = np.bincount(row_of_S, weights=np.where(real_span_S, real_len_S - 1, 0),
                            minlength=rows.size).astype(np.int64)
    nt = np.asarray(cols["num_targets"]).reshape(-1)[rows].astype(np.int64)
    if cols.get("labels") is not None:
        lab = np.asarray(cols["labels"]).reshape(R, C)[rows].astype(np.int64)
        want = expected_labels(ids[rows], span_id, first, convention)
        # with input label masks a target may be -100 too, never the other way round
        report("labels", (lab != want) & ~(label_masked & (lab == IGNORE_INDEX)),
               lambda i, j: f"label at token {j} is {int(lab[i, j])}, the {convention} "
               f"convention gives {int(want[i, j])}")
        counted = np.count_nonzero(lab != IGNORE_INDEX, axis=1)
        off = (counted > targets_R) | ((counted != targets_R) & (not label_masked))
        for i in np.flatnonzero((nt != counted) | off):
            out.append((int(rows[i]), "num_targets", None, f"num_targets {int(nt[i])}, labels "
                        f"!= -100: {int(counted[i])}, sum(len - 1): {int(targets_R[i])}"))
    else:
        for i in np.flatnonzero(nt != targets_R):
            out.append((int(rows[i]), "num_targets", None, f"num_targets {int(nt[i])} != "
                        f"sum(len - 1) {int(targets_R[i])}"))
    return out


def check_row_contract(row: dict, labels_mode: str, label_masked: bool = False,
                       segment_multiple: int = 1) -> list[tuple[str, int | None, str]]:
    """Contract violations of one packed row as ``(check, segment or None, message)``.

    Args:
        row: one row as :meth:`~packtool.formats.packed.PackedOutput.read_row` returns it
            (per-token columns int[C]); ``labels`` may be absent.
        labels_mode: ``unshifted``, ``shifted``, or ``none`` (labels not checked).
        label_masked: input label masks allowed (see :func:`check_block`).
        segment_multiple: N of ``--segment-multiple`` (see :func:`check_block`).

    Returns:
        The violations of :func:`check_block` for this row, without the row index.
    """
    ids = np.asarray(row["input_ids"])
    cols = {k: np.asarray(row[k])[None] for k in ("input_ids", "segment_ids", "position_ids")}
    if labels_mode != "none" and row.get("labels") is not None:
        cols["labels"] = np.asarray(row["labels"])[None]
    cols.update(cu_seqlens=[np.asarray(row["cu_seqlens"])], doc_ids=[row["doc_ids"]],
                max_seqlen=np.array([row["max_seqlen"]]), num_targets=np.array([row["num_targets"]]))
    if row.get("cu_seqlens_unpadded") is not None:
        cols["cu_seqlens_unpadded"] = [np.asarray(row["cu_seqlens_unpadded"])]
    conv = labels_mode if labels_mode != "none" else "unshifted"
    return [(c, q, m) for _, c, q, m in check_block(cols, ids.shape[0], conv, label_masked,
                                                    segment_multiple)]


class DocumentPieces:
    """What ``doc_ids`` and ``doc_offsets`` of every row say about each document, checked once
    every row was seen (the ``doc_offsets`` check of the full scan).

    A document is laid out as pieces (segments) that tile it from offset 0: the piece at offset
    0 appears once, and every later piece starts where the one before it ends. A piece is
    followed by another only when it fills its row to the end (a document is cut because its
    row is full), so only the pieces at an offset other than 0 and the pieces whose span ends
    at C are kept (at most rows + split pieces), plus one bit per document id for the pieces
    at offset 0. Checked:

    * no two segments hold a document at offset 0 (a duplicated row or segment), always;
    * every piece of a document carries the same ``source_ids`` entry (``pack --source-column``:
      a document comes from one source), always;
    * when the manifest says no planned row was left out (``--min-fill`` drops pieces), every
      document seen has its piece at offset 0, and each later piece starts where the one
      before it ends (no gap, no overlap, no duplicate).

    Not decidable without the input: a whole document lost (its rows gone with the counts
    fixed), a changed document length at the last piece, two ``doc_ids`` of one row swapped.
    """

    def __init__(self, capacity: int) -> None:
        self.C = int(capacity)
        self.start_bits = np.zeros(0, dtype=np.uint8)  # one bit per doc id: a piece at offset 0
        #: (doc, offset, end, global row, source id or -1) of the kept pieces, per block
        self.parts: list = []
        self.twice: tuple | None = None  # (doc, global row) of the first start seen twice
        self.negative: tuple | None = None  # (doc, offset, global row) of a negative offset

    def add(self, block, real_len_S: np.ndarray | None = None,
            span_end_S: np.ndarray | None = None) -> None:
        """Count one row group's segments.

        Args:
            block: a :class:`~packtool.formats.packed.Block` holding ``doc_ids`` and
                ``doc_offsets`` (and ``source_ids``, when the output has them, whose entries
                the pieces of a document must agree on), whose ragged columns passed
                :func:`packtool.recount.ragged_faults`.
            real_len_S: int64[S], the real tokens of each document segment (S = the block's
                ``doc_ids`` entries, in order); None: computed from the block's
                ``cu_seqlens`` (and ``cu_seqlens_unpadded`` when it holds them).
            span_end_S: int64[S], where each segment's span ends in its row (None: as
                ``real_len_S``).
        """
        if real_len_S is None or span_end_S is None:
            real_len_S, span_end_S = _document_segments(
                block, self.C, "cu_seqlens_unpadded" in block.ragged)
        doc, k_off = block.ragged["doc_ids"]
        off = block.ragged["doc_offsets"][0].astype(np.int64)  # shape: (S,)
        if doc.size == 0:
            return
        src = (block.ragged["source_ids"][0].astype(np.int64) if "source_ids" in block.ragged
               else np.full(doc.size, -1, dtype=np.int64))  # shape: (S,)
        doc = doc.astype(np.int64)
        row_S = block.first + np.repeat(np.arange(block.num_rows, dtype=np.int64),
                                        np.diff(k_off))  # shape: (S,), global rows
        if self.negative is None and (off < 0).any():
            j = int(np.argmax(off < 0))
            self.negative = (int(doc[j]), int(off[j]), int(row_S[j]))
        zero = off == 0
        ids = doc[zero]
        if ids.size:
            self.start_bits, u, again = mark_ids(self.start_bits, ids)
            if again.any() and self.twice is None:
                d = int(u[np.argmax(again)])
                self.twice = (d, int(row_S[zero][np.flatnonzero(ids == d)[-1]]))
        keep = ~zero | (span_end_S == self.C)
        if keep.any():
            self.parts.append(np.stack([doc[keep], off[keep], off[keep] + real_len_S[keep],
                                        row_S[keep], src[keep]]))

    def _kept(self) -> np.ndarray:
        """int64[5, kept pieces]: doc, offset, end, global row, source id of every kept piece."""
        return (np.concatenate(self.parts, axis=1) if self.parts
                else np.zeros((5, 0), dtype=np.int64))

    def source_problem(self, locate=None) -> tuple[int, int, str] | None:
        """``(global row, document, message)`` of the first document whose pieces carry two
        ``source_ids`` (each piece compared with the document's piece of the lowest offset);
        None when every document's pieces agree or the output has no ``source_ids``.

        Every piece of a split document is kept (its first fills its row, the later ones are
        at an offset over 0), so no disagreement among them goes unseen.

        Args:
            locate: ``callable(global row) -> str`` naming a row in the message (e.g.
                ``part-00000.parquet row 3``); None: ``row N`` of the whole output.
        """
        doc, off, _, row, src = self._kept()
        if not (src >= 0).any():
            return None
        name = locate or (lambda g: f"row {g}")
        order = np.lexsort((off, doc))
        doc, off, row, src = doc[order], off[order], row[order], src[order]
        head = np.ones(doc.size, dtype=bool)  # first piece (lowest offset) of each document
        head[1:] = doc[1:] != doc[:-1]
        first = np.maximum.accumulate(np.where(head, np.arange(doc.size), 0))  # shape: (K,)
        bad = src != src[first]
        if not bad.any():
            return None
        j = int(np.argmax(bad))
        i, d = int(first[j]), int(doc[j])
        return (int(row[j]), d, f"document {d} has pieces of two sources: its piece at "
                f"doc_offsets {int(off[j])} ({name(int(row[j]))}) has source_id {int(src[j])}, "
                f"its piece at doc_offsets {int(off[i])} ({name(int(row[i]))}) has source_id "
                f"{int(src[i])}; a document comes from one source, so a source id was changed "
                "after packing (the per-source figures count its tokens to the wrong source)")

    def problems(self, seen_bits: np.ndarray, lossless: bool,
                 locate=None) -> list[tuple[int, int, str]]:
        """``[(global row, document, message)]`` (the first of each kind).

        Args:
            seen_bits: uint8, one bit per document id seen in any segment
                (:attr:`packtool.recount.Recount.seen_bits`).
            lossless: no planned row was left out (the manifest's ``rows_dropped`` is 0), so
                every piece of every document seen is in the output.
            locate: names a row in messages that speak of two (:meth:`source_problem`).
        """
        out = []
        if self.negative is not None:
            d, o, r = self.negative
            out.append((r, d, f"document {d} has a piece at doc_offsets {o} (negative)"))
        if self.twice is not None:
            d, r = self.twice
            out.append((r, d, f"document {d} starts (doc_offsets 0) in two segments, the second "
                        "here: a duplicated row or segment (its tokens train twice)"))
        mixed = self.source_problem(locate)
        if mixed is not None:
            out.append(mixed)
        if not lossless:
            return out
        doc, off, end, row, _ = self._kept()  # shape: (kept pieces,) each
        starts = np.zeros(seen_bits.size, dtype=np.uint8)
        starts[:min(self.start_bits.size, seen_bits.size)] = self.start_bits[:seen_bits.size]
        lacking = np.flatnonzero(np.unpackbits(seen_bits & ~starts, bitorder="little"))
        if lacking.size:
            d = int(lacking[0])
            at = np.flatnonzero(doc == d)
            r = int(row[at[np.argmin(off[at])]]) if at.size else -1
            o = int(off[at].min()) if at.size else -1
            out.append((r, d, f"document {d} has no piece at doc_offsets 0 (its first piece "
                        f"here starts at {o}) and no row was left out under --min-fill: an "
                        "offset was changed or its first piece lost"))
        order = np.lexsort((off, doc))
        doc, off, end, row = doc[order], off[order], end[order], row[order]
        same = doc[1:] == doc[:-1]
        broken = np.zeros(doc.size, dtype=bool)  # a later piece not where the previous ends
        broken[1:] = same & (off[1:] != end[:-1])
        first = np.ones(doc.size, dtype=bool)
        first[1:] = ~same
        orphan = first & (off != 0)  # the piece before it neither at offset 0 nor filling its row
        bad = broken | orphan
        if bad.any():
            j = int(np.argmax(bad))
            d = int(doc[j])
            before = (f"the piece before it ends at {int(end[j - 1])}" if broken[j] else
                      "no piece before it fills its row")
            out.append((int(row[j]), d, f"document {d}: its piece at doc_offsets {int(off[j])} "
                        f"({int(end[j] - off[j])} tokens) does not continue it: {before} (a "
                        "piece is missing, duplicated, or its offset changed)"))
        return out


@dataclass
class ContractScan:
    """What a scan of the column contract found."""

    rows_checked: int = 0
    #: check -> ``[(where, message)]`` of every bad row (``where``: shard, row, segment)
    bad: dict = field(default_factory=dict)
    #: global index -> segments (``len(doc_ids)``) of each scanned row
    segments: dict = field(default_factory=dict)
    #: global indices of the scanned rows holding padding (a ``segment_ids`` 0), one int64
    #: array per block read (:meth:`padded_rows`)
    padded: list = field(default_factory=list)
    #: global indices of the scanned rows holding a target (a label other than -100 in the
    #: labels the reader gives), one int64 array per block read (:meth:`target_rows`)
    targeted: list = field(default_factory=list)
    #: global index -> :func:`pad_target_span` of each scanned row holding padding and a target
    pad_target: dict = field(default_factory=dict)
    labels_stored: bool = True
    segment_multiple: int = 1  #: N of ``--segment-multiple`` the output was packed with
    #: the checks of :data:`WHOLE_OUTPUT_CHECKS` that did not run, and why (a scan of some
    #: rows only, or rows whose ``cu_seqlens`` cannot be counted)
    not_run: dict = field(default_factory=dict)
    #: the largest first token (index in its row) of a document after its row's first, over
    #: the scanned rows (0: none holds two documents; :func:`later_documents`)
    far_start: int = 0
    #: the largest end (exclusive index in its row) of such a document's real tokens
    far_end: int = 0

    def padded_rows(self) -> np.ndarray:
        """int64[P], sorted: the global indices of the scanned rows holding padding."""
        if not self.padded:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(self.padded))

    def pad_target_rows(self, window: int) -> np.ndarray:
        """int64[K], sorted: the global indices of the scanned rows holding padding and a target
        that a window of ``window`` tokens holds together (:func:`pad_target_span`)."""
        return np.array(sorted(g for g, n in self.pad_target.items() if n <= window),
                        dtype=np.int64)

    def target_rows(self) -> np.ndarray:
        """int64[T], sorted: the global indices of the scanned rows holding a target."""
        if not self.targeted:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(self.targeted))


#: :func:`pad_target_span` of a row without padding or without a target: no window holds both
NO_SPAN = np.iinfo(np.int64).max


def pad_target_span(labels_RC: np.ndarray, segment_ids_RC: np.ndarray,
                    convention: str) -> np.ndarray:
    """The fewest consecutive tokens of each row that hold both a padding token (a
    ``segment_ids`` 0) and a target with the token it is predicted from: the smallest row window
    (:func:`packtool.verify.checks.row_windows`) in which ``grad_zero_padding`` can measure
    anything (its gradients are looked at in windows holding a target only).

    Args:
        labels_RC: int [R, C], the labels a reader gives (-100: no target).
        segment_ids_RC: int [R, C] (0: padding).
        convention: ``shifted`` (``labels[j]`` is predicted at j: the target takes one token)
            or ``unshifted`` (predicted at j - 1: it takes two).

    Returns:
        int64 [R]: tokens per row; :data:`NO_SPAN` for a row without padding or without a target.
    """
    lab = np.asarray(labels_RC)
    seg = np.asarray(segment_ids_RC)
    R, C = seg.shape
    out = np.full(R, NO_SPAN, dtype=np.int64)
    if not R or not C:
        return out
    tgt = lab != IGNORE_INDEX  # shape: (R, C)
    if convention != "shifted":
        tgt[:, 0] = False  # nothing predicts a row's first token
    pad = seg == 0  # shape: (R, C)
    j = np.broadcast_to(np.arange(C, dtype=np.int64), (R, C))
    big = np.int64(4 * C)
    left = np.maximum.accumulate(np.where(pad, j, -big), axis=1)  # nearest padding at or before j
    right = np.minimum.accumulate(np.where(pad, j, 2 * big)[:, ::-1], axis=1)[:, ::-1]
    extra = 0 if convention == "shifted" else 1  # the token the target is predicted from
    need = np.minimum(j - left + 1 + extra * (left == j), right - j + 1 + extra)  # shape: (R, C)
    need = np.where(tgt, need, big).min(axis=1)
    ok = need <= C
    out[ok] = need[ok]
    return out


def schema_problem(schema, manifest) -> str | None:
    """How an output's schema (the manifest's, which every shard's is checked against when it
    is opened) departs from the contract of the format version it was written as: the columns,
    their order, types and non-nullability :func:`~packtool.formats.schema.packed_schema` gives
    for its capacity, labels, ``--segment-multiple`` and ``--source-column``; None when it
    agrees. Outputs of a format version before 3 are not compared (None); versions 3 and 4
    differ only in what the manifest's totals mean.

    Args:
        schema: ``pyarrow.Schema`` of the output.
        manifest: its :class:`~packtool.formats.manifest.Manifest`.
    """
    from packtool.formats.schema import packed_schema

    if manifest.format_version < 3:  # the schema contract as it has been since version 3
        return None
    labels = manifest.labels.convention if manifest.labels.stored else "none"
    want = packed_schema(manifest.capacity, labels, segment_multiple_of(manifest),
                         sources=manifest.source_column is not None)
    if schema.names != want.names:
        missing = [n for n in want.names if n not in schema.names]
        extra = [n for n in schema.names if n not in want.names]
        return (f"columns {schema.names}, the contract has {want.names}"
                + (f" (missing {missing})" if missing else "")
                + (f" (not in the contract: {extra})" if extra else ""))
    for got, exp in zip(schema, want):
        if not got.type.equals(exp.type, check_metadata=False) or got.nullable != exp.nullable:
            return (f"column {got.name!r} is {got.type}{'' if not got.nullable else ' nullable'}"
                    f", the contract says {exp.type} not nullable")
    return None


def segment_multiple_of(manifest) -> int:
    """N of ``--segment-multiple`` an output was packed with (1 when its options do not say).

    Args:
        manifest: a :class:`~packtool.formats.manifest.Manifest`.
    """
    return int(manifest.options.get("segment_multiple", 1))


def _block_columns(block) -> dict:
    """A :class:`~packtool.formats.packed.Block` as :func:`check_block` takes it: per-token
    int[R, C], ``cu_seqlens`` and ``doc_ids`` as lists of R arrays, scalars int[R]."""
    cols = dict(block.tokens)
    cols.update({k: block.ragged_rows(k) for k in block.ragged})
    cols.update(block.scalars)
    return cols


def scan_contract(reader, convention: str, *, indices=None, progress=None,
                  label_masked: bool = False) -> ContractScan:
    """Check the column contract on every row of a packed output (or on ``indices``).

    The columns are read through the one reader (so the labels checked are the ones training
    gets: stored, or derived by the reader when not stored), and checked against rules rebuilt
    here from ``cu_seqlens`` alone (:func:`check_block`), independently of the reader's.

    Args:
        reader: a :class:`~packtool.formats.packed.PackedOutput`.
        convention: the labels convention asked of the reader and checked (``unshifted`` or
            ``shifted``).
        indices: global row indices to check; None checks every row, row group by row group.
        progress: optional ``callable(str)`` told about the scan.
        label_masked: input label masks allowed (see :func:`check_block`).

    Returns:
        A :class:`ContractScan`.

    Raises:
        SchemaError: the manifest says ``--segment-multiple`` N > 1 and the shards have no
            ``cu_seqlens_unpadded`` column.
    """
    m = reader.manifest
    multiple = segment_multiple_of(m)
    padded = "cu_seqlens_unpadded" in reader.columns
    want = ["input_ids", "segment_ids", "position_ids", "labels", "cu_seqlens", "max_seqlen",
            "num_targets", "doc_ids"] + (["cu_seqlens_unpadded"] if padded else [])
    num_sources = None
    num_docs = m.totals.docs_in
    if m.source_column is not None:
        want.append("source_ids")
        num_sources = len(m.source_values)
    pieces = None
    if "doc_offsets" in reader.columns:
        want.append("doc_offsets")
        pieces = DocumentPieces(reader.capacity)
    pad_id = m.options.get("pad_id")
    scan = ContractScan(labels_stored=reader.labels.stored, segment_multiple=multiple)
    problem = schema_problem(reader.schema, m)
    if problem:  # one schema for every shard (each checked against it when opened)
        scan.bad["schema"] = [({"shard": reader.shards[0]}, problem + ": other readers of the "
                               "contract get other types; rerun the same packtool pack with "
                               "--overwrite")]
    # the one recount of the manifest totals (stats' own), fed the blocks the scan reads
    recount = Recount(reader.capacity, padded=padded,
                      label_masked=label_masked and reader.labels.stored,
                      num_sources=num_sources or 0, num_docs=num_docs,
                      concat=m.options.get("strategy") == "concat",
                      location=reader.location) if indices is None else None
    if indices is not None:
        scan.not_run = {c: "needs every row: the scan checked the sampled rows only (--no-scan)"
                        for c in WHOLE_OUTPUT_CHECKS}
    elif pieces is None:
        scan.not_run["doc_offsets"] = "the output stores no doc_offsets"

    def run(block, local_rows=None):
        cols = _block_columns(block)
        rows = np.arange(block.num_rows) if local_rows is None else np.asarray(local_rows)
        if local_rows is not None:
            cols = {k: ([v[i] for i in rows] if isinstance(v, list) else v[rows])
                    for k, v in cols.items()}
        for i, r in enumerate(rows.tolist()):
            scan.segments[block.first + r] = len(cols["doc_ids"][i])
        start, end = later_documents(block.ragged, reader.capacity, rows)
        scan.far_start, scan.far_end = max(scan.far_start, start), max(scan.far_end, end)
        pad = (np.asarray(cols["segment_ids"]) == 0).any(1)  # shape: (len(rows),)
        if pad.any():
            scan.padded.append(block.first + rows[pad].astype(np.int64))
        has_t = (np.asarray(cols["labels"]) != IGNORE_INDEX).any(1)  # shape: (len(rows),)
        if has_t.any():
            scan.targeted.append(block.first + rows[has_t].astype(np.int64))
        both = np.flatnonzero(pad & has_t)
        if both.size:
            span = pad_target_span(np.asarray(cols["labels"])[both],
                                   np.asarray(cols["segment_ids"])[both], convention)
            for i, n in zip(both.tolist(), span.tolist()):
                if n != NO_SPAN:
                    scan.pad_target[int(block.first + rows[i])] = int(n)
        for i, check, q, msg in check_block(cols, reader.capacity, convention, label_masked,
                                            multiple, num_sources=num_sources, pad_id=pad_id,
                                            num_docs=num_docs):
            r = int(rows[i])
            where = {"shard": block.shard, "row": block.shard_row0 + r,
                     **({"segment": q} if q else {})}
            scan.bad.setdefault(check, []).append((where, msg))
        scan.rows_checked += len(rows)
        if local_rows is None and not scan.not_run.get("totals"):
            if ragged_faults(block.ragged, reader.capacity, num_docs=num_docs,
                             num_sources=num_sources or 0):  # reported by check_block
                scan.not_run.update(dict.fromkeys(WHOLE_OUTPUT_CHECKS, "rows whose cu_seqlens "
                                                  "or doc_ids, doc_offsets, source_ids break "
                                                  "the contract cannot be counted"))
                return
            seg = _document_segments(block, reader.capacity, padded)
            recount.add(block)
            if pieces is not None:
                pieces.add(block, *seg)

    if indices is None:
        for block in reader.iter_blocks(want, convention):
            run(block)
    else:
        by_group: dict = {}
        for g in sorted({int(i) for i in indices}):
            by_group.setdefault(reader.group_of(g), []).append(g)
        for grp, rows in by_group.items():
            block = reader.decode(grp, want, convention)
            run(block, [r - block.first for r in rows])
    if recount is not None and not scan.not_run.get("totals"):
        totals = m.totals.to_dict()
        wrong = {k: v for k, v in recount.mismatches(totals).items()
                 if k != "num_targets_rows_wrong"}  # the num_targets check names those rows
        if wrong:
            text = "; ".join(f"{k} {man:,} in the manifest, {got:,} recounted from the rows"
                             for k, (got, man) in wrong.items())
            scan.bad["totals"] = [(None, f"manifest totals differ from the rows: {text}; "
                                   "trainers read these totals (effective_targets is the loss "
                                   "denominator): rerun the same packtool pack with --overwrite")
                                  ] * len(wrong)
        if pieces is not None and not scan.not_run.get("doc_offsets"):
            lossless = not int(totals.get("rows_dropped", 0))
            def name(g):
                s, r = reader.locate(g)
                return f"{reader.shards[s]} row {r}"

            for row, _, msg in pieces.problems(recount.seen_bits, lossless, name)[:1]:
                s, r = reader.locate(row) if row >= 0 else (0, -1)
                where = {"shard": reader.shards[s], "row": r} if row >= 0 else None
                scan.bad["doc_offsets"] = [(where, msg)]
    if progress:
        bad = sum(len(v) for v in scan.bad.values())
        progress(f"data: {plural(scan.rows_checked, 'row')} checked, "
                 f"{plural(bad, 'contract violation')}")
    return scan


def later_documents(ragged: dict, capacity: int, rows=None) -> tuple[int, int]:
    """Where the documents after each row's first lie, at the farthest, from ``cu_seqlens``
    alone (NumPy, no per-row loop): the ones a model that reads a token's index in its row
    (ALiBi from the index) sees elsewhere than alone.

    Args:
        ragged: a block's ragged columns, name -> (values, offsets int64[R + 1]): ``doc_ids``
            and ``cu_seqlens`` (with ``--segment-multiple`` also ``cu_seqlens_unpadded``, whose
            spans give the real tokens).
        capacity: C (tokens); rows: local row numbers (int[k]) to look at; None: all R.

    Returns:
        ``(start, end)`` in tokens: the largest first token of a row's last document over the
        rows holding two documents or more, and the largest end (exclusive) of such a
        document's real tokens; ``(0, 0)`` when no row holds two. Entries a broken row places
        outside 0 .. C are left out (the column checks report that row).
    """
    cu, cu_off = ragged["cu_seqlens"]
    k = np.diff(ragged["doc_ids"][1])  # documents per row, shape: (R,)
    lo, hi = cu_off[:-1], cu_off[1:]
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
        k, lo, hi = k[rows], lo[rows], hi[rows]
    last = lo + k - 1  # each row's last document's entry, shape: (R,)
    ok = (k >= 2) & (last + 1 < hi)
    if not ok.any():
        return 0, 0
    at = last[ok]
    start = cu[at].astype(np.int64)
    end = cu[at + 1].astype(np.int64)
    if "cu_seqlens_unpadded" in ragged:  # spans padded to N: the real tokens are fewer
        un, un_off = ragged["cu_seqlens_unpadded"]
        ulo, uhi = un_off[:-1], un_off[1:]
        if rows is not None:
            ulo, uhi = ulo[rows], uhi[rows]
        uat = ulo[ok] + k[ok] - 1
        fits = uat + 1 < uhi[ok]
        real = np.zeros_like(start)
        real[fits] = un[uat[fits] + 1].astype(np.int64) - un[uat[fits]]
        end = np.minimum(end, start + real)
    good = (start > 0) & (start < end) & (end <= capacity)
    if not good.any():
        return 0, 0
    return int(start[good].max()), int(end[good].max())


def _document_segments(block, capacity: int, padded: bool):
    """(real tokens int64[S], span end int64[S]) of the S document segments of a block (its
    ``doc_ids`` entries in order); its ragged columns must have passed
    :func:`packtool.recount.ragged_faults` (one ``cu_seqlens`` entry per document plus at most
    the padding tail, 0 .. C, increasing)."""
    cu, cu_off = block.ragged["cu_seqlens"]
    k = np.diff(block.ragged["doc_ids"][1])  # shape: (R,)
    cu64 = cu.astype(np.int64)
    start = np.repeat(cu_off[:-1] - np.append(0, np.cumsum(k)[:-1]), k) + np.arange(k.sum())
    span_end = cu64[start + 1]  # shape: (S,)
    real = span_end - cu64[start]
    if padded:
        un = block.ragged["cu_seqlens_unpadded"][0].astype(np.int64)
        real = un[start + 1] - un[start]
    return real, span_end
