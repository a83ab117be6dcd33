"""Choosing a document's answer across the windows it was read as (data/windows.py).

The rule, defined here once (evaluate, predict, serve, explain and the benchmark all reach
it through inference/reading.py's ``predict``):

- each window proposes its best span among those starting on a token it owns (the
  max-context rule), scored as a single window is: p_start * p_end;
- the document's best span is the proposal with the highest score, its start logit plus
  its end logit (ties: the earlier window): a window's probabilities are normalised over
  that window alone, so a window without the answer still gives some span most of its
  mass, while the logits say how good a span is whatever else the window holds (as
  transformers' run_qa compares a document's features);
- its no-answer probability is the lowest of its windows' (SQuAD v2.0): a window that does
  not hold the answer rightly says "no answer", so only the window most sure that the
  answer is there speaks for the document (as transformers' run_qa keeps the minimum null
  score over a document's features). The document abstains when that probability beats its
  best span's (decode.predict_no_answer), or the no-answer threshold evaluate chose.

A context read as one window gets exactly the answer it got before windows: its one
proposal and its own no-answer probability.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rcpipe.data.windows import window_starts


@dataclass(frozen=True)
class Proposal:
    """One window's best span, in the document's tokens."""

    window: int  # its place among the document's windows (0 = the first)
    start: int  # the span's first token in the document
    end: int  # its last token (inclusive)
    prob: float  # p_start * p_end in that window
    na_prob: float  # the window's no-answer probability (0 for SQuAD v1.1 models)
    # the span's start logit + end logit: comparable across windows, unlike ``prob``, which
    # each window's softmax normalises over that window alone (within one window both
    # rank the spans alike)
    score: float = 0.0


def choose(proposals: Sequence[Proposal]) -> tuple[Proposal, float]:
    """(the document's best span, its no-answer probability) from its windows' proposals."""
    if not proposals:
        raise ValueError("a document read as no window has no answer to choose")
    best = proposals[0]
    for p in proposals[1:]:
        if p.score > best.score or (p.score == best.score and p.window < best.window):
            best = p
    return best, min(p.na_prob for p in proposals)


class TooLong(ValueError):
    """A context over the request cap (data.window.max_tokens): refused, never cut."""

    def __init__(self, tokens: int, cap: int, windows: int) -> None:
        self.tokens, self.cap, self.windows = tokens, cap, windows
        super().__init__(f"the context is {tokens:,} tokens ({windows:,} windows), over the "
                         f"cap of {cap:,} (data.window.max_tokens): split the document or "
                         "raise the cap")


def over_cap(lengths: Iterable[int], cap: int | None, window: Any = None) -> dict[int, TooLong]:
    """The one check of data.window.max_tokens: each context longer than ``cap`` tokens, by
    its place in ``lengths``, with the windows it would have been read as (``window``:
    data.window; None: one window); nothing when there is no cap."""
    if cap is None:
        return {}
    return {i: TooLong(n, cap, len(window_starts(n, window.length, window.stride))
                       if window else 1)
            for i, n in enumerate(int(x) for x in lengths) if n > cap}
