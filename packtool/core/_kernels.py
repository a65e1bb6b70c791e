"""Numba kernels of the packer and the row layout. Private: call them only from ``core``.

Every kernel takes contiguous fixed-dtype arrays and ints, positionally, and is called from
exactly one public wrapper (``core/packing.py`` or ``core/layout.py``) that validates, casts and
documents it. ``core/reference.py`` holds a slow twin of each, and the tests compare them.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

# Overflow policy codes shared with core/packing.py (ints keep the kernels monomorphic).
OVERFLOW_SPLIT = 0
OVERFLOW_TRUNCATE = 1
OVERFLOW_DROP = 2

# Label codes shared with core/layout.py.
LABELS_UNSHIFTED = 0
LABELS_SHIFTED = 1
LABELS_NONE = 2

_IGNORE = -100

try:  # LLVM's cttz intrinsic; unavailable as a plain Python call when JIT is disabled
    from numba.cpython.unsafe.numbers import trailing_zeros as _cttz
except ImportError:  # pragma: no cover - depends on numba version
    _cttz = None

if _cttz is not None and not numba.config.DISABLE_JIT:

    @njit(inline="always")
    def _ctz(word):
        return _cttz(word)

else:

    def _ctz(word):  # slow path used under NUMBA_DISABLE_JIT=1 (coverage runs)
        w = int(word)
        return (w & -w).bit_length() - 1


_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONE = np.uint64(1)
_BLOCK = 32  # bin ids per stack block


@njit(cache=True)
def _split_chunks(lengths, capacity, overflow):
    """Turn document lengths into chunks (doc, offset, length) in document-then-chunk order.

    Returns chunks int64[S, 3] (doc, offset, length per chunk) and a counts array int64[8]:
    [docs_empty, docs_split, split_fragments, docs_truncated, tokens_truncated, docs_dropped,
    tokens of the dropped documents, chunks] (the plan's ``tokens_dropped`` adds the truncated
    tails to counts[6]: ``packtool.core.packing._counts``).
    """
    n = lengths.shape[0]
    counts = np.zeros(8, dtype=np.int64)
    total = 0
    for i in range(n):
        length = lengths[i]
        if length == 0:
            continue
        if length <= capacity:
            total += 1
        elif overflow == OVERFLOW_SPLIT:
            total += (length + capacity - 1) // capacity
        elif overflow == OVERFLOW_TRUNCATE:
            total += 1
    chunks = np.empty((total, 3), dtype=np.int64)
    s = 0
    for i in range(n):
        length = lengths[i]
        if length == 0:
            counts[0] += 1
            continue
        if length <= capacity:
            chunks[s, 0] = i
            chunks[s, 1] = 0
            chunks[s, 2] = length
            s += 1
        elif overflow == OVERFLOW_SPLIT:
            counts[1] += 1
            off = 0
            while off < length:
                take = min(capacity, length - off)
                chunks[s, 0] = i
                chunks[s, 1] = off
                chunks[s, 2] = take
                s += 1
                off += take
                if off < length:
                    counts[2] += 1
        elif overflow == OVERFLOW_TRUNCATE:
            counts[3] += 1
            counts[4] += length - capacity
            chunks[s, 0] = i
            chunks[s, 1] = 0
            chunks[s, 2] = capacity
            s += 1
        else:
            counts[5] += 1
            counts[6] += length
    counts[7] = total
    return chunks, counts


@njit(cache=True)
def _tree_layout(n_leaves):
    """Level offsets (into one flat uint64 array) of a 64-ary bit tree over n_leaves leaves."""
    sizes = np.zeros(8, dtype=np.int64)
    nlev = 0
    bits = n_leaves
    while True:
        words = (bits + 63) // 64
        sizes[nlev] = words
        nlev += 1
        if words == 1:
            break
        bits = words
    offs = np.zeros(nlev + 1, dtype=np.int64)
    for k in range(nlev):
        offs[k + 1] = offs[k] + sizes[k]
    return offs, nlev


@njit(inline="always")
def _tree_set(tree, offs, nlev, leaf):
    i = leaf
    for lev in range(nlev):
        w = offs[lev] + (i >> 6)
        was = tree[w]
        tree[w] = was | (_ONE << np.uint64(i & 63))
        if was != 0:  # ancestors already flag this word as non-empty
            break
        i >>= 6


@njit(inline="always")
def _tree_clear(tree, offs, nlev, leaf):
    i = leaf
    for lev in range(nlev):
        w = offs[lev] + (i >> 6)
        now = tree[w] & ~(_ONE << np.uint64(i & 63))
        tree[w] = now
        if now != 0:  # the word still has a set bit: ancestors stay set
            break
        i >>= 6


@njit(inline="always")
def _tree_next(tree, offs, nlev, x):
    """Smallest set leaf >= x, or -1. O(log_64 C) word operations."""
    lev = 0
    i = x
    while True:
        wi = i >> 6
        if offs[lev] + wi >= offs[lev + 1]:
            return -1
        m = tree[offs[lev] + wi] & (_ALL << np.uint64(i & 63))
        if m != 0:
            i = (wi << 6) + np.int64(_ctz(m))
            break
        if lev == nlev - 1:
            return -1
        lev += 1
        i = wi + 1
        if (i & 63) == 0 and offs[lev] + (i >> 6) >= offs[lev + 1]:
            return -1
    while lev > 0:
        lev -= 1
        i = (i << 6) + np.int64(_ctz(tree[offs[lev] + i]))
    return i


@njit(cache=True)
def _chunk_histogram(lengths, capacity, overflow):
    """Histogram of chunk lengths after the overflow policy, with its bookkeeping.

    Args: lengths int64[N] (>= 0); capacity C; overflow code (split, truncate or drop).
    Returns hist int64[C + 1] (hist[l] = chunks of length l; hist[0] = empty documents) and
    counts int64[8] as ``_split_chunks`` (counts[7] = number of chunks S).
    """
    n = lengths.shape[0]
    counts = np.zeros(8, dtype=np.int64)
    hist = np.zeros(capacity + 1, dtype=np.int64)
    for i in range(n):
        length = lengths[i]
        if length <= capacity:
            hist[length] += 1
        elif overflow == OVERFLOW_SPLIT:
            full = length // capacity
            rest = length - full * capacity
            hist[capacity] += full
            if rest > 0:
                hist[rest] += 1
            counts[1] += 1
            counts[2] += full - (rest == 0)
        elif overflow == OVERFLOW_TRUNCATE:
            hist[capacity] += 1
            counts[3] += 1
            counts[4] += length - capacity
        else:
            counts[5] += 1
            counts[6] += length
    counts[0] = hist[0]
    counts[7] = n - hist[0] - counts[5] + counts[2]
    return hist, counts


@njit(cache=True)
def _obfd_plan(lengths, capacity, overflow, hist, sdoc, sfull, runs, heads, data, row_offsets,
               seg_doc, seg_offset, seg_len):
    """Counting sort + best-fit placement + CSR of bins, in place; returns the number of bins.

    Same bins and segment order as one-chunk-at-a-time best-fit-decreasing (and as
    ``reference_pack``), without a 3-column chunk table or a scatter by bin:

    - the sorted order holds document ids only: a chunk's length is its bucket, and its offset is
      0, or its rank among its document's chunks times C (bucket C), or C times the number of
      full chunks for the last chunk of a split document (stored as ``-1 - doc`` to flag it,
      that number beside it in ``sfull``: no random reads of ``lengths`` after the scatter);
    - a run of equal-length chunks is placed in bulk: a bin popped with remaining capacity r
      takes min(run left, r // l) chunks of length l at once (it stays the best fit and the most
      recent bin at its new remaining capacity until that drops below l), so the capacity tree
      is searched only when a stack empties;
    - a bin is a linked list of such runs, and the stacks hold each bin's last run, so the plan
      is written bin by bin with sequential stores.

    The caller allocates every large array (numpy asks for huge pages; the first-touch page
    faults of small pages cost more than the placement itself).

    Args:
        lengths: int64[N] (>= 0); capacity: C; overflow: split, truncate or drop code.
        hist: int64[C + 1] from ``_chunk_histogram``.
        sdoc: int32|int64[S] scratch (flagged document id of each sorted chunk).
        sfull: same dtype [S] scratch (full chunks before a flagged chunk; other slots unset).
        runs: same dtype [S, 5] scratch, one row per run: (first sorted position, count, length,
            next run of the bin or -1, unused) or, for a run of one chunk, (document, 0, length,
            next, offset).
        heads: same dtype [S] scratch (first run of each bin).
        data: same dtype [(S // _BLOCK + C + 2) * _BLOCK] scratch (stack blocks of run ids).
        row_offsets: int64[S + 1]; on return ``row_offsets[:nbins + 1]`` is the CSR.
        seg_doc, seg_offset, seg_len: int64[S] outputs, bins in creation order, segments in
            placement order.
    """
    n = lengths.shape[0]
    # start[l]: first sorted position of length l (lengths descending); bucket l ends at start[l-1]
    start = np.zeros(capacity + 1, dtype=np.int64)
    acc = 0
    for l in range(capacity, 0, -1):
        start[l] = acc
        acc += hist[l]
    start[0] = acc
    # 1. stable scatter of document ids into length-descending order (ties: doc, then chunk)
    pos = start.copy()
    for i in range(n):
        length = lengths[i]
        if length == 0:
            continue
        if length <= capacity:
            q = pos[length]
            sdoc[q] = i
            pos[length] = q + 1
        elif overflow == OVERFLOW_SPLIT:
            full = length // capacity
            rest = length - full * capacity
            q = pos[capacity]
            for k in range(full):
                sdoc[q + k] = i
            pos[capacity] = q + full
            if rest > 0:
                q = pos[rest]
                sdoc[q] = -1 - i  # flag: offset is full * C
                sfull[q] = full
                pos[rest] = q + 1
        elif overflow == OVERFLOW_TRUNCATE:
            q = pos[capacity]
            sdoc[q] = i
            pos[capacity] = q + 1
    # 2. placement, one length class at a time
    offs, nlev = _tree_layout(capacity + 1)
    tree = np.zeros(offs[nlev], dtype=np.uint64)
    max_blocks = data.shape[0] // _BLOCK
    prev = np.empty(max_blocks, dtype=np.int64)  # block below in the same stack / free list link
    top = np.full(capacity + 1, -1, dtype=np.int64)  # top block of stack r, -1 = empty
    cnt = np.zeros(capacity + 1, dtype=np.int64)  # entries used in the top block
    free = -1
    used_blocks = 0
    nbins = 0
    nruns = 0
    for length in range(capacity, 0, -1):
        j = start[length]
        hi = start[length - 1]
        if j == hi:
            continue
        big = 2 * length > capacity  # no open bin can take it: one new bin per chunk
        r = -1 if big else _tree_next(tree, offs, nlev, length)
        while j < hi:
            if r < 0:
                heads[nbins] = nruns
                nbins += 1
                k = 1 if big else min(hi - j, capacity // length)
                left = capacity - k * length
            else:  # pop the top of stack r: the last run of the best-fitting bin
                t = top[r]
                c = cnt[r] - 1
                runs[np.int64(data[t * _BLOCK + c]), 3] = nruns
                k = min(hi - j, r // length)
                left = r - k * length
                if c == 0:
                    p = prev[t]
                    prev[t] = free
                    free = t
                    top[r] = p
                    if p < 0:
                        cnt[r] = 0
                        _tree_clear(tree, offs, nlev, r)
                        # stacks in [length, r) are empty and `left` < length unless the run
                        # ends here: the next best fit lies above r
                        if j + k < hi:
                            r = _tree_next(tree, offs, nlev, r + 1)
                    else:
                        cnt[r] = _BLOCK
                else:
                    cnt[r] = c
            if k == 1:  # one chunk: keep its document and offset in the run (no sdoc lookup
                # in the pointer chase of step 3; the lengths[] reads here are independent)
                d = np.int64(sdoc[j])
                if d < 0:
                    d = -1 - d
                    runs[nruns, 4] = sfull[j] * capacity
                else:
                    runs[nruns, 4] = 0
                runs[nruns, 0] = d
                runs[nruns, 1] = 0
            else:
                runs[nruns, 0] = j
                runs[nruns, 1] = k
            runs[nruns, 2] = length
            runs[nruns, 3] = -1
            if left > 0:  # push the bin (its last run) on stack `left`
                t = top[left]
                if t < 0 or cnt[left] == _BLOCK:
                    if free >= 0:
                        nb = free
                        free = prev[nb]
                    else:
                        nb = used_blocks
                        used_blocks += 1
                    prev[nb] = t
                    top[left] = nb
                    cnt[left] = 0
                    if t < 0:
                        _tree_set(tree, offs, nlev, left)
                    t = nb
                data[t * _BLOCK + cnt[left]] = nruns
                cnt[left] += 1
            nruns += 1
            j += k
    # 3. write the plan bin by bin (sequential stores). Bins of length-C chunks come first, one
    # chunk each, in sorted order, so a split document's full chunks are consecutive there.
    q = 0
    last = -1
    off = 0
    row_offsets[0] = 0
    for b in range(nbins):
        r = np.int64(heads[b])
        while r >= 0:
            length = np.int64(runs[r, 2])
            if runs[r, 1] == 0:  # a single chunk, document and offset in the run
                d = np.int64(runs[r, 0])
                if length == capacity:
                    off = off + capacity if d == last else 0
                    last = d
                else:
                    off = np.int64(runs[r, 4])
                seg_doc[q] = d
                seg_offset[q] = off
                seg_len[q] = length
                q += 1
                r = np.int64(runs[r, 3])
                continue
            j = np.int64(runs[r, 0])
            for jj in range(j, j + np.int64(runs[r, 1])):
                d = np.int64(sdoc[jj])
                if length == capacity:  # whole, truncated, or the k-th full chunk of a split doc
                    off = off + capacity if d == last else 0
                    last = d
                elif d < 0:  # the last, shorter chunk of a split document
                    d = -1 - d
                    off = np.int64(sfull[jj]) * capacity
                else:
                    off = 0
                seg_doc[q] = d
                seg_offset[q] = off
                seg_len[q] = length
                q += 1
            r = np.int64(runs[r, 3])
        row_offsets[b + 1] = q
    return nbins

@njit(cache=True)
def _ordered_rows(chunks, capacity):
    """Order-preserving next-fit: chunks in input order; a new row when the next one does not fit.

    Rows hold consecutive chunks, so the plan is the chunk table itself plus row_offsets
    int64[num_rows + 1] (row r = chunks[row_offsets[r]:row_offsets[r + 1]]).
    """
    s = chunks.shape[0]
    row_offsets = np.empty(s + 1, dtype=np.int64)
    nrows = 0
    used = capacity  # forces a first row
    for j in range(s):
        length = chunks[j, 2]
        if length > capacity - used:
            row_offsets[nrows] = j
            nrows += 1
            used = 0
        used += length
    row_offsets[nrows] = s
    return row_offsets[:nrows + 1].copy()


@njit(cache=True)
def _concat_segments(chunks, capacity):
    """Continuous stream of whole documents cut every C tokens; each piece becomes a segment."""
    total = 0
    for i in range(chunks.shape[0]):
        total += chunks[i, 2]
    nrows = (total + capacity - 1) // capacity
    # every cut adds at most one piece
    max_segs = chunks.shape[0] + nrows
    seg_doc = np.empty(max_segs, dtype=np.int64)
    seg_off = np.empty(max_segs, dtype=np.int64)
    seg_len = np.empty(max_segs, dtype=np.int64)
    row_offsets = np.zeros(nrows + 1, dtype=np.int64)
    s = 0
    row = 0
    used = 0
    for i in range(chunks.shape[0]):
        off = 0
        length = chunks[i, 2]
        while off < length:
            if used == capacity:
                row += 1
                row_offsets[row] = s
                used = 0
            take = min(length - off, capacity - used)
            seg_doc[s] = chunks[i, 0]
            seg_off[s] = off
            seg_len[s] = take
            s += 1
            used += take
            off += take
    if nrows > 0:
        row_offsets[nrows] = s
    return row_offsets, seg_doc[:s].copy(), seg_off[:s].copy(), seg_len[:s].copy()



@njit(cache=True, nogil=True)
def _complete_rows(seg_offsets, seg_len, input_ids, flags, has_flags, capacity, pad_id,
                   labels_mode, multiple, segment_ids, position_ids, labels, cu_values,
                   cu_unpadded, cu_offsets, num_targets, max_seqlen):
    """Finish rows whose segments' tokens are already at the start of their spans in
    ``input_ids``.

    seg_offsets int64[n + 1] (row k's segments), seg_len int64[S] (real lengths); each segment
    spans ``ceil(len / multiple) * multiple`` slots, back to back from the row's start;
    input_ids int32[n, C] (the rest of each span and the padding tail are written here); flags
    uint8[n, C] aligned with input_ids (0 = the token is not a target; read only when has_flags
    is 1). Writes segment_ids, position_ids, labels (int32[n, C]; labels untouched for
    LABELS_NONE), cu_values (int32, at least n + S + n entries: the spans summed), cu_unpadded
    (the same size, the real lengths summed; written only when multiple > 1), cu_offsets
    int64[n + 1], num_targets and max_seqlen (int32[n]: the longest span).
    """
    n = seg_offsets.shape[0] - 1
    c = 0
    cu_offsets[0] = 0
    for k in range(n):
        # loops over slices of one row's views: indices from 0 that Numba knows are not
        # negative, so the fills compile to vector stores (ten times faster than [k, pos + t])
        ids_k = input_ids[k]
        seg_k = segment_ids[k]
        posn_k = position_ids[k]
        lab_k = labels[k] if labels_mode != LABELS_NONE else input_ids[k]  # not written: none
        pos = 0
        acc = 0
        cu_values[c] = 0
        if multiple > 1:
            cu_unpadded[c] = 0
        c += 1
        segno = 0
        longest = 0
        count = 0
        for q in range(seg_offsets[k], seg_offsets[k + 1]):
            segno += 1
            length = seg_len[q]
            seg_s = seg_k[pos:pos + length]
            posn_s = posn_k[pos:pos + length]
            for t in range(length):
                seg_s[t] = segno
                posn_s[t] = t
            if labels_mode == LABELS_UNSHIFTED:
                lab_s = lab_k[pos:pos + length]
                ids_s = ids_k[pos:pos + length]
                if length > 0:
                    lab_s[0] = _IGNORE
                if has_flags:
                    for t in range(1, length):
                        if flags[k, pos + t] == 0:
                            lab_s[t] = _IGNORE
                        else:
                            lab_s[t] = ids_s[t]
                            count += 1
                else:
                    for t in range(1, length):
                        lab_s[t] = ids_s[t]
                    if length > 0:
                        count += length - 1
            elif labels_mode == LABELS_SHIFTED:
                lab_s = lab_k[pos:pos + length]
                ids_s = ids_k[pos:pos + length]
                if has_flags:
                    for t in range(length - 1):
                        if flags[k, pos + t + 1] == 0:
                            lab_s[t] = _IGNORE
                        else:
                            lab_s[t] = ids_s[t + 1]
                            count += 1
                else:
                    for t in range(length - 1):
                        lab_s[t] = ids_s[t + 1]
                    if length > 0:
                        count += length - 1
                if length > 0:
                    lab_s[length - 1] = _IGNORE
            elif has_flags:
                for t in range(1, length):
                    if flags[k, pos + t] != 0:
                        count += 1
            elif length > 0:
                count += length - 1
            span = length
            if multiple > 1:  # padding inside the span: its document's positions go on
                span = (length + multiple - 1) // multiple * multiple
                for t in range(length, span):
                    ids_k[pos + t] = pad_id
                    seg_k[pos + t] = 0
                    posn_k[pos + t] = t
                if labels_mode != LABELS_NONE:
                    for t in range(length, span):
                        lab_k[pos + t] = _IGNORE
                acc += length
                cu_unpadded[c] = acc
            pos += span
            cu_values[c] = pos
            c += 1
            if span > longest:
                longest = span
        pad = capacity - pos
        ids_p = ids_k[pos:]
        seg_p = seg_k[pos:]
        posn_p = posn_k[pos:]
        for t in range(pad):
            ids_p[t] = pad_id
            seg_p[t] = 0
            posn_p[t] = t
        if labels_mode != LABELS_NONE:
            lab_p = lab_k[pos:]
            for t in range(pad):
                lab_p[t] = _IGNORE
        if pad > 0:
            cu_values[c] = capacity
            if multiple > 1:
                cu_unpadded[c] = acc + pad
            c += 1
            if pad > longest:
                longest = pad
        cu_offsets[k + 1] = c
        num_targets[k] = count
        max_seqlen[k] = longest


@njit(cache=True, nogil=True)
def _copy_segments(values, src, lens, out, dest):
    """out[dest[q] .. dest[q] + lens[q] - 1] = values[src[q] .. src[q] + lens[q] - 1] for every
    segment q (int64 src, lens, dest; values and out of one dtype)."""
    for q in range(src.shape[0]):
        s = src[q]
        d = dest[q]
        for t in range(lens[q]):
            out[d + t] = values[s + t]


@njit(cache=True, nogil=True)
def _mask_labels(seg_offsets, seg_len, seg_src, targets, labels, num_targets, shifted):
    """Set -100 on labels whose target token is masked in the input; recount num_targets.

    seg_offsets int64[n + 1] (row k's segments), seg_len int64[S], seg_src int64[S] (flat index
    in ``targets`` of each segment's first token), targets uint8[T] (0 = not a target), labels
    int32[n, C] (modified in place), num_targets int32[n] (overwritten). Unshifted: position t
    of a segment predicts its own token t; shifted: position t predicts token t + 1. Either way
    the first token of a segment is never a target.
    """
    n = seg_offsets.shape[0] - 1
    for k in range(n):
        pos = 0
        count = 0
        for q in range(seg_offsets[k], seg_offsets[k + 1]):
            length = seg_len[q]
            src = seg_src[q]
            for t in range(1, length):
                p = pos + t if shifted == 0 else pos + t - 1
                if targets[src + t] == 0:
                    labels[k, p] = _IGNORE
                else:
                    count += 1
            pos += length
        num_targets[k] = count


@njit(cache=True, nogil=True)
def _segment_targets(seg_src, seg_len, targets):
    """int64[S]: effective targets of each segment: tokens 1..len-1 whose targets flag is set."""
    out = np.zeros(seg_len.shape[0], dtype=np.int64)
    for q in range(seg_len.shape[0]):
        src = seg_src[q]
        c = 0
        for t in range(1, seg_len[q]):
            c += targets[src + t] != 0
        out[q] = c
    return out


@njit(cache=True)
def _row_structure(input_ids, cu_values, cu_offsets, num_segments, shifted, segment_ids,
                   position_ids, labels, seq_idx, cu_out):
    """Segments, positions, labels and span indices of B rows of capacity C from their
    ``cu_seqlens``, written into the flat arrays given (``input_ids`` and the four outputs are
    [B * C], row-major); the rows' spans laid end to end into ``cu_out`` (int32[S + 1]).

    Returns (bad row or -1, longest span, effective targets). A row is bad when its entries are
    fewer than 2, not k + 1 or k + 2, do not start at 0, end at C or strictly increase.
    """
    B = cu_offsets.shape[0] - 1
    C = input_ids.shape[0] // B if B > 0 else 0
    s = 0
    longest = 0
    targets = 0
    for r in range(B):
        a = cu_offsets[r]
        n = cu_offsets[r + 1] - a
        k = num_segments[r]
        if n < 2 or n - 1 < k or n - 1 > k + 1 or cu_values[a] != 0 or cu_values[a + n - 1] != C:
            return r, 0, 0
        for j in range(n - 1):
            if cu_values[a + j + 1] <= cu_values[a + j]:
                return r, 0, 0
        for j in range(n - 1):
            lo = np.int64(r) * C + cu_values[a + j]  # flat position of the span's first token
            size = np.int64(cu_values[a + j + 1] - cu_values[a + j])
            cu_out[s] = lo
            s += 1
            longest = max(longest, size)
            # views: indices from 0 let the loops vectorise
            seg = segment_ids[lo:lo + size]
            pos = position_ids[lo:lo + size]
            lab = labels[lo:lo + size]
            seq = seq_idx[lo:lo + size]
            ids = input_ids[lo:lo + size]
            seg[:] = j + 1 if j < k else 0
            seq[:] = j
            for t in range(size):
                pos[t] = t
            if j >= k:  # the padding tail: no targets
                lab[:] = _IGNORE
            elif shifted:
                for t in range(size - 1):
                    lab[t] = ids[t + 1]
                lab[size - 1] = _IGNORE
                targets += size - 1
            else:
                for t in range(1, size):
                    lab[t] = ids[t]
                lab[0] = _IGNORE
                targets += size - 1
    cu_out[s] = np.int64(B) * C
    return -1, longest, targets
