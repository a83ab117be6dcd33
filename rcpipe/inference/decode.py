"""Span decoding: the best answer span from start/end distributions, and the no-answer call."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def best_span(
    p_start: torch.Tensor, p_end: torch.Tensor, max_len: int = 15,
    length_prior: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The span (i, j) maximising p_start[i] * p_end[j] subject to i <= j < i + max_len.

    p_start and p_end are (B, L) probabilities with padding positions already 0. Returns
    (start (B,), end (B,), prob (B,)), prob being p_start[start] * p_end[end]. Only the band
    of allowed pairs is scored, as a (B, L, max_len) tensor of [b, i, k] = span (i, i + k),
    so memory grows with L * max_len (a window of 1,000 tokens: 15,000 pairs, not a
    million). Ties go to the earliest pair in row-major order (smallest start, then
    smallest end), since torch.argmax returns the first maximum.
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

    width = min(max_len, length)  # spans a start may have: ends i .. i + width - 1
    ends = F.pad(p_end, (0, width - 1)).unfold(1, width, 1)  # (B, L, W): [b, i, k] = end i+k
    scores = p_start.unsqueeze(2) * ends  # (B, L, W)
    steps = torch.arange(length, device=p_start.device)
    offsets = torch.arange(width, device=p_start.device)
    inside = steps[:, None] + offsets[None, :] < length  # (L, W): the end is in the context
    # -inf rather than 0 past the end, so such a pair can never tie with or beat an allowed
    # one, whatever the inputs' sign.
    scores = scores.masked_fill(~inside, float("-inf"))  # (B, L, W)
    flat = scores.reshape(batch, length * width)  # (B, L*W)
    chooser = flat
    if length_prior is not None:
        # the prior is built on the host (NumPy); the scores live on the model's device
        prior = length_prior.to(scores.device, scores.dtype)[:width]  # (W,): by length - 1
        chooser = (scores * prior).reshape(batch, length * width)  # (B, L*W)
    best = chooser.argmax(dim=1)  # (B,)
    prob = flat.gather(1, best.unsqueeze(1)).squeeze(1)  # (B,)
    start = torch.div(best, width, rounding_mode="floor")  # (B,)
    end = start + best % width  # (B,)
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
