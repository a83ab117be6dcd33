"""Majority-vote ensembling of several models' answers (one answer per model and question)."""

from __future__ import annotations

from typing import Any


def majority_vote(nbests: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Combine models' answers by vote on the exact answer text.

    Each nbest maps qid -> {"text": str, "prob": float, "na_prob": float}, one model's
    answer; "" (no answer) is a text like any other. For every qid any model answers, the text
    with the most votes wins. A tie goes to the tied text with the highest prob given by any
    single voter for it: the maximum over that text's voters, not the last voter's prob (which
    would let model order decide; a published implementation had that bug). A tie in that too
    goes to the text seen first in model order, so the result is deterministic.

    Returns qid -> {"text", "prob" (the winning text's highest single-voter prob), "votes"
    (int), "na_prob" (mean over the models that answered the qid)}. Qids appear in order of
    first appearance across the models.
    """
    votes: dict[str, dict[str, int]] = {}  # qid -> text -> votes; texts in first-seen order
    best_prob: dict[str, dict[str, float]] = {}  # qid -> text -> max single-voter prob
    na_probs: dict[str, list[float]] = {}  # qid -> every voter's na_prob
    for nbest in nbests:
        for qid, answer in nbest.items():
            text, prob = answer["text"], float(answer["prob"])
            text_votes = votes.setdefault(qid, {})
            text_probs = best_prob.setdefault(qid, {})
            text_votes[text] = text_votes.get(text, 0) + 1
            text_probs[text] = max(text_probs.get(text, prob), prob)
            na_probs.setdefault(qid, []).append(float(answer["na_prob"]))

    ensemble: dict[str, dict[str, Any]] = {}
    for qid, text_votes in votes.items():
        text_probs = best_prob[qid]
        # max() keeps the first of equal keys, and texts iterate in first-seen order.
        winner = max(text_votes, key=lambda t: (text_votes[t], text_probs[t]))
        voters_na = na_probs[qid]
        ensemble[qid] = {
            "text": winner,
            "prob": text_probs[winner],
            "votes": text_votes[winner],
            "na_prob": sum(voters_na) / len(voters_na),
        }
    return ensemble


def predictions_from(ensemble: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The official predictions format, qid -> answer text ("" for no answer)."""
    return {qid: entry["text"] for qid, entry in ensemble.items()}
