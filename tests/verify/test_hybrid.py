"""The hybrid check: a short causal convolution and a gated linear recurrence reset by seq_idx.

The reference block equals its slow twins (the token-by-token recurrence, a convolution summed
term by term); ``verify --backend hybrid`` passes on good output, fails when the collate withholds
``seq_idx`` (what a hybrid model trained on packed rows without it computes), and fails on each
broken-output control the attention backends fail on.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from packcheck import no_padding_block, withhold_seq_idx  # noqa: E402
from packtool.verify.checks import run_verify  # noqa: E402
from packtool.verify.hybrid import (causal_conv_reference, ssd_recurrence,  # noqa: E402
                                    ssd_reference)

from packed_helpers import edit_rows, pack_docs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RNG = np.random.default_rng(5)
DOCS = [list(map(int, RNG.integers(0, 131_000, n))) for n in [9, 5, 7, 3, 12, 4, 6, 2, 40, 8, 1]]
C = 16


def _failed(report, backend, check):
    return [r for r in report.results
            if r.backend == backend and r.check == check and r.status == "fail"]


def _docs_of(lengths):
    return torch.tensor(np.repeat(np.arange(len(lengths)), lengths), dtype=torch.int32)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=5),
       chunk=st.sampled_from([1, 5, 16, 64]), seed=st.integers(0, 2**16))
def test_chunked_recurrence_equals_the_token_by_token_recurrence(lengths, chunk, seed):
    """ssd_reference (chunked) == ssd_recurrence (one token at a time), documents anywhere."""
    g = torch.Generator().manual_seed(seed)
    T, H, P, N = sum(lengths), 2, 3, 4
    x = torch.randn(2, T, H, P, generator=g, dtype=torch.float64)
    dt = torch.rand(2, T, H, generator=g, dtype=torch.float64) * 0.5 + 0.01
    A = -torch.rand(H, generator=g, dtype=torch.float64) * 3 - 0.1
    B, Cm = (torch.randn(2, T, N, generator=g, dtype=torch.float64) for _ in range(2))
    D = torch.randn(H, generator=g, dtype=torch.float64)
    seq = _docs_of(lengths).expand(2, T)
    for s in (seq, None):
        got = ssd_reference(x, dt, A, B, Cm, D, s, chunk=chunk)
        want = ssd_recurrence(x, dt, A, B, Cm, D, s)
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_a_strongly_decaying_document_before_a_chunk_boundary_stays_finite():
    """A document whose summed decay is large (dt * A of -8 a token over 40 tokens) followed in
    the same chunk by another that goes on into the next chunk: the chunked form stays finite
    in float32 and equals the token-by-token recurrence (the earlier document's sums are no
    decay of the last one's: an exp of their difference overflowed to inf, times 0: NaN)."""
    g = torch.Generator().manual_seed(3)
    T, H, P, N = 128, 2, 4, 3
    x = torch.randn(1, T, H, P, generator=g)
    dt = torch.full((1, T, H), 2.0)
    A = torch.full((H,), -4.0)
    B, Cm = (torch.randn(1, T, N, generator=g) for _ in range(2))
    D = torch.ones(H)
    seq = _docs_of([40, 88])[None]
    got = ssd_reference(x, dt, A, B, Cm, D, seq, chunk=64)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, ssd_recurrence(x, dt, A, B, Cm, D, seq), rtol=1e-4, atol=1e-4)


def test_each_document_of_a_packed_row_computes_what_it_computes_alone():
    """Convolution and recurrence on a packed row with seq_idx == each document run alone, and
    without seq_idx document 2 is changed by document 1 (the leak the check must see)."""
    g = torch.Generator().manual_seed(0)
    lengths = [7, 11, 5]
    T, H, P, N, D_ = sum(lengths), 2, 4, 3, 8
    seq = _docs_of(lengths)[None]
    x = torch.randn(1, T, D_, generator=g)
    w, b = torch.randn(D_, 4, generator=g), torch.randn(D_, generator=g)
    xs = torch.randn(1, T, H, P, generator=g)
    dt = torch.rand(1, T, H, generator=g) * 0.3 + 0.05
    A, Bm, Cm, D = -torch.rand(H, generator=g) - 0.5, *(torch.randn(1, T, N, generator=g)
                                                         for _ in range(2)), torch.ones(H)
    conv, ssd = causal_conv_reference(x, w, b, seq), ssd_reference(xs, dt, A, Bm, Cm, D, seq)
    a = 0
    for n in lengths:
        sl = slice(a, a + n)
        assert torch.allclose(conv[:, sl], causal_conv_reference(x[:, sl], w, b), atol=1e-6)
        assert torch.allclose(ssd[:, sl], ssd_reference(xs[:, sl], dt[:, sl], A, Bm[:, sl],
                                                        Cm[:, sl], D), atol=1e-6)
        a += n
    # the same convolution as a plain causal conv1d over one document
    ref = torch.nn.functional.conv1d(x[:, :7].transpose(1, 2), w[:, None], b, padding=3,
                                     groups=D_)[..., :7]
    assert torch.allclose(conv[:, :7], ref.transpose(1, 2), atol=1e-6)
    leak_conv = causal_conv_reference(x, w, b, None)[:, 7:18]
    leak_ssd = ssd_reference(xs, dt, A, Bm, Cm, D, None)[:, 7:18]
    assert (leak_conv - conv[:, 7:18]).abs().max() > 1e-3
    assert (leak_ssd - ssd[:, 7:18]).abs().max() > 1e-3


@pytest.fixture
def good(tmp_path):
    return pack_docs(tmp_path, DOCS, C)


def test_hybrid_check_passes_on_good_output_forward_and_backward(tmp_path):
    """Logits, isolation, loss denominator and exact zero gradients at ignored positions and at
    padding, through the convolution, the recurrence and attention. Two more short documents
    put padding in a row of several documents (the rows run through the model): without them
    no row run had padding, and grad_zero_padding had nothing to check."""
    good = pack_docs(tmp_path, DOCS + [[7] * 3, [8] * 4], C)
    rep = run_verify(good, rows=0, backends=["hybrid"])
    assert rep.ok, rep.format_text()
    for check in ("logits_match", "isolation", "loss_denominator", "grad_zero_ignored",
                  "grad_zero_padding", "finite"):
        assert rep.get("hybrid", check).status == "pass", rep.format_text()
    assert rep.get("hybrid", "logits_match").figures["mixers"] == "torch"


def test_hybrid_check_fails_when_the_collate_withholds_seq_idx(good, monkeypatch):
    """Negative control: batches without seq_idx (a training loop that does not pass it) run
    the mixers as one sequence per row; document 1 leaks into the next: isolation and
    logits_match fail, at segment 2 or later."""
    withhold_seq_idx(monkeypatch)
    rep = run_verify(good, rows=0, backends=["hybrid", "sdpa"])
    iso = _failed(rep, "hybrid", "isolation")
    assert iso and iso[0].where["segment"] >= 2, rep.format_text()
    assert _failed(rep, "hybrid", "logits_match") and not rep.ok
    assert rep.get("sdpa", "isolation").status == "pass"  # attention alone cannot see it


def test_hybrid_check_fails_on_a_plain_causal_mask_and_on_padding_rows_without_a_key(tmp_path):
    """B02/B29 and B22 controls through the hybrid model's attention layer."""
    out = pack_docs(tmp_path, [[5, 6, 7], [8, 9]], 6)
    F = torch.nn.functional
    plain = {"hybrid": lambda b, dev: (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True))}
    rep = run_verify(out, rows=0, backends=["hybrid"], attend_overrides=plain)
    assert _failed(rep, "hybrid", "isolation")[0].where["segment"] == 2

    rep = run_verify(out, rows=0, backends=["hybrid"],
                     attend_overrides={"hybrid": no_padding_block})
    assert rep.get("hybrid", "finite").status == "fail" and not rep.ok


def _row_with_two_docs(rows):
    return next(i for i, r in enumerate(rows) if len(r["doc_ids"]) >= 2)


def _positions_not_reset(rows):
    rows[_row_with_two_docs(rows)]["position_ids"] = list(range(C))
    return rows


def _boundary_moved(rows):
    rows[_row_with_two_docs(rows)]["cu_seqlens"][1] += 1
    return rows


def _segments_merged(rows):
    i = _row_with_two_docs(rows)
    rows[i]["segment_ids"] = [1 if s == 2 else s for s in rows[i]["segment_ids"]]
    return rows


@pytest.mark.parametrize("edit, check", [(_positions_not_reset, "logits_match"),
                                         (_boundary_moved, "logits_match"),
                                         (_segments_merged, "isolation")])
def test_hybrid_check_fails_on_each_broken_output(good, edit, check):
    """Positions not reset (B01), a boundary moved in cu_seqlens, two documents under one
    segment id: the hybrid backend fails as the attention backends do."""
    edit_rows(good, edit)
    rep = run_verify(good, rows=0, backends=["hybrid"])
    assert _failed(rep, "hybrid", check), rep.format_text()


def test_hybrid_check_fails_on_a_label_across_a_boundary(tmp_path):
    """B03: the first token of document 2 as a target of document 1."""
    good = pack_docs(tmp_path, DOCS, C, "--labels", "unshifted")

    def edit(rows):
        i = _row_with_two_docs(rows)
        j = rows[i]["cu_seqlens"][1]
        rows[i]["labels"][j] = rows[i]["input_ids"][j]
        rows[i]["num_targets"] += 1
        return rows

    edit_rows(good, edit)
    rep = run_verify(good, rows=0, backends=["hybrid"])
    den = _failed(rep, "hybrid", "loss_denominator")
    assert den and den[0].where["segment"] == 2
