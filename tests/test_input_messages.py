"""What pack, tokenize, stats and verify say of inputs a new user gives them: each message is
one line, names what was found and gives a fix that works when followed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import invoke, write_docs


def error_line(args, code: int = 1) -> str:
    """Run ``packtool ARGS``: it fails with ``code`` and exactly one line, ``Error: ...``."""
    res = invoke(args)
    assert res.exit_code == code, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    return lines[0]


def test_damaged_page_quotes_the_library_error_in_one_line(tmp_path):
    """A Parquet file whose footer is intact but whose pages were cut: pyarrow's error runs over
    several lines (``Couldn't deserialize thrift ...\\nDeserializing page header failed.``);
    the message quotes its first line only."""
    src = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[i, i + 1, i + 2] for i in range(2000)],
                                                   pa.list_(pa.int32()))}), src,
                   compression="none")
    data = src.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[:4] + data[400:])  # pages cut, footer whole
    line = error_line(["pack", "-q", "-c", 8, cut, tmp_path / "out"])
    assert "cut.parquet: row group 0 cannot be read" in line
    assert "thrift" in line and "regenerate it" in line
    assert not (tmp_path / "out").exists()
