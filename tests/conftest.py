"""Shared fixtures: tiny Parquet inputs written into tmp_path, the sample data path, GPU marks."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DATA = ROOT / "sample_data"


def write_docs(path: Path, docs, *, column: str = "input_ids", value_type=pa.int64(),
               row_group_size: int | None = None) -> Path:
    """Write ``docs`` (list of token lists) as one Parquet file with a list<value_type> column."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: pa.array(docs, pa.list_(value_type))})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def read_rows(out_dir: Path) -> list[dict]:
    """All rows of a packed output, shard by shard in manifest order."""
    import json

    manifest = json.loads((out_dir / "manifest.json").read_text())
    rows = []
    for entry in manifest["outputs"]:
        rows.extend(pq.read_table(out_dir / entry["file"]).to_pylist())
    return rows


@pytest.fixture
def docs_dir(tmp_path):
    """Factory: write docs into tmp_path/in/<name>.parquet and return the directory."""

    def make(docs, name="a.parquet", **kw):
        write_docs(tmp_path / "in" / name, docs, **kw)
        return tmp_path / "in"

    return make


@pytest.fixture(scope="session")
def sample_data() -> Path:
    if not any(SAMPLE_DATA.glob("*.parquet")):
        pytest.fail("sample_data/ has no Parquet shards; they are committed with the repository")
    return SAMPLE_DATA
