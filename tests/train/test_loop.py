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
