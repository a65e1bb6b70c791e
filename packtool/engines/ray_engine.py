"""``packtool pack --engine ray``: one Ray task per window, on a local Ray or a cluster.

The driver (the ``packtool`` process) lists the inputs, cuts the windows
(:func:`packtool.windows.plan_windows`, Parquet footers only), submits one task per window and
writes the manifest last from the per-window results. Each task runs
:func:`packtool.windows.pack_window` where Ray places it: it reads its window's files, plans them
with OBFD, writes its own shards (temporary name, then ``os.replace``) and returns only names,
sizes, hashes and counts. No tokens go through the Ray object store.

Bytes: a window's shards depend only on the window and the options, so the output equals the
local engine's with the same ``--window-docs`` at any number of Ray workers. Retries: a task
killed with its worker is retried by Ray (``max_retries``); shard names are fixed by (window,
shard) and complete windows leave a marker, so a retry rewrites the same files or skips the
window, never duplicating or losing a shard.

Needs: ``pip install 'packtool[ray]'``; on a cluster, the same packtool version on every node
and INPUT and OUTPUT on a filesystem every node sees at the same path (see docs/ray.md).
"""

from __future__ import annotations

import logging
from typing import Iterator

from packtool.config import PackConfig
from packtool.errors import MissingDependencyError, PacktoolError
from packtool.windows import Window, WindowResult, pack_window, run_windowed

__all__ = ["run_ray", "import_ray"]

log = logging.getLogger(__name__)

#: Ray retries of a window whose worker died (a raised PacktoolError is not retried).
MAX_RETRIES = 3


def import_ray():
    """Import Ray, or raise :class:`MissingDependencyError` naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            "--engine ray needs Ray: pip install 'packtool[ray]'") from None
    return ray


def _map_ray(ray, cfg: PackConfig, windows: list[Window], output: str) -> Iterator[WindowResult]:
    """Submit every window as a task (1 CPU each); yield the results in window order."""
    task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(pack_window)
    refs = [task.remote(cfg, w, output, 1) for w in windows]
    for ref in refs:
        try:
            yield ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            for other in refs:
                ray.cancel(other)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, PacktoolError):
                raise cause from None
            raise


def run_ray(cfg: PackConfig, *, progress: bool = True):
    """Run a windowed pack on Ray (``cfg.window_docs`` set, ``cfg.engine == "ray"``).

    Joins ``cfg.ray_address`` when given, else starts a local Ray instance with ``cfg.workers``
    CPUs; a Ray already initialised in this process (e.g. by a test or a notebook) is used as
    is. A Ray started here is shut down at the end.

    Returns:
        :class:`packtool.pipeline.PackResult`, as :func:`packtool.windows.run_windowed`.

    Raises:
        MissingDependencyError: Ray is not installed.
        ConnectionError: ``cfg.ray_address`` cannot be reached (Ray's own message).
        InputError, SchemaError, OutputError, PackingError: as the local engine.
    """
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        if cfg.ray_address:
            ray.init(address=cfg.ray_address, logging_level=logging.WARNING,
                     log_to_driver=False)
        else:
            ray.init(num_cpus=cfg.workers, include_dashboard=False,
                     logging_level=logging.WARNING, log_to_driver=False)
        started = True
    try:
        return run_windowed(cfg, progress=progress,
                            map_windows=lambda c, ws, out: _map_ray(ray, c, ws, out))
    finally:
        if started:
            ray.shutdown()
