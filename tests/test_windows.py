"""Windowed packing (``--window-docs``): windows of N documents planned alone, rows mixed."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import read_rows, write_docs
from packtool.cli import cli
from packtool.config import PackConfig
from packtool.errors import PackingError
from packtool.formats.manifest import MANIFEST_NAME, read_manifest
from packtool.formats.reader import discover_inputs
from packtool.pipeline import run_pack
from packtool.pipeline.read import plan_windows

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


def test_windows_are_runs_of_n_documents_across_files_and_row_groups(tmp_path):
    """Windows hold exactly N documents (the last one fewer), cutting files and row groups."""
    _corpus(tmp_path / "in", files=(40, 7, 90, 0, 25), row_group=16)
    files = discover_inputs([tmp_path / "in"])
    ws = plan_windows(files, "input_ids", 50)
    assert [w.docs for w in ws] == [50, 50, 50, 12]
    assert [(p.file, p.first_row, p.docs) for p in ws[0].parts] == [(0, 0, 40), (1, 0, 7),
                                                                     (2, 0, 3)]
    assert [(p.file, p.first_row, p.docs) for p in ws[1].parts] == [(2, 3, 50)]
    assert [(p.file, p.first_row, p.docs) for p in ws[3].parts] == [(4, 13, 12)]
    first = np.cumsum([0] + [w.docs for w in ws])
    assert [w.first_doc for w in ws] == first[:-1].tolist()
    assert all(w.index == i for i, w in enumerate(ws))
    assert len(plan_windows(files, "input_ids", None)) == 1


def test_window_size_holds_with_one_huge_row_group(tmp_path):
    """A file written as one row group of 500 documents still gives windows of 40."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 1000, int(k)).tolist() for k in rng.integers(1, 90, 500)]
    write_docs(tmp_path / "in" / "big.parquet", docs, row_group_size=500)
    import pyarrow.parquet as pq

    assert pq.ParquetFile(tmp_path / "in" / "big.parquet").num_row_groups == 1
    files = discover_inputs([tmp_path / "in"])
    ws = plan_windows(files, "input_ids", 40)
    assert [w.docs for w in ws] == [40] * 12 + [20]
    res = _pack(tmp_path / "in", tmp_path / "out", window_docs=40, rows_per_shard=1000)
    recs = res.manifest.windows
    assert [w.docs for w in recs] == [40] * 12 + [20]
    assert [w.inputs[0]["first_row"] for w in recs] == list(range(0, 500, 40))
    for w in recs:  # each window's rows hold only its own documents
        assert w.tokens == sum(len(d) for d in docs[w.first_doc:w.first_doc + w.docs])
    rows = read_rows(tmp_path / "out")
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


def _window_of_rows(out, ws):
    """Window index of each output row, in reading order (manifest, then row order)."""
    firsts = np.array([w.first_doc for w in ws])
    return [int(np.searchsorted(firsts, r["doc_ids"][0], side="right") - 1)
            for r in read_rows(out)]


def test_rows_of_all_windows_are_mixed_in_reading_order(tmp_path):
    """Read in order, the output does not follow the input window by window: the first shard
    already holds rows of most windows, and window changes happen all along."""
    _corpus(tmp_path / "in")
    res = _pack(tmp_path / "in", tmp_path / "s", window_docs=30, rows_per_shard=20)
    ws = res.manifest.windows
    order = _window_of_rows(tmp_path / "s", ws)
    assert len(ws) >= 6 and len(order) > 40
    first_shard = set(order[:20])
    assert len(first_shard) >= len(ws) // 2, first_shard
    changes = sum(a != b for a, b in zip(order, order[1:]))
    assert changes > len(order) // 2  # window-granular order would change len(ws) - 1 times
    assert order != sorted(order)
    # each row still holds documents of one window only
    firsts = [w.first_doc for w in ws] + [10**9]
    for r, w in zip(read_rows(tmp_path / "s"), order):
        assert all(firsts[w] <= d < firsts[w + 1] for d in r["doc_ids"])
    # --no-shuffle keeps creation order: window after window
    res = _pack(tmp_path / "in", tmp_path / "n", window_docs=30, shuffle=False)
    assert _window_of_rows(tmp_path / "n", ws) == sorted(_window_of_rows(tmp_path / "n", ws))


def test_default_mode_is_one_global_plan(tmp_path):
    """Without --window-docs the output is the single global plan; a window larger than the
    corpus gives the same shards."""
    _corpus(tmp_path / "in")
    _pack(tmp_path / "in", tmp_path / "g", shuffle=False)
    _pack(tmp_path / "in", tmp_path / "w", shuffle=False, window_docs=10**9)
    mg = read_manifest(tmp_path / "g")
    mw = read_manifest(tmp_path / "w")
    assert not mg.windows and "window_docs" not in mg.options
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
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000.parquet",
                                                          "part-00001.parquet"]
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
                if "windows 6 of 12..30 documents (--window-docs 30)" in x)
    # the parts add up to the total extra rows of the summary's first lines
    total, packing, rounding = (int(x.replace(",", "")) for x in re.findall(
        r"extra rows ([\d,]+) = ([\d,]+) from packing .* \+ ([\d,]+) from rounding", line)[0])
    assert total == packing + rounding
    assert f"extra rows over ceil(tokens/C): {total}" in r.output
    r = CliRunner().invoke(cli, ["pack", "--window-docs", "0", str(tmp_path / "in"),
                                 str(tmp_path / "o2")])
    assert r.exit_code == 2


def _tree_bytes(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("window_docs", [None, 30])
def test_windows_over_the_memory_budget_spill_and_give_the_same_bytes(tmp_path, monkeypatch,
                                                                      window_docs):
    """A window task holds WINDOW_MEMORY bytes of input-order tokens and spills the rest to a
    file it reads back with pread: the output is byte-identical either way, input label masks
    included (flags spilled beside the tokens), and no spill is left."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.pipeline import plan as plan_mod

    docs = _corpus(tmp_path / "in")
    rng = np.random.default_rng(9)
    labels = [[-100 if rng.random() < 0.3 else t for t in d] for d in docs[:60]]
    pq.write_table(pa.table({"input_ids": pa.array(docs[:60], pa.list_(pa.int64())),
                             "labels": pa.array(labels, pa.list_(pa.int64()))}),
                   tmp_path / "in" / "f00.parquet", row_group_size=16)
    ref = _pack(tmp_path / "in", tmp_path / "ref", window_docs=window_docs)
    assert ref.stats.tokens_label_masked > 0
    used = []  # (items held in memory, a spill file was written) of every DocSpill
    real = plan_mod.DocSpill.finish

    def spy(self):
        used.append((self.held, self._file is not None))
        return real(self)

    monkeypatch.setattr(plan_mod, "WINDOW_MEMORY", 4 * 1000)  # 1,000 tokens in memory
    monkeypatch.setattr(plan_mod.DocSpill, "finish", spy)
    res = _pack(tmp_path / "in", tmp_path / "small", window_docs=window_docs)
    assert any(h for h, _ in used) and any(f for _, f in used)  # both places were used
    assert res.manifest.totals == ref.manifest.totals
    assert _tree_bytes(tmp_path / "small") == _tree_bytes(tmp_path / "ref")


def test_a_row_group_reads_one_token_range_per_window(tmp_path, monkeypatch):
    """Each window's rows are spilled in the order the output takes them, so laying out a row
    group reads one contiguous range of each window's row spill it draws from, and every
    window's spill is read front to back over the whole pack."""
    from packtool.pipeline import layout as layout_mod
    from packtool.pipeline.spill import ROW_TOKENS

    _corpus(tmp_path / "in")
    reads, groups = [], []
    real_read, real_group = layout_mod.read_spill, layout_mod.layout_group

    def read(location, offsets, sizes):
        if str(location).endswith(ROW_TOKENS):
            reads.append((str(location), int(offsets[0]), int(sizes[0])))
        return real_read(location, offsets, sizes)

    def group(spills, shard, lo, hi, **kw):
        groups.append(len(set(shard.slot[lo:hi].tolist())))
        return real_group(spills, shard, lo, hi, **kw)

    monkeypatch.setattr(layout_mod, "read_spill", read)
    monkeypatch.setattr("packtool.pipeline.write.layout_group", group)
    res = _pack(tmp_path / "in", tmp_path / "out", window_docs=30, workers=1, rows_per_group=3)
    assert len(res.manifest.windows) >= 6 and max(groups) > 1
    assert len(reads) == sum(groups)  # one read per (row group, window present)
    ends = {}
    for loc, off, size in reads:  # front to back, without gaps or overlaps
        assert off == ends.get(loc, 0), (loc, off)
        ends[loc] = off + size
    spilled = {int(re.search(r"window-(\d+)", loc).group(1)): end for loc, end in ends.items()}
    assert spilled == {i: 4 * w.real_tokens for i, w in enumerate(res.manifest.windows)
                       if w.real_tokens}


def test_row_order_rewrite_in_chunks_and_threads_gives_the_same_bytes(tmp_path, monkeypatch):
    """A window rewritten in row order a few rows at a time, gathered by spare threads (one
    window, three workers) or in this thread, gives the bytes of a one-chunk rewrite."""
    from packtool.pipeline import plan as plan_mod

    _corpus(tmp_path / "in")
    _pack(tmp_path / "in", tmp_path / "ref", workers=1)
    calls = []
    real = plan_mod._row_chunk

    def spy(plan, doc_starts, rows, tokens, targets):
        calls.append(rows.size)
        return real(plan, doc_starts, rows, tokens, targets)

    monkeypatch.setattr(plan_mod, "REWRITE_TOKENS", 3 * C)  # 3 rows per chunk
    monkeypatch.setattr(plan_mod, "_row_chunk", spy)
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        _pack(tmp_path / "in", out, workers=workers)
        assert _tree_bytes(out) == _tree_bytes(tmp_path / "ref")
    assert len(calls) > 10 and max(calls) == 3
