"""Packed outputs shared by the loader tests (built once per session through the CLI)."""

from __future__ import annotations

import pytest

from loader_helpers import pack, random_docs, write_input


@pytest.fixture(scope="session")
def many_groups(tmp_path_factory):
    """~150 rows at C = 16 in shards of 7 rows (one row group each, the last one shorter):
    enough row groups that ranks x workers split unevenly."""
    d = tmp_path_factory.mktemp("many_groups")
    write_input(d / "in", random_docs(300, 12, seed=1))
    return pack(d / "in", d / "out", 16, "--rows-per-shard", "7", "--seed", "3")
