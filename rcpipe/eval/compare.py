"""Whether one model's F1 beats another's on the same questions, beyond what the sample allows.

Two runs scored on one test set differ by chance as well as by their settings: a test F1 over
~2,000 SQuAD questions has a standard error near a point. The two models answer the same
questions, so their difference is compared question by question (paired), and its spread
comes from a bootstrap over **paragraphs**, not questions: the questions of one passage rise
and fall together (a passage a model misreads costs it all of them), so resampling single
questions would make the interval too narrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rcpipe.eval.metrics import question_scores


@dataclass(frozen=True)
class PairedDifference:
    """F1 of ``a`` and ``b`` (percent), ``b - a``, its bootstrap standard error and interval."""

    f1_a: float
    f1_b: float
    diff: float
    se: float
    low: float  # the interval's ends (``level`` of the bootstrap draws between them)
    high: float
    level: float
    paragraphs: int
    questions: int

    def line(self) -> str:
        return (f"{self.f1_a:.1f} -> {self.f1_b:.1f}: {self.diff:+.2f} F1 "
                f"[{self.low:+.2f}, {self.high:+.2f}] ({self.level:.0%}, "
                f"{self.paragraphs} paragraphs bootstrapped)")


def paragraph_f1(dataset: dict[str, Any], predictions: dict[str, str]) -> list[list[float]]:
    """Each paragraph's questions' official F1 (0 for a question without a prediction), in
    dataset order; v2.0 predictions are strings already ("" for no answer)."""
    scores = iter(question_scores(dataset, predictions))
    return [[next(scores).f1 or 0.0 for _ in paragraph["qas"]]
            for article in dataset["data"] for paragraph in article["paragraphs"]
            if paragraph["qas"]]


def paired_difference(dataset: dict[str, Any], a: dict[str, str], b: dict[str, str],
                      draws: int = 2000, level: float = 0.95, seed: int = 0
                      ) -> PairedDifference:
    """``b``'s F1 minus ``a``'s on ``dataset`` with a paragraph bootstrap interval."""
    fa, fb = paragraph_f1(dataset, a), paragraph_f1(dataset, b)
    sums = np.array([sum(y) - sum(x) for x, y in zip(fa, fb, strict=True)])  # (paragraphs,)
    counts = np.array([len(x) for x in fa])  # questions of each paragraph
    n = counts.sum()
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(sums), size=(draws, len(sums)))  # (draws, paragraphs)
    boot = 100.0 * sums[picks].sum(axis=1) / counts[picks].sum(axis=1)  # (draws,)
    tail = (1.0 - level) / 2
    return PairedDifference(
        f1_a=100.0 * sum(map(sum, fa)) / n, f1_b=100.0 * sum(map(sum, fb)) / n,
        diff=100.0 * sums.sum() / n, se=float(boot.std()),
        low=float(np.quantile(boot, tail)), high=float(np.quantile(boot, 1 - tail)),
        level=level, paragraphs=len(sums), questions=int(n))
