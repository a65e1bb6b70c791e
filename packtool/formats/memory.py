"""Arrow's memory pool in a ``packtool`` process.

Every record batch the reader decodes and every page the Parquet writer encodes is allocated
from Arrow's default memory pool. On Linux, pyarrow's default pool is mimalloc, and its jemalloc
(the other pool it bundles) returns freed pages to the system at once, so every record batch
faults its pages in anew. Reading the 50 M-token random-id corpus (``docs/benchmarks.md``) on
two threads, batch by batch: mimalloc 0.58 to 1.09 CPU-s (0.32 to 0.79 of it in the system),
jemalloc as pyarrow builds it 0.47 to 0.52 (185,000 page faults on one thread), jemalloc keeping
its freed pages 0.35 to 0.37 (one thread: 0.30, as mimalloc at its best). The output bytes do not
depend on the pool.

The ``packtool`` command line therefore runs Arrow on jemalloc keeping its freed pages
(:data:`JEMALLOC_CONF`): :func:`prepare` (before pyarrow is imported: jemalloc reads its options
once, when pyarrow loads it) and :func:`use_jemalloc` (when a command starts). Both leave
everything alone when the user chose a pool with pyarrow's ``ARROW_DEFAULT_MEMORY_POOL``, and
the user's own jemalloc options win. The Python API (:func:`packtool.pack`) leaves the pool of
its host process alone.
"""

from __future__ import annotations

import os

__all__ = ["JEMALLOC_CONF", "JEMALLOC_CONF_ENV", "POOL_ENV", "prepare", "use_jemalloc"]

#: pyarrow's environment variable choosing the default memory pool (``jemalloc``,
#: ``mimalloc`` or ``system``); when set, packtool leaves the choice to it.
POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
#: The options of the jemalloc that pyarrow bundles (its ``MALLOC_CONF``, under pyarrow's
#: ``je_arrow_`` prefix), read once, when pyarrow is imported.
JEMALLOC_CONF_ENV = "JE_ARROW_MALLOC_CONF"
#: Freed pages stay with jemalloc for the next allocation instead of going back to the system.
#: The resident set is then the peak of Arrow's live memory, which a pack bounds (a record
#: batch per read task, a row group per writing task) whatever the corpus size.
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"


def prepare() -> None:
    """Set :data:`JEMALLOC_CONF` for this process unless a pool or jemalloc options were
    chosen; call it before pyarrow is imported (later it changes nothing). Imports nothing."""
    if not os.environ.get(POOL_ENV):
        os.environ.setdefault(JEMALLOC_CONF_ENV, JEMALLOC_CONF)


def use_jemalloc() -> str:
    """Make jemalloc Arrow's default memory pool in this process (see the module docstring),
    unless ``ARROW_DEFAULT_MEMORY_POOL`` chose one or pyarrow was built without jemalloc.

    Returns:
        The backend name of the default pool afterwards (``"jemalloc"``, or the pool left in
        place).
    """
    prepare()  # in case pyarrow is not imported yet
    import pyarrow as pa

    if not os.environ.get(POOL_ENV):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow build without jemalloc
            pass
    return pa.default_memory_pool().backend_name
