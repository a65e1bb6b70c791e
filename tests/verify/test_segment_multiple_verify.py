"""``pack --segment-multiple N`` (context-parallel layout) end to end: the contract oracle and every
CPU attention check pass at C = 2048, a C that is not a multiple of N is refused before any work,
stats report what N costs, and verify fails when the padding inside a row is broken."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packtool.cli import cli
from packtool.formats.manifest import read_manifest

from packed_helpers import edit_rows, pack_docs

RNG = np.random.default_rng(11)
# documents of every remainder mod 8, some over C (split), ids above 65535
DOCS = [list(map(int, RNG.integers(0, 131_000, n)))
        for n in [301, 5, 77, 1, 640, 9, 1200, 33, 2500, 15, 8, 16, 250, 700, 3, 460]]


@pytest.fixture(scope="module")
def cp2048(tmp_path_factory):
    return pack_docs(tmp_path_factory.mktemp("cp"), DOCS, 2048, "--segment-multiple", "8")


def test_contract_oracle_passes_and_every_span_is_a_multiple_of_n(cp2048):
    """The independent oracle checks every row: spans, real lengths, padding, labels, targets."""
    from packtool.verify.checks import run_verify

    rep = run_verify(cp2048, data_only=True)
    assert rep.ok, rep.format_text()
    assert rep.get("data", "cu_seqlens_unpadded").status == "pass"
    assert rep.get("data", "cu_seqlens").figures["segment_multiple"] == 8
    m = read_manifest(cp2048)
    assert m.options["segment_multiple"] == 8
    assert "cu_seqlens_unpadded" in pq.read_schema(cp2048 / m.shards[0].file).names
    from packtool.formats.manifest import FORMAT_VERSION

    assert m.format_version == FORMAT_VERSION


def test_every_cpu_attention_check_passes_at_2048(cp2048):
    """sdpa, hf and hybrid on a row of several documents at C = 2048: logits, isolation, loss
    denominator, gradients at ignored positions and at padding (the padding inside the row
    included), finiteness. (FlexAttention, the slowest on CPU, runs on the same layout below.)"""
    pytest.importorskip("torch")
    from packtool.verify.checks import run_verify

    rep = run_verify(cp2048, rows=1, backends=["sdpa", "hf", "hybrid"])
    assert rep.ok, rep.format_text()
    for b in ("sdpa", "hf", "hybrid"):
        assert rep.get(b, "isolation").status == "pass", rep.format_text()
        assert rep.get(b, "logits_match").figures["rows_multi_doc"] >= 1
        assert rep.get(b, "grad_zero_padding").status == "pass", rep.format_text()


def test_flex_block_mask_covers_padding_inside_rows(tmp_path):
    """FlexAttention's tile-level document mask on rows whose padding lies between documents."""
    pytest.importorskip("torch")
    from packtool.verify.checks import run_verify

    out = pack_docs(tmp_path, [d[:200] for d in DOCS], 256, "--segment-multiple", "8")
    rep = run_verify(out, rows=2, backends=["flex"], compile=False)
    assert rep.ok, rep.format_text()
    assert rep.get("flex", "isolation").status == "pass"


def test_capacity_not_a_multiple_of_n_is_refused_before_any_work(tmp_path):
    """C = 2050 with N = 8 would leave a padding tail no context-parallel split accepts: exit 2,
    one line naming both options and the nearest capacities; OUTPUT is never created."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(DOCS[:3], pa.list_(pa.int64()))}), src)
    res = CliRunner().invoke(cli, ["pack", "--capacity", "2050", "--segment-multiple", "8",
                                   str(src.parent), str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert "--segment-multiple 8" in res.output and "use --capacity 2048 or 2056" in res.output
    assert not (tmp_path / "out").exists()


def test_stats_reports_the_padding_and_rows_n_costs(cp2048, tmp_path):
    """stats recounts the padding inside rows from the shards and names the rows of N = 1."""
    plain = pack_docs(tmp_path, DOCS, 2048, name="plain")
    res = CliRunner().invoke(cli, ["stats", str(cp2048), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)["stats"]
    real = sum(len(d) for d in DOCS)
    assert s["real_tokens"] == real
    plain_rows = read_manifest(plain).totals.rows
    assert s["rows_without_segment_padding"] == plain_rows
    # every piece rounded up to a multiple of 8: padding inside rows is the sum of the roundings
    rows = [r for e in read_manifest(cp2048).shards
            for r in pq.read_table(cp2048 / e.file).to_pylist()]
    pieces = [b - a for r in rows for a, b in zip(r["cu_seqlens_unpadded"][:len(r["doc_ids"])],
                                                  r["cu_seqlens_unpadded"][1:])]
    assert s["segment_padding_tokens"] == sum(-(-n // 8) * 8 - n for n in pieces) > 0
    text = CliRunner().invoke(cli, ["stats", str(cp2048)]).output
    assert "segment padding (--segment-multiple 8)" in text and "with N = 1" in text


def _cp_row(rows):
    """A row whose first document has padding after it inside the row."""
    return next(i for i, r in enumerate(rows) if len(r["doc_ids"]) >= 2
                and (r["cu_seqlens_unpadded"][1] - r["cu_seqlens_unpadded"][0])
                < r["cu_seqlens"][1])


def test_padding_made_a_target_or_a_document_token_fails(tmp_path):
    """The padding after document 1 given a label, or counted as document 1 in segment_ids:
    the oracle fails at that row (labels / segment_ids), and the attention checks see it."""
    pytest.importorskip("torch")
    from packtool.verify.checks import run_verify

    docs = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [16, 17]]
    out = pack_docs(tmp_path, docs, 16, "--segment-multiple", "4", "--labels", "unshifted",
                    "--strategy", "ordered")

    def pad_target(rows):
        i = _cp_row(rows)
        j = rows[i]["cu_seqlens_unpadded"][1]  # first padding slot after document 1
        rows[i]["labels"][j] = rows[i]["input_ids"][j]
        rows[i]["num_targets"] += 1
        return rows

    edit_rows(out, pad_target)
    rep = run_verify(out, rows=0, backends=["sdpa"])
    assert rep.get("data", "labels").status == "fail", rep.format_text()
    assert rep.get("sdpa", "loss_denominator").status == "fail"

    out2 = pack_docs(tmp_path, docs, 16, "--segment-multiple", "4", "--strategy", "ordered",
                     name="out2")

    def pad_in_document(rows):
        i = _cp_row(rows)
        j = rows[i]["cu_seqlens_unpadded"][1]
        rows[i]["segment_ids"][j] = 1
        return rows

    edit_rows(out2, pad_in_document)
    rep = run_verify(out2, rows=0, backends=["sdpa"])
    assert rep.get("data", "segment_ids").status == "fail", rep.format_text()


def test_a_real_length_that_does_not_round_to_its_span_fails(tmp_path):
    """cu_seqlens_unpadded edited so document 1 claims more real tokens than its span holds."""
    pytest.importorskip("torch")
    from packtool.verify.checks import run_verify

    out = pack_docs(tmp_path, [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]], 16, "--segment-multiple",
                    "4", "--strategy", "ordered")

    def shrink(rows):
        rows[0]["cu_seqlens_unpadded"] = [0] + [x + 2 for x in rows[0]["cu_seqlens_unpadded"][1:]]
        return rows

    edit_rows(out, shrink)
    rep = run_verify(out, data_only=True)
    bad = rep.get("data", "cu_seqlens_unpadded")
    assert bad.status == "fail" and bad.where["segment"] == 1, rep.format_text()


def test_a_padded_output_without_cu_seqlens_unpadded_is_one_line(tmp_path):
    """The manifest says --segment-multiple 4 but the shard lost cu_seqlens_unpadded (the
    manifest resealed over it): verify and stats exit 1 naming the shard and the missing column
    (stats counted the padding inside spans as tokens), and the loader refuses it the same way
    (one check where a shard is opened)."""
    from packcheck import reseal

    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22], [31, 32, 33, 34], list(range(41, 52))],
                    16, "--segment-multiple", "4")
    shard = out / "part-00000.parquet"
    pq.write_table(pq.read_table(shard).drop_columns(["cu_seqlens_unpadded"]), shard)
    reseal(out)
    for extra in (["--data-only"], ["--backend", "sdpa", "--no-progress"]):
        r = CliRunner().invoke(cli, ["verify", *extra, str(out)])
        assert r.exit_code == 1, r.output
        line = r.output.strip().splitlines()[-1]
        assert line.startswith(f"Error: {shard}: column cu_seqlens_unpadded is missing"), line
        assert "--segment-multiple 4" in line and "internal error" not in r.output
    r = CliRunner().invoke(cli, ["stats", str(out)])
    assert r.exit_code == 1 and "column cu_seqlens_unpadded is missing" in r.output, r.output
    from packtool.errors import ManifestError
    from packtool.loader import PackedDataset

    with pytest.raises(ManifestError, match="cu_seqlens_unpadded is missing"):
        PackedDataset(out)[0]
