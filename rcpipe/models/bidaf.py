"""BiDAF (Seo et al. 2017) and BiDAF with R-Net's self-matching layer (``bidaf_selfattn``).

BiDAF: word + char-CNN embeddings -> highway -> contextual BiLSTM (H, U) -> attention flow
G = [h; u~; h * u~; h * h~] -> modeling BiLSTM (M) -> p1 = softmax(w_p1^T [G; M]),
M2 = BiLSTM(M), p2 = softmax(w_p2^T [G; M2]).

bidaf_selfattn: the CS224N SQuAD 2.0 study's best model adds R-Net's self-matching layer
(Wang et al. 2017) between the attention flow and the modeling layer. G is first projected
from 8d to 2d, since self-matching attention is quadratic in the passage and its gate and
RNN are quadratic in the input width; the output layer still reads the full G.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.models import ModelInputs
from rcpipe.models.batch import Batch
from rcpipe.models.embeddings import CharCNN, Highway, WordEmbedding, embed_batch
from rcpipe.models.layers import (
    BiRNN,
    Dropout,
    NoAnswerHead,
    SelfMatching,
    SpanLogits,
    TrilinearAttention,
    mask_logits,
)
from rcpipe.models.views import C2Q, SELF, ViewSpec


class BiDAF(nn.Module):
    """Bi-Directional Attention Flow; ``self_matching`` adds R-Net's self-matching layer."""

    def __init__(self, cfg: ModelConfig, inputs: ModelInputs, self_matching: bool = False,
                 cell: str = "lstm") -> None:
        super().__init__()
        d = cfg.hidden
        self.word_emb = WordEmbedding.of(inputs, cfg.train_word_vectors, cfg.word_dropout)
        # the paper drops out the CNN's input at the model's rate (0.2), not a char rate
        self.char_emb = CharCNN(inputs.char_vocab, cfg.char_dim, cfg.char_hidden,
                                cfg.char_kernel, cfg.dropout)
        emb_dim = self.word_emb.dim + self.char_emb.dim
        self.highway = Highway(emb_dim, cfg.highway_layers)
        # one encoder for passage and question: the paper shares the contextual layer
        self.contextual = BiRNN(emb_dim, d, 1, cfg.dropout, cell)
        self.attention_flow = TrilinearAttention(2 * d, "bidaf", cfg.similarity_init)
        g_dim = 8 * d
        self.project: nn.Linear | None = None
        self.self_matching: SelfMatching | None = None
        model_in = g_dim
        if self_matching:
            self.project = nn.Linear(g_dim, 2 * d)
            self.self_matching = SelfMatching(2 * d, d, d, cfg.dropout)
            model_in = self.self_matching.dim
        self.modeling = BiRNN(model_in, d, cfg.layers, cfg.dropout, cell)
        self.end_rnn = BiRNN(self.modeling.dim, d, 1, cfg.dropout, cell)
        out_dim = g_dim + 2 * d
        self.w_p1 = nn.Linear(out_dim, 1)
        self.w_p2 = nn.Linear(out_dim, 1)
        self.drop = Dropout(cfg.dropout)  # "the linear transformation before the softmax"
        self.no_answer = NoAnswerHead(out_dim) if inputs.no_answer else None

    def embed(self, words: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
        """Word ids (B, L) and their char-CNN features (B, L, Dc) -> (B, L, De)."""
        x = torch.cat([self.word_emb(words), chars], dim=-1)  # (B, L, De)
        return self.highway(x)  # (B, L, De)

    def forward(self, batch: Batch) -> SpanLogits:
        c_mask, q_mask = batch.c_mask, batch.q_mask
        # once per distinct word, unless word dropout draws a coin per token in training
        word_coins = self.training and self.word_emb.word_dropout > 0
        c_emb, q_emb = embed_batch(self.embed, self.char_emb, batch, word_coins)  # (B, L, De)
        h = self.contextual(c_emb, c_mask)  # (B, Lc, 2d)
        u = self.contextual(q_emb, q_mask)  # (B, Lq, 2d)
        g = self.attention_flow(h, u, c_mask, q_mask)  # (B, Lc, 8d)
        x = g
        if self.project is not None and self.self_matching is not None:
            x = self.self_matching(self.project(g), c_mask)  # (B, Lc, 2d)
        m = self.modeling(x, c_mask)  # (B, Lc, 2d)
        m2 = self.end_rnn(m, c_mask)  # (B, Lc, 2d)
        g1, g2 = self.drop(g), self.drop(g)  # (B, Lc, 8d): each output layer its own mask
        m, m2 = self.drop(m), self.drop(m2)  # (B, Lc, 2d)
        start = mask_logits(self._span_score(self.w_p1, g1, m), c_mask)  # (B, Lc)
        end = mask_logits(self._span_score(self.w_p2, g2, m2), c_mask)  # (B, Lc)
        na = None
        if self.no_answer is not None:
            # [G; M2] has seen the whole passage twice over: the richest summary for "no answer"
            na = self.no_answer(torch.cat([g2, m2], dim=-1), c_mask)  # (B, 2)
        return SpanLogits(start, end, na)

    @staticmethod
    def _span_score(w_p: nn.Linear, g: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """w_p^T [G; M] (B, Lc) as two products, G's and M's halves of w_p: the same sum
        without writing the (B, Lc, 10d) concatenation (and its gradient) each step."""
        split = g.size(-1)
        return (F.linear(g, w_p.weight[:, :split])
                + F.linear(m, w_p.weight[:, split:], w_p.bias)).squeeze(-1)  # (B, Lc)


def build_bidaf(cfg: ModelConfig, inputs: ModelInputs) -> nn.Module:
    return BiDAF(cfg, inputs)


def build_bidaf_selfattn(cfg: ModelConfig, inputs: ModelInputs) -> nn.Module:
    return BiDAF(cfg, inputs, self_matching=True)


# what `rcpipe explain` shows of each variant (rcpipe.models.views)
_C2Q_VIEW = ViewSpec("attention_flow", "c2q", 0, "question", f"{C2Q} (C2Q)",
                     "BiDAF attention flow, context-to-query: for each passage word, a "
                     "softmax over the question words")
VIEWS: dict[str, tuple[ViewSpec, ...]] = {
    "bidaf": (
        _C2Q_VIEW,
        ViewSpec("attention_flow", "q2c", 0, "passage_weights", "query-to-context (Q2C)",
                 "BiDAF query-to-context: softmax over the passage of each word's best "
                 "question-word score (BiDAF has no passage self-attention)"),
    ),
    "bidaf_selfattn": (
        _C2Q_VIEW,
        ViewSpec("self_matching", "self", 0, "passage", SELF,
                 "R-Net self-matching (additive) over the projected attention-flow output"),
    ),
}
