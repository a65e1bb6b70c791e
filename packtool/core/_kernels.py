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
_SIX = np.uint64(6)
_M63 = np.uint64(63)
_BLOCK = 32  # bin ids per stack block


@njit(cache=True)
def _split_chunks(lengths, capacity, overflow):
    """Turn document lengths into chunks (doc, offset, length) in document-then-chunk order.

    Returns chunks int64[S, 3] (doc, offset, length per chunk) and a counts array int64[8]:
    [docs_empty, docs_split, split_fragments, docs_truncated, tokens_truncated, docs_dropped,
    tokens_dropped, chunks].
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
def _obfd_place(chunks, capacity):
    """Best-fit-decreasing placement (OBFD, Ding et al. 2024, arXiv 2404.10830, Sec. 3.2 and App. B).

    Chunks are visited by length descending (stable counting sort, ties by chunk order). Each goes
    into the open bin whose remaining capacity is the smallest one >= its length; among bins with
    that same remaining capacity, the one that reached it most recently (a stack per capacity).
    The search is a 64-ary segment tree of bits over remaining capacities 0..C ("is some bin left
    with exactly r tokens free?"), so each placement costs O(log_64 C) word operations.

    Args: chunks int64[S, 3] (doc, offset, length). Returns placed int64[S, 3] (the chunks in
    placement order), bin_of int64[S] (bin of placed[j]) and the number of bins.
    """
    s = chunks.shape[0]
    # counting sort, descending: bucket of length l starts at start[C - l]
    start = np.zeros(capacity + 1, dtype=np.int64)
    for i in range(s):
        start[capacity - chunks[i, 2] + 1] += 1
    for k in range(1, capacity + 1):
        start[k] += start[k - 1]
    placed = np.empty((s, 3), dtype=np.int64)
    fill = start.copy()
    for i in range(s):
        q = fill[capacity - chunks[i, 2]]
        placed[q, 0] = chunks[i, 0]
        placed[q, 1] = chunks[i, 1]
        placed[q, 2] = chunks[i, 2]
        fill[capacity - chunks[i, 2]] = q + 1
    offs, nlev = _tree_layout(capacity + 1)
    tree = np.zeros(offs[nlev], dtype=np.uint64)
    # One LIFO stack of bins per remaining capacity r, stored in blocks of _BLOCK bin ids so the
    # top of every stack stays in cache (a linked list through bin ids misses cache per pop).
    max_blocks = s // _BLOCK + capacity + 2
    data = np.empty(max_blocks * _BLOCK, dtype=np.int64)
    prev = np.empty(max_blocks, dtype=np.int64)  # block below in the same stack / free list link
    top = np.full(capacity + 1, -1, dtype=np.int64)  # top block of stack r, -1 = empty
    cnt = np.zeros(capacity + 1, dtype=np.int64)  # entries used in the top block
    free = -1
    used_blocks = 0
    bin_of = np.empty(s, dtype=np.int64)
    nbins = 0
    for slot in range(capacity):
        length = capacity - slot
        j = start[slot]
        hi = start[slot + 1]
        big = 2 * length > capacity  # no open bin can take a chunk over C/2: skip the search
        while j < hi:
            r = -1 if big else _tree_next(tree, offs, nlev, length)
            if r < 0:
                b = nbins
                nbins += 1
                left = capacity - length
            else:  # pop the top of stack r
                t = top[r]
                c = cnt[r] - 1
                b = data[t * _BLOCK + c]
                if c == 0:
                    p = prev[t]
                    prev[t] = free
                    free = t
                    top[r] = p
                    if p < 0:
                        cnt[r] = 0
                        _tree_clear(tree, offs, nlev, r)
                    else:
                        cnt[r] = _BLOCK
                else:
                    cnt[r] = c
                left = r - length
            bin_of[j] = b
            if left > 0:  # push b on stack `left`
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
                data[t * _BLOCK + cnt[left]] = b
                cnt[left] += 1
            j += 1
    return placed, bin_of, nbins


@njit(cache=True)
def _ordered_place(chunks, capacity):
    """Order-preserving next-fit: chunks in input order; a new bin when the next one does not fit."""
    s = chunks.shape[0]
    bin_of = np.empty(s, dtype=np.int64)
    nbins = 0
    used = capacity  # forces a first bin
    for j in range(s):
        length = chunks[j, 2]
        if length > capacity - used:
            nbins += 1
            used = 0
        bin_of[j] = nbins - 1
        used += length
    return chunks, bin_of, nbins


@njit(cache=True)
def _group_by_bin(placed, bin_of, nbins):
    """CSR of bins, placement order kept within each bin.

    Returns row_offsets int64[nbins + 1] and segs int64[S, 3] (doc, offset, length per segment).
    The three fields sit in one row so each scattered write touches one cache line.
    """
    s = placed.shape[0]
    row_offsets = np.zeros(nbins + 1, dtype=np.int64)
    for j in range(s):
        row_offsets[bin_of[j] + 1] += 1
    for b in range(nbins):
        row_offsets[b + 1] += row_offsets[b]
    fill = row_offsets[:-1].copy()
    segs = np.empty((s, 3), dtype=np.int64)
    for j in range(s):
        b = bin_of[j]
        q = fill[b]
        fill[b] = q + 1
        segs[q, 0] = placed[j, 0]
        segs[q, 1] = placed[j, 1]
        segs[q, 2] = placed[j, 2]
    return row_offsets, segs


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
def _fill_rows(rows, row_offsets, seg_len, seg_src, tokens, capacity, pad_id, labels_mode):
    """Lay out the given rows: token, segment, position and label columns plus cu_seqlens.

    rows int64[n] (row ids in output order); seg_src int64[S] (flat index in ``tokens`` of each
    segment's first token). Returns input_ids, segment_ids, position_ids, labels (int32[n, C]),
    cu_values int32[n_cu] with cu_offsets int64[n + 1] (row k's cu_seqlens is
    cu_values[cu_offsets[k]:cu_offsets[k + 1]]), num_targets int32[n], max_seqlen int32[n].
    """
    n = rows.shape[0]
    input_ids = np.empty((n, capacity), dtype=np.int32)
    segment_ids = np.empty((n, capacity), dtype=np.int32)
    position_ids = np.empty((n, capacity), dtype=np.int32)
    labels = np.empty((n, capacity), dtype=np.int32)
    num_targets = np.zeros(n, dtype=np.int32)
    max_seqlen = np.zeros(n, dtype=np.int32)
    cu_offsets = np.zeros(n + 1, dtype=np.int64)  # shape: (n + 1,)
    for k in range(n):
        r = rows[k]
        used = 0
        for q in range(row_offsets[r], row_offsets[r + 1]):
            used += seg_len[q]
        # 0, one boundary per segment, and the padding tail as one more segment
        entries = 1 + (row_offsets[r + 1] - row_offsets[r]) + (1 if used < capacity else 0)
        cu_offsets[k + 1] = cu_offsets[k] + entries
    cu_values = np.empty(cu_offsets[n], dtype=np.int32)
    for k in range(n):
        r = rows[k]
        pos = 0
        c = cu_offsets[k]
        cu_values[c] = 0
        c += 1
        seg = 0
        longest = 0
        for q in range(row_offsets[r], row_offsets[r + 1]):
            seg += 1
            length = seg_len[q]
            src = seg_src[q]
            for t in range(length):
                tok = tokens[src + t]
                input_ids[k, pos + t] = tok
                segment_ids[k, pos + t] = seg
                position_ids[k, pos + t] = t
                if labels_mode == LABELS_UNSHIFTED:
                    labels[k, pos + t] = tok if t > 0 else _IGNORE
                elif labels_mode == LABELS_SHIFTED:
                    labels[k, pos + t] = tokens[src + t + 1] if t + 1 < length else _IGNORE
            pos += length
            num_targets[k] += length - 1
            cu_values[c] = pos
            c += 1
            if length > longest:
                longest = length
        pad = capacity - pos
        for t in range(pad):
            input_ids[k, pos + t] = pad_id
            segment_ids[k, pos + t] = 0
            position_ids[k, pos + t] = t
            labels[k, pos + t] = _IGNORE
        if pad > 0:
            cu_values[c] = capacity
            if pad > longest:
                longest = pad
        max_seqlen[k] = longest
    return input_ids, segment_ids, position_ids, labels, cu_values, cu_offsets, num_targets, max_seqlen
