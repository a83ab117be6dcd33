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



def test_a_growing_file_holds_out_no_more_questions_than_the_cap() -> None:
    """5% of 40,000 articles of 50 questions is 100,000 questions scored at every checkpoint;
    the cap takes the drawn articles in the draw's order while they fit."""
    titles = [f"article {i}" for i in range(40_000)]
    sizes = [50] * len(titles)
    capped = heldout_articles(titles, 0.05, 0, sizes, max_questions=10_000)
    assert len(capped) == 200 and set(capped) < set(heldout_articles(titles, 0.05, 0))
    assert heldout_articles(titles, 0.05, 0, sizes, None) == heldout_articles(titles, 0.05, 0)
    # an article larger than the cap: the first drawn is held out whole, alone
    assert len(heldout_articles(titles[:100], 0.05, 0, [20_000] * 100, 10_000)) == 1
    small = [f"a{i}" for i in range(442)]  # SQuAD's 442 articles: 22 under the cap
    assert heldout_articles(small, 0.05, 0, [200] * 442, 10_000) == \
        heldout_articles(small, 0.05, 0)
