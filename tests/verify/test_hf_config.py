"""``packtool verify OUT --hf-config PATH``: the user's own architecture, shrunk, fed packtool's rows.

A Llama config passes; every hybrid architecture transformers builds on CPU gets the verdict
``docs/architectures.md`` states (:data:`CPU_VERDICTS`, checked against that page's table): on
CPU, transformers refuses ``seq_idx`` in the Mamba-2 / convolution layers of most of them (no
causal-conv1d kernel here) and a few ignore it; either way their documents leak, and verify names
the layer. Nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from packtool.cli import cli  # noqa: E402
from packtool.verify.checks import run_verify  # noqa: E402

from packed_helpers import pack_docs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[2]
#: the transformers release docs/architectures.md's table (and CPU_VERDICTS) was measured on, as
#: that page states it ("What transformers X.Y does on CPU") and test-constraints.txt pins it
PAGE_VERSION = re.search(r"What transformers (\d+\.\d+) does on CPU",
                         (ROOT / "docs" / "architectures.md").read_text()).group(1)
#: transformers (5.x) on CPU: "pass" (documents kept apart with packtool's keywords), "refuses"
#: (transformers raises on seq_idx without the causal-conv1d kernels; without it documents leak),
#: "ignores" (seq_idx changes nothing; documents leak) or "positions" (documents leak fed
#: position_ids [B, C], and are kept apart fed them as [4, B, C]), and the layer class where the
#: leak starts. Config overrides make a model hybrid where its default config is not.
CPU_VERDICTS = {
    "llama": ("pass", None, {}),
    # partial rotary: shrinking kept rotary_dim 64 on heads of 16 (a shape error)
    "gptj": ("pass", None, {}),
    "codegen": ("pass", None, {}),
    # multimodal RoPE: Qwen3-VL reads position_ids [B, C] as its text positions too
    "qwen3_vl": ("pass", None, {}),
    # they take position_ids [B, C] for their three RoPE axes alone and build one causal mask
    # over the row; the text positions of [4, B, C] keep documents apart
    "qwen2_vl": ("positions", "Qwen2VLAttention", {}),
    "qwen2_5_vl": ("positions", "Qwen2_5_VLAttention", {}),
    "bamba": ("refuses", "BambaMixer", {}),
    "falcon_h1": ("refuses", "FalconH1Mixer", {}),
    "granitemoehybrid": ("refuses", "GraniteMoeHybridMambaLayer", {}),
    "kimi_linear": ("refuses", "KimiLinearDeltaAttention", {}),
    "lfm2": ("refuses", "Lfm2ShortConv", {"full_attn_idxs": [2], "num_hidden_layers": 4}),
    "nemotron_h": ("refuses", "NemotronHMamba2Mixer", {}),
    "nemotron_h_omni": ("refuses", "NemotronHMamba2Mixer", {}),
    "olmo_hybrid": ("refuses", "OlmoHybridGatedDeltaNet", {}),
    "qwen3_next": ("refuses", "Qwen3NextGatedDeltaNet", {}),
    "qwen3_5": ("refuses", "Qwen3_5GatedDeltaNet", {}),
    "qwen3_5_text": ("refuses", "Qwen3_5GatedDeltaNet", {}),
    "minicpmv4_6": ("refuses", "Qwen3_5GatedDeltaNet", {}),
    "minicpmv4_7": ("refuses", "Qwen3_5GatedDeltaNet", {}),
    "minicpm_ocr": ("refuses", "Qwen3_5GatedDeltaNet", {}),
    "qwen3_5_moe": ("refuses", "Qwen3_5MoeGatedDeltaNet", {}),
    "qwen3_5_moe_text": ("refuses", "Qwen3_5MoeGatedDeltaNet", {}),
    "lfm3": ("refuses", "Lfm3ShortConv", {}),
    "lfm3_vl": ("refuses", "Lfm3ShortConv", {}),
    "bailing_hybrid": ("refuses", "BailingHybridDeltaAttention", {}),
    "lara_mini": ("refuses", "LaraMiniGatedDeltaNet", {}),
    "zamba2": ("refuses", "Zamba2MambaMixer", {}),
    # its shared block is tied across hybrid layers: cut to one, it did not build
    "zamba": ("refuses", "ZambaMambaMixer", {}),
    # 5.24 ignored seq_idx in Mamba2Mixer; 5.25 hands it to the causal-conv1d kernels
    "mamba2": ("refuses", "Mamba2Mixer", {}),
    "jamba": ("ignores", "JambaMambaMixer", {}),
    "minimax": ("ignores", "MiniMaxLightningAttention", {}),
    "recurrent_gemma": ("ignores", "RecurrentGemmaRecurrentBlock", {}),
}


def _installed_minor() -> str:
    return ".".join(transformers.__version__.split(".")[:2])


def test_the_suite_installs_the_transformers_the_table_was_measured_on():
    """``make test`` pins transformers (test-constraints.txt) to the release the page's table
    states, so CI checks every verdict exactly; under ``make test`` it is the installed one."""
    pins = dict(ln.split("==", 1) for ln in
                (ROOT / "test-constraints.txt").read_text().splitlines()
                if "==" in ln and not ln.startswith("#"))
    assert ".".join(pins["transformers"].split(".")[:2]) == PAGE_VERSION, pins["transformers"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Two rows of several documents each (C = 32)."""
    docs = [[(7 * d + t) % 97_000 + 3 for t in range(n)]
            for d, n in enumerate([9, 5, 7, 3, 12, 4, 6, 10])]
    return pack_docs(tmp_path_factory.mktemp("hf"), docs, 32)


def _config_file(tmp_path: Path, model_type: str, **overrides) -> Path:
    cfg = transformers.AutoConfig.for_model(model_type, **overrides)
    path = tmp_path / f"{model_type}.json"
    cfg.to_json_file(str(path))
    return path


def test_llama_config_passes_every_check(packed, tmp_path):
    """A pure-attention config: position_ids keep documents apart; exit 0, hf checks only."""
    res = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config",
                                   str(_config_file(tmp_path, "llama")), "--json",
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    backends = {r["backend"] for r in rep["results"]}
    assert backends == {"data", "hf"}
    lm = next(r for r in rep["results"] if r["backend"] == "hf" and r["check"] == "isolation")
    assert lm["status"] == "pass" and lm["figures"]["rows_multi_doc"] >= 1


def test_hybrid_config_fails_naming_the_layer_and_what_it_needs(packed, tmp_path):
    """Bamba on CPU: exit 1, "documents leak in layer 0 (linear_attention, ...), in its
    BambaMixer: this model needs seq_idx with the causal_conv1d package's CUDA kernels"."""
    res = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config",
                                   str(_config_file(tmp_path, "bamba")), "--no-progress"])
    assert res.exit_code == 1, res.output
    line = res.output.strip().splitlines()[-1]
    assert re.search(r"documents leak in layer 0 \(linear_attention, \w+\), in its BambaMixer: "
                     r"this model needs seq_idx with the causal_conv1d", line), line
    assert "transformers refused seq_idx here" in line


def test_an_attention_that_reads_neither_positions_nor_boundaries_is_named_as_such(packed,
                                                                                  tmp_path):
    """OPT builds one causal mask over the row whatever it is given: the advice is not to pass
    position_ids or cu_seq_lens (verify fed both, as HFCollator does) but that this attention
    reads neither."""
    res = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config",
                                   str(_config_file(tmp_path, "opt")), "--no-progress"])
    assert res.exit_code == 1, res.output
    line = res.output.strip().splitlines()[-1]
    assert "documents leak in" in line and "this attention reads neither" in line, line
    assert "no attention check ran" not in res.output


@pytest.mark.parametrize("model_type", sorted(CPU_VERDICTS))
def test_cpu_verdict_of_each_architecture(packed, tmp_path, model_type):
    """Each architecture's verdict on CPU, as the table states (and as docs/architectures.md
    repeats it)."""
    verdict, culprit, overrides = CPU_VERDICTS[model_type]
    rep = run_verify(packed, rows=0, hf_config=_config_file(tmp_path, model_type, **overrides))
    iso = rep.get("hf", "isolation")
    extra = rep.get("hf", "logits_match").figures
    refused = extra.get("seq_idx", "").startswith("refused")
    if verdict == "pass":
        assert rep.ok and iso.status == "pass" and not refused, rep.format_text()
        return
    assert iso.status == "fail" and not rep.ok, rep.format_text()
    if _installed_minor() == PAGE_VERSION or verdict == "positions":
        assert refused == (verdict == "refuses"), rep.format_text()
    # another release may move a leaking model between refusing and ignoring seq_idx (Mamba-2
    # did in 5.25): the leak is still caught and the message still says which happened
    assert f"in its {culprit}: this model needs" in iso.message, iso.message
    assert ("transformers refused seq_idx" in iso.message) == refused
    if verdict == "positions":
        assert f"in its {culprit}: this model needs position_ids of shape [4, 2, 32]" in \
            iso.message and "kernel" not in iso.message, iso.message


@pytest.mark.parametrize("model_type, init", [("jamba", 0.002), ("lfm2", 0.005)])
def test_a_leak_is_caught_whatever_the_config_weight_scale(packed, tmp_path, model_type, init):
    """The test model took its random weights at the config's initializer_range, and a leak
    through a recurrence or a convolution shrinks with the third or fourth power of that scale:
    Jamba at 0.002 and LFM2 at 0.005 leaked 1e-7 to 1e-6 of their largest logit, under the
    checks' 1e-5, so verify passed them (exit 0) and their leak grew once training began. The
    shrunk config's weight scales are raised to the usual 0.02 at least."""
    from packtool.verify.hf_model import load_hf_config, shrink_config

    overrides = dict(CPU_VERDICTS[model_type][2], initializer_range=init)
    path = _config_file(tmp_path, model_type, **overrides)
    assert shrink_config(load_hf_config(path)).initializer_range == 0.02
    rep = run_verify(packed, rows=0, hf_config=path)
    iso = rep.get("hf", "isolation")
    assert iso.status == "fail" and not rep.ok, rep.format_text()
    assert f"in its {CPU_VERDICTS[model_type][1]}" in iso.message, iso.message


def test_the_docs_table_states_the_tested_verdicts():
    """docs/architectures.md lists every architecture of the test with the same verdict."""
    text = (ROOT / "docs" / "architectures.md").read_text()
    words = {"pass": "kept apart", "refuses": "refuses seq_idx", "ignores": "ignores seq_idx",
             "positions": "leaks fed position_ids [B, C]"}
    for model_type, (verdict, culprit, _) in CPU_VERDICTS.items():
        row = next((ln for ln in text.splitlines()
                    if ln.startswith("|") and f"`{model_type}`" in ln), None)
        assert row is not None, f"{model_type} missing from docs/architectures.md"
        assert words[verdict] in row, row
        if culprit:
            assert culprit in row, row


#: token-mixing layer classes of transformers other than softmax attention that no row of
#: CPU_VERDICTS names, and why
NOT_IN_THE_TABLE = {
    "MambaMixer": "pure recurrent model: listed on that page among the models that leak",
    "FalconMambaMixer": "pure recurrent model: listed on that page among the models that leak",
    "RwkvLinearAttention": "pure recurrent model: listed on that page among the models that leak",
    "InklingShortConvolution": "Inkling text models: listed among the models that leak",
    "Inkling2ShortConvolution": "Inkling text models: listed among the models that leak",
    "Inkling2DynamicShortConvolution": "Inkling text models: listed among the models that leak",
    "Inkling2LoopShortConvolution": "Inkling text models: listed among the models that leak",
    "Inkling2LoopDynamicShortConvolution": "Inkling text models: listed among the models that "
                                           "leak",
    "KimiLinearAttention": "kimi_linear's row (its leak starts in KimiLinearDeltaAttention)",
    "Lfm3VlVisionShortConv": "in a vision tower, not the language model",
    "Sam3LiteTextRepMixer": "in a text encoder, not a causal LM",
    "Lfm2MoeShortConv": "lfm2_moe's default config does not build shrunk in this transformers",
    "Qwen4ExpTextGatedDeltaNet": "qwen4_exp's default config does not build shrunk here",
    "Glm5NextTextLinearAttention": "glm5_next's default config does not shrink here",
}
_MIXER_CLASS = re.compile(r"^class (\w+(?:GatedDeltaNet|Mixer|MambaLayer|ShortConv|"
                          r"ShortConvolution|DeltaAttention|LightningAttention|RecurrentBlock|"
                          r"LinearAttention))\(", re.MULTILINE)


def test_the_table_covers_every_non_attention_layer_transformers_ships():
    """Every mixing layer class other than softmax attention in the installed transformers is
    the culprit of a row of CPU_VERDICTS (so of docs/architectures.md's table) or named in
    NOT_IN_THE_TABLE with the reason: the table had left out Qwen3.5, LFM3, Bailing hybrid and
    Lara mini."""
    models = Path(transformers.__file__).parent / "models"
    found = {m for f in models.glob("*/modeling_*.py") for m in _MIXER_CLASS.findall(
        f.read_text(encoding="utf-8", errors="replace"))}
    covered = {culprit for _, culprit, _ in CPU_VERDICTS.values() if culprit}
    missing = sorted(found - covered - set(NOT_IN_THE_TABLE))
    assert not missing, f"{missing}: measure them into CPU_VERDICTS and the page's table"


def test_a_model_name_is_read_from_the_cache_only(packed, tmp_path):
    """A name the transformers cache holds is used; one it does not hold is an input error
    saying packtool never downloads (run in a fresh process whose cache is tmp_path)."""
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4).to_json_file(
        str(snap / "config.json"))
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_CACHE": str(tmp_path / "hub"),
           "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "packtool", "verify", str(packed), "--rows", "1",
           "--no-progress", "--hf-config", "acme/tiny"]
    ok = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    missing = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", "acme/absent"])
    assert missing.exit_code == 1
    assert "acme/absent: not in the transformers cache (packtool never downloads" in \
        missing.output


def test_bad_hf_config_arguments(packed, tmp_path):
    """A missing file is an input error (exit 1); --hf-config without the hf backend, or with
    --data-only, is a usage error (exit 2)."""
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and "no such file or directory" in r.output
    cfg = str(_config_file(tmp_path, "llama"))
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", cfg, "--backend", "sdpa"])
    assert r.exit_code == 2 and "add --backend hf" in r.output
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", cfg, "--data-only"])
    assert r.exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "no_such_model"}')
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", str(bad)])
    assert r.exit_code == 1 and "is not one transformers" in r.output


@pytest.mark.parametrize("form", ["file", "directory", "object"])
def test_a_remote_code_config_is_refused(packed, tmp_path, form):
    """A config with auto_map (its model's code lives beside it) is refused in one line naming
    the config and the code, instead of testing transformers' own class of that model_type."""
    from packtool.errors import InputError
    from packtool.verify.hf_model import shrink_config

    cfg = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"],
           "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                        "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
           "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "pad_token_id": 0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if form == "object":
        obj = transformers.Phi3Config.from_json_file(str(tmp_path / "config.json"))
        with pytest.raises(InputError, match="needs remote code"):
            shrink_config(obj)
        return
    spec = tmp_path / "config.json" if form == "file" else tmp_path
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", str(spec),
                                 "--no-progress"])
    assert r.exit_code == 1, r.output
    line = r.output.strip().splitlines()[-1]
    assert str(tmp_path / "config.json") in line and "needs remote code" in line, line
    assert "modeling_phi3.Phi3ForCausalLM" in line, line


@pytest.mark.parametrize("model_type", ["llama4", "gemma3", "mistral3", "qwen3_5"])
def test_a_wrapper_config_shrinks_its_nested_text_config(model_type):
    """Wrappers keep the language model in text_config (and a vision tower beside it): both are
    shrunk, and what is built stays under the parameter budget."""
    from packtool.verify.hf_model import MAX_TEST_PARAMS, build_hf_model, shrink_config

    small = shrink_config(transformers.AutoConfig.for_model(model_type))
    text = small.get_text_config()
    assert text is not small
    assert text.hidden_size == 64 and text.vocab_size == 512, text
    assert text.num_hidden_layers <= 8
    for k in ("num_local_experts", "num_experts"):
        assert getattr(text, k, None) in (None, 4), (k, getattr(text, k))
    vision = getattr(small, "vision_config", None)
    if vision is not None and hasattr(vision, "hidden_size"):
        assert vision.hidden_size == 64 and vision.num_hidden_layers <= 2, vision
    model = build_hf_model(small, seed=0)
    assert sum(p.numel() for p in model.parameters()) <= MAX_TEST_PARAMS


def test_a_model_above_the_parameter_budget_is_refused(monkeypatch):
    """Sizes shrinking does not reach would build a large model: it is laid out without memory
    first and refused in one line naming the config and the largest parameter."""
    from packtool.errors import InputError
    from packtool.verify import hf_model

    monkeypatch.setattr(hf_model, "MAX_TEST_PARAMS", 10_000)
    cfg = hf_model.shrink_config(transformers.AutoConfig.for_model("llama"))
    with pytest.raises(InputError, match=r"the llama config shrunk to a test size would still "
                                         r"build 0M parameters \(at most 0M; the largest, "):
        hf_model.build_hf_model(cfg, seed=0)


def test_an_mla_config_shrinks_consistently_and_keeps_a_moe_layer(packed):
    """DeepSeek-V3 (MLA): the rope head_dim follows qk_rope_head_dim, one leading dense layer
    then a MoE layer; the model runs and keeps documents apart."""
    from packtool.verify.hf_model import build_hf_model, decoder_layers, shrink_config

    small = shrink_config(transformers.DeepseekV3Config())
    assert small.head_dim == small.qk_rope_head_dim
    assert small.qk_head_dim == small.qk_nope_head_dim + small.qk_rope_head_dim
    assert 0 < small.first_k_dense_replace < small.num_hidden_layers
    layers = decoder_layers(build_hf_model(small, seed=0))
    assert any("MoE" in type(layer.mlp).__name__ for layer in layers), layers
    rep = run_verify(packed, rows=0, hf_config=transformers.DeepseekV3Config())
    assert rep.ok, rep.format_text()


def test_a_config_transformers_cannot_build_is_one_line(packed, tmp_path):
    """DBRX's default config does not build in this transformers: exit 1 with one line naming
    the config and transformers' error, never an internal error."""
    path = tmp_path / "dbrx.json"
    transformers.DbrxConfig().to_json_file(str(path))
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", str(path),
                                 "--no-progress"])
    assert r.exit_code == 1, r.output
    line = r.output.strip().splitlines()[-1]
    assert "internal error" not in r.output
    assert re.match(r"Error: transformers cannot build a causal LM from the dbrx config", line)


@pytest.mark.parametrize("form", ["file", "dir"])
def test_a_config_its_class_validates_away_is_one_line(packed, tmp_path, form):
    """A config transformers' validators refuse (huggingface_hub's class validation error is a
    bare Exception) was an internal error: one line naming the file and the reason."""
    d = {"model_type": "llama", "hidden_size": 96, "num_attention_heads": 5}
    path = tmp_path / "odd.json" if form == "file" else tmp_path / "odd" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(d))
    given = path if form == "file" else path.parent
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", str(given),
                                 "--no-progress"])
    assert r.exit_code == 1 and "internal error" not in r.output, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1, r.output
    assert line.startswith(f"Error: {given}: ") and "The hidden size (96) is not a multiple " \
        "of the number of attention heads (5)" in line, line


def test_a_leaking_models_loss_difference_is_put_down_to_its_logits(packed, tmp_path):
    """OPT leaks across documents: loss_denominator fails too, and says the packed logits
    explain it (its labels and counts are right), not 'a label on another token?'."""
    rep = run_verify(packed, rows=0, hf_config=_config_file(tmp_path, "opt"))
    loss = rep.get("hf", "loss_denominator")
    assert rep.get("hf", "isolation").status == "fail"
    assert loss.status == "fail", rep.format_text()
    assert "follows from the packed logits" in loss.message, loss.message
    assert "a label on another token" not in loss.message


def test_a_config_that_fails_to_run_names_the_config(packed, tmp_path, monkeypatch):
    """A model that builds but raises on the packed rows fails the run check with a line naming
    the config, not a bare backend error."""
    from packtool.verify.runners import HFRunner

    def broken(self, *a, **k):
        raise RuntimeError("The size of tensor a (4) must match the size of tensor b (8)")

    monkeypatch.setattr(HFRunner, "_call", broken)
    rep = run_verify(packed, rows=0, hf_config=_config_file(tmp_path, "llama"))
    run = rep.get("hf", "run")
    assert run.status == "fail" and not rep.ok
    assert run.message.startswith("the llama model of --hf-config, shrunk to a test size, "
                                  "raised RuntimeError: The size of tensor a"), run.message


def _longrope_config(tmp_path: Path) -> Path:
    """A tiny Phi-3 with longrope: short factors 1, long factors 4, switching at 32 positions."""
    d = tmp_path / "phi3-longrope"
    d.mkdir()
    transformers.Phi3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
        original_max_position_embeddings=32, pad_token_id=0,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                         "long_factor": [4.0] * 8, "original_max_position_embeddings": 32},
    ).to_json_file(str(d / "config.json"))
    return d


def test_each_documents_reference_is_that_document_run_alone(tmp_path):
    """Phi-3 longrope takes the long factors for the whole batch once its largest position
    reaches 32: a 10-token document packed beside a 40-token one gets them, alone it does not.
    The references ran in right-padded batches (the 10-token documents beside the 40-token
    ones, positions up to 39), got the same wrong logits as the packed rows, and verify passed;
    each document runs alone now: logits_match fails (no leak: isolation passes) naming the
    switch and the capacity at which it passes, which it does."""
    cfg = _longrope_config(tmp_path)
    docs = [[(3 * t + k) % 120 + 5 for t in range(n)] for k in range(4) for n in (40, 10)]
    rep = run_verify(pack_docs(tmp_path, docs, 64), rows=0, hf_config=cfg)
    lm, iso = rep.get("hf", "logits_match"), rep.get("hf", "isolation")
    assert lm.status == "fail" and iso.status == "pass" and not rep.ok, rep.format_text()
    assert lm.figures["max_abs_diff"] > 1e-3, lm.figures
    assert "rope_type longrope" in lm.message and "pack with --capacity 32 or less" in \
        lm.message, lm.message
    r = CliRunner().invoke(cli, ["verify", str(pack_docs(tmp_path, docs, 64, name="cli")),
                                 "--hf-config", str(cfg), "--no-progress"])
    assert r.exit_code == 1 and "check logits_match failed on backend hf" in r.output, r.output
    short = [[(3 * t + k) % 120 + 5 for t in range(n)] for k in range(4) for n in (20, 10)]
    rep = run_verify(pack_docs(tmp_path, short, 32, name="c32"), rows=0, hf_config=cfg)
    assert rep.ok, rep.format_text()


#: real configs whose per-layer or per-rotary-frequency fields did not shrink (one line:
#: "could not shrink ... to a test size")
UNSHRINKABLE = {
    # attention_types [[kinds, repeats]] expands to one kind a layer
    "gpt_neo": lambda: transformers.GPTNeoConfig(num_layers=12,
                                                 attention_types=[[["global", "local"], 6]]),
    # Phi-3.5-mini: 48 longrope factors a list, one per rotary frequency of heads of 96
    "phi3_longrope": lambda: transformers.Phi3Config(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=131072,
        original_max_position_embeddings=4096, pad_token_id=32000,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                         "short_factor": [1.0 + i / 48 for i in range(48)],
                         "long_factor": [1.0 + i for i in range(48)],
                         "original_max_position_embeddings": 4096}),
    # activation_sparsity_pattern: one value a layer; KV shared by the last 15 layers
    "gemma3n_text": lambda: transformers.AutoConfig.for_model("gemma3n_text"),
    # per_layer_config: overrides keyed by layer index ("05", "11", ...)
    "gemma4_text": lambda: transformers.AutoConfig.for_model("gemma4_text"),
}


@pytest.mark.parametrize("name", sorted(UNSHRINKABLE))
def test_per_layer_and_per_frequency_fields_shrink_with_layers_and_heads(name):
    """Per-layer lists, patterns and overrides are cut with the layers, per-frequency RoPE
    factor lists with the head size: the shrunk config keeps its kinds of layers and builds."""
    from packtool.verify.hf_model import build_hf_model, decoder_layers, shrink_config

    small = shrink_config(UNSHRINKABLE[name]())
    n = small.num_hidden_layers
    if name == "gpt_neo":
        assert small.attention_layers == ["global", "local"] and n == 2, small
    elif name == "phi3_longrope":
        half = small.head_dim // 2 if getattr(small, "head_dim", None) else 8
        rp = small.rope_parameters
        assert len(rp["short_factor"]) == len(rp["long_factor"]) == half == 8, rp
        assert rp["short_factor"][0] == 1.0 and rp["long_factor"][-1] > rp["long_factor"][0]
    elif name == "gemma3n_text":
        assert len(small.activation_sparsity_pattern) == n, small
        assert set(small.layer_types) == {"sliding_attention", "full_attention"}
        assert small.num_kv_shared_layers == 1 and n <= 8, small
    else:
        assert all(int(k) < n for k in small.to_dict()["per_layer_config"]), small
        assert "full_attention" in small.layer_types and n <= 8, small
    assert len(decoder_layers(build_hf_model(small, seed=0))) == n


@pytest.mark.parametrize("name", ["gpt_neo", "phi3_longrope"])
def test_attention_configs_that_now_shrink_keep_documents_apart(packed, name):
    """GPT-Neo's local and global attention and Phi-3.5's longrope (C = 32, far below its
    4,096-position switch) keep packed documents apart: verify passes."""
    rep = run_verify(packed, rows=0, hf_config=UNSHRINKABLE[name]())
    assert rep.ok, rep.format_text()


@pytest.mark.parametrize("model_type,layer", [
    ("qwen2_5_vl", "Qwen2_5_VLDecoderLayer"), ("qwen3_vl", "Qwen3VLTextDecoderLayer"),
    ("cosmos3_edge", "Cosmos3EdgeTextDecoderLayer"), ("llama", "LlamaDecoderLayer"),
    ("bamba", "BambaDecoderLayer")])
def test_the_decoder_layers_are_the_language_models_never_a_vision_towers(model_type, layer):
    """The layers watched and reported are those the text goes through: Qwen2.5-VL's, Qwen3-VL's
    and Cosmos 3's vision towers hold as many ``blocks`` / ``layers`` as their shrunk language
    models, and theirs were taken (a leak in the attention was then put outside the layers);
    plain models keep theirs."""
    from packtool.verify.hf_model import build_hf_model, decoder_layers, shrink_config

    small = shrink_config(transformers.AutoConfig.for_model(model_type))
    layers = decoder_layers(build_hf_model(small, seed=0))
    assert {type(x).__name__ for x in layers} == {layer}, layers
    assert len(layers) == small.get_text_config().num_hidden_layers


def test_a_vision_language_models_report_names_its_language_layers(packed, tmp_path):
    """verify's model line lists Qwen3-VL's text decoder layers, not its vision blocks."""
    rep = run_verify(packed, rows=0, hf_config=_config_file(tmp_path, "qwen3_vl"))
    model = rep.get("hf", "logits_match").figures["model"]
    assert rep.ok and "Qwen3VLTextDecoderLayer" in model and "Vision" not in model, model


def test_a_leak_outside_the_layers_asks_for_no_kernel(packed, tmp_path, monkeypatch):
    """When no decoder layer's output moves, no layer is named, and neither is a kernel that
    resets a layer's state (the model may have no recurrent layer at all)."""
    from packtool.verify import hf_model

    monkeypatch.setattr(hf_model, "decoder_layers", lambda model: [])
    iso = run_verify(packed, rows=0, hf_config=_config_file(tmp_path, "opt")).get(
        "hf", "isolation")
    assert iso.status == "fail", iso.message
    assert iso.message.startswith("documents leak in the model (no decoder layer output "
                                  "moved"), iso.message
    assert "kernel" not in iso.message and "seq_idx" not in iso.message, iso.message
    assert "one document per row" in iso.message, iso.message


@pytest.mark.parametrize("config", [
    {}, {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                             "mrope_section": [16, 24, 24]}}}])
def test_a_qwen2_5_vl_leak_names_the_position_ids_form_it_reads(packed, tmp_path, config):
    """Qwen2.5-VL takes position_ids [B, C] for its three RoPE axes and builds one causal mask
    over the row: the leak is in its attention, and the fix named is position_ids [4, B, C]
    (the text positions first), which keep the documents apart; it was put outside the layers,
    with a kernel to reset a state it does not have. Its config stated mrope_section, or left
    it to the class's default, which did not run shrunk ("split_sizes=[16, 24, 24]")."""
    path = tmp_path / "q25"
    transformers.Qwen2_5_VLConfig(**config).save_pretrained(str(path))
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", str(path),
                                 "--no-progress"])
    assert r.exit_code == 1, r.output
    assert "transformers cannot run this config" not in r.output, r.output
    assert "Vision" not in r.output, r.output
    line = r.output.strip().splitlines()[-1]
    assert re.search(r"documents leak in layer 0 \(full_attention, Qwen2_5_VLDecoderLayer\), in "
                     r"its Qwen2_5_VLAttention: this model needs position_ids of shape "
                     r"\[4, 2, 32\] \(.*\): verify gave it, as HFCollator\(\) does, position_ids "
                     r"of shape \[2, 32\]", line), line
    assert "position_ids.expand(4, *position_ids.shape)" in line, line
    assert "kernel" not in line and "outside the layers" not in line, line


def test_mrope_sections_follow_the_head_size():
    """Multimodal RoPE sections sum to half the rotary head, which Cosmos 3's config checks:
    [24, 20, 20] on heads of 128 become sections summing to 8 on heads of 16 (it did not
    shrink)."""
    from packtool.verify.hf_model import build_hf_model, shrink_config

    small = shrink_config(transformers.AutoConfig.for_model("cosmos3_edge"))
    text = small.get_text_config()
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    sections = text.rope_parameters["mrope_section"]
    assert sections == [3, 3, 2] and sum(sections) == head // 2, text.rope_parameters
    build_hf_model(small, seed=0)


@pytest.mark.parametrize("model_type,default", [
    ("qwen2_vl", [16, 24, 24]), ("qwen2_5_vl", [16, 24, 24]), ("qwen3_vl", [24, 20, 20]),
    ("qwen3_5", [11, 11, 10])])
def test_a_class_default_mrope_section_follows_the_head_size(model_type, default):
    """A config that leaves mrope_section out gets its rotary embedding's built-in default
    (Qwen2.5-VL: [16, 24, 24], halves of heads of 128), which was left at that size on heads of
    16 ("split_sizes=[16, 24, 24] ... sum exactly to 8"): it is written into the shrunk config,
    scaled as a stated one, and the model runs."""
    from packtool.verify.hf_model import build_hf_model, shrink_config

    cfg = transformers.AutoConfig.for_model(model_type)
    assert "mrope_section" not in cfg.get_text_config().rope_parameters
    small = shrink_config(cfg)
    text = small.get_text_config()
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rotary = int(head * text.rope_parameters.get("partial_rotary_factor", 1.0))
    sections = text.rope_parameters["mrope_section"]
    assert len(sections) == 3 and sum(sections) == rotary // 2, text.rope_parameters
    assert all(abs(x - d * sum(sections) / sum(default)) < 1 for x, d in zip(sections, default))
    model = build_hf_model(small, seed=0)
    rotary_emb = next(m for m in model.modules() if hasattr(m, "mrope_section"))
    assert list(rotary_emb.mrope_section) == sections
    ids = torch.arange(12).reshape(1, 12)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids, use_cache=False).logits).all()


def test_a_config_that_still_cannot_shrink_names_the_fields():
    """When the config class refuses the shrunk config, the message names the fields: those
    transformers' message names (XLNet's d_head against d_model // n_head), else the fields
    packtool changed whose original value alone the class accepts."""
    from packtool.errors import InputError
    from packtool.verify.hf_model import shrink_config

    with pytest.raises(InputError) as err:
        shrink_config(transformers.XLNetConfig())
    msg = str(err.value)
    assert re.match(r"could not shrink the xlnet config to a test size: its class refuses "
                    r"[\w, ]*\bd_head\b[\w, ]* of the shrunk config \(", msg), msg

    class Picky(transformers.LlamaConfig):  # refuses a width of 64 without naming it
        @classmethod
        def from_dict(cls, d, **kwargs):
            if d.get("hidden_size") == 64:
                raise ValueError("these sizes do not go together")
            return super().from_dict(d, **kwargs)

    with pytest.raises(InputError) as err:
        shrink_config(Picky())
    assert "its class refuses hidden_size of the shrunk config (ValueError: these sizes do " \
        "not go together)" in str(err.value), err.value


@pytest.mark.parametrize("given", ["cfg/nonexist", "cfg/a/config.json", "./cfg/nonexist"])
def test_a_mistyped_local_path_is_no_such_directory_not_a_model_name(packed, tmp_path,
                                                                    monkeypatch, given):
    """A path under a local directory that does not exist (cfg/ is here, cfg/nonexist is not)
    was looked up as a model name ("not in the transformers cache ... hf download
    cfg/nonexist"): it is no such file or directory, naming the part missing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg").mkdir()
    r = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config", given, "--no-progress"])
    assert r.exit_code == 1, r.output
    line = r.output.strip().splitlines()[-1]
    missing = "nonexist" if "nonexist" in given else "a"
    assert f"{given}: no such file or directory (cfg/ has no {missing})" in line, line
    assert "hf download" not in line, line


def _long_docs() -> list:
    """Documents of 10 to 64 tokens, a 64-token one among them (C = 64: spans up to 64)."""
    return [[(5 * t + k) % 120 + 5 for t in range(n)] for k in range(3) for n in (64, 10, 40)]


@pytest.mark.parametrize("model_type,field", [("gpt2", "n_positions"), ("opt",
                                               "max_position_embeddings"),
                                              ("gptj", "n_positions"), ("ctrl", "n_positions")])
def test_a_position_table_shorter_than_the_longest_span_fails_in_one_line(tmp_path, model_type,
                                                                          field):
    """The config's position limit is tested as given: verify had raised it to C, so GPT-2
    with n_positions 32 passed an output of 64-token spans on which training raises
    IndexError. Learned (GPT-2, OPT), precomputed rotary (GPT-J) and sinusoidal (CTRL) tables
    alike now fail the run in one line naming the limit, the longest span and the fix; the
    config is left as it was, and at C = 32 the same config runs."""
    from packtool.verify.runners import HFRunner

    cfg = tmp_path / "cfg"
    transformers.AutoConfig.for_model(model_type, **{field: 32}).save_pretrained(cfg)
    out = pack_docs(tmp_path, _long_docs(), 64)
    r = CliRunner().invoke(cli, ["verify", str(out), "--hf-config", str(cfg), "--no-progress"])
    assert r.exit_code == 1 and "internal error" not in r.output, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("Error:"))
    assert f"has {field} = 32 positions" in line and "longest span is 64 tokens" in line, line
    assert "index error at position 32" in line and "pack with --capacity 32 or less" in line
    assert f"train a model with {field} >= 64" in line, line
    runner = HFRunner(0, 64, "cpu", transformers.AutoConfig.from_pretrained(cfg), longest=64)
    assert getattr(runner.config, field) == 32 and runner.position_fault, runner.config
    short = pack_docs(tmp_path, [d[:32] for d in _long_docs()], 32, name="c32")
    rep = run_verify(short, rows=0, hf_config=cfg)  # runs (OPT then leaks, as it does)
    assert rep.get("hf", "isolation").status in ("pass", "fail"), rep.format_text()
    assert "run" not in {r.check for r in rep.results if r.backend == "hf"}


def test_a_model_that_takes_short_sequences_fails_naming_the_row_length(tmp_path):
    """MPT builds its ALiBi bias for max_seq_len tokens whatever the positions: rows longer
    than that raised a bare size mismatch ("transformers cannot run this config here"); the
    run now fails naming the limit, the row length and the fix."""
    cfg = tmp_path / "mpt"
    transformers.AutoConfig.for_model("mpt", max_seq_len=32).save_pretrained(cfg)
    rep = run_verify(pack_docs(tmp_path, _long_docs(), 64), rows=0, hf_config=cfg)
    run = rep.get("hf", "run")
    assert run is not None and run.status == "fail" and not rep.ok, rep.format_text()
    assert "takes sequences of at most max_seq_len = 32 tokens" in run.message, run.message
    assert "rows are 64 tokens" in run.message and "--capacity 32 or less" in run.message
    assert "cannot run this config" not in run.message


def _dynamic_rope(tmp_path: Path) -> Path:
    d = tmp_path / "dynamic"
    transformers.AutoConfig.for_model(
        "llama", max_position_embeddings=32,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
    ).save_pretrained(d)
    return d


def test_dynamic_rope_past_its_limit_fails_as_a_place_effect(tmp_path):
    """Dynamic NTK scaling rescales the rotary frequencies of the whole batch once its largest
    position reaches max_position_embeddings: verify had raised that limit to C and passed,
    though a 10-token document beside a 64-token one gets other logits than alone. It now
    fails logits_match as the place effect it is (isolation passes), naming the scaling and
    the capacity at which it passes, which it does; on row windows that stay below the limit
    it fails all the same, from the output's longest span."""
    cfg = _dynamic_rope(tmp_path)
    out = pack_docs(tmp_path, _long_docs(), 64)
    rep = run_verify(out, rows=0, hf_config=cfg)
    lm, iso = rep.get("hf", "logits_match"), rep.get("hf", "isolation")
    assert lm.status == "fail" and iso.status == "pass" and not rep.ok, rep.format_text()
    assert lm.figures["max_abs_diff"] > 1e-4, lm.figures
    assert "rope_type dynamic" in lm.message and "no document reads another" in lm.message
    assert "pack with --capacity 32 or less" in lm.message, lm.message
    win = run_verify(out, rows=0, hf_config=cfg, row_window=16)
    lm = win.get("hf", "logits_match")
    assert lm.status == "fail" and not win.ok, win.format_text()
    assert "windows of 16 tokens" in lm.message and "longest span is 64" in lm.message
    assert "rope_type dynamic" in lm.message, lm.message
    short = pack_docs(tmp_path, [d[:32] for d in _long_docs()], 32, name="c32")
    assert run_verify(short, rows=0, hf_config=cfg).ok


def test_alibi_from_the_token_index_fails_on_row_windows_too(tmp_path):
    """Falcon with alibi=True builds its bias from a token's index in the sequence, rounded to
    bfloat16. With 8 heads (slopes 2^-1 .. 2^-8) it is exact below index 256: whole rows of 512
    fail logits_match (isolation passes), but row windows of 64 tokens, whose tokens all sit
    below index 64, passed. They now fail it too, from a document at the end of a whole row run
    against itself alone, naming the windows, the row and the index effect; at C = 256 both
    pass. Falcon's default 71 heads are kept (their slopes are not powers of two): it fails at
    C = 256 too, on windows as on whole rows."""
    cfg = tmp_path / "falcon8"
    transformers.AutoConfig.for_model("falcon", alibi=True, num_attention_heads=8,
                                      hidden_size=512).save_pretrained(cfg)
    docs = [[(11 * t + k) % 300 + 5 for t in range(n)] for k in range(6) for n in (200, 37, 120)]
    out = pack_docs(tmp_path, docs, 512)
    whole = run_verify(out, rows=0, hf_config=cfg, row_window=0)
    lm, iso = whole.get("hf", "logits_match"), whole.get("hf", "isolation")
    assert lm.status == "fail" and iso.status == "pass" and not whole.ok, whole.format_text()
    win = run_verify(out, rows=0, hf_config=cfg, row_window=64)
    lm, iso = win.get("hf", "logits_match"), win.get("hf", "isolation")
    assert lm.status == "fail" and iso.status == "pass" and not win.ok, win.format_text()
    assert "windows of 64 tokens" in lm.message and "row of 512 tokens" in lm.message
    assert "where a token sits in the row" in lm.message and "leak" not in lm.message
    assert lm.figures["far_tokens_max_abs_diff"] > 1e-4, lm.figures
    small = pack_docs(tmp_path, [d[:100] for d in docs], 256, name="c256")
    rep = run_verify(small, rows=0, hf_config=cfg, row_window=64)
    assert rep.ok, rep.format_text()
    assert rep.get("hf", "logits_match").figures["far_tokens_max_abs_diff"] < 1e-5
    seventy_one = tmp_path / "falcon"
    transformers.AutoConfig.for_model("falcon", alibi=True).save_pretrained(seventy_one)
    for window in (0, 64):
        rep = run_verify(small, rows=0, hf_config=seventy_one, row_window=window)
        lm, iso = rep.get("hf", "logits_match"), rep.get("hf", "isolation")
        assert lm.status == "fail" and iso.status == "pass", rep.format_text()
        assert lm.figures["max_abs_diff"] > 1e-3 and "where a token sits" in lm.message


def test_a_model_that_scales_its_input_embeddings_in_place_runs(packed, tmp_path):
    """CTRL scales its input embeddings in place (``inputs_embeds *= sqrt(d)``): verify handed
    it the leaf whose gradient it reads, autograd refused the in-place operation, and the run
    failed ("transformers cannot run this config here"). The model now gets a copy: it runs,
    the gradient still reaches the padding inputs (grad_zero_padding measured), and CTRL keeps
    packed documents apart."""
    rep = run_verify(packed, rows=0, hf_config=_config_file(tmp_path, "ctrl"))
    assert rep.get("hf", "run") is None, rep.format_text()
    assert rep.get("hf", "isolation").status == "pass", rep.format_text()
    pad = rep.get("hf", "grad_zero_padding")
    assert pad.status == "pass" and pad.figures["max_grad_padding_inputs"] == 0, pad
    assert rep.ok, rep.format_text()


def test_nan_from_the_pad_ids_embedding_is_named_with_the_pad_id_not_as_a_leak(packed,
                                                                               tmp_path):
    """Gemma 3n's pad_token_id 0 has an all-zero embedding, and the model alone on a run of
    them gives non-finite gradients; packtool's default --pad-id is 0. verify said "non-zero
    gradient at a padding input (a real token attends padding)". It now says NaN or inf,
    that the padding alone gives them too (the pad id's embedding, not packing), and to repack
    with another --pad-id; with --pad-id 5 both checks pass."""
    cfg = _config_file(tmp_path, "gemma3n_text")
    rep = run_verify(packed, rows=0, hf_config=cfg)
    pad, fin = rep.get("hf", "grad_zero_padding"), rep.get("hf", "finite")
    assert pad.status == "fail" and fin.status == "fail", rep.format_text()
    assert "a real token attends padding" not in pad.message, pad.message
    assert "NaN or inf" in pad.message and "says nothing of a leak" in pad.message
    assert "on a document run alone" not in fin.message, fin.message  # each alone is finite
    assert "that padding run alone" in fin.message and "gives NaN or inf too" in fin.message
    assert "repack with another --pad-id" in fin.message, fin.message
    assert rep.get("hf", "isolation").status == "pass", rep.format_text()
    docs = [[(7 * d + t) % 97_000 + 3 for t in range(n)]
            for d, n in enumerate([9, 5, 7, 3, 12, 4, 6, 10])]
    other = pack_docs(tmp_path, docs, 32, "--pad-id", "5", name="pad5")
    rep = run_verify(other, rows=0, hf_config=cfg)
    assert rep.get("hf", "grad_zero_padding").status == "pass", rep.format_text()
    assert rep.get("hf", "finite").status == "pass" and rep.ok, rep.format_text()


@pytest.mark.parametrize("reserved", [None, 0, 7, 511])
def test_folding_keeps_ids_below_the_vocabulary_and_skips_the_padding_token(reserved):
    from types import SimpleNamespace

    from packtool.verify.runners import Runner

    r = SimpleNamespace(vocab=512, reserved=reserved)
    ids = torch.arange(0, 512 * 5 + 3)
    got = Runner.fold(r, ids)
    assert got.shape == ids.shape and got.dtype == ids.dtype
    assert bool(((got >= 0) & (got < 512)).all())
    assert torch.equal(got[:512], ids[:512])  # the data's own ids below V are kept
    high = ids >= 512
    if reserved is not None:
        assert not bool((got[high] == reserved).any())
    assert bool(((got[high] == ids[high] % 512) | (ids[high] % 512 == (reserved or 0))).all())
    r.fold = lambda x: Runner.fold(r, x)
    changed = Runner.changed_ids(r, ids)
    assert bool((changed != got).all()) and bool(((changed >= 0) & (changed < 512)).all())
    if reserved is not None:
        assert not bool((changed == reserved).any())


def test_real_tokens_never_fold_onto_the_test_models_padding_token(tmp_path):
    """The shrunk model has 512 ids; real ids are folded into them. A real token of a large
    vocabulary (512 k here) used to land on Gemma 3n's pad_token_id 0, whose all-zero embedding
    gives the model alone NaN gradients, so a correct output packed with --pad-id 5 failed
    'finite' ("the model gives NaN or inf on a document run alone"). Folded ids now skip the
    model's padding token (an id below 512 stays as it is); the output passes."""
    from packtool.verify.hf_model import HF_CONFIG_VOCAB as V

    cfg = _config_file(tmp_path, "gemma3n_text")
    docs = [[V * (d + t + 1) if t % 3 == 0 else (7 * d + t) % 97_000 + 3 for t in range(n)]
            for d, n in enumerate([9, 5, 7, 3, 12, 4, 6, 10])]
    out = pack_docs(tmp_path, docs, 32, "--pad-id", "5", name="fold")
    rep = run_verify(out, rows=0, hf_config=cfg)
    assert rep.get("hf", "finite").status == "pass" and rep.ok, rep.format_text()


@pytest.mark.parametrize("model_type,fields", [
    ("xlstm", {"embedding_dim": 64}),
    ("inkling2_text", {"unpadded_vocab_size": 512, "swa_num_attention_heads": 4,
                       "swa_head_dim": 16, "swa_num_key_value_heads": 2})])
def test_widths_under_a_models_own_names_are_shrunk(model_type, fields):
    """xLSTM keeps its width as embedding_dim (4096 beside the shrunk 64: the model could not
    run), Inkling 2 its output layer's rows as unpadded_vocab_size (200,058: over the allowed
    parameters) and its sliding-window heads under swa_ names; each is shrunk, and the model
    builds within MAX_TEST_PARAMS."""
    from packtool.verify.hf_model import MAX_TEST_PARAMS, build_hf_model, shrink_config

    cfg = shrink_config(transformers.AutoConfig.for_model(model_type))
    assert {k: getattr(cfg, k) for k in fields} == fields
    model = build_hf_model(cfg, seed=0)
    assert sum(p.numel() for p in model.parameters()) <= MAX_TEST_PARAMS


#: the causal LMs docs/architectures.md says leak whatever they are given, by model_type: the
#: name the page gives them, and what verify --hf-config does with the default config ("leak":
#: names the layer where documents leak; "refused": its tokens read later ones, refused in one
#: line before any check, no leak verdict)
LEAK_WHATEVER_GIVEN = {
    "opt": ("OPT", "leak"), "bloom": ("BLOOM", "leak"), "mpt": ("MPT", "leak"),
    "gpt_oss": ("GPT-OSS", "leak"), "biogpt": ("BioGPT", "leak"), "xglm": ("XGLM", "leak"),
    "openai-gpt": ("OpenAI-GPT", "leak"), "afmoe": ("AFMoE", "leak"), "zaya": ("Zaya", "leak"),
    "inkling_text": ("`inkling_text` leaks", "leak"), "mamba": ("Mamba", "leak"),
    "falcon_mamba": ("FalconMamba", "leak"), "rwkv": ("RWKV", "leak"),
    "cpmant": ("CPM-Ant", "refused"), "deepseek_v4": ("DeepSeek-V4", "leak"),
    "xlstm": ("xLSTM", "leak"),
}


def _leak_paragraph() -> str:
    text = (ROOT / "docs" / "architectures.md").read_text()
    start = text.index("**Hugging Face models that leak whatever they are given.**")
    return " ".join(text[start:text.index("\n\n", start)].split())


@pytest.mark.parametrize("model_type", sorted(LEAK_WHATEVER_GIVEN))
def test_each_model_said_to_leak_whatever_it_is_given_gets_the_verdict_the_page_states(
        packed, tmp_path, model_type):
    """The page listed CPM-Ant, DeepSeek-V4 and xLSTM among the models verify "fails on every
    one of" as leaks, though verify cannot run their default configs (it never gives them a
    leak verdict), and left Zaya out, which leaks in its attention. Each listed model gets the
    verdict the page states: a named leak, or (CPM-Ant, whose tokens read later ones) a refusal
    before any check, which the page says of exactly those."""
    name, verdict = LEAK_WHATEVER_GIVEN[model_type]
    para = _leak_paragraph()
    assert name in para, f"{name} missing from the page's list of models that leak"
    refused = para[para.index("One it refuses"):para.index("Of the Inkling")]
    assert (name in refused) == (verdict == "refused"), refused
    if verdict == "refused":  # its tokens read later ones: refused before any check
        from packtool.errors import InputError

        with pytest.raises(InputError, match=f"the {model_type} config builds a model whose "
                                             "tokens read later ones"):
            run_verify(packed, rows=0, hf_config=_config_file(tmp_path, model_type))
        return
    rep = run_verify(packed, rows=0, hf_config=_config_file(tmp_path, model_type))
    assert not rep.ok, rep.format_text()
    run = rep.get("hf", "run")
    iso = rep.get("hf", "isolation")
    assert run is None and iso.status == "fail", rep.format_text()
    assert iso.message.startswith("documents leak in layer"), iso.message


#: configs whose key/value heads (each name transformers gives them) are more than the 4 query
#: heads of a shrunk model, or one for all (multi-query): built from real sizes
GROUPED_QUERY = {
    # Falcon-40B / 180B: 128 query heads, 8 key/value heads (num_kv_heads)
    "falcon_new_decoder": lambda: transformers.FalconConfig(
        new_decoder_architecture=True, hidden_size=8192, num_attention_heads=128, num_kv_heads=8,
        ffn_hidden_size=32768, num_hidden_layers=60, vocab_size=65024),
    "falcon_multi_query": lambda: transformers.FalconConfig(multi_query=True),
    "llama_gqa": lambda: transformers.LlamaConfig(hidden_size=8192, num_attention_heads=64,
                                                  num_key_value_heads=8),
    "llama_mqa": lambda: transformers.LlamaConfig(num_attention_heads=32, num_key_value_heads=1),
    "gpt_bigcode": lambda: transformers.GPTBigCodeConfig(n_embd=6144, n_head=48,
                                                         multi_query=True),
    # the key/value heads in a sub-config, the query heads in the config (kv_n_heads)
    "dbrx": lambda: transformers.DbrxConfig(d_model=6144, n_heads=48,
                                            attn_config={"kv_n_heads": 8}),
    "inkling2_text": lambda: transformers.AutoConfig.for_model(
        "inkling2_text", swa_num_attention_heads=64, swa_num_key_value_heads=8,
        num_attention_heads=64, num_key_value_heads=8),
    # one query-head count a layer, one key/value-head count for all
    "laguna": lambda: transformers.AutoConfig.for_model("laguna", num_attention_heads=64,
                                                        num_key_value_heads=8),
}
#: configs transformers cannot build here whatever their sizes (DBRX's attention reads a
#: rope_theta its attn_config lacks): their shrunk config is checked, not run
NOT_BUILT = {"dbrx"}


@pytest.mark.parametrize("name", sorted(GROUPED_QUERY))
def test_key_value_heads_stay_consistent_with_the_shrunk_query_heads(name):
    """Falcon-40B's num_kv_heads (8) was kept beside the 4 shrunk query heads: the model failed
    to run (a reshape to 8 key/value heads). Every key/value head count now follows its query
    heads (as many as them, one for all, or a group of them), and the model runs."""
    from packtool.verify.hf_model import _kv_pairs, build_hf_model, shrink_config

    small = shrink_config(GROUPED_QUERY[name]())
    d = small.to_dict()
    pairs = list(_kv_pairs(d))
    assert pairs or name == "gpt_bigcode", d
    for kv_name, kv, heads in pairs:
        assert 0 < kv <= heads and heads % kv == 0, (kv_name, kv, heads)
    if name == "falcon_new_decoder":
        assert (small.num_attention_heads, small.num_kv_heads) == (4, 2), d
    if name.endswith("mqa") or name == "falcon_multi_query":
        assert small.num_key_value_heads == 1, d
    if name == "dbrx":
        assert (small.n_heads, small.attn_config.kv_n_heads) == (4, 2), d
    if name in NOT_BUILT:
        return
    model = build_hf_model(small, seed=0)
    with torch.no_grad():
        logits = model(input_ids=torch.arange(12)[None] % 500 + 3, use_cache=False).logits
    assert logits.shape[:2] == (1, 12) and bool(torch.isfinite(logits).all())


def _config_fields(pattern: str) -> set:
    """The int (or int list) fields transformers' config classes declare whose names match."""
    names = set()
    for path in (Path(transformers.__file__).parent / "models").glob("*/configuration_*.py"):
        names.update(re.findall(rf"^\s+({pattern})\s*:\s*(?:int|list\[int\])", path.read_text(),
                                re.M))
    return names


def test_every_key_value_head_field_transformers_declares_is_paired_with_its_query_heads():
    """Each key/value head count any config class declares is one the shrink keeps consistent
    with its query heads (a new name would be left as it is, beside 4 query heads)."""
    from packtool.verify.hf_model import _KV_HEADS

    names = _config_fields(r"\w*(?:key_value|kv)\w*heads\w*|\w*heads?_kv\w*")
    assert {"num_key_value_heads", "num_kv_heads", "kv_n_heads"} <= names, names
    assert [n for n in sorted(names) if not _KV_HEADS.search(n)] == []


#: int fields with "intermediate" / "ffn" / "inner" in their names that are not a layer's size
NOT_FFN_SIZES = {"centroid_intermediate_top_k", "intermediate_multiple_size",
                 "intermediate_layers_indices", "intermediate_hook_ids",
                 "intermediate_hidden_state_indices", "intermediate_groups",
                 "intermediate_feature_dims", "inner_group_num", "ffn_round_up_to_multiple_of",
                 "ffn_multiplier", "ffn_kernel_size", "ffn_expansion", "aligner_ffn_mult"}


def test_every_feed_forward_size_transformers_declares_is_shrunk():
    """Falcon's ffn_hidden_size (18,176) was left whole: a "tiny" model of 4.7M parameters.
    Every intermediate / feed-forward size a config class declares, under any name, is one the
    shrink makes small (the fields of those words that are not sizes are listed)."""
    from packtool.verify.hf_model import _ffn_size

    names = _config_fields(r"\w*(?:intermediate|ffn|d_ff|inner|feed_forward|mlp_dim|mlp_hidden)\w*")
    assert {"intermediate_size", "ffn_hidden_size", "n_inner", "d_ff"} <= names, names
    assert [n for n in sorted(names) if (_ffn_size(n) is None) != (n in NOT_FFN_SIZES)] == []


@pytest.mark.parametrize("model_type,overrides", [
    ("falcon", {}), ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 8}),
    ("llama4_text", {}), ("gpt2", {"n_inner": 3072}), ("longcat_flash", {}),
    ("opt", {}), ("nemotron_h", {})])
def test_feed_forward_sizes_are_shrunk_under_every_name(model_type, overrides):
    """No weight of the shrunk model keeps a full-size feed-forward dimension: the largest
    tensor (a table of positions aside) is at most the 512-token embedding's rows by a few
    widths."""
    from packtool.verify.hf_model import build_hf_model, shrink_config

    small = shrink_config(transformers.AutoConfig.for_model(model_type, **overrides))
    model = build_hf_model(small, seed=0)
    biggest = max((p.numel(), n, tuple(p.shape)) for n, p in model.named_parameters()
                  if "position" not in n)
    assert biggest[0] <= 512 * 4 * 64, biggest
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


@pytest.mark.parametrize("model_type,overrides,field", [
    ("falcon", {"alibi": True}, "num_attention_heads"),
    ("falcon", {"alibi": True, "num_attention_heads": 32, "hidden_size": 2048,
                "new_decoder_architecture": True, "num_kv_heads": 8}, "num_attention_heads"),
    ("bloom", {"n_head": 112, "hidden_size": 14336}, "n_head"),
    ("mpt", {"n_heads": 32, "d_model": 4096}, "n_heads")])
def test_a_model_whose_alibi_slopes_follow_its_heads_keeps_them(model_type, overrides, field):
    """ALiBi's slopes are taken from the number of heads: Falcon shrunk from 71 alibi heads to
    4 got slopes 2^-2 .. 2^-8, exact in its bfloat16 bias below index 256, and passed configs
    that are inexact at any C. Falcon (alibi=True), BLOOM (always ALiBi) and MPT (its
    attn_config's alibi) keep their heads, of 4 or more dimensions each; key/value heads stay
    those of the config; without ALiBi they shrink to 4."""
    from packtool.verify.hf_model import build_hf_model, shrink_config

    cfg = transformers.AutoConfig.for_model(model_type, **overrides)
    small = shrink_config(cfg)
    heads = getattr(cfg, field)
    assert getattr(small, field) == heads and small.hidden_size == heads * max(4, 64 // heads)
    if overrides.get("num_kv_heads"):
        assert small.num_kv_heads == overrides["num_kv_heads"]
    model = build_hf_model(small, seed=0)
    with torch.no_grad():
        logits = model(input_ids=torch.arange(12)[None] + 3, use_cache=False).logits
    assert bool(torch.isfinite(logits).all())
    plain = {"falcon": {"alibi": False}, "bloom": None, "mpt": {"attn_config": {"alibi": False}}}
    if plain[model_type] is not None:
        off = shrink_config(transformers.AutoConfig.for_model(model_type, **{
            **overrides, **plain[model_type]}))
        assert getattr(off, field) == 4, off


def test_a_model_whose_tokens_read_later_ones_is_refused(packed, tmp_path):
    """A BERT config builds BertLMHeadModel without is_decoder: each token reads the later ones,
    so no packing keeps a document from the next, yet packed and alone agreed and verify passed
    every check (exit 0). verify now refuses it in one line, before any check."""
    res = CliRunner().invoke(cli, ["verify", str(packed), "--hf-config",
                                   str(_config_file(tmp_path, "bert")), "--no-progress"])
    assert res.exit_code != 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert "the bert config builds a model whose tokens read later ones" in line, line
    assert "causal LMs" in line, line
