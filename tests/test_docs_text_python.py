"""README's "From text, from Python, to NeMo" runs as pasted: its shell lines (tokenize a JSON Lines
file with a local tokenizer.json, pack with a held-out split, export for NeMo), its Python block
(pack_dataset, then the Trainer use it names, a few steps), and the Python block of
docs/python-and-text.md."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("datasets")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[1]


def blocks(text: str, start: str) -> list[tuple[str, str]]:
    sec = text.split(start, 1)[1].split("\n#", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", sec, flags=re.S)


def make_tokenizer(path: Path, texts: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(path))


def run_shell(body: str, cwd: Path) -> list[str]:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep
           + os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    ran = []
    for line in body.splitlines():
        cmd = line.split("  #", 1)[0].strip()
        if not cmd:
            continue
        argv = shlex.split(cmd)
        assert argv[0] == "packtool"
        res = subprocess.run([sys.executable, "-m", "packtool", *argv[1:]], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, (cmd, res.stderr[-2000:])
        ran.append(argv[1])
    return ran


def test_readme_text_and_python_section_runs_as_pasted(tmp_path, monkeypatch):
    sec = blocks((ROOT / "README.md").read_text(encoding="utf-8"),
                 "### From text, from Python, to NeMo")
    assert [lang for lang, _ in sec] == ["bash", "python"]
    texts = [f"document {i}: " + "some words of text, " * (i % 40 + 1) for i in range(400)]
    make_tokenizer(tmp_path / "tokenizer.json", texts)
    with open(tmp_path / "text.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    assert run_shell(sec[0][1], tmp_path) == ["tokenize", "pack", "export"]
    assert (tmp_path / "packed-holdout" / ".packtool-manifest.parquet").is_file()
    assert (tmp_path / "nemo" / "training_2048.idx.parquet").is_file()

    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(sec[1][1], "README.md", "exec"), scope)
    import datasets

    packed, collator = scope["packed"], scope["collator"]
    assert isinstance(packed, datasets.Dataset) and len(packed[0]["input_ids"]) == 256
    # the Trainer use the block names: a tiny model, two steps on the packed Dataset
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=131_072, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=2,
                                          per_device_train_batch_size=1, report_to=[],
                                          use_cpu=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=packed,
                                   data_collator=collator)
    out = trainer.train()
    assert out.global_step == 2 and out.training_loss > 0


def test_docs_page_python_block_runs(tmp_path, monkeypatch):
    sec = blocks((ROOT / "docs" / "python-and-text.md").read_text(encoding="utf-8"),
                 "## Python: `packtool.pack_dataset` and `packtool.pack`")
    code = sec[0][1]
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "python-and-text.md", "exec"), scope)
    train, held = scope["train"], scope["held"]
    a = {d for ids in train["doc_ids"] for d in ids}
    b = {d for ids in held["doc_ids"] for d in ids}
    assert a and b and not a & b
    result = scope["result"]
    assert result.stats.rows == result.manifest.totals.rows > 0
    assert (tmp_path / "out" / ".packtool-manifest.parquet").is_file()
