"""OUTPUT opens as it is, as a directory, in the common Parquet readers and yields exactly the
packed rows: the manifest is a zero-row Parquet file of the same schema that pyarrow skips
(leading ``_``) and the others read as no rows."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from packtool.config import PackConfig
from packtool.formats.manifest import MANIFEST_NAME, read_manifest
from packtool.formats.packed import PackedOutput
from packtool.pipeline import run_pack


@pytest.fixture(scope="module")
def packed(tmp_path_factory, sample_data):
    out = tmp_path_factory.mktemp("readers") / "out"
    run_pack(PackConfig(inputs=(str(sample_data),), output=str(out), capacity=1024,
                        rows_per_shard=700, workers=2), progress=False)
    return out


def _expected(out):
    """(rows, sum of input_ids) over the shards listed in the manifest."""
    r = PackedOutput.open(out)
    total = sum(int(b.tokens["input_ids"].astype(np.int64).sum())
                for b in r.iter_blocks(["input_ids"]))
    return r.num_rows, total


def test_output_is_only_shards_and_the_manifest(packed):
    """Nothing else sits in OUTPUT once pack is done (no marker, no scratch directory)."""
    names = sorted(os.listdir(packed))
    assert names[0] == MANIFEST_NAME and len(names) > 2
    assert all(n.startswith("part-") and n.endswith(".parquet") for n in names[1:])
    assert pq.read_metadata(packed / MANIFEST_NAME).num_rows == 0
    assert read_manifest(packed).shards[0].file == names[1]


def test_pyarrow_dataset_and_read_table_open_the_directory(packed):
    n, total = _expected(packed)
    for table in (ds.dataset(packed).to_table(), ds.dataset(packed, format="parquet").to_table(),
                  pq.read_table(packed)):
        assert table.num_rows == n
        assert pa.compute.sum(table.column("input_ids").combine_chunks().flatten()).as_py() == total


def test_polars_opens_the_directory(packed):
    pl = pytest.importorskip("polars")
    n, total = _expected(packed)
    assert pl.scan_parquet(packed).select(pl.len()).collect().item() == n
    df = pl.read_parquet(packed, columns=["input_ids"])
    assert df.height == n
    assert int(df["input_ids"].arr.sum().cast(pl.Int64).sum()) == total


def test_duckdb_opens_the_directory(packed):
    duckdb = pytest.importorskip("duckdb")
    n, _ = _expected(packed)
    con = duckdb.connect()
    assert con.execute(f"select count(*) from read_parquet('{packed}')").fetchall()[0][0] == n
    assert con.execute(f"select count(*) from read_parquet('{packed}/*.parquet')"
                       ).fetchall()[0][0] == n


def test_hf_datasets_opens_the_directory(packed, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    n, total = _expected(packed)
    d = datasets.load_dataset("parquet", data_dir=str(packed), split="train",
                              cache_dir=str(tmp_path / "hf"))
    assert d.num_rows == n
    ids = d.with_format("numpy")["input_ids"]
    assert int(np.asarray(ids, dtype=np.int64).sum()) == total
    assert datasets.load_dataset(str(packed), split="train",
                                 cache_dir=str(tmp_path / "hf2")).num_rows == n
