"""``pack --source-column``: every segment carries its document's source id, the manifest the id
-> value table, whatever the windows; ``stats`` counts per source exactly as a recount does; the
loader hands out per-token source ids; bad columns are refused in one line."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import hash_tree, invoke
from packtool.formats.manifest import read_manifest
from packtool.loader import PackedDataset

SOURCES = ["web", "code", "books", "wiki"]


def _docs(n, seed):
    rng = np.random.default_rng(seed)
    return [[d * 100 + p + 1 for p in range(int(k))] for d, k in
            enumerate(rng.integers(1, 30, n))]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """Two files: string sources (one file dictionary-encoded), documents of 1..29 tokens; the
    sources change along the documents (runs of 50), so windows of 37 documents each see
    another set of values and number them differently."""
    d = tmp_path_factory.mktemp("sources") / "in"
    d.mkdir()
    a, b = _docs(150, 1), _docs(60, 2)
    pq.write_table(pa.table({"input_ids": a, "source": [SOURCES[i // 50] for i in range(150)]}),
                   d / "a.parquet")
    lang = pa.array([SOURCES[3 - (i % 2)] for i in range(60)]).dictionary_encode()
    pq.write_table(pa.table({"input_ids": b, "source": lang}), d / "b.parquet")
    return d


def input_values(src: Path, column="source") -> list:
    """Each input document's source value, in global document order."""
    out = []
    for f in sorted(src.glob("*.parquet")):
        out += pq.read_table(f, columns=[column]).column(column).to_pylist()
    return out


def pack(src, out, *extra):
    res = invoke(["pack", "-q", "--capacity", "64", "--rows-per-shard", "9", "--workers", "1",
                  "--source-column", "source", *extra, src, out])
    assert res.exit_code == 0, res.output
    return out


def rows_of(out):
    ds = PackedDataset(out)
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("extra", [[], ["--window-docs", "37"]])
def test_every_segment_carries_its_documents_source(src, tmp_path, extra):
    """source_ids[j] names the value of document doc_ids[j] in the manifest's table (sorted
    values over all files and windows), for one plan and for windows of 37 documents."""
    out = pack(src, tmp_path / "out", *extra)
    m = read_manifest(out)
    values = input_values(src)
    assert m.source_column == "source" and m.source_values == tuple(sorted(set(values)))
    segments = 0
    for row in rows_of(out):
        assert len(row["source_ids"]) == len(row["doc_ids"])
        for doc, sid in zip(row["doc_ids"], row["source_ids"]):
            assert m.source_values[sid] == values[doc]
        segments += len(row["doc_ids"])
    assert segments == m.totals.segments
    res = invoke(["verify", "--data-only", out])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("typ", [pa.int16(), pa.uint64()])
def test_integer_sources_keep_their_values(tmp_path, typ):
    """An integer column (e.g. a dataset id) keeps its integers in the table, sorted."""
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"input_ids": _docs(40, 3),
                             "source": pa.array([(i % 3) * 10 + 5 for i in range(40)],
                                                typ)}), d / "a.parquet")
    out = pack(d, tmp_path / "out")
    m = read_manifest(out)
    assert m.source_values == (5, 15, 25)
    values = input_values(d)
    for row in rows_of(out):
        assert [m.source_values[s] for s in row["source_ids"]] == [values[i]
                                                                   for i in row["doc_ids"]]


def test_stats_per_source_equal_a_recount(src, tmp_path):
    """stats --json per source (rows holding it, segments, real tokens, padding counted to
    the row's last segment, effective targets) equals a recount over the rows, and sums to
    the totals."""
    out = pack(src, tmp_path / "out")
    res = invoke(["stats", "--json", out])
    assert res.exit_code == 0, res.output
    got = {p["source"]: p for p in json.loads(res.output)["per_source"]}
    table = read_manifest(out).source_values
    want = defaultdict(lambda: defaultdict(int))
    for row in rows_of(out):
        seg, lab = np.asarray(row["segment_ids"]), np.asarray(row["labels"])
        held = set()
        for q, sid in enumerate(row["source_ids"], start=1):
            name = table[sid]
            held.add(name)
            want[name]["segments"] += 1
            want[name]["real_tokens"] += int((seg == q).sum())
            want[name]["effective_targets"] += int(((seg == q) & (lab != -100)).sum())
        for name in held:
            want[name]["rows"] += 1
        last = table[row["source_ids"][-1]]
        want[last]["padding_tokens"] += int((seg == 0).sum())
    assert {k: dict(v) for k, v in want.items()} == {
        k: {f: p[f] for f in ("rows", "segments", "real_tokens", "padding_tokens",
                              "effective_targets")} for k, p in got.items()}
    stats = json.loads(res.output)["stats"]
    for f in ("segments", "real_tokens", "padding_tokens", "effective_targets"):
        assert sum(p[f] for p in got.values()) == stats[f]


def test_stats_lists_at_most_the_sources_asked_for(src, tmp_path):
    """A URL-domain column makes thousands of sources: the text table lists the N of the most
    real tokens (default 50) and sums the rest in one line; --per-source-limit 0 and --json
    list every one."""
    out = pack(src, tmp_path / "out")
    per = json.loads(invoke(["stats", "--json", "--per-source-limit", "1", out]).output)
    per = per["per_source"]
    assert len(per) >= 3
    top = max(per, key=lambda p: p["real_tokens"])
    res = invoke(["stats", "--per-source-limit", "1", out])
    assert res.exit_code == 0, res.output
    listed = [p["source"] for p in per if f"    {p['source']} " in res.output]
    assert listed == [top["source"]], res.output
    rest = sum(p["real_tokens"] for p in per) - top["real_tokens"]
    assert f"... {len(per) - 1:,} more sources, {rest:,} real tokens" in res.output
    res = invoke(["stats", "--per-source-limit", "0", out])
    assert all(f"    {p['source']} " in res.output for p in per) and "more sources" not in \
        res.output


def test_stats_lists_only_the_sources_present_in_the_output(tmp_path):
    """The source table is shared by both outputs of a --holdout: a document per source, the
    held-out output holds few of them. stats counted every source of the table ("... 810 more
    sources" where 88 had rows; --json listed them all, zeros included): it lists the sources
    holding a segment here, each with its id in the table, says how many of the table's it
    holds, and the "more" line counts the present ones. An empty document's source is absent."""
    d = tmp_path / "in"
    d.mkdir()
    docs = _docs(40, 5) + [[]]
    pq.write_table(pa.table({"input_ids": docs, "source": [f"s{i:02}" for i in range(41)]}),
                   d / "a.parquet")
    out = pack(d, tmp_path / "out", "--holdout", "0.25")
    for o in (out, tmp_path / "out-holdout"):
        table = read_manifest(o).source_values
        assert len(table) == 41
        present = {table[s] for row in rows_of(o) for s in row["source_ids"]}
        assert 0 < len(present) < 40 and "s40" not in present
        doc = json.loads(invoke(["stats", "--json", o]).output)
        per = doc["per_source"]
        assert {p["source"] for p in per} == present and all(p["segments"] for p in per)
        assert doc["sources_in_table"] == 41
        assert all(table[p["source_id"]] == p["source"] for p in per)
        res = invoke(["stats", "--per-source-limit", "1", o])
        assert res.exit_code == 0, res.output
        assert f"{len(present)} of the 41 sources of the manifest's table hold segments here" \
            in res.output, res.output
        assert f"... {len(present) - 1:,} more sources," in res.output, res.output
        res = invoke(["stats", "--per-source-limit", "0", o])
        assert "    s40 " not in res.output and sum(
            f"    {v} " in res.output for v in table) == len(present), res.output


def test_a_killed_windowed_pack_resumes_to_the_same_bytes(src, tmp_path):
    """Killed while window 1 is planned, the rerun reuses window 0 (its table read back from
    its done.json) and writes the bytes of an uninterrupted run."""
    from test_crash_resume import kill_at

    opts = ["--capacity", "64", "--rows-per-shard", "9", "--workers", "1", "--window-docs", "70",
            "--source-column", "source"]
    ref = tmp_path / "ref"
    assert invoke(["pack", "-q", *opts, src, ref]).exit_code == 0
    out = tmp_path / "out"
    kill_at("plan:1", src, out, opts)
    assert invoke(["pack", "-q", *opts, src, out]).exit_code == 0
    assert hash_tree(out) == hash_tree(ref)


def test_the_loader_hands_out_per_token_source_ids(src, tmp_path):
    """collate gives token_source_ids int32 [B, C]: each token's segment's id, -1 on the
    padding tail; a mixture of two outputs with different tables renumbers into one."""
    torch = pytest.importorskip("torch")
    from packtool.loader import PackedIterableDataset, collate

    out = pack(src, tmp_path / "out")
    ds = PackedDataset(out)
    # the map-style dataset names its table as the iterable one does
    assert ds.source_values == PackedIterableDataset(out).source_values == \
        read_manifest(out).source_values
    items = [ds[i] for i in range(4)]
    b = collate(items)
    assert b["token_source_ids"].dtype == torch.int32
    for r, it in enumerate(items):
        seg = np.asarray(it["segment_ids"])
        want = np.where(seg > 0, np.asarray(it["source_ids"])[np.maximum(seg - 1, 0)], -1)
        assert b["token_source_ids"][r].tolist() == want.tolist()
    # a second output whose table has other values (only "wiki" and "zeta")
    d = tmp_path / "in2"
    d.mkdir()
    pq.write_table(pa.table({"input_ids": _docs(30, 4),
                             "source": [["wiki", "zeta"][i % 2] for i in range(30)]}),
                   d / "a.parquet")
    other = pack(d, tmp_path / "other")
    mix = PackedIterableDataset({"a": out, "b": other}, rank=0, world_size=1)
    assert mix.source_values == tuple(sorted(set(input_values(src)))) + ("zeta",)
    table = {"a": read_manifest(out).source_values, "b": read_manifest(other).source_values}
    raw = {"a": PackedDataset(out), "b": PackedDataset(other)}
    for it in mix:
        orig = raw[it["source"]][it["index"]]["source_ids"]
        assert [mix.source_values[s] for s in it["source_ids"]] == \
            [table[it["source"]][s] for s in orig]


@pytest.mark.parametrize("extra", [[], ["--segment-multiple", "8"]])
def test_collate_flat_hands_out_collates_token_source_ids_flattened(src, tmp_path, extra):
    """collate_flat gives token_source_ids int32 [1, B * C], collate's [B, C] laid end to end
    (-1 on every padding token), from items and from the rows a dataset gathers for its batches
    (in a DataLoader worker too); HFCollator leaves it out (every key of its batch reaches the model's forward)."""
    torch = pytest.importorskip("torch")
    from packtool.loader import HFCollator, PackedIterableDataset, collate, collate_flat

    out = pack(src, tmp_path / "out", *extra)
    ds = PackedDataset(out)
    items = [ds[i] for i in range(len(ds))]
    flat, rows = collate_flat(items), collate(items)
    B, C = rows["input_ids"].shape
    got = flat["token_source_ids"]
    assert got.dtype == torch.int32 and got.shape == (1, B * C) == flat["input_ids"].shape
    assert torch.equal(got, rows["token_source_ids"].reshape(1, B * C))
    assert torch.equal(got == -1, rows["segment_ids"].reshape(1, B * C) == 0)
    assert (got == -1).any() and (got >= 0).any()
    # the batch path: rows gathered from the decoded row groups
    batches = PackedIterableDataset(out, rank=0, world_size=1, shuffle=False, batch_size=5,
                                    collate_fn=collate_flat)
    order = PackedIterableDataset(out, rank=0, world_size=1, shuffle=False)
    want = collate_flat([it for it, _ in zip(order, range(5))])
    assert torch.equal(next(iter(batches))["token_source_ids"], want["token_source_ids"])
    worker = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=1)
    assert torch.equal(next(iter(worker))["token_source_ids"], want["token_source_ids"])
    for hf in (HFCollator(), HFCollator(flatten=True)):
        assert "token_source_ids" not in hf(items)


@pytest.mark.parametrize("case,match", [
    ("missing", r"no column 'source' for --source-column"),
    ("float", r"--source-column 'source' has type double"),
    ("null", r"row 3.*--source-column 'source' is null"),
    ("mixed", r"holds strings in some .* and integers in others"),
    ("uint64", r"row 4.*--source-column 'source' value 9223372036854775813 does not fit int64"),
])
def test_bad_source_columns_are_refused_in_one_line(tmp_path, case, match):
    d = tmp_path / "in"
    d.mkdir()
    docs = _docs(10, 5)
    col = {"missing": None, "float": [0.5] * 10, "null": ["a", "b", "c", None] + ["d"] * 6,
           "mixed": ["a"] * 10,
           # a hashed domain id over 2**63 - 1 was stored as a negative one, silently
           "uint64": pa.array([1, 2, 3, 4, 2**63 + 5] + [6] * 5, pa.uint64())}[case]
    cols = {"input_ids": docs} if col is None else {"input_ids": docs, "source": col}
    pq.write_table(pa.table(cols), d / "a.parquet")
    if case == "mixed":
        pq.write_table(pa.table({"input_ids": docs, "source": list(range(10))}), d / "b.parquet")
    res = invoke(["pack", "-q", "--capacity", "64", "--source-column", "source", d,
                  tmp_path / "out"])
    assert res.exit_code == 1
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert __import__("re").search(match, res.output), res.output
    assert not (tmp_path / "out" / ".packtool-manifest.parquet").exists()


def test_per_source_stats_with_padded_segments_and_a_holdout(src, tmp_path):
    """--segment-multiple 8 with --holdout: both outputs map every segment to its document's
    value and pass verify; stats per source equal a recount in which each segment's own
    padding counts to its source and the padding tail to the row's last segment's."""
    out = pack(src, tmp_path / "out", "--segment-multiple", "8", "--holdout", "0.25")
    values = input_values(src)
    for o in (out, tmp_path / "out-holdout"):
        m = read_manifest(o)
        assert m.source_column == "source" and m.source_values == tuple(sorted(set(values)))
        res = invoke(["verify", "--data-only", o])
        assert res.exit_code == 0, res.output
        want = defaultdict(lambda: defaultdict(int))
        for row in rows_of(o):
            seg, cu = np.asarray(row["segment_ids"]), np.asarray(row["cu_seqlens"])
            for q, (doc, sid) in enumerate(zip(row["doc_ids"], row["source_ids"]), start=1):
                name = m.source_values[sid]
                assert name == values[doc]
                real = int((seg == q).sum())
                want[name]["real_tokens"] += real
                want[name]["padding_tokens"] += int(cu[q] - cu[q - 1]) - real
            k = len(row["doc_ids"])
            want[m.source_values[row["source_ids"][-1]]]["padding_tokens"] += 64 - int(cu[k])
        res = invoke(["stats", "--json", o])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.output)
        got = {p["source"]: {f: p[f] for f in ("real_tokens", "padding_tokens")}
               for p in doc["per_source"] if p["segments"]}
        assert got == {k: dict(v) for k, v in want.items()}
        assert doc["stats"]["segment_padding_tokens"] > 0
        assert sum(p["padding_tokens"] for p in doc["per_source"]) == \
            doc["stats"]["padding_tokens"]


def test_the_source_table_is_a_typed_field_of_the_manifest():
    """source_column / source_values survive to_dict and from_dict (written as ``sources``);
    a table without its column is refused; a manifest without them keeps its old form."""
    from packtool.formats.manifest import FORMAT_VERSION, LabelsInfo, Manifest

    m = Manifest(format_version=FORMAT_VERSION, packtool_version="x", fingerprint="f",
                 capacity=8, labels=LabelsInfo(False, "unshifted"), source_column="lang",
                 source_values=["de", "en"])
    d = m.to_dict()
    assert d["sources"] == {"column": "lang", "values": ["de", "en"]}
    back = Manifest.from_dict(json.loads(json.dumps(d)))
    assert back.source_column == "lang" and back.source_values == ("de", "en")
    plain = Manifest(format_version=FORMAT_VERSION, packtool_version="x", fingerprint="f",
                     capacity=8, labels=LabelsInfo(False, "unshifted"))
    assert "sources" not in plain.to_dict()
    assert Manifest.from_dict(plain.to_dict()).source_column is None
    with pytest.raises(ValueError, match="source_values without a source_column"):
        Manifest(format_version=FORMAT_VERSION, packtool_version="x", fingerprint="f",
                 capacity=8, labels=LabelsInfo(False, "unshifted"), source_values=[1, 2])


def test_the_python_api_takes_source_column(src, tmp_path):
    """packtool.pack(source_column=) writes what the CLI writes; pack_dataset(source_column=)
    keeps that (string) column and gives the CLI's rows, source_ids included."""
    import packtool

    cli = pack(src, tmp_path / "cli")
    res = packtool.pack(src, tmp_path / "api", capacity=64, rows_per_shard=9, workers=1,
                        source_column="source")
    assert res.manifest.source_values == read_manifest(cli).source_values
    assert hash_tree(tmp_path / "api") == hash_tree(cli)
    table = pa.Table.from_batches(
        [b for f in sorted(src.glob("*.parquet"))
         for b in pq.read_table(f).cast(pa.schema([("input_ids", pa.list_(pa.int64())),
                                                   ("source", pa.string())])).to_batches()])
    one = tmp_path / "one"
    one.mkdir()
    pq.write_table(table, one / "docs.parquet")
    want = pack(one, tmp_path / "cli-one")
    got = packtool.pack_dataset(table, 64, rows_per_shard=9, workers=1, source_column="source",
                                output=tmp_path / "ds")
    assert got.column("source_ids").to_pylist() == [list(r["source_ids"]) for r in rows_of(want)]
    assert read_manifest(tmp_path / "ds").source_values == read_manifest(want).source_values


def test_stats_text_table_quotes_values_that_would_not_show(tmp_path):
    """An empty value showed as a blank, a tab or newline inside a value broke the table's
    columns: such values (and ones with leading or trailing spaces, or a leading quote) are
    shown quoted with escapes, as JSON writes them; the others as they are, and every line of
    the table keeps its columns (wide characters counted as two)."""
    import unicodedata

    values = ["", "a\tb", "web", " pad", "x\ny", '"q', "中文", "plain words"]
    d = tmp_path / "in"
    d.mkdir()
    docs = _docs(len(values) * 3, 7)
    pq.write_table(pa.table({"input_ids": docs,
                             "source": [values[i % len(values)] for i in range(len(docs))]}),
                   d / "a.parquet")
    out = pack(d, tmp_path / "out")
    res = invoke(["stats", "--per-source-limit", "0", out])
    assert res.exit_code == 0, res.output
    assert "\t" not in res.output
    lines = res.output.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("source "))
    table = lines[head + 1:head + 1 + len(values)]
    shown = {json.dumps(v, ensure_ascii=False) if v in ("", "a\tb", " pad", "x\ny", '"q')
             else v for v in values}
    cells = set()
    for ln in table:
        assert ln.startswith("    ")
        for v in shown:
            if ln[4:].startswith(v + " "):
                cells.add(v)

    def width(text):
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)

    assert cells == shown, table
    ends = {width(ln) for ln in table + [lines[head]]}
    assert len(ends) == 1, [lines[head]] + table


@pytest.mark.parametrize("kind", ["string", "integer"])
@pytest.mark.parametrize("extra", [[], ["--window-docs", "2"]])
def test_a_null_beside_a_document_that_is_not_packed_is_left_alone(tmp_path, kind, extra):
    """One rule for a null in a column read beside the tokens (the source, the attention mask,
    labels, a loss mask): refused on a document that is packed, left alone on one that is not
    (empty, or every token masked: pack skips it). A null source of an empty document stopped
    the pack ("fill it"); the rows are those of the same input with the nulls filled."""
    docs = [[1, 2, 3], [], [4, 5], [6, 7], [], [8]]  # 1 and 4 empty, 3 masked whole
    value = {"string": ["a", "b", "c"], "integer": [7, 8, 9]}[kind]

    def write(path, fill):
        # fill: the nulls filled in (the source with a value the input has elsewhere)
        src = [value[0], value[1] if fill else None, value[1], value[2] if fill else None,
               value[0] if fill else None, value[2]]
        mask = [[1, 1, 1], [] if fill else None, [1, 1], [0, 0], [], [1]]
        labels = [[1, 2, 3], [] if fill else None, [-100, 5], [6, 7] if fill else None,
                  [] if fill else None, [8]]
        loss = [[1, 1, 1], [] if fill else None, [1, 1], [1, 0] if fill else None, [], [1]]
        path.mkdir(parents=True)
        pq.write_table(pa.table({
            "input_ids": pa.array(docs, pa.list_(pa.int32())), "source": src,
            "attention_mask": pa.array(mask, pa.list_(pa.int8())),
            "labels": pa.array(labels, pa.list_(pa.int64())),
            "completion_mask": pa.array(loss, pa.list_(pa.int8()))}), path / "a.parquet")
        return path

    got = pack(write(tmp_path / "nulls", False), tmp_path / "out", *extra)
    want = pack(write(tmp_path / "filled", True), tmp_path / "want", *extra)
    assert pq.read_table(got).equals(pq.read_table(want))
    m = read_manifest(got)
    assert m.source_values == read_manifest(want).source_values == tuple(sorted(value))
    assert m.totals == read_manifest(want).totals
    assert invoke(["verify", "--data-only", got]).exit_code == 0
    res = invoke(["stats", got])
    assert res.exit_code == 0 and "None" not in res.output, res.output


@pytest.mark.parametrize("column,values,said", [
    ("source", ["a", None, "b"], "--source-column 'source' is null; fill it (e.g. 'unknown')"),
    ("attention_mask", [[1], None, [1]],
     "'attention_mask' is null; fill it or pass --attention-mask-column none"),
    ("labels", [[1], None, [3]], "'labels' is null; fill it or pass --labels-column none"),
    ("completion_mask", [[1], None, [1]],
     "'completion_mask' is null; fill it or pass --loss-mask-column none"),
])
def test_a_null_beside_a_packed_document_is_refused(tmp_path, column, values, said):
    d = tmp_path / "in"
    d.mkdir()
    cols = {"input_ids": [[1], [2], [3]], "source": ["a", "b", "c"], column: values}
    pq.write_table(pa.table(cols), d / "a.parquet")
    res = invoke(["pack", "-q", "--capacity", "8", "--source-column", "source", d,
                  tmp_path / "out"])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert f"a.parquet: row 1 (0-based): {said}" in res.output, res.output


@pytest.mark.parametrize("kind", ["table", "DataFrame", "Dataset", "IterableDataset"])
def test_pack_dataset_hands_the_source_table_with_its_rows(kind):
    """Without output= the id -> value table of source_ids was only in the manifest of a
    temporary directory, removed as the call ended: it comes with the rows (the Table's schema
    metadata, the DataFrame's attrs, the Dataset's source_ids ClassLabel names). It is
    sorted(set(values)) over every document read, empty ones and those overflow='drop' left
    out included."""
    import packtool

    docs = [[1, 2, 3], [], [4] * 30, [5, 6], [7]]
    values = ["web", "zeta", "alpha", "web", "code"]
    table = pa.table({"input_ids": docs, "source": values})
    want = ("alpha", "code", "web", "zeta")
    if kind == "table":
        got = packtool.pack_dataset(table, 8, source_column="source", overflow="drop")
        table_of = json.loads(got.schema.metadata[packtool.api.SOURCE_VALUES_META_KEY])
        ids = got.column("source_ids").to_pylist()
        docs_of = got.column("doc_ids").to_pylist()
    elif kind == "DataFrame":
        got = packtool.pack_dataset(table.to_pandas(), 8, source_column="source",
                                    overflow="drop")
        table_of = got.attrs["source_values"]
        ids = [list(x) for x in got["source_ids"]]
        docs_of = [list(x) for x in got["doc_ids"]]
    else:
        datasets = pytest.importorskip("datasets")
        ds = datasets.Dataset(table)
        ds = ds if kind == "Dataset" else ds.to_iterable_dataset()
        got = packtool.pack_dataset(ds, 8, source_column="source", overflow="drop")
        feature = got.features["source_ids"].feature
        assert isinstance(feature, datasets.ClassLabel)
        table_of = feature.names
        rows = list(got)
        ids = [r["source_ids"] for r in rows]
        docs_of = [r["doc_ids"] for r in rows]
        derived = got.shuffle(seed=1)  # a transform keeps it
        assert derived.features["source_ids"].feature.names == list(want)
    assert tuple(table_of) == want
    for row_ids, row_docs in zip(ids, docs_of):
        assert [table_of[i] for i in row_ids] == [values[d] for d in row_docs]


def test_pack_dataset_source_table_of_integers_and_of_a_holdout():
    """Integer sources: the Table's metadata keeps them as integers, the ClassLabel names are
    their decimal strings; with holdout= each side's table is that of its own documents."""
    import packtool

    datasets = pytest.importorskip("datasets")
    docs = [[i + 1] * (1 + i % 5) for i in range(60)]
    values = [(i * 7) % 11 for i in range(60)]
    table = pa.table({"input_ids": docs, "source": values})
    got = packtool.pack_dataset(table, 16, source_column="source")
    assert json.loads(got.schema.metadata[packtool.api.SOURCE_VALUES_META_KEY]) == \
        sorted(set(values))
    ds = packtool.pack_dataset(datasets.Dataset(table), 16, source_column="source")
    assert ds.features["source_ids"].feature.names == [str(v) for v in sorted(set(values))]
    train, held = packtool.pack_dataset(table, 16, source_column="source", holdout=0.3, seed=2)
    for side in (train, held):
        side_docs = {d for r in side.column("doc_ids").to_pylist() for d in r}
        assert json.loads(side.schema.metadata[packtool.api.SOURCE_VALUES_META_KEY]) == \
            sorted({values[d] for d in side_docs})
