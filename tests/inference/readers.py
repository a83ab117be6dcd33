"""Readers for tests about what is done with a model's probabilities: each finds every gold
span, and its no-answer logit is set by hand."""

from __future__ import annotations

import torch
from torch import nn

from rcpipe.data.dataset import Batch
from rcpipe.models.layers import NEG_INF, SpanLogits


class ShyReader(nn.Module):
    """Finds every gold span, but its no-answer logit always beats the span: under the
    raw rule (na_prob > span prob) it answers nothing, the state issue 15 saw after five
    minutes of training. Its no-answer logit is lower on answerable questions, so a
    threshold exists that answers them and abstains on the rest."""

    def __init__(self, no_answer: bool = True) -> None:
        super().__init__()
        self.no_answer = no_answer

    def forward(self, batch: Batch) -> SpanLogits:
        lc = batch.cw.size(1)
        pos = torch.arange(lc)[None, :]  # (1, Lc)
        start = torch.where(pos == batch.y1[:, None], 5.0, 0.0)  # (B, Lc)
        end = torch.where(pos == batch.y2[:, None], 5.0, 0.0)  # (B, Lc)
        na = torch.where(batch.is_impossible, 12.0, 9.0)[:, None].expand(-1, 2)  # (B, 2)
        mask = batch.c_mask
        return SpanLogits(start.masked_fill(~mask, NEG_INF), end.masked_fill(~mask, NEG_INF),
                          na.clone() if self.no_answer else None)


class UnsureReader(ShyReader):
    """ShyReader whose no-answer logit also wanders with the context's length, so the
    classes overlap and each set of questions has its own best threshold."""

    def forward(self, batch: Batch) -> SpanLogits:
        out = super().forward(batch)
        wander = 4.0 * torch.sin(1.7 * batch.c_mask.sum(1).float())[:, None]  # (B, 1)
        return SpanLogits(out.start, out.end, out.na + wander)
