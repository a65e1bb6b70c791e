"""Windowed packing (``--window-docs``): windows of whole files or row groups, planned alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import read_rows, write_docs
from packtool.formats.manifest import MANIFEST_NAME, read_manifest
from packtool.cli import cli
from packtool.config import PackConfig
from packtool.errors import PackingError
from packtool.formats.reader import discover_inputs
from packtool.pipeline import run_pack
from packtool.windows import plan_windows

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


def test_windows_are_whole_files_or_row_groups_in_input_order(tmp_path):
    """Window assignment depends only on the sorted files and their footers."""
    _corpus(tmp_path / "in", files=(40, 7, 90, 0, 25), row_group=16)
    files = discover_inputs([tmp_path / "in"])
    ws = plan_windows(files, "input_ids", 50)
    assert [w.docs for w in ws] == [47, 48, 42, 25]  # f00+f01 | f02 rg0-2 | f02 rg3-5 + f03 | f04
    assert ws[0].parts[0].row_groups is None and ws[0].parts[1].row_groups is None
    assert ws[1].parts[0].row_groups == (0, 1, 2) and ws[1].parts[0].first_row == 0
    assert ws[2].parts[0].row_groups == (3, 4, 5) and ws[2].parts[0].first_row == 48
    first = np.cumsum([0] + [w.docs for w in ws])
    assert [w.first_doc for w in ws] == first[:-1].tolist()
    assert all(w.index == i for i, w in enumerate(ws))


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
    assert m == res.manifest and m["options"]["window_docs"] == 30
    ws = m["windows"]
    assert len(ws) > 3
    t = m["totals"]
    assert sum(w["rows"] for w in ws) == t["rows"] == sum(o["rows"] for o in m["outputs"])
    assert sum(w["docs"] for w in ws) == t["docs_in"]
    assert sum(w["real_tokens"] for w in ws) == t["real_tokens"]
    for w in ws:
        assert w["lower_bound_rows"] == -(-w["real_tokens"] // C)
        assert w["extra_rows"] == w["rows"] - w["lower_bound_rows"] >= 0
    assert t["extra_rows"] == t["rows"] - -(-t["real_tokens"] // C)
    assert [o["file"] for o in m["outputs"]] == [f for w in ws for f in w["outputs"]]
    assert m["outputs"][0]["file"] == "part-00000-00000.parquet"


def test_windowed_output_is_deterministic_for_any_worker_count(tmp_path):
    """Same bytes on a rerun and with 1 or 3 threads."""
    _corpus(tmp_path / "in")
    _pack(tmp_path / "in", tmp_path / "a", window_docs=30, workers=1)
    _pack(tmp_path / "in", tmp_path / "b", window_docs=30, workers=3)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n


def test_rows_are_shuffled_within_their_window_only(tmp_path):
    """The shuffle permutes a window's rows (seeded by seed and window index), never across."""
    _corpus(tmp_path / "in")
    _pack(tmp_path / "in", tmp_path / "s", window_docs=30, rows_per_shard=1000)
    _pack(tmp_path / "in", tmp_path / "n", window_docs=30, rows_per_shard=1000, shuffle=False)
    ms = read_manifest(tmp_path / "s")
    shuffled_any = False
    for w in ms["windows"]:
        import pyarrow.parquet as pq

        a = pq.read_table(tmp_path / "s" / w["outputs"][0]).column("doc_ids").to_pylist()
        b = pq.read_table(tmp_path / "n" / w["outputs"][0]).column("doc_ids").to_pylist()
        assert sorted(a) == sorted(b)
        assert all(w["first_doc"] <= d < w["first_doc"] + w["docs"] for r in a for d in r)
        shuffled_any |= a != b
    assert shuffled_any


def test_default_mode_is_one_global_plan(tmp_path):
    """Without --window-docs the output is the single global plan, as before windows existed."""
    _corpus(tmp_path / "in")
    _pack(tmp_path / "in", tmp_path / "g", shuffle=False)
    _pack(tmp_path / "in", tmp_path / "w", shuffle=False, window_docs=10**9)
    mg = read_manifest(tmp_path / "g")
    mw = read_manifest(tmp_path / "w")
    assert "windows" not in mg and "window_docs" not in mg["options"]
    assert [o["file"] for o in mg["outputs"]][:2] == ["part-00000.parquet", "part-00001.parquet"]
    assert len(mw["windows"]) == 1
    for og, ow in zip(mg["outputs"], mw["outputs"], strict=True):
        assert (tmp_path / "g" / og["file"]).read_bytes() == \
            (tmp_path / "w" / ow["file"]).read_bytes()
    assert mg["totals"] == mw["totals"]


def test_overflow_error_names_file_and_row_of_the_long_document(tmp_path):
    """--overflow error in a later window names the real file and row, not a window index."""
    docs = [[1] * 10] * 20 + [[2] * (C + 1)]
    write_docs(tmp_path / "in" / "a.parquet", docs, row_group_size=8)
    with pytest.raises(PackingError, match=r"a\.parquet: row 20: .*longer than --capacity"):
        _pack(tmp_path / "in", tmp_path / "out", window_docs=8, overflow="error")
    assert not (tmp_path / "out").exists()


def test_interrupted_windowed_pack_resumes_with_same_bytes(tmp_path):
    """A rerun after a crash reuses the complete windows and ends with the uninterrupted bytes."""
    from packtool.windows import pack_window, run_windowed

    _corpus(tmp_path / "in")
    ref = _pack(tmp_path / "in", tmp_path / "ref", window_docs=30)
    cfg = PackConfig(inputs=(str(tmp_path / "in"),), output=str(tmp_path / "out"), capacity=C,
                     workers=2, rows_per_shard=7, window_docs=30)

    def crash_after_two(c, windows, out):
        for w in windows[:2]:
            yield pack_window(c, w, out)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_windowed(cfg, progress=False, map_windows=crash_after_two)
    out = tmp_path / "out"
    assert not (out / MANIFEST_NAME).exists()
    done = {o["file"] for w in ref.manifest["windows"][:2] for o in ref.manifest["outputs"]
            if o["file"] in w["outputs"]}
    res = run_pack(cfg, progress=False)
    assert res.shards_reused == len(done) > 0
    assert res.manifest["outputs"] == ref.manifest["outputs"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in
                                                            (tmp_path / "ref").iterdir())
    for o in ref.manifest["outputs"]:
        assert (out / o["file"]).read_bytes() == (tmp_path / "ref" / o["file"]).read_bytes()


def test_cli_summary_reports_windows(tmp_path):
    """The summary names the window count and the extra rows they cost."""
    _corpus(tmp_path / "in")
    r = CliRunner().invoke(cli, ["pack", "-c", str(C), "--window-docs", "30",
                                 str(tmp_path / "in"), str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "windows 8 of ~30 documents: extra rows per window max" in r.output
    r = CliRunner().invoke(cli, ["pack", "--window-docs", "0", str(tmp_path / "in"),
                                 str(tmp_path / "o2")])
    assert r.exit_code == 2
