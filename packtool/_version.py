"""The package version, in a module of its own so that modules import it without importing the
package's lazy public names (and their import graph), and the identity of the code beside it."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"


@functools.cache
def code_identity() -> str:
    """The sha256 (64 hex characters) of this packtool's source: every ``.py`` file of the
    package, by path relative to it and content, in path order. Computed once per process
    (about 2 MB read: milliseconds). Two processes with the same :data:`__version__` and
    identity run the same code; a process of a Ray cluster whose packtool differs from the
    driver's is refused by it (:mod:`packtool.engines.ray_engine`)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        h.update(b"%d:%s%d:" % (len(rel), rel, len(data)))
        h.update(data)
    return h.hexdigest()
