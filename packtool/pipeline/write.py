"""Write: the one shard loop. Every shard of every pack is written by :func:`write_shard_task`.

A shard is ``rows_per_shard`` output rows, laid out ``rows_per_group`` at a time (one Parquet row
group each, so memory stays at one row group per worker), written under a unique temporary name
locally and published whole under its pending name (a rename in a directory, one upload to an
object store), which the commit changes to its final name just before the manifest is written.
Its bytes depend only on the windows' plans, the read parts' spills and on which window each of
its rows comes from, never on the engine or the worker count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.formats.manifest import ShardEntry
from packtool.formats.object_store import read_session
from packtool.formats.schema import packed_schema, shard_schema
from packtool.formats.writer import rows_to_table, shard_num_targets, write_shard
from packtool.output import (check_scratch_seen, discard_shard_temp, finished_shard,
                             kept_shard, publish_shard, shard_temp)
from packtool.pipeline.layout import RowBuffers, ShardRows, ShardSources, layout_group
from packtool.pipeline.spill import SpillReader
from packtool.signals import check, test_pause

__all__ = ["ShardJob", "write_shard_task"]


@dataclass(frozen=True)
class ShardJob:
    """One output shard to write (small: it crosses processes)."""

    index: int  #: shard number
    name: str  #: final file name
    windows: np.ndarray  #: int32[n], the window of each of its rows, in output order
    starts: np.ndarray  #: int64[k], per window present (ascending): first position in its row order
    output: str  #: OUTPUT directory or URI
    tmp: str  #: scratch directory or URI
    reuse: bool  #: keep the shard if it is there already (resuming an identical pack)
    promised: dict | None = None  #: its manifest entry from an interrupted run's marker
    #: a kept shard may be under its final name (False: those hold the finished pack the run
    #: replaces, :attr:`packtool.output.Output.keeps_finished`)
    final: bool = True


def write_shard_task(cfg, job: ShardJob, sources: ShardSources
                     ) -> tuple[ShardEntry, bool, int]:
    """Lay out and write one shard (or keep it when resuming and it is there).

    The shard is written to a local file (:func:`packtool.output.shard_temp`: in the scratch
    directory, or in the task's own temporary directory when OUTPUT is in an object store)
    and published whole (:func:`packtool.output.publish_shard`: a rename, or one upload).

    Args:
        cfg: :class:`packtool.config.PackConfig` (capacity, labels, pad_id, rows_per_group,
            segment_multiple, source_column, compression).
        job: the shard.
        sources: the windows' plans and the read parts' spills.

    Returns:
        (its :class:`~packtool.formats.manifest.ShardEntry`, reused, effective targets of the
        shard: the sum of its ``num_targets``; 0 for a reused shard unless the input had target
        flags).

    Raises:
        OSError: the shard cannot be written (full disk, I/O error, the store refused it), or a
            spill cannot be read.
        KeyboardInterrupt: the run was told to stop (checked between row groups).
    """
    check_scratch_seen(job.tmp)  # a node of a joined cluster with OUTPUT on a disk of its own
    if job.reuse:
        kept = kept_shard(job.output, job.name, job.promised, job.final)
        if kept is not None:
            where = finished_shard(job.output, job.name, job.final)
            targets = shard_num_targets(where) if sources.any_targets else 0
            return kept, True, targets
    schema = shard_schema(packed_schema(cfg.capacity, cfg.labels.value, cfg.segment_multiple,
                                        sources=cfg.source_column is not None), job.name)
    n = job.windows.size
    group = min(n, cfg.rows_per_group)
    targets = [0]

    def tables(reader):
        rows = ShardRows(sources, job.windows, job.starts)
        buffers = RowBuffers(group, cfg.capacity, cfg.labels.value != "none",
                             sources.any_targets, cfg.segment_multiple > 1)
        for lo in range(0, n, cfg.rows_per_group):
            check()
            packed = layout_group(sources, rows, lo, min(n, lo + cfg.rows_per_group),
                                  pad_id=cfg.pad_id, labels=cfg.labels, buffers=buffers,
                                  reader=reader)
            targets[0] += int(packed.num_targets.sum(dtype=np.int64))
            yield rows_to_table(packed, schema)  # written before the buffers are reused
            test_pause("write-shard", job.index)

    tmp = shard_temp(job.tmp, job.name)
    try:
        with read_session(), SpillReader() as reader:  # spills kept open for the task
            w = write_shard(tmp, schema, tables(reader),  # sha256 while writing
                            compression=cfg.compression)
        check()  # a run that is stopping publishes nothing more
        publish_shard(tmp, job.output, job.name)
    finally:
        discard_shard_temp(tmp, job.tmp)
    return (ShardEntry(job.name, n, w.bytes, w.sha256, w.footer_sha256,
                       ShardEntry.run_lengths(w.group_rows)), False, targets[0])
