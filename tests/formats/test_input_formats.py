"""Every Arrow integer list layout and every input format gives the same packed bytes as the
plain ``list<int64>`` Parquet input holding the same documents."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from packcheck import hash_tree, invoke, write_docs
from packtool.formats.manifest import MANIFEST_NAME
from packtool.errors import InputError, SchemaError
from packtool.formats.reader import iter_token_batches, list_parts

DOCS = [[5, 6, 7], [1, 2], [9] * 6, [3], [4, 4, 4, 4], [8, 9, 10, 11, 12]]
FIXED = [[i, i + 1, i + 2, i + 3] for i in range(1, 40, 4)]  # fixed length 4


def _pack(src, out, *extra):
    res = invoke(["pack", "-q", "--capacity", 8, *extra, src, out])
    assert res.exit_code == 0, res.output
    return {k: v for k, v in hash_tree(out).items() if k != MANIFEST_NAME}


def _reference(tmp_path, docs, name="ref"):
    src = write_docs(tmp_path / name / "in" / "a.parquet", docs)
    return _pack(src, tmp_path / name / "out")


def _list_view(docs, large=False):
    """A list view whose rows sit in the child array in reverse order (views, not offsets)."""
    values, offsets, sizes = [], [0] * len(docs), [len(d) for d in docs]
    for i in reversed(range(len(docs))):
        offsets[i] = len(values)
        values.extend(docs[i])
    cls = pa.LargeListViewArray if large else pa.ListViewArray
    ot = pa.int64() if large else pa.int32()
    return cls.from_arrays(pa.array(offsets, ot), pa.array(sizes, ot), pa.array(values, pa.int32()))


LAYOUTS = {
    "list<int8>": lambda d: pa.array(d, pa.list_(pa.int8())),
    "large_list<uint16>": lambda d: pa.array(d, pa.large_list(pa.uint16())),
    "list<uint64>": lambda d: pa.array(d, pa.list_(pa.uint64())),
    "list_view<int32>": _list_view,
    "large_list_view<int32>": lambda d: _list_view(d, large=True),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_list_layouts_give_the_same_bytes_as_list(tmp_path, layout):
    ref = _reference(tmp_path, DOCS)
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": LAYOUTS[layout](DOCS)}), src)
    assert _pack(src, tmp_path / "out") == ref


def test_fixed_size_list_gives_the_same_bytes_as_list(tmp_path):
    """What fixed-length tokenization produces (``fixed_size_list<int32>[4]``)."""
    ref = _reference(tmp_path, FIXED)
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(FIXED, pa.list_(pa.int32(), 4))}), src,
                   row_group_size=3)
    assert pq.read_schema(src).field("input_ids").type == pa.list_(pa.int32(), 4)
    assert _pack(src, tmp_path / "out") == ref


def test_chunked_arrow_file_gives_the_same_bytes_as_one_chunk(tmp_path):
    """An Arrow IPC file of several record batches (a chunked column) packs like one chunk."""
    ref = _reference(tmp_path, DOCS)
    table = pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))})
    src = tmp_path / "in" / "a.arrow"
    src.parent.mkdir()
    with pa.ipc.new_file(src, table.schema) as w:
        for b in table.to_batches(max_chunksize=2):
            w.write_batch(b)
    assert pa.ipc.open_file(src).num_record_batches == 3
    assert _pack(src, tmp_path / "out") == ref


@pytest.mark.parametrize("layout", sorted(LAYOUTS) + ["fixed_size_list<int32>[2]"])
def test_list_parts_matches_python_lists(layout):
    """Kernel-free check of the flattening: lengths and values in row order, slices honoured."""
    docs = [[1, 2], [3, 4], [5, 6], [7, 8]] if "fixed" in layout else DOCS
    arr = (pa.array(docs, pa.list_(pa.int32(), 2)) if "fixed" in layout
           else LAYOUTS[layout](docs))
    for lo in range(len(docs)):
        part = arr.slice(lo)
        lengths, values = list_parts(part)
        assert lengths.tolist() == [len(d) for d in docs[lo:]]
        assert values.to_pylist() == [t for d in docs[lo:] for t in d]


def test_out_of_range_checks_hold_for_list_views(tmp_path):
    src = tmp_path / "a.parquet"
    pq.write_table(pa.table({"input_ids": _list_view([[1, 2], [3, -4], [5]])}), src)
    with pytest.raises(SchemaError, match=r"row 1 \(0-based\): negative token id -4"):
        list(iter_token_batches(src, "input_ids"))


def test_fixed_size_list_of_floats_is_refused(tmp_path):
    src = tmp_path / "a.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1.0, 2.0]], pa.list_(pa.float32(), 2))}),
                   src)
    res = invoke(["pack", "-q", src, tmp_path / "out"])
    assert res.exit_code == 1 and "expected a list of integer token ids" in res.output


@pytest.mark.parametrize("suffix", ["arrow", "feather"])
def test_arrow_ipc_file_packs_like_parquet(tmp_path, suffix):
    ref = _reference(tmp_path, DOCS)
    src = tmp_path / "in" / f"a.{suffix}"
    src.parent.mkdir()
    feather.write_feather(pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))}), src,
                          chunksize=4)
    assert _pack(src, tmp_path / "out") == ref


def _save_to_disk(folder, docs, shards=2):
    """What ``datasets.Dataset.save_to_disk`` writes: IPC stream files listed in state.json."""
    folder.mkdir(parents=True)
    names = []
    for i, part in enumerate(np.array_split(np.arange(len(docs)), shards)):
        name = f"data-{i:05d}-of-{shards:05d}.arrow"
        table = pa.table({"input_ids": pa.array([docs[j] for j in part], pa.list_(pa.int32())),
                          "attention_mask": pa.array([[1] * len(docs[j]) for j in part],
                                                     pa.list_(pa.int8()))})
        with pa.ipc.new_stream(folder / name, table.schema) as w:
            w.write_table(table, max_chunksize=2)
        names.append(name)
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    (folder / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": n} for n in names], "_split": None}))
    return folder


def test_hugging_face_save_to_disk_folder_packs_like_parquet(tmp_path):
    ref = _reference(tmp_path, DOCS)
    src = _save_to_disk(tmp_path / "hf", DOCS)
    assert _pack(src, tmp_path / "out") == ref


def test_hugging_face_dataset_dict_asks_for_one_split(tmp_path):
    root = tmp_path / "hf"
    _save_to_disk(root / "train", DOCS)
    _save_to_disk(root / "test", DOCS[:2])
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    res = invoke(["pack", "-q", root, tmp_path / "out"])
    assert res.exit_code == 1, res.output
    assert "splits test, train" in res.output and "train" in res.output.split("e.g.")[1]


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.json", "docs.csv"])
def test_other_formats_get_one_line_naming_the_supported_ones(tmp_path, name):
    src = tmp_path / name
    src.write_text('{"input_ids": [1, 2, 3]}\n')
    out = tmp_path / "out"
    res = invoke(["pack", "-q", src, out])
    assert res.exit_code == 1
    assert res.output.count("\n") == 1, res.output
    for word in (name, "unsupported input format", "Parquet", "Arrow IPC", "Hugging Face"):
        assert word in res.output
    assert not out.exists()


def test_directory_of_jsonl_names_what_it_found_and_what_is_supported(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text("{}\n")
    res = invoke(["pack", "-q", src, tmp_path / "out"])
    assert res.exit_code == 1
    assert "found a.jsonl" in res.output and "Hugging Face" in res.output


def test_feather_v1_is_refused_with_the_fix(tmp_path):
    src = tmp_path / "a.feather"
    src.write_bytes(b"FEA1" + b"\0" * 64)
    res = invoke(["pack", "-q", src, tmp_path / "out"])
    assert res.exit_code == 1 and "Feather v1" in res.output


def test_windows_over_arrow_record_batches_match_parquet_row_groups(tmp_path):
    """--window-docs cuts an IPC file at record batches as it cuts Parquet at row groups."""
    docs = [[i + 1] * (1 + i % 5) for i in range(30)]
    ref_src = tmp_path / "ref" / "a.parquet"
    ref_src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), ref_src,
                   row_group_size=7)
    ref = _pack(ref_src, tmp_path / "ref_out", "--window-docs", 10)
    src = tmp_path / "in" / "a.arrow"
    src.parent.mkdir()
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})
    with pa.ipc.new_file(src, table.schema) as w:
        w.write_table(table, max_chunksize=7)
    assert _pack(src, tmp_path / "out", "--window-docs", 10) == ref


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_row_range_reads_exactly_those_rows(tmp_path, suffix):
    """Any (start, stop) gives the documents start..stop-1, across row groups and batches."""
    docs = [[i + 1] * (1 + i % 4) for i in range(23)]
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})
    src = tmp_path / f"a.{suffix}"
    if suffix == "parquet":
        pq.write_table(table, src, row_group_size=5)
    else:
        with pa.ipc.new_file(src, table.schema) as w:
            w.write_table(table, max_chunksize=5)
    for start, stop in [(0, 23), (3, 4), (4, 11), (10, 10), (5, 20), (22, 23)]:
        got, first = [], None
        for tb in iter_token_batches(src, "input_ids", batch_rows=3, row_range=(start, stop)):
            first = tb.first_row if first is None else first
            ends = np.cumsum(tb.lengths)
            got += [tb.tokens[e - n:e].tolist() for e, n in zip(ends, tb.lengths)]
        assert got == docs[start:stop]
        assert first in (None, start)


def test_real_save_to_disk_folder_packs_in_the_datasets_order(tmp_path):
    """A folder written by ``datasets`` itself (shuffled and selected: save_to_disk writes the
    rows in the dataset's order) packs like the same rows in Parquet."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": DOCS}).shuffle(seed=1).select(range(5))
    ds.save_to_disk(str(tmp_path / "hf"), num_shards=2)
    ref = _reference(tmp_path, [list(d) for d in ds["input_ids"]])
    assert _pack(tmp_path / "hf", tmp_path / "out") == ref


def _damaged_page(path, table, **kw):
    """``table`` written with page checksums (as Spark and parquet-java write them), then 16
    bytes in the middle of its first data page zeroed."""
    pq.write_table(table, path, write_page_checksum=True, compression="none",
                   use_dictionary=False, **kw)
    raw = bytearray(path.read_bytes())
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    mid = col.data_page_offset + col.total_compressed_size // 2
    raw[mid:mid + 16] = bytes(16)
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("extra", [(), ("--window-docs", 10)])
def test_a_page_that_fails_its_checksum_is_refused_not_packed(tmp_path, extra):
    """Without verification the zeroed bytes are read as tokens (and lengths) of other
    documents; with it the page is refused in one line naming the file, whatever the plan."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, 1000, rng.integers(1, 30)).tolist() for _ in range(300)]
    src = _damaged_page(tmp_path / "a.parquet",
                        pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}))
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 32, "--workers", 1, *extra, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "a.parquet: row group 0: a page fails its CRC checksum" in res.output
    assert not out.exists()
    with pytest.raises(InputError, match="CRC checksum"):
        list(iter_token_batches(src, "input_ids", row_range=(100, 200)))


def test_tokenize_reads_text_parquet_with_page_checksums_verified(tmp_path):
    from packtool.formats.text import iter_texts

    src = _damaged_page(tmp_path / "t.parquet", pa.table({"text": ["x" * 64] * 200}))
    with pytest.raises(InputError, match=r"t\.parquet.*checksum"):
        list(iter_texts(src, "parquet", "text"))


def test_a_stream_still_being_written_is_refused_until_its_writer_closes_it(tmp_path):
    """A reader stops at the end of the file as at the end-of-stream marker: without the marker
    check, the batches flushed so far would be packed as the whole file."""
    table = pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))})
    src = tmp_path / "in" / "data.arrows"
    src.parent.mkdir()
    sink = pa.OSFile(str(src), "wb")
    writer = pa.ipc.new_stream(sink, table.schema)
    writer.write_table(table.slice(0, 3))
    sink.flush()
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 8, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert (f"{src} ends without the Arrow end-of-stream marker: it is still being written or "
            "was cut; wait for its writer or regenerate it") in res.output
    assert not out.exists()
    writer.write_table(table.slice(3))
    writer.close()
    sink.close()
    assert _pack(src, out) == _reference(tmp_path, DOCS)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_stream_cut_at_a_message_boundary_or_joined_to_another_is_refused(tmp_path, legacy):
    table = pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))})
    whole = tmp_path / "whole.arrow"
    options = pa.ipc.IpcWriteOptions(use_legacy_format=legacy)
    with pa.ipc.new_stream(whole, table.schema, options=options) as w:
        w.write_table(table, max_chunksize=2)
    assert _pack(whole, tmp_path / "ok") == _reference(tmp_path, DOCS)  # legacy marker too
    data = whole.read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[:-(4 if legacy else 8)])
    (tmp_path / "joined.arrow").write_bytes(data + data)
    for name, words in (("cut.arrow", "ends without the Arrow end-of-stream marker"),
                        ("joined.arrow", f"holds {len(data)} bytes after the Arrow end-of-stream")):
        out = tmp_path / f"out-{name.split('.')[0]}"
        res = invoke(["pack", "-q", "--capacity", 8, tmp_path / name, out])
        assert res.exit_code == 1 and words in res.output and name in res.output, res.output
        assert not out.exists()


@pytest.mark.parametrize("writer", ["datasets map cache", "polars"])
def test_streams_written_by_other_libraries_end_with_the_marker_and_pack(tmp_path, writer):
    if writer == "polars":
        pl = pytest.importorskip("polars")
        src = tmp_path / "a.arrows"
        pl.DataFrame({"input_ids": DOCS}).write_ipc_stream(src)
    else:
        datasets = pytest.importorskip("datasets")
        src = tmp_path / "cache-1.arrow"
        datasets.Dataset.from_dict({"input_ids": DOCS}).map(
            lambda x: {"n": len(x["input_ids"])}, cache_file_name=str(src))
    assert _pack(src, tmp_path / "out") == _reference(tmp_path, DOCS)


def test_tokenize_refuses_a_text_stream_without_its_end_marker(tmp_path):
    from packtool.formats.text import iter_texts

    table = pa.table({"text": ["a b", "c"]})
    src = tmp_path / "t.arrow"
    with pa.ipc.new_stream(src, table.schema) as w:
        w.write_table(table)
    src.write_bytes(src.read_bytes()[:-8])
    with pytest.raises(InputError, match="ends without the Arrow end-of-stream marker"):
        list(iter_texts(src, "arrow", "text"))
