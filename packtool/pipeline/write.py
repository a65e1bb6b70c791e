"""Write: the one shard loop. Every shard of every pack is written by :func:`write_shard_task`.

A shard is ``rows_per_shard`` output rows, laid out ``rows_per_group`` at a time (one Parquet row
group each, so memory stays at one row group per worker), written under a unique temporary name
in the scratch directory and published under its final name with ``os.replace``. Its bytes
depend only on the plans and its row numbers, never on the engine or the worker count.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.formats.manifest import sha256_file
from packtool.formats.schema import packed_schema
from packtool.formats.writer import rows_to_table, write_shard
from packtool.pipeline.layout import WindowPlans, layout_group
from packtool.signals import check, test_pause

__all__ = ["ShardJob", "write_shard_task", "shard_entry"]


@dataclass(frozen=True)
class ShardJob:
    """One output shard to write (small: it crosses processes)."""

    index: int  #: shard number
    name: str  #: final file name
    rows: np.ndarray  #: int64[n], global row numbers in output order
    output: str  #: OUTPUT directory
    tmp: str  #: scratch directory
    reuse: bool  #: keep the file if it exists already (resuming an identical pack)


def shard_entry(path: Path, rows: int, digest: str | None = None) -> dict:
    """The manifest entry of a finished shard: ``{"file", "rows", "bytes", "sha256"}``.

    ``digest`` is the sha256 the writer took while writing; a shard kept from an interrupted run
    is hashed here (the only place a written shard is read back for its sha256).
    """
    return {"file": path.name, "rows": int(rows), "bytes": path.stat().st_size,
            "sha256": digest if digest is not None else sha256_file(path)}


def write_shard_task(cfg, job: ShardJob, plans: WindowPlans) -> tuple[dict, bool]:
    """Lay out and write one shard (or keep it when resuming and it is there).

    Args:
        cfg: :class:`packtool.config.PackConfig` (capacity, labels, pad_id, rows_per_group).
        job: the shard.
        plans: the windows' saved plans.

    Returns:
        (manifest entry, reused).

    Raises:
        OSError: the shard cannot be written (full disk, I/O error).
        KeyboardInterrupt: the run was told to stop (checked between row groups).
    """
    final = Path(job.output) / job.name
    if job.reuse and final.is_file():
        return shard_entry(final, job.rows.size), True
    schema = packed_schema(cfg.capacity, cfg.labels.value)

    def tables():
        for lo in range(0, job.rows.size, cfg.rows_per_group):
            check()
            packed = layout_group(plans, job.rows[lo:lo + cfg.rows_per_group],
                                  pad_id=cfg.pad_id, labels=cfg.labels)
            yield rows_to_table(packed, schema)
            test_pause("write-shard", job.index)

    tmp = Path(job.tmp) / f"{uuid.uuid4().hex}-{job.name}"
    _, digest = write_shard(tmp, schema, tables())  # sha256 taken while writing
    check()  # a run that is stopping publishes nothing more
    os.replace(tmp, final)
    return shard_entry(final, job.rows.size, digest), False
