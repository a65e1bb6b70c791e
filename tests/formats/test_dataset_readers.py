"""OUTPUT opens as it is, as a directory, in the common Parquet readers and yields exactly the
packed rows: the manifest is a zero-row Parquet file of the same schema that pyarrow skips
(leading ``_``) and the others read as no rows."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from packtool.config import PackConfig
from packtool.errors import ManifestError
from packtool.formats.manifest import MANIFEST_NAME, load_manifest, pending_name, read_manifest
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


def _rows_each_reader_reads(out):
    """Rows pyarrow, polars and duckdb read from the folder ``out`` (folder and glob forms;
    an error: None)."""
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")

    def attempt(read):
        try:
            return read()
        except Exception:
            return None

    return {
        "pyarrow": attempt(lambda: ds.dataset(out).count_rows()),
        "polars": attempt(lambda: pl.scan_parquet(f"{out}/*.parquet").select(pl.len())
                          .collect().item()),
        "polars-dir": attempt(lambda: pl.scan_parquet(out).select(pl.len()).collect().item()),
        "duckdb": attempt(lambda: duckdb.connect().execute(
            f"select count(*) from read_parquet('{out}/*.parquet')").fetchall()[0][0]),
        "duckdb-dir": attempt(lambda: duckdb.connect().execute(
            f"select count(*) from read_parquet('{out}/**/*.parquet')").fetchall()[0][0]),
    }


@pytest.mark.parametrize("stray", ["backup.parquet", ".backup.parquet", "old/part-00000.parquet",
                                   "_old/part-00000.parquet", ".old/part-00000.parquet",
                                   "backup.pq"])
def test_a_copy_a_reader_reads_beside_the_shards_is_refused_by_the_shared_check(packed, tmp_path,
                                                                                stray):
    """What the stray rule (:func:`packtool.formats.manifest.stray_data_files`) rests on: each
    of these copies of a shard makes at least one reader of the folder read more rows than the
    manifest counts, and the check every packtool reader shares refuses it."""
    out = tmp_path / "out"
    shutil.copytree(packed, out)
    n, _ = _expected(out)
    copy = out / stray
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / read_manifest(out).shards[0].file, copy)
    seen = _rows_each_reader_reads(out)
    assert any(v is not None and v > n for v in seen.values()), seen
    with pytest.raises(ManifestError, match="a Parquet file the manifest does not list"):
        load_manifest(out)


def test_a_pending_shard_is_read_by_no_reader(packed, tmp_path):
    """A shard under its pending name (a pack's, before its commit) adds no row in any reader
    of the folder (polars given the folder refuses the odd name), and is no stray."""
    out = tmp_path / "out"
    shutil.copytree(packed, out)
    n, _ = _expected(out)
    first = read_manifest(out).shards[0].file
    shutil.copy(out / first, out / pending_name(first))
    seen = _rows_each_reader_reads(out)
    assert all(v is None or v == n for v in seen.values()), seen
    load_manifest(out, check_hashes=True)
