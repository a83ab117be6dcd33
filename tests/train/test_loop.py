"""The plain training loop: schedule, EMA, one step, prediction."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rcpipe.config import OptimConfig
from rcpipe.data.dataset import Batch
from rcpipe.models.layers import SpanLogits, mask_logits
from rcpipe.train.loop import EMA, make_optimizer, train_step, warmup
from tests.models.conftest import make_batch


class Pointer(nn.Module):
    """A minimal model with the SpanLogits contract: one score per context word id."""

    def __init__(self, words: int = 50) -> None:
        super().__init__()
        self.w1 = nn.Embedding(words, 1)
        self.w2 = nn.Embedding(words, 1)

    def forward(self, b: Batch) -> SpanLogits:
        return SpanLogits(mask_logits(self.w1(b.cw).squeeze(-1), b.c_mask),
                          mask_logits(self.w2(b.cw).squeeze(-1), b.c_mask))


def test_warmup_is_logarithmic_then_flat() -> None:
    f = warmup(1000)
    assert f(0) == 0.0
    assert f(9) == pytest.approx(math.log(10) / math.log(1000))
    assert f(999) == pytest.approx(1.0)
    assert f(5000) == 1.0
    assert warmup(0)(0) == 1.0


def test_optimizers_follow_config() -> None:
    m = Pointer()
    opt, _ = make_optimizer(m, OptimConfig(name="adam", lr=1e-3, beta1=0.8, weight_decay=3e-7))
    assert isinstance(opt, torch.optim.Adam)
    assert opt.param_groups[0]["betas"] == (0.8, 0.999)
    assert opt.param_groups[0]["weight_decay"] == 3e-7
    opt, _ = make_optimizer(m, OptimConfig(name="adadelta", lr=0.5, rho=0.95))
    assert isinstance(opt, torch.optim.Adadelta)


def test_ema_tracks_and_swaps_back() -> None:
    m = Pointer()
    ema = EMA(m, decay=0.5)
    before = m.w1.weight.detach().clone()
    with torch.no_grad():
        m.w1.weight.add_(1.0)
    ema.update(m)  # ramp: d = min(0.5, 2/11)
    d = 2 / 11
    assert torch.allclose(ema.shadow["w1.weight"], before * d + (before + 1) * (1 - d))
    current = m.w1.weight.detach().clone()
    with ema.applied(m):
        assert torch.allclose(m.w1.weight, ema.shadow["w1.weight"])
    assert torch.equal(m.w1.weight, current)
    restored = EMA(Pointer(), 0.5)
    restored.load_state_dict(ema.state_dict())
    assert restored.updates == 1
    assert torch.equal(restored.shadow["w1.weight"], ema.shadow["w1.weight"])


@pytest.mark.trains
def test_train_steps_reduce_the_loss() -> None:
    torch.manual_seed(0)
    m = Pointer()
    batch = make_batch(b=8, lc=20)
    opt, sched = make_optimizer(m, OptimConfig(name="adam", lr=0.1))
    losses = [float(train_step(m, batch, opt, sched, 5.0)) for _ in range(60)]
    assert losses[-1] < 0.7 * losses[0]


def _teacher(batch: Batch, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A teacher's (B, 1 + Lc) p_start and p_end over the real tokens (v1.1: 0 on the
    no-answer position and on padding)."""
    g = torch.Generator().manual_seed(seed)
    real = torch.cat([torch.zeros(len(batch), 1, dtype=torch.bool), batch.c_mask], dim=1)
    out = []
    for _ in range(2):
        logits = torch.randn(real.shape, generator=g) * 3
        out.append(torch.softmax(logits.masked_fill(~real, float("-inf")), dim=1))
    return out[0], out[1]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0])
def test_the_distillation_loss_is_zero_against_itself_and_pulls_the_student_to_its_teacher(
        temperature: float) -> None:
    """KL(teacher || student) at T, times T^2: 0 when the teacher is the student's own
    distribution (softened alike), finite on padding and v1.1's no-answer position (p 0
    there), and its gradient moves the student's distributions towards the teacher's."""
    from rcpipe.models.layers import distillation_loss

    torch.manual_seed(0)
    m = Pointer()
    batch = make_batch(b=6, lc=12)
    with torch.no_grad():
        own = [lp.exp() for lp in m(batch).log_probs()]
    assert float(distillation_loss(m(batch), *own, temperature)) == pytest.approx(0, abs=1e-5)
    t1, t2 = _teacher(batch)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = distillation_loss(m(batch), t1, t2, temperature)
        assert torch.isfinite(loss)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters())
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]


def test_a_students_step_weighs_gold_and_teacher_by_alpha_and_plain_batches_stay_gold(
        ) -> None:
    from rcpipe.models.layers import distillation_loss, span_loss
    from rcpipe.train.loop import Distill, TrainStep

    torch.manual_seed(0)
    m = Pointer()
    batch = make_batch(b=6, lc=12)
    t1, t2 = _teacher(batch)
    taught = Batch(**{**batch.__dict__, "teacher_start": t1, "teacher_end": t2})
    opt, sched = make_optimizer(m, OptimConfig(name="adam", lr=0.1))
    with torch.no_grad():
        out = m(batch)
        gold = float(span_loss(out, batch.y1, batch.y2))
        kl = float(distillation_loss(out, t1, t2, 2.0))
    for alpha in (0.0, 0.3, 1.0):
        step = TrainStep(m, opt, sched, 5.0, distill=Distill(alpha, 2.0))
        assert float(step.loss(taught)) == pytest.approx((1 - alpha) * gold + alpha * kl,
                                                         rel=1e-5)
        assert float(step.loss(batch)) == pytest.approx(gold, rel=1e-6)  # no targets: gold
    assert float(TrainStep(m, opt, sched, 5.0).loss(taught)) == pytest.approx(gold, rel=1e-6)
