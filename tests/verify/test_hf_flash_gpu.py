"""A Hugging Face model with attn_implementation="flash_attention_2" on a GPU, fed HFCollator()
batches of several rows: each document's logits equal the document alone. transformers reads
boundaries from position_ids for one row only, so the collator's cu_seq_lens keywords are what
keeps the rows' documents apart (the CPU twin of this test runs the same dispatch over exact
torch kernels: tests/loader/test_hf_trainer.py)."""

from __future__ import annotations

import pytest

from packtool.verify import has_cuda, has_flash_attn

from packed_helpers import pack_docs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not has_cuda(), reason="no CUDA GPU"),
              pytest.mark.skipif(not has_flash_attn(), reason="flash-attn not installed")]

DOCS = [[11, 12, 13, 14, 15], [21, 22, 23], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43],
        [1, 2, 3, 4, 5, 6], [30, 31, 32], [50, 51, 52, 53, 54], [60, 61]]


@pytest.mark.parametrize("flatten", [False, True])
def test_flash_attention_2_keeps_documents_apart_in_a_batch_of_rows(tmp_path, flatten):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from packtool.loader import HFCollator, PackedDataset

    out = pack_docs(tmp_path, DOCS, 12)
    ds = PackedDataset(out)
    items = [ds[i] for i in range(len(ds))]
    assert len(items) >= 3 and all(len(it["doc_ids"]) >= 2 for it in items[:2])
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, attn_implementation="flash_attention_2")
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()

    def worst(collator):
        batch = {k: v.cuda() if hasattr(v, "cuda") else v for k, v in collator(items).items()
                 if k not in ("labels", "seq_idx")}
        with torch.no_grad():
            got = model(**batch).logits.float().reshape(len(items), 12, -1)
            w = 0.0
            for r, it in enumerate(items):
                cu = it["cu_seqlens"].tolist()
                for a, e in zip(cu[:-1], cu[1:]):
                    if (it["labels"][a + 1:e] == -100).all():
                        continue  # the padding tail
                    ids = torch.as_tensor(it["input_ids"][a:e], device="cuda").long()[None]
                    alone = model(input_ids=ids, use_cache=False).logits.float()[0]
                    w = max(w, float((got[r, a:e] - alone).abs().max()))
        return w

    isolated = worst(HFCollator(flatten=flatten))
    if not flatten:  # the control: without the keywords flash attends across documents
        leaky = worst(HFCollator(flash_attn_kwargs=False))
        assert isolated < leaky / 4, (isolated, leaky)
    assert isolated < 5e-2, isolated
