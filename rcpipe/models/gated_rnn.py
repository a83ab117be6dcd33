"""R-Net's gated attention-based recurrent network (Wang et al. 2017, eq. 3-4): question-
passage matching, attention recomputed from v^P_{t-1} at every passage step.

Both directions advance together: one loop over the passage steps in which step t moves the
forward direction to position t and the backward direction to position t of each passage
reversed within its length, their weights stacked along a leading direction dim so that a
step is one set of (D, B, ...) batched matmuls and pointwise ops whatever D is (1 or 2).
Each direction keeps its own module (``fwd``, ``bwd``) and parameter names, so saved models
load as before; the stacking is a handful of torch.stack/cat per forward, not per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from rcpipe.models.layers import (
    NEG_INF,
    MatchGate,
    VariationalDropout,
    at_least_float32,
    capturing,
    float32_recurrence,
    keep_attention,
    reverse_padded,
)


class GatedAttentionRNN(nn.Module):
    """One direction's weights (eq. 3-4): at step t,
    s_j = v^T tanh(W_u^Q u^Q_j + W_u^P u^P_t + W_v^P v^P_{t-1}), c_t = softmax(s) u^Q,
    v^P_t = GRU(v^P_{t-1}, g_t * [u^P_t; c_t]) with g_t = sigmoid(W_g [u^P_t; c_t]).

    Its forward runs this direction alone on the passage as given; BiGatedAttentionRNN
    runs two of them in one loop (``gated_attention``), and owns the dropout of both.
    """

    # its recurrence is a Python loop over the passage's steps: a trace (torch.export, so
    # `rcpipe export`) unrolls it for one passage length, which trained/onnx.py refuses
    steps_in_python = True

    def __init__(self, dim: int, attn_dim: int, hidden: int) -> None:
        super().__init__()
        self.w_uq = nn.Linear(dim, attn_dim, bias=False)  # W_u^Q
        self.w_up = nn.Linear(dim, attn_dim, bias=False)  # W_u^P
        self.w_vp = nn.Linear(hidden, attn_dim, bias=False)  # W_v^P
        self.v = nn.Linear(attn_dim, 1, bias=False)
        self.gate = MatchGate(2 * dim)
        self.cell = nn.GRUCell(2 * dim, hidden)
        self.dim = hidden

    def forward(self, u_p: torch.Tensor, c_mask: torch.Tensor, u_q: torch.Tensor,
                q_mask: torch.Tensor) -> torch.Tensor:
        return gated_attention((self,), u_p.unsqueeze(0), u_q, q_mask)[0]  # (B, Lc, H)


class BiGatedAttentionRNN(nn.Module):
    """Question-passage matching in both directions (the R-Net report, section 4.1): one
    gated attention-based recurrence reads the passage forward, another (its own weights)
    reads it backward, and their states are concatenated, (B, Lc, 2H). ``bidirectional``
    False keeps the forward one alone (section 3.2's formulation), (B, Lc, H)."""

    def __init__(self, dim: int, attn_dim: int, hidden: int, dropout: float = 0.0,
                 bidirectional: bool = True) -> None:
        super().__init__()
        self.fwd = GatedAttentionRNN(dim, attn_dim, hidden)
        self.bwd = GatedAttentionRNN(dim, attn_dim, hidden) if bidirectional else None
        self.drop = VariationalDropout(dropout)  # one mask, shared by both directions
        self.dim = hidden * (2 if bidirectional else 1)

    def forward(self, u_p: torch.Tensor, c_mask: torch.Tensor, u_q: torch.Tensor,
                q_mask: torch.Tensor) -> torch.Tensor:
        u_p, u_q = self.drop(u_p), self.drop(u_q)
        if self.bwd is None:
            return self.fwd(u_p, c_mask, u_q, q_mask)  # (B, Lc, H)
        lengths = c_mask.sum(1).clamp(min=1)  # (B,)
        # the backward direction reads each row reversed within its length: its padding
        # stays after the real steps, so (being later in time) it never reaches them
        both = torch.stack([u_p, reverse_padded(u_p, lengths)])  # (2, B, Lc, D)
        v_p = gated_attention((self.fwd, self.bwd), both, u_q, q_mask)  # (2, B, Lc, H)
        return torch.cat([v_p[0], reverse_padded(v_p[1], lengths)], dim=-1)  # (B, Lc, 2H)


class _StepWeights(NamedTuple):
    """The weights a step uses, the directions stacked on dim 0, laid out for bmm."""

    w_h: torch.Tensor  # (D, H, A + 3H): [W_v^P; W_hh]^T, everything that multiplies v_{t-1}
    v: torch.Tensor  # (D, 1, 1, A)
    w_gc: torch.Tensor  # (D, Din, 2Din): the c_t half of W_g, transposed
    w_ih: torch.Tensor  # (D, 2Din, 3H)
    b_ih: torch.Tensor  # (D, 1, 3H)


def gated_attention(cells: Sequence[GatedAttentionRNN], u_p: torch.Tensor, u_q: torch.Tensor,
                    q_mask: torch.Tensor) -> torch.Tensor:
    """v^P of each direction d (cells[d]'s weights) over its own passage u_p[d]: (D, B, Lc, H)
    from u_p (D, B, Lc, Din), u_q (B, Lq, Din). Runs in float32 (latency-bound small ops:
    it costs nothing) and returns u_p's dtype. Steps past a row's length run on padding
    and are masked downstream."""
    dtype = u_p.dtype
    with float32_recurrence(u_p):
        u_p, u_q = at_least_float32(u_p), at_least_float32(u_q)
        d, b, lc, dim = u_p.shape
        lq = u_q.size(1)
        # everything that does not depend on v_{t-1}, computed once, time-major so that each
        # step's slice is contiguous
        keys = torch.stack([c.w_uq(u_q) for c in cells])  # (D, B, Lq, A)
        passage = torch.stack([c.w_up(u_p[i]) for i, c in enumerate(cells)])  # (D, B, Lc, A)
        b_hh = torch.stack([c.cell.bias_hh for c in cells])  # (D, 3H)
        h_bias = b_hh[:, None, None, :].expand(-1, b, lc, -1)  # (D, B, Lc, 3H)
        h_add = torch.cat([passage, h_bias], dim=-1).permute(2, 0, 1, 3)  # (Lc, D, B, A+3H)
        gate_u = torch.stack([F.linear(u_p[i], c.gate.w_g.weight[:, :dim])
                              for i, c in enumerate(cells)])  # (D, B, Lc, 2Din): W_g's u half
        memory = u_q.expand(d, b, lq, dim).reshape(d * b, lq, dim)  # (D*B, Lq, Din)
        weights = _StepWeights(
            w_h=torch.cat([torch.stack([c.w_vp.weight for c in cells]),
                           torch.stack([c.cell.weight_hh for c in cells])],
                          dim=1).transpose(1, 2),  # (D, H, A + 3H)
            v=torch.stack([c.v.weight for c in cells]).unsqueeze(1),  # (D, 1, 1, A)
            w_gc=torch.stack([c.gate.w_g.weight[:, dim:] for c in cells]).transpose(1, 2),
            w_ih=torch.stack([c.cell.weight_ih for c in cells]).transpose(1, 2),
            b_ih=torch.stack([c.cell.bias_ih for c in cells]).unsqueeze(1))  # (D, 1, 3H)
        steps = (h_add.contiguous(), gate_u.permute(2, 0, 1, 3).contiguous(),
                 u_p.permute(2, 0, 1, 3).contiguous())  # (Lc, D, B, ...) each
    # outside the autocast block: a graph break inside a context manager would break the
    # whole frame under torch.compile; _recurrence turns autocast off itself
    keep = capturing(cells[0])  # explain: the per-step question weights
    v_p, attention = _recurrence(*steps, keys, memory, ~q_mask, weights, keep)
    if attention is not None:
        for i, c in enumerate(cells):
            keep_attention(c, "question", attention[i])  # (B, Lc, Lq)
    return v_p.to(dtype)


# R-Net's gated attention recurrence: the one place torch.compile may not trace, the graph
# break allowed by design. The loop runs Lc (up to 400) dependent steps: unrolled, the
# compiled graph would hold hundreds of copies of the step, slow to compile and compiled
# again for every passage length. All around it (the hoisted projections, the rest of R-Net)
# compiles as usual.
@torch.compiler.disable(reason="R-Net's gated attention recurrence: a loop over Lc steps")
def _recurrence(h_add: torch.Tensor, gate_u: torch.Tensor, u_p: torch.Tensor,
                keys: torch.Tensor, memory: torch.Tensor, q_pad: torch.Tensor,
                w: _StepWeights, keep: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The loop over passage steps, all directions at once: h_add (Lc, D, B, A+3H) is
    W_u^P u^P_t with b_hh beside it, gate_u (Lc, D, B, 2Din), u_p (Lc, D, B, Din), keys
    (D, B, Lq, A), memory (D*B, Lq, Din) = u^Q per direction, q_pad (B, Lq) True on padding.
    Returns v^P (D, B, Lc, H) and, if ``keep``, the attention (D, B, Lc, Lq)."""
    d, b, dim = keys.size(0), keys.size(1), u_p.size(-1)
    lq, attn, hidden = keys.size(2), keys.size(3), w.w_h.size(1)
    h = u_p.new_zeros(d, b, hidden)  # (D, B, H)
    outs, seen = [], []
    with float32_recurrence(h):
        # unbind, not [t]: each slice's backward would write a zero tensor the size of the
        # whole sequence, O(Lc^2) work; unbind's backward is one stack
        steps = zip(h_add.unbind(0), gate_u.unbind(0), u_p.unbind(0), strict=True)
        for h_add_t, gate_u_t, u_p_t in steps:
            # one bmm for all that multiplies v_{t-1}: the attention query and the GRU's W_hh
            query, gh = torch.baddbmm(h_add_t, h, w.w_h).split([attn, 3 * hidden], dim=-1)
            e = torch.tanh(keys + query.unsqueeze(2))  # (D, B, Lq, A)
            # v^T e as a product and a sum, not a bmm: on the CPU a bmm with one output
            # column (and its backward) costs twice as much
            s = (e * w.v).sum(-1)  # (D, B, Lq)
            a = F.softmax(s.masked_fill(q_pad, NEG_INF), dim=-1)  # (D, B, Lq): masked_softmax
            if keep:
                seen.append(a)
            c = torch.bmm(a.view(d * b, 1, lq), memory).view(d, b, dim)  # (D, B, Din)
            g = torch.sigmoid(torch.baddbmm(gate_u_t, c, w.w_gc))  # (D, B, 2Din)
            gi = torch.baddbmm(w.b_ih, g * torch.cat([u_p_t, c], dim=-1), w.w_ih)  # (D, B, 3H)
            # the GRU cell written out, gates as nn.GRUCell computes them
            i_rz, i_n = gi.split([2 * hidden, hidden], dim=-1)
            h_rz, h_n = gh.split([2 * hidden, hidden], dim=-1)
            r, z = torch.sigmoid(i_rz + h_rz).chunk(2, dim=-1)  # (D, B, H) each
            n = torch.tanh(i_n + r * h_n)  # (D, B, H)
            h = torch.lerp(n, h, z)  # (1 - z) * n + z * h: (D, B, H)
            outs.append(h)
    attention = torch.stack(seen, dim=2) if keep else None  # (D, B, Lc, Lq)
    return torch.stack(outs, dim=2), attention  # (D, B, Lc, H)
