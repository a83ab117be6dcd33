"""One variant trained several times (models.<variant>.seeds), answering as one model: the
mean of its runs' start/end distributions (and v2.0's no-answer probabilities), as the BiDAF
and R-Net papers built their ensembles from runs of one architecture. What it buys on real
text, measured: docs/results/accuracy.md, "Several runs of one variant"."""

from __future__ import annotations

import math

import torch
from torch import nn

from rcpipe.models.batch import Batch
from rcpipe.models.layers import SpanLogits


class SeedMean(nn.Module):
    """The runs' networks side by side (their weights ``replicas.<k>.*`` in one state dict);
    forward gives SpanLogits whose log_probs are the log of the runs' mean probabilities."""

    def __init__(self, replicas: list[nn.Module]) -> None:
        super().__init__()
        self.replicas = nn.ModuleList(replicas)

    def forward(self, batch: Batch) -> SpanLogits:
        outs = [m(batch) for m in self.replicas]
        logs = [o.log_probs() for o in outs]  # each run's (log p_start, log p_end)
        shift = math.log(len(outs))
        # (R, B, 1 + Lc) -> (B, 1 + Lc): log of the mean probability, index 0 no-answer
        start, end = (torch.logsumexp(torch.stack(parts), 0) - shift
                      for parts in zip(*logs, strict=True))
        # already normalised: log_probs' softmax over them gives them back
        na = torch.stack([start[:, 0], end[:, 0]], 1) if outs[0].na is not None else None
        return SpanLogits(start[:, 1:], end[:, 1:], na)  # na: (B, 2)
