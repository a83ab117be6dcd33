"""One RNN direction (models/rnn.py): nn.GRU/nn.LSTM's weights and outputs, and under
torch.compile one opaque op whose recomputing backward gives autograd's gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rcpipe.models.rnn import RNNWeights

MODULES = {"gru": nn.GRU, "lstm": nn.LSTM}


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_weights_initialise_and_run_as_torch_own_module(cell: str) -> None:
    torch.manual_seed(0)
    ours = RNNWeights(cell, 6, 5, bidirectional=True)
    torch.manual_seed(0)
    theirs = MODULES[cell](6, 5, batch_first=True, bidirectional=True)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for name, p in theirs.named_parameters():
        assert torch.equal(getattr(ours, name), p), name  # the same draws, in the same order
    x = torch.randn(3, 7, 6)
    with torch.no_grad():
        both, _ = theirs(x)  # (3, 7, 10): forward, then the backward direction's outputs
        torch.testing.assert_close(ours(x), both[..., :5])
        torch.testing.assert_close(ours(x.flip(1), "_reverse").flip(1), both[..., 5:])


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_compiled_it_is_one_graph_with_eager_outputs_and_gradients(cell: str) -> None:
    torch.manual_seed(0)
    rnn = RNNWeights(cell, 6, 5)
    x = torch.randn(3, 7, 6, requires_grad=True)
    inputs = [x, *rnn.parameters()]

    def loss(run) -> tuple[torch.Tensor, list[torch.Tensor]]:
        out = run(x)
        grads = torch.autograd.grad((out * out.detach().cos()).sum(), inputs)
        return out.detach(), list(grads)

    eager = loss(rnn)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(rnn)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    assert not any("aten.gru" in str(g.graph) or "aten.lstm" in str(g.graph)
                   for g in explained.graphs)  # not traced into: rcpipe::rnn
    compiled = loss(torch.compile(rnn, backend="aot_eager", fullgraph=True))
    torch._dynamo.reset()
    torch.testing.assert_close(compiled[0], eager[0], atol=1e-6, rtol=1e-6)
    for a, b in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_the_custom_op_passes_torch_library_checks() -> None:
    torch.manual_seed(0)
    rnn = RNNWeights("lstm", 4, 3)
    args = (torch.randn(2, 5, 4, requires_grad=True),
            *(p.detach().clone().requires_grad_() for p in rnn.parameters()), "lstm")
    torch.library.opcheck(torch.ops.rcpipe.rnn.default, args)
