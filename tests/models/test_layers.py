"""Shared blocks of models/layers.py that trade nothing for speed: the reversal within each
row's length as whole rows (the gather it replaced gives the same values and gradients; time
first as BiRNN runs it inside), the CPU dropout whose mask is a float32 uniform against p
(nn.Dropout's distribution), the variational mask drawn alike in either layout, and the
trilinear similarity's start (models.<v>.similarity_init), which BiDAF and QANet build."""

from __future__ import annotations

import pytest
import torch

from rcpipe.config import ModelConfig
from rcpipe.models import build_model
from rcpipe.models.layers import (
    Dropout,
    TrilinearAttention,
    VariationalDropout,
    capture_attention,
    reversal,
    reverse_padded,
    reverse_rows,
)


def test_reverse_padded_is_the_gather_bit_for_bit_and_its_own_inverse() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 7, 5, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([7, 3, 1, 5])
    steps = torch.arange(7)
    rev = lengths[:, None] - 1 - steps  # (B, L)
    rev = torch.where(rev >= 0, rev, steps)
    by_gather = x.gather(1, rev.unsqueeze(-1).expand_as(x))  # (B, L, D): the former path
    ours = reverse_padded(x, lengths)
    assert torch.equal(ours, by_gather)
    assert torch.equal(ours[1, :3], x[1, :3].flip(0)) and torch.equal(ours[1, 3:], x[1, 3:])
    assert torch.equal(reverse_padded(ours, lengths), x)
    g = torch.randn_like(x)
    assert torch.equal(torch.autograd.grad(ours, x, g)[0],
                       torch.autograd.grad(by_gather, x, g)[0])
    # time first (BiRNN's layout inside): the same reversal of the transposed tensor
    x_t = x.detach().transpose(0, 1).contiguous()  # (L, B, D)
    rows = reversal(lengths, 7, time_first=True)  # (L*B,)
    assert torch.equal(reverse_rows(x_t, rows), by_gather.detach().transpose(0, 1))


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_on_the_cpu_keeps_1_minus_p_of_the_values_scaled(p: float) -> None:
    torch.manual_seed(0)
    drop = Dropout(p)
    x = torch.rand(200, 500) + 1.0  # no zero of its own
    assert drop.eval()(x) is x
    y = drop.train()(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    x.requires_grad_()
    y = drop(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, (y != 0).float() / (1 - p))
    assert torch.equal(Dropout(0.0).train()(x), x)


def test_dropout_masks_follow_torch_seed_and_keep_the_dtype() -> None:
    """The CPU mask comes from NumPy seeded by torch's generator: torch.manual_seed (and a
    resumed run's saved RNG state) decides it, and each call draws a new one."""
    drop = Dropout(0.5).train()
    x = torch.ones(64, 64)
    torch.manual_seed(3)
    a, b = drop(x), drop(x)
    torch.manual_seed(3)
    assert torch.equal(drop(x), a) and not torch.equal(a, b)
    assert drop(x.bfloat16()).dtype == torch.bfloat16
    assert drop(x.double()).dtype == torch.float64


def test_variational_dropout_has_one_mask_per_sequence() -> None:
    torch.manual_seed(0)
    x = torch.rand(8, 6, 50) + 1.0
    y = VariationalDropout(0.3).train()(x)
    kept = y != 0  # (B, L, D)
    assert torch.equal(kept, kept[:, :1].expand_as(kept))  # the same at every step
    torch.testing.assert_close(y[kept], x[kept] / 0.7)
    torch.manual_seed(0)  # time first: the same mask for the same sequences
    torch.rand(8, 6, 50)  # the draw x took
    y_t = VariationalDropout(0.3).train()(x.transpose(0, 1), time_first=True)  # (L, B, D)
    assert torch.equal(y_t.transpose(0, 1), y)


def _matches(init: str) -> float:
    """The share of passage words whose most attended question word is the same vector, the
    similarity's w_c and w_q zeroed: the c * q term's prior alone."""
    torch.manual_seed(0)
    att = TrilinearAttention(64, init=init)
    with torch.no_grad():
        att.w_c.weight.zero_()
        att.w_q.weight.zero_()
    c = torch.randn(8, 20, 64)  # (B, Lc, D)
    order = torch.randperm(20)
    q = c[:, order]  # (B, Lq, D): the passage's words, shuffled
    ones = torch.ones(8, 20, dtype=torch.bool)
    with capture_attention(att) as maps:
        att(c, q, ones, ones)
    chosen = maps[(att, "c2q")][0].argmax(dim=-1)  # (B, Lc): each word's best question word
    return (order[chosen] == torch.arange(20)).float().mean().item()


def test_the_attracting_start_attends_to_the_same_word_where_signs_at_random_do_not() -> None:
    torch.manual_seed(0)
    attract = TrilinearAttention(64).w_cq.detach()
    torch.manual_seed(0)
    symmetric = TrilinearAttention(64, init="symmetric").w_cq.detach()
    assert torch.equal(attract, symmetric.abs())  # the same draw, signs made positive
    assert (symmetric < 0).any() and (symmetric > 0).any()
    assert _matches("attract") > 0.95 > 0.5 > _matches("symmetric")
    with pytest.raises(ValueError, match="attract or symmetric"):
        TrilinearAttention(8, init="positive")


@pytest.mark.parametrize(("variant", "layer"), [("bidaf", "attention_flow"),
                                                ("qanet", "cq_attention")])
def test_each_trilinear_family_starts_as_its_config_says(variant: str, layer: str) -> None:
    from tests.models.conftest import inputs

    for init, positive in (("attract", True), ("symmetric", False)):
        cfg = ModelConfig(hidden=16, heads=2, model_blocks=1, similarity_init=init)
        w_cq = getattr(build_model(variant, cfg, inputs()), layer).w_cq
        assert bool((w_cq >= 0).all()) is positive
