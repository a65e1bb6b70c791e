"""Shared fixtures: tiny Parquet inputs written into tmp_path, the sample data path, GPU marks."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from packtool.formats.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DATA = ROOT / "sample_data"


def pytest_configure(config):
    """Hugging Face ``datasets`` caches what tests load (``Dataset.from_parquet`` and the like)
    in a directory of the run, removed at its end, not in the user's home (about 5 MB a run
    there). Set before any test imports ``datasets``; xdist workers inherit it."""
    if "HF_DATASETS_CACHE" not in os.environ:
        os.environ["HF_DATASETS_CACHE"] = config._packtool_hf_cache = tempfile.mkdtemp(
            prefix="packtool-tests-hf-datasets-")


def pytest_unconfigure(config):
    cache = getattr(config, "_packtool_hf_cache", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
        del os.environ["HF_DATASETS_CACHE"]


def write_docs(path: Path, docs, *, column: str = "input_ids", value_type=pa.int64(),
               row_group_size: int | None = None) -> Path:
    """Write ``docs`` (list of token lists) as one Parquet file with a list<value_type> column."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: pa.array(docs, pa.list_(value_type))})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def read_rows(out_dir: Path) -> list[dict]:
    """All rows of a packed output, shard by shard in manifest order."""

    manifest = read_manifest(out_dir)
    rows = []
    for entry in manifest.shards:
        rows.extend(pq.read_table(out_dir / entry.file).to_pylist())
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


@pytest.fixture(scope="session")
def s3_endpoint():
    """A local S3-compatible server (moto's server mode) on 127.0.0.1, for the whole session.

    Yields the endpoint URL; skipped when moto is not installed. Nothing leaves the machine.
    """
    import sys

    pytest.importorskip("moto.server")
    sys.path.insert(0, str(ROOT / "scripts"))
    from local_s3 import local_s3

    try:
        with local_s3() as url:
            yield url
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def s3(s3_endpoint, monkeypatch, request):
    """A fresh bucket on the local S3 server; the AWS environment points at it.

    Returns ``(filesystem, bucket)``: a ``pyarrow.fs.S3FileSystem`` and the bucket name.
    """
    import re

    import pyarrow.fs as pafs

    for k, v in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    fs = pafs.S3FileSystem(endpoint_override=s3_endpoint, access_key="testing",
                           secret_key="testing", region="us-east-1", allow_bucket_creation=True,
                           allow_bucket_deletion=True)
    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-")
    fs.create_dir(bucket)
    return fs, bucket
