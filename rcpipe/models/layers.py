"""Blocks shared by the model families, and the output convention every model follows.

Every model's forward(batch) returns ``SpanLogits``: start/end logits over the context
tokens with padding masked out, plus, for SQuAD v2.0, a learned no-answer logit that
competes with the positions in the same softmax (index 0 of ``log_probs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

NEG_INF = -1e30  # finite: a fully masked row stays NaN-free


def mask_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Padding positions get NEG_INF so softmax gives them exactly 0."""
    return logits.masked_fill(~mask, NEG_INF)


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return F.softmax(mask_logits(logits.float(), mask), dim=dim).to(logits.dtype)


# ------------------------------------------------------------------------------ the output


@dataclass
class SpanLogits:
    start: torch.Tensor  # (B, Lc), NEG_INF on padding
    end: torch.Tensor  # (B, Lc)
    na: torch.Tensor | None = None  # (B, 2): no-answer logits for the start and end softmax

    def log_probs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """log p_start, log p_end over [no-answer, token 0 .. Lc-1]: (B, 1 + Lc) each.

        Without a no-answer logit (SQuAD v1.1) index 0 has probability 0.
        """
        b = self.start.size(0)
        na = self.na if self.na is not None else self.start.new_full((b, 2), NEG_INF)
        start = torch.cat([na[:, :1], self.start], dim=1).float()  # (B, 1 + Lc)
        end = torch.cat([na[:, 1:], self.end], dim=1).float()  # (B, 1 + Lc)
        return F.log_softmax(start, dim=1), F.log_softmax(end, dim=1)


def span_loss(out: SpanLogits, y1: torch.Tensor, y2: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on start and end; y = -1 (no answer) targets index 0, the na logit."""
    log_p1, log_p2 = out.log_probs()
    return F.nll_loss(log_p1, y1 + 1) + F.nll_loss(log_p2, y2 + 1)


class NoAnswerHead(nn.Module):
    """The no-answer logits from an attention-pooled summary of the context (v2.0 only)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.pool = nn.Linear(dim, 1)
        self.out = nn.Linear(dim, 2)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        a = masked_softmax(self.pool(h).squeeze(-1), mask)  # (B, Lc)
        summary = torch.bmm(a.unsqueeze(1), h).squeeze(1)  # (B, D)
        return self.out(summary)  # (B, 2)


# ------------------------------------------------------------------------------ embeddings


class WordEmbedding(nn.Module):
    """Word vectors: pretrained (frozen unless fine-tuned) or trainable from scratch."""

    def __init__(self, vocab_size: int, dim: int, vectors: np.ndarray | None = None,
                 trainable: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim, padding_idx=0)
        if vectors is not None:
            if vectors.shape != (vocab_size, dim):
                raise ValueError(f"vectors {vectors.shape} != ({vocab_size}, {dim})")
            self.emb.weight.data.copy_(torch.from_numpy(vectors))
            self.emb.weight.requires_grad = trainable
        self.dim = dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids)  # (B, L, dim)


class CharCNN(nn.Module):
    """Char embeddings -> 1D conv over each word's chars -> max over chars (BiDAF, QANet)."""

    def __init__(self, vocab_size: int, char_dim: int, filters: int, kernel: int,
                 dropout: float) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, char_dim, padding_idx=0)
        self.conv = nn.Conv1d(char_dim, filters, kernel, padding=kernel // 2)
        self.drop = nn.Dropout(dropout)
        self.dim = filters

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        b, n, w = chars.shape
        x = self.drop(self.emb(chars.view(b * n, w)))  # (B*L, W, char_dim)
        x = F.relu(self.conv(x.transpose(1, 2)))  # (B*L, filters, W)
        x = x.masked_fill((chars.view(b * n, 1, w) == 0), 0.0)  # padding chars never win
        return x.max(dim=2).values.view(b, n, -1)  # (B, L, filters)


class Highway(nn.Module):
    """y = g * relu(W x) + (1 - g) * x, g = sigmoid(W_g x) (Srivastava et al.)."""

    def __init__(self, dim: int, layers: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.transform = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.gate = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for t, g in zip(self.transform, self.gate, strict=True):
            gate = torch.sigmoid(g(x))
            x = gate * self.drop(F.relu(t(x))) + (1 - gate) * x
        return x


# ----------------------------------------------------------------------------- recurrence


class VariationalDropout(nn.Module):
    """One dropout mask per sequence, the same at every step (Gal & Ghahramani; R-Net)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = x.new_empty(x.size(0), 1, x.size(2)).bernoulli_(1 - self.p)  # (B, 1, D)
        return x * keep / (1 - self.p)


class BiRNN(nn.Module):
    """Stacked bidirectional GRU/LSTM over padded sequences (packed: padding never leaks
    into the backward direction), variational dropout on each layer's input."""

    def __init__(self, input_dim: int, hidden: int, layers: int = 1, dropout: float = 0.0,
                 cell: str = "gru", concat_layers: bool = False) -> None:
        super().__init__()
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
        self.rnns = nn.ModuleList(
            rnn(input_dim if i == 0 else 2 * hidden, hidden, batch_first=True,
                bidirectional=True)
            for i in range(layers)
        )
        self.drop = VariationalDropout(dropout)
        self.concat_layers = concat_layers
        self.dim = 2 * hidden * (layers if concat_layers else 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(1).clamp(min=1).cpu()
        outs = []
        for rnn in self.rnns:
            packed = pack_padded_sequence(self.drop(x), lengths, batch_first=True,
                                          enforce_sorted=False)
            y, _ = rnn(packed)
            x, _ = pad_packed_sequence(y, batch_first=True, total_length=mask.size(1))
            outs.append(x)  # (B, L, 2H)
        return torch.cat(outs, dim=-1) if self.concat_layers else x


# ------------------------------------------------------------------------------ attention


class TrilinearAttention(nn.Module):
    """Context-query attention of BiDAF (Seo et al.) and QANet (Yu et al.).

    S_ij = w^T [c_i; q_j; c_i * q_j] computed without the (B, Lc, Lq, 3D) tensor.
    Returns G = [c; c2q; c * c2q; c * q2c] (B, Lc, 4D). ``q2c`` is BiDAF's (max over the
    query, attend over the context, tiled) or DCN's (Xiong et al.), as QANet uses it.
    """

    def __init__(self, dim: int, q2c: str = "bidaf") -> None:
        super().__init__()
        if q2c not in ("bidaf", "dcn"):
            raise ValueError(f"q2c must be bidaf or dcn, not {q2c}")
        self.w_c = nn.Linear(dim, 1, bias=False)
        self.w_q = nn.Linear(dim, 1, bias=False)
        self.w_cq = nn.Parameter(torch.empty(1, 1, dim).uniform_(-1 / math.sqrt(dim),
                                                                 1 / math.sqrt(dim)))
        self.bias = nn.Parameter(torch.zeros(1))
        self.q2c = q2c

    def forward(self, c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor,
                q_mask: torch.Tensor) -> torch.Tensor:
        s = (self.w_c(c)  # (B, Lc, 1)
             + self.w_q(q).transpose(1, 2)  # (B, 1, Lq)
             + torch.bmm(c * self.w_cq, q.transpose(1, 2))  # (B, Lc, Lq)
             + self.bias)
        a = masked_softmax(s, q_mask.unsqueeze(1), dim=2)  # (B, Lc, Lq) over the query
        c2q = torch.bmm(a, q)  # (B, Lc, D)
        if self.q2c == "bidaf":
            best = mask_logits(s, q_mask.unsqueeze(1)).max(dim=2).values  # (B, Lc)
            b = masked_softmax(best, c_mask)  # (B, Lc)
            q2c = torch.bmm(b.unsqueeze(1), c).expand_as(c)  # (B, Lc, D)
        else:
            b = masked_softmax(s, c_mask.unsqueeze(2), dim=1)  # (B, Lc, Lq) over the context
            q2c = torch.bmm(torch.bmm(a, b.transpose(1, 2)), c)  # (B, Lc, D)
        return torch.cat([c, c2q, c * c2q, c * q2c], dim=-1)  # (B, Lc, 4D)


def count_parameters(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """Trainable parameters; optionally without embedding tables (as the papers count)."""
    skip = set()
    if exclude_embeddings:
        skip = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in model.parameters() if p.requires_grad and id(p) not in skip)
