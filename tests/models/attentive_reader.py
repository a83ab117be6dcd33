"""The worked example of docs/architecture.md, "Adding a variant": a family module that is
not shipped. tests/test_variants.py registers it and runs it through rcpipe.

Chen et al. 2017's reader (DrQA, "Reading Wikipedia to Answer Open-Domain Questions"), in
small: each passage word carries its aligned question embedding, a BiGRU reads the passage and
one the question, the question is pooled by learned weights, and start and end are bilinear
in a passage word and the pooled question.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.models import ModelInputs
from rcpipe.models.batch import Batch
from rcpipe.models.embeddings import WordEmbedding
from rcpipe.models.layers import (
    BiRNN,
    NoAnswerHead,
    SpanLogits,
    keep_attention,
    mask_logits,
    masked_softmax,
)
from rcpipe.models.views import C2Q, ViewSpec


class AttentiveReader(nn.Module):
    def __init__(self, cfg: ModelConfig, inputs: ModelInputs) -> None:
        super().__init__()
        d = cfg.hidden
        self.word_emb = WordEmbedding.of(inputs, cfg.train_word_vectors, cfg.word_dropout)
        e = self.word_emb.dim
        self.align = nn.Linear(e, e)  # section 3.2, "aligned question embedding"
        self.passage = BiRNN(2 * e, d, cfg.layers, cfg.dropout, "gru")
        self.question = BiRNN(e, d, cfg.layers, cfg.dropout, "gru")
        self.pool = nn.Linear(2 * d, 1)
        self.w_start = nn.Linear(2 * d, 2 * d, bias=False)
        self.w_end = nn.Linear(2 * d, 2 * d, bias=False)
        self.no_answer = NoAnswerHead(2 * d) if inputs.no_answer else None

    def forward(self, batch: Batch) -> SpanLogits:
        c_mask, q_mask = batch.c_mask, batch.q_mask
        ep, eq = self.word_emb(batch.cw), self.word_emb(batch.qw)  # (B, Lc, e), (B, Lq, e)
        scores = F.relu(self.align(ep)) @ F.relu(self.align(eq)).transpose(1, 2)  # (B, Lc, Lq)
        a = masked_softmax(scores, q_mask.unsqueeze(1))  # (B, Lc, Lq)
        keep_attention(self, "align", a)
        p = self.passage(torch.cat([ep, a @ eq], dim=-1), c_mask)  # (B, Lc, 2d)
        q = self.question(eq, q_mask)  # (B, Lq, 2d)
        b = masked_softmax(self.pool(q).squeeze(-1), q_mask)  # (B, Lq)
        q_vec = (b.unsqueeze(1) @ q).squeeze(1)  # (B, 2d)
        start = (self.w_start(p) @ q_vec.unsqueeze(-1)).squeeze(-1)  # (B, Lc)
        end = (self.w_end(p) @ q_vec.unsqueeze(-1)).squeeze(-1)  # (B, Lc)
        na = self.no_answer(p, c_mask) if self.no_answer is not None else None  # (B, 2)
        return SpanLogits(mask_logits(start, c_mask), mask_logits(end, c_mask), na)


def build_attentive_reader(cfg: ModelConfig, inputs: ModelInputs) -> nn.Module:
    return AttentiveReader(cfg, inputs)


VIEWS: dict[str, tuple[ViewSpec, ...]] = {
    "attentive_reader": (
        ViewSpec("", "align", 0, "question", C2Q,
                 "aligned question embedding: for each passage word, a softmax over the "
                 "question words of their embeddings' similarity"),
    ),
}
