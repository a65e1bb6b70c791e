"""The README's "Training with the output" runs as pasted: its shell lines (pack, one process,
torchrun with two ranks, the Hugging Face Trainer) and the scripts they name, whose text the
README (the Trainer script) and docs/training.md (the plain loop) show as they are."""

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
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]


def section_blocks():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    sec = text.split("## Training with the output", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", sec, flags=re.S)


def example_blocks(page: str) -> dict:
    """The python blocks of ``page`` that show an example file, by the file they name."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return {re.match(r"# (\S+\.py)", body).group(1): body
            for body in re.findall(r"```python\n(.*?)```", text, flags=re.S)
            if re.match(r"# examples/\S+\.py", body)}


def test_training_section_runs_as_pasted(tmp_path):
    blocks = section_blocks()
    shell = [body for lang, body in blocks if lang == "bash"]
    readme = [body for lang, body in blocks if lang == "python"]
    assert len(shell) == 1 and len(readme) == 1
    shown = example_blocks("docs/training.md")
    shown.update(example_blocks("README.md"))
    assert sorted(shown) == ["examples/train.py", "examples/train_hf.py"]
    scripts = list(shown.values())
    for body in scripts:  # each script block opens with "# examples/NAME.py: ..."
        name = re.match(r"# (\S+\.py)", body).group(1)
        assert (ROOT / name).read_text() == body, f"{name} differs from the README"
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(body)
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    bindir = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    ran = []
    for line in shell[0].splitlines():
        cmd = line.split("#", 1)[0].strip()
        if not cmd:
            continue
        argv = shlex.split(cmd)
        if argv[0] == "torchrun":
            argv.insert(1, "--standalone")  # a free port on a shared test machine
        res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=400)
        assert res.returncode == 0, (cmd, res.stderr[-3000:])
        ran.append((argv[0], res.stdout))
    assert [r[0] for r in ran] == ["packtool", "python", "torchrun", "python"]
    # the plain loop printed its two steps (twice under torchrun), the Trainer its summary
    assert ran[1][1].count("per target") == 2 and ran[2][1].count("per target") == 4
    assert "train_loss" in ran[3][1]


def test_the_plain_loop_takes_a_step_without_targets(tmp_path):
    """Rows of one-token documents hold no effective targets: the loop's step divides by at
    least 1 (loss 0, gradients 0) instead of 0/0, and its log line says 0 per target."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"input_ids": [[t] for t in range(1, 33)]}),
                   tmp_path / "in" / "a.parquet")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    subprocess.run([sys.executable, "-m", "packtool", "pack", "-q", "-c", "4",
                    str(tmp_path / "in"), str(tmp_path / "packed")], check=True, env=env)
    env["PACKED"] = str(tmp_path / "packed")
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("0.000 per target on this rank") == 2, res.stdout
