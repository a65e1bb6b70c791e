"""Windows: which documents are planned together when one plan of the whole corpus is too big.

Documents are dealt to windows in blocks: the corpus, in global document order, is cut into
blocks of ``b = max(1, N // DEAL_BLOCKS)`` documents and block ``j`` goes to window
``j mod K``, with K the fewest windows that hold at most N documents each. So each window holds
about :data:`DEAL_BLOCKS` blocks spread evenly over the whole input: a sample of every source
and of every length, however the input is sorted. Corpora are usually stored by source, and a
window that is one contiguous run of a source packs much worse than one global plan (its long
documents find no short ones to fill the gaps): on a synthetic corpus of six sources of sharply
different lengths, stored by source, 280,000 documents at C = 2048, windows of 20,000
documents cost 1,702 rows over ceil(tokens / C) as contiguous runs and 10 dealt in blocks,
against 1 for one global plan (docs/benchmarks.md, "Windows").

Pure NumPy: the deal depends only on the document count and N.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Windows", "plan_windows", "DEAL_BLOCKS"]

#: Blocks a window is dealt (about): the finer, the closer a window's mix of lengths is to the
#: corpus's, and the more ranged reads a window's lengths take (one per block).
DEAL_BLOCKS = 64


@dataclass(frozen=True)
class Windows:
    """How documents are dealt to windows (small: it crosses processes).

    Block ``j`` (documents ``j * block .. (j + 1) * block - 1`` in global order) belongs to
    window ``j mod count``.
    """

    docs: int  #: documents in the corpus
    count: int  #: windows (>= 1)
    block: int  #: documents per block (>= 1)

    @property
    def blocks(self) -> int:
        return -(-self.docs // self.block) if self.docs else 0

    def ranges(self, w: int) -> np.ndarray:
        """int64[m, 2]: the global document ranges ``[start, stop)`` of window ``w``, ascending
        (adjacent blocks merged: one window holds one range)."""
        j = np.arange(w, self.blocks, self.count, dtype=np.int64)
        r = np.stack([j * self.block, np.minimum((j + 1) * self.block, self.docs)], axis=1)
        if len(r) > 1:
            cut = np.flatnonzero(r[1:, 0] != r[:-1, 1]) + 1
            first = np.concatenate([[0], cut])
            last = np.concatenate([cut, [len(r)]]) - 1
            r = np.stack([r[first, 0], r[last, 1]], axis=1)
        return r.reshape(-1, 2)

    def members(self, w: int) -> np.ndarray:
        """int64[docs of window w]: its global document numbers, ascending."""
        r = self.ranges(w)
        if not len(r):
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in r.tolist()])

    def sizes(self) -> np.ndarray:
        """int64[count]: documents of each window."""
        j = np.arange(self.blocks, dtype=np.int64)
        n = np.minimum((j + 1) * self.block, self.docs) - j * self.block
        return np.bincount(j % self.count, weights=n, minlength=self.count).astype(np.int64)

    def window_of(self, doc: np.ndarray) -> np.ndarray:
        """Window of each global document number."""
        return (np.asarray(doc, dtype=np.int64) // self.block) % self.count

    def to_dict(self) -> dict:
        """The dealing as the manifest records it: ``windows``, ``block_docs`` and the rule in
        words (JSON-ready)."""
        return {"windows": self.count, "block_docs": self.block,
                "rule": "block j (documents j*block_docs .. (j+1)*block_docs-1) is in window "
                        "j mod windows"}


def plan_windows(total_docs: int, window_docs: int | None) -> Windows:
    """Deal ``total_docs`` documents to windows of at most ``window_docs`` documents (module
    docstring); None (or a window at least the corpus): one window of every document.

    Raises:
        ValueError: ``window_docs`` < 1.
    """
    if window_docs is not None and window_docs < 1:
        raise ValueError(f"window_docs must be >= 1, got {window_docs}")
    if window_docs is None or window_docs >= total_docs:
        return Windows(total_docs, 1, max(1, total_docs))
    block = max(1, window_docs // DEAL_BLOCKS)
    per = window_docs // block  # blocks per window at most
    blocks = -(-total_docs // block)
    return Windows(total_docs, -(-blocks // per), block)
