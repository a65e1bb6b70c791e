"""packtool: pack tokenized documents into fixed-capacity rows for document-masked training.

:func:`pack` (``packtool pack`` as a function) and :func:`pack_dataset` (an in-memory Hugging
Face dataset, Arrow table or list of token sequences, packed) are the Python API
(:mod:`packtool.api`). Importing ``packtool`` is cheap: the Numba kernels (and numba itself)
are imported on first use of :func:`pack_lengths`, :func:`layout_rows` and friends, so
``packtool --help``, ``--version`` and the torch loader never pay for them. When the installed
package directory is read-only, the kernel cache goes to a user cache directory
(``NUMBA_CACHE_DIR``, unless already set).
"""

from __future__ import annotations

import os as _os

from packtool._version import __version__

__all__ = ["__version__", "pack", "pack_dataset", "pack_lengths", "layout_rows", "PackPlan",
           "PackedRows", "PackStats", "IGNORE_INDEX", "Strategy", "Overflow", "LabelMode"]

_LAZY = {
    "pack": "packtool.api", "pack_dataset": "packtool.api",
    "pack_lengths": "packtool.core", "layout_rows": "packtool.core", "PackPlan": "packtool.core",
    "PackedRows": "packtool.core", "PackStats": "packtool.stats", "IGNORE_INDEX": "packtool.types",
    "Strategy": "packtool.types", "Overflow": "packtool.types", "LabelMode": "packtool.types",
}


def _user_cache_dir() -> str:
    base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(base, "packtool", "numba")


if "NUMBA_CACHE_DIR" not in _os.environ and not _os.access(
        _os.path.join(_os.path.dirname(__file__), "core"), _os.W_OK):
    # numba caches next to the source by default; a read-only install could not keep it
    _os.environ["NUMBA_CACHE_DIR"] = _user_cache_dir()


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'packtool' has no attribute {name!r}")


def __dir__():
    # a lazy name once loaded is in globals() too: each name once
    return sorted(set(globals()) | set(_LAZY))
