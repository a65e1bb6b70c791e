"""examples/train_mixture.py runs as its header says (two outputs packed from sample_data/,
mixed 70 / 30) and logs a loss per source that adds up to the step's loss per target."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_mixture.py"


def test_the_mixture_example_logs_a_loss_per_source(tmp_path):
    header = [line[1:].strip() for line in EXAMPLE.read_text().splitlines()[1:4]]
    assert header[0].startswith("packtool pack") and header[2].startswith("python examples/")
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    outputs = []
    for cmd in header:
        argv = shlex.split(cmd)
        argv[0] = {"packtool": "packtool", "python": sys.executable}[argv[0]]
        res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, (cmd, res.stderr[-3000:])
        outputs.append(res.stdout)
    lines = outputs[-1].splitlines()
    shares = re.match(r"rows per epoch: \{'code': (\d+), 'mixed': (\d+)\}", lines[0])
    code, docs = int(shares[1]), int(shares[2])
    assert abs(code / (code + docs) - 0.7) < 1e-3  # the exact 70 % share
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert len(steps) == 3
    for ln in steps:
        m = re.match(r"step \d: ([\d.]+) per target; code ([\d.]+) \((\d+) targets\), "
                     r"mixed ([\d.]+|-) \((\d+) targets\)", ln)
        assert m, ln
        total, lc, nc, ld, nd = m.groups()
        docs_sum = float(ld) * int(nd) if ld != "-" else 0.0
        mean = (float(lc) * int(nc) + docs_sum) / (int(nc) + int(nd))
        assert abs(mean - float(total)) < 2e-4, ln  # the per-source losses add up
