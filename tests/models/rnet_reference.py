"""R-Net's recurrences as they stood before they were batched (git 38a6af0's rnet.py,
verbatim): the gated attention directions one after the other, CharGRU packed. The
reference tests/models/test_rnet_recurrence.py holds them to (the same weights give the same
outputs and gradients); the bench that timed the two (bench/rnet_recurrence.py) was removed
after 8c924ea, its figures in docs/results/speed.md. Not in rcpipe/, which ships: rcpipe runs
none of it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils._python_dispatch import TorchDispatchMode

from rcpipe.models.layers import (
    MatchGate,
    VariationalDropout,
    capturing,
    float32_recurrence,
    keep_attention,
    masked_softmax,
    reverse_padded,
)

# ------------------------------------------------ the reference: git 38a6af0's rnet.py, verbatim


class OldCharGRU(nn.Module):
    """R-Net's char embedding: a BiGRU over each word's chars, final states concatenated."""

    def __init__(self, vocab_size: int, char_dim: int, hidden: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, char_dim, padding_idx=0)
        self.rnn = nn.GRU(char_dim, hidden, batch_first=True, bidirectional=True)
        self.dim = 2 * hidden

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        b, n, w = chars.shape
        flat = chars.reshape(b * n, w)  # (B*L, W)
        lengths = (flat != 0).sum(dim=1)  # (B*L,) chars are left-aligned, 0 = pad
        real = lengths > 0
        out = self.emb.weight.new_zeros(b * n, self.dim)  # (B*L, 2H): padding tokens stay 0
        n_real = int(real.sum())
        if n_real:
            # only real words go through the GRU: a third of a bucketed batch can be padding
            packed = pack_padded_sequence(self.emb(flat[real]), lengths[real].cpu(),
                                          batch_first=True, enforce_sorted=False)
            with float32_recurrence(out):
                _, h_n = self.rnn(packed)  # (2, N, H): forward and backward final states
            out[real] = torch.cat([h_n[0], h_n[1]], dim=-1)  # (N, 2H)
        return out.view(b, n, self.dim)  # (B, L, 2H)


class OldGatedAttentionRNN(nn.Module):
    """Question-passage matching (eq. 3-4): at step t,
    s_j = v^T tanh(W_u^Q u^Q_j + W_u^P u^P_t + W_v^P v^P_{t-1}), c_t = softmax(s) u^Q,
    v^P_t = GRU(v^P_{t-1}, g_t * [u^P_t; c_t]) with g_t = sigmoid(W_g [u^P_t; c_t]).

    One direction (BiGatedAttentionRNN runs two). Everything that does not depend on v^P_{t-1}
    (W_u^Q u^Q, W_u^P u^P and the u^P half of the gate) is computed once, outside the loop,
    so a step is a (B, Lq, A) tanh, a softmax, a bmm and a GRUCell.
    """

    def __init__(self, dim: int, attn_dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.w_uq = nn.Linear(dim, attn_dim, bias=False)  # W_u^Q
        self.w_up = nn.Linear(dim, attn_dim, bias=False)  # W_u^P
        self.w_vp = nn.Linear(hidden, attn_dim, bias=False)  # W_v^P
        self.v = nn.Linear(attn_dim, 1, bias=False)
        self.gate = MatchGate(2 * dim)
        self.cell = nn.GRUCell(2 * dim, hidden)
        self.drop = VariationalDropout(dropout)
        self.dim = hidden

    def forward(self, u_p: torch.Tensor, c_mask: torch.Tensor, u_q: torch.Tensor,
                q_mask: torch.Tensor) -> torch.Tensor:
        dtype = u_p.dtype
        # a GRUCell and a few small ops per step: latency-bound, so float32 costs nothing
        with float32_recurrence(u_p):
            return self._recur(u_p.float(), c_mask, u_q.float(), q_mask).to(dtype)

    def _recur(self, u_p: torch.Tensor, c_mask: torch.Tensor, u_q: torch.Tensor,
               q_mask: torch.Tensor) -> torch.Tensor:
        u_p, u_q = self.drop(u_p), self.drop(u_q)
        b, lc, dim = u_p.shape
        keys = self.w_uq(u_q)  # (B, Lq, A)
        passage = self.w_up(u_p)  # (B, Lc, A)
        w_g = self.gate.w_g.weight  # (2D, 2D) acting on [u^P_t; c_t]
        gate_p = F.linear(u_p, w_g[:, :dim])  # (B, Lc, 2D): the u^P_t half of W_g [u; c]
        w_g_c = w_g[:, dim:]  # (2D, D): the c_t half, applied inside the loop
        v_weight = self.v.weight.squeeze(0)  # (A,)
        h = u_p.new_zeros(b, self.dim)  # (B, H)
        outs = []
        weights: list[torch.Tensor] | None = [] if capturing(self) else None  # for explain
        # unbind, not [:, t]: each slice's backward would write a zero tensor the size of
        # the whole sequence, O(Lc^2) work; unbind's backward is one stack
        steps = zip(passage.unbind(1), gate_p.unbind(1), u_p.unbind(1), strict=True)
        for passage_t, gate_p_t, u_p_t in steps:  # (B, A), (B, 2D), (B, D)
            query = passage_t + self.w_vp(h)  # (B, A)
            s = torch.tanh(keys + query.unsqueeze(1)) @ v_weight  # (B, Lq)
            a = masked_softmax(s, q_mask)  # (B, Lq)
            if weights is not None:
                weights.append(a)
            c = torch.bmm(a.unsqueeze(1), u_q).squeeze(1)  # (B, D)
            g = torch.sigmoid(gate_p_t + F.linear(c, w_g_c))  # (B, 2D)
            h = self.cell(g * torch.cat([u_p_t, c], dim=-1), h)  # (B, H)
            outs.append(h)
        if weights is not None:
            keep_attention(self, "question", torch.stack(weights, dim=1))  # (B, Lc, Lq)
        # steps past a row's length run on padding but, being later in time, never reach
        # its real positions; their outputs are masked downstream
        return torch.stack(outs, dim=1)  # (B, Lc, H)


class OldBiGatedAttentionRNN(nn.Module):
    """Question-passage matching in both directions (the R-Net report, section 4.1): one
    gated attention-based recurrence reads the passage forward, another (its own weights)
    reads it backward, and their states are concatenated, (B, Lc, 2H). ``bidirectional``
    False keeps the forward one alone (section 3.2's formulation), (B, Lc, H)."""

    def __init__(self, dim: int, attn_dim: int, hidden: int, dropout: float = 0.0,
                 bidirectional: bool = True) -> None:
        super().__init__()
        self.fwd = OldGatedAttentionRNN(dim, attn_dim, hidden)
        self.bwd = OldGatedAttentionRNN(dim, attn_dim, hidden) if bidirectional else None
        self.drop = VariationalDropout(dropout)  # one mask, shared by both directions
        self.dim = hidden * (2 if bidirectional else 1)

    def forward(self, u_p: torch.Tensor, c_mask: torch.Tensor, u_q: torch.Tensor,
                q_mask: torch.Tensor) -> torch.Tensor:
        u_p, u_q = self.drop(u_p), self.drop(u_q)
        v_p = self.fwd(u_p, c_mask, u_q, q_mask)  # (B, Lc, H)
        if self.bwd is None:
            return v_p
        lengths = c_mask.sum(1).clamp(min=1)  # (B,)
        # each row reversed within its length: padding stays after the real steps
        back = self.bwd(reverse_padded(u_p, lengths), c_mask, u_q, q_mask)  # (B, Lc, H)
        return torch.cat([v_p, reverse_padded(back, lengths)], dim=-1)  # (B, Lc, 2H)


# ----------------------------------------------------------------------------- helpers


class OpLog(TorchDispatchMode):
    """Every aten op dispatched inside the block (below autograd: forward and backward
    kernels alike), and those whose output is data-dependent: a host sync or a shape only
    known once the data is (torch.compile and CUDA graphs cannot capture them)."""

    SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default}
    TAGS = {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.views = 0  # of them, views: no kernel, no copy
        self.data_dependent: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func)
        self.ops.append(name)
        self.views += func.is_view
        if func in self.SYNCS or self.TAGS & set(func.tags):
            self.data_dependent.append(name)
        return func(*args, **(kwargs or {}))


def with_reference_recurrences(model: nn.Module) -> nn.Module:
    """A copy of an R-Net with the reference CharGRU and gated attention, its weights."""
    old = copy.deepcopy(model)
    emb, qm = model.char_emb, model.question_matching
    old.char_emb = OldCharGRU(emb.emb.num_embeddings, emb.emb.embedding_dim,
                              emb.rnn.hidden_size)
    cell = qm.fwd
    old.question_matching = OldBiGatedAttentionRNN(
        cell.w_uq.in_features, cell.w_uq.out_features, cell.cell.hidden_size, qm.drop.p,
        qm.bwd is not None)
    old.load_state_dict(model.state_dict())  # the same keys: saved models load
    return old.train(model.training)

