"""Bounded memory at large C: budgets, SDPA in query blocks, batched and blocked references,
and the tile-level FlexAttention block mask."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from packtool.verify.masks import block_causal_mask, document_block_mask, document_mask_mod  # noqa: E402
from packtool.verify.model import build_model, make_attend, reference_attend  # noqa: E402
from packtool.verify.runners import (Runner, make_runner, memory_budget,  # noqa: E402
                                     parse_size)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _segments(C, lengths, B=2):
    seg = torch.zeros(B, C, dtype=torch.long)
    for b in range(B):
        a = 0
        for q, n in enumerate(lengths[b], start=1):
            seg[b, a:a + n] = q
            a += n
    return seg


def test_sdpa_in_query_blocks_equals_the_full_mask_forward_and_backward():
    """SDPA on blocks of queries with the mask rows (under checkpointing) gives the outputs and
    gradients of SDPA with the whole block_causal_mask."""
    g = torch.Generator().manual_seed(0)
    C = 70
    seg = _segments(C, [[20, 31, 9], [70]])
    q, k, v = (torch.randn(2, 3, C, 8, generator=g, requires_grad=True) for _ in range(3))
    full = make_attend("sdpa", {"segment_ids": seg})(q, k, v)
    gf = torch.autograd.grad(full.square().sum(), (q, k, v))
    blocked = make_attend("sdpa", {"segment_ids": seg}, query_block=16)(q, k, v)
    gb = torch.autograd.grad(blocked.square().sum(), (q, k, v))
    assert torch.allclose(full, blocked, atol=1e-6)
    for a, b in zip(gf, gb):
        assert torch.allclose(a, b, atol=1e-5)


def test_reference_attention_in_query_blocks_equals_one_block():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 50, 8, generator=g) for _ in range(3))
    assert torch.allclose(reference_attend(q, k, v), reference_attend(q, k, v, query_block=7),
                          atol=1e-6)


def test_batched_right_padded_references_equal_one_document_at_a_time():
    """Documents grouped into right-padded batches (and query blocks under a tiny budget) give
    the logits of each document run alone."""
    model = build_model(seed=0)
    r = Runner("sdpa", model, "cpu", torch.float32)
    g = torch.Generator().manual_seed(2)
    docs = [torch.randint(0, 1000, (n,), generator=g) for n in (5, 40, 1, 17, 40, 33)]
    with torch.no_grad():
        alone = [r.reference([d], 1 << 30)[0] for d in docs]
        grouped = r.reference(docs, 1 << 30)
        tiny = r.reference(docs, 1 << 20)  # forces query blocks and small groups
    for a, b, c in zip(alone, grouped, tiny):
        assert a.shape == b.shape == c.shape
        assert torch.allclose(a, b, atol=1e-5) and torch.allclose(a, c, atol=1e-5)


def test_runner_sizes_follow_the_budget():
    """Under a small budget SDPA switches to query blocks; a budget too small for one row skips
    the backend with the figures; eager FlexAttention is not chosen where it cannot fit."""
    model = build_model(seed=0)
    small = memory_budget(parse_size("80M"))
    r, why = make_runner("sdpa", model, device="cpu", capacity=2048, budget=small, seed=0,
                         compile=None)
    assert why == "" and r.query_block and r.query_block < 2048
    assert r.row_bytes(2048) <= small.bytes
    r, why = make_runner("sdpa", model, device="cpu", capacity=32768, budget=small, seed=0,
                         compile=None)
    assert r is None and "raise --max-memory" in why
    r, _ = make_runner("flex", model, device="cpu", capacity=8192,
                       budget=memory_budget(parse_size("1G")), seed=0, compile=None)
    assert r.compiled
    assert parse_size("4G") == 4 << 30 and parse_size("1.5GiB") == 3 << 29
    with pytest.raises(ValueError):
        parse_size("lots")


def test_tile_level_block_mask_covers_every_allowed_pair_and_matches_sdpa():
    """document_block_mask builds tiles from segment_ids without a C x C mask: every tile with an
    allowed pair is listed (as create_block_mask would list it) and FlexAttention with it equals
    SDPA with the dense mask, padding tail and C not a multiple of the tile included."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(3)
    for C, lengths in [(300, [[100, 130, 20], [300]]), (257, [[1, 128, 100], [129, 127]]),
                       (256, [[128, 128], [5, 5, 5]])]:
        seg = _segments(C, lengths)
        bm = document_block_mask(seg)
        ref = create_block_mask(document_mask_mod(seg), 2, None, C, C, device="cpu")
        assert bool(((ref.to_dense() > 0) <= (bm.to_dense() > 0)).all())
        q, k, v = (torch.randn(2, 2, C, 8, generator=g) for _ in range(3))
        out = flex_attention(q, k, v, block_mask=bm)
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=block_causal_mask(seg))
        assert torch.allclose(out, want, atol=1e-5)


class _LiveTensors:
    """The most bytes of tensor storage alive at once while it is entered (every storage an
    operation returns, counted until it is freed): what a forward and backward allocate."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.multiprocessing.reductions import StorageWeakRef

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for key in [k for k, (ref, _) in tracker.live.items() if ref.expired()]:
                    tracker.now -= tracker.live.pop(key)[1]
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        st = t.untyped_storage()
                        ref = StorageWeakRef(st)
                        if ref.cdata not in tracker.live:
                            tracker.live[ref.cdata] = (ref, st.nbytes())
                            tracker.now += st.nbytes()
                tracker.peak = max(tracker.peak, tracker.now)
                return out

        self.live, self.now, self.peak, self.mode = {}, 0, 0, Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


@pytest.mark.parametrize("model_type", ["gemma2", "llama"])
def test_hf_row_estimate_covers_the_attention_the_model_runs(model_type):
    """The hf backend's row estimate covers what one row allocates, measured as the tensor
    storage alive at once: forward + backward as the checks run it, forward alone as the
    far-token probe does. Gemma 2 builds eager attention, whose per-head [H, C, C] scores the
    estimate had left out: at C = 1024 the row allocated 114 MB against an estimate of 46 MB
    (one forward at C = 8192: 2.7 GB). SDPA (Llama) holds no such scores."""
    transformers = pytest.importorskip("transformers")
    import numpy as np

    from packtool.loader import collate
    from packtool.verify.equivalence import Measurements, measure_batch
    from packtool.verify.runners import HFRunner

    C = 1024
    r = HFRunner(0, C, "cpu", transformers.AutoConfig.for_model(model_type))
    assert r.model.config._attn_implementation == ("eager" if model_type == "gemma2" else "sdpa")
    ids = np.random.default_rng(0).integers(5, 300, C).astype(np.int32)
    seg = np.repeat([1, 2], [C // 2, C - C // 2]).astype(np.int32)
    batch = collate([{"input_ids": ids, "segment_ids": seg, "labels": ids.astype(np.int64),
                      "labels_convention": "shifted"}])
    refs = [[(torch.zeros(C // 2, r.vocab), 0.0, 0), (torch.zeros(C - C // 2, r.vocab), 0.0, 0)]]
    with _LiveTensors() as both:
        measure_batch(Measurements("hf", "cpu", "float32", True, ""), r, batch,
                      [[(0, C // 2), (C // 2, C)]], refs, True)
    with _LiveTensors() as fwd, torch.no_grad():
        r.forward(r.embed(batch["input_ids"]), batch)
    assert both.peak <= r.row_bytes(C) <= 3 * both.peak, (both.peak, r.row_bytes(C))
    assert fwd.peak <= r.row_bytes(C, backward=False) <= r.row_bytes(C), fwd.peak
    if model_type == "gemma2":  # forward + backward hold more than twice the forward's scores
        assert r.row_bytes(C, backward=False) <= 3 * fwd.peak, fwd.peak


@pytest.mark.parametrize("model_type, options, alibi", [
    ("bloom", {"n_layer": 2, "hidden_size": 64, "n_head": 4}, True),   # builds ALiBi always
    ("mpt", {"n_layers": 2, "d_model": 64, "n_heads": 4, "attn_config": {"alibi": True}}, True),
    ("falcon", {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                "alibi": True}, True),
    ("falcon", {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                "alibi": False}, False),
    ("llama", {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
               "intermediate_size": 128}, False),
])
def test_attention_estimate_knows_every_alibi_model(model_type, options, alibi):
    """The row estimate took ALiBi from a config's own ``alibi`` field only, so BLOOM (no such
    field: it always builds the bias) and MPT (the field inside ``attn_config``) were sized
    as models without the per-head bias."""
    transformers = pytest.importorskip("transformers")
    from packtool.verify.runners import attention_scores

    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=512, **options)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert attention_scores(model)[3] is alibi
