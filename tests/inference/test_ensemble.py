"""Majority vote across models' answers."""

from __future__ import annotations

from typing import Any

import pytest

from rcpipe.inference.ensemble import majority_vote, predictions_from


def answer(text: str, prob: float, na_prob: float = 0.0) -> dict[str, Any]:
    return {"text": text, "prob": prob, "na_prob": na_prob}


def test_plain_majority() -> None:
    nbests = [
        {"q": answer("Denver", 0.3, 0.1)},
        {"q": answer("Carolina", 0.9, 0.2)},
        {"q": answer("Denver", 0.4, 0.6)},
    ]
    result = majority_vote(nbests)
    assert result == {
        "q": {"text": "Denver", "prob": 0.4, "votes": 2, "na_prob": pytest.approx(0.3)}
    }
    assert isinstance(result["q"]["votes"], int)


def test_tie_goes_to_the_highest_single_voter_prob() -> None:
    # B and A have two votes each. A has the highest single prob (0.9), so A wins. Keeping
    # each text's last voter's prob (the published bug) gives A 0.1 < B 0.5 and picks B;
    # first-seen order also picks B.
    nbests = [
        {"q": answer("B", 0.5)},
        {"q": answer("A", 0.9)},
        {"q": answer("B", 0.5)},
        {"q": answer("A", 0.1)},
    ]
    result = majority_vote(nbests)["q"]
    assert (result["text"], result["prob"], result["votes"]) == ("A", 0.9, 2)


def test_full_tie_goes_to_the_text_seen_first() -> None:
    nbests = [{"q": answer("late", 0.5)}, {"q": answer("early", 0.5)}]
    assert majority_vote(nbests)["q"]["text"] == "late"
    assert majority_vote(nbests[::-1])["q"]["text"] == "early"


def test_empty_text_votes_like_any_other() -> None:
    nbests = [
        {"q": answer("", 0.2, 0.9)},
        {"q": answer("Paris", 0.8, 0.1)},
        {"q": answer("", 0.3, 0.8)},
    ]
    result = majority_vote(nbests)["q"]
    assert (result["text"], result["prob"], result["votes"]) == ("", 0.3, 2)
    assert result["na_prob"] == pytest.approx(0.6)


def test_votes_compare_exact_text() -> None:
    # "paris" and "Paris" normalise alike for scoring but are different votes.
    nbests = [
        {"q": answer("Paris", 0.2)},
        {"q": answer("paris", 0.3)},
        {"q": answer("paris", 0.1)},
    ]
    assert majority_vote(nbests)["q"]["text"] == "paris"


def test_qids_missing_from_some_models() -> None:
    nbests = [
        {"q1": answer("x", 0.5, 0.2)},
        {"q1": answer("y", 0.6, 0.4), "q2": answer("z", 0.7, 0.8)},
    ]
    result = majority_vote(nbests)
    assert list(result) == ["q1", "q2"]
    assert result["q1"]["text"] == "y"  # 1-1 tie, 0.6 > 0.5
    assert result["q1"]["na_prob"] == pytest.approx(0.3)
    # Only the model that answered q2 votes, and only its na_prob counts.
    assert result["q2"] == {"text": "z", "prob": 0.7, "votes": 1, "na_prob": 0.8}


def test_deterministic_and_inputs_untouched() -> None:
    nbests = [
        {"q1": answer("a", 0.1), "q2": answer("", 0.4)},
        {"q2": answer("b", 0.4), "q1": answer("c", 0.1)},
        {"q1": answer("c", 0.2), "q2": answer("b", 0.3)},
    ]
    snapshot = [{qid: dict(a) for qid, a in nbest.items()} for nbest in nbests]
    first = majority_vote(nbests)
    assert first == majority_vote(nbests)
    assert nbests == snapshot
    assert predictions_from(first) == {"q1": "c", "q2": "b"}


def test_no_models_gives_nothing() -> None:
    assert majority_vote([]) == {}
    assert predictions_from({}) == {}


# ------------------------------------------------ averaged distributions (mean, selected)

def one_hot(split: Any, rows_right: bool, seed: int = 0) -> dict[str, Any]:
    """A member's distributions over ``split``: all the mass on each question's gold span
    (``rows_right``) or on a wrong token, with a little noise spread over the rest."""
    import numpy as np

    from rcpipe.inference.distributions import Dist

    rng, data, out = np.random.default_rng(seed), split.dataset, {}
    for row, q in enumerate(data.ids):
        n = len(data.cw.row(row))
        p1 = rng.random(n).astype(np.float32) * 0.01
        p2 = rng.random(n).astype(np.float32) * 0.01
        y1, y2 = int(data.y1[row]), int(data.y2[row])
        if not rows_right:
            y1 = y2 = (y2 + 3) % n
        p1[y1] += 1.0
        p2[y2] += 1.0
        out[q] = Dist(p1 / p1.sum(), p2 / p2.sum(), 0.0)
    return out


@pytest.fixture
def dev_split(prepared: Any) -> Any:
    from rcpipe.data.dataset import SquadDataset
    from rcpipe.inference.reading import Split

    return Split(SquadDataset.from_parquet(prepared.out_dir / "dev"),
                 prepared.data.dev_doc)


def test_the_mean_answers_the_span_the_members_agree_on(dev_split: Any) -> None:
    """Two members sure of the gold span outweigh one sure of another token: the mean gives
    the gold answers (F1 100), the wrong member alone gives none of them."""
    from rcpipe.inference.ensemble import scored

    right, wrong = one_hot(dev_split, True, 1), one_hot(dev_split, False, 2)
    _, alone, _ = scored([wrong], [1.0], dev_split, 15)
    _, mean, _ = scored([right, right, wrong], [1.0, 1.0, 1.0], dev_split, 15)
    assert mean["f1"] == pytest.approx(100.0) and alone["f1"] < 50
    # the weights count: the wrong member weighed above both right ones wins
    _, outweighed, _ = scored([right, wrong], [1.0, 3.0], dev_split, 15)
    assert outweighed["f1"] == pytest.approx(alone["f1"])


def test_selection_keeps_the_member_that_helps_on_the_held_out_questions(
        dev_split: Any) -> None:
    """Greedy selection with replacement: the right member is picked first and the wrong
    one never gains a weight; the kept round is the best one."""
    from rcpipe.inference.ensemble import select

    weights, curve = select([one_hot(dev_split, False, 3), one_hot(dev_split, True, 4)],
                            dev_split, 15, rounds=3)
    assert weights[0] == 0 and weights[1] >= 1
    assert curve[0] == pytest.approx(100.0) and len(curve) == 3


def test_a_served_pair_averages_its_members_as_the_stage_does() -> None:
    """inference/answer.py's ``averaged`` (the champion app's mean): the weighted mean of the
    members' distributions over the pair's tokens, its best span cut from the context;
    v2.0: nothing where the averaged na_prob passes the threshold."""
    from rcpipe.inference.answer import averaged

    context = "Ada wrote it in 1843 ."
    tokens = [[0, 3], [4, 9], [10, 12], [13, 15], [16, 20], [21, 22]]

    def member(at: int, na: float) -> dict[str, Any]:
        p = [0.02] * len(tokens)
        p[at] = 0.9
        return {"p_start": p, "p_end": p, "na_prob": na, "tokens": tokens, "window": 0,
                "windows": 1}

    year, name = member(4, 0.1), member(0, 0.5)
    assert averaged([year, name, year], [1.0, 1.0, 1.0], context, 15)["text"] == "1843"
    heavier = averaged([year, name], [1.0, 3.0], context, 15)
    assert (heavier["text"], heavier["start"], heavier["end"]) == ("Ada", 0, 3)
    assert heavier["na_prob"] == pytest.approx(0.4)
    assert heavier["p_start"][0] == pytest.approx((0.02 + 3 * 0.9) / 4)
    assert averaged([year, name], [1.0, 3.0], context, 15, na_threshold=0.3)["text"] == ""
