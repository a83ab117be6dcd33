"""Every variant at params.yaml's sizes on the CPU, and mixed precision: recurrent layers run
in float32 inside autocast and hand back their input's dtype (layers.float32_recurrence)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rcpipe.config import VARIANTS, load_config
from rcpipe.models import build_model
from rcpipe.models.layers import BiRNN, span_loss
from rcpipe.models.rnet import CharGRU, GatedAttentionRNN, PointerNetwork
from rcpipe.train.loop import make_optimizer, train_step
from tests.models.conftest import inputs, make_batch

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_builds_at_paper_size_and_trains(variant: str) -> None:
    cfg = load_config(PARAMS).models.of(variant)
    torch.manual_seed(0)
    model = build_model(variant, cfg, inputs(no_answer=True, word_dim=300))
    optimizer, scheduler = make_optimizer(model, cfg.optim)
    batch = make_batch(b=3, lc=24, lq=6, impossible=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(2):  # QANet's log warm-up gives the very first step lr 0, as in the paper
        loss = train_step(model, batch, optimizer, scheduler, cfg.optim.grad_clip)
        assert loss.ndim == 0 and torch.isfinite(loss)
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved  # the paper's optimiser took its steps


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_trains_under_bf16_autocast(variant: str) -> None:
    """CPU autocast stands in for CUDA's here: before float32_recurrence, BiDAF's LSTM failed
    under it, as both R-Nets failed under CUDA's (Half written into Float)."""
    cfg = load_config(PARAMS).models.of(variant).model_copy(
        update={"hidden": 16, "heads": 2, "char_hidden": 8, "char_dim": 8, "model_blocks": 1})
    torch.manual_seed(0)
    model = build_model(variant, cfg, inputs(no_answer=True))
    batch = make_batch(impossible=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
    loss = span_loss(out, batch.y1, batch.y2)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all()
               for g in grads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_birnn_runs_in_float32_and_returns_its_inputs_dtype(dtype: torch.dtype, cell: str
                                                            ) -> None:
    rnn = BiRNN(6, 4, layers=2, cell=cell)
    x, mask = torch.randn(3, 5, 6), torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = rnn(x.to(dtype), mask)
    assert y.dtype == dtype
    # the recurrence itself ran in float32: the same numbers as without autocast
    assert torch.allclose(y.float(), rnn(x.to(dtype).float(), mask).to(dtype).float())


def test_r_net_recurrences_follow_their_inputs_dtype() -> None:
    torch.manual_seed(0)
    chars = torch.randint(1, 9, (2, 4, 5))
    chars[1, 2:] = 0  # padding words
    char_gru = CharGRU(10, 3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert char_gru(chars).dtype == torch.float32  # its embedding's dtype
    gated = GatedAttentionRNN(6, 5, 4)
    u_p, u_q = torch.randn(2, 7, 6, dtype=torch.bfloat16), torch.randn(2, 3, 6,
                                                                       dtype=torch.bfloat16)
    c_mask, q_mask = torch.ones(2, 7, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert gated(u_p, c_mask, u_q, q_mask).dtype == torch.bfloat16
        pointer = PointerNetwork(6, 5)
        start, end = pointer(u_p, c_mask, u_q[:, 0])
    assert torch.isfinite(start).all() and torch.isfinite(end).all()
