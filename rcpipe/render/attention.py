"""Attention views for `rcpipe explain`: what a model looked at to answer one question.

In the manner of the R-Net report's attention figures: the passage-question attention, the
passage self-attention (where the variant has one) and the start/end pointer
distributions, taken from one forward pass under ``layers.capture_attention``. Which
module's weights each view shows is declared next to each family (its ``VIEWS``, found by
``rcpipe.models.views_of``).

Plain data and numpy here (render/plots.py and render/pages.py draw from it); running a model
for its views is render/attention_pass.py. No file I/O: stages/explain.py reads the model and
the question and writes the page.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rcpipe.models.views import Kind, ViewSpec


@dataclass(frozen=True)
class AttentionMap:
    spec: ViewSpec
    weights: np.ndarray  # (Lc, Lq), (Lc, Lc) or (Lc,), float64


@dataclass(frozen=True)
class Explanation:
    """One question seen through one model (a batch of one: no padding anywhere)."""

    variant: str
    qid: str
    question: str
    context: str
    passage: list[str]  # the passage tokens the model read (its window's)
    question_tokens: list[str]
    maps: list[AttentionMap]
    p_start: np.ndarray  # (Lc,) the start pointer over the passage tokens
    p_end: np.ndarray  # (Lc,)
    p_start_na: float  # the no-answer share of the start softmax (0 for v1.1 models)
    p_end_na: float
    start: int  # the predicted span's tokens, -1 for "no answer"
    end: int
    answer: str
    gold: list[str]
    gold_start: int = -1  # the first gold answer's tokens (-1: none, or cut off)
    gold_end: int = -1
    # a long context read as windows (data.window): the passage, the views and the token
    # positions above are those of window ``window`` (0 = the first) of ``windows``, whose
    # first token is the context's token ``window_start``
    window: int = 0
    windows: int = 1
    window_start: int = 0

    def of(self, kind: Kind) -> AttentionMap | None:
        return next((m for m in self.maps if m.spec.kind == kind), None)

    def gold_tokens(self) -> set[int]:
        return set(range(self.gold_start, self.gold_end + 1)) if self.gold_start >= 0 else set()

    def focus_rows(self) -> list[int]:
        """The passage rows the views summarise: the predicted answer (or the start peak)."""
        if self.start >= 0:
            return list(range(self.start, self.end + 1))
        return [int(self.p_start.argmax())]


def strongest(weights: np.ndarray, k: int) -> list[int]:
    """Indices of the k largest entries of a 1-D array, largest first (ties: earlier first)."""
    order = np.argsort(-weights, kind="stable")
    return [int(i) for i in order[:k]]


def question_focus(ex: Explanation) -> np.ndarray | None:
    """(Lq,) how the focus rows spread over the question: mean of their attention rows."""
    m = ex.of("question")
    return None if m is None else m.weights[ex.focus_rows()].mean(axis=0)


def passage_focus(ex: Explanation) -> np.ndarray | None:
    """(Lc,) the passage words the answer draws on: the focus rows' self-attention (or
    BiDAF's Q2C weights, which are one distribution over the passage)."""
    m = ex.of("passage")
    if m is not None:
        return m.weights[ex.focus_rows()].mean(axis=0)
    m = ex.of("passage_weights")
    return None if m is None else m.weights


def top_pairs(ex: Explanation, k: int = 8) -> list[tuple[int, int, float]]:
    """The k strongest (passage token, question token, weight) of the passage-question map."""
    m = ex.of("question")
    if m is None:
        return []
    flat = strongest(m.weights.ravel(), k)
    lq = m.weights.shape[1]
    return [(i // lq, i % lq, float(m.weights.ravel()[i])) for i in flat]


def display_window(ex: Explanation, size: int) -> tuple[int, int]:
    """[lo, hi) of at most ``size`` passage tokens for plots: centred on the predicted and
    the gold answer when both fit, on the predicted answer otherwise."""
    n = len(ex.passage)
    if n <= size:
        return 0, n
    rows = ex.focus_rows()
    first, last = rows[0], rows[-1]
    if ex.gold_start >= 0 and max(last, ex.gold_end) - min(first, ex.gold_start) < size:
        first, last = min(first, ex.gold_start), max(last, ex.gold_end)
    centre = (first + last) // 2
    lo = min(max(0, centre - size // 2), n - size)
    return lo, lo + size
