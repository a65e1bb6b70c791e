"""Slow, obviously-correct twins of the packer and the layout, for tests.

Plain Python lists and loops, no numpy tricks. Each function mirrors one public function:
:func:`reference_pack` <-> :func:`packtool.core.packing.pack_lengths` and
:func:`reference_layout` <-> :func:`packtool.core.layout.layout_rows` (with ``targets``: and
:func:`packtool.core.masks.mask_labels`), :func:`reference_drop_masked` <->
:func:`packtool.core.masks.drop_masked_tokens`, :func:`reference_inner_mask_zeros` <->
:func:`packtool.core.masks.inner_mask_zeros`, :func:`reference_boundary_tokens` <->
:func:`packtool.core.masks.add_boundary_tokens`, :func:`reference_prepare_documents` <->
:func:`packtool.core.masks.prepare_documents`, :func:`reference_gather_segments` <->
:func:`packtool.core.layout.gather_segments`, :func:`reference_row_structure` <->
:func:`packtool.core.structure.row_structure`.
"""

from __future__ import annotations

__all__ = ["reference_chunks", "reference_pack", "reference_layout", "reference_drop_masked",
           "reference_inner_mask_zeros", "reference_boundary_tokens",
           "reference_prepare_documents", "reference_gather_segments",
           "reference_row_structure"]

IGNORE = -100


def reference_chunks(lengths, capacity, overflow="split"):
    """[(doc, offset, length)] in document-then-chunk order after the overflow policy."""
    chunks = []
    for doc, length in enumerate(lengths):
        if length == 0:
            continue
        if length <= capacity:
            chunks.append((doc, 0, length))
        elif overflow == "split":
            for off in range(0, length, capacity):
                chunks.append((doc, off, min(capacity, length - off)))
        elif overflow == "truncate":
            chunks.append((doc, 0, capacity))
        elif overflow == "drop":
            pass
        else:
            raise ValueError(f"document {doc} longer than capacity")
    return chunks


def reference_overflow_counts(lengths, capacity, overflow="split"):
    """What the overflow policy leaves out, counted from :func:`reference_chunks`: a dict of
    ``docs_truncated``, ``tokens_truncated`` (the tails past ``capacity``), ``docs_dropped`` and
    ``tokens_dropped``: every token of ``lengths`` that no chunk holds (the truncated tails and
    the dropped documents' tokens), so sum(lengths) = tokens in chunks + ``tokens_dropped``."""
    chunks = reference_chunks(lengths, capacity, overflow)
    kept = {}
    for doc, _, length in chunks:
        kept[doc] = kept.get(doc, 0) + length
    truncated = [d for d, n in enumerate(lengths) if d in kept and kept[d] < n]
    dropped = [d for d, n in enumerate(lengths) if n and d not in kept]
    return {"docs_truncated": len(truncated),
            "tokens_truncated": sum(lengths[d] - kept[d] for d in truncated),
            "docs_dropped": len(dropped),
            "tokens_dropped": sum(lengths) - sum(kept.values())}


def reference_pack(lengths, capacity, strategy="obfd", overflow="split", segment_multiple=1):
    """Rows as lists of (doc, offset, length) segments, in layout order.

    obfd: scan every bin; take the one with the least remaining capacity that fits; among equal
    remaining capacities, the one whose remaining capacity changed most recently. O(N * bins).

    segment_multiple N: every document is planned as if it were ``ceil(L / N) * N`` tokens long,
    and each segment then keeps only the real tokens it covers.
    """
    lengths = [int(x) for x in lengths]
    if segment_multiple > 1:
        padded = [-(-x // segment_multiple) * segment_multiple for x in lengths]
        rows = reference_pack(padded, capacity, strategy, overflow)
        return [[(d, o, min(n, lengths[d] - o)) for d, o, n in row] for row in rows]
    if strategy == "concat":
        cap = max([capacity] + lengths) if overflow in ("split", "error") else capacity
        chunks = reference_chunks(lengths, cap, overflow)
        rows, row, used = [], [], 0
        for doc, _, length in chunks:
            off = 0
            while off < length:
                if used == capacity:
                    rows.append(row)
                    row, used = [], 0
                take = min(length - off, capacity - used)
                row.append((doc, off, take))
                used += take
                off += take
        if row:
            rows.append(row)
        return rows
    chunks = reference_chunks(lengths, capacity, overflow)
    if strategy == "ordered":
        rows, used = [], capacity
        for chunk in chunks:
            if chunk[2] > capacity - used:
                rows.append([])
                used = 0
            rows[-1].append(chunk)
            used += chunk[2]
        return rows
    # obfd: sort by length descending; Python's sort is stable, so ties keep chunk order
    ordered = sorted(chunks, key=lambda c: -c[2])
    bins = []  # each: [remaining, last_changed_step, segments]
    for step, chunk in enumerate(ordered):
        best = None
        for b in bins:
            if b[0] >= chunk[2]:
                if best is None or b[0] < best[0] or (b[0] == best[0] and b[1] > best[1]):
                    best = b
        if best is None:
            best = [capacity, step, []]
            bins.append(best)
        best[0] -= chunk[2]
        best[1] = step
        best[2].append(chunk)
    return [b[2] for b in bins]


def reference_drop_underfilled(rows, min_tokens):
    """``rows`` (as :func:`reference_pack` gives them) without those holding fewer than
    ``min_tokens`` real tokens, and what was lost: ``(kept, rows_dropped, tokens_under_min_fill,
    docs_dropped, docs_cut, docs_split, split_fragments)`` (the rows' real tokens, which a plan
    counts in its ``tokens_dropped`` too), a document dropped when none of its
    pieces is kept, cut when more than one is; split when the plan gave it more than one piece
    and one is kept, its fragments the kept pieces beyond the first."""
    kept = [row for row in rows if sum(n for _, _, n in row) >= min_tokens]
    lost = [row for row in rows if sum(n for _, _, n in row) < min_tokens]
    pieces = {}
    for row in kept:
        for d, _, _ in row:
            pieces[d] = pieces.get(d, 0) + 1
    before = {}
    for row in rows:
        for d, _, _ in row:
            before[d] = before.get(d, 0) + 1
    split = [d for d in pieces if before[d] > 1]
    return (kept, len(lost), sum(n for row in lost for _, _, n in row),
            len(set(before) - set(pieces)), sum(1 for c in pieces.values() if c > 1),
            len(split), sum(pieces[d] - 1 for d in split))


def reference_layout(rows, docs, capacity, pad_id=0, labels="unshifted", targets=None,
                     segment_multiple=1):
    """Columns of each row as plain lists: a list of dicts with the contract's fields.

    ``targets`` (optional, one list of 0/1 per document, like ``docs``): a label whose target
    token is flagged 0 is -100 too, and ``num_targets`` counts the labels that are not -100.

    ``segment_multiple`` N: after each segment, padding up to a multiple of N (pad id, segment
    0, positions going on, label -100); ``cu_seqlens`` holds the spans and, when N > 1,
    ``cu_seqlens_unpadded`` the real lengths summed (the tail counted whole in both).
    """
    out = []
    for row in rows:
        ids, seg, pos, lab, cu, cu_real = [], [], [], [], [0], [0]
        for k, (doc, off, length) in enumerate(row, start=1):
            piece = list(docs[doc][off:off + length])
            flags = [1] * length if targets is None else list(targets[doc][off:off + length])
            for t, tok in enumerate(piece):
                ids.append(tok)
                seg.append(k)
                pos.append(t)
                if labels == "shifted":
                    nxt = t + 1 < length and flags[t + 1]
                    lab.append(piece[t + 1] if nxt else IGNORE)
                else:
                    lab.append(tok if t > 0 and flags[t] else IGNORE)
            t = length
            while t % segment_multiple:
                ids.append(pad_id)
                seg.append(0)
                pos.append(t)
                lab.append(IGNORE)
                t += 1
            cu.append(len(ids))
            cu_real.append(cu_real[-1] + length)
        pad = capacity - len(ids)
        for t in range(pad):
            ids.append(pad_id)
            seg.append(0)
            pos.append(t)
            lab.append(IGNORE)
        if pad:
            cu.append(capacity)
            cu_real.append(cu_real[-1] + pad)
        out.append({
            "input_ids": ids,
            "segment_ids": seg,
            "position_ids": pos,
            "labels": None if labels == "none" else lab,
            "cu_seqlens": cu,
            **({"cu_seqlens_unpadded": cu_real} if segment_multiple > 1 else {}),
            "max_seqlen": max(b - a for a, b in zip(cu, cu[1:])),
            "num_targets": sum(x != IGNORE for x in lab),
            "doc_ids": [d for d, _, _ in row],
            "doc_offsets": [o for _, o, _ in row],
        })
    return out


def reference_drop_masked(docs, masks, targets=None):
    """Documents without their attention-mask-0 tokens: (docs, targets or None, removed)."""
    out_docs, out_targets, removed = [], [], 0
    for i, (doc, mask) in enumerate(zip(docs, masks)):
        out_docs.append([t for t, m in zip(doc, mask) if m])
        if targets is not None:
            out_targets.append([f for f, m in zip(targets[i], mask) if m])
        removed += sum(1 for m in mask if not m)
    return out_docs, (out_targets if targets is not None else None), removed


def reference_inner_mask_zeros(masks):
    """(document, position) of every attention-mask zero with a nonzero entry before it and
    one after it in its document, in order."""
    out = []
    for i, mask in enumerate(masks):
        for j, m in enumerate(mask):
            if not m and any(mask[:j]) and any(mask[j + 1:]):
                out.append((i, j))
    return out


def reference_boundary_tokens(docs, targets=None, bos=None, eos=None):
    """BOS/EOS added to non-empty documents lacking them: (docs, targets, counts dict)."""
    counts = {"bos_added": 0, "bos_present": 0, "eos_added": 0, "eos_present": 0}
    out_docs, out_targets = [], []
    for i, doc in enumerate(docs):
        doc = list(doc)
        flags = None if targets is None else list(targets[i])
        if doc and bos is not None:
            if doc[0] == bos:
                counts["bos_present"] += 1
            else:
                counts["bos_added"] += 1
                doc = [bos] + doc
                flags = None if flags is None else [1] + flags
        if doc and eos is not None:
            if doc[-1] == eos:
                counts["eos_present"] += 1
            else:
                counts["eos_added"] += 1
                doc = doc + [eos]
                flags = None if flags is None else flags + [flags[-1]]
        out_docs.append(doc)
        out_targets.append(flags)
    return out_docs, (out_targets if targets is not None else None), counts


def reference_prepare_documents(docs, keep=None, labels=None, loss_masks=(), bos=None,
                                eos=None, keep_docs=None):
    """Documents as packed, one token at a time: (docs, targets or None).

    A document ``keep_docs`` marks False (the other part of a held-out split) becomes empty; in
    the others a token whose attention mask is 0 is dropped; a kept token is a target unless
    its label is -100 or one of the loss masks is 0; a BOS is added (never a target's flag: 1)
    to a non-empty document not starting with it, an EOS (with the flag of the last token) to
    one not ending with it."""
    with_flags = labels is not None or len(loss_masks) > 0
    out_docs, out_flags = [], []
    for i, doc in enumerate(docs):
        toks, flags = [], []
        if keep_docs is not None and not keep_docs[i]:
            out_docs.append(toks)
            out_flags.append(flags)
            continue
        for j, t in enumerate(doc):
            if keep is not None and not keep[i][j]:
                continue
            learn = labels is None or labels[i][j] != IGNORE
            for m in loss_masks:
                learn = learn and bool(m[i][j])
            toks.append(t)
            flags.append(1 if learn else 0)
        if toks and bos is not None and toks[0] != bos:
            toks, flags = [bos] + toks, [1] + flags
        if toks and eos is not None and toks[-1] != eos:
            toks, flags = toks + [eos], flags + [flags[-1]]
        out_docs.append(toks)
        out_flags.append(flags)
    return out_docs, (out_flags if with_flags else None)


def reference_gather_segments(values, src, lens):
    """Slow twin of :func:`packtool.core.layout.gather_segments`: the segments back to back,
    as a list."""
    out = []
    for s, n in zip(src, lens):
        out.extend(values[s:s + n])
    return out


def reference_row_structure(input_ids, cu_rows, num_segments, convention="unshifted"):
    """Per row, from its tokens, its ``cu_seqlens`` and its document count k: segment ids (1..k,
    0 on the padding tail), positions (restarting in every span), labels and span indices;
    plus the spans of all rows laid end to end, the longest span and the effective targets.

    Returns (segment_ids, position_ids, labels, seq_idx as lists of rows; cu_seqlens list;
    max_seqlen; num_targets), or None when a row's ``cu_seqlens`` breaks the contract.
    """
    C = len(input_ids[0]) if input_ids else 0
    segs, poss, labs, seqs, cu_all = [], [], [], [], []
    longest, targets = 0, 0
    for r, (ids, cu, k) in enumerate(zip(input_ids, cu_rows, num_segments)):
        cu = [int(x) for x in cu]
        if len(cu) < 2 or not k <= len(cu) - 1 <= k + 1 or cu[0] != 0 or cu[-1] != C:
            return None
        if any(b <= a for a, b in zip(cu, cu[1:])):
            return None
        seg, pos, lab, seq = [], [], [], []
        for j in range(len(cu) - 1):
            start, end = cu[j], cu[j + 1]
            cu_all.append(r * C + start)
            longest = max(longest, end - start)
            real = j < k
            for t in range(start, end):
                seg.append(j + 1 if real else 0)
                pos.append(t - start)
                seq.append(j)
                if not real:
                    lab.append(IGNORE)
                elif convention == "shifted":
                    lab.append(int(ids[t + 1]) if t + 1 < end else IGNORE)
                else:
                    lab.append(int(ids[t]) if t > start else IGNORE)
        targets += sum(1 for x in lab if x != IGNORE)
        segs.append(seg)
        poss.append(pos)
        labs.append(lab)
        seqs.append(seq)
    cu_all.append(len(input_ids) * C)
    return segs, poss, labs, seqs, cu_all, longest, targets
