"""Start-up notes: say on stderr that the first run compiles the kernels (a few seconds, once:
a first ``pack`` of ``sample_data/`` took 3.2 CPU-s against 0.9 with the kernels cached, on a
2-core AMD EPYC VM).

The Numba kernels are compiled on their first call after an install and cached
(``cache=True``): next to the source, or under ``NUMBA_CACHE_DIR`` (set by :mod:`packtool` to a
user cache directory when the install is read-only). This module only looks for that cache; it
imports neither numba nor the kernels.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["kernels_cached", "compile_note"]

_KERNELS = Path(__file__).resolve().parent / "core" / "_kernels.py"


def kernels_cached() -> bool:
    """True when a Numba cache index of ``packtool/core/_kernels.py`` exists."""
    pattern = f"{_KERNELS.stem}.*.nbi"
    if any((_KERNELS.parent / "__pycache__").glob(pattern)):
        return True
    cache = os.environ.get("NUMBA_CACHE_DIR")
    return bool(cache) and any(Path(cache).rglob(pattern))


def compile_note() -> str | None:
    """The line to print before the first kernel call when nothing is cached, else None."""
    if kernels_cached() or os.environ.get("NUMBA_DISABLE_JIT") == "1":
        return None
    return ("packtool: first run after install: compiling the packing kernels (a few seconds, "
            "once; cached for later runs)")
