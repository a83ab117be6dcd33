"""Gradient parity, in float64, of R-Net's recurrences and ``rcpipe::rnn`` against the papers'
per-step equations (issue 32, item 1).

test_rnet_recurrence.py holds the batched implementations to the ones they replaced (nn.GRU
packed, nn.GRUCell), in float32 at 1e-5; test_rnn.py holds the compiled op to the eager one.
Neither says the code computes the equations it cites, and the references there share
fused kernels with the code under test. Here the reference is a plain Python loop over each
row's real steps only (padding is never read), the cells written out gate by gate, and
autograd through it: the module's outputs on real positions and its gradients w.r.t. the
inputs and every parameter must equal that loop's to float64 round-off (atol 1e-10), under
a random upstream gradient so that every output element counts. What it protects:

- the gated attention-based recurrence (gated_rnn.py): both directions stacked in one loop,
  the hoisted W_u^P / W_g halves and bmm layouts must still be eq. 3-4 of Wang et al. 2017;
- ``rcpipe::rnn``'s backward, which reruns the fused kernel and differentiates it instead
  of letting autograd record the forward: it must give autograd's gradients of the GRU/LSTM
  cell equations (and gradcheck's finite differences);
- CharGRU: static width, no packing, final states gathered at each word's last char and the
  backward direction run on each word reversed within its length, must equal running each
  word's real chars alone; a word without chars gives 0.

Padding follows each module's contract: outputs past a row's length are unspecified (masked
downstream), so the upstream gradient is zero there and those outputs are not compared; the
gradient reaching padded inputs must then be exactly 0, as in the reference that never reads
them.

The modules cast to float32 for the recurrence (``.float()``, a mixed-precision guard), so a
float64 module fails with a dtype error; ``keep_float64`` lets ``.float()`` leave float64
tensors as they are for the block, and nothing else. The 1e-10 tolerance would catch any
step still run in float32 (~1e-7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from rcpipe.models.gated_rnn import BiGatedAttentionRNN, GatedAttentionRNN
from rcpipe.models.layers import reverse_padded
from rcpipe.models.rnet import CharGRU
from rcpipe.models.rnn import WEIGHTS, RNNWeights
from tests.models.test_rnet_recurrence import OpLog, masks

TOL = {"atol": 1e-10, "rtol": 1e-8}
F64 = torch.float64


class _KeepFloat64(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is Tensor.float and args[0].dtype == F64:
            return args[0]
        return func(*args, **(kwargs or {}))


@contextmanager
def keep_float64() -> Iterator[None]:
    """``x.float()`` returns a float64 x unchanged within the block (see the module doc)."""
    with _KeepFloat64():
        yield


def assert_all_close(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in got:
        assert got[name].dtype == F64, name
        torch.testing.assert_close(got[name], want[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


def gradients(out: Tensor, upstream: Tensor, leaves: dict[str, Tensor]) -> dict[str, Tensor]:
    """d(sum(out * upstream)) / d leaf for every leaf; a leaf the graph never reached is an
    error (allow_unused False): a reference that skipped a weight would not pass silently."""
    grads = torch.autograd.grad(out, list(leaves.values()), upstream)
    return dict(zip(leaves, grads, strict=True))


# ------------------------------------------------------------ the cells, as the papers write them


def gru_cell(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
             b_hh: Tensor) -> Tensor:
    """One GRU step (Cho et al. 2014, PyTorch's gate order r, z, n), x (Din,), h (H,) -> (H,):
    r = sigma(W_ir x + b_ir + W_hr h + b_hr), z = sigma(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) * n + z * h."""
    (w_ir, w_iz, w_in), (w_hr, w_hz, w_hn) = w_ih.chunk(3), w_hh.chunk(3)  # (H, Din), (H, H)
    (b_ir, b_iz, b_in), (b_hr, b_hz, b_hn) = b_ih.chunk(3), b_hh.chunk(3)  # (H,) each
    r = torch.sigmoid(w_ir @ x + b_ir + w_hr @ h + b_hr)
    z = torch.sigmoid(w_iz @ x + b_iz + w_hz @ h + b_hz)
    n = torch.tanh(w_in @ x + b_in + r * (w_hn @ h + b_hn))
    return (1 - z) * n + z * h


def lstm_cell(x: Tensor, state: tuple[Tensor, Tensor], w_ih: Tensor, w_hh: Tensor,
              b_ih: Tensor, b_hh: Tensor) -> tuple[Tensor, Tensor]:
    """One LSTM step (Hochreiter & Schmidhuber, PyTorch's gate order i, f, g, o):
    c' = f * c + i * g, h' = o * tanh(c'), each gate from W_i. x + b_i. + W_h. h + b_h."""
    h, c = state
    pre = [w_x @ x + b_x + w_h @ h + b_h for w_x, w_h, b_x, b_h in
           zip(w_ih.chunk(4), w_hh.chunk(4), b_ih.chunk(4), b_hh.chunk(4), strict=True)]
    i, f, o = torch.sigmoid(pre[0]), torch.sigmoid(pre[1]), torch.sigmoid(pre[3])
    g = torch.tanh(pre[2])
    c = f * c + i * g
    return o * torch.tanh(c), c


def run_cell(cell: str, xs: Tensor, weights: list[Tensor]) -> Tensor:
    """One direction of a GRU/LSTM over xs (L, Din) left to right from a zero state, a step at
    a time: (L, H)."""
    hidden = weights[1].size(1)
    h = c = xs.new_zeros(hidden)  # (H,)
    outs = []
    for x in xs:  # x: (Din,)
        if cell == "gru":
            h = gru_cell(x, h, *weights)
        else:
            h, c = lstm_cell(x, (h, c), *weights)
        outs.append(h)
    return torch.stack(outs)  # (L, H)


# --------------------------------------------- 1. R-Net's gated attention-based recurrence


def reference_gated(cell: GatedAttentionRNN, u_p: Tensor, u_q: Tensor) -> Tensor:
    """Eq. 3-4 of Wang et al. 2017 for one passage u_p (n, D) read left to right against its
    question u_q (m, D), real words only: v^P (n, H). At step t, from v^P_{t-1} (0 at t = 0):
    s_j = v^T tanh(W_u^Q u^Q_j + W_u^P u^P_t + W_v^P v^P_{t-1}), a_t = softmax(s),
    c_t = sum_j a_tj u^Q_j, g_t = sigmoid(W_g [u^P_t; c_t]),
    v^P_t = GRU(v^P_{t-1}, g_t * [u^P_t; c_t])."""
    w_uq, w_up, w_vp = cell.w_uq.weight, cell.w_up.weight, cell.w_vp.weight  # (A, D), (A, H)
    v = cell.v.weight.squeeze(0)  # (A,)
    w_g = cell.gate.w_g.weight  # (2D, 2D)
    gru = [cell.cell.weight_ih, cell.cell.weight_hh, cell.cell.bias_ih, cell.cell.bias_hh]
    v_p = u_p.new_zeros(cell.cell.hidden_size)  # v^P_0: (H,)
    outs = []
    for u_p_t in u_p:  # (D,)
        s = torch.stack([v @ torch.tanh(w_uq @ u_q_j + w_up @ u_p_t + w_vp @ v_p)
                         for u_q_j in u_q])  # (m,)
        a_t = torch.softmax(s, dim=0)  # (m,): over the question's real words alone
        c_t = a_t @ u_q  # (D,)
        x_t = torch.cat([u_p_t, c_t])  # (2D,)
        g_t = torch.sigmoid(w_g @ x_t)  # (2D,)
        v_p = gru_cell(g_t * x_t, v_p, *gru)  # (H,)
        outs.append(v_p)
    return torch.stack(outs)  # (n, H)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_gated_attention_has_the_per_step_equations_gradients(bidirectional: bool) -> None:
    """The loop in gated_rnn.py stacks both directions on a leading dim, hoists everything
    that does not depend on v^P_{t-1} (W_u^Q u^Q, W_u^P u^P, the u^P half of W_g) and fuses
    W_v^P with W_hh in one baddbmm: each a place where a transposed or swapped half would
    still train. Against eq. 3-4 step by step: outputs on the real words, and the gradients
    w.r.t. u^P, u^Q and all 9 weights of each direction."""
    torch.manual_seed(0)
    module = BiGatedAttentionRNN(4, 5, 3, bidirectional=bidirectional).double().eval()
    b, lc, lq, dim = 4, 7, 5, 4
    c_len, q_len = [7, 4, 1, 6], [5, 2, 1, 4]  # one-word passage and question in row 2
    c_mask, q_mask = masks(c_len, lc), masks(q_len, lq)  # (B, Lc), (B, Lq)
    u_p = torch.randn(b, lc, dim, dtype=F64, requires_grad=True)
    u_q = torch.randn(b, lq, dim, dtype=F64, requires_grad=True)
    # downstream masks the outputs past a passage's length: no gradient comes from there
    upstream = torch.randn(b, lc, module.dim, dtype=F64) * c_mask.unsqueeze(-1)  # (B, Lc, H')
    leaves = {"u_p": u_p, "u_q": u_q} | dict(module.named_parameters())
    assert len(leaves) == 2 + (18 if bidirectional else 9)

    with keep_float64():
        out = module(u_p, c_mask, u_q, q_mask)  # (B, Lc, 2H or H)
    got = {"v_p": (out * c_mask.unsqueeze(-1)).detach()} | gradients(out, upstream, leaves)

    rows = []
    for i, (n, m) in enumerate(zip(c_len, q_len, strict=True)):
        p, q = u_p[i, :n], u_q[i, :m]  # (n, D), (m, D): the real words alone
        directions = [reference_gated(module.fwd, p, q)]  # (n, H)
        if module.bwd is not None:  # reads the passage from its last real word back
            directions.append(reference_gated(module.bwd, p.flip(0), q).flip(0))  # (n, H)
        rows.append(F.pad(torch.cat(directions, dim=-1), (0, 0, 0, lc - n)))  # (Lc, H')
    ref = torch.stack(rows)  # (B, Lc, H'), 0 past each length
    want = {"v_p": ref.detach()} | gradients(ref, upstream, leaves)

    assert_all_close(got, want)
    # padding is never read on the way to a real position: exactly no gradient reaches it
    assert (got["u_p"][~c_mask] == 0).all() and (got["u_q"][~q_mask] == 0).all()


# --------------------------------------------------- 2. rcpipe::rnn's recomputing backward


def op_direction(rnn: RNNWeights, x: Tensor, suffix: str) -> Tensor:
    """What RNNWeights runs under torch.compile, called eagerly: (B, L, H)."""
    return torch.ops.rcpipe.rnn(x, *(getattr(rnn, w + suffix) for w in WEIGHTS), rnn.cell)


def fused_direction(rnn: RNNWeights, x: Tensor, suffix: str) -> Tensor:
    """The eager path: torch.gru / torch.lstm, differentiated by autograd: (B, L, H)."""
    return rnn(x, suffix)


def bidirectional(direction: Callable[[RNNWeights, Tensor, str], Tensor], rnn: RNNWeights,
                  x: Tensor, mask: Tensor) -> Tensor:
    """A BiRNN layer as layers.BiRNN and CharGRU run one, without packing: the forward
    direction on the padded batch, the backward one on each row reversed within its length,
    zeros on padding: (B, L, 2H)."""
    lengths = mask.sum(1)  # (B,)
    y_f = direction(rnn, x, "")  # (B, L, H)
    y_b = reverse_padded(direction(rnn, reverse_padded(x, lengths), "_reverse"), lengths)
    return torch.cat([y_f, y_b], dim=-1) * mask.unsqueeze(-1)  # (B, L, 2H)


@pytest.mark.parametrize("path", ["op", "fused"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_rnn_op_recomputing_backward_is_autograd_of_the_cell_equations(
        cell: str, path: str) -> None:
    """rcpipe::rnn's backward is not autograd's record of the forward: rnn_backward reruns
    the fused kernel with autograd on and differentiates that (the kernel's saved state
    cannot leave an op). A wrong argument order, a stale input or a gradient returned for
    the wrong weight would still run; against the GRU/LSTM cell equations step by step,
    both directions over padded rows: outputs, and gradients w.r.t. the input and the 8
    weights and biases (the state starts at zero: there is no initial state to feed). The
    eager fused path is held to the same reference alongside."""
    torch.manual_seed(0)
    rnn = RNNWeights(cell, 3, 4, bidirectional=True).double()
    b, steps, lengths = 4, 6, [6, 3, 1, 5]
    mask = masks(lengths, steps)  # (B, L)
    x = torch.randn(b, steps, 3, dtype=F64, requires_grad=True)
    upstream = torch.randn(b, steps, 8, dtype=F64)  # (B, L, 2H)
    leaves = {"x": x} | dict(rnn.named_parameters())
    assert len(leaves) == 1 + 8

    direction = op_direction if path == "op" else fused_direction
    with OpLog() as log:
        out = bidirectional(direction, rnn, x, mask)  # (B, L, 2H)
        got = {"out": out.detach()} | gradients(out, upstream, leaves)
    # the op path did differentiate through the recompute, the fused one through autograd
    assert ("rcpipe.rnn_backward.default" in log.ops) == (path == "op")

    fwd = [getattr(rnn, w) for w in WEIGHTS]
    bwd = [getattr(rnn, w + "_reverse") for w in WEIGHTS]
    rows = []
    for i, n in enumerate(lengths):
        both = torch.cat([run_cell(cell, x[i, :n], fwd),  # (n, H)
                          run_cell(cell, x[i, :n].flip(0), bwd).flip(0)], dim=-1)  # (n, 2H)
        rows.append(F.pad(both, (0, 0, 0, steps - n)))  # (L, 2H)
    ref = torch.stack(rows)  # (B, L, 2H)
    want = {"out": ref.detach()} | gradients(ref, upstream, leaves)

    assert_all_close(got, want)
    assert (got["x"][~mask] == 0).all()  # padding reaches no real output in either direction


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_rnn_op_passes_gradcheck(cell: str) -> None:
    """Finite differences, independent of any autograd formula: the recomputing backward's
    Jacobian-vector products against numerical derivatives of the op itself."""
    torch.manual_seed(0)
    rnn = RNNWeights(cell, 2, 2).double()
    args = (torch.randn(2, 3, 2, dtype=F64, requires_grad=True),
            *(p.detach().clone().requires_grad_() for p in rnn.parameters()))
    assert torch.autograd.gradcheck(lambda *a: torch.ops.rcpipe.rnn(*a, cell), args)


# -------------------------------------------------------------------------- 3. CharGRU


def reference_char_gru(module: CharGRU, chars: Tensor) -> Tensor:
    """Each word's real chars alone through the BiGRU, a step at a time: the forward final
    state (after its last char) and the backward one (after its first, reading back),
    concatenated; 0 for a word without chars. chars (B, L, W) -> (B, L, 2H)."""
    emb, rnn = module.emb.weight, module.rnn
    fwd = [getattr(rnn, w) for w in WEIGHTS]
    bwd = [getattr(rnn, w + "_reverse") for w in WEIGHTS]
    words = []
    for word in chars.reshape(-1, chars.size(-1)):  # (W,)
        real = word[word != 0]  # (n,): left-aligned, 0 = pad
        if real.numel() == 0:
            words.append(emb.new_zeros(module.dim))
            continue
        x = emb[real]  # (n, E)
        words.append(torch.cat([run_cell("gru", x, fwd)[-1],
                                run_cell("gru", x.flip(0), bwd)[-1]]))  # (2H,)
    return torch.stack(words).view(*chars.shape[:2], module.dim)  # (B, L, 2H)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_char_gru_has_the_per_word_recurrences_gradients(mode: str) -> None:
    """CharGRU runs every word the full char width W and picks each direction's state at the
    word's last char: padding chars do run through the GRU, after the real ones. Against
    each word's real chars alone: outputs and the gradients w.r.t. the char embeddings
    (emb.weight) and the 8 GRU weights. The padding char's embedding row is made nonzero, so
    a padding char leaking into a final state would show."""
    torch.manual_seed(0)
    module = CharGRU(20, 4, 3).double().train(mode == "train")
    with torch.no_grad():
        module.emb.weight[0] = torch.randn(4, dtype=F64)  # padding_idx's row, never a real char
    width = 6
    lengths = torch.tensor([[6, 1, 3, 0], [0, 0, 0, 0], [2, 5, 4, 0]])  # row 1: padding only
    chars = torch.randint(1, 20, (3, 4, width))
    chars = chars * (torch.arange(width) < lengths.unsqueeze(-1))  # (B, L, W) left-aligned
    upstream = torch.randn(3, 4, module.dim, dtype=F64)  # (B, L, 2H)
    leaves = dict(module.named_parameters())
    assert len(leaves) == 1 + 8

    with keep_float64():
        out = module(chars)  # (B, L, 2H)
    got = {"out": out.detach()} | gradients(out, upstream, leaves)
    ref = reference_char_gru(module, chars)  # (B, L, 2H)
    want = {"out": ref.detach()} | gradients(ref, upstream, leaves)

    assert_all_close(got, want)
    assert (got["out"][lengths == 0] == 0).all()  # a word without chars gives exactly 0
    assert (got["emb.weight"][0] == 0).all()  # and no char's gradient reaches the pad row
