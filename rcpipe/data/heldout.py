"""The held-out slice: a seeded share of the training file's articles, never trained on.

The v2.0 no-answer threshold is chosen on it and checkpoints are ranked on it, so the dev
set that reports a model's scores never tunes them. Articles, not questions, are held out:
questions on one passage share its answers, and a held-out question whose passage was
trained on would flatter the threshold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def heldout_count(articles: int, fraction: float) -> int:
    """How many of ``articles`` go held out: ``fraction`` of them, rounded, at least one
    when the fraction is above 0, and never all of them (some article must train).

    Raises ValueError when a fraction above 0 meets fewer than two articles.
    """
    if fraction <= 0:
        return 0
    if articles < 2:
        raise ValueError(f"holding out {fraction:g} of the training articles needs at "
                         f"least 2 articles, the file has {articles}")
    return min(articles - 1, max(1, round(fraction * articles)))


def heldout_articles(titles: list[str], fraction: float, seed: int,
                     sizes: Sequence[int] | None = None, max_questions: int | None = None
                     ) -> list[int]:
    """The indices (ascending) of the articles held out, chosen by ``seed``: ``fraction``
    of them, and with ``max_questions`` (``sizes``: each article's questions) no more of
    them, in the draw's order, than hold that many questions (the first always).

    Each article's place in the draw is the sha256 of the seed, its title and its index,
    so the slice is the same on every machine and Python version for the same file and
    seed, and a different seed draws another. The cap keeps what every checkpoint is
    scored on bounded as the training file grows (5% of 65M questions is 3M)."""
    k = heldout_count(len(titles), fraction)

    def draw(i: int) -> str:
        return hashlib.sha256(f"{seed}\0{i}\0{titles[i]}".encode()).hexdigest()

    chosen = sorted(range(len(titles)), key=draw)[:k]
    if max_questions is not None and sizes is not None:
        held, kept = 0, []
        for i in chosen:
            if kept and held + sizes[i] > max_questions:
                break
            kept.append(i)
            held += sizes[i]
        chosen = kept
    return sorted(chosen)

