"""scripts/gpu_check.sh refuses to report success when a backend could not run.

The CUDA, flash-attn and causal-conv1d / mamba-ssm probes of the script are answered by a fake
interpreter (a shell wrapper around the real one): it claims a GPU and working kernels, or
kernels that cannot be installed, while everything else runs on this CPU machine. A script that
passed by skipping would print OK here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _fake_python(tmp_path: Path, *, cuda: bool, flash: bool, pip_ok: bool,
                 mamba: bool = True) -> Path:
    fake = tmp_path / "fake-python"
    fake.write_text(f"""#!/usr/bin/env bash
case "$*" in
  *"probe:cuda"*) exit {0 if cuda else 1};;
  *"probe:flash"*) exit {0 if flash else 1};;
  *"probe:mamba"*) exit {0 if mamba else 1};;
esac
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "fake pip: no network" >&2; exit {0 if pip_ok else 1}; fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    return fake


def _run(tmp_path, fake, **env_extra):
    from conftest import write_docs

    data = write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3], [4, 5], [6, 7, 8, 9]] * 3).parent
    (tmp_path / "work").mkdir(exist_ok=True)
    env = {**os.environ, "PY": str(fake), "ROWS": "2", "GPU_CHECK_OUT": str(tmp_path / "work"),
           "GPU_CHECK_DATA": str(data), "CAPACITY": "16", "GPU_CHECK_TESTS": "0",
           "GPU_CHECK_WHEELS": "", **env_extra}
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_gpu_check_fails_loudly_when_flash_attn_cannot_be_installed(tmp_path):
    """flash-attn neither importable nor installable: non-zero exit naming flash-attn, no OK."""
    r = _run(tmp_path, _fake_python(tmp_path, cuda=True, flash=False, pip_ok=False))
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "flash-attn could not be installed" in out
    assert "gpu_check: OK" not in out


def test_gpu_check_fails_when_backends_cannot_run_although_the_probe_says_cuda(tmp_path):
    """The probes claim CUDA and flash-attn, but no backend can run on this CPU machine: every
    backend is printed as FAIL, the exit is non-zero and nothing reads as success."""
    if subprocess.run([sys.executable, "-c", "import torch, sys; "
                       "sys.exit(torch.cuda.is_available())"]).returncode:
        pytest.skip("a real GPU is present: the faked probe would not be fake")
    r = _run(tmp_path, _fake_python(tmp_path, cuda=True, flash=True, pip_ok=True))
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    for layout in ("plain", "cp"):  # the sample data, then packed with --segment-multiple
        for b in ("sdpa", "flex", "varlen", "flash", "hybrid", "mamba"):
            line = next(ln for ln in r.stdout.splitlines()
                        if re.match(rf"gpu_check: {layout} +{b} ", ln))
            assert "FAIL" in line, line
    assert "gpu_check: FAIL" in r.stdout and "gpu_check: OK" not in r.stdout


def test_gpu_check_fails_loudly_without_mamba_kernels_or_their_wheels(tmp_path):
    """causal-conv1d / mamba-ssm missing: with no wheel directory the script stops naming the
    script that makes one (it never compiles CUDA code); with a directory that lacks them it
    stops naming the directory. Never OK."""
    fake = _fake_python(tmp_path, cuda=True, flash=True, pip_ok=False, mamba=False)
    r = _run(tmp_path, fake)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "gpu_check: OK" not in out
    assert "causal-conv1d and mamba-ssm are not installed" in out and "gpu_wheels.sh" in out
    empty = tmp_path / "wheels"
    empty.mkdir()
    r = _run(tmp_path, fake, GPU_CHECK_WHEELS=str(empty))
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "gpu_check: OK" not in out
    assert f"could not be installed from {empty}" in out
