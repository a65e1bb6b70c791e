"""One reader of the packed output for every consumer: the loader's datasets, ``stats`` and
``verify`` see the same rows, labels and boundaries, from a directory or a store, and refuse a
changed shard in one line naming it.

The rows every consumer returns are compared with the shards read directly by pyarrow and labels
rebuilt here from the contract's rule (plain Python, not packtool's), for outputs with stored
labels of each convention, derived labels, and an SFT input labels column.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import invoke, write_docs
from packtool.errors import ManifestError
from packtool.formats.manifest import (FORMAT_VERSION, IN_PROGRESS_NAME, MANIFEST_NAME,
                                       read_manifest)
from packtool.formats.packed import PackedOutput

IGNORE = -100
DOCS = [[(7 * i + k) % 97 + 1 for k in range(1 + (i * 5) % 23)] for i in range(60)]


def _labels_by_hand(ids, seg, convention, mask=None):
    """The contract's labels of one row, in plain Python (``mask[i]`` False: input label -100)."""
    C = len(ids)
    out = [IGNORE] * C
    for i in range(C):
        if convention == "unshifted":
            if seg[i] != 0 and i > 0 and seg[i - 1] == seg[i]:
                out[i] = ids[i] if mask is None or mask[i] else IGNORE
        elif i + 1 < C and seg[i] != 0 and seg[i + 1] == seg[i]:
            out[i] = ids[i + 1] if mask is None or mask[i + 1] else IGNORE
    return out


def _pyarrow_rows(out):
    """Every row straight from the shards (pyarrow, manifest order), as plain lists."""
    rows = []
    for s in read_manifest(out).shards:
        rows.extend(pq.read_table(out / s.file).to_pylist())
    return rows


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The same documents packed with --labels none, unshifted and shifted, and an SFT input
    whose labels column masks every third token (stored labels, masked)."""
    base = tmp_path_factory.mktemp("one_reader")
    src = write_docs(base / "in" / "a.parquet", DOCS)
    outs = {}
    for mode in ("none", "unshifted", "shifted"):
        outs[mode] = base / mode
        res = invoke(["pack", "-q", "-c", 32, "--labels", mode, "--rows-per-shard", 9,
                      "--row-group-mb", 0.0004, src, outs[mode]])
        assert res.exit_code == 0, res.output
    sft = base / "sft" / "a.parquet"
    sft.parent.mkdir()
    labels = [[t if k % 3 else IGNORE for k, t in enumerate(d)] for d in DOCS]
    pq.write_table(pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32())),
                             "labels": pa.array(labels, pa.list_(pa.int32()))}), sft)
    outs["sft"] = base / "sft-out"
    res = invoke(["pack", "-q", "-c", 32, "--rows-per-shard", 9, "--row-group-mb", 0.0004, sft,
                  outs["sft"]])
    assert res.exit_code == 0, res.output
    return outs


def _expected(out, convention):
    """(input_ids, labels, cu_seqlens) of every row, from pyarrow and the hand-written rule."""
    rows = _pyarrow_rows(out)
    got = []
    for r in rows:
        ids, seg = r["input_ids"], r["segment_ids"]
        stored = read_manifest(out).labels
        if stored.stored:  # masks survive: the stored labels moved to the wanted convention
            lab = r["labels"]
            if stored.convention != convention:
                C = len(ids)
                moved = [IGNORE] * C
                for i in range(C):
                    if convention == "unshifted" and i > 0 and seg[i] and seg[i - 1] == seg[i]:
                        moved[i] = lab[i - 1]
                    if convention == "shifted" and i + 1 < C and seg[i] and seg[i + 1] == seg[i]:
                        moved[i] = lab[i + 1]
                lab = moved
        else:
            lab = _labels_by_hand(ids, seg, convention)
        got.append((ids, lab, r["cu_seqlens"]))
    return got


def _loader_rows(out, convention):
    from packtool.loader import PackedDataset

    ds = PackedDataset(out, labels=convention)
    return [(it["input_ids"].tolist(), it["labels"].tolist(), it["cu_seqlens"].tolist())
            for it in (ds[i] for i in range(len(ds)))]


def _iterable_rows(out, convention):
    pytest.importorskip("torch")
    from packtool.loader import PackedIterableDataset

    ds = PackedIterableDataset(out, labels=convention, shuffle=False, rank=0, world_size=1)
    return [(it["input_ids"].tolist(), it["labels"].tolist(), it["cu_seqlens"].tolist())
            for it in ds]


def _reader_rows(out, convention):
    r = PackedOutput.open(out)
    return [(b.tokens["input_ids"][i].tolist(), b.tokens["labels"][i].tolist(), cu.tolist())
            for b in r.iter_blocks(["input_ids", "labels", "cu_seqlens"], convention)
            for i, cu in enumerate(b.ragged_rows("cu_seqlens"))]


@pytest.mark.parametrize("kind", ["none", "unshifted", "shifted", "sft"])
@pytest.mark.parametrize("convention", ["unshifted", "shifted"])
def test_every_consumer_returns_the_rows_the_shards_hold(outputs, kind, convention):
    """PackedDataset, PackedIterableDataset and the reader verify and stats use give the same
    rows, labels in either convention and cu_seqlens as the shards read by pyarrow with labels
    rebuilt by hand; verify's column scan passes on what they return; stats recounts the
    targets the labels hold."""
    out = outputs[kind]
    want = _expected(out, convention)
    assert len(want) > 10
    assert _loader_rows(out, convention) == want
    assert _iterable_rows(out, convention) == want
    assert _reader_rows(out, convention) == want
    from packtool.verify.contract import scan_contract

    r = PackedOutput.open(out)
    scan = scan_contract(r, convention, label_masked=r.manifest.label_masked)
    assert scan.rows_checked == len(want) and not scan.bad, scan.bad
    from packtool.analysis import analyze_packed

    a = analyze_packed(out)
    assert a.stats.effective_targets == sum(sum(x != IGNORE for x in lab) for _, lab, _ in want)
    assert not a.mismatches


def test_the_sft_output_really_masks_and_the_rule_is_not_trivial(outputs):
    """The fixture can fail the parity test: masked labels differ from the boundary rule."""
    rows = _pyarrow_rows(outputs["sft"])
    masked = sum(sum(x != IGNORE for x in r["labels"]) for r in rows)
    plain = sum(sum(x != IGNORE for x in _labels_by_hand(r["input_ids"], r["segment_ids"],
                                                         "unshifted")) for r in rows)
    assert 0 < masked < plain


# -- tamper evidence ------------------------------------------------------------------------------

def _data_page_offset(path, column="input_ids"):
    md = pq.read_metadata(path)
    rg = md.row_group(0)
    for c in range(rg.num_columns):
        cc = rg.column(c)
        if cc.path_in_schema.split(".")[0] == column:
            return cc.data_page_offset + cc.total_compressed_size // 2
    raise AssertionError(column)


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[_data_page_offset(path)] ^= 0x5A
    path.write_bytes(bytes(data))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:-100])


def _corrupt(src, tmp_path, how):
    out = tmp_path / how
    shutil.copytree(src, out)
    if how == "flip":
        _flip_byte(out / "part-00001.parquet")
    elif how == "truncate":
        _truncate(out / "part-00001.parquet")
    else:
        _same_size_swap(out)
    return out


def _same_size_swap(out):
    """Exchange two shards of exactly the same size (the fixture makes them so)."""
    a, b = out / "part-00001.parquet", out / "part-00002.parquet"
    da, db = a.read_bytes(), b.read_bytes()
    assert len(da) == len(db) and da != db
    a.write_bytes(db)
    b.write_bytes(da)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Shards of equal size: one document of exactly C random (incompressible) ids per row, in
    creation order, so zstd stores every page raw and shards of as many rows are as large."""
    base = tmp_path_factory.mktemp("tamper")
    rng = np.random.default_rng(5)
    docs = [rng.integers(2**20, 2**31 - 1, 32).tolist() for _ in range(60)]
    src = write_docs(base / "in" / "a.parquet", docs)
    out = base / "out"
    res = invoke(["pack", "-q", "-c", 32, "--no-shuffle", "--rows-per-shard", 20,
                  "--row-group-mb", 0.0004, src, out])
    assert res.exit_code == 0, res.output
    sizes = [s.bytes for s in read_manifest(out).shards]
    assert len(sizes) == 3 and sizes[1] == sizes[2], sizes
    return out


@pytest.mark.parametrize("how", ["flip", "truncate", "swap"])
def test_a_changed_shard_is_refused_by_stats_verify_and_the_loader(clean, tmp_path, how):
    """One flipped byte in a data page, a truncated file, a shard replaced by another of the
    same size: stats, verify (--data-only, no torch needed) and the loader refuse it in one line
    naming the shard, exit 1; the untouched copy passes all three."""
    out = _corrupt(clean, tmp_path, how)
    shard = str(out / "part-00001.parquet")
    for cmd in (["stats", out], ["verify", "--data-only", out]):
        res = invoke(cmd)
        assert res.exit_code == 1, (cmd, res.output)
        # verify's progress lines ("verify: expecting about ...") may come first
        lines = [ln for ln in res.output.strip().splitlines() if not ln.startswith("verify: ")]
        assert len(lines) == 1 and lines[0].startswith("Error: ") and shard in lines[0], lines
    from packtool.loader import PackedDataset

    with pytest.raises(ManifestError) as err:
        ds = PackedDataset(out)
        for i in range(len(ds)):
            ds[i]
    assert shard in str(err.value) and "\n" not in str(err.value)
    for cmd in (["stats", clean], ["verify", "--data-only", clean]):
        assert invoke(cmd).exit_code == 0


def test_stats_no_hash_still_checks_sizes_and_says_what_it_skipped(clean, tmp_path):
    out = _corrupt(clean, tmp_path, "truncate")
    assert invoke(["stats", "--no-hash", out]).exit_code == 1
    res = invoke(["stats", "--no-hash", clean])
    assert res.exit_code == 0 and "sha256 not checked (--no-hash)" in res.output
    res = invoke(["stats", clean])
    assert "sha256 of" in res.output and "--no-hash skips it" in res.output


def _flip_column(path, column, group=0):
    """One byte flipped in the middle of ``column``'s pages of row group ``group``."""
    cc = next(c for c in (pq.read_metadata(path).row_group(group).column(i)
                          for i in range(pq.read_metadata(path).num_columns))
              if c.path_in_schema.split(".")[0] == column)
    start = cc.dictionary_page_offset or cc.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + cc.total_compressed_size // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def _unseen(text, lead):
    """The column names listed after ``lead`` in ``text``, up to the next parenthesis."""
    from packtool.formats.packed import KNOWN_COLUMNS

    tail = " ".join(text.split()).split(lead, 1)[1].split("(", 1)[0]
    return {c for c in tail.replace(",", " ").split() if c in KNOWN_COLUMNS}


@pytest.fixture(scope="module")
def every_column(tmp_path_factory):
    """Outputs holding every column of the contract between them: stored labels, a source
    column and --segment-multiple (cu_seqlens_unpadded, source_ids); and an SFT input whose
    labels mask targets (stats then reads labels, input_ids and segment_ids)."""
    base = tmp_path_factory.mktemp("every_column")
    rng = np.random.default_rng(11)
    docs = [rng.integers(2**20, 2**31 - 1, int(rng.integers(3, 40))).tolist() for _ in range(80)]
    src = base / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())),
                             "labels": pa.array([[t if k % 3 else IGNORE for k, t in enumerate(d)]
                                                 for d in docs], pa.list_(pa.int32())),
                             "src": [f"s{i % 4}" for i in range(len(docs))]}), src)
    outs = {"full": base / "full", "sft": base / "sft"}
    common = ["pack", "-q", "-c", 32, "--rows-per-shard", 12, "--row-group-mb", 0.0004]
    for args in (["--labels", "unshifted", "--labels-column", "none", "--source-column", "src",
                  "--segment-multiple", 2, src, outs["full"]], [src, outs["sft"]]):
        res = invoke(common + args)
        assert res.exit_code == 0, res.output
    return outs


@pytest.mark.parametrize("kind", ["full", "sft"])
def test_no_hash_says_exactly_which_changed_pages_go_unseen(every_column, tmp_path, kind):
    """Under --no-hash a changed page goes unseen by stats exactly when it belongs to a column
    its integrity line (and, for the common case, the option's help) says it did not read; the
    sha256 and verify's default scan refuse every one."""
    from packtool.cli import cli

    clean = every_column[kind]
    shard = read_manifest(clean).shards[1].file
    columns = [c.split(".")[0] for c in pq.read_schema(clean / shard).names]
    line = next(x for x in invoke(["stats", "--no-hash", clean]).output.splitlines()
                if "integrity" in x)
    unread = _unseen(line, "the pages of")
    assert unread and unread < set(columns)
    if kind == "full":
        help_ = next(p.help for p in cli.commands["stats"].params if p.name == "no_hash")
        assert _unseen(help_, "goes unseen:") & set(columns) == unread
    else:
        assert {"labels", "input_ids", "segment_ids"}.isdisjoint(unread)
    for col in columns:
        out = tmp_path / col
        shutil.copytree(clean, out)
        _flip_column(out / shard, col)
        got = invoke(["stats", "--no-hash", out])
        assert (got.exit_code == 0) == (col in unread), (col, got.output)
        assert invoke(["stats", out]).exit_code == 1, col
        assert invoke(["verify", "--data-only", "--no-hash", out]).exit_code == 1, col


def test_verify_no_hash_no_scan_can_miss_a_page_outside_the_sampled_rows(every_column, tmp_path):
    """As its help says: with --no-scan only the sampled rows' row groups are decoded, so under
    --no-hash a changed page in a row group none of them is in goes unseen (one row sampled, a
    page changed in the first row group of each of the 5 shards: most are not read), while the
    default scan refuses every one."""
    clean = every_column["full"]
    shards = [s.file for s in read_manifest(clean).shards]
    assert len(shards) >= 5
    cmd = ["verify", "--data-only", "--no-hash"]
    seen = []
    for shard in shards:
        out = tmp_path / shard
        shutil.copytree(clean, out)
        _flip_column(out / shard, "input_ids")
        seen.append(invoke(cmd + ["--no-scan", "--rows", 1, out]).exit_code == 1)
        assert invoke(cmd + [out]).exit_code == 1
    assert not all(seen)


def test_the_loader_checks_pages_when_it_reads_them(clean, tmp_path):
    """With its default integrity (no whole-file hash) the loader still refuses the flipped
    byte: the shard opens (size and footer agree) and the damaged page fails its checksum."""
    from packtool.loader import PackedDataset

    out = _corrupt(clean, tmp_path, "flip")
    ds = PackedDataset(out)
    with pytest.raises(ManifestError, match="part-00001.parquet: row group 0 cannot be read"):
        for i in range(len(ds)):
            ds[i]


# -- format versions --------------------------------------------------------------------------------

def _as_version_2(out, edit=None):
    """Rewrite a version-3 manifest as version 2 wrote it (shards untouched); ``edit(old)``
    changes the version-2 record first."""
    import hashlib

    from packtool.formats.manifest import MANIFEST_META_KEY

    path = out / MANIFEST_NAME
    schema = pq.read_schema(path)
    m = json.loads(schema.metadata[MANIFEST_META_KEY])
    old = {"format_version": 2, "packtool_version": "0.1.0", "fingerprint": m["fingerprint"],
           "options": {**m["options"], "capacity": m["capacity"],
                       "labels": "none" if not m["labels"]["stored"] else m["labels"]["convention"]},
           "labels_shifted": m["labels"]["convention"] == "shifted",
           "labels": m["labels"], "columns": schema.names, "inputs": m["inputs"],
           "outputs": [{k: s[k] for k in ("file", "rows", "bytes", "sha256")}
                       for s in m["shards"]],
           "totals": m["totals"]}
    if edit is not None:
        edit(old)
    meta = dict(schema.metadata)
    meta[MANIFEST_META_KEY] = json.dumps(old).encode()
    pq.write_table(schema.with_metadata(meta).empty_table(), path)
    assert hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest_json(out) -> tuple[dict, pa.Schema]:
    from packtool.formats.manifest import MANIFEST_META_KEY

    schema = pq.read_schema(out / MANIFEST_NAME)
    return json.loads(schema.metadata[MANIFEST_META_KEY]), schema


@pytest.mark.parametrize("version", [2, 3])
def test_an_older_manifest_counting_truncation_apart_reads_in_this_versions_meaning(
        tmp_path, version):
    """Public case B11 on an output of format version 3 (or 2), whose totals left the tails
    ``--overflow truncate`` cut out of ``tokens_dropped``: ``read_manifest`` and ``packtool
    stats --json`` report them in this version's meaning (tokens_dropped = 2, every input token
    not written, tokens_in = real + tokens_dropped), and ``packtool upgrade`` writes them so."""
    from packtool.formats.manifest import MANIFEST_META_KEY

    src = write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3, 4, 5, 6]])
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--no-shuffle", "-c", 4, "--overflow", "truncate", src, out])
    assert res.exit_code == 0, res.output
    m, schema = _manifest_json(out)
    assert m["format_version"] == FORMAT_VERSION
    assert (m["totals"]["tokens_truncated"], m["totals"]["tokens_dropped"]) == (2, 2)
    if version == 2:
        _as_version_2(out)
        m, schema = _manifest_json(out)
    m["format_version"] = version
    m["totals"]["tokens_dropped"] -= m["totals"]["tokens_truncated"]  # the older meaning
    m["totals"]["tokens_lost"] = 2  # then tokens_truncated + tokens_dropped
    meta = dict(schema.metadata)
    meta[MANIFEST_META_KEY] = json.dumps(m).encode()
    pq.write_table(schema.with_metadata(meta).empty_table(), out / MANIFEST_NAME)
    t = read_manifest(out).totals
    assert read_manifest(out).format_version == version
    assert (t.tokens_dropped, t.tokens_truncated, t.docs_truncated, t.tokens_lost) == (2, 2, 1, 2)
    res = invoke(["stats", "--json", out])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    s = got["stats"]
    assert (s["tokens_dropped"], s["tokens_truncated"], s["real_tokens"], s["tokens_in"]) == \
        (2, 2, 4, 6)
    assert not got["mismatches"]
    # the same pack rerun finds it there, read as it is, and says how to rewrite it
    res = invoke(["pack", "--no-shuffle", "-c", 4, "--overflow", "truncate", src, out])
    assert res.exit_code == 0 and res.output.strip() == (
        f"{out}: already holds this pack (same inputs, options and versions) (its manifest is "
        f"format version {version}: packtool upgrade {out} rewrites it as version "
        f"{FORMAT_VERSION}); nothing to do"), res.output
    assert read_manifest(out).format_version == version
    res = invoke(["upgrade", out])
    assert res.exit_code == 0 and f"format version {FORMAT_VERSION}" in res.output, res.output
    m, _ = _manifest_json(out)
    assert m["format_version"] == FORMAT_VERSION
    assert (m["totals"]["tokens_truncated"], m["totals"]["tokens_dropped"]) == (2, 2)
    assert read_manifest(out).totals == t


def test_a_version_2_output_reads_as_it_is_and_upgrades_in_place(clean, tmp_path):
    out = tmp_path / "v2"
    shutil.copytree(clean, out)
    _as_version_2(out)
    before = {p.name: p.read_bytes() for p in out.glob("part-*.parquet")}
    assert read_manifest(out).format_version == 2
    assert _reader_rows(out, "unshifted") == _reader_rows(clean, "unshifted")
    assert invoke(["stats", out]).exit_code == 0
    res = invoke(["upgrade", out])
    assert res.exit_code == 0 and f"format version {FORMAT_VERSION}" in res.output, res.output
    m = read_manifest(out)
    assert m.format_version == FORMAT_VERSION and m.indexed
    assert all(s.footer_sha256 for s in m.shards)
    assert m.shards == read_manifest(clean).shards
    assert {p.name: p.read_bytes() for p in out.glob("part-*.parquet")} == before
    assert "nothing to do" in invoke(["upgrade", out]).output


def test_upgrade_refuses_a_changed_shard(clean, tmp_path):
    out = tmp_path / "v2bad"
    shutil.copytree(clean, out)
    _as_version_2(out)
    _flip_byte(out / "part-00001.parquet")
    res = invoke(["upgrade", out])
    assert res.exit_code == 1 and "part-00001.parquet" in res.output
    assert read_manifest(out).format_version == 2


def _capacity(m):
    m["options"]["capacity"] *= 2


def _labels_flipped(m):
    stored = not m["labels"]["stored"]
    m["options"]["labels"] = m["labels"]["convention"] if stored else "none"
    m["labels"] = {**m["labels"], "stored": stored}


def _rows(m):
    m["outputs"][1]["rows"] = 5


def _totals(m):
    m["totals"]["rows"] += 3


@pytest.mark.parametrize("edit,said", [(_capacity, "schema metadata says capacity"),
                                       (_labels_flipped, "the manifest says labels are"),
                                       (_rows, "the manifest says 5"),
                                       (_totals, "its totals say")])
def test_upgrade_refuses_a_manifest_its_readers_refuse(clean, tmp_path, edit, said):
    """A version-2 manifest whose capacity, labels or row counts contradict its shards: every
    reader refuses it, so upgrade must not vouch for it (it rewrote it as version 3 and said
    so, replacing an edited row count by the footer's in silence)."""
    out = tmp_path / "v2edited"
    shutil.copytree(clean, out)
    _as_version_2(out, edit)
    assert invoke(["stats", out]).exit_code == 1
    res = invoke(["upgrade", out])
    assert res.exit_code == 1 and said in res.output, res.output
    assert read_manifest(out).format_version == 2


def test_an_output_of_format_version_1_is_named_and_replaced_by_overwrite(clean, tmp_path):
    """Format version 1 kept its manifest in manifest.json: every command called such an output
    an interrupted or damaged pack, and pack --overwrite refused its files as the user's. Now
    each reader names the version and the fix, and --overwrite replaces the old output whole;
    a manifest.json of other content stays the user's."""
    from packtool.loader import PackedDataset

    src = tmp_path / "in" / "a.parquet"
    write_docs(src, [[5, 6, 7], [8, 9]])
    old = tmp_path / "v1"
    old.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[5, 6, 7, 8]], pa.list_(pa.int32()))}),
                   old / "part-00000.parquet")  # no footer key names it: the list does
    (old / "manifest.json").write_text(json.dumps(
        {"format_version": 1, "options": {"capacity": 8},
         "outputs": [{"file": "part-00000.parquet", "rows": 1, "bytes": 1, "sha256": "0"}]}))
    said = "an output of packtool format version 1 (its manifest.json)"
    for command in ("stats", "verify", "upgrade"):
        res = invoke([command, old])
        assert res.exit_code == 1 and said in res.output, (command, res.output)
    with pytest.raises(ManifestError, match=r"format version 1 .*--overwrite"):
        PackedDataset(old)
    for extra in ((), ("--skip-unsupported",)):  # as INPUT: packed rows, never documents
        res = invoke(["pack", "-q", "-c", 8, *extra, old, tmp_path / f"again{len(extra)}"])
        assert res.exit_code == 1 and "is a packtool output (manifest.json, format version 1)" \
            in res.output, res.output
    res = invoke(["pack", "-q", "-c", 8, src, old])
    assert res.exit_code == 1 and "holds a pack of format version 1" in res.output, res.output
    assert invoke(["pack", "-q", "-c", 8, "--overwrite", src, old]).exit_code == 0
    assert sorted(p.name for p in old.iterdir()) == [MANIFEST_NAME, "part-00000.parquet"]
    assert read_manifest(old).num_rows == 1
    mine = tmp_path / "mine"  # a manifest.json of the user's own: never deleted
    mine.mkdir()
    (mine / "manifest.json").write_text('{"format_version": "mine"}')
    res = invoke(["pack", "-q", "-c", 8, "--overwrite", src, mine])
    assert res.exit_code == 1 and "did not write (manifest.json)" in res.output, res.output
    assert (mine / "manifest.json").is_file()


def test_opening_reads_no_shard(clean, monkeypatch):
    """The index comes from the manifest: opening an output (and len) touches no shard file."""
    from packtool.location import LocalPath

    opened = []
    real = LocalPath.open_input
    monkeypatch.setattr(LocalPath, "open_input", lambda self: opened.append(self) or real(self))
    r = PackedOutput.open(clean)
    assert r.num_rows == read_manifest(clean).num_rows and opened == []
    r.read_row(0)
    assert [p.name for p in opened] == ["part-00000.parquet"]


def test_columns_that_the_output_lacks_are_refused_when_the_dataset_is_built(clean):
    from packtool.loader import PackedDataset

    with pytest.raises(ManifestError, match="no column"):
        PackedDataset(clean, columns=["input_ids", "attention_mask"])
    assert os.path.isdir(clean)


@pytest.mark.parametrize("when", ["checking", "publishing"])
def test_ctrl_c_during_upgrade_leaves_the_old_manifest_or_the_new_one(clean, tmp_path,
                                                                     monkeypatch, when):
    """Ctrl-C while the shards are checked: exit 130, a line saying OUTPUT is unchanged, the
    version-2 manifest and no temporary file left. Ctrl-C once the rewrite began: held until the
    new manifest is in place, and the upgrade ends as a success."""
    import os
    import signal

    import packtool.formats.upgrade as upgrade

    out = tmp_path / "v2"
    shutil.copytree(clean, out)
    _as_version_2(out)
    if when == "checking":
        real_check = upgrade.check_shards

        def check_then_ctrl_c(*a, **kw):
            signal.raise_signal(signal.SIGINT)
            return real_check(*a, **kw)

        monkeypatch.setattr(upgrade, "check_shards", check_then_ctrl_c)
    else:
        real_replace = os.replace

        def replace_then_ctrl_c(src, dst):
            real_replace(src, dst)
            signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(os, "replace", replace_then_ctrl_c)
    res = invoke(["upgrade", out])
    if when == "checking":
        assert res.exit_code == 130, res.output
        assert res.output.strip() == (f"Error: interrupted: {out} is unchanged (its manifest was "
                                      "not rewritten); rerun the same command to upgrade it")
        assert read_manifest(out).format_version == 2
    else:
        assert res.exit_code == 0 and f"format version {FORMAT_VERSION}" in res.output, res.output
        assert read_manifest(out).format_version == FORMAT_VERSION
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("kind, command", [("packed", "pack"), ("tokenized", "tokenize")])
def test_a_damaged_output_asks_for_the_command_that_wrote_it(outputs, tmp_path, kind, command):
    """A shard missing, resized, unlisted or rewritten: the line says to rerun the command that
    wrote the output (``packtool tokenize`` for a tokenized one, not ``pack``)."""
    import dataclasses

    from packtool.formats.manifest import check_shards

    out = tmp_path / "o"
    shutil.copytree(outputs["none"], out)
    m = dataclasses.replace(read_manifest(out), kind=kind)
    first = out / m.shards[0].file
    overwrite = f"rerun the same packtool {command} with --overwrite"
    # a pack's own rerun packs a shard missing or resized again (its fingerprint is the
    # manifest's, its shards not all there): the simpler fix is named
    plain = ("rerun the same packtool pack command, which packs it again" if command == "pack"
             else overwrite)
    data = first.read_bytes()
    for damage in ("missing", "resized", "extra", "rewritten"):
        want = plain if damage in ("missing", "resized") else overwrite
        if damage == "missing":
            first.unlink()
        elif damage == "resized":
            first.write_bytes(data + b"x")
        elif damage == "extra":
            shutil.copy(out / m.shards[1].file, out / "part-99999.parquet")
        else:
            first.write_bytes(bytes([data[0] ^ 1]) + data[1:])
        with pytest.raises(ManifestError, match=want):
            check_shards(out, m, hashes=True)
        first.write_bytes(data)
        (out / "part-99999.parquet").unlink(missing_ok=True)
    check_shards(out, m, hashes=True)


def test_a_reader_of_an_output_packed_again_since_it_opened_says_so(tmp_path):
    """pack --overwrite replaced the output while a dataset held it open: the shard it reads
    next is another file, and the message says the output was packed again and to open it
    again (it called the shard modified or truncated and said to repack)."""
    from packtool.loader import PackedDataset

    rng = np.random.default_rng(7)
    src = write_docs(tmp_path / "in" / "a.parquet",
                     [rng.integers(1, 5000, int(rng.integers(1, 30))).tolist()
                      for _ in range(200)])
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 32, "--rows-per-shard", 40, src, out]).exit_code == 0
    ds = PackedDataset(out)
    ds[0]
    assert invoke(["pack", "-q", "-c", 32, "--rows-per-shard", 60, "--overwrite", src,
                   out]).exit_code == 0
    with pytest.raises(ManifestError, match="packed again since it was opened .*open it again"):
        ds[len(ds) - 1]
    assert len(PackedDataset(out)) == len(ds)


def test_a_shard_deleted_after_the_output_was_opened_is_called_missing(clean, tmp_path):
    """Not a file-descriptor limit ("lower max_open_files or raise ulimit -n")."""
    from packtool.loader import PackedDataset

    out = tmp_path / "gone"
    shutil.copytree(clean, out)
    ds = PackedDataset(out)
    (out / "part-00002.parquet").unlink()
    with pytest.raises(ManifestError, match=r"part-00002\.parquet: missing \(deleted or moved.*"
                                            "rerun the same packtool pack command, which packs "
                                            "it again"):
        ds[len(ds) - 1]


def test_ctrl_c_once_the_upgrade_is_done_finishes_it(clean, tmp_path):
    """A signal after the manifest was rewritten (the command printing its line) exits 0 with
    "rewritten"; it said "unchanged (its manifest was not rewritten)" with exit 130 beside a
    version-3 manifest."""
    from packcheck import signals_after_run

    out = tmp_path / "v2"
    shutil.copytree(clean, out)
    _as_version_2(out)
    proc = signals_after_run("packtool.formats.upgrade", "upgrade_manifest", 1, ["upgrade", out])
    assert proc.returncode == 0, proc.stderr
    assert f"manifest rewritten as format version {FORMAT_VERSION}" in proc.stdout, proc.stdout
    assert read_manifest(out).format_version == FORMAT_VERSION


def test_upgrade_and_pack_hold_off_each_other_through_outputs_lock(clean, tmp_path):
    """An upgrade while a pack writes OUTPUT (its lock held) is refused in one line and
    rewrites nothing; a pack, or a second upgrade, started while an upgrade holds the lock is
    refused, and the upgrade then finishes. A lock held before any marker is written names no
    command it cannot know: another packtool run (an upgrade held off by an upgrade was told
    a pack was writing)."""
    import signal
    import subprocess
    import sys

    from packcheck import paused_pack

    out = tmp_path / "v2"
    shutil.copytree(clean, out)
    _as_version_2(out)
    before = (out / MANIFEST_NAME).read_bytes()
    src = clean.parent / "in" / "a.parquet"
    with paused_pack(src, out, "read:0", ["--overwrite", "-c", 32], stop=signal.SIGINT):
        res = invoke(["upgrade", out])
        assert res.exit_code == 1, res.output
        assert res.output.strip() == (
            f"Error: {out}: another packtool run is writing OUTPUT now (its lock "
            ".packtool.lock is held); wait for it to end, then rerun packtool upgrade")
        assert (out / MANIFEST_NAME).read_bytes() == before
    assert (out / MANIFEST_NAME).read_bytes() == before  # the pack stopped before writing
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT="upgrade")
    proc = subprocess.Popen([sys.executable, "-m", "packtool", "upgrade", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert "test pause at upgrade" in proc.stderr.readline()
        res = invoke(["pack", "-q", "--overwrite", "-c", 32, src, out])
        assert res.exit_code == 1, res.output
        assert "is writing this OUTPUT (lock .packtool.lock is held)" in res.output, res.output
        assert (out / MANIFEST_NAME).read_bytes() == before
        res = invoke(["upgrade", out])
        assert res.exit_code == 1 and res.output.strip() == (
            f"Error: {out}: another packtool run is writing OUTPUT now (its lock "
            ".packtool.lock is held); wait for it to end, then rerun packtool upgrade"), \
            res.output
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 130, proc.stderr.read()
    assert read_manifest(out).format_version == 2 and not (out / ".packtool.lock").exists()
    res = invoke(["upgrade", out])
    assert res.exit_code == 0 and f"format version {FORMAT_VERSION}" in res.output, res.output


def test_an_upgrade_held_off_by_a_pack_that_marked_output_names_the_pack(clean, tmp_path):
    """Once the run holding OUTPUT's lock wrote its in-progress marker, the marker says what
    it is: the upgrade names that pack."""
    import signal

    from packcheck import paused_pack

    out = tmp_path / "v2"
    shutil.copytree(clean, out)
    _as_version_2(out)
    src = clean.parent / "in" / "a.parquet"
    with paused_pack(src, out, "write-shard:0", ["--overwrite", "-c", 32], stop=signal.SIGINT):
        assert (out / IN_PROGRESS_NAME).is_file()
        res = invoke(["upgrade", out])
        assert res.exit_code == 1 and res.output.strip() == (
            f"Error: {out}: another packtool pack is writing OUTPUT now (its lock "
            ".packtool.lock is held); wait for it to end, then rerun packtool upgrade"), \
            res.output


def test_a_shard_that_is_a_git_lfs_pointer_says_git_lfs_pull(clean, tmp_path):
    """A packed output cloned without git-lfs holds pointers in place of its shards: the size
    check said the shard was modified or truncated and to pack again; stats, verify and a
    dataset opened before the shard was replaced say it is a Git LFS pointer and to run
    git lfs pull."""
    from packtool.loader import PackedDataset

    out = tmp_path / "lfs"
    shutil.copytree(clean, out)
    ds = PackedDataset(out)
    shard = out / "part-00002.parquet"
    pointer = (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64
               + b"\nsize %d\n" % shard.stat().st_size)
    shard.write_bytes(pointer)
    for command in (["stats", "--no-hash"], ["verify"]):
        res = invoke([*command, out])
        assert res.exit_code != 0, res.output
        assert "part-00002.parquet: size " in res.output, res.output
        assert "the shard is a Git LFS pointer" in res.output and "git lfs pull" in res.output
        assert "--overwrite" not in res.output and "truncated" not in res.output, res.output
    with pytest.raises(ManifestError, match=r"part-00002\.parquet: size .*the shard is a Git "
                                            r"LFS pointer.*git lfs pull"):
        ds[len(ds) - 1]
    shard.write_bytes(b"PAR1" + pointer)  # truncated Parquet: still to pack again
    with pytest.raises(ManifestError, match="modified or truncated; rerun the same packtool "
                                            "pack command, which packs it again"):
        PackedDataset(out)
