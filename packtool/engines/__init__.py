"""Execution engines for windowed packing (the local engine lives in :mod:`packtool.windows`).

Engines decide where windows run, never what they contain: the output bytes are the same for
every engine and worker count.
"""

__all__: list[str] = []
