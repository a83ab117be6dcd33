"""Ensembling several models' answers: the majority vote on the answer text (one answer per
model and question), and the mean of their start/end distributions over prepare's shared
tokens, with equal weights or with weights chosen on the held-out questions (``select``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rcpipe.inference.decode import best_span
from rcpipe.inference.distributions import Dist, Dists
from rcpipe.inference.reading import Split
from rcpipe.scoring import metrics


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


# ------------------------------------------------ averaged distributions (mean, selected)

def mean_answers(members: list[dict[str, Dist]], weights: list[float], split: Split,
                 max_answer_len: int, na_threshold: float | None = None,
                 chunk: int = 256) -> dict[str, dict[str, Any]]:
    """qid -> {"text", "span_text", "span", "prob", "na_prob"}: for each question of
    ``split``, the members' start/end distributions (and no-answer probabilities) averaged
    with ``weights``, then the best span of at most ``max_answer_len`` tokens (decode's
    best_span). ``na_threshold`` (v2.0): "" where the averaged na_prob exceeds it.
    Every member must hold every question: they read the same prepared tokens."""
    data = split.dataset

    def span_of(row: int, s: int, e: int) -> tuple[str, list[int]]:
        return data.answer_text(row, s, e), list(data.char_span(row, s, e))

    return averaged_spans(members, weights, data.ids, span_of, max_answer_len, na_threshold,
                          chunk)


def averaged_spans(members: list[dict[str, Dist]], weights: list[float], ids: list[str],
                   span_of: Callable[[int, int, int], tuple[str, list[int]]],
                   max_answer_len: int, na_threshold: float | None = None,
                   chunk: int = 256) -> dict[str, dict[str, Any]]:
    """mean_answers for the questions ``ids``, whatever holds their contexts: ``span_of(i,
    start, end)`` gives the text and character span of tokens start..end of ids[i]'s
    context (a prepared split's, or a served pair's)."""
    w = torch.tensor(weights, dtype=torch.float32)
    w = w / w.sum()  # (M,)
    out = {}
    rows = list(range(len(ids)))
    for lo in range(0, len(rows), chunk):
        part = rows[lo : lo + chunk]
        qids = [ids[r] for r in part]
        length = max(1, max(len(members[0][q].p_start) for q in qids))

        def stacked(key: str, qids: list[str] = qids, length: int = length) -> torch.Tensor:
            # (B, L): each question's weighted mean over the members, zero past its end
            out = torch.zeros(len(qids), length)
            for m, member in enumerate(members):
                for b, q in enumerate(qids):
                    p = torch.from_numpy(np.asarray(getattr(member[q], key), np.float32))
                    out[b, : len(p)] += w[m] * p
            return out

        p1, p2 = stacked("p_start"), stacked("p_end")
        start, end, prob = best_span(p1, p2, max_answer_len)
        for b, (row, q) in enumerate(zip(part, qids, strict=True)):
            na = float(sum(w[m] * member[q].na_prob for m, member in enumerate(members)))
            s, e = int(start[b]), int(end[b])
            if len(members[0][q].p_start):
                span_text, span = span_of(row, s, e)
            else:  # an empty context has no span to give
                span_text, span = "", [-1, -1]
            abstain = na_threshold is not None and na > na_threshold
            out[q] = {"text": "" if abstain else span_text, "span_text": span_text,
                      "span": span, "prob": float(prob[b]), "na_prob": na}
    return out


def scored(members: list[dict[str, Dist]], weights: list[float], split: Split,
           max_answer_len: int, na_threshold: float | None = None
           ) -> tuple[dict[str, dict[str, Any]], dict[str, Any], float | None]:
    """(answers, official result, na_threshold) of the weighted mean on ``split``. v2.0
    without ``na_threshold``: the best-threshold walk's on this split (so only on the
    held-out questions, whose walk chooses the threshold dev is answered at)."""
    answers = mean_answers(members, weights, split, max_answer_len, na_threshold)
    if metrics.dataset_version(split.doc) != "2.0":
        return answers, metrics.score(split.doc, {q: a["text"] for q, a in answers.items()}), None
    spans = {q: a["span_text"] for q, a in answers.items()}
    na = {q: a["na_prob"] for q, a in answers.items()}
    if na_threshold is None:
        na_threshold = metrics.score(split.doc, spans, na)["best_f1_thresh"]
        answers = {q: a | {"text": "" if a["na_prob"] > na_threshold else a["span_text"]}
                   for q, a in answers.items()}
    return answers, metrics.score(split.doc, spans, na, na_threshold), na_threshold


def select(members: list[dict[str, Dist]], heldout: Split, max_answer_len: int,
           rounds: int) -> tuple[list[int], list[float]]:
    """Greedy ensemble selection with replacement (Caruana et al., 2004) on the held-out
    questions: each round adds one weight to the member whose addition gives the highest
    held-out F1 (a tie: the first in order); the weights kept are those of the round with the
    best F1 (the earliest of equals). Returns (each member's count, the F1 of each round)."""
    counts, curve = [0] * len(members), []
    best: tuple[float, list[int]] = (-1.0, counts)
    for _ in range(rounds):
        tried = []
        for m in range(len(members)):
            trial = [c + (i == m) for i, c in enumerate(counts)]
            chosen = [i for i, c in enumerate(trial) if c]
            _, result, _ = scored([members[i] for i in chosen], [trial[i] for i in chosen],
                                  heldout, max_answer_len)
            tried.append(metrics.headline(result)[1])
        m = max(range(len(members)), key=lambda i: (tried[i], -i))
        counts = [c + (i == m) for i, c in enumerate(counts)]
        curve.append(tried[m])
        if tried[m] > best[0]:
            best = (tried[m], counts)
    return best[1], curve


def averaged(members: dict[str, Dists], dev: Split, heldout: Split | None,
             max_answer_len: int, rounds: int
             ) -> dict[str, tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]]:
    """method -> (dev's answers, dev's official result, what else it reports) for "mean"
    (equal weights) and, with held-out questions, "selected" (weights chosen on them by
    ``select``); v2.0: the no-answer threshold the held-out walk chooses for the same
    weights (without held-out questions, dev's own walk: the oracle, named so). Each member
    (name -> its distributions, inference/distributions.py) holds every question of both
    splits. Nothing is chosen on dev."""
    names, read = list(members), list(members.values())
    v2 = metrics.dataset_version(dev.doc) == "2.0"
    out = {}
    for method in ("mean", "selected"):
        if method == "selected" and heldout is None:
            continue
        curve: list[float] = []
        weights = [1] * len(read)
        if method == "selected":
            weights, curve = select([d["heldout"] for d in read], heldout, max_answer_len,
                                    rounds)
        chosen = [i for i, w in enumerate(weights) if w]
        kept = [weights[i] for i in chosen]
        threshold, source = None, "dev"
        if v2 and heldout is not None:
            _, _, threshold = scored([read[i]["heldout"] for i in chosen], kept, heldout,
                                     max_answer_len)
            source = "heldout"
        answers, result, threshold = scored([read[i]["dev"] for i in chosen], kept, dev,
                                            max_answer_len, threshold)
        if threshold is not None:
            result = metrics.at_threshold(result, threshold, source)
        extra: dict[str, Any] = {"weights": dict(zip(names, weights, strict=True))}
        if curve:
            extra["heldout_f1_by_round"] = curve
        out[method] = (answers, result, extra)
    return out
