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
from packtool.formats.manifest import MANIFEST_META_KEY, MANIFEST_NAME, read_manifest

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


def _empty_shard(d):
    d["shards"][1]["rows"] = 0
    d["shards"][1]["row_groups"] = []


def _drop_last(d):
    d["shards"].pop()


@pytest.mark.parametrize("edit, words", [
    (_empty_shard, r"part-00001.parquet: .*rows, the manifest says 0"),
    (_drop_last, "its shards hold"),
    (lambda d: d["totals"].update(rows=999), "its totals say 999"),
])
def test_a_manifest_whose_rows_do_not_add_up_is_refused_by_the_loader_too(tmp_path, edit, words):
    """A shard's entry emptied or dropped (its file with it), or the totals edited: stats
    refused them, the loader served the rows left (12 of 20) without a word."""
    from packtool.loader import PackedDataset, PackedIterableDataset

    src = write_docs(tmp_path / "in" / "a.parquet", DOCS)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "-c", 16, "--rows-per-shard", 5, "--no-shuffle", src, out])
    assert res.exit_code == 0, res.output
    assert len(PackedDataset(out)) == read_manifest(out).totals.rows
    last = read_manifest(out).shards[-1].file
    _edit_manifest(out, edit)
    if edit is _drop_last:
        (out / last).unlink()
    for make in (lambda: PackedDataset(out),
                 lambda: PackedIterableDataset(out, rank=0, world_size=1)):
        with pytest.raises(ManifestError, match=words):
            make()
    res = invoke(["stats", out])
    assert res.exit_code == 1, res.output


def test_a_shard_listed_with_no_rows_must_hold_none():
    """A 0-row entry is never opened by a reader, so its footer is read when the output opens:
    rows the manifest hides are refused, not skipped (edited consistently, totals too)."""
    import tempfile
    from pathlib import Path

    from packtool.formats.packed import PackedOutput

    tmp = Path(tempfile.mkdtemp())
    src = write_docs(tmp / "in" / "a.parquet", DOCS)
    out = tmp / "out"
    assert invoke(["pack", "-q", "-c", 16, "--rows-per-shard", 5, "--no-shuffle", src,
                   out]).exit_code == 0
    hidden = read_manifest(out).shards[1].rows

    def edit(d):
        _empty_shard(d)
        d["totals"]["rows"] -= hidden
    _edit_manifest(out, edit)
    with pytest.raises(ManifestError, match="part-00001.parquet"):
        PackedOutput.open(out)
