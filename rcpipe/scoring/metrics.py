"""Official SQuAD EM/F1, reproducing evaluate-v1.1.py and evaluate-v2.0.py exactly.

The numbers must equal the official scripts' to the last bit, so the computation keeps their
quirks on purpose (each is pointed out where it happens) and sums scores in the same order
(dataset order), because float addition is not associative.

Pure functions over already-parsed JSON: the caller reads the dataset, predictions and
no-answer probability files.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

# Deletes string.punctuation, ASCII only: unicode punctuation survives, as in the official code.
_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)

QUESTION_TYPES: tuple[str, ...] = (
    "what",
    "who",
    "when",
    "where",
    "which",
    "why",
    "how many",
    "how much",
    "how",
    "other",
)
# Inflected forms of a wh-word count as that word in question_type.
_WH_WORDS: dict[str, str] = {
    "what": "what",
    "who": "who",
    "whom": "who",
    "whose": "who",
    "when": "when",
    "where": "where",
    "which": "which",
    "why": "why",
}


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, replace the articles a/an/the by a space, squash spaces.

    The order (punctuation before articles) matters: "the-end" becomes "theend", whose "the"
    is no longer a word and so stays.
    """
    text = s.lower()
    text = text.translate(_DELETE_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when both normalise to the same string, else 0.0 (the same in v1.1 and v2.0)."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def _token_f1_v1(pred_toks: list[str], gold_toks: list[str]) -> float:
    """Bag-of-tokens F1 (counts with multiplicity) of normalised tokens; 0 when none is shared."""
    common = collections.Counter(pred_toks) & collections.Counter(gold_toks)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _token_f1_v2(pred_toks: list[str], gold_toks: list[str]) -> float:
    """v2.0 differs only when a side is empty: then 1 exactly when both are (no-answer agrees)."""
    if not pred_toks or not gold_toks:
        return float(pred_toks == gold_toks)
    return _token_f1_v1(pred_toks, gold_toks)


def f1_score(prediction: str, ground_truth: str) -> float:
    """v1.1 token F1: two empty answers score 0, as in evaluate-v1.1.py."""
    return _token_f1_v1(
        normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    )


def f1_score_v2(prediction: str, ground_truth: str) -> float:
    """v2.0 token F1: 1 when both answers are empty, 0 when only one is, else as in v1.1."""
    return _token_f1_v2(
        normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    )


def dataset_version(dataset: dict[str, Any]) -> str:
    """The SQuAD version, "1.1" or "2.0", from the dataset JSON's "version" field.

    The official files say "1.1" and "v2.0"; "2.0" is accepted too. Anything else (or no field)
    raises ValueError, since scoring with the wrong script's rules would be silently wrong.
    """
    version = dataset.get("version")
    if version == "1.1":
        return "1.1"
    if version in ("v2.0", "2.0"):
        return "2.0"
    raise ValueError(
        f'unknown SQuAD version {version!r} in the "version" field: expected "1.1", "v2.0" or "2.0"'
    )


def question_type(question: str) -> str:
    """The question's type: its first wh-word, scanning lower-cased word tokens left to right.

    Tokens are runs of word characters, so "What's" yields "what". "whom" and "whose" count as
    "who". "how" followed directly by "many" or "much" is "how many" / "how much", otherwise
    "how". A question without any of these words is "other" ("Name the ...", "In 1999, ...").
    The first wh-word rather than the first token, because SQuAD questions often open with a
    clause ("In what year ...", "According to ..., who ...").
    """
    tokens = re.findall(r"\w+", question.lower())
    for i, token in enumerate(tokens):
        if token == "how":
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            return f"how {following}" if following in ("many", "much") else "how"
        if token in _WH_WORDS:
            return _WH_WORDS[token]
    return "other"


@dataclass(frozen=True)
class QuestionScore:
    """One question's score against its prediction.

    exact and f1 are None when the predictions lack the question; has_answer is the official
    bool(qa["answers"]) (True for every v1.1 question).
    """

    qid: str
    question: str
    has_answer: bool
    exact: float | None
    f1: float | None


def _iter_questions(dataset: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every qa entry, in dataset order (the order the official scripts sum in)."""
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def _max_over_gold(
    prediction: str, gold: list[str], token_f1: Callable[[list[str], list[str]], float]
) -> tuple[float, float]:
    """(EM, F1) of a prediction, each maximised over the gold answers.

    Same values as max(exact_match_score(...)) and max(f1_score(...)) over gold, but each
    string is normalised once (scoring a dev set normalises ~100k strings).
    """
    pred_norm = normalize_answer(prediction)
    pred_toks = pred_norm.split()
    gold_norms = [normalize_answer(g) for g in gold]
    exact = max(float(pred_norm == g) for g in gold_norms)
    f1 = max(token_f1(pred_toks, g.split()) for g in gold_norms)
    return exact, f1


def _score_v1(qa: dict[str, Any], prediction: str) -> tuple[float, float]:
    gold = [answer["text"] for answer in qa["answers"]]
    if not gold:
        # evaluate-v1.1.py takes max() over an empty list and crashes here.
        raise ValueError(f"question {qa['id']!r} has no answers, which a v1.1 dataset requires")
    return _max_over_gold(prediction, gold, _token_f1_v1)


def _score_v2(qa: dict[str, Any], prediction: str) -> tuple[float, float]:
    # Gold answers that normalise to nothing (such as ".") are dropped; with none left the only
    # right answer is "", even for a question that has answers.
    gold = [answer["text"] for answer in qa["answers"] if normalize_answer(answer["text"])]
    return _max_over_gold(prediction, gold or [""], _token_f1_v2)


def question_scores(dataset: dict[str, Any], predictions: dict[str, str]) -> list[QuestionScore]:
    """Raw per-question scores for the dataset's version, one per question in dataset order.

    The single place a question is scored; score() and breakdown() both build on it.
    """
    score_one = _score_v1 if dataset_version(dataset) == "1.1" else _score_v2
    scores = []
    for qa in _iter_questions(dataset):
        qid = qa["id"]
        exact: float | None = None
        f1: float | None = None
        if qid in predictions:
            exact, f1 = score_one(qa, predictions[qid])
        scores.append(QuestionScore(qid, qa["question"], bool(qa["answers"]), exact, f1))
    return scores


def apply_no_answer_threshold(
    scores: list[QuestionScore], na_probs: dict[str, float] | None, na_prob_thresh: float
) -> list[QuestionScore]:
    """v2.0: a scored question whose no-answer probability exceeds the threshold counts as "".

    Its score becomes 1 for an unanswerable question and 0 otherwise (official
    apply_no_ans_threshold). Without probabilities every prediction has probability 0.0, as the
    official script assumes, so only a negative threshold changes anything.
    """
    thresholded = []
    for s in scores:
        if s.exact is None:
            thresholded.append(s)
            continue
        if na_probs is None:
            na_prob = 0.0
        elif s.qid in na_probs:
            na_prob = na_probs[s.qid]
        else:
            raise ValueError(f"no-answer probabilities lack question {s.qid!r}")
        if na_prob > na_prob_thresh:
            no_answer_score = float(not s.has_answer)
            s = replace(s, exact=no_answer_score, f1=no_answer_score)
        thresholded.append(s)
    return thresholded


def _percentages(exact: list[float], f1: list[float], total: int) -> dict[str, float | int]:
    return {
        "exact": 100.0 * sum(exact) / total,
        "f1": 100.0 * sum(f1) / total,
        "total": total,
    }


def _score_v1_dataset(scores: list[QuestionScore]) -> dict[str, float | int]:
    # A question without a prediction adds 0 but still counts in the total.
    total = len(scores)
    if total == 0:
        raise ValueError("the dataset has no questions")
    block = _percentages([s.exact or 0.0 for s in scores], [s.f1 or 0.0 for s in scores], total)
    return {"exact_match": block["exact"], "f1": block["f1"]}


def find_best_thresh(
    predictions: dict[str, str],
    scores: dict[str, float],
    na_probs: dict[str, float],
    has_answer: dict[str, bool],
) -> tuple[float, float]:
    """The best score over no-answer thresholds and the threshold reaching it (official walk).

    Start from answering nothing (one point per unanswerable question), walk questions by
    rising probability (stable sort in na_probs' order) and add each answerable question's raw
    score, and -1 for an unanswerable one whose raw prediction string is non-empty (the
    official test, not normalised). Percentages are of the scored questions.
    """
    current = sum(1 for answerable in has_answer.values() if not answerable)
    best, best_thresh = current, 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_thresh = current, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def _score_v2_dataset(
    scores: list[QuestionScore],
    predictions: dict[str, str],
    na_probs: dict[str, float] | None,
    na_prob_thresh: float,
) -> dict[str, float | int]:
    # Dicts keyed by qid, as in the official script: a repeated qid keeps its first position and
    # its last score.
    has_answer = {s.qid: s.has_answer for s in scores}
    raw_exact = {s.qid: s.exact for s in scores if s.exact is not None}
    raw_f1 = {s.qid: s.f1 for s in scores if s.f1 is not None}
    if not raw_exact:
        raise ValueError("the predictions answer none of the dataset's questions")
    thresholded = apply_no_answer_threshold(scores, na_probs, na_prob_thresh)
    exact = {s.qid: s.exact for s in thresholded if s.exact is not None}
    f1 = {s.qid: s.f1 for s in thresholded if s.f1 is not None}

    # Questions without a prediction are skipped here: total is the number scored.
    result = _percentages(list(exact.values()), list(f1.values()), len(exact))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, answerable in has_answer.items() if answerable is wanted]
        if qids:
            # The official script raises KeyError for a missing prediction here; we count it as
            # 0 over the whole list instead, which changes nothing when every question is
            # answered.
            block = _percentages(
                [exact.get(q, 0.0) for q in qids], [f1.get(q, 0.0) for q in qids], len(qids)
            )
            result.update({f"{prefix}_{key}": value for key, value in block.items()})
    if na_probs is not None:
        # The best-threshold search uses the raw scores, before the threshold above.
        best_exact, best_exact_thresh = find_best_thresh(
            predictions, raw_exact, na_probs, has_answer
        )
        best_f1, best_f1_thresh = find_best_thresh(predictions, raw_f1, na_probs, has_answer)
        result.update(
            best_exact=best_exact,
            best_exact_thresh=best_exact_thresh,
            best_f1=best_f1,
            best_f1_thresh=best_f1_thresh,
        )
    return result


# the official v2.0 script's best-threshold walk: the threshold best on the scored set itself
ORACLE = ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")
# what metrics/<v>.json holds beside the scores: where the threshold came from (at_threshold;
# the ensemble adds its voters' sources)
NOT_SCORES = ("na_threshold", "na_threshold_source", "oracle", "voters", "method", "methods")


def at_threshold(result: dict[str, Any], na_threshold: float | None, source: str
                 ) -> dict[str, Any]:
    """A v2.0 result at a no-answer threshold chosen elsewhere, as metrics/<v>.json holds it.

    The headline (exact, f1, HasAns_*, NoAns_*: the official script's keys at
    ``na_threshold``), then ``na_threshold`` and ``na_threshold_source`` (where it was
    chosen: "heldout", "file:<path>", "params"; the ensemble's "voters", None: each voter
    abstained at its own), and under "oracle" the walk's best_* keys:
    the best the scored set allows when it chooses its own threshold, a ceiling, not a
    result.
    """
    out = {k: v for k, v in result.items() if k not in ORACLE}
    out |= {"na_threshold": na_threshold, "na_threshold_source": source}
    if oracle := {k: result[k] for k in ORACLE if k in result}:
        out["oracle"] = oracle
    return out


def headline(result: dict[str, Any]) -> tuple[float, float]:
    """(EM, F1) of an official result: v1.1 names EM exact_match, v2.0 exact."""
    return float(result.get("exact_match", result.get("exact", 0.0))), float(result["f1"])


def score(
    dataset: dict[str, Any],
    predictions: dict[str, str],
    na_probs: dict[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float | int]:
    """The official evaluate script's output dict for the dataset's version.

    v1.1: {"exact_match", "f1"}; na_probs and na_prob_thresh are ignored (the v1.1 script has
    no such options). v2.0: exact, f1, total, then HasAns_exact, HasAns_f1, HasAns_total and
    NoAns_exact, NoAns_f1, NoAns_total when such questions exist, then best_exact,
    best_exact_thresh, best_f1, best_f1_thresh when na_probs is given.
    Raises ValueError for an unknown version, a v1.1 question without answers, a v2.0
    prediction set that answers nothing, or na_probs lacking a predicted question.
    """
    scores = question_scores(dataset, predictions)
    if dataset_version(dataset) == "1.1":
        return _score_v1_dataset(scores)
    return _score_v2_dataset(scores, predictions, na_probs, na_prob_thresh)


def breakdown(
    dataset: dict[str, Any],
    predictions: dict[str, str],
    na_probs: dict[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, dict[str, float | int]]:
    """Scores per question type, for reports: type -> {"exact", "f1", "total"} (percentages).

    Uses score()'s per-question scores (v2.0: after the no-answer threshold). Unlike v2.0's
    score(), every question counts: one without a prediction scores 0. Types appear in
    QUESTION_TYPES order and only when some question has them, so the totals sum to the
    number of questions; a v2.0 dataset adds "HasAns" and "NoAns" entries (when non-empty).
    """
    scores = question_scores(dataset, predictions)
    version = dataset_version(dataset)
    if version == "2.0":
        scores = apply_no_answer_threshold(scores, na_probs, na_prob_thresh)
    groups: dict[str, list[QuestionScore]] = {name: [] for name in QUESTION_TYPES}
    if version == "2.0":
        groups.update(HasAns=[], NoAns=[])
    for s in scores:
        groups[question_type(s.question)].append(s)
        if version == "2.0":
            groups["HasAns" if s.has_answer else "NoAns"].append(s)
    return {
        name: _percentages(
            [s.exact or 0.0 for s in members], [s.f1 or 0.0 for s in members], len(members)
        )
        for name, members in groups.items()
        if members
    }
