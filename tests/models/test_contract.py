"""The model contract every RNN-family variant keeps (BiDAF, BiDAF + self-matching, R-Net,
R-Net multiplicative), on tiny random batches; QANet's own file covers it for QANet.

allennlp-models style: output shapes with padding masked, probabilities sum to 1, start <=
end, a tiny batch can be overfit (v1.1 and v2.0), save/load round-trips, eval is
deterministic, padding never changes a row, degenerate inputs stay finite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.data.dataset import Batch
from rcpipe.inference.decode import best_span
from rcpipe.models import build_model
from rcpipe.models.layers import NEG_INF, span_loss
from tests.models.conftest import inputs, make_batch

VARIANTS = ("bidaf", "bidaf_selfattn", "rnet", "rnet_mult")
CFG = ModelConfig(hidden=16, char_dim=8, char_hidden=16, char_kernel=5, layers=2,
                  highway_layers=2, dropout=0.1)


def build(variant: str, no_answer: bool = False, seed: int = 0, cfg: ModelConfig = CFG
          ) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(variant, cfg, inputs(no_answer))


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


@pytest.mark.trains
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("no_answer", [False, True], ids=["v1.1", "v2.0"])
def test_overfits_one_batch(variant: str, no_answer: bool) -> None:
    batch = make_batch(impossible=no_answer)
    # R-Net with a one-layer encoder: CPU RNN steps cost ~10 us of dispatch each
    layers = 1 if variant.startswith("rnet") else CFG.layers
    model = build(variant, no_answer, cfg=CFG.model_copy(update={"layers": layers}))
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
