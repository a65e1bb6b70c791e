"""check_isolation and the IsolationCheck callback: before training, the user's own model fed the
collator's batch must give each packed document the logits of that document alone.

A Llama with sdpa keeps documents apart (float32 and bfloat16, rows and the flattened form); OPT
builds one causal mask over the row whatever it is given (shown leaking here first, outside the
check), and is refused naming the document and the layer; so are a wrapper that drops
position_ids, a collator whose positions do not restart, a position embedding that ignores
position_ids (no document reads another, the logits differ all the same), flash_attention_2 on
several rows without the cu_seq_lens keywords, a batch holding an attention_mask, Qwen2.5-VL
fed position_ids [B, C] (it reads [4, B, C]), and a hybrid model whose seq_idx transformers
refuses on CPU. Each module's train/eval mode comes back, also after a refusal.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from packtool.errors import VerifyError  # noqa: E402
from packtool.loader import HFCollator, PackedDataset, check_isolation  # noqa: E402

from loader_helpers import emulate_flash_attention_2, pack, write_input  # noqa: E402
import loader_helpers  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

VOCAB = 128
ROOT = Path(__file__).resolve().parents[2]


def tiny_llama(seed=0):
    return loader_helpers.tiny_llama(VOCAB, seed)


def tiny_opt(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 word_embed_proj_dim=32, max_position_embeddings=64)
    return transformers.OPTForCausalLM(cfg)


def tiny_gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def refused(model, collator=None) -> str:
    with pytest.raises(VerifyError) as exc:
        check_isolation(model, collator)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("check_isolation: "), msg
    return msg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("flatten", [False, True])
def test_a_llama_with_sdpa_keeps_packed_documents_apart(dtype, flatten):
    model = tiny_llama().to(dtype)
    got = check_isolation(model, HFCollator(flatten=flatten))
    assert (got.model, got.attn_implementation, got.dtype) == (
        "LlamaForCausalLM", "sdpa", str(dtype).removeprefix("torch."))
    assert got.documents == 6 and got.collator == f"HFCollator({'flatten=True' if flatten else ''})"
    assert got.max_abs_diff <= got.tolerance and got.max_change_other_docs == 0.0
    # float32: verify's CPU rule; bfloat16: 4 units of rounding at the largest logit (~0.4 here)
    assert got.tolerance == (1e-5 if dtype == torch.float32 else 4 * 2 ** -7)
    assert "documents kept apart: LlamaForCausalLM (attn_implementation sdpa" in str(got)


def _opt_leaks_with_the_collators_batch() -> float:
    """The largest |packed - alone| logit of a second document, the model fed HFCollator()'s
    batch as Trainer feeds it (computed here without check_isolation)."""
    model = tiny_opt().eval()
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, VOCAB, n).tolist() for n in (9, 7, 5)]
    ids = sum(docs, [])
    pos = sum([list(range(len(d))) for d in docs], [])
    lab = sum([[-100] + d[1:] for d in docs], [])
    item = {"input_ids": np.array(ids, np.int32), "position_ids": np.array(pos, np.int32),
            "labels": np.array(lab, np.int32)}
    batch = HFCollator()([item, item])
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        alone = model(input_ids=torch.tensor([docs[1]]), use_cache=False).logits[0]
    return float((packed[9:16] - alone).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_whose_mask_ignores_position_ids_is_refused_naming_the_document(dtype):
    """OPT (transformers 5.24) builds one causal mask over the row: its second document attends
    to the first. The refusal names the model, its attention implementation, the document that
    differs most and by how much, and the layer."""
    assert _opt_leaks_with_the_collators_batch() > 1e-2
    msg = refused(tiny_opt().to(dtype))
    name = str(dtype).removeprefix("torch.")
    assert msg.startswith(f"check_isolation: OPTForCausalLM (attn_implementation sdpa, {name} "
                          "on cpu), fed the batch HFCollator() builds, does not compute each "
                          "packed document as it computes it alone: row "), msg
    m = re.search(r"row (\d), document (\d) \(tokens (\d+)\.\.(\d+)\) differs from that "
                  r"document run alone by ([0-9.e-]+) \(tolerance ([0-9.e-]+)\)", msg)
    assert m and int(m.group(2)) >= 2 and float(m.group(5)) > float(m.group(6)), msg
    assert "documents leak in layer 0 (OPTDecoderLayer), in its OPTAttention" in msg
    assert "this attention reads neither" in msg and "one document per row" in msg
    if dtype == torch.float32:  # docs/training.md quotes it (its figures may round otherwise)
        assert re.fullmatch(_quoted("docs/training.md", "check_isolation: OPT"), msg), msg


def _quoted(page: str, start: str) -> str:
    """A regex of the message ``page`` quotes in a plain code block starting with ``start``:
    its lines joined, ``(...)`` for any text in parentheses, any figure for each decimal one."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    first = next(i for i in range(1, len(lines))
                 if lines[i - 1] == "```" and lines[i].startswith(start))
    block = lines[first:lines.index("```", first)]
    parts = re.split(r"(\(\.\.\.\)|\d+\.\d+(?:e-?\d+)?|\d+e-?\d+)", " ".join(block))
    return "".join(r"\(.*?\)" if p == "(...)" else r"[0-9.e-]+" if i % 2 else re.escape(p)
                   for i, p in enumerate(parts))


def test_a_wrapper_dropping_position_ids_is_caught():
    """A forward that drops position_ids (as a wrapper whose signature lacks them would): the
    model builds one causal mask over the row; without the wrapper the same model passes."""
    model = tiny_llama()
    check_isolation(model)
    forward = model.forward
    model.forward = lambda *a, position_ids=None, **kw: forward(*a, **kw)
    msg = refused(model)
    assert "documents leak in layer 0 (LlamaDecoderLayer), in its LlamaAttention" in msg


class _NoReset(HFCollator):
    """Positions 0..C-1 along each row, not restarting at each document."""

    def __call__(self, batch):
        out = super().__call__(batch)
        pos = out["position_ids"]
        out["position_ids"] = torch.arange(pos.shape[-1]).expand_as(pos).clone()
        return out


def test_positions_that_do_not_restart_are_caught_and_named():
    msg = refused(tiny_llama(), _NoReset())
    assert "fed the batch _NoReset() builds" in msg
    assert ("this model needs position_ids restarting at 0 at each document, which the batch of "
            "_NoReset() does not hold: train with data_collator=HFCollator()") in msg


def test_a_position_embedding_that_ignores_position_ids_is_caught_without_a_leak():
    """GPT-2's learned position embedding fed the token's index in the row instead of its
    position_ids: no document reads another (changing one moves no other), yet a later
    document gets other embeddings than alone. The plain model passes."""
    model = tiny_gpt2()
    check_isolation(model)
    wpe = model.transformer.wpe
    forward = wpe.forward
    wpe.forward = lambda pos: forward(torch.arange(pos.shape[-1]).expand_as(pos))
    msg = refused(model)
    assert "though changing document 1 moves no other document" in msg
    assert "depends on where a token sits in the row, not on its position_ids" in msg


def test_flash_attention_2_without_the_boundary_keywords_is_named(monkeypatch):
    """flash_attention_2 (transformers' own dispatch over exact torch twins of the kernels)
    reads the boundaries from position_ids for one row only: HFCollator() passes, and without
    its cu_seq_lens keywords the fix is named."""
    emulate_flash_attention_2(monkeypatch)
    model = tiny_llama()
    model.config._attn_implementation = "flash_attention_2"
    assert check_isolation(model).attn_implementation == "flash_attention_2"
    assert check_isolation(model, HFCollator(flatten=True, flash_attn_kwargs=False))
    msg = refused(model, HFCollator(flash_attn_kwargs=False))
    assert "attn_implementation flash_attention_2" in msg
    assert ("needs cu_seq_lens_q/cu_seq_lens_k and max_length_q/max_length_k in a batch of 2 "
            "rows (flash_attention_2 reads the boundaries from position_ids for one row only), "
            "which the batch of HFCollator(flash_attn_kwargs=False) does not hold: use "
            "HFCollator() or HFCollator(flatten=True)") in msg


def test_a_batch_without_use_cache_false_is_named():
    msg = refused(tiny_llama(), transformers.default_data_collator)
    assert "fed the batch default_data_collator builds" in msg
    assert "needs use_cache=False" in msg and "train with data_collator=HFCollator()" in msg


class _WithMask(HFCollator):
    """HFCollator's batch with an attention_mask added: all ones ([B, C], as a tokenizer's
    padding gives it), or ``four_d``: one causal mask over each row, [B, 1, C, C]."""

    def __init__(self, four_d=False):
        super().__init__()
        self.four_d = four_d

    def __call__(self, items):
        out = super().__call__(items)
        ids = out["input_ids"]
        out["attention_mask"] = torch.ones_like(ids) if not self.four_d else torch.tril(
            torch.ones(ids.shape[-1], ids.shape[-1], dtype=torch.bool)).expand(
            ids.shape[0], 1, -1, -1)
        return out

    def __repr__(self):
        return f"_WithMask({'four_d=True' if self.four_d else ''})"


def test_a_batch_holding_an_attention_mask_is_named():
    """An all-ones attention_mask turns off transformers' search for the documents in
    position_ids, so a Llama leaks: the refusal names the mask and its fix (drop it), never that
    this attention reads neither keyword nor that the model needs one document per row."""
    msg = refused(tiny_llama(), _WithMask())
    assert "documents leak in layer 0 (LlamaDecoderLayer), in its LlamaAttention" in msg, msg
    assert ("this model needs no attention_mask, which the batch of _WithMask() holds: given "
            "one, transformers builds the mask from it alone") in msg, msg
    assert "drop attention_mask from the batch: train with data_collator=HFCollator(), which " \
        "leaves it out" in msg, msg
    assert "reads neither" not in msg and "one document per row" not in msg, msg
    msg = refused(tiny_llama(), _WithMask(four_d=True))
    assert ("needs an attention_mask that keeps each document to itself: the batch of "
            "_WithMask(four_d=True) holds one of shape [2, 1, 48, 48]") in msg, msg


def _doc_collator(page: str, name: str):
    """The class ``name`` of the Python block of ``page`` that defines it, as printed there."""
    text = (ROOT / page).read_text(encoding="utf-8")
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
                if f"class {name}(" in b)
    scope = {"HFCollator": HFCollator}
    exec(code, scope)  # noqa: S102 - the page's own example
    return scope[name]


def test_qwen2_5_vl_is_told_the_position_ids_form_it_reads_and_passes_in_it():
    """Qwen2.5-VL reads position_ids [B, C] as its three RoPE axes and builds one causal mask
    over the row: the refusal names its attention (it said the leak was outside the layers,
    in its vision blocks, and asked for a kernel resetting a recurrent state) and position_ids
    [4, B, C]; the collator docs/architectures.md prints gives them, and the model passes."""
    from packtool.verify.hf_model import build_hf_model, shrink_config

    model = build_hf_model(shrink_config(transformers.Qwen2_5_VLConfig()), seed=0)
    msg = refused(model)
    assert ("documents leak in layer 0 (full_attention, Qwen2_5_VLDecoderLayer), in its "
            "Qwen2_5_VLAttention: this model needs position_ids of shape [4, 2, 48]") in msg, msg
    assert "the batch of HFCollator() gives it position_ids of shape [2, 48]" in msg, msg
    assert "kernel" not in msg and "Vision" not in msg, msg
    got = check_isolation(model, _doc_collator("docs/architectures.md", "QwenVLCollator")())
    assert got.max_change_other_docs == 0.0 and got.max_abs_diff <= got.tolerance, got


def test_a_hybrid_model_refusing_seq_idx_here_is_one_line():
    """Bamba's Mamba-2 layers take seq_idx only with the causal-conv1d kernels; on CPU
    transformers raises a ValueError, which training would hit at its first step."""
    from packtool.verify.hf_model import build_hf_model, shrink_config

    model = build_hf_model(shrink_config(transformers.AutoConfig.for_model("bamba")), seed=0)
    msg = refused(model)
    assert msg.startswith("check_isolation: BambaForCausalLM (attn_implementation sdpa, float32 "
                          "on cpu) refuses the seq_idx of the batch HFCollator() builds, as "
                          "training would at its first step: this model needs seq_idx with the "
                          "causal_conv1d package's CUDA kernels"), msg
    assert "install them and train on a GPU" in msg
    msg = refused(model, HFCollator(seq_idx=False))
    assert "in its BambaMixer: this model needs seq_idx, which the batch of " \
           "HFCollator(seq_idx=False) does not hold" in msg


def test_nan_or_inf_logits_are_said_as_such_never_as_a_leak():
    """A model that gives NaN on some token ids (here their embeddings) has no measure of a
    leak: the refusal says where the NaN comes from (that document run alone), never that
    documents leak or that a layer needs a kernel resetting its state."""
    model = tiny_llama()
    with torch.no_grad():
        model.model.embed_tokens.weight[5::7] = float("nan")
    msg = refused(model)
    assert "cannot be checked: the logits of " in msg and "hold NaN or inf, which says " \
           "nothing of a leak: the model gives NaN or inf on a document run alone (row " in msg, msg
    assert "shard" not in msg, msg  # the probe batch is built in memory: no shard to name
    assert "leak in" not in msg and "kernel" not in msg and "differs" not in msg, msg
    with torch.no_grad():  # finite again: the same model passes
        model.model.embed_tokens.weight[5::7] = 0.01
    assert check_isolation(model).max_change_other_docs == 0.0


@pytest.mark.parametrize("make", [tiny_llama, tiny_opt])
def test_the_modules_modes_come_back(make):
    """Train mode with one layer left in eval mode (a frozen part): each module's mode is as it
    was after the check, passed or refused; the forwards ran in eval mode."""
    model = make()
    model.train()
    frozen = next(m for m in model.modules() if m.__class__.__name__.endswith("DecoderLayer"))
    frozen.eval()
    before = [m.training for m in model.modules()]
    seen = []
    model.register_forward_pre_hook(lambda mod, args: seen.append(mod.training))
    try:
        check_isolation(model)
    except VerifyError:
        assert make is tiny_opt
    assert [m.training for m in model.modules()] == before
    assert seen and not any(seen)


def test_the_check_needs_neither_torch_nor_transformers_to_import():
    code = ("import sys; from packtool.loader import check_isolation, HFCollator; "
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert res.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("iso")
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, VOCAB, int(n)).tolist() for n in rng.integers(3, 20, 30)]
    return pack(write_input(d / "in", docs), d / "out", 32)


def test_the_trainer_callback_checks_the_trainers_model_and_collator(packed, tmp_path):
    """Trainer(..., callbacks=[IsolationCheck()]): a Llama trains after the check passed on the
    collator the train DataLoader calls (behind Trainer's column removal); OPT stops
    trainer.train() with the VerifyError before any step changed a weight."""
    pytest.importorskip("accelerate")
    from packtool.loader import IsolationCheck

    def trainer(model, check):
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=1,
                                              per_device_train_batch_size=2, report_to=[],
                                              use_cpu=True)
        return transformers.Trainer(model=model, args=args, train_dataset=PackedDataset(packed),
                                    data_collator=HFCollator(), callbacks=[check])

    check = IsolationCheck()
    assert trainer(tiny_llama(), check).train().global_step == 1
    assert check.result.collator == "HFCollator()" and check.result.documents == 6
    model = tiny_opt()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(VerifyError, match=r"OPTForCausalLM .* in its OPTAttention"):
        trainer(model, IsolationCheck()).train()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert model.training
