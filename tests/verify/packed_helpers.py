"""Helpers shared by the verify and stats tests: pack tiny inputs, edit packed shards."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from packtool.cli import cli
from packcheck import reseal
from packtool.formats.manifest import read_manifest


def pack_docs(tmp_path: Path, docs, capacity: int, *extra: str, name: str = "out") -> Path:
    """Write ``docs`` as one input file and pack them (creation order kept) into tmp_path/name."""
    src = tmp_path / f"{name}-in" / "a.parquet"
    src.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int64()))}), src)
    out = tmp_path / name
    res = CliRunner().invoke(cli, ["pack", "--capacity", str(capacity), "--no-shuffle", "-q",
                                   *extra, str(src.parent), str(out)])
    assert res.exit_code == 0, res.output
    return out


def edit_rows(out: Path, fn, shard: int = 0) -> None:
    """Rewrite one shard with ``fn(rows: list[dict]) -> list[dict]`` and fix its manifest entry
    (rows, bytes, sha256), keeping the manifest totals: a broken output that still loads."""
    manifest = read_manifest(out)
    entry = manifest.shards[shard]
    path = out / entry.file
    table = pq.read_table(path)
    rows = fn(table.to_pylist())
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path, compression="zstd")
    reseal(out)
