"""Windowed packing (``--window-docs``): windows of N documents planned alone, rows mixed."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import read_rows, write_docs
from packcheck import finished_shards
from packtool.cli import cli
from packtool.config import PackConfig
from packtool.errors import PackingError
from packtool.formats.manifest import MANIFEST_NAME, read_manifest
from packtool.formats.reader import discover_inputs
from packtool.pipeline import run_pack
from packtool.pipeline.plan import plan_windows
from packtool.pipeline.read import plan_reads

C = 64


def _corpus(root, seed=0, files=(40, 7, 90, 0, 25), row_group=16):
    """Files of web-like lengths (some empty, some over C); returns docs in global order."""
    rng = np.random.default_rng(seed)
    all_docs = []
    for i, n in enumerate(files):
        lengths = np.minimum(rng.lognormal(3.0, 1.0, n).astype(int), 300)
        lengths[rng.random(n) < 0.05] = 0
        docs = [rng.integers(0, 200_000, k).tolist() for k in lengths]
        write_docs(root / f"f{i:02d}.parquet", docs, row_group_size=row_group)
        all_docs.extend(docs)
    return all_docs


def _pack(inp, out, **kw):
    kw.setdefault("capacity", C)
    kw.setdefault("workers", 2)
    kw.setdefault("rows_per_shard", 7)
    return run_pack(PackConfig(inputs=(str(inp),), output=str(out), **kw), progress=False)


def test_windows_deal_blocks_of_documents_across_the_whole_input():
    """Every document is in exactly one window, no window holds more than N, the fewest such
    windows are used, and each window's blocks are spread over the whole input (a window is a
    sample of every part of a corpus sorted by source, not one run of it)."""
    for docs, n in [(162, 30), (10_000, 700), (5, 2), (1000, 1), (64 * 50 + 7, 64 * 5)]:
        ws = plan_windows(docs, n)
        sizes = ws.sizes()
        assert sizes.sum() == docs and sizes.max() <= n
        assert ws.count == -(-ws.blocks // (n // ws.block))  # fewest windows of whole blocks
        seen = np.concatenate([np.arange(a, b) for w in range(ws.count)
                               for a, b in ws.ranges(w).tolist()])
        assert np.array_equal(np.sort(seen), np.arange(docs))
        for w in range(ws.count):
            r = ws.ranges(w)
            assert (r[:, 0] < r[:, 1]).all() and (r[1:, 0] > r[:-1, 1] - 1).all()
            assert r[:, 1].sum() - r[:, 0].sum() == sizes[w]
            assert (ws.window_of(np.arange(r[0, 0], r[0, 1])) == w).all()
            if ws.count > 1 and sizes[w] >= 4 * ws.block:  # spread: first and last blocks apart
                assert r[0, 0] < docs // 4 and r[-1, 1] > 3 * docs // 4, (w, r)
    assert plan_windows(162, None).count == 1 and plan_windows(162, 10**9).ranges(0).tolist() \
        == [[0, 162]]
    assert plan_windows(162, 30).count == 6


def test_read_parts_cut_files_at_row_groups_and_never_mix_a_cut(tmp_path, monkeypatch):
    """Files are cut into pieces at row-group boundaries under the byte budget (a row group over
    the most a part may hold into equal row ranges), pieces are grouped into parts under the
    budget, and the parts tile the global document order."""
    from packtool.pipeline import read as read_mod

    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 1000, int(k)).tolist() for k in rng.integers(1, 90, 500)]
    write_docs(tmp_path / "in" / "a.parquet", docs[:100], row_group_size=10)
    write_docs(tmp_path / "in" / "b.parquet", docs[100:], row_group_size=400)  # 1 big group
    files = discover_inputs([tmp_path / "in"])
    assert len(plan_reads(files, "input_ids")) == 1  # both files fit one smallest part
    budget = files[1].bytes // 5
    assert len(plan_reads(files, "input_ids", budget)) > 1
    assert all(p.first_row == 0 for part in plan_reads(files, "input_ids", budget)
               for p in part.pieces if p.file == 1)  # a budget alone never cuts a row group
    monkeypatch.setattr(read_mod, "READ_PART_BYTES", budget)
    parts = plan_reads(files, "input_ids", budget)
    pieces = [p for part in parts for p in part.pieces]
    assert sum(p.docs for p in pieces) == 500
    assert [p.first_doc for p in pieces] == np.cumsum([0] + [p.docs for p in pieces])[:-1].tolist()
    a = [p for p in pieces if p.file == 0]
    assert all(p.first_row % 10 == 0 and p.docs % 10 == 0 for p in a)  # whole row groups
    b = [p for p in pieces if p.file == 1]
    assert len(b) >= 5 and max(p.docs for p in b) - min(p.docs for p in b) <= 1  # equal ranges
    assert all(sum(p.bytes for p in part.pieces) <= budget or len(part.pieces) == 1
               for part in parts)
    assert [part.index for part in parts] == list(range(len(parts)))


def test_one_huge_row_group_read_in_parts_gives_the_same_bytes(tmp_path, monkeypatch):
    """A file written as one row group of 500 documents, read in parts of a few rows each, packs
    to the bytes of one part, windows or not; each document appears once, whole."""
    from packtool.pipeline import read as read_mod

    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 1000, int(k)).tolist() for k in rng.integers(1, 90, 500)]
    write_docs(tmp_path / "in" / "big.parquet", docs, row_group_size=500)
    import pyarrow.parquet as pq

    assert pq.ParquetFile(tmp_path / "in" / "big.parquet").num_row_groups == 1
    for wd in (None, 40):
        _pack(tmp_path / "in", tmp_path / f"ref-{wd}", window_docs=wd, rows_per_shard=1000)
    monkeypatch.setattr(read_mod, "MIN_PART_BYTES", 2000)
    monkeypatch.setattr(read_mod, "READ_PART_BYTES", 2000)
    assert len(read_mod.plan_reads(discover_inputs([tmp_path / "in"]), "input_ids")) > 10
    for wd in (None, 40):
        res = _pack(tmp_path / "in", tmp_path / f"out-{wd}", window_docs=wd, rows_per_shard=1000)
        assert _tree_bytes(tmp_path / f"out-{wd}") == _tree_bytes(tmp_path / f"ref-{wd}")
    recs = res.manifest.windows
    assert sum(w.docs for w in recs) == 500 and max(w.docs for w in recs) <= 40
    rows = read_rows(tmp_path / "out-40")
    assert sorted((d, o) for r in rows for d, o in zip(r["doc_ids"], r["doc_offsets"])) == \
        sorted((d, o) for d, doc in enumerate(docs) for o in range(0, len(doc), C))


def test_windowed_pack_conserves_every_token(tmp_path):
    """Every input token appears exactly once, at its global doc id and offset."""
    docs = _corpus(tmp_path / "in")
    _pack(tmp_path / "in", tmp_path / "out", window_docs=30)
    seen = {}
    for row in read_rows(tmp_path / "out"):
        ids, seg = row["input_ids"], row["segment_ids"]
        assert len(ids) == C
        for k, (d, off) in enumerate(zip(row["doc_ids"], row["doc_offsets"])):
            piece = [t for t, s in zip(ids, seg) if s == k + 1]
            assert (d, off) not in seen
            seen[(d, off)] = piece
    for d, doc in enumerate(docs):
        got = [t for (dd, off) in sorted(k for k in seen if k[0] == d) for t in seen[(dd, off)]]
        assert got == doc, f"document {d}"


def test_window_extra_rows_are_reported_per_window_and_in_total(tmp_path):
    """The manifest's windows add up to its totals, each with its own lower bound."""
    _corpus(tmp_path / "in")
    res = _pack(tmp_path / "in", tmp_path / "out", window_docs=30)
    m = read_manifest(tmp_path / "out")
    assert m == res.manifest and m.options["window_docs"] == 30
    ws = m.windows
    assert len(ws) > 3
    t = m.totals.to_dict()
    assert sum(w.rows for w in ws) == t["rows"] == sum(o.rows for o in m.shards)
    assert sum(w.docs for w in ws) == t["docs_in"]
    assert sum(w.real_tokens for w in ws) == t["real_tokens"]
    for w in ws:
        assert w.lower_bound_rows == -(-w.real_tokens // C)
        assert w.extra_rows == w.rows - w.lower_bound_rows >= 0
    assert t["extra_rows"] == t["rows"] - -(-t["real_tokens"] // C)
    assert [o.file for o in m.shards] == [f"part-{i:05d}.parquet"
                                          for i in range(len(m.shards))]


def test_windowed_output_is_deterministic_for_any_worker_count(tmp_path):
    """Same bytes on a rerun and with 1 or 3 threads."""
    _corpus(tmp_path / "in")
    _pack(tmp_path / "in", tmp_path / "a", window_docs=30, workers=1)
    _pack(tmp_path / "in", tmp_path / "b", window_docs=30, workers=3)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n


def _window_of(manifest, doc):
    """Window of a global document, by the manifest's dealing rule."""
    rule = manifest.windowing
    return (doc // rule.block_docs) % rule.windows


def _window_of_rows(out, m):
    """Window index of each output row, in reading order (manifest, then row order)."""
    return [_window_of(m, r["doc_ids"][0]) for r in read_rows(out)]


def test_rows_of_all_windows_are_mixed_in_reading_order(tmp_path):
    """Read in order, the output does not follow the input window by window: the first shard
    already holds rows of most windows, and window changes happen all along."""
    _corpus(tmp_path / "in")
    res = _pack(tmp_path / "in", tmp_path / "s", window_docs=30, rows_per_shard=20)
    ws = res.manifest.windows
    order = _window_of_rows(tmp_path / "s", res.manifest)
    assert len(ws) >= 6 and len(order) > 40
    first_shard = set(order[:20])
    assert len(first_shard) >= len(ws) // 2, first_shard
    changes = sum(a != b for a, b in zip(order, order[1:]))
    assert changes > len(order) // 2  # window-granular order would change len(ws) - 1 times
    assert order != sorted(order)
    # each row still holds documents of one window only
    for r, w in zip(read_rows(tmp_path / "s"), order):
        assert all(_window_of(res.manifest, d) == w for d in r["doc_ids"])
    # --no-shuffle keeps creation order: window after window
    res = _pack(tmp_path / "in", tmp_path / "n", window_docs=30, shuffle=False)
    got = _window_of_rows(tmp_path / "n", res.manifest)
    assert got == sorted(got)


def test_default_mode_is_one_global_plan(tmp_path):
    """Without --window-docs the output is the single global plan; a window larger than the
    corpus gives the same shards."""
    _corpus(tmp_path / "in")
    _pack(tmp_path / "in", tmp_path / "g", shuffle=False)
    _pack(tmp_path / "in", tmp_path / "w", shuffle=False, window_docs=10**9)
    mg = read_manifest(tmp_path / "g")
    mw = read_manifest(tmp_path / "w")
    assert not mg.windows and mg.windowing is None and "window_docs" not in mg.options
    assert [o.file for o in mg.shards][:2] == ["part-00000.parquet", "part-00001.parquet"]
    assert len(mw.windows) == 1
    for og, ow in zip(mg.shards, mw.shards, strict=True):
        assert (tmp_path / "g" / og.file).read_bytes() == \
            (tmp_path / "w" / ow.file).read_bytes()
    assert mg.totals == mw.totals


def test_overflow_error_names_file_and_row_of_the_long_document(tmp_path):
    """--overflow error in a later window names the real file and row, not a window index."""
    docs = [[1] * 10] * 20 + [[2] * (C + 1)]
    write_docs(tmp_path / "in" / "a.parquet", docs, row_group_size=8)
    with pytest.raises(PackingError,
                       match=r"a\.parquet: row 20 \(0-based\): .*longer than --capacity"):
        _pack(tmp_path / "in", tmp_path / "out", window_docs=8, overflow="error")
    assert not (tmp_path / "out").exists()


def test_interrupted_windowed_pack_resumes_with_same_bytes(tmp_path, monkeypatch):
    """A failure after some shards were written leaves them; the rerun reuses them and ends
    with the bytes of an uninterrupted run."""
    from packtool.pipeline import write as write_mod

    _corpus(tmp_path / "in")
    ref = _pack(tmp_path / "in", tmp_path / "ref", window_docs=30, workers=1)
    real = write_mod.write_shard_task
    calls = []

    def crash_at_third(cfg, job, plans):
        calls.append(job.index)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(cfg, job, plans)

    monkeypatch.setattr("packtool.pipeline.write_shard_task", crash_at_third)
    with pytest.raises(KeyboardInterrupt):
        _pack(tmp_path / "in", tmp_path / "out", window_docs=30, workers=1)
    monkeypatch.undo()
    out = tmp_path / "out"
    assert not (out / MANIFEST_NAME).exists()
    assert not list(out.glob("part-*"))  # no row under a final name before the manifest
    assert finished_shards(out) == ["part-00000.parquet", "part-00001.parquet"]
    res = _pack(tmp_path / "in", out, window_docs=30, workers=1)
    assert res.shards_reused == 2
    assert res.windows_reused == len(ref.manifest.windows) > 1  # Ctrl-C keeps them
    assert res.manifest.shards == ref.manifest.shards
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in
                                                            (tmp_path / "ref").iterdir())
    for o in ref.manifest.shards:
        assert (out / o.file).read_bytes() == (tmp_path / "ref" / o.file).read_bytes()


def test_cli_summary_reports_windows(tmp_path):
    """The summary names the window count and the extra rows they cost."""
    _corpus(tmp_path / "in")
    r = CliRunner().invoke(cli, ["pack", "-c", str(C), "--window-docs", "30",
                                 str(tmp_path / "in"), str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines()
                if "windows 6 of 27..27 documents (--window-docs 30)" in x)
    # the parts add up to the total extra rows of the summary's first lines
    total, packing, rounding = (int(x.replace(",", "")) for x in re.findall(
        r"extra rows ([\d,]+) = ([\d,]+) from packing .* \+ ([\d,]+) from rounding", line)[0])
    assert total == packing + rounding
    assert f"extra rows over ceil(tokens/C): {total}" in r.output
    r = CliRunner().invoke(cli, ["pack", "--window-docs", "0", str(tmp_path / "in"),
                                 str(tmp_path / "o2")])
    assert r.exit_code == 2
    # --json carries the same breakdown (it had none: only the manifest held the windows)
    r = CliRunner().invoke(cli, ["pack", "-c", str(C), "--window-docs", "30", "--json",
                                 str(tmp_path / "in"), str(tmp_path / "o3")])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["windows"] == {"windows": 6, "docs_min": 27, "docs_max": 27, "window_docs": 30,
                              "extra_rows": total, "extra_rows_within": packing,
                              "extra_rows_max": got["windows"]["extra_rows_max"],
                              "extra_rows_rounding": rounding}
    assert got["stats"]["extra_rows"] == total
    assert 0 <= got["windows"]["extra_rows_max"] <= packing
    r = CliRunner().invoke(cli, ["pack", "-c", str(C), "--json", str(tmp_path / "in"),
                                 str(tmp_path / "o4")])
    assert "windows" not in json.loads(r.stdout)  # one global plan: no windows


def _tree_bytes(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("window_docs", [None, 30])
def test_any_read_part_size_and_worker_count_gives_the_same_bytes(tmp_path, monkeypatch,
                                                                 window_docs):
    """Read parts of a few hundred bytes (files cut into many pieces and parts) or one part, 1
    or 3 workers: the output is byte-identical, input label masks included (flags spilled
    beside the tokens, in the parts of the file that has them), and no spill is left."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.pipeline import read as read_mod

    docs = _corpus(tmp_path / "in")
    rng = np.random.default_rng(9)
    labels = [[-100 if rng.random() < 0.3 else t for t in d] for d in docs[:60]]
    pq.write_table(pa.table({"input_ids": pa.array(docs[:60], pa.list_(pa.int64())),
                             "labels": pa.array(labels, pa.list_(pa.int64()))}),
                   tmp_path / "in" / "f00.parquet", row_group_size=16)
    ref = _pack(tmp_path / "in", tmp_path / "ref", window_docs=window_docs, workers=1)
    assert ref.stats.tokens_label_masked > 0
    monkeypatch.setattr(read_mod, "MIN_PART_BYTES", 600)
    for workers in (1, 3):
        res = _pack(tmp_path / "in", tmp_path / f"small{workers}", window_docs=window_docs,
                    workers=workers)
        assert res.manifest.totals == ref.manifest.totals
        assert _tree_bytes(tmp_path / f"small{workers}") == _tree_bytes(tmp_path / "ref")
    assert len(read_mod.plan_reads(discover_inputs([tmp_path / "in"]), "input_ids")) > 5


def test_every_token_is_spilled_once_and_read_once_into_its_row(tmp_path, monkeypatch):
    """Outside Parquet each token is written once (the read parts' spill; the windows hold only
    their plans) and read once, by the writing tasks, straight into its row: the segments read
    add up to the real tokens of the output."""
    from packtool.pipeline import spill as spill_mod
    from packtool.pipeline.spill import ROW_INDEX, SEGMENTS

    _corpus(tmp_path / "in")
    files, reads = {}, []
    real_writer, real_pread = spill_mod.spill_writer, spill_mod._pread_segments

    def writer(location, append=False):
        name = str(location).rsplit("/", 1)[-1]
        files[name] = files.get(name, 0) + 1
        return real_writer(location, append)

    def pread(fds, src, lens, out, dest):  # every local read of a spill goes through it
        if out.dtype == np.int32:
            reads.append(int(np.asarray(lens).sum()))
        return real_pread(fds, src, lens, out, dest)

    monkeypatch.setattr("packtool.pipeline.read.spill_writer", writer)
    monkeypatch.setattr("packtool.pipeline.plan.spill_writer", writer)
    monkeypatch.setattr(spill_mod, "_pread_segments", pread)
    res = _pack(tmp_path / "in", tmp_path / "out", window_docs=30, workers=1, rows_per_group=3)
    assert set(files) == {"tokens.int32", "starts.int64", ROW_INDEX, SEGMENTS}, files
    assert files[ROW_INDEX] == files[SEGMENTS] == len(res.manifest.windows)
    assert sum(reads) == res.stats.real_tokens


def test_windowing_is_a_typed_manifest_field_and_older_window_records_still_read(tmp_path):
    """A windowed pack records how it dealt its documents (``windowing``: windows, block size,
    the rule) and one record per window without ``first_doc``/``inputs``; a manifest written
    with contiguous windows (records with ``first_doc`` and ``inputs``, no ``windowing``),
    format version 3 or 2, still reads, and writes back in its own form."""
    from packtool.core.windows import plan_windows as deal
    from packtool.formats.manifest import Manifest, Windowing

    docs = _corpus(tmp_path / "in")
    res = _pack(tmp_path / "in", tmp_path / "out", window_docs=30)
    m = read_manifest(tmp_path / "out")
    ws = deal(len(docs), 30)
    assert m.windowing == Windowing(ws.count, ws.block) == res.manifest.windowing
    assert [m.windowing.window_of(d) for d in range(len(docs))] == \
        ws.window_of(np.arange(len(docs))).tolist()
    d = m.to_dict()
    assert d["windowing"]["rule"].startswith("block j") and d["windowing"]["windows"] == ws.count
    assert all("first_doc" not in w and "inputs" not in w for w in d["windows"])
    assert [w.first_doc for w in m.windows] == [None] * ws.count
    assert Manifest.from_dict(d) == m
    old = {k: v for k, v in d.items() if k != "windowing"}
    old["windows"] = [{**w, "first_doc": 30 * i,
                       "inputs": [{"path": "f00.parquet", "first_row": 30 * i, "docs": w["docs"]}]}
                      for i, w in enumerate(d["windows"])]
    mo = Manifest.from_dict(old)
    assert mo.windowing is None and [w.first_doc for w in mo.windows] == \
        [30 * i for i in range(ws.count)]
    assert mo.windows[1].inputs == ({"path": "f00.parquet", "first_row": 30, "docs":
                                     d["windows"][1]["docs"]},)
    assert mo.to_dict()["windows"] == old["windows"] and Manifest.from_dict(mo.to_dict()) == mo
    v2 = {k: v for k, v in old.items() if k not in ("shards", "capacity", "labels")}
    v2.update(format_version=2, options={**d["options"], "capacity": C, "labels": "none"},
              outputs=[{k: s[k] for k in ("file", "rows", "bytes", "sha256")}
                       for s in d["shards"]])
    m2 = Manifest.from_dict(v2)
    assert m2.format_version == 2 and m2.windows == mo.windows and m2.windowing is None
