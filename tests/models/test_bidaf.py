"""BiDAF and BiDAF + self-matching (bidaf_selfattn) on tiny random batches.

allennlp-models style: probabilities sum to 1, start <= end, a tiny batch can be overfit,
save/load round-trips; plus exact parameter counts derived from the paper's layer sizes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.data.dataset import Batch
from rcpipe.eval.decode import best_span
from rcpipe.models import ModelInputs, build_model
from rcpipe.models.bidaf import BiDAF
from rcpipe.models.layers import NEG_INF, SelfMatching, count_parameters, span_loss
from tests.models.conftest import CHARS, WORDS, inputs, make_batch

VARIANTS = ("bidaf", "bidaf_selfattn")
D = 16  # hidden
CFG = ModelConfig(hidden=D, char_dim=8, char_hidden=16, char_kernel=5, layers=2,
                  highway_layers=2, dropout=0.1)


def build(variant: str, no_answer: bool = False, seed: int = 0,
          cfg: ModelConfig = CFG, model_inputs: ModelInputs | None = None) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(variant, cfg, model_inputs or inputs(no_answer))


def one_token_batch() -> Batch:
    b = make_batch(b=2, lc=1, lq=4, seed=3)
    b.cw[:] = 5
    b.cc[:] = 0
    b.cc[..., :3] = 7
    b.c_mask[:] = True
    b.y1[:], b.y2[:] = 0, 0
    return b


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("no_answer", [False, True])
def test_output_shapes_and_padding_masked(variant: str, no_answer: bool) -> None:
    batch = make_batch(b=4, lc=30, lq=8)
    out = build(variant, no_answer)(batch)
    assert out.start.shape == out.end.shape == (4, 30)
    assert (out.na is not None) == no_answer
    if out.na is not None:
        assert out.na.shape == (4, 2)
    assert (out.start[~batch.c_mask] == NEG_INF).all()
    assert (out.end[~batch.c_mask] == NEG_INF).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("no_answer", [False, True])
def test_probabilities_sum_to_one_with_padding_zero(variant: str, no_answer: bool) -> None:
    batch = make_batch(impossible=no_answer)
    model = build(variant, no_answer).eval()
    with torch.no_grad():
        log_p1, log_p2 = model(batch).log_probs()
    for p in (log_p1.exp(), log_p2.exp()):  # (B, 1 + Lc): [no answer, tokens]
        torch.testing.assert_close(p.sum(1), torch.ones(4), atol=1e-5, rtol=0)
        assert (p[:, 1:][~batch.c_mask] == 0).all()
        if not no_answer:
            assert (p[:, 0] == 0).all()
        else:
            assert (p[:, 0] > 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_best_span_is_ordered_and_inside_the_context(variant: str) -> None:
    batch = make_batch(b=6, lc=40, seed=5)
    model = build(variant).eval()
    with torch.no_grad():
        log_p1, log_p2 = model(batch).log_probs()
    start, end, prob = best_span(log_p1.exp()[:, 1:], log_p2.exp()[:, 1:])
    assert (start <= end).all()
    assert (end < batch.c_mask.sum(1)).all()
    assert (prob > 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("no_answer", [False, True], ids=["v1.1", "v2.0"])
def test_overfits_one_batch(variant: str, no_answer: bool) -> None:
    batch = make_batch(impossible=no_answer)
    model = build(variant, no_answer)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(300):
        loss = span_loss(model(batch), batch.y1, batch.y2)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.03:
            break
    model.eval()
    with torch.no_grad():
        final = span_loss(model(batch), batch.y1, batch.y2).item()
    assert first is not None and first > 5.0  # ~2 log(Lc) at initialisation
    assert final < 0.1


@pytest.mark.parametrize("variant", VARIANTS)
def test_save_load_round_trip(variant: str, tmp_path: Path) -> None:
    batch = make_batch()
    model = build(variant, no_answer=True).eval()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    fresh = build(variant, no_answer=True, seed=123).eval()
    fresh.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    with torch.no_grad():
        a, b = model(batch), fresh(batch)
    assert torch.equal(a.start, b.start) and torch.equal(a.end, b.end)
    assert a.na is not None and b.na is not None and torch.equal(a.na, b.na)


@pytest.mark.parametrize("variant", VARIANTS)
def test_eval_is_deterministic_and_train_is_not(variant: str) -> None:
    batch = make_batch()
    model = build(variant)
    with torch.no_grad():
        model.eval()
        a, b = model(batch), model(batch)
        model.train()
        c = model(batch)
    assert torch.equal(a.start, b.start) and torch.equal(a.end, b.end)
    assert not torch.equal(a.start, c.start)  # dropout is on in training


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_does_not_change_a_row(variant: str) -> None:
    """Row 1 alone (trimmed to its own lengths) scores as it does inside the padded batch."""
    batch = make_batch(b=4, lc=30, lq=8, seed=7)
    lc, lq = int(batch.c_mask[1].sum()), int(batch.q_mask[1].sum())
    assert lc < 30 and lq < 8
    alone = Batch(ids=["q1"], cw=batch.cw[1:2, :lc], cc=batch.cc[1:2, :lc],
                  qw=batch.qw[1:2, :lq], qc=batch.qc[1:2, :lq], c_mask=batch.c_mask[1:2, :lc],
                  q_mask=batch.q_mask[1:2, :lq], y1=batch.y1[1:2], y2=batch.y2[1:2],
                  is_impossible=batch.is_impossible[1:2])
    model = build(variant, no_answer=True).eval()
    with torch.no_grad():
        full, one = model(batch), model(alone)
    torch.testing.assert_close(full.start[1, :lc], one.start[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full.end[1, :lc], one.end[0], atol=1e-5, rtol=1e-5)
    assert full.na is not None and one.na is not None
    torch.testing.assert_close(full.na[1], one.na[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", ["masked_question_row", "one_token_context"])
def test_degenerate_inputs_stay_finite(variant: str, case: str) -> None:
    if case == "masked_question_row":
        batch = make_batch()
        batch.q_mask[1] = False
        batch.qw[1] = 0
        batch.qc[1] = 0
    else:
        batch = one_token_batch()
    model = build(variant, no_answer=True)
    out = model(batch)
    loss = span_loss(out, batch.y1, batch.y2)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(t).all() for t in (out.start, out.end, out.na))
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_parameter_gets_a_gradient(variant: str) -> None:
    batch = make_batch(impossible=True)
    model = build(variant, no_answer=True)
    span_loss(model(batch), batch.y1, batch.y2).backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing


def test_pretrained_vectors_are_frozen_unless_fine_tuned() -> None:
    vectors = np.random.default_rng(0).normal(size=(WORDS, 16)).astype(np.float32)
    given = ModelInputs(word_vocab=WORDS, char_vocab=CHARS, word_dim=16, vectors=vectors,
                        no_answer=False)
    frozen = build("bidaf", model_inputs=given)
    assert isinstance(frozen, BiDAF)
    weight = frozen.word_emb.emb.weight
    assert not weight.requires_grad
    np.testing.assert_array_equal(weight.detach().numpy(), vectors)
    tuned = build("bidaf", cfg=CFG.model_copy(update={"train_word_vectors": True}),
                  model_inputs=given)
    assert isinstance(tuned, BiDAF) and tuned.word_emb.emb.weight.requires_grad
    scratch = build("bidaf")  # no vectors: trained from scratch
    assert isinstance(scratch, BiDAF) and scratch.word_emb.emb.weight.requires_grad


@pytest.mark.parametrize("rows_per_chunk", [7, 3])
def test_self_matching_attention_matches_the_per_step_formula(rows_per_chunk: int) -> None:
    """c_t = sum_j softmax_j(v^T tanh(W_v^P v_j + W_v^~P v_t)) v_j, one t at a time."""
    torch.manual_seed(0)
    block = SelfMatching(dim=6, attn_dim=5, hidden=4).eval()
    block.CHUNK = 2 * 7 * 5 * rows_per_chunk  # (B, rows, L, A) elements per block of rows
    v = torch.randn(2, 7, 6)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    c = block.attend(v, mask)
    for b in range(2):
        n = int(mask[b].sum())
        for t in range(7):
            s = torch.stack([block.v(torch.tanh(block.w_v(v[b, j]) + block.w_v_t(v[b, t])))
                             for j in range(n)]).squeeze(-1)
            expected = torch.softmax(s, 0) @ v[b, :n]
            torch.testing.assert_close(c[b, t], expected, atol=1e-5, rtol=1e-5)


def lstm_params(n_in: int, h: int) -> int:
    """One direction of nn.LSTM: 4 gates of W_ih, W_hh, b_ih, b_hh."""
    return 4 * (n_in * h + h * h + 2 * h)


def test_parameter_counts() -> None:
    d, w, c = D, 16, CFG.char_hidden  # hidden, word_dim, char filters
    e = w + c  # highway width
    model = build("bidaf")
    selfattn = build("bidaf_selfattn")
    v2 = build("bidaf", no_answer=True)
    assert isinstance(model, BiDAF) and isinstance(selfattn, BiDAF)
    highway = 2 * (e * e + e) * CFG.highway_layers  # transform + gate, weights + biases
    assert count_parameters(model.highway) == highway
    char_cnn = CHARS * CFG.char_dim + CFG.char_dim * c * CFG.char_kernel + c
    assert count_parameters(model.char_emb) == char_cnn
    contextual = 2 * lstm_params(e, d)
    assert count_parameters(model.contextual) == contextual
    attention_flow = 3 * 2 * d + 1  # w_S over [h; u; h * u] (each 2d) + bias
    assert count_parameters(model.attention_flow) == attention_flow
    modeling = 2 * lstm_params(8 * d, d) + 2 * lstm_params(2 * d, d) * (CFG.layers - 1)
    assert count_parameters(model.modeling) == modeling
    # the output layer: w_p1 and w_p2 over [G; M] (10d) with a bias each, M2 = BiLSTM(M)
    output = 2 * (10 * d + 1) + 2 * lstm_params(2 * d, d)
    assert count_parameters(model.w_p1) + count_parameters(model.w_p2) \
        + count_parameters(model.end_rnn) == output
    words = WORDS * w
    total = words + char_cnn + highway + contextual + attention_flow + modeling + output
    assert count_parameters(model) == total
    # v2.0: the no-answer head pools [G; M2] (10d) and maps it to two logits
    assert count_parameters(v2) - total == (10 * d + 1) + (10 * d * 2 + 2)
    # bidaf_selfattn: the 8d -> 2d projection, self-matching (W_v^P, W_v^~P, v, W_g, BiGRU)
    # and a modeling layer that now reads 2d
    gru = 2 * 3 * (4 * d * d + d * d + 2 * d)  # BiGRU over g * [v; c] (4d)
    self_matching = 2 * (2 * d * d) + d + (4 * d) ** 2 + gru
    assert count_parameters(selfattn.self_matching) == self_matching
    extra = (8 * d * 2 * d + 2 * d) + self_matching - (lstm_params(8 * d, d)
                                                       - lstm_params(2 * d, d)) * 2
    assert count_parameters(selfattn) == total + extra
    print(f"bidaf {count_parameters(model)}  bidaf_selfattn {count_parameters(selfattn)}")
    assert count_parameters(model) == 44147  # pinned for CFG, word_dim 16
    assert count_parameters(selfattn) == 48995
