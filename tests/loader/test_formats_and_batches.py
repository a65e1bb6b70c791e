"""What the loader reads and hands out: light import, both per-token column types, derived
labels, windowed outputs mixed, the [B, C] and flattened batches with their checks."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.loader import (PackedDataset, batch_cu_seqlens, convert_labels, shifted_labels,
                             unshifted_labels)

from loader_helpers import pack, random_docs, write_input


def test_import_loads_neither_numba_nor_the_packer_nor_torch():
    """`import packtool.loader` (in every DataLoader worker) stays light."""
    code = ("import sys, packtool.loader; "
            "print([m for m in ('numba', 'torch', 'packtool.core', 'packtool.pipeline', "
            "'packtool.core._kernels') if m in sys.modules])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert res.stdout.strip() == "[]"


def _rewrite_other_list_type_without_labels(out):
    """Rewrite every shard with the per-token columns in the other list type (list<int32> <->
    fixed_size_list<int32>[C]) and no labels column (the manifest entry's bytes and sha256
    updated): both layouts a packed output has had."""
    from packcheck import reseal
    from packtool.formats.manifest import LabelsInfo, read_manifest

    manifest = read_manifest(out)
    C = int(manifest.capacity)
    schema = None
    for entry in manifest.shards:
        path = out / entry.file
        t = pq.read_table(path)
        cols, fields = [], []
        for f in t.schema:
            if f.name == "labels":
                continue
            col = t.column(f.name).combine_chunks()
            if f.name in ("input_ids", "segment_ids", "position_ids"):
                if pa.types.is_fixed_size_list(col.type):
                    col = pa.ListArray.from_arrays(pa.array(np.arange(len(col) + 1) * C,
                                                            pa.int32()), col.flatten())
                else:
                    col = pa.FixedSizeListArray.from_arrays(col.flatten(), C)
            cols.append(col)
            fields.append(pa.field(f.name, col.type))
        meta = dict(t.schema.metadata or {})
        meta[b"packtool.labels_convention"] = b"unshifted"
        schema = pa.schema(fields, metadata=meta)
        pq.write_table(pa.Table.from_arrays(cols, schema=schema), path)
    reseal(out, labels=LabelsInfo(False, "unshifted"))



def test_both_list_types_with_or_without_labels_read_the_same(tmp_path):
    """The same rows come back from one per-token list type with stored labels and from the
    other list type with labels derived (unshifted rule)."""
    src = write_input(tmp_path / "in", random_docs(40, 9, seed=2))
    a = pack(src, tmp_path / "a", 12, "--rows-per-shard", "5", "--labels", "unshifted")
    b = pack(src, tmp_path / "b", 12, "--rows-per-shard", "5", "--labels", "unshifted")
    _rewrite_other_list_type_without_labels(b)
    ta = pq.read_schema(a / PackedDataset(a).output.shards[0]).field("input_ids").type
    tb = pq.read_schema(b / PackedDataset(b).output.shards[0]).field("input_ids").type
    assert pa.types.is_fixed_size_list(ta) != pa.types.is_fixed_size_list(tb)
    da, db = PackedDataset(a), PackedDataset(b)
    assert da.output.labels.stored and not db.output.labels.stored
    assert len(da) == len(db) > 5
    for i in range(len(da)):
        for k in ("input_ids", "segment_ids", "position_ids", "labels", "cu_seqlens"):
            assert np.array_equal(da[i][k], db[i][k]), (i, k)


def test_labels_none_output_derives_unshifted_labels_B03(tmp_path):
    """B03: docs [[11,12,13],[21,22]] at C=6 packed with --labels none load with labels
    [-100,12,13,-100,22,-100] (3 effective targets), shifted on request [12,13,-100,22,-100,-100]."""
    out = pack(write_input(tmp_path / "in", [[11, 12, 13], [21, 22]]), tmp_path / "out", 6,
               "--labels", "none", "--no-shuffle")
    assert PackedDataset(out)[0]["labels"].tolist() == [-100, 12, 13, -100, 22, -100]
    assert PackedDataset(out, labels="shifted")[0]["labels"].tolist() == [12, 13, -100, 22,
                                                                        -100, -100]


@pytest.mark.parametrize("spell", ["file://{}", "file:{}", "file://localhost{}"])
def test_loaders_take_a_file_uri_as_its_local_directory(tmp_path, spell):
    """``file:///abs/out`` (and ``file:/abs/out``, as pathlib folds it, and
    ``file://localhost/abs/out``, RFC 8089's spelling of no host) names the local OUTPUT:
    both datasets read exactly the rows of the plain path."""
    from packtool.loader import PackedIterableDataset

    out = pack(write_input(tmp_path / "in", random_docs(40, 30)), tmp_path / "out", 32)
    uri = spell.format(out.resolve())
    plain, via_uri = PackedDataset(out), PackedDataset(uri)
    assert len(via_uri) == len(plain) > 1
    for i in range(len(plain)):
        assert via_uri[i]["input_ids"].tolist() == plain[i]["input_ids"].tolist()
    rows = [r["input_ids"].tolist() for r in PackedIterableDataset(uri, shuffle=False)]
    assert rows == [r["input_ids"].tolist() for r in PackedIterableDataset(out, shuffle=False)]


def test_loaders_refuse_a_file_uri_of_another_host_or_of_no_absolute_path(tmp_path):
    """``file://HOST/abs/out`` was read as the path ``//HOST/abs/out`` ("no such directory"),
    and ``file:out`` as a folder named ``file:out``: both are a LocationError naming the
    fix, from both datasets."""
    from packtool.errors import LocationError
    from packtool.loader import PackedIterableDataset

    out = pack(write_input(tmp_path / "in", random_docs(40, 30)), tmp_path / "out", 32)
    for uri, says in ((f"file://otherhost{out.resolve()}", "names the host 'otherhost'"),
                      ("file:out", "not a file: URI")):
        for make in (PackedDataset, PackedIterableDataset):
            with pytest.raises(LocationError, match=f"^{re.escape(uri)}: {says}"):
                make(uri)


def test_label_conventions_convert_both_ways_B04_B05():
    """B04/B05: shifted <-> unshifted inside each segment; derived labels agree."""
    ids = np.array([11, 12, 13, 21, 22, 0])
    seg = np.array([1, 1, 1, 2, 2, 0])
    un, sh = unshifted_labels(ids, seg), shifted_labels(ids, seg)
    assert un.tolist() == [-100, 12, 13, -100, 22, -100]
    assert sh.tolist() == [12, 13, -100, 22, -100, -100]
    assert convert_labels(sh, seg, "shifted", "unshifted").tolist() == un.tolist()
    assert convert_labels(un, seg, "unshifted", "shifted").tolist() == sh.tolist()
    masked = un.copy()
    masked[1] = -100  # a stored mask survives the move
    assert convert_labels(masked, seg, "unshifted", "shifted").tolist()[0] == -100


def test_output_in_input_order_is_not_read_in_file_order(tmp_path):
    """An output whose rows follow the input files (``--strategy ordered --no-shuffle``: rows
    in input order, the worst case of an output not shuffled at all) is read by the loader with
    rows of many files from the start, uncorrelated with file order."""
    src = tmp_path / "in"
    for f in range(6):
        write_input(src, [[f * 10_000 + d * 10 + p + 1 for p in range(5)] for d in range(40)],
                    name=f"f{f}.parquet")
    out = pack(src, tmp_path / "out", 16, "--strategy", "ordered", "--rows-per-shard", "4",
               "--no-shuffle")
    torch = pytest.importorskip("torch")  # noqa: F841
    from packtool.loader import PackedIterableDataset

    ds = PackedIterableDataset(out, rank=0, world_size=1, seed=0, shuffle_buffer=8)
    files = [int(it["doc_ids"][0]) // 40 for it in ds]  # input file of each row's 1st document
    in_order = [int(r["doc_ids"][0]) // 40 for r in (PackedDataset(out)[i]
                                                     for i in range(len(ds)))]
    assert in_order == sorted(in_order)  # the output itself walks the files in order
    first = files[: len(files) // 6]
    assert len(set(first)) >= 3, first
    rho = np.corrcoef(np.arange(len(files)), files)[0, 1]
    assert abs(rho) < 0.5, rho


def _fake_rows(B, C):
    z = np.broadcast_to(np.int32(0), (C,))  # no memory: the check runs before any stacking
    return [{"input_ids": z, "cu_seqlens": np.array([0, C])} for _ in range(B)]


def test_cu_seqlens_int32_overflow_is_refused():
    """B x C >= 2**31 cannot be int32 boundaries: OverflowError naming the largest batch, for
    items before they are stacked (1024 rows of 2**21 tokens would be 8 GiB) and for gathered
    rows; the largest batch that fits gets its boundaries (its rows given as a Rows whose
    input_ids take no memory)."""
    from packtool.formats.packed import Rows

    C = 2**21

    def rows(B):
        cu = np.tile(np.array([0, C], dtype=np.int32), B)
        return Rows({"input_ids": np.broadcast_to(np.int32(0), (B, C))},
                    {"cu_seqlens": (cu, np.arange(0, 2 * B + 1, 2, dtype=np.int64))}, {},
                    np.arange(B), np.arange(B), ["s"] * B, "unshifted", {})

    cu, m = batch_cu_seqlens(rows(1023))
    assert cu.dtype == np.int32 and int(cu[-1]) == 1023 * C and m == C
    assert cu.tolist() == [r * C for r in range(1024)]
    for big in (_fake_rows(1024, C), rows(1024)):
        with pytest.raises(OverflowError, match="at most 1023 rows"):
            batch_cu_seqlens(big)

    class Unstackable:  # items refused before their tokens are ever turned into arrays
        def __len__(self):
            return C

        def __array__(self, *args, **kwargs):
            raise AssertionError("the rows were stacked before the check")

    items = [{"input_ids": Unstackable(), "cu_seqlens": np.array([0, C])} for _ in range(1024)]
    with pytest.raises(OverflowError, match="at most 1023 rows"):
        batch_cu_seqlens(items)


def test_flat_batch_has_flash_attention_2_keyword_names_B06_B24(tmp_path):
    """collate_flat: [1, B*C] tensors (ids int32, positions int64 (B28), labels int64: the loss needs
    Long targets), cu_seq_lens_q/k int32 equal to the [B, C] batch's cu_seqlens, max_length_q/k
    Python ints, num_targets = labels != -100."""
    torch = pytest.importorskip("torch")
    from packtool.loader import collate, collate_flat

    out = pack(write_input(tmp_path / "in", random_docs(30, 7, seed=3)), tmp_path / "out", 10)
    ds = PackedDataset(out)
    items = [ds[i] for i in range(4)]
    flat, rows = collate_flat(items), collate(items)
    for k in ("input_ids", "position_ids", "labels"):
        want = torch.int64 if k in ("labels", "position_ids") else torch.int32
        assert flat[k].shape == (1, 40) and flat[k].dtype == rows[k].dtype == want
        assert torch.equal(flat[k].reshape(4, 10), rows[k])
    assert flat["cu_seq_lens_q"].dtype == torch.int32
    assert torch.equal(flat["cu_seq_lens_q"], rows["cu_seqlens"])
    assert flat["cu_seq_lens_k"] is flat["cu_seq_lens_q"]
    assert type(flat["max_length_q"]) is int and flat["max_length_q"] == rows["max_seqlen"]
    assert flat["num_targets"] == rows["num_targets"] == sum(it["num_targets"] for it in items)
    with pytest.raises(ValueError):
        collate([])


def test_hf_collator_rebuilds_segments_from_positions_when_keys_were_dropped(tmp_path):
    """Trainer drops segment_ids/cu_seqlens before the collator: labels converted from a
    shifted output and cu_seq_lens still come out right from position_ids alone."""
    pytest.importorskip("torch")
    from packtool.loader import HFCollator, collate

    out = pack(write_input(tmp_path / "in", random_docs(30, 7, seed=4)), tmp_path / "out", 10,
               "--labels", "shifted")
    ds = PackedDataset(out, labels="shifted")
    items = [ds[i] for i in range(3)]
    stripped = [{k: it[k] for k in ("input_ids", "position_ids", "labels")} for it in items]
    full = HFCollator(flatten=True, flash_attn_kwargs=True, labels_mode="shifted")(stripped)
    ref = collate([PackedDataset(out, labels="unshifted")[i] for i in range(3)])
    assert full["labels"].reshape(3, 10).tolist() == ref["labels"].tolist()
    assert full["cu_seq_lens_q"].tolist() == ref["cu_seqlens"].tolist()
    assert full["use_cache"] is False
