"""rcpipe.data.heldout: which training articles are held out, and how many."""

from __future__ import annotations

import pytest

from rcpipe.data.heldout import heldout_articles, heldout_count


@pytest.mark.parametrize(("articles", "fraction", "held"), [
    (442, 0.05, 22),  # SQuAD v1.1 train: 5% of its articles
    (3, 0.05, 1),  # a tiny set: at least one article
    (2, 0.05, 1),
    (2, 0.9, 1),  # never every article: one must train
    (200, 0.0, 0),  # 0: nothing held out
    (1, 0.0, 0),
])
def test_heldout_count(articles: int, fraction: float, held: int) -> None:
    assert heldout_count(articles, fraction) == held


def test_one_article_cannot_be_split() -> None:
    with pytest.raises(ValueError, match="at least 2 articles, the file has 1"):
        heldout_count(1, 0.05)


def test_the_slice_is_stable_under_its_seed_and_moves_with_it() -> None:
    titles = [f"article {i}" for i in range(100)]
    a = heldout_articles(titles, 0.1, seed=7)
    assert a == heldout_articles(titles, 0.1, seed=7) == sorted(a) and len(a) == 10
    assert heldout_articles(titles, 0.1, seed=8) != a
    # pinned: the draw is sha256, the same on every machine and Python version
    assert heldout_articles(titles, 0.05, seed=0) == [19, 25, 34, 46, 52]

