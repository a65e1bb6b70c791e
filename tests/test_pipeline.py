"""``packtool pack`` end to end: the output contract on real sample data and tiny inputs."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import read_rows
from packtool.formats.manifest import MANIFEST_NAME, read_manifest
from packtool.cli import cli
from packtool.config import PackConfig
from packtool.pipeline import run_pack


def pack(args):
    result = CliRunner().invoke(cli, ["pack", "--quiet", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def sample_out(tmp_path_factory, sample_data):
    out = tmp_path_factory.mktemp("sample") / "out"
    res = run_pack(PackConfig(inputs=(str(sample_data),), output=str(out), capacity=2048,
                              rows_per_shard=256, workers=2), progress=False)
    return out, res


def input_docs(sample_data):
    docs = []
    for f in sorted(sample_data.rglob("*.parquet"), key=lambda p: p.relative_to(sample_data).as_posix()):
        docs.extend(pq.read_table(f, columns=["input_ids"]).column(0).to_pylist())
    return docs


def test_sample_every_token_appears_once_at_its_recorded_place(sample_out, sample_data):
    """Conservation on real data: each segment equals docs[doc_id][offset:offset+len], and the
    pieces of each document tile it exactly."""
    out, _ = sample_out
    docs = input_docs(sample_data)
    covered = [[] for _ in docs]
    for row in read_rows(out):
        seg = np.array(row["segment_ids"])
        ids = np.array(row["input_ids"])
        for k, (d, off) in enumerate(zip(row["doc_ids"], row["doc_offsets"]), start=1):
            piece = ids[seg == k].tolist()
            assert piece == docs[d][off:off + len(piece)]
            covered[d].append((off, len(piece)))
    for d, doc in enumerate(docs):
        pos = 0
        for off, n in sorted(covered[d]):
            assert off == pos
            pos += n
        assert pos == len(doc)


def test_sample_only_long_documents_are_split(sample_out, sample_data):
    """OBFD cuts no document of at most C tokens; long ones are cut into C-sized chunks."""
    out, _ = sample_out
    lengths = [len(d) for d in input_docs(sample_data)]
    pieces = {}
    for row in read_rows(out):
        for d in row["doc_ids"]:
            pieces[d] = pieces.get(d, 0) + 1
    for d, n in pieces.items():
        assert n == max(1, -(-lengths[d] // 2048))


def test_sample_rows_close_to_lower_bound_and_figures_agree(sample_out):
    """Rows exceed ceil(tokens / C) by a handful at most; manifest totals == the shards."""
    out, res = sample_out
    rows = read_rows(out)
    manifest = read_manifest(out)
    t = manifest.totals.to_dict()
    real = sum(sum(1 for s in r["segment_ids"] if s) for r in rows)
    assert all("labels" not in r for r in rows)  # default --labels none: not stored
    # targets: tokens that continue the segment of the token before them (sum of len - 1)
    targets = sum(sum(1 for a, b in zip(r["segment_ids"], r["segment_ids"][1:]) if b and a == b)
                  for r in rows)
    assert t["rows"] == len(rows) == res.stats.rows
    assert t["real_tokens"] == real == t["tokens_in"]
    assert t["effective_targets"] == targets == sum(r["num_targets"] for r in rows)
    assert t["padding_tokens"] == len(rows) * 2048 - real
    assert 0 <= t["extra_rows"] <= 3
    assert sum(o.rows for o in manifest.shards) == len(rows)


def test_sample_ids_above_16_bits_survive(sample_out):
    """Tekken ids exceed 65,535: a 16-bit storage bug would show here."""
    out, _ = sample_out
    assert max(max(r["input_ids"]) for r in read_rows(out)) > 65535


def test_rows_are_shuffled_by_seed_and_kept_with_no_shuffle(docs_dir, tmp_path):
    src = docs_dir([[i + 1] * (i % 7 + 1) for i in range(60)])
    a, b, c = (tmp_path / n for n in "abc")
    pack([src, a, "--capacity", "8", "--seed", "1"])
    pack([src, b, "--capacity", "8", "--seed", "2"])
    pack([src, c, "--capacity", "8", "--no-shuffle"])
    ra, rb, rc = read_rows(a), read_rows(b), read_rows(c)
    key = lambda r: r["doc_ids"]  # noqa: E731
    assert sorted(map(key, ra)) == sorted(map(key, rb)) == sorted(map(key, rc))
    assert list(map(key, ra)) != list(map(key, rb))
    # creation order: rows of the obfd plan start with the longest documents
    assert sum(s > 0 for s in rc[0]["segment_ids"]) >= sum(s > 0 for s in rc[-1]["segment_ids"])


def test_overflow_modes_are_counted_in_manifest(docs_dir, tmp_path):
    """B11: each policy is explicit and counted; tokens_in == real + lost in every mode."""
    src = docs_dir([[1, 2, 3, 4, 5, 6]])
    expect = {
        "split": ([[1, 2, 3, 4], [5, 6, 0, 0]], {"docs_split": 1, "split_fragments": 1}),
        "truncate": ([[1, 2, 3, 4]], {"docs_truncated": 1, "tokens_truncated": 2,
                                      "tokens_dropped": 2}),
        "drop": ([], {"docs_dropped": 1, "tokens_dropped": 6}),
    }
    for mode, (rows, counts) in expect.items():
        out = tmp_path / mode
        pack([src, out, "--capacity", "4", "--overflow", mode, "--no-shuffle"])
        assert [r["input_ids"] for r in read_rows(out)] == rows
        t = read_manifest(out).totals.to_dict()
        for k, v in counts.items():
            assert t[k] == v
        assert t["tokens_in"] == t["real_tokens"] + t["tokens_dropped"] == 6
        assert t["tokens_lost"] == t["tokens_dropped"]


def test_overflow_error_exits_1_naming_the_row(docs_dir, tmp_path):
    src = docs_dir([[1], [1, 2, 3, 4, 5, 6]])
    res = CliRunner().invoke(cli, ["pack", "-q", str(src), str(tmp_path / "o"), "--capacity", "4",
                                   "--overflow", "error"])
    assert res.exit_code == 1
    assert "document 1 has 6 tokens" in res.output
    assert not (tmp_path / "o" / MANIFEST_NAME).exists()


def test_append_eos_and_pad_id(docs_dir, tmp_path):
    src = docs_dir([[5, 6], [7]])
    out = tmp_path / "o"
    pack([src, out, "--capacity", "8", "--append-eos", "2", "--pad-id", "9", "--no-shuffle",
          "--labels", "unshifted"])
    (row,) = read_rows(out)
    assert row["input_ids"] == [5, 6, 2, 7, 2, 9, 9, 9]
    assert row["labels"] == [-100, 6, 2, -100, 2, -100, -100, -100]


def test_non_empty_output_needs_overwrite(docs_dir, tmp_path):
    """Another pack into a finished OUTPUT is refused without --overwrite."""
    src = docs_dir([[1, 2]])
    out = tmp_path / "o"
    pack([src, out, "--capacity", "4"])
    res = CliRunner().invoke(cli, ["pack", "-q", str(src), str(out), "--capacity", "5"])
    assert res.exit_code == 1 and "--overwrite" in res.output
    pack([src, out, "--capacity", "5", "--overwrite"])
    assert read_manifest(out).capacity == 5


def test_completed_identical_rerun_is_a_no_op_that_says_so(docs_dir, tmp_path):
    """The same command on a finished OUTPUT writes nothing, says so and exits 0."""
    src = docs_dir([[1, 2], [3, 4, 5]])
    out = tmp_path / "o"
    pack([src, out, "--capacity", "4"])
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    res = CliRunner().invoke(cli, ["pack", str(src), str(out), "--capacity", "4"])
    assert res.exit_code == 0, res.output
    assert "already holds this pack" in res.output and "nothing to do" in res.output
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == before
    res = CliRunner().invoke(cli, ["pack", "--json", str(src), str(out), "--capacity", "4"])
    assert res.exit_code == 0 and json.loads(res.output)["already_complete"] is True


def test_shard_metadata_records_label_convention(docs_dir, tmp_path):
    """B05: the shard says which label convention it holds, so nobody shifts twice."""
    src = docs_dir([[11, 12, 13, 14]])
    for mode in ("unshifted", "shifted"):
        out = tmp_path / mode
        pack([src, out, "--capacity", "4", "--labels", mode])
        meta = pq.read_schema(out / "part-00000.parquet").metadata
        assert meta[b"packtool.labels_convention"] == mode.encode()
        labels = read_manifest(out).labels
        assert labels.stored and labels.convention == mode


def test_schema_types_are_int32_lists(docs_dir, tmp_path):
    """B06/B27/B28: per-token columns are fixed_size_list<int32>[C] (no offsets to wrap),
    cu_seqlens list<int32>; max_seqlen int32."""
    import pyarrow as pa

    src = docs_dir([[1, 2, 3], [4, 5]], value_type=pa.uint16())
    out = tmp_path / "o"
    pack([src, out, "--capacity", "6", "--labels", "unshifted"])
    schema = pq.read_schema(out / "part-00000.parquet")
    for name in ("input_ids", "segment_ids", "position_ids", "labels"):
        typ = schema.field(name).type
        assert pa.types.is_fixed_size_list(typ) and typ.list_size == 6
        assert typ.value_type == pa.int32()
    assert pa.types.is_list(schema.field("cu_seqlens").type)
    assert schema.field("cu_seqlens").type.value_type == pa.int32()
    assert schema.field("max_seqlen").type == pa.int32()
    assert schema.field("doc_ids").type.value_type == pa.int64()


def test_summary_is_printed(docs_dir, tmp_path):
    src = docs_dir([[1, 2, 3], [4, 5]])
    res = CliRunner().invoke(cli, ["pack", str(src), str(tmp_path / "o"), "--capacity", "6"])
    assert res.exit_code == 0
    assert "packed 2 of 2 documents read (5 of 5 tokens) into 1 row of 6" in res.output
    assert "effective targets 3" in res.output


def test_read_and_plan_progress_counts_documents_and_tokens_as_they_go(tmp_path, sample_data,
                                                                      monkeypatch):
    """The read phase advances its bar batch by batch (not once at the end), in documents and
    tokens, up to exactly what was read; the plan phase reaches every document too; the bar
    shows a rate in tokens per second, the documents and a time left."""
    import io
    import re

    from packtool.pipeline import progress

    calls = {}
    real = progress.Phase.advance

    def spy(self, docs, tokens):
        calls.setdefault(self.desc, []).append((docs, tokens))
        return real(self, docs, tokens)

    monkeypatch.setattr(progress.Phase, "advance", spy)
    res = run_pack(PackConfig(inputs=(str(sample_data),), output=str(tmp_path / "o"),
                              capacity=2048, workers=2), progress=False)
    read, plan = calls["read"], calls["plan"]
    assert len(read) > 3  # batch by batch
    assert sum(d for d, _ in read) == res.stats.docs_in == sum(d for d, _ in plan)
    assert sum(t for _, t in read) == res.stats.tokens_in
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    bar = progress.Phase("read", 4_000_000, 1000, True)
    bar._bar.mininterval = 0
    bar.advance(250, 1_000_000)
    text = err.getvalue()
    assert "250/1,000 docs" in text and re.search(r"1\.00M/4\.00M", text), text
    assert re.search(r"tok/s", text) and re.search(r"<\d\d:\d\d", text), text
    bar.close()
