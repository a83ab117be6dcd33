"""One RNN direction, the fused GRU/LSTM that torch.compile keeps whole inside its graph.

Dynamo refuses nn.GRU/nn.LSTM modules (a graph break at every call) and, with allow_rnn,
unrolls the fused RNN into a cell per time step (over 10 minutes to compile a tiny BiDAF on
2 cores). So a direction's weights live in a plain module, ``RNNWeights``, under nn.GRU's
and nn.LSTM's own parameter names and initialisation (saved models load as before), and:

- in eager mode (the CPU demo, tests) a run is the plain torch.gru / torch.lstm call,
  differentiated by autograd as always;
- under torch.compile it is the custom op ``rcpipe::rnn``, opaque to the compiler. Its
  backward is a second custom op, ``rcpipe::rnn_backward``, that runs the forward again with
  autograd on and differentiates it: one more forward of the recurrence per training step
  (the fused kernel's saved state cannot leave an op), in exchange for one graph.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor, nn

GATES = {"gru": 3, "lstm": 4}
WEIGHTS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")

# cuDNN copies the four weights into one buffer at every call where nn.GRU keeps them in
# one (flatten_parameters); for these sizes (under a megabyte a direction) the copy is
# noise, the warning is not
warnings.filterwarnings("ignore", message="RNN module weights are not part of single")


class RNNWeights(nn.Module):
    """A single-layer GRU/LSTM's weights, one direction or two (``*_reverse``), named and
    initialised as nn.GRU/nn.LSTM name and initialise theirs."""

    def __init__(self, cell: str, input_dim: int, hidden: int,
                 bidirectional: bool = False) -> None:
        super().__init__()
        if cell not in GATES:
            raise ValueError(f"cell must be one of {sorted(GATES)}, not {cell}")
        self.cell, self.hidden_size = cell, hidden
        rows = GATES[cell] * hidden
        for suffix in ("", "_reverse") if bidirectional else ("",):
            for name, shape in zip(WEIGHTS, ((rows, input_dim), (rows, hidden), (rows,),
                                             (rows,)), strict=True):
                self.register_parameter(name + suffix, nn.Parameter(torch.empty(shape)))
        bound = 1 / math.sqrt(hidden)
        for p in self.parameters():  # nn.RNNBase.reset_parameters, in the same order
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: Tensor, suffix: str = "", time_first: bool = False) -> Tensor:
        """The direction ``suffix`` ("" or "_reverse") over x (B, L, D) read left to right,
        from a zero state: its outputs (B, L, H); (L, B, D) -> (L, B, H) if ``time_first``,
        the fused kernels' own layout (a batch-first input is copied into it)."""
        w_ih, w_hh, b_ih, b_hh = (getattr(self, name + suffix) for name in WEIGHTS)
        if torch.compiler.is_compiling():
            if time_first:  # the op is batch first: the compiler plans the copies
                x = x.transpose(0, 1)  # (B, L, D)
            y = torch.ops.rcpipe.rnn(x, w_ih, w_hh, b_ih, b_hh, self.cell)  # (B, L, H)
            return y.transpose(0, 1) if time_first else y
        return fused(x, [w_ih, w_hh, b_ih, b_hh], self.cell, self.training, not time_first)


def fused(x: Tensor, weights: list[Tensor], cell: str, train: bool,
          batch_first: bool = True) -> Tensor:
    """torch.gru / torch.lstm, one layer, zero initial state: (B, L, H) batch first, else
    (L, B, H). ``train`` is cuDNN's: keep what its backward needs."""
    h0 = x.new_zeros(1, x.size(0 if batch_first else 1), weights[1].size(1))  # (1, B, H)
    if cell == "lstm":
        return torch.lstm(x, (h0, h0), weights, True, 1, 0.0, train, False, batch_first)[0]
    return torch.gru(x, h0, weights, True, 1, 0.0, train, False, batch_first)[0]


@torch.library.custom_op("rcpipe::rnn", mutates_args=())
def rnn(x: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor,
        cell: str) -> Tensor:
    # contiguous: the fused kernels return (L, B, H) memory viewed batch first, strides
    # that differ by device and that the fake kernel below must match
    return fused(x, [w_ih, w_hh, b_ih, b_hh], cell, train=False).contiguous()


@rnn.register_fake
def _(x: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor,
      cell: str) -> Tensor:
    return x.new_empty(x.size(0), x.size(1), w_hh.size(1))  # (B, L, H)


@torch.library.custom_op("rcpipe::rnn_backward", mutates_args=())
def rnn_backward(grad: Tensor, x: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
                 b_hh: Tensor, cell: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    with _autograd_on(), torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (x, w_ih, w_hh, b_ih, b_hh)]
        out = fused(inputs[0], inputs[1:], cell, train=True)
        grads = torch.autograd.grad(out, inputs, grad)
    return tuple(g.contiguous() for g in grads)  # type: ignore[return-value]


@rnn_backward.register_fake
def _(grad: Tensor, x: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor,
      cell: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)  # type: ignore
                 for t in (x, w_ih, w_hh, b_ih, b_hh))


def _save(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(*inputs[:5])  # x and the weights: the backward recomputes
    ctx.cell = inputs[5]  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple:
    return (*rnn_backward(grad, *ctx.saved_tensors, ctx.cell), None)  # type: ignore


rnn.register_autograd(_backward, setup_context=_save)


def _autograd_on() -> torch._C._ForceDispatchKeyGuard:
    """The dispatcher's autograd keys back on for the block. A custom op's kernel runs
    below autograd (torch.library excludes those keys around it), and rnn_backward must
    differentiate its own recompute; autocast stays off as it was."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.AutogradOther,
                torch._C.DispatchKey.AutogradNestedTensor):
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)
