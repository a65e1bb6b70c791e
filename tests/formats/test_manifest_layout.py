"""The one reader refuses a manifest whose recorded layout contradicts the shards' own schema
metadata (labels convention, capacity, --segment-multiple), so no consumer reads labels shifted
once more or rows of another capacity.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from packcheck import invoke, write_docs
from packtool.errors import ManifestError
from packtool.formats.manifest import MANIFEST_META_KEY, MANIFEST_NAME

DOCS = [[(5 * i + k) % 89 + 1 for k in range(2 + (i * 3) % 11)] for i in range(30)]


def _edit_manifest(out, fn):
    """Change the manifest's JSON in place (its schema metadata untouched), as a hand edit."""
    path = out / MANIFEST_NAME
    schema = pq.read_schema(path)
    meta = dict(schema.metadata)
    doc = json.loads(meta[MANIFEST_META_KEY])
    fn(doc)
    meta[MANIFEST_META_KEY] = json.dumps(doc).encode()
    pq.write_table(schema.empty_table().replace_schema_metadata(meta), path)


@pytest.fixture
def packed(tmp_path):
    src = write_docs(tmp_path / "in" / "a.parquet", DOCS)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "-c", 16, "--labels", "unshifted", "--no-shuffle", src, out])
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["labels"].update(convention="shifted"),
     "labels convention unshifted, the manifest says shifted"),
    (lambda d: d.update(capacity=32), "capacity 16, the manifest says 32"),
    (lambda d: d["options"].update(segment_multiple=4),
     "--segment-multiple 1, the manifest says 4"),
])
def test_a_manifest_that_contradicts_the_shards_layout_is_refused_by_every_consumer(
        packed, edit, words):
    """The loader refuses in one line naming the shard, both values and the fix; stats, verify
    and export exit 1 with the same line. The untouched output reads."""
    from packtool.loader import PackedDataset

    assert PackedDataset(packed)[0]["labels"][1] != -100  # unshifted: the 2nd token is a target
    _edit_manifest(packed, edit)
    shard = str(packed / "part-00000.parquet")
    with pytest.raises(ManifestError) as err:
        PackedDataset(packed)[0]
    msg = str(err.value)
    assert "\n" not in msg and shard in msg and words in msg and "--overwrite" in msg
    for cmd in (["stats", packed], ["verify", "--data-only", packed],
                ["export", "--to", "nemo", packed, packed.parent / "nemo"]):
        res = invoke(cmd)
        assert res.exit_code == 1 and words in res.output, (cmd, res.output)
