"""The packed format: fixed-size per-token columns, labels derived unless asked for, checksums
taken while writing, and what the README table, the manifest and the schema metadata say."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.config import PackConfig
from packtool.formats.manifest import FORMAT_VERSION, read_manifest
from packtool.formats.packed import PackedOutput, labels_in
from packtool.formats.schema import (CAPACITY_META_KEY, FORMAT_VERSION_META_KEY,
                                     LABELS_CONVENTION_META_KEY, packed_columns)


def derive_labels(ids, seg, convention="unshifted"):
    return labels_in(convention, input_ids=ids, segment_ids=seg)
from packtool.pipeline import run_pack


def _pack(src, out, **kw):
    return run_pack(PackConfig(inputs=(str(src),), output=str(out), workers=2, **kw),
                    progress=False)


@pytest.fixture(scope="module")
def three_outputs(tmp_path_factory, sample_data):
    """sample_data packed at C=512 with each --labels mode (same plan, same rows)."""
    base = tmp_path_factory.mktemp("labels")
    outs = {}
    for mode in ("none", "unshifted", "shifted"):
        outs[mode] = base / mode
        _pack(sample_data, outs[mode], capacity=512, labels=mode, rows_per_shard=1000,
              rows_per_group=64)  # same row groups whatever the column count
    return outs


def test_default_stores_no_labels_and_says_what_readers_derive(three_outputs):
    """Default --labels none: no labels column; metadata and manifest name the derived
    convention (unshifted), and list the same columns as the shard schema."""
    assert PackConfig(inputs=("x",), output="y").labels.value == "none"
    out = three_outputs["none"]
    manifest = read_manifest(out)
    schema = pq.read_schema(out / manifest.shards[0].file)
    assert "labels" not in schema.names
    assert schema.metadata[LABELS_CONVENTION_META_KEY] == b"unshifted"
    assert schema.metadata[CAPACITY_META_KEY] == b"512"
    assert schema.metadata[FORMAT_VERSION_META_KEY] == str(FORMAT_VERSION).encode()
    assert (manifest.labels.stored, manifest.labels.convention) == (False, "unshifted")
    assert "labels" not in manifest.options  # the labels fact is recorded once
    assert PackedOutput.open(out).columns == tuple(schema.names) == tuple(packed_columns("none"))
    for mode in ("unshifted", "shifted"):
        m = read_manifest(three_outputs[mode])
        s = pq.read_schema(three_outputs[mode] / m.shards[0].file)
        assert (m.labels.stored, m.labels.convention) == (True, mode)
        assert "labels" in s.names
        assert s.metadata[LABELS_CONVENTION_META_KEY] == mode.encode()


@pytest.mark.parametrize("mode", ["unshifted", "shifted"])
def test_derived_labels_equal_stored_labels(three_outputs, mode):
    """B03/B05: labels derived from input_ids and segment_ids are exactly the stored ones."""
    stored = PackedOutput.open(three_outputs[mode])
    derived = PackedOutput.open(three_outputs["none"])
    assert stored.num_rows == derived.num_rows > 100
    n_targets = 0
    for a, b in zip(stored.iter_blocks(["labels", "input_ids", "num_targets"]),
                    derived.iter_blocks(["input_ids", "segment_ids", "num_targets"])):
        np.testing.assert_array_equal(a.tokens["input_ids"], b.tokens["input_ids"])
        lab = derive_labels(b.tokens["input_ids"], b.tokens["segment_ids"], mode)
        np.testing.assert_array_equal(a.tokens["labels"], lab)
        np.testing.assert_array_equal((lab != -100).sum(axis=1), b.scalars["num_targets"])
        n_targets += int((lab != -100).sum())
    assert n_targets == read_manifest(three_outputs["none"]).totals.effective_targets
    # the reader derives any convention on request, equal to the stored one
    for i in (0, derived.num_rows // 2, derived.num_rows - 1):
        np.testing.assert_array_equal(derived.read_row(i, ["labels"], mode)["labels"],
                                      stored.read_row(i, ["labels"])["labels"])


def test_derive_labels_hand_case():
    """B03/B04: docs [11,12,13] and [21,22] at C=6."""
    ids = np.array([11, 12, 13, 21, 22, 0])
    seg = np.array([1, 1, 1, 2, 2, 0])
    assert derive_labels(ids, seg).tolist() == [-100, 12, 13, -100, 22, -100]
    assert derive_labels(ids, seg, "shifted").tolist() == [12, 13, -100, 22, -100, -100]
    with pytest.raises(ValueError):
        derive_labels(ids, seg[:5])


def test_sha256_is_taken_while_writing_and_matches_the_file(three_outputs):
    """The manifest's sha256 (computed as the bytes went out) is the file's sha256."""
    out = three_outputs["unshifted"]
    manifest = read_manifest(out)
    for o in manifest.shards:
        data = (out / o.file).read_bytes()
        assert o.bytes == len(data)
        assert o.sha256 == hashlib.sha256(data).hexdigest()
    PackedOutput.open(out, integrity="sha256")


def test_capacity_2_pow_22_packs_without_offsets(tmp_path):
    """C = 2**22: per-token columns are fixed_size_list (no int32 offsets that could wrap) and
    the rows hold exactly the documents."""
    C = 2**22
    rng = np.random.default_rng(22)
    lens = [3_000_000, 2_000_000, 1_500_000, 7]
    docs = [rng.integers(0, 131_072, n, dtype=np.int32) for n in lens]
    src = tmp_path / "in.parquet"
    arr = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(lens)]), pa.int32()),
                                   pa.array(np.concatenate(docs)))
    pq.write_table(pa.table({"input_ids": arr}), src)
    out = tmp_path / "out"
    _pack(src, out, capacity=C, shuffle=False)
    reader = PackedOutput.open(out)
    typ = pq.read_schema(out / reader.shards[0]).field("input_ids").type
    assert pa.types.is_fixed_size_list(typ) and typ.list_size == C
    assert reader.num_rows == 2  # obfd: [3.0 M + 7 ...], [2.0 M + 1.5 M]
    seen = {}
    cols = ["input_ids", "segment_ids", "position_ids", "cu_seqlens", "doc_ids", "doc_offsets"]
    for row in (reader.read_row(i, cols) for i in range(reader.num_rows)):
        assert row["input_ids"].shape == (C,) and row["cu_seqlens"][-1] == C
        for k, (d, off) in enumerate(zip(row["doc_ids"], row["doc_offsets"]), start=1):
            piece = row["input_ids"][row["segment_ids"] == k]
            np.testing.assert_array_equal(piece, docs[d][off:off + piece.size])
            assert row["position_ids"][row["segment_ids"] == k][-1] == piece.size - 1
            seen[int(d)] = seen.get(int(d), 0) + piece.size
    assert seen == dict(enumerate(lens))


@pytest.mark.parametrize("mb, labels", [(1.0, "none"), (0.25, "unshifted")])
def test_row_groups_are_sized_by_the_byte_budget(tmp_path, sample_data, mb, labels):
    """--row-group-mb: every row group but a shard's last holds floor(budget / (4 C columns))
    rows, so memory per worker and the cost of one random row do not depend on C."""
    from click.testing import CliRunner

    from packtool.cli import cli
    from packtool.config import rows_per_group_for

    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["pack", "-q", "-c", "2048", "--row-group-mb", str(mb),
                                   "--labels", labels, "--rows-per-shard", "500",
                                   str(sample_data), str(out)])
    assert res.exit_code == 0, res.output
    ncols = 3 if labels == "none" else 4
    want = int(mb * 2**20) // (4 * 2048 * ncols)
    assert rows_per_group_for(mb, 2048, ncols) == want > 1
    for o in read_manifest(out).shards:
        md = pq.read_metadata(out / o.file)
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        assert sizes[:-1] == [want] * (len(sizes) - 1) and 0 < sizes[-1] <= want
    assert rows_per_group_for(1.0, 2**24, 3) == 1


def test_reader_returns_the_same_rows_in_any_access_order(three_outputs):
    """Random read_row, sequential read_row and iter_blocks (decoding ahead in a thread) give
    the same row for every index."""
    out = three_outputs["unshifted"]
    cols = ["input_ids", "labels", "cu_seqlens", "doc_ids", "num_targets"]
    ref = {}
    for b in PackedOutput.open(out).iter_blocks(cols):
        for i, cu in enumerate(b.ragged_rows("cu_seqlens")):
            ref[b.first + i] = (b.tokens["input_ids"][i].copy(), cu.copy())
    r = PackedOutput.open(out)
    assert sorted(ref) == list(range(r.num_rows))
    order = list(range(r.num_rows)) + list(np.random.default_rng(1).permutation(r.num_rows)[:200])
    for i in order:
        row = r.read_row(int(i), cols)
        assert row["index"] == i
        np.testing.assert_array_equal(row["input_ids"], ref[i][0])
        np.testing.assert_array_equal(row["cu_seqlens"], ref[i][1])


def test_lz4_shards_hold_the_same_rows_as_zstd_ones(tmp_path, sample_data):
    """--compression lz4: every column chunk is LZ4_RAW, the rows read back (loader batches
    included) equal the default zstd pack's, the manifest lists the option (a default pack's
    does not, so its fingerprint is unchanged), and an unknown codec is refused."""
    import torch

    from packtool.errors import ConfigError
    from packtool.loader import PackedIterableDataset

    outs = {c: tmp_path / c for c in ("zstd", "lz4")}
    for c, out in outs.items():
        _pack(sample_data, out, capacity=1024, compression=c, rows_per_group=32)
    for c, out in outs.items():
        m = read_manifest(out)
        assert m.options.get("compression") == (None if c == "zstd" else "lz4")
        for s in m.shards:
            md = pq.read_metadata(out / s.file)
            codecs = {md.row_group(g).column(k).compression
                      for g in range(md.num_row_groups) for k in range(md.num_columns)}
            assert codecs == {"ZSTD" if c == "zstd" else "LZ4"}
    a, b = (PackedOutput.open(outs[c]) for c in ("zstd", "lz4"))
    assert a.num_rows == b.num_rows and a.num_rows > 100
    cols = a.default_columns()
    for g in range(a.num_row_groups):
        x, y = a.decode(g, cols), b.decode(g, cols)
        for k in x.tokens:
            np.testing.assert_array_equal(x.tokens[k], y.tokens[k])
        for k in x.ragged:
            for u, v in zip(x.ragged[k], y.ragged[k]):
                np.testing.assert_array_equal(u, v)
    batches = [list(PackedIterableDataset(outs[c], rank=0, world_size=1, batch_size=4, seed=3))
               for c in ("zstd", "lz4")]
    assert len(batches[0]) == len(batches[1]) > 0
    for u, v in zip(*batches):
        for k in ("input_ids", "labels", "position_ids", "segment_ids", "cu_seqlens", "seq_idx"):
            assert torch.equal(u[k], v[k]), k
    assert sum(f.stat().st_size for f in outs["lz4"].glob("*.parquet")) > \
        sum(f.stat().st_size for f in outs["zstd"].glob("*.parquet"))
    with pytest.raises(ConfigError, match="--compression 'gzip': choose zstd or lz4"):
        PackConfig(inputs=("x",), output="y", compression="gzip")


def test_a_finished_pack_of_other_options_is_refused_naming_them(tmp_path, sample_data):
    """Rerunning a finished pack with another --compression (or other options) without
    --overwrite: one line naming what differs, exit 1, the output untouched."""
    from click.testing import CliRunner

    from packtool.cli import cli

    out = tmp_path / "out"
    args = ["pack", "-q", "-c", "1024", str(sample_data), str(out)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    res = CliRunner().invoke(cli, args[:4] + ["--compression", "lz4", "--seed", "2"] + args[4:])
    assert res.exit_code == 1
    assert "holds a finished pack of other options (--seed 0 -> 2, --compression default -> " \
           "lz4); pass --overwrite" in res.output, res.output
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    again = CliRunner().invoke(cli, args[:4] + ["--labels", "shifted"] + args[4:])
    # rows_per_group follows from the labels column and the capacity: no flag sets it, so it
    # is not named beside what the user changed
    assert "(--labels none -> shifted); pass" in again.output, again.output
    again = CliRunner().invoke(cli, args[:3] + ["2048"] + args[4:])
    assert "(--capacity 1024 -> 2048); pass" in again.output, again.output


def test_decode_takes_groups_counted_from_the_end_and_refuses_others(three_outputs):
    """decode(-1) read the last group but numbered its rows from num_rows (past the end);
    decode(G) was a bare NumPy IndexError."""
    out = PackedOutput.open(next(iter(three_outputs.values())))
    G = out.num_row_groups
    last, neg = out.decode(G - 1, ["input_ids"]), out.decode(-1, ["input_ids"])
    assert neg.first == last.first and neg.shard_row0 == last.shard_row0
    assert neg.row(neg.num_rows - 1)["index"] == out.num_rows - 1
    assert np.array_equal(neg.tokens["input_ids"], last.tokens["input_ids"])
    for bad in (G, -G - 1):
        with pytest.raises(IndexError, match=f"row group {bad} out of range for {G} row groups"):
            out.decode(bad, ["input_ids"])
