"""Whether one model's F1 beats another's on the same questions, beyond what the sample allows.

Two runs scored on one test set differ by chance as well as by their settings: a test F1 over
~2,000 SQuAD questions has a standard error near a point. The two models answer the same
questions, so their difference is compared question by question (paired), and its spread
comes from a bootstrap over **paragraphs**, not questions: the questions of one passage rise
and fall together (a passage a model misreads costs it all of them), so resampling single
questions would make the interval too narrow.

A second source of chance is the run itself: another seed (another initialisation, shuffle
and dropout mask) moves a short run's F1 by points. With several seeds a side,
`seeded_difference` compares the seed-averaged answers (each question's F1 averaged over a
side's seeds, then the paragraph bootstrap) and reports beside it each seed pair's
difference: their range is the seed spread, which the bootstrap does not see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rcpipe.scoring.metrics import question_scores


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
    return _bootstrap(paragraph_f1(dataset, a), paragraph_f1(dataset, b), draws, level, seed)


def _bootstrap(fa: list[list[float]], fb: list[list[float]], draws: int, level: float,
               seed: int) -> PairedDifference:
    """The paired difference of two sides' per-paragraph question F1s (0..1)."""
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


@dataclass(frozen=True)
class SeededDifference:
    """``b - a`` over several seeds a side: the seed-averaged paired difference (``mean``,
    its interval from the paragraph bootstrap) and each seed pair's (``per_seed``)."""

    mean: PairedDifference
    per_seed: tuple[PairedDifference, ...]

    @property
    def seed_range(self) -> tuple[float, float]:
        """The lowest and highest seed pair's difference: the spread from the runs."""
        diffs = [d.diff for d in self.per_seed]
        return min(diffs), max(diffs)

    def verdict(self) -> str:
        """``gain`` or ``loss`` only when the seed-averaged interval leaves out 0 and every
        seed pair moves the same way; ``chance`` otherwise."""
        lo, hi = self.seed_range
        if self.mean.low > 0 and lo > 0:
            return "gain"
        if self.mean.high < 0 and hi < 0:
            return "loss"
        return "chance"

    def line(self) -> str:
        lo, hi = self.seed_range
        return (f"{self.mean.line()}; {len(self.per_seed)} seeds: differences "
                f"{lo:+.2f} to {hi:+.2f}: {self.verdict()}")

    def record(self) -> dict[str, Any]:
        """As a bench's JSON holds it: the mean, each seed pair, their range, the verdict."""
        return {"mean": asdict(self.mean), "per_seed": [asdict(x) for x in self.per_seed],
                "seed_range": self.seed_range, "verdict": self.verdict()}


def seeded_difference(dataset: dict[str, Any], a: Sequence[dict[str, str]],
                      b: Sequence[dict[str, str]], draws: int = 2000, level: float = 0.95,
                      seed: int = 0) -> SeededDifference:
    """``b``'s F1 minus ``a``'s with seeds: ``a[i]`` and ``b[i]`` are seed i's answers."""
    if not a or len(a) != len(b):
        raise ValueError(f"seeded_difference: {len(a)} and {len(b)} runs; need the same "
                         "number of seeds a side, one or more")
    fa = _seed_mean([paragraph_f1(dataset, p) for p in a])
    fb = _seed_mean([paragraph_f1(dataset, p) for p in b])
    return SeededDifference(
        mean=_bootstrap(fa, fb, draws, level, seed),
        per_seed=tuple(paired_difference(dataset, x, y, draws, level, seed)
                       for x, y in zip(a, b, strict=True)))


def _seed_mean(runs: list[list[list[float]]]) -> list[list[float]]:
    """Each question's F1 averaged over the runs (seeds), paragraph by paragraph."""
    return [[sum(q) / len(q) for q in zip(*paragraphs, strict=True)]
            for paragraphs in zip(*runs, strict=True)]
