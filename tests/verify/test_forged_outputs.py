"""Forged outputs the column scan of every row must refuse: manifest totals that the rows do not
add up to, a duplicated row, a document piece moved or repeated, padding that is not the pad id.

Each forgery keeps the manifest consistent with the shards it lists (sizes, sha256, footers), so
only what the rows say against the manifest can catch it. NumPy only (``--data-only``): no torch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packcheck import reseal
from packed_helpers import edit_rows, pack_docs
from packtool.analysis import analyze_packed
from packtool.cli import cli
from packtool.formats.manifest import read_manifest
from packtool.verify.checks import run_verify
from packtool.verify.report import FAIL, PASS

RNG = np.random.default_rng(11)
#: short documents: never split at C = 16, several per row, padding tails
SHORT = [list(map(int, RNG.integers(1, 1000, n))) for n in [9, 5, 7, 3, 12, 4, 6, 2, 8, 10, 3]]
#: long documents: split into pieces of C = 16 (one full row each) and a tail
LONG = [list(map(int, RNG.integers(1, 1000, n))) for n in [70, 53, 41]]


def _data(out):
    """verify --data-only of ``out`` as {check: result}."""
    rep = run_verify(out, data_only=True, check_hashes=False)
    return {r.check: r for r in rep.results}, rep.ok


@pytest.fixture
def short(tmp_path):
    return pack_docs(tmp_path, SHORT, 16)


@pytest.mark.parametrize("figure", ["effective_targets", "rows", "padding_tokens"])
def test_manifest_totals_one_off_fail_verify_naming_the_figure(short, figure):
    """One figure of the manifest's totals changed by one (the shards untouched): verify fails
    `totals` naming the figure and both values, as stats reports it; the untouched output
    passes."""
    res, ok = _data(short)
    assert ok and res["totals"].status == PASS
    m = read_manifest(short)
    right = getattr(m.totals, figure)
    reseal(short, totals=dataclasses.replace(m.totals, **{figure: right + 1}))
    res, ok = _data(short)
    assert not ok and res["totals"].status == FAIL
    assert f"{figure} {right + 1:,} in the manifest, {right:,} recounted" in res["totals"].message
    assert analyze_packed(short, check_hashes=False).mismatches[figure] == (right, right + 1)
    run = CliRunner().invoke(cli, ["verify", "--data-only", str(short)])
    assert run.exit_code == 1 and "totals" in run.output


def test_a_duplicated_row_fails_verify_as_it_fails_stats(short):
    """Row 3 replaced by a copy of row 4 (one document trained twice, others lost), the manifest
    resealed over the new shard: stats counts a document cut that the manifest does not, and
    verify names the document that starts twice and the totals that differ."""
    edit_rows(short, lambda rows: rows[:3] + [dict(rows[4])] + rows[4:])
    assert "docs_cut" in analyze_packed(short, check_hashes=False).mismatches
    res, ok = _data(short)
    assert not ok
    assert res["doc_offsets"].status == FAIL and "in two segments" in res["doc_offsets"].message
    assert res["doc_offsets"].where["row"] == 4
    assert res["totals"].status == FAIL and "docs_cut" in res["totals"].message


def test_a_duplicated_piece_of_a_split_document_fails_verify_though_the_totals_agree(tmp_path):
    """Two middle pieces of one split document, each a full row: replacing the first with the
    second leaves every total as it was (stats finds nothing), but the document's pieces no
    longer follow one another: verify fails `doc_offsets`."""
    out = pack_docs(tmp_path, LONG, 16)
    rows = []
    edit_rows(out, lambda r: rows.extend(r) or r)  # read them as stored
    doc = [r for r in rows if r["doc_ids"] == [0]]
    assert len(doc) >= 3 and all(len(r["doc_ids"]) == 1 for r in doc[:3])
    a, b = rows.index(doc[1]), rows.index(doc[2])
    edit_rows(out, lambda r: r[:a] + [dict(r[b])] + r[a + 1:])
    assert analyze_packed(out, check_hashes=False).mismatches == {}
    res, ok = _data(out)
    assert not ok and res["doc_offsets"].status == FAIL
    assert "document 0" in res["doc_offsets"].message


def test_a_moved_offset_of_a_document_never_split_fails_verify(short):
    """doc_offsets of a document held by one segment moved from 0 to 5: nothing was split,
    truncated or left out (the manifest says so), so its only piece must start at 0."""
    def move(rows):
        rows[0]["doc_offsets"][0] += 5
        return rows

    edit_rows(short, move)
    res, ok = _data(short)
    assert not ok and res["doc_offsets"].status == FAIL
    assert "no piece at doc_offsets 0" in res["doc_offsets"].message
    assert res["doc_offsets"].where == {"shard": "part-00000.parquet", "row": 0}


def test_pieces_of_split_documents_and_a_min_fill_output_pass(tmp_path):
    """No false alarm: split documents (pieces that fill their rows, tails anywhere), and an
    output whose --min-fill left rows out (pieces legitimately missing) pass `doc_offsets`."""
    long_ = pack_docs(tmp_path, LONG + SHORT, 16, name="long")
    cut = pack_docs(tmp_path, LONG + SHORT, 16, "--strategy", "concat", "--min-fill", "0.9",
                    name="cut")
    assert read_manifest(cut).totals.rows_dropped > 0
    for out in (long_, cut):
        res, ok = _data(out)
        assert ok and res["doc_offsets"].status == PASS and res["totals"].status == PASS, out


def test_a_padding_token_other_than_the_pad_id_fails_verify(tmp_path):
    """The manifest records the pad id; a padding token holding another id fails `padding`,
    naming shard and row; an output packed with --pad-id 3 passes."""
    out = pack_docs(tmp_path, SHORT, 16, "--pad-id", "3")
    res, ok = _data(out)
    assert ok and res["padding"].status == PASS and res["padding"].figures["pad_id"] == 3
    row = []

    def pad7(rows):
        i = next(i for i, r in enumerate(rows) if r["segment_ids"][-1] == 0)
        rows[i]["input_ids"][-1] = 7
        row.append(i)
        return rows

    edit_rows(out, pad7)
    res, ok = _data(out)
    assert not ok and res["padding"].status == FAIL
    assert "holds 7" in res["padding"].message and "pad_id 3" in res["padding"].message
    assert res["padding"].where["row"] == row[0]


@pytest.mark.parametrize("multiple", [1, 4])
def test_padding_given_a_real_segment_id_is_blamed_on_segment_ids_not_cu_seqlens(tmp_path,
                                                                                 multiple):
    """Padding given its document's segment id: segment_ids decided what was padding, so the
    scan said cu_seqlens does not cut the tokens and that doc_ids were too few. cu_seqlens
    (with cu_seqlens_unpadded) decides it now: segment_ids fails at the first such token,
    saying where the padding starts, and cu_seqlens and doc_ids pass."""
    out = pack_docs(tmp_path, SHORT, 16, "--segment-multiple", str(multiple))
    found = {}

    def edit(rows):
        for i, r in enumerate(rows):
            cu, k = r["cu_seqlens"], len(r["doc_ids"])
            real = (r["cu_seqlens_unpadded"][1] - r["cu_seqlens_unpadded"][0] if multiple > 1
                    else None)
            if multiple > 1 and k >= 2 and real < cu[1]:  # padding inside the first span
                a, b, q = real, cu[1], 1
            elif multiple == 1 and k >= 2 and len(cu) == k + 2:  # a padding tail
                a, b, q = cu[k], cu[k + 1], k
            else:
                continue
            r["segment_ids"][a:b] = [q] * (b - a)
            found.update(row=i, at=a, q=q)
            return rows
        raise AssertionError("no row to edit")

    edit_rows(out, edit)
    res, ok = _data(out)
    assert not ok
    seg = res["segment_ids"]
    assert seg.status == FAIL and seg.where["row"] == found["row"], seg.message
    assert seg.message.startswith(f"padding token {found['at']} (after ")
    assert seg.message.endswith(f"has segment_id {found['q']}, must be 0")
    if multiple == 1:
        assert f"after cu_seqlens' last boundary {found['at']})" in seg.message
    for check in ("cu_seqlens", "doc_ids", "cu_seqlens_unpadded"):
        if check in res:
            assert res[check].status == PASS, res[check].message


def test_the_model_checks_take_padding_from_cu_seqlens_not_segment_ids():
    """The rows run through the models: their documents' spans and windows ended where
    segment_ids said the padding starts, so padding given a segment id became a document."""
    from packtool.verify.checks import _spans

    item = {"cu_seqlens": np.array([0, 5, 9, 16]), "doc_ids": [3, 4],
            "segment_ids": np.array([1] * 5 + [2] * 11), "input_ids": np.zeros(16, np.int64)}
    assert _spans(item) == [(0, 5), (5, 9)]
    item["segment_ids"][9:] = 0
    assert _spans(item) == [(0, 5), (5, 9)]


def test_no_scan_lists_the_whole_output_checks_as_not_run(short):
    """--no-scan checks sampled rows only: the totals and document pieces cannot be told, and
    the report says so (skipped, not required) instead of passing them."""
    rep = run_verify(short, data_only=True, check_hashes=False, scan_all=False)
    res = {r.check: r for r in rep.results}
    assert rep.ok
    for check in ("totals", "doc_offsets"):
        assert res[check].status == "skip" and not res[check].required
        assert "--no-scan" in res[check].message


def test_a_negative_token_id_fails_verify_naming_shard_and_row(short):
    """pack refuses a negative token id as input: one in a document of row 2 (the manifest
    resealed) fails the `input_ids` column check, naming shard, row and token."""
    res, ok = _data(short)
    assert ok and res["input_ids"].status == PASS

    def negative(rows):
        rows[2]["input_ids"][1] = -7
        return rows

    edit_rows(short, negative)
    res, ok = _data(short)
    assert not ok and res["input_ids"].status == FAIL
    assert res["input_ids"].where == {"shard": "part-00000.parquet", "row": 2}
    assert "token 1 holds the negative token id -7" in res["input_ids"].message
    run = CliRunner().invoke(cli, ["verify", "--data-only", str(short)])
    assert run.exit_code == 1 and "negative token id -7" in run.output


@pytest.mark.parametrize("forge, words", [
    (lambda t: t.set_column(t.schema.get_field_index("cu_seqlens"), "cu_seqlens",
                            t["cu_seqlens"].cast(pa.list_(pa.int64()))),
     "column 'cu_seqlens' is list<element: int64>"),
    (lambda t: t.set_column(0, "input_ids", t["input_ids"].cast(pa.list_(pa.int32()))),
     "column 'input_ids' is list<element: int32>"),
    (lambda t: t.drop_columns(["doc_offsets"]), "missing ['doc_offsets']"),
    (lambda t: t.append_column("attention_mask", pa.array([[1]] * t.num_rows)),
     "not in the contract: ['attention_mask']"),
])
def test_a_schema_off_the_contract_fails_verify(tmp_path, forge, words):
    """Shards rewritten with other types or columns and the manifest resealed over them (so
    the reader's own checks pass): the values still read, but other readers of the contract
    would get other types: verify's schema check names the column."""
    out = pack_docs(tmp_path, [[11, 12, 13], [21, 22], [31, 32, 33, 34]], 8)
    shard = out / "part-00000.parquet"
    pq.write_table(forge(pq.read_table(shard)), shard)
    reseal(out)
    res = CliRunner().invoke(cli, ["verify", "--data-only", str(out)])
    assert res.exit_code == 1, res.output
    line = res.output.strip().splitlines()[-1]
    assert "check schema failed" in line and words in line, line


def test_an_id_over_the_recorded_vocabulary_passes_input_ids(tmp_path):
    """An output whose manifest records its inputs' tokenizer (1,000 ids): a row holding id
    1,000 passes ``input_ids`` (a valid corpus holds such ids: a BOS/EOS tokenize added above a
    BPE file's ranks, a column the tokenizer did not write), as does ``--pad-id`` 5000."""
    from packtool.formats.manifest import Tokenization, TokenizerInfo

    out = pack_docs(tmp_path, SHORT, 16, "--pad-id", "5000")
    reseal(out, tokenized=Tokenization(TokenizerInfo("tokenizers", "0" * 64, vocab_size=1000)))

    def over(rows):
        rows[2]["input_ids"] = [1000] + list(rows[2]["input_ids"][1:])
        return rows

    edit_rows(out, over)
    res, ok = _data(out)
    assert ok and res["input_ids"].status == PASS, res["input_ids"].message
