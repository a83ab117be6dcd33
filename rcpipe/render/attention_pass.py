"""One forward pass of a model on one question, kept with its attention weights.

The module paths and names of the weights each variant shows are its family's VIEWS;
the models record them under ``layers.capture_attention`` only, so evaluation is untouched.
"""

from __future__ import annotations

import torch
from torch import nn

from rcpipe.inference.decode import best_span, predict_no_answer
from rcpipe.models import views_of
from rcpipe.models.batch import Batch
from rcpipe.models.layers import capture_attention
from rcpipe.models.seed_mean import SeedMean
from rcpipe.render.attention import AttentionMap


def attention_maps(model: nn.Module, variant: str, batch: Batch
                   ) -> tuple[list[AttentionMap], torch.Tensor, torch.Tensor]:
    """One eval forward pass of a one-question batch; its views and log p_start, log p_end
    over [no-answer, tokens] (1 + Lc,). A model of several runs (models/seed_mean.py):
    the views of its first run, the distributions their mean."""
    if len(batch) != 1:
        raise ValueError(f"explain one question at a time, not {len(batch)}")
    model.eval()
    with torch.no_grad(), capture_attention(model) as captured:
        log_p1, log_p2 = model(batch).log_probs()  # (1, 1 + Lc) each
    maps = []
    # a model of several runs answers with their mean; the views are its first run's
    viewed = model.replicas[0] if isinstance(model, SeedMean) else model
    for spec in views_of(variant):
        calls = captured.get((viewed.get_submodule(spec.module), spec.name), [])
        if len(calls) <= spec.call:
            raise RuntimeError(f"{variant}: {spec.module} recorded no {spec.name!r} attention")
        w = calls[spec.call][0].double()  # (Lc, Lq) / (Lc, Lc) / (Lc,), or (h, Lc, Lc)
        if w.dim() == 3:  # multi-head: the heads' mean, still a distribution per row
            w = w.mean(dim=0)  # (Lc, Lc)
        maps.append(AttentionMap(spec, w.numpy()))
    return maps, log_p1[0], log_p2[0]


def decode(log_p1: torch.Tensor, log_p2: torch.Tensor, max_answer_len: int,
           na_threshold: float | None) -> tuple[int, int]:
    """The predicted token span as `rcpipe evaluate` decides it; (-1, -1) for no answer."""
    p1, p2 = log_p1.exp().unsqueeze(0), log_p2.exp().unsqueeze(0)  # (1, 1 + Lc)
    start, end, prob = best_span(p1[:, 1:], p2[:, 1:], max_answer_len)
    if bool(predict_no_answer(prob, p1[:, 0] * p2[:, 0], na_threshold)[0]):
        return -1, -1
    return int(start[0]), int(end[0])
