"""layers.capture_attention: the weights explain shows, recorded without changing a model.

Every variant gives bit-identical outputs with and without a capture block open (so the
model tests above still pin the same numbers), and every recorded map is a distribution
over the real positions of each real row, even in a padded batch.
"""

from __future__ import annotations

import pytest
import torch

from rcpipe.config import VARIANTS, ModelConfig
from rcpipe.models import build_model, views_of
from rcpipe.models.layers import capture_attention, capturing
from tests.models.conftest import inputs, make_batch

CFG = ModelConfig(hidden=16, char_dim=8, char_hidden=16, layers=1, heads=2, model_blocks=2,
                  emb_convs=1, model_convs=1, highway_layers=1, dropout=0.1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_capture_changes_no_output_and_records_distributions(variant: str) -> None:
    torch.manual_seed(0)
    model = build_model(variant, CFG, inputs(no_answer=True)).eval()
    batch = make_batch(b=3, lc=24, lq=7, seed=1)
    with torch.no_grad():
        plain = model(batch)
        with capture_attention(model) as captured:
            assert all(capturing(m) for m in model.modules())
            seen = model(batch)
    assert not any(capturing(m) for m in model.modules())
    assert torch.equal(plain.start, seen.start) and torch.equal(plain.end, seen.end)
    assert torch.equal(plain.na, seen.na)

    c_mask, q_mask = batch.c_mask, batch.q_mask
    for spec in views_of(variant):
        w = captured[(model.get_submodule(spec.module), spec.name)][spec.call]
        cols = q_mask if spec.kind == "question" else c_mask  # (B, L) real columns
        if spec.kind == "passage_weights":  # (B, Lc): one distribution per question
            sums = w.sum(-1)
            assert (w[~c_mask] == 0).all()
        else:
            w = w.mean(1) if w.dim() == 4 else w  # QANet heads: (B, h, L, L)
            assert (w.masked_select(~cols[:, None, :].expand_as(w)) == 0).all()
            sums = w.sum(-1)[c_mask]  # the real passage rows
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def test_training_records_nothing_and_gradients_match() -> None:
    """In training (no block open) nothing is kept; inside one, the loss and its gradients
    are the same (explain never trains, but a capture left open must not skew a step)."""
    from rcpipe.models.layers import span_loss

    batch = make_batch(b=2, lc=12, lq=5, seed=2)
    grads = []
    for capture in (False, True):
        torch.manual_seed(0)
        model = build_model("rnet", CFG, inputs()).train()
        torch.manual_seed(1)  # the same dropout masks in both runs
        if capture:
            with capture_attention(model) as captured:
                span_loss(model(batch), batch.y1, batch.y2).backward()
            assert captured
        else:
            span_loss(model(batch), batch.y1, batch.y2).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)
