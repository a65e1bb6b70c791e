"""Progress of a pack's phases in documents and tokens, with rate and time left.

The driver opens one :func:`phase` at a time (a tqdm bar on stderr, only when stderr is a
terminal); the tasks of the local engine, threads of the same process, call :func:`advance`
as they go (the read parts per record batch), so the bar moves while a task runs, not only
when it ends. Tasks in other processes (Ray) advance nothing; the driver then advances the
bar by each task's result. The bar's total is an estimate from the footers, so its rate and
time left hold from the first batches on.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["Phase", "phase", "advance"]


class Phase:
    """Counts of the phase that runs (thread-safe), shown as one tqdm bar in tokens."""

    def __init__(self, desc: str, total_tokens: int, total_docs: int, enabled: bool):
        from tqdm import tqdm

        self.desc = desc
        self.docs = 0
        self.tokens = 0
        self.total_docs = total_docs
        self._lock = threading.Lock()
        self._bar = tqdm(total=max(total_tokens, 1), desc=desc, unit=" tok", unit_scale=True,
                         leave=False, disable=not enabled, file=sys.stderr, smoothing=0.1,
                         dynamic_ncols=True)

    def advance(self, docs: int, tokens: int) -> None:
        """Add ``docs`` documents and ``tokens`` tokens done."""
        with self._lock:
            self.docs += docs
            self.tokens += tokens
            if self.tokens > self._bar.total:  # the footers' estimate was low
                self._bar.total = self.tokens
            self._bar.set_postfix_str(f"{self.docs:,}/{self.total_docs:,} docs", refresh=False)
            self._bar.update(tokens)

    def close(self) -> None:
        self._bar.close()


_CURRENT: Phase | None = None


@contextmanager
def phase(desc: str, total_tokens: int, total_docs: int, enabled: bool) -> Iterator[Phase]:
    """Show one phase; :func:`advance` adds to it while the block runs."""
    global _CURRENT
    bar = Phase(desc, total_tokens, total_docs, enabled)
    _CURRENT = bar
    try:
        yield bar
    finally:
        _CURRENT = None
        bar.close()


def advance(docs: int, tokens: int) -> None:
    """Add to the phase shown by this process, if any (a task in a Ray worker: nothing)."""
    bar = _CURRENT
    if bar is not None:
        bar.advance(docs, tokens)
