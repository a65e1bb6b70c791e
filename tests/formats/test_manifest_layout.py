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


def _consumers(out):
    """Every reader of a packed output, as commands (the CLI) or calls (Python)."""
    from packtool.formats.inmemory import packed_batches
    from packtool.formats.packed import PackedOutput
    from packtool.loader import PackedDataset

    commands = [["stats", out], ["verify", "--data-only", out],
                ["export", "--to", "nemo", out, out.parent / "nemo"]]
    calls = [lambda: PackedOutput.open(out), lambda: PackedDataset(out),
             lambda: list(packed_batches(out))]
    return commands, calls


@pytest.mark.parametrize("edit, words", [
    (_drop_last, "its shards hold 10 rows, its totals say 14"),
    (lambda d: d["totals"].update(rows=15), "its shards hold 14 rows, its totals say 15"),
])
def test_every_reader_refuses_a_manifest_whose_rows_do_not_add_up(tmp_path, edit, words):
    """A shard and its entry gone, or the totals edited: export wrote the rows left (a subset,
    exit 0) where stats and the loader refused; every reader now refuses in the one line of
    check_rows_add_up, and export writes nothing."""
    src = write_docs(tmp_path / "in" / "a.parquet", DOCS)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "-c", 16, "--rows-per-shard", 5, "--no-shuffle", src, out])
    assert res.exit_code == 0, res.output
    assert read_manifest(out).totals.rows == 14
    last = read_manifest(out).shards[-1].file
    _edit_manifest(out, edit)
    if edit is _drop_last:
        (out / last).unlink()
    commands, calls = _consumers(out)
    for cmd in commands[2:] + [["verify", "--data-only", "--no-scan", out]]:
        res = invoke(cmd)
        assert res.exit_code == 1 and words in res.output, (cmd, res.output)
        line = [ln for ln in res.output.splitlines() if words in ln]
        assert len(line) == 1 and str(out) in line[0] and "--overwrite" in line[0], res.output
    assert not (out.parent / "nemo").exists()
    for cmd in commands[:2]:  # they recount every total and name the one that differs
        res = invoke(cmd)
        assert res.exit_code == 1 and "rows" in res.output, (cmd, res.output)
    for call in calls:
        with pytest.raises(ManifestError, match=words):
            call()


def _change_one_copy(out, copy: str, old: bytes, new: bytes) -> None:
    """Change ``old`` to ``new`` (same length) in one of the manifest file's two copies of its
    JSON, the file otherwise byte for byte as it was: ``plain`` (the Parquet key-value
    ``packtool.manifest``) or ``arrow`` (inside the base64 ``ARROW:schema``)."""
    import base64
    import re

    path = out / MANIFEST_NAME
    raw = bytearray(path.read_bytes())
    if copy == "plain":
        assert raw.count(old) == 1
        i = raw.index(old)
        raw[i:i + len(old)] = new
    else:
        m = re.compile(rb"[A-Za-z0-9+/=]{200,}").search(bytes(raw), raw.index(b"ARROW:schema"))
        dec = bytearray(base64.b64decode(m.group()))
        i = dec.index(old)
        dec[i:i + len(old)] = new
        first, last = i // 3, (i + len(old) - 1) // 3 + 1  # the base64 quads it spans
        raw[m.start() + 4 * first:m.start() + 4 * last] = \
            base64.b64encode(bytes(dec[3 * first:3 * last]))
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("copy", ["plain", "arrow"])
def test_a_manifest_whose_two_copies_differ_is_refused_by_every_reader(tmp_path, copy):
    """The manifest file holds its JSON twice; a changed byte in the copy readers take renamed
    a --source-column source, and stats and verify passed. Every reader now compares the two
    and refuses in one line naming the manifest file and the fix."""
    import pyarrow as pa

    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": DOCS,
                             "source": ["web" if i % 3 else "code" for i in range(30)]}), src)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "-c", 16, "--source-column", "source", "--no-shuffle", src, out])
    assert res.exit_code == 0, res.output
    assert read_manifest(out).source_values == ("code", "web")
    _change_one_copy(out, copy, b'"code"', b'"cope"')
    manifest = str(out / MANIFEST_NAME)
    words = "its two copies of the manifest differ"
    commands, calls = _consumers(out)
    for cmd in commands + [["upgrade", out]]:
        res = invoke(cmd)
        assert res.exit_code == 1 and words in res.output, (cmd, res.output)
        line = [ln for ln in res.output.splitlines() if words in ln]
        assert len(line) == 1 and manifest in line[0] and "--overwrite" in line[0], res.output
    for call in calls + [lambda: read_manifest(out)]:
        with pytest.raises(ManifestError, match=words):
            call()


@pytest.mark.parametrize("version, edit", [
    (2, lambda d: d.update(format_version=2)),
    (4, lambda d: d.update(format_version=4, outputs=d.pop("shards"))),
])
def test_a_format_version_that_contradicts_the_layout_says_so(packed, version, edit):
    """A version 4 manifest relabelled 2 (or a version 2 layout labelled 4) was a 'malformed
    manifest (KeyError: 'outputs')' in every command and in upgrade."""
    _edit_manifest(packed, edit)
    words = f"format_version {version} contradicts its layout"
    for cmd in (["stats", packed], ["verify", "--data-only", packed],
                ["export", "--to", "nemo", packed, packed.parent / "nemo"],
                ["upgrade", packed]):
        res = invoke(cmd)
        assert res.exit_code == 1 and words in res.output, (cmd, res.output)
        assert "KeyError" not in res.output and str(packed / MANIFEST_NAME) in res.output
    with pytest.raises(ManifestError, match=words):
        read_manifest(packed)


@pytest.mark.parametrize("docs_in", [29, 5])
def test_totals_that_contradict_the_rows_name_the_shard_path_and_the_manifest(packed, docs_in):
    """docs_in edited down: stats said 'part-00000.parquet: row 13 ...: the shards were changed
    after packing', naming the shard without its directory and blaming the shards alone."""
    _edit_manifest(packed, lambda d: d["totals"].update(docs_in=docs_in))
    res = invoke(["stats", packed])
    assert res.exit_code == 1, res.output
    line = [ln for ln in res.output.splitlines() if "docs_in" in ln and "Error" in ln]
    assert len(line) == 1, res.output
    assert str(packed) + "/part-" in line[0], line
    assert "the manifest's totals or the shards were changed" in line[0], line
