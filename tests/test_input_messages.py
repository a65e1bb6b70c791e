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


@pytest.mark.parametrize("command", ["stats", "verify", "export --to nemo"])
def test_folder_above_a_packed_output_names_the_output(tmp_path, command):
    """``pack IN o/par/run1`` then ``stats o/par`` said the manifest of o/par was removed and
    to pack again with --overwrite: o/par is no output, run1 is a complete one."""
    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5]])
    above = tmp_path / "o" / "par"
    assert invoke(["pack", "-q", "-c", 8, src, above / "run1"]).exit_code == 0
    extra = [tmp_path / "nemo"] if command.startswith("export") else []
    line = error_line(command.split() + [above] + extra)
    assert "run1/ is a packed output" in line, line
    assert f"run packtool {command} {above / 'run1'}" in line
    assert "--overwrite" not in line and "removed" not in line
    assert invoke(["pack", "-q", "-c", 8, src, above / "run2"]).exit_code == 0
    line = error_line(command.split() + [tmp_path / "o"] + extra)
    assert "holds the packed outputs par/run1/, par/run2/" in line, line


def test_loader_given_the_folder_above_a_packed_output_names_it(tmp_path):
    from packtool.errors import ManifestError
    from packtool.loader import PackedDataset

    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5]])
    assert invoke(["pack", "-q", "-c", 8, src, tmp_path / "par" / "run1"]).exit_code == 0
    with pytest.raises(ManifestError, match="run1/ is a packed output: give .*par/run1$"):
        PackedDataset(tmp_path / "par")
    # loose shards of a pack whose manifest is gone, beside no output: pack again
    (tmp_path / "par" / "run1" / ".packtool-manifest.parquet").unlink()
    line = error_line(["stats", tmp_path / "par"])
    assert "--overwrite" in line and "is a packed output" not in line
