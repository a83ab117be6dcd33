"""The paired comparison of two models' answers (rcpipe/scoring/compare.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rcpipe.scoring import metrics
from rcpipe.scoring.compare import paired_difference, seeded_difference


def _doc(paragraphs: int, per: int, version: str = "1.1") -> dict[str, Any]:
    """``paragraphs`` passages of ``per`` questions each; question p-q's answer 'gold p q'."""
    return {"version": version, "data": [{"title": "t", "paragraphs": [
        {"context": "c", "qas": [{"id": f"{p}-{q}", "question": "what?",
                                  "answers": [{"text": f"gold {p} {q}", "answer_start": 0}]}
                                 for q in range(per)]}
        for p in range(paragraphs)]}]}


def _right(doc: dict[str, Any], where: set[str]) -> dict[str, str]:
    """The gold answer for the questions in ``where``, a wrong one elsewhere."""
    qas = [qa for a in doc["data"] for p in a["paragraphs"] for qa in p["qas"]]
    return {qa["id"]: qa["answers"][0]["text"] if qa["id"] in where else "nothing"
            for qa in qas}


def test_the_same_answers_differ_by_nothing() -> None:
    doc = _doc(20, 5)
    a = _right(doc, {"0-0", "3-1"})
    d = paired_difference(doc, a, a)
    assert (d.diff, d.se, d.low, d.high) == (0.0, 0.0, 0.0, 0.0)
    assert (d.paragraphs, d.questions) == (20, 100)


def test_the_difference_is_the_official_f1s_difference() -> None:
    doc = _doc(20, 5)
    a, b = _right(doc, {"0-0", "1-1"}), _right(doc, {"0-0", "2-2", "5-0", "5-1"})
    d = paired_difference(doc, a, b)
    assert d.f1_a == pytest.approx(metrics.score(doc, a)["f1"])
    assert d.f1_b == pytest.approx(metrics.score(doc, b)["f1"])
    assert d.diff == pytest.approx(d.f1_b - d.f1_a) and d.diff == pytest.approx(2.0)
    assert d.low <= d.diff <= d.high


def test_a_gain_in_one_passage_is_not_called_a_gain_but_one_spread_over_all_is() -> None:
    doc = _doc(50, 4)
    base = _right(doc, set())
    # every question of one paragraph right: +2 F1, which a bootstrap over questions would
    # call a gain (all 4 drawn out in ~2% of draws), one over paragraphs chance (~36%)
    clumped = _right(doc, {f"7-{q}" for q in range(4)})
    spread = _right(doc, {f"{p}-0" for p in range(50)})  # one question of every paragraph
    one = paired_difference(doc, base, clumped)
    assert one.low <= 0.0 < one.high
    every = paired_difference(doc, base, spread)
    assert every.low > 0.0  # every passage better: a gain


def test_a_question_without_an_answer_scores_zero_and_v2_empty_answers_count() -> None:
    doc = _doc(10, 2, version="v2.0")
    doc["data"][0]["paragraphs"][0]["qas"][0]["answers"] = []  # unanswerable
    a = _right(doc, set()) | {"0-0": ""}  # abstains where it should
    b = {k: v for k, v in a.items() if k != "0-0"}  # says nothing for it: scores 0
    d = paired_difference(doc, a, b)
    assert d.f1_a == pytest.approx(metrics.score(doc, a)["f1"]) == pytest.approx(5.0)
    assert d.diff == pytest.approx(-5.0)


def test_over_seeds_the_mean_is_the_seed_averaged_f1_and_the_range_each_pairs() -> None:
    doc = _doc(40, 4)
    a = [_right(doc, {f"{p}-0" for p in range(0, 10)}), _right(doc, {f"{p}-0" for p in range(20)})]
    b = [_right(doc, {f"{p}-0" for p in range(40)}), _right(doc, {f"{p}-1" for p in range(30)})]
    d = seeded_difference(doc, a, b)
    singles = [paired_difference(doc, x, y) for x, y in zip(a, b, strict=True)]
    assert [s.diff for s in d.per_seed] == [s.diff for s in singles]
    assert d.mean.f1_a == pytest.approx((singles[0].f1_a + singles[1].f1_a) / 2)
    assert d.mean.f1_b == pytest.approx((singles[0].f1_b + singles[1].f1_b) / 2)
    assert d.seed_range == (pytest.approx(6.25), pytest.approx(18.75))
    assert d.verdict() == "gain" and "2 seeds" in d.line()


def test_a_gain_one_seed_pair_contradicts_is_chance() -> None:
    doc = _doc(40, 4)
    a = [_right(doc, set()), _right(doc, {f"{p}-0" for p in range(40)})]
    # seed 1: every paragraph better (+25); seed 2: 4 paragraphs worse (-2.5)
    b = [_right(doc, {f"{p}-0" for p in range(40)}), _right(doc, {f"{p}-0" for p in range(4, 40)})]
    d = seeded_difference(doc, a, b)
    assert d.mean.low > 0  # the averaged answers alone would call it a gain
    assert d.seed_range[0] < 0 < d.seed_range[1]
    assert d.verdict() == "chance"


def test_seeds_must_pair_up() -> None:
    doc = _doc(4, 2)
    with pytest.raises(ValueError, match="same number of seeds"):
        seeded_difference(doc, [_right(doc, set())], [])
