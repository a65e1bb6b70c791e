"""scripts/bench_scale.py at a tiny size, so the billion-document benchmark cannot rot.

Every figure the script prints is recomputed here independently (``make_lengths`` +
``pack_lengths`` on the whole array), so a broken stream, window cut or extra-rows formula fails.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packtool.core.packing import pack_lengths

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(SCRIPTS))
    return mod


@pytest.fixture(scope="module")
def scale():
    return _load("bench_scale")


@pytest.fixture(scope="module")
def packer():
    return _load("bench_packer")


@pytest.mark.parametrize("dist", ["web", "code"])
def test_streamed_windows_are_bench_packer_documents(scale, packer, dist):
    """The windows stream exactly bench_packer's documents, so both scripts' figures agree."""
    n = 3 * scale.STREAM_BLOCK + 17  # crosses generator blocks and ends inside one
    got = np.concatenate(list(scale.iter_windows(dist, n, 30_001, 2048)))
    assert np.array_equal(got, packer.make_lengths(dist, n, 2048))
    assert [w.size for w in scale.iter_windows(dist, n, 100_000, 2048)] == [100_000, 96_625]


def test_plan_command_figures_match_an_independent_plan(tmp_path, scale, packer, capsys):
    """The plan table's rows and extra rows equal pack_lengths run here on the same lengths."""
    n, window, cap = 100_000, 30_000, 2048
    scale.main(["plan", "--docs", "1e5", "--windows", str(window), "--dists", "web",
                "--pilot-docs", "1e5", "--inline", "--out", str(tmp_path)])
    assert "| web | 1e+05 | 30,000 | 4 |" in capsys.readouterr().out
    res = {r["window"]: r for r in json.loads(
        (tmp_path / "bench_scale_plan.json").read_text())["results"]}
    assert set(res) == {"global", window}
    lengths = packer.make_lengths("web", n, cap)
    bound = -(-int(lengths.sum()) // cap)
    glob = pack_lengths(lengths, cap)
    plans = [pack_lengths(lengths[lo:lo + window], cap) for lo in range(0, n, window)]
    win_extra = [p.num_rows - -(-int(p.seg_len.sum()) // cap) for p in plans]
    g, w = res["global"], res[window]
    assert (g["rows"], g["extra_rows"], g["windows"]) == (glob.num_rows, glob.num_rows - bound, 1)
    assert w["windows"] == len(plans) == 4
    assert w["rows"] == sum(p.num_rows for p in plans)
    assert w["extra_rows"] == w["rows"] - bound
    assert (w["extra_in_windows"], w["extra_max_window"]) == (sum(win_extra), max(win_extra))
    for r in (g, w):
        assert r["tokens"] == int(lengths.sum()) and r["peak_rss"] > r["rss_growth"] >= 0
    assert "| web | 1e+05 | global |" in (tmp_path / "bench_scale_plan.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="needs GNU time (/usr/bin/time)")
def test_pack_command_reports_the_manifest_and_removes_its_data(tmp_path):
    """The end-to-end run reports the manifest's rows and cleans its scratch folder."""
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_scale.py"), "pack", "--tokens", "2e5",
         "--window-docs", "150", "--docs-per-file", "250", "--workers", "1", "--work", str(work),
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "bench_scale_pack.json").read_text())
    assert res["corpus"]["tokens"] >= 200_000
    assert res["summary"]["stats"]["tokens_in"] == res["corpus"]["tokens"]
    assert res["rows"] == -(-res["corpus"]["tokens"] // 2048) + res["extra_rows"]
    assert res["windows"] >= 2 and res["extra_max_window"] <= res["extra_in_windows"]
    assert res["pack_peak_rss"] > 0 and res["floor_s"] > 0
    assert res["ratio"] == pytest.approx(res["pack_s"] / res["floor_s"])
    assert not work.exists()
