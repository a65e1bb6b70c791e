"""Forged provenance lists and manifest figures: each a FAIL (verify) or a one-line error naming
shard and row (stats), never a crash or an allocation sized by a value read from the output.

The rows' ragged columns (``doc_ids``, ``doc_offsets``, ``source_ids``, ``cu_seqlens_unpadded``)
are edited with pyarrow and the manifest resealed over the new shard, so only what the rows say
against the manifest can catch them; the manifest figures no row holds are edited alone and
caught through their identities with the recounted ones (``packtool.recount.Recount.tied``).
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
from packtool.errors import ManifestError
from packtool.formats.manifest import read_manifest
from packtool.verify.checks import run_verify
from packtool.verify.report import FAIL, PASS

RNG = np.random.default_rng(5)
#: never split at C = 16, several per row, padding tails
SHORT = [list(map(int, RNG.integers(1, 1000, n))) for n in [9, 5, 7, 3, 12, 4, 6, 2, 8, 10, 3]]
#: split into pieces of C = 16, an empty document among them
LONG = [list(map(int, RNG.integers(1, 1000, n))) for n in [70, 53, 0, 41]]


def _pack_sourced(tmp_path, docs, every: int):
    """``docs`` packed at C = 16 with ``--source-column``: source ``a``, or ``b`` for every
    ``every``-th document (from the first)."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int64())),
                             "s": ["a" if i % every else "b" for i in range(len(docs))]}), src)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["pack", "-c", "16", "--no-shuffle", "-q", "--source-column",
                                   "s", str(src.parent), str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture
def sourced(tmp_path):
    """SHORT packed at C = 16 with ``--source-column``: two sources, ids 0 and 1."""
    return _pack_sourced(tmp_path, SHORT, 3)


def _set(row, column, fn):
    def edit(rows):
        rows[row] = dict(rows[row], **{column: fn(rows[row])})
        return rows
    return edit


FORGED = {  # name -> (column, new value from the row); row 1 holds 2+ documents
    "doc_ids_longer": ("doc_ids", lambda r: r["doc_ids"] + [r["doc_ids"][-1]]),
    "doc_offsets_shorter": ("doc_offsets", lambda r: r["doc_offsets"][:-1]),
    "source_ids_shorter": ("source_ids", lambda r: r["source_ids"][:-1]),
    "source_id_outside_table": ("source_ids", lambda r: r["source_ids"][:-1] + [7]),
    "doc_id_negative": ("doc_ids", lambda r: r["doc_ids"][:-1] + [-1]),
    "doc_id_beyond_docs_in": ("doc_ids", lambda r: r["doc_ids"][:-1] + [99]),
    "doc_id_huge": ("doc_ids", lambda r: r["doc_ids"][:-1] + [2**40]),
}


@pytest.mark.parametrize("name", list(FORGED))
def test_a_forged_provenance_list_fails_verify_naming_the_row(sourced, name):
    """A provenance list of the wrong length or with an id that names no document (no source)
    fails the row's ``doc_ids`` check at its shard and row; the whole-output checks are not run
    on rows that cannot be counted; the CLI exits 1 with FAIL lines, no internal error and no
    allocation sized by the id."""
    column, fn = FORGED[name]
    rows = pq.read_table(next(sourced.glob("part-*.parquet"))).to_pylist()
    assert len(rows[1]["doc_ids"]) >= 2
    edit_rows(sourced, _set(1, column, fn))
    rep = run_verify(sourced, data_only=True, check_hashes=False)
    res = {r.check: r for r in rep.results}
    assert not rep.ok
    assert res["doc_ids"].status == FAIL and res["doc_ids"].where["row"] == 1
    assert res["totals"].status != PASS
    run = CliRunner().invoke(cli, ["verify", "--data-only", "--no-hash", str(sourced)])
    assert run.exit_code == 1 and "FAIL" in run.output
    assert "internal error" not in run.output and "out of memory" not in run.output


@pytest.mark.parametrize("name", [n for n in FORGED if FORGED[n][0] != "doc_offsets"])
def test_a_forged_provenance_list_is_one_stats_error_naming_shard_and_row(sourced, name):
    """stats reads doc_ids and source_ids: a forged one is a ManifestError naming the shard and
    row (a doc_ids list longer than the segments counts the padding as a document, which the
    totals then refuse)."""
    column, fn = FORGED[name]
    edit_rows(sourced, _set(1, column, fn))
    try:
        a = analyze_packed(sourced, check_hashes=False)
    except ManifestError as exc:
        assert "part-00000.parquet: row 1 (0-based)" in str(exc)
    else:
        assert name == "doc_ids_longer" and a.mismatches
    run = CliRunner().invoke(cli, ["stats", "--no-hash", str(sourced)])
    assert run.exit_code == 1 and "internal error" not in run.output


def test_forged_cu_seqlens_unpadded_is_one_stats_error(tmp_path):
    """``--segment-multiple``: real lengths that do not increase (a negative document length)
    are refused by stats at their row, not counted into a histogram."""
    out = pack_docs(tmp_path, SHORT, 16, "--segment-multiple", "4")
    edit_rows(out, _set(0, "cu_seqlens_unpadded",
                        lambda r: [0, r["cu_seqlens_unpadded"][1] + 99]
                        + r["cu_seqlens_unpadded"][2:]))
    with pytest.raises(ManifestError, match=r"part-00000.parquet: row 0 \(0-based\): "
                                            "cu_seqlens_unpadded"):
        analyze_packed(out, check_hashes=False)
    rep = run_verify(out, data_only=True, check_hashes=False)
    assert not rep.ok


#: figure raised by one -> the mismatch stats names (the figure, or the identity it breaks)
TIED = {"docs_split": "docs_split", "split_fragments": "split_fragments",
        "tokens_truncated": "tokens_dropped", "tokens_dropped": "tokens_in",
        "docs_empty": "docs_empty", "tokens_in": "tokens_in", "docs_dropped": "docs_empty"}


@pytest.mark.parametrize("figure", list(TIED))
def test_manifest_figures_tied_to_the_rows_are_checked(tmp_path, figure):
    """A figure no row holds, raised by one in the manifest alone: stats exits 1 naming the
    identity it breaks (split pieces from segments - documents, split documents from those in
    several segments, tokens_in = real + tokens_dropped, tokens_dropped at least the truncated
    tokens it counts, empty documents from docs_in less
    those seen, dropped or held out), and verify fails ``totals``."""
    out = pack_docs(tmp_path, LONG + SHORT, 16)
    assert not analyze_packed(out, check_hashes=False).mismatches
    m = read_manifest(out)
    reseal(out, totals=dataclasses.replace(m.totals, **{figure: getattr(m.totals, figure) + 1}))
    bad = analyze_packed(out, check_hashes=False).mismatches
    assert any(k.split(" ")[0] == TIED[figure] for k in bad), bad
    run = CliRunner().invoke(cli, ["stats", "--no-hash", str(out)])
    assert run.exit_code == 1 and TIED[figure] in run.output
    res = {r.check: r for r in run_verify(out, data_only=True, check_hashes=False).results}
    assert res["totals"].status == FAIL and TIED[figure] in res["totals"].message


@pytest.mark.parametrize("options", [(), ("--strategy", "concat"), ("--strategy", "ordered"),
                                     ("--overflow", "truncate"), ("--overflow", "drop"),
                                     ("--min-fill", "0.9"), ("--segment-multiple", "4"),
                                     ("--strategy", "concat", "--min-fill", "0.95"),
                                     ("--holdout", "0.3"), ("--window-docs", "5")])
def test_tied_figures_of_untouched_outputs_agree(tmp_path, options):
    """The identities hold for every way of packing (concat counts its cuts as docs_cut, not
    split; --min-fill keeps some pieces of a split document; --holdout counts the other part's
    documents in docs_in), for both outputs of a holdout."""
    out = pack_docs(tmp_path, LONG + SHORT, 16, *options)
    for o in [out] + ([out.with_name(out.name + "-holdout")] if "--holdout" in options else []):
        assert not analyze_packed(o, check_hashes=False).mismatches, o
        assert run_verify(o, data_only=True, check_hashes=False).ok


@pytest.mark.parametrize("piece", [0, 1, -1])
def test_a_piece_of_a_split_document_given_another_source_fails_verify_and_stats(tmp_path,
                                                                                  piece):
    """A document split into pieces comes from one source: one piece (first, middle or last)
    rewritten to carry another valid source id passed verify and stats, which then counted its
    tokens to the wrong source. Both now fail naming the document, both ids, shard and row."""
    out = _pack_sourced(tmp_path, LONG + SHORT, 2)
    assert run_verify(out, data_only=True, check_hashes=False).ok
    assert CliRunner().invoke(cli, ["stats", "--no-hash", str(out)]).exit_code == 0
    rows = pq.read_table(next(out.glob("part-*.parquet"))).to_pylist()
    held = [i for i, r in enumerate(rows) if 0 in r["doc_ids"]]  # document 0: 70 tokens
    assert len(held) == 5
    row = held[piece]
    j = rows[row]["doc_ids"].index(0)
    was = rows[row]["source_ids"][j]

    def other(r):
        s = list(r["source_ids"])
        s[j] = 1 - was  # the other source of the table: in range, so no row check sees it
        return s

    edit_rows(out, _set(row, "source_ids", other))
    rep = run_verify(out, data_only=True, check_hashes=False)
    res = {r.check: r for r in rep.results}
    assert not rep.ok and res["doc_ids"].status == PASS
    msg = res["doc_offsets"].message
    assert res["doc_offsets"].status == FAIL, rep.format_text()
    assert "document 0" in msg and f"source_id {1 - was}" in msg and f"source_id {was}" in msg
    assert "part-00000.parquet" in msg and f"row {row}" in msg
    a = analyze_packed(out, check_hashes=False)
    assert len(a.faults) == 1 and "document 0" in a.faults[0] and f"row {row}" in a.faults[0]
    run = CliRunner().invoke(cli, ["stats", "--no-hash", str(out)])
    assert run.exit_code == 1 and "document 0" in run.output, run.output
    assert "part-00000.parquet" in run.output and "internal error" not in run.output
