"""Official SQuAD scoring: hand-computed cases, the official scripts' output, and relations
that must hold between scores of related prediction sets."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from rcpipe.scoring.metrics import (
    ORACLE,
    at_threshold,
    breakdown,
    dataset_version,
    exact_match_score,
    f1_score,
    f1_score_v2,
    headline,
    normalize_answer,
    question_type,
    score,
)

SHARED_DATA = Path("/work/shared/data")
SCORE_CHECK = SHARED_DATA / "score-check"
SQUAD = SHARED_DATA / "squad"


def make_squad(version: str, questions: list[tuple[str, str, list[str]]]) -> dict[str, Any]:
    """A one-article dataset: (qid, question, gold answer texts); no answers = unanswerable."""
    qas = [
        {
            "id": qid,
            "question": question,
            "answers": [{"text": text, "answer_start": 0} for text in answers],
            **({"is_impossible": not answers} if version != "1.1" else {}),
        }
        for qid, question, answers in questions
    ]
    paragraph = {"context": "unused by scoring", "qas": qas}
    return {"version": version, "data": [{"title": "t", "paragraphs": [paragraph]}]}


def all_qas(dataset: dict[str, Any]) -> list[dict[str, Any]]:
    return [qa for a in dataset["data"] for p in a["paragraphs"] for qa in p["qas"]]


# --- normalisation and single-answer scores ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The  Cat's hat!", "cats hat"),
        ("an apple a day", "apple day"),
        ("theater anthem", "theater anthem"),  # articles only as whole words
        ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word
        ("A.B.", "ab"),
        ("“Paris”", "“paris”"),  # unicode quotes are not string.punctuation
        ("Café—Bar", "café—bar"),  # nor is the em dash
        ("the", ""),
        (" \t\n", ""),
    ],
)
def test_normalize_answer(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


def test_exact_and_f1_single_answers() -> None:
    assert exact_match_score("Eiffel tower.", "the Eiffel Tower") == 1.0
    assert exact_match_score("Eiffel", "the Eiffel Tower") == 0.0
    # pred {in, paris} vs gold {paris, france}: one shared token, P = R = 1/2.
    assert f1_score("in Paris", "Paris, France") == pytest.approx(0.5)
    # pred {in, paris} vs gold {paris}: P = 1/2, R = 1 -> 2/3.
    assert f1_score("in Paris", "Paris") == pytest.approx(2 / 3)
    # Counts with multiplicity: pred {a1, a1, b} vs gold {a1, b, c}: shared 2 -> 2/3.
    assert f1_score("x x y", "x y z") == pytest.approx(2 / 3)
    assert f1_score("“Paris”", "Paris") == 0.0  # curly quotes stay part of the token


def test_f1_of_empty_answers_differs_between_versions() -> None:
    assert f1_score("", ".") == 0.0  # v1.1: nothing shared -> 0, even when both are empty
    assert f1_score_v2("", ".") == 1.0  # v2.0: both empty -> agree
    assert f1_score_v2("the", "") == 1.0
    assert f1_score_v2("Paris", "") == 0.0
    assert f1_score_v2("", "Paris") == 0.0
    assert exact_match_score("", ".") == 1.0


@pytest.mark.parametrize(("version", "expected"), [("1.1", "1.1"), ("v2.0", "2.0"), ("2.0", "2.0")])
def test_dataset_version(version: str, expected: str) -> None:
    assert dataset_version({"version": version, "data": []}) == expected


@pytest.mark.parametrize("version", ["v1.1", "3.0", "", None])
def test_dataset_version_rejects_unknown(version: str | None) -> None:
    with pytest.raises(ValueError, match="version"):
        dataset_version({"version": version, "data": []})
    with pytest.raises(ValueError, match="version"):
        dataset_version({"data": []})


# --- v1.1, hand-computed -----------------------------------------------------------------


V1 = make_squad(
    "1.1",
    [
        ("q1", "What tower?", ["the Eiffel Tower"]),
        ("q2", "Where?", ["Paris, France", "Paris"]),
        ("q3", "Who?", ["Gustave Eiffel"]),
    ],
)


def test_v1_scores_missing_prediction_as_zero_in_the_total() -> None:
    # q1 exact; q2 EM 0, F1 max(1/2, 2/3) = 2/3; q3 unanswered: 0 but counted.
    result = score(V1, {"q1": "Eiffel tower.", "q2": "in Paris"})
    assert list(result) == ["exact_match", "f1"]
    assert result["exact_match"] == pytest.approx(100.0 * 1 / 3)
    assert result["f1"] == pytest.approx(100.0 * (1 + 2 / 3) / 3)


def test_v1_ignores_predictions_for_unknown_questions_and_na_probs() -> None:
    preds = {"q1": "Eiffel Tower", "q2": "Paris", "q3": "Eiffel", "zz": "x"}
    result = score(V1, preds, na_probs={"q1": 0.9}, na_prob_thresh=0.0)
    # q3 "Eiffel" vs "Gustave Eiffel": EM 0, F1 P = 1, R = 1/2 -> 2/3.
    assert result == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(800 / 9)}


def test_v1_question_without_answers_is_an_error() -> None:
    with pytest.raises(ValueError, match="q0"):
        score(make_squad("1.1", [("q0", "What?", [])]), {"q0": ""})


# --- v2.0, hand-computed -----------------------------------------------------------------

# a1: F1 1/2 ("broncos" shared, P = R = 1/2), EM 0.
# a2: its only gold "." normalises to nothing -> gold [""]; "" is right, yet it "has answers".
# n1, n2: unanswerable; n1 abstains (right), n2 answers (wrong).
# a3: wrong.
V2 = make_squad(
    "v2.0",
    [
        ("a1", "Who won?", ["Denver Broncos"]),
        ("a2", "What ends it?", ["."]),
        ("n1", "Why not?", []),
        ("n2", "When never?", []),
        ("a3", "When?", ["1999"]),
    ],
)
V2_PREDS = {"a1": "Broncos team", "a2": "", "n1": "", "n2": "something", "a3": "in 2000"}
# Deliberately not in sorted order: the threshold walk sorts them.
V2_NA = {"a1": 0.1, "n2": 0.2, "a2": 0.3, "n1": 0.9, "a3": 0.4}


def test_v2_without_na_probs() -> None:
    result = score(V2, V2_PREDS)
    expected = {
        "exact": 100.0 * 2 / 5,  # a2, n1
        "f1": 100.0 * 2.5 / 5,  # a1 0.5 + a2 + n1
        "total": 5,
        "HasAns_exact": 100.0 * 1 / 3,
        "HasAns_f1": 100.0 * 1.5 / 3,
        "HasAns_total": 3,
        "NoAns_exact": 50.0,
        "NoAns_f1": 50.0,
        "NoAns_total": 2,
    }
    assert list(result) == list(expected)  # the official key order
    assert result == pytest.approx(expected)
    assert isinstance(result["total"], int)


def test_v2_best_threshold_walk() -> None:
    result = score(V2, V2_PREDS, na_probs=V2_NA)
    # Walk by na_prob: a1 (.1), n2 (.2), a2 (.3), a3 (.4), n1 (.9), starting from 2 (the
    # unanswerable questions). EM: +0, -1 (n2 answers), +1, +0, +0 -> never above 2, so
    # the best stays 2/5 at the initial threshold 0.0.
    # F1: +0.5 -> 2.5 (new best at .1), -1, +1 (2.5, not above), +0, +0.
    assert result["best_exact"] == pytest.approx(40.0)
    assert result["best_exact_thresh"] == 0.0
    assert result["best_f1"] == pytest.approx(50.0)
    assert result["best_f1_thresh"] == 0.1
    assert list(result)[-4:] == ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
    # The default threshold 1.0 changes nothing, so the rest equals the no-file result.
    assert {k: result[k] for k in score(V2, V2_PREDS)} == score(V2, V2_PREDS)


def test_v2_na_prob_threshold() -> None:
    result = score(V2, V2_PREDS, na_probs=V2_NA, na_prob_thresh=0.15)
    # Above .15: n2 (-> 1, unanswerable), a2 (-> 0: it has answers, even though "" scored 1
    # raw), a3 (-> 0), n1 (-> 1). a1 keeps EM 0, F1 0.5.
    assert result["exact"] == pytest.approx(100.0 * 2 / 5)
    assert result["f1"] == pytest.approx(100.0 * 2.5 / 5)
    assert result["HasAns_exact"] == 0.0
    assert result["HasAns_f1"] == pytest.approx(100.0 * 0.5 / 3)
    assert result["NoAns_exact"] == 100.0
    assert result["NoAns_f1"] == 100.0
    # best_* use the raw scores, whatever the threshold.
    assert result["best_exact"] == pytest.approx(40.0)
    assert result["best_f1_thresh"] == 0.1


def test_v2_ties_in_na_prob_keep_the_na_probs_order() -> None:
    dataset = make_squad("v2.0", [("h", "What?", ["x"]), ("n", "Who?", [])])
    preds = {"h": "x", "n": "y"}
    # Start 1. n first: 1 - 1 + 1 = 1, never above 1 -> 50% at 0.0.
    late = score(dataset, preds, na_probs={"n": 0.5, "h": 0.5})
    assert (late["best_exact"], late["best_exact_thresh"]) == (50.0, 0.0)
    # h first: 1 + 1 = 2 -> 100% at 0.5.
    early = score(dataset, preds, na_probs={"h": 0.5, "n": 0.5})
    assert (early["best_exact"], early["best_exact_thresh"]) == (100.0, 0.5)


def test_v2_unanswerable_with_non_empty_prediction_normalising_to_empty() -> None:
    # "the" scores 1 on an unanswerable question, but the threshold walk tests the raw
    # string, so it counts -1 there.
    dataset = make_squad("v2.0", [("n", "Who?", [])])
    result = score(dataset, {"n": "the"}, na_probs={"n": 0.7})
    assert result["exact"] == 100.0
    assert (result["best_exact"], result["best_exact_thresh"]) == (100.0, 0.0)


def test_v2_missing_predictions_are_skipped_in_the_total() -> None:
    preds = {k: v for k, v in V2_PREDS.items() if k != "a2"}
    result = score(V2, preds, na_probs=V2_NA)
    assert result["total"] == 4
    assert result["exact"] == pytest.approx(100.0 * 1 / 4)  # n1
    assert result["f1"] == pytest.approx(100.0 * 1.5 / 4)
    # The HasAns block keeps every answerable question; the missing one scores 0.
    assert result["HasAns_total"] == 3
    assert result["HasAns_exact"] == 0.0
    assert result["HasAns_f1"] == pytest.approx(100.0 * 0.5 / 3)
    # Walk without a2: 2, +0.5 (best at .1), -1, +0, +0; percentages of the 4 scored.
    assert result["best_f1"] == pytest.approx(100.0 * 2.5 / 4)
    assert result["best_exact"] == pytest.approx(100.0 * 2 / 4)


def test_v2_blocks_only_for_existing_question_kinds() -> None:
    dataset = make_squad("v2.0", [("n", "Who?", [])])
    keys = "exact f1 total NoAns_exact NoAns_f1 NoAns_total".split()
    assert list(score(dataset, {"n": ""})) == keys


def test_v2_negative_threshold_without_na_probs_abstains_everywhere() -> None:
    # Without a probability file every prediction has probability 0.0 > -1.
    result = score(V2, V2_PREDS, na_prob_thresh=-1.0)
    assert result["exact"] == pytest.approx(100.0 * 2 / 5)
    assert result["HasAns_exact"] == 0.0
    assert result["NoAns_exact"] == 100.0
    assert "best_exact" not in result


def test_v2_input_errors() -> None:
    with pytest.raises(ValueError, match="a3"):
        score(V2, V2_PREDS, na_probs={k: v for k, v in V2_NA.items() if k != "a3"})
    with pytest.raises(ValueError, match="none"):
        score(V2, {"other": "x"})


# --- question types and breakdown --------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        ("What is the capital of France?", "what"),
        ("In what year did the war end?", "what"),
        ("What's the name of the river?", "what"),
        ("Who wrote Hamlet?", "who"),
        ("Whose idea was it?", "who"),
        ("To whom was it given?", "who"),
        ("When did it open?", "when"),
        ("Where is the tower?", "where"),
        ("Which team won?", "which"),
        ("The team won in which year?", "which"),
        ("Why did they leave?", "why"),
        ("How many people live there?", "how many"),
        ("HOW MUCH did it cost?", "how much"),
        ("How did it start?", "how"),
        ("how", "how"),
        ("Name the largest city.", "other"),
        ("Somehow, they won?", "other"),  # "how" only as a whole word
        ("What is how many times?", "what"),  # the first wh-word decides
        ("", "other"),
    ],
)
def test_question_type(question: str, kind: str) -> None:
    assert question_type(question) == kind


def test_breakdown_v1_counts_missing_predictions() -> None:
    result = breakdown(V1, {"q1": "Eiffel tower.", "q2": "in Paris"})
    assert result == {
        "what": {"exact": 100.0, "f1": 100.0, "total": 1},
        "where": {"exact": 0.0, "f1": pytest.approx(200 / 3), "total": 1},
        "who": {"exact": 0.0, "f1": 0.0, "total": 1},
    }
    assert list(result) == ["what", "who", "where"]  # QUESTION_TYPES order


def test_breakdown_v2_applies_threshold_and_adds_answerability() -> None:
    preds = {k: v for k, v in V2_PREDS.items() if k != "a2"}
    result = breakdown(V2, preds, na_probs=V2_NA, na_prob_thresh=0.15)
    # Thresholded: a1 (0, .5), a2 missing -> 0, n1 1, n2 1, a3 0.
    assert result["who"] == {"exact": 0.0, "f1": 50.0, "total": 1}
    assert result["what"] == {"exact": 0.0, "f1": 0.0, "total": 1}
    assert result["when"] == {"exact": 50.0, "f1": 50.0, "total": 2}
    assert result["why"] == {"exact": 100.0, "f1": 100.0, "total": 1}
    assert result["HasAns"] == {"exact": 0.0, "f1": pytest.approx(50 / 3), "total": 3}
    assert result["NoAns"] == {"exact": 100.0, "f1": 100.0, "total": 2}
    types = sum(v["total"] for k, v in result.items() if k not in ("HasAns", "NoAns"))
    assert types == 5


# --- the official scripts' output and derived prediction sets ----------------------------


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def official() -> dict[str, Any]:
    """The score-check files and the dev sets; skipped where a clone lacks them."""
    if not SCORE_CHECK.is_dir() or not SQUAD.is_dir():
        pytest.skip(f"{SCORE_CHECK} or {SQUAD} is not here (only the project's CI has them)")
    return {
        "v1": _load(SQUAD / "dev-v1.1.json"),
        "v2": _load(SQUAD / "dev-v2.0.json"),
        "pred_v1": _load(SCORE_CHECK / "pred-v1.1.json"),
        "pred_v2": _load(SCORE_CHECK / "pred-v2.0.json"),
        "na_v2": _load(SCORE_CHECK / "na-v2.0.json"),
        "expected": _load(SCORE_CHECK / "expected.json"),
    }


def _assert_matches(result: dict[str, float | int], expected: dict[str, float | int]) -> None:
    assert list(result) == list(expected)
    for key, value in expected.items():
        if key.endswith("_thresh") or key.endswith("total"):
            assert result[key] == value, key
        else:
            assert result[key] == pytest.approx(value, abs=1e-6), key


def test_matches_official_scripts(official: dict[str, Any]) -> None:
    expected = official["expected"]
    _assert_matches(score(official["v1"], official["pred_v1"]), expected["v1.1"])
    _assert_matches(score(official["v2"], official["pred_v2"]), expected["v2.0"])
    _assert_matches(
        score(official["v2"], official["pred_v2"], na_probs=official["na_v2"]),
        expected["v2.0 with --na-prob-file na-v2.0.json"],
    )


def test_gold_predictions_score_100(official: dict[str, Any]) -> None:
    v1_gold = {qa["id"]: qa["answers"][0]["text"] for qa in all_qas(official["v1"])}
    assert score(official["v1"], v1_gold) == {"exact_match": 100.0, "f1": 100.0}
    # v2.0: the first gold answer that is more than punctuation, "" for unanswerable.
    v2_gold = {
        qa["id"]: next((a["text"] for a in qa["answers"] if a["text"].strip(".")), "")
        for qa in all_qas(official["v2"])
    }
    result = score(official["v2"], v2_gold)
    assert result["exact"] == result["f1"] == result["HasAns_f1"] == result["NoAns_f1"] == 100.0
    assert (result["total"], result["HasAns_total"], result["NoAns_total"]) == (11873, 5928, 5945)


def test_empty_predictions(official: dict[str, Any]) -> None:
    v1_qas = all_qas(official["v1"])
    # In v1.1, "" matches exactly the gold answers that normalise to nothing: three
    # questions have a gold answer ".". F1 is 0 even there (v1.1 quirk).
    dotted = sum(any(a["text"] == "." for a in qa["answers"]) for qa in v1_qas)
    assert dotted == 3
    result = score(official["v1"], {qa["id"]: "" for qa in v1_qas})
    assert result["exact_match"] == pytest.approx(100.0 * dotted / len(v1_qas))
    assert result["f1"] == 0.0
    # In v2.0, "." golds are ignored (those questions have other answers), so "" scores
    # exactly the unanswerable questions.
    result = score(official["v2"], {qa["id"]: "" for qa in all_qas(official["v2"])})
    assert result["exact"] == result["f1"] == pytest.approx(100.0 * 5945 / 11873)
    assert result["HasAns_exact"] == result["HasAns_f1"] == 0.0
    assert result["NoAns_exact"] == 100.0


def _perturbed(predictions: dict[str, str], seed: int) -> dict[str, str]:
    """Drop, add or swap words in a third of the predictions, blank some others."""
    rng = random.Random(seed)
    texts = list(predictions.values())
    out = {}
    for qid, text in predictions.items():
        roll = rng.random()
        words = text.split()
        if roll < 0.1 and words:
            words.pop(rng.randrange(len(words)))
        elif roll < 0.2:
            words.insert(rng.randrange(len(words) + 1), rng.choice(["the", "of", "x", "."]))
        elif roll < 0.3:
            words = rng.choice(texts).split()
        elif roll < 0.35:
            words = []
        out[qid] = " ".join(words)
    return out


def _restricted(dataset: dict[str, Any], qids: set[str]) -> dict[str, Any]:
    """The dataset with only the given questions, in the same order."""
    data = [
        {
            **article,
            "paragraphs": [
                {**p, "qas": [qa for qa in p["qas"] if qa["id"] in qids]}
                for p in article["paragraphs"]
            ],
        }
        for article in dataset["data"]
    ]
    return {**dataset, "data": data}


@pytest.mark.parametrize("seed", [0, 1])
def test_missing_predictions_relate_to_the_answered_subset(
    official: dict[str, Any], seed: int
) -> None:
    rng = random.Random(seed)
    for version in ("v1", "v2"):
        dataset, preds = official[version], official[f"pred_{version}"]
        preds = _perturbed(preds, seed)
        kept = {qid: text for qid, text in preds.items() if rng.random() < 0.5}
        subset = _restricted(dataset, set(kept))
        n_all, n_kept = len(all_qas(dataset)), len(all_qas(subset))
        partial, on_subset = score(dataset, kept), score(subset, kept)
        if dataset_version(dataset) == "1.1":
            # Missing questions add 0 to the sum but count in the total.
            for key in ("exact_match", "f1"):
                assert partial[key] * n_all == pytest.approx(on_subset[key] * n_kept)
        else:
            # Missing questions are left out of the overall score altogether.
            for key in ("exact", "f1", "total"):
                assert partial[key] == pytest.approx(on_subset[key])
            assert partial["total"] == n_kept


@pytest.mark.parametrize(("seed", "thresh"), [(0, 0.5), (1, 0.9)])
def test_threshold_equals_blanking_predictions(
    official: dict[str, Any], seed: int, thresh: float
) -> None:
    # Answering "" scores 1 on unanswerable questions and 0 on answerable ones (none in
    # dev-v2.0 has only golds that normalise to nothing), exactly what the threshold assigns.
    preds, na = _perturbed(official["pred_v2"], seed), official["na_v2"]
    blanked = {qid: "" if na[qid] > thresh else text for qid, text in preds.items()}
    thresholded = score(official["v2"], preds, na_probs=na, na_prob_thresh=thresh)
    assert {k: thresholded[k] for k in score(official["v2"], blanked)} == pytest.approx(
        score(official["v2"], blanked)
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_breakdown_agrees_with_score(official: dict[str, Any], seed: int) -> None:
    for version in ("v1", "v2"):
        dataset, preds = official[version], official[f"pred_{version}"]
        preds = _perturbed(preds, seed)
        # Answer every question so that both count the same questions.
        preds = {qa["id"]: preds.get(qa["id"], "") for qa in all_qas(dataset)}
        parts = breakdown(dataset, preds)
        overall = score(dataset, preds)
        by_type = {k: v for k, v in parts.items() if k not in ("HasAns", "NoAns")}
        n = len(all_qas(dataset))
        assert sum(v["total"] for v in by_type.values()) == n
        exact_key = "exact_match" if dataset_version(dataset) == "1.1" else "exact"
        for key, overall_key in (("exact", exact_key), ("f1", "f1")):
            weighted = sum(v[key] * v["total"] for v in by_type.values())
            assert weighted == pytest.approx(overall[overall_key] * n)
        if "HasAns" in parts:
            for prefix in ("HasAns", "NoAns"):
                for key in ("exact", "f1", "total"):
                    assert parts[prefix][key] == pytest.approx(overall[f"{prefix}_{key}"])


def test_at_threshold_keeps_the_headline_and_files_the_walk_as_the_oracle() -> None:
    official = {"exact": 50.0, "f1": 55.0, "total": 4, "HasAns_f1": 40.0, "NoAns_f1": 70.0,
                "best_exact": 60.0, "best_exact_thresh": 0.3, "best_f1": 65.0,
                "best_f1_thresh": 0.3}
    out = at_threshold(official, 0.7, "heldout")
    assert out == {"exact": 50.0, "f1": 55.0, "total": 4, "HasAns_f1": 40.0,
                   "NoAns_f1": 70.0, "na_threshold": 0.7, "na_threshold_source": "heldout",
                   "oracle": {k: official[k] for k in ORACLE}}
    assert headline(out) == (50.0, 55.0)  # what every reader ranks by: not the oracle
