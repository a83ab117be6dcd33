"""R-Net's recurrences as they are (both gated directions in one loop, CharGRU without
packing) against the implementations they replaced, kept as they stood (git 38a6af0) in
tests/models/rnet_reference.py: the same weights give the same outputs and gradients; and no op of
an R-Net step has a data-dependent output (no host sync, no data-dependent shape), so it
can be captured whole.

The timings of the two side by side: docs/results/speed.md.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.models import build_model
from rcpipe.models.gated_rnn import BiGatedAttentionRNN
from rcpipe.models.layers import span_loss
from rcpipe.models.rnet import CharGRU
from tests.models.conftest import inputs, make_batch
from tests.models.rnet_reference import (
    OldBiGatedAttentionRNN,
    OldCharGRU,
    OpLog,
    with_reference_recurrences,
)

# ----------------------------------------------------------------------------- helpers

def masks(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total) < torch.tensor(lengths).unsqueeze(1)  # (B, total)


def grads(module: nn.Module, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    named = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    return named | {f"input{i}": t.grad for i, t in enumerate(tensors)}


def assert_same(new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> None:
    assert new.keys() == old.keys()
    for name in new:
        torch.testing.assert_close(new[name], old[name], atol=1e-5, rtol=1e-5, msg=name)


# ------------------------------------------------------------------------------ the tests


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("mode", ["train", "train_dropout", "eval"])
def test_gated_attention_gives_the_references_outputs_and_gradients(
        bidirectional: bool, mode: str) -> None:
    dropout = 0.3 if mode == "train_dropout" else 0.0
    torch.manual_seed(0)
    new = BiGatedAttentionRNN(6, 5, 4, dropout, bidirectional)
    old = OldBiGatedAttentionRNN(6, 5, 4, dropout, bidirectional)
    old.load_state_dict(new.state_dict())  # the same keys: saved models load
    for m in (new, old):
        m.train(mode != "eval")
    u_p, u_q = torch.randn(4, 9, 6), torch.randn(4, 5, 6)
    c_mask, q_mask = masks([9, 5, 1, 7], 9), masks([5, 3, 1, 5], 5)
    upstream = torch.randn(4, 9, 8 if bidirectional else 4)
    results = []
    for m in (new, old):
        x, y = u_p.clone().requires_grad_(), u_q.clone().requires_grad_()
        torch.manual_seed(1)  # the same dropout mask for both
        out = m(x, c_mask, y, q_mask)  # (B, Lc, 2H or H)
        (out * upstream).sum().backward()
        results.append(({"out": out.detach()}, grads(m, x, y)))
    (new_out, new_grads), (old_out, old_grads) = results
    assert_same(new_out, old_out)
    assert_same(new_grads, old_grads)
    assert len(new_grads) == (18 if bidirectional else 9) + 2  # every weight got a gradient


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_char_gru_gives_the_references_outputs_and_gradients(mode: str) -> None:
    torch.manual_seed(0)
    new, old = CharGRU(20, 4, 3), OldCharGRU(20, 4, 3)
    old.load_state_dict(new.state_dict())
    chars = torch.randint(1, 20, (3, 4, 7))
    lengths = torch.tensor([[7, 1, 3, 0], [0, 0, 0, 0], [2, 5, 0, 0]])  # row 1: padding only
    chars = chars * (torch.arange(7) < lengths.unsqueeze(-1))  # (3, 4, 7) left-aligned
    upstream = torch.randn(3, 4, 6)
    results = []
    for m in (new, old):
        m.train(mode == "train")
        out = m(chars)  # (3, 4, 6)
        (out * upstream).sum().backward()
        results.append(({"out": out.detach()}, grads(m)))
    (new_out, new_grads), (old_out, old_grads) = results
    assert_same(new_out, old_out)
    assert_same(new_grads, old_grads)
    assert (new_out["out"][lengths == 0] == 0).all()


@pytest.mark.parametrize("bidirectional", [True, False])
def test_an_r_net_step_is_the_references_and_loads_its_weights(bidirectional: bool) -> None:
    """The whole model, its two recurrences swapped for the reference ones."""
    cfg = ModelConfig(hidden=8, char_dim=4, char_hidden=6, layers=1, dropout=0.2,
                      bidirectional_matching=bidirectional)
    torch.manual_seed(0)
    new = build_model("rnet", cfg, inputs()).train()
    old = with_reference_recurrences(new)
    batch = make_batch(b=3, lc=14, lq=6, seed=3)
    batch.cc[1, -3:] = 0  # padding words inside a row's length: no chars at all
    results = []
    for m in (new, old):
        torch.manual_seed(1)
        out = m(batch)
        span_loss(out, batch.y1, batch.y2).backward()
        results.append(({"start": out.start.detach(), "end": out.end.detach()}, grads(m)))
    assert_same(results[0][0], results[1][0])
    assert_same(results[0][1], results[1][1])


@pytest.mark.parametrize("variant", ["rnet", "rnet_mult"])
def test_an_r_net_step_has_no_data_dependent_op(variant: str) -> None:
    cfg = ModelConfig(hidden=8, char_dim=4, char_hidden=6, layers=1, dropout=0.1)
    torch.manual_seed(0)
    model = build_model(variant, cfg, inputs(no_answer=True)).train()
    batch = make_batch(b=3, lc=12, lq=5, seed=1, impossible=True)
    with OpLog() as log:
        span_loss(model(batch), batch.y1, batch.y2).backward()
    assert log.ops and not log.data_dependent, sorted(set(log.data_dependent))
    reference = OldCharGRU(20, 4, 6)
    with OpLog() as log:
        reference(batch.cc)  # the log does catch the packed one's syncs
    assert "aten._local_scalar_dense.default" in log.data_dependent


def test_char_gru_traces_as_one_graph_and_the_gated_loop_is_r_nets_one_break() -> None:
    import torch._dynamo

    torch.manual_seed(0)
    emb = CharGRU(20, 4, 3)
    chars = make_batch(b=2, lc=6, lq=3).cc
    torch._dynamo.reset()
    explained = torch._dynamo.explain(emb)(chars)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained
    cfg = ModelConfig(hidden=8, char_dim=4, char_hidden=6, layers=1, dropout=0.1)
    batch = make_batch(b=3, lc=12, lq=5)
    for variant in ("rnet", "rnet_mult"):
        model = build_model(variant, cfg, inputs()).train()
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(batch)
        # dynamo names the one break once per frame it sits in (RNet, BiGatedAttentionRNN,
        # gated_attention); rnet_mult has no recurrence of its own: one graph
        reasons = [r.reason for r in explained.break_reasons]
        if variant == "rnet_mult":
            assert (explained.graph_count, reasons) == (1, []), reasons
        else:
            assert reasons and all("R-Net's gated attention recurrence" in r
                                   for r in reasons), reasons
