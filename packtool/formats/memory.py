"""Arrow's memory pool in a ``packtool`` process.

Every record batch the reader decodes and every page the Parquet writer encodes is allocated
from Arrow's default memory pool. On Linux, pyarrow's default pool is mimalloc; measured on
``packtool pack`` of a 137.7 M-token corpus of real ids (2-core VM, 3 alternating runs each),
the process spent 2.2 to 2.9 CPU-s in the system with mimalloc and 1.1 to 1.7 CPU-s with
jemalloc, for the same user time: about 1 CPU-s, a tenth of the pack, went to the kernel handing
memory back and forth (the 50 M-token random-id corpus with two workers: 0.88 against 0.58
system CPU-s, medians of 4). The output bytes do not depend on the pool.

:func:`use_jemalloc` makes jemalloc the default pool of the process, unless the user chose one
with pyarrow's ``ARROW_DEFAULT_MEMORY_POOL`` or pyarrow was built without it (then nothing
changes). Only the CLI calls it: it owns its process, while the Python API (:func:`packtool.pack`)
leaves the pool of its host process alone.
"""

from __future__ import annotations

import os

import pyarrow as pa

__all__ = ["POOL_ENV", "use_jemalloc"]

#: pyarrow's environment variable choosing the default memory pool (``jemalloc``,
#: ``mimalloc`` or ``system``); when set, packtool leaves the choice to it.
POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def use_jemalloc() -> str:
    """Make jemalloc Arrow's default memory pool in this process (see the module docstring).

    Returns:
        The backend name of the default pool afterwards (``"jemalloc"``, or the pool left in
        place: the one ``ARROW_DEFAULT_MEMORY_POOL`` chose, or pyarrow's default when it was
        built without jemalloc).
    """
    if not os.environ.get(POOL_ENV):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow build without jemalloc
            pass
    return pa.default_memory_pool().backend_name
