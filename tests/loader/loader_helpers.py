"""Helpers for the loader tests: pack small inputs through the CLI, read every row back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packtool.cli import cli


def write_input(directory: Path, docs, name: str = "a.parquet") -> Path:
    """One Parquet input file of ``docs`` (lists of token ids) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int64()))}),
                   directory / name)
    return directory


def pack(src: Path, out: Path, capacity: int, *extra: str) -> Path:
    """``packtool pack`` ``src`` into ``out`` (quiet), asserting success."""
    res = CliRunner().invoke(cli, ["pack", "--capacity", str(capacity), "-q", *extra,
                                   str(src), str(out)])
    assert res.exit_code == 0, res.output
    return out


def random_docs(n: int, max_len: int, seed: int = 0) -> list[list[int]]:
    """``n`` documents of 1..max_len tokens; token ids encode the document (doc * 1000 + pos),
    so a row's content tells which document it holds."""
    rng = np.random.default_rng(seed)
    return [[d * 1000 + p + 1 for p in range(int(k))]
            for d, k in enumerate(rng.integers(1, max_len + 1, n))]


@pytest.fixture(scope="session")
def many_groups(tmp_path_factory):
    """~150 rows at C = 16 in shards of 7 rows (one row group each, the last one shorter):
    enough row groups that ranks x workers split unevenly. Test modules import it."""
    d = tmp_path_factory.mktemp("many_groups")
    write_input(d / "in", random_docs(300, 12, seed=1))
    return pack(d / "in", d / "out", 16, "--rows-per-shard", "7", "--seed", "3")


@pytest.fixture(scope="session")
def rows_120(tmp_path_factory):
    """120 rows at C = 16 (one full-length document each) in shards of 7 rows (one row group
    each): a row count that 2, 3, 4, 5 and 6 ranks divide, so an epoch has no even-up repeats
    and "every row exactly once" is the whole claim."""
    d = tmp_path_factory.mktemp("rows_120")
    write_input(d / "in", [[r * 100 + p + 1 for p in range(16)] for r in range(120)])
    return pack(d / "in", d / "out", 16, "--rows-per-shard", "7", "--seed", "5")


@pytest.fixture(scope="session")
def web_and_code(tmp_path_factory):
    """Two outputs to mix at C = 16: ``web`` (the larger) and ``code`` (the smaller)."""
    d = tmp_path_factory.mktemp("mixture")
    web = pack(write_input(d / "web_in", random_docs(400, 12, seed=5)), d / "web", 16,
               "--rows-per-shard", "7", "--seed", "1")
    code = pack(write_input(d / "code_in", random_docs(30, 12, seed=6)), d / "code", 16,
                "--rows-per-shard", "5", "--seed", "2")
    return {"web": web, "code": code}


def stop_and_resume(make, stop_after: int, full: list | None = None
                    ) -> tuple[list, list, list, dict]:
    """(every batch of an uninterrupted run, the first ``stop_after`` batches of a second run,
    the batches of a third loader restarted from the second's ``state_dict()``, that state):
    ``make()`` builds a fresh ``StatefulDataLoader`` each time; ``full``, when given, is the
    uninterrupted run's batches already collected (not run again)."""
    full = list(make()) if full is None else full
    dl = make()
    it = iter(dl)
    head = [next(it) for _ in range(stop_after)]
    state = dl.state_dict()
    del it, dl
    again = make()
    again.load_state_dict(state)
    return full, head, list(again), state


def emulate_flash_attention_2(monkeypatch):
    """transformers' own flash_attention_2 dispatch (which of flash / varlen it calls, with which
    boundaries) over exact torch twins of the two flash-attn kernels, so it runs on CPU."""
    torch = pytest.importorskip("torch")
    fau = pytest.importorskip("transformers.modeling_flash_attention_utils")
    if not all(hasattr(fau, n) for n in ("_flash_fn", "_flash_varlen_fn",
                                         "_lazy_define_process_function")):
        pytest.skip("this transformers lays out its flash-attention dispatch differently")
    F = torch.nn.functional

    def one(q, k, v, scale):  # [T, H, D] -> causal attention over the T tokens
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], is_causal=True,
                                           scale=scale, enable_gqa=True)
        return o[0].transpose(0, 1)

    def flash(q, k, v, causal=True, softmax_scale=None, **_):  # [B, T, H, D]: rows alone
        return torch.stack([one(q[b], k[b], v[b], softmax_scale) for b in range(q.shape[0])])

    def varlen(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
               max_seqlen_k=None, causal=True, softmax_scale=None, **_):  # [N, H, D]
        assert torch.equal(cu_seqlens_q, cu_seqlens_k) and cu_seqlens_q.dtype == torch.int32
        cu = cu_seqlens_q.tolist()
        assert max_seqlen_q == max(b - a for a, b in zip(cu[:-1], cu[1:]))
        return torch.cat([one(q[a:b], k[a:b], v[a:b], softmax_scale)
                          for a, b in zip(cu[:-1], cu[1:])])

    monkeypatch.setattr(fau, "_loaded_implementation", "flash_attention_2", raising=False)
    monkeypatch.setattr(fau, "_flash_fn", flash)
    monkeypatch.setattr(fau, "_flash_varlen_fn", varlen)
    monkeypatch.setattr(fau, "_flash_with_kvcache_fn", None, raising=False)
    monkeypatch.setattr(fau, "_process_flash_kwargs_fn", fau._lazy_define_process_function(varlen),
                        raising=False)


def tiny_llama(vocab: int, seed: int = 0):
    """A 2-layer Llama of width 32 (4 heads, 2 key/value heads, 64 positions), seeded."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)
