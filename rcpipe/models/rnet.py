"""R-Net (Wang et al. 2017, "R-Net: machine reading comprehension with self-matching
networks", MSRA technical report) and a multiplicative-attention variant (``rnet_mult``).

R-Net: word vectors + char BiGRU final states -> shared multi-layer BiGRU encoder (u^Q, u^P)
-> gated attention-based recurrent network (v^P: question-passage matching, attention
recomputed from v^P_{t-1} at every step; both directions in one loop, gated_rnn.py) ->
self-matching layer (h^P, see layers.SelfMatching) -> the March 2017 report's extra BiGRU
over h^P -> pointer network initialised with the attention-pooled question r^Q.

rnet_mult replaces both additive attentions by multiplicative scores computed outside any
recurrence, tanh(W_1 x) tanh(W_2 y)^T, so each matching layer is one batched matmul, a gate
and a fused BiGRU: no Python loop over time steps.
"""

from __future__ import annotations

import torch
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.models import ModelInputs
from rcpipe.models.batch import Batch
from rcpipe.models.embeddings import WordEmbedding, chars_per_word
from rcpipe.models.gated_rnn import BiGatedAttentionRNN
from rcpipe.models.gated_rnn import GatedAttentionRNN as GatedAttentionRNN  # re-exported
from rcpipe.models.layers import (
    BiRNN,
    MatchGate,
    NoAnswerHead,
    SelfMatching,
    SpanLogits,
    VariationalDropout,
    at_least_float32,
    float32_recurrence,
    keep_attention,
    mask_logits,
    masked_softmax,
    reverse_padded,
)
from rcpipe.models.rnn import RNNWeights
from rcpipe.models.views import C2Q, SELF, ViewSpec


class CharGRU(nn.Module):
    """R-Net's char embedding: a BiGRU over each word's chars, final states concatenated.

    Static shapes, no host sync: every word of the batch (padding words too) runs the full
    char width W; the forward final state is the forward direction's output at the word's
    last char, the backward one the backward direction's, run on each word reversed within
    its length, at the same position. A word with no chars (a padding token) gives 0.
    The price, on the CPU: W steps for every word where packing ran only each real word's
    chars, ~3x the GRU work on English words at W = 16 (docs/results/speed.md).
    """

    def __init__(self, vocab_size: int, char_dim: int, hidden: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, char_dim, padding_idx=0)
        self.rnn = RNNWeights("gru", char_dim, hidden, bidirectional=True)
        self.dim = 2 * hidden

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        b, n, w = chars.shape
        flat = chars.reshape(b * n, w)  # (N = B*L, W)
        lengths = (flat != 0).sum(dim=1)  # (N,) chars are left-aligned, 0 = pad
        last = (lengths - 1).clamp(min=0).view(-1, 1, 1)  # (N, 1, 1): the last char's place
        x = self.emb(flat)  # (N, W, E)
        with float32_recurrence(x):
            x32 = at_least_float32(x)
            ends = [out.gather(1, last.expand(-1, 1, out.size(2))).squeeze(1)  # (N, H)
                    for out in (self.rnn(x32),  # (N, W, H) each
                                self.rnn(reverse_padded(x32, lengths), "_reverse"))]
        real = (lengths > 0).unsqueeze(1).to(x32.dtype)  # (N, 1): padding tokens give 0
        out = torch.cat(ends, dim=-1) * real  # (N, 2H)
        return out.to(x.dtype).view(b, n, self.dim)  # (B, L, 2H)


class MultiplicativeMatching(nn.Module):
    """rnet_mult's matching layer: scores = tanh(W_1 x) tanh(W_2 y)^T in one bmm,
    c = softmax(scores) y, then R-Net's gate on [x; c] and a fused BiGRU.

    With ``memory`` None it is self-matching (y = x). The diagonal is then masked: W_1 and
    W_2 differ, so a word need not score itself highest, but x_t already enters the gate
    as the first half of [x_t; c_t], so attending to itself adds nothing, and masking it
    makes c_t a summary of the rest of the passage (as Clark & Gardner 2018 do). A
    one-token passage has no other word to attend to: its c_t is 0.
    """

    def __init__(self, dim: int, memory_dim: int, attn_dim: int, hidden: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.w_x = nn.Linear(dim, attn_dim, bias=False)  # W_1
        self.w_y = nn.Linear(memory_dim, attn_dim, bias=False)  # W_2
        self.gate = MatchGate(dim + memory_dim)
        self.drop = VariationalDropout(dropout)
        self.rnn = BiRNN(dim + memory_dim, hidden, 1, 0.0, "gru")  # input is dropped
        self.dim = self.rnn.dim

    def attention(self, x: torch.Tensor, x_mask: torch.Tensor, y: torch.Tensor,
                  y_mask: torch.Tensor | None) -> torch.Tensor:
        """The weights of each x_t over y (B, Lx, Ly); y_mask None: y is x, self-matching."""
        if y_mask is None:
            eye = torch.eye(x.size(1), dtype=torch.bool, device=x.device)  # (L, L)
            keep = x_mask.unsqueeze(1) & ~eye  # (B, L, L)
        else:
            keep = y_mask.unsqueeze(1).expand(-1, x.size(1), -1)  # (B, Lx, Ly)
        scores = torch.bmm(torch.tanh(self.w_x(x)),
                           torch.tanh(self.w_y(y)).transpose(1, 2))  # (B, Lx, Ly)
        a = masked_softmax(scores, keep, dim=2)  # (B, Lx, Ly)
        return a * keep.any(dim=2, keepdim=True)  # a row with nothing to attend to: c = 0

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, memory: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        if (memory is None) != (memory_mask is None):
            raise ValueError("give memory and memory_mask together, or neither (self-matching)")
        x = self.drop(x)
        y = x if memory is None else self.drop(memory)
        a = self.attention(x, x_mask, y, None if memory is None else memory_mask)  # (B, Lx, Ly)
        keep_attention(self, "attention", a)
        c = torch.bmm(a, y)  # (B, Lx, Dy)
        return self.rnn(self.gate(torch.cat([x, c], dim=-1)), x_mask)  # (B, Lx, 2H)


class QuestionPooling(nn.Module):
    """r^Q = att(u^Q, V_r^Q) (eq. 11): s_j = v^T tanh(W_u^Q u^Q_j + W_v^Q V_r^Q).

    W_v^Q V_r^Q is a constant vector, so the pair is over-parameterised; kept as in the
    paper so the parameter count matches its description.
    """

    def __init__(self, dim: int, attn_dim: int) -> None:
        super().__init__()
        self.w_u = nn.Linear(dim, attn_dim, bias=False)  # W_u^Q (separate from matching's)
        self.w_v = nn.Linear(attn_dim, attn_dim, bias=False)  # W_v^Q
        self.v_r = nn.Parameter(torch.randn(attn_dim) / attn_dim**0.5)  # V_r^Q
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def forward(self, u_q: torch.Tensor, q_mask: torch.Tensor) -> torch.Tensor:
        s = self.v(torch.tanh(self.w_u(u_q) + self.w_v(self.v_r))).squeeze(-1)  # (B, Lq)
        a = masked_softmax(s, q_mask)  # (B, Lq)
        return torch.bmm(a.unsqueeze(1), u_q).squeeze(1)  # (B, D)


class PointerNetwork(nn.Module):
    """Two-step pointer (eq. 9-10): s^t_j = v^T tanh(W_h^P h_j + W_h^a h^a_{t-1}); step 1
    gives the start, c_1 = a^1 h^P updates h^a_1 = GRU(h^a_0 = r^Q, c_1), step 2 the end."""

    def __init__(self, dim: int, attn_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.w_h = nn.Linear(dim, attn_dim, bias=False)  # W_h^P
        self.w_a = nn.Linear(dim, attn_dim, bias=False)  # W_h^a
        self.v = nn.Linear(attn_dim, 1, bias=False)
        self.cell = nn.GRUCell(dim, dim)
        self.drop = nn.Dropout(dropout)

    def scores(self, keys: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.v(torch.tanh(keys + self.w_a(state).unsqueeze(1))).squeeze(-1)  # (B, Lc)

    def forward(self, h_p: torch.Tensor, c_mask: torch.Tensor, r_q: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self.w_h(h_p)  # (B, Lc, A), shared by both steps
        s1 = self.scores(keys, r_q)  # (B, Lc)
        a1 = masked_softmax(s1, c_mask)  # (B, Lc)
        c1 = torch.bmm(a1.unsqueeze(1), h_p).squeeze(1)  # (B, D)
        with float32_recurrence(c1):
            h_a = self.cell(at_least_float32(self.drop(c1)), at_least_float32(r_q))  # (B, D)
        s2 = self.scores(keys, h_a)  # (B, Lc)
        return mask_logits(s1, c_mask), mask_logits(s2, c_mask)


class RNet(nn.Module):
    """R-Net; ``matching`` "additive" (the paper) or "multiplicative" (rnet_mult)."""

    def __init__(self, cfg: ModelConfig, inputs: ModelInputs, matching: str = "additive"
                 ) -> None:
        super().__init__()
        if matching not in ("additive", "multiplicative"):
            raise ValueError(f"matching must be additive or multiplicative, not {matching}")
        d = cfg.hidden  # the paper uses 75 for every RNN and every attention
        self.word_emb = WordEmbedding.of(inputs, cfg.train_word_vectors, cfg.word_dropout)
        self.char_emb = CharGRU(inputs.char_vocab, cfg.char_dim, cfg.char_hidden)
        emb_dim = self.word_emb.dim + self.char_emb.dim
        # one encoder for passage and question, as in the paper
        self.encoder = BiRNN(emb_dim, d, cfg.layers, cfg.dropout, "gru")
        self.question_matching: BiGatedAttentionRNN | MultiplicativeMatching
        self.self_matching: SelfMatching | MultiplicativeMatching
        if matching == "additive":
            self.question_matching = BiGatedAttentionRNN(2 * d, d, d, cfg.dropout,
                                                         cfg.bidirectional_matching)
            self.self_matching = SelfMatching(self.question_matching.dim, d, d, cfg.dropout)
        else:
            self.question_matching = MultiplicativeMatching(2 * d, 2 * d, d, d, cfg.dropout)
            qm_dim = self.question_matching.dim
            self.self_matching = MultiplicativeMatching(qm_dim, qm_dim, d, d, cfg.dropout)
        self.output_rnn = BiRNN(self.self_matching.dim, d, 1, cfg.dropout, "gru")
        self.question_pooling = QuestionPooling(2 * d, d)
        self.pointer = PointerNetwork(2 * d, d, cfg.dropout)
        self.drop = VariationalDropout(cfg.dropout)
        self.no_answer = NoAnswerHead(2 * d) if inputs.no_answer else None

    def embed(self, words: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.word_emb(words), chars], dim=-1)  # (B, L, De)

    def forward(self, batch: Batch) -> SpanLogits:
        c_mask, q_mask = batch.c_mask, batch.q_mask
        c_chars, q_chars = chars_per_word(self.char_emb, batch)
        u_p = self.encoder(self.embed(batch.cw, c_chars), c_mask)  # (B, Lc, 2d)
        u_q = self.encoder(self.embed(batch.qw, q_chars), q_mask)  # (B, Lq, 2d)
        v_p = self.question_matching(u_p, c_mask, u_q, q_mask)  # (B, Lc, d or 2d)
        h_p = self.self_matching(v_p, c_mask)  # (B, Lc, 2d)
        h_p = self.drop(self.output_rnn(h_p, c_mask))  # (B, Lc, 2d)
        r_q = self.question_pooling(u_q, q_mask)  # (B, 2d)
        start, end = self.pointer(h_p, c_mask, r_q)  # (B, Lc) each
        na = self.no_answer(h_p, c_mask) if self.no_answer is not None else None  # (B, 2)
        return SpanLogits(start, end, na)


def build_rnet(cfg: ModelConfig, inputs: ModelInputs) -> nn.Module:
    return RNet(cfg, inputs, matching="additive")


def build_rnet_mult(cfg: ModelConfig, inputs: ModelInputs) -> nn.Module:
    return RNet(cfg, inputs, matching="multiplicative")


# what `rcpipe explain` shows of each variant (rcpipe.models.views)
VIEWS: dict[str, tuple[ViewSpec, ...]] = {
    "rnet": (
        ViewSpec("question_matching.fwd", "question", 0, "question", C2Q,
                 "R-Net gated attention-based recurrence (forward direction): at each "
                 "passage step, additive attention over the question, given the previous "
                 "state"),
        ViewSpec("self_matching", "self", 0, "passage", SELF,
                 "R-Net self-matching attention (additive, diagonal kept)"),
    ),
    "rnet_mult": (
        ViewSpec("question_matching", "attention", 0, "question", C2Q,
                 "R-Net question matching, multiplicative: tanh(W1 u^P) tanh(W2 u^Q)^T"),
        ViewSpec("self_matching", "attention", 0, "passage", SELF,
                 "R-Net self-matching, multiplicative (a word does not attend to itself)"),
    ),
}
