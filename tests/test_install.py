"""Install paths that work without packtool on a package index: the torch build chosen for the
machine (scripts/install_torch.sh, run by `make install`) and the hints in missing-dependency
errors."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from packtool.errors import TORCH_CPU_INDEX, install_hint

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install_torch.sh"


def _exe(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def run_script(tmp_path, *args, gpu: bool, local_wheel: bool, env=None):
    """Run install_torch.sh with a stand-in python that logs each pip call (and fails the
    offline ``--no-index`` one unless ``local_wheel``) and, with ``gpu``, an nvidia-smi that
    lists a GPU. Returns the logged pip argument lists."""
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no sh")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "pip.log"
    offline = "exit 0" if local_wheel else "exit 1"
    py = _exe(bin_ / "python", f'echo "$@" >> {log}\ncase "$*" in *--no-index*) {offline};; '
                               'esac\nexit 0\n')
    if gpu:
        _exe(bin_ / "nvidia-smi", 'echo "GPU 0: NVIDIA H200"\n')
    # PATH holds only the stand-ins, so a real nvidia-smi on the test machine is not seen
    e = {"PATH": str(bin_), **(env or {})}
    proc = subprocess.run([sh, str(SCRIPT), str(py), "2.13.0", *args], env=e,
                          capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_no_gpu_installs_the_cpu_build_from_the_cpu_index(tmp_path):
    proc, calls = run_script(tmp_path, gpu=False, local_wheel=False)
    assert proc.returncode == 0, proc.stderr
    assert "torch 2.13.0+cpu" in proc.stdout
    # the offline try first, then the "+cpu" pin with PyTorch's CPU index added
    assert "--no-index" in calls[0] and "torch==2.13.0+cpu" in calls[0]
    assert calls[-1].endswith(f"torch==2.13.0+cpu --extra-index-url {TORCH_CPU_INDEX}")


def test_no_gpu_prefers_a_local_cpu_wheel(tmp_path):
    proc, calls = run_script(tmp_path, gpu=False, local_wheel=True)
    assert proc.returncode == 0, proc.stderr
    assert "local torch 2.13.0+cpu wheel" in proc.stdout
    assert not any("download.pytorch.org" in c for c in calls)
    assert calls[-1].endswith("torch==2.13.0+cpu")  # its dependencies from the configured index


def test_gpu_takes_the_default_cuda_build(tmp_path):
    proc, calls = run_script(tmp_path, gpu=True, local_wheel=True)
    assert proc.returncode == 0, proc.stderr
    assert "NVIDIA GPU" in proc.stdout
    assert calls == [calls[-1]] and calls[-1].endswith("torch==2.13.0")


@pytest.mark.parametrize("build,expect", [("cpu", "torch==2.13.0+cpu"),
                                          ("cuda", "torch==2.13.0")])
def test_torch_build_overrides_the_detection(tmp_path, build, expect):
    proc, calls = run_script(tmp_path, build, gpu=build == "cpu", local_wheel=False)
    assert proc.returncode == 0, proc.stderr
    assert expect in calls[-1] and (build == "cpu") == ("+cpu" in calls[-1])


def test_torch_index_is_used_as_given(tmp_path):
    url = "https://download.pytorch.org/whl/cu128"
    proc, calls = run_script(tmp_path, "auto", url, gpu=False, local_wheel=False)
    assert proc.returncode == 0, proc.stderr
    assert calls == [f"-m pip install --progress-bar on torch==2.13.0 --extra-index-url {url}"]


def test_unknown_build_is_refused(tmp_path):
    proc, _ = run_script(tmp_path, "rocm", gpu=False, local_wheel=False)
    assert proc.returncode == 2 and "auto, cpu or cuda" in proc.stderr


def test_install_hints_name_requirements_not_an_index_package():
    """packtool is not on a package index: hints name the extra's own requirements."""
    for extra, pkg in (("ray", "ray"), ("plot", "matplotlib"), ("hf", "transformers"),
                       ("verify", "torch")):
        hint = install_hint(extra)
        assert hint.startswith(f"pip install '{pkg}") and "packtool[" not in hint, hint
    assert TORCH_CPU_INDEX in install_hint("verify")
    assert install_hint("no-such-extra") == \
        "pip install -e '.[no-such-extra]' in a packtool checkout"
