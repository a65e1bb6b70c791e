"""A command's start-up: the note that the first run compiles the kernels, Python's collector
held while a command imports (:func:`hold_gc`, :func:`release_gc`), and Numba without cffi in
the command line's process (:func:`numba_without_cffi`); measured in ``docs/benchmarks.md``,
"Start-up, third round".

The compile note: the first run compiles the kernels (a few seconds, once: a first ``pack`` of
``sample_data/`` took 3.2 CPU-s against 0.9 with the kernels cached, on a 2-core AMD EPYC VM).

The Numba kernels are compiled on their first call after an install and cached
(``cache=True``): next to the source, or under ``NUMBA_CACHE_DIR`` (set by :mod:`packtool` to a
user cache directory when the install is read-only). This module only looks for that cache; it
imports neither numba nor the kernels.
"""

from __future__ import annotations

import gc
import importlib.machinery
import os
import sys
from pathlib import Path

__all__ = ["kernels_cached", "compile_note", "numba_without_cffi", "hold_gc", "release_gc"]

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


_CFFI_UTILS = "numba.core.typing.cffi_utils"


class _HideCffi:
    """Loader of Numba's cffi module that runs it with ``cffi`` hidden (the real loader does
    the work)."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        missing = object()
        saved = sys.modules.get("cffi", missing)
        sys.modules["cffi"] = None  # ``import cffi`` raises ImportError while this is set
        try:
            self.loader.exec_module(module)
        finally:
            if saved is missing:
                del sys.modules["cffi"]
            else:
                sys.modules["cffi"] = saved


class _NumbaCffiFinder:
    """Finds Numba's cffi module (once) and hands it to :class:`_HideCffi`."""

    def find_spec(self, name, path, target=None):
        if name != _CFFI_UTILS:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _HideCffi(spec.loader)
        return spec


def numba_without_cffi() -> None:
    """Turn off Numba's support for calling cffi functions in this process: for the command
    line's own process only (no packtool kernel calls cffi).

    When cffi is installed (``cryptography`` brings it), Numba's typing registry imports it on
    the first kernel call and builds a C parser: about 0.05 CPU-s of the start-up of every
    command that runs a kernel (``docs/benchmarks.md``). From this call on, Numba's cffi module, when
    it is first imported, runs with ``cffi`` hidden, so it records cffi as missing; nothing
    else changes: Numba is not imported here, and ``cffi`` stays importable by anything else.
    Does nothing when that module is already imported.
    """
    if _CFFI_UTILS in sys.modules or any(isinstance(f, _NumbaCffiFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _NumbaCffiFinder())


#: Allocations between two young-generation collections while a command starts (Python's
#: default is 700): imports and Numba's first kernel call create about a million objects.
_START_THRESHOLD = 1_000_000
_held: tuple | None = None  # the thresholds to restore, while held


def hold_gc() -> None:
    """At a command's start: Python's cyclic garbage collector runs only every
    :data:`_START_THRESHOLD` allocations until :func:`release_gc`.

    Importing NumPy, pyarrow and Numba, and Numba's first kernel call, create about a million
    long-lived objects; with the default thresholds the collector walks them again and again,
    0.3 of the 1.1 CPU-s a ``pack`` of two documents took (``docs/benchmarks.md``). It still
    runs (rarely), so a command that never calls :func:`release_gc` is as safe as before."""
    global _held
    if _held is None:
        _held = gc.get_threshold()
        gc.set_threshold(_START_THRESHOLD, *_held[1:])


def release_gc(freeze: bool = True) -> None:
    """After a command's imports: the objects made so far move to the collector's permanent
    generation (``gc.freeze``: later collections no longer walk them; ``freeze=False`` skips
    that, for a command that ends) and the thresholds held by :func:`hold_gc` come back. Does
    nothing when they are not held."""
    global _held
    if _held is not None:
        if freeze:
            gc.freeze()
        gc.set_threshold(*_held)
        _held = None

