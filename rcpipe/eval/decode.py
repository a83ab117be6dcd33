"""Span decoding: the best answer span from start/end distributions, and the no-answer call."""

from __future__ import annotations

import torch


def best_span(
    p_start: torch.Tensor, p_end: torch.Tensor, max_len: int = 15,
    length_prior: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The span (i, j) maximising p_start[i] * p_end[j] subject to i <= j < i + max_len.

    p_start and p_end are (B, L) probabilities with padding positions already 0. Returns
    (start (B,), end (B,), prob (B,)), prob being p_start[start] * p_end[end]. Every pair is
    scored at once as a (B, L, L) outer product, so memory grows with L**2 (fine for SQuAD
    contexts of a few hundred tokens). Ties go to the earliest pair in row-major order
    (smallest start, then smallest end), since torch.argmax returns the first maximum.
    ``length_prior`` (max_len,): the pair is chosen by p_start * p_end * prior[j - i]
    instead, and ``prob`` stays the pair's p_start * p_end.
    """
    if p_start.dim() != 2 or p_start.shape != p_end.shape:
        raise ValueError(
            f"p_start and p_end must both be (B, L), got {tuple(p_start.shape)} and "
            f"{tuple(p_end.shape)}"
        )
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    batch, length = p_start.shape
    if length == 0:
        raise ValueError("cannot pick a span from a zero-length context")

    scores = p_start.unsqueeze(2) * p_end.unsqueeze(1)  # (B, L, L): [b, i, j] = start i, end j
    ones = torch.ones(length, length, dtype=torch.bool, device=p_start.device)
    band = ones.triu(0).tril(max_len - 1)  # (L, L): True where i <= j <= i + max_len - 1
    # -inf rather than 0 outside the band, so an out-of-band pair can never tie with or beat
    # an allowed one, whatever the inputs' sign.
    scores = scores.masked_fill(~band, float("-inf"))  # (B, L, L)
    flat = scores.reshape(batch, length * length)  # (B, L*L)
    chooser = flat
    if length_prior is not None:
        steps = torch.arange(length, device=p_start.device)
        span_len = (steps[None, :] - steps[:, None]).clamp(0, max_len - 1)  # (L, L): j - i
        prior = length_prior.to(scores.dtype)[span_len]  # (L, L)
        chooser = (scores * prior).reshape(batch, length * length)  # (B, L*L)
    best = chooser.argmax(dim=1)  # (B,)
    prob = flat.gather(1, best.unsqueeze(1)).squeeze(1)  # (B,)
    start = torch.div(best, length, rounding_mode="floor")  # (B,)
    end = best % length  # (B,)
    return start, end, prob


def predict_no_answer(
    span_prob: torch.Tensor, na_prob: torch.Tensor, threshold: float | None = None
) -> torch.Tensor:
    """The SQuAD v2.0 no-answer decision, (B,) bool: True means answer "".

    With threshold None the model abstains when its no-answer probability beats its best
    span's probability (na_prob > span_prob). With a threshold (for instance best_f1_thresh
    from a previous evaluation) it abstains when na_prob > threshold, the same comparison the
    official script applies with --na-prob-thresh. Equality answers, in both cases.
    """
    if threshold is None:
        return na_prob > span_prob
    return na_prob > threshold
