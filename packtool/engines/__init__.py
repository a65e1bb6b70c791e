"""Engines: where the pack's tasks run. They only map a function over a list of tasks.

An engine knows nothing of windows, shards or manifests: the driver
(:func:`packtool.pipeline.run_pack`) hands it a module-level function and its arguments, and
gets the results back in task order. The output bytes are the same for every engine and worker
count, because every task's result depends only on its arguments.

- :class:`packtool.engines.local.LocalEngine`: threads of this process (``--workers``).
- :class:`packtool.engines.ray_engine.RayEngine`: one Ray task per item, on a local Ray or a
  cluster (``--engine ray``).
"""

from __future__ import annotations

__all__ = ["make_engine"]


def make_engine(engine: str, *, workers: int, ray_address: str | None = None):
    """The engine named ``engine`` (``local`` or ``ray``); use it as a context manager.

    Raises:
        MissingDependencyError: ``ray`` without Ray installed.
    """
    if engine == "ray":
        from packtool.engines.ray_engine import RayEngine

        return RayEngine(workers=workers, address=ray_address)
    from packtool.engines.local import LocalEngine

    return LocalEngine(workers=workers)
