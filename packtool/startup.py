"""A command's start-up: the note that the first run compiles the kernels, Python's collector
held while a command imports (:func:`hold_gc`, :func:`release_gc`), and, in the command
line's process only, Numba without cffi (:func:`numba_without_cffi`) and NumPy's OpenBLAS
without threads (:func:`numpy_with_one_blas_thread`); measured in ``docs/benchmarks.md``,
"Start-up, third round" and "fourth round".

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
from contextlib import contextmanager
from pathlib import Path

__all__ = ["kernels_cached", "compile_note", "numba_without_cffi", "numpy_with_one_blas_thread",
           "hold_gc", "release_gc"]

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

#: The variables OpenBLAS reads for its thread count, in its own order of precedence.
_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


@contextmanager
def _cffi_hidden():
    """``import cffi`` raises ImportError inside."""
    missing = object()
    saved = sys.modules.get("cffi", missing)
    sys.modules["cffi"] = None
    try:
        yield
    finally:
        if saved is missing:
            del sys.modules["cffi"]
        else:
            sys.modules["cffi"] = saved


@contextmanager
def _one_blas_thread():
    """``OPENBLAS_NUM_THREADS=1`` inside, unless the user set a thread count OpenBLAS reads."""
    if any(name in os.environ for name in _BLAS_THREAD_VARS):
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


class _LoadWithin:
    """Loader that runs the real one (which does the work) inside a context."""

    def __init__(self, loader, within) -> None:
        self.loader = loader
        self.within = within

    def create_module(self, spec):
        with self.within():
            return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        with self.within():
            self.loader.exec_module(module)


class _FirstImportFinder:
    """Finds one module on its first import (then leaves ``sys.meta_path``) and hands it to
    :class:`_LoadWithin`."""

    def __init__(self, name: str, within) -> None:
        self.name = name
        self.within = within

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoadWithin(spec.loader, self.within)
        return spec


def _on_first_import(name: str, within) -> None:
    """Install a :class:`_FirstImportFinder` unless ``name`` is imported or one is there."""
    if name in sys.modules or any(isinstance(f, _FirstImportFinder) and f.name == name
                                  for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _FirstImportFinder(name, within))


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
    _on_first_import(_CFFI_UTILS, _cffi_hidden)


def numpy_with_one_blas_thread() -> None:
    """NumPy's OpenBLAS starts no threads in this process: for the command line's own process
    only (no packtool command multiplies floating-point matrices with NumPy).

    NumPy's wheels load OpenBLAS when NumPy is imported, and OpenBLAS starts one thread per core
    at once (up to 64), whether or not anything ever calls it: 0.05 to 0.1 CPU-s of every
    command's start-up on 2 cores, more on a large node (``docs/benchmarks.md``, "Start-up,
    fourth round"). From this call on, NumPy's first import runs with
    ``OPENBLAS_NUM_THREADS=1`` in the environment, which is removed again once NumPy is loaded,
    so nothing else the command loads or starts (torch, Ray's workers) sees it. Does nothing
    when NumPy is already imported, or when the user set ``OPENBLAS_NUM_THREADS``,
    ``GOTO_NUM_THREADS`` or ``OMP_NUM_THREADS``.
    """
    _on_first_import("numpy", _one_blas_thread)


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

