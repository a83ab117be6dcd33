"""Inference: a model's answers to a prepared split, and its official scores on dev.

``predict`` is the one decoding path (training's dev evaluation, `rcpipe evaluate`,
`rcpipe predict` and the service all use it). ``evaluate_model`` scores it the official
way and, on SQuAD v2.0, chooses the no-answer threshold by the official script's
best-threshold walk over the best non-empty spans: abstaining is decided by that threshold,
never by the raw comparison of two probabilities, which can leave a young model answering
nothing at all. ``heldout_then_dev`` chooses it on the held-out questions and gives dev's
answers at it, so the set that reports never tunes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rcpipe.data.dataset import SquadDataset, bucket_batches
from rcpipe.data.heldout import PreparedHeldout
from rcpipe.eval import metrics
from rcpipe.eval.decode import best_span, predict_no_answer

EVAL_BATCH = 64  # questions per forward pass


@torch.no_grad()
def predict(model: nn.Module, dataset: SquadDataset, batches: Iterable[list[int]],
            device: torch.device, max_answer_len: int = 15,
            na_threshold: float | None = None, token_probs: bool = False,
            length_prior: torch.Tensor | None = None) -> dict[str, dict[str, Any]]:
    """qid -> {"text", "start", "end", "span_text", "span", "prob", "na_prob"}.

    ``span_text`` is the best non-empty span (``span``: its [start, end) characters) and
    ``prob`` its p_start * p_end; ``text`` is the answer given: the span, or "" when the
    no-answer rule (decode.predict_no_answer with ``na_threshold``) abstains, with
    ``start``/``end`` its characters (-1 for ""). ``token_probs`` adds "p_start" and
    "p_end": the distributions over the context tokens the model saw. ``length_prior``
    (max_answer_len,) weighs the spans by their length when choosing (eval.length_prior).
    """
    model.eval()
    out: dict[str, dict[str, Any]] = {}
    for indices in batches:
        batch = dataset.collate(indices).to(device)
        log_p1, log_p2 = model(batch).log_probs()  # (B, 1 + Lc) each
        p1, p2 = log_p1.exp(), log_p2.exp()
        start, end, prob = best_span(p1[:, 1:], p2[:, 1:], max_answer_len, length_prior)
        na_prob = p1[:, 0] * p2[:, 0]  # (B,)
        no_answer = predict_no_answer(prob, na_prob, na_threshold)
        for b, i in enumerate(indices):
            s, e = int(start[b]), int(end[b])
            if bool(batch.c_mask[b].any()):
                span_text, span = dataset.answer_text(i, s, e), dataset.char_span(i, s, e)
            else:  # an empty context has no span to give
                span_text, span = "", (-1, -1)
            entry = {"span_text": span_text, "span": list(span), "prob": float(prob[b]),
                     "na_prob": float(na_prob[b])}
            out[dataset.ids[i]] = answer_given(entry, bool(no_answer[b]))
            if token_probs:
                n = int(batch.c_mask[b].sum())
                out[dataset.ids[i]] |= {"p_start": p1[b, 1 : 1 + n].tolist(),
                                        "p_end": p2[b, 1 : 1 + n].tolist()}
    return out


def answer_given(entry: dict[str, Any], abstain: bool) -> dict[str, Any]:
    """``entry`` with "text", "start" and "end": its best span, or "" (-1, -1)."""
    if abstain or not entry["span_text"]:
        return entry | {"text": "", "start": -1, "end": -1}
    return entry | {"text": entry["span_text"], "start": entry["span"][0],
                    "end": entry["span"][1]}


@dataclass
class Evaluation:
    nbest: dict[str, dict[str, Any]]  # predict's entries, "text" the answer given
    result: dict[str, Any]  # the official keys (v2.0: at na_threshold, with best_* and NoAns)
    na_threshold: float | None  # v2.0: the threshold the answers were given at
    # v2.0: F1 on the answerable questions of the best spans, answering every one: how good
    # the spans are whatever the threshold (training breaks ties of F1 with it)
    span_f1: float | None = None

    @property
    def predictions(self) -> dict[str, str]:
        return {q: v["text"] for q, v in self.nbest.items()}

    @property
    def na_probs(self) -> dict[str, float]:
        return {q: v["na_prob"] for q, v in self.nbest.items()}


def evaluate_model(model: nn.Module, dataset: SquadDataset, doc: dict[str, Any],
                   device: torch.device, max_answer_len: int = 15,
                   na_threshold: float | None = None,
                   length_prior: torch.Tensor | None = None) -> Evaluation:
    """The model's official scores on ``doc`` (the dataset ``dataset`` was prepared from).

    v2.0: without a fixed ``na_threshold`` the threshold is the official best-threshold walk's
    best_f1_thresh over the best non-empty spans, so the scores are best_f1's and the answers
    given are the spans whose na_prob does not exceed it.
    """
    batches = bucket_batches(dataset.context_lengths(), EVAL_BATCH, shuffle=False)
    nbest = predict(model, dataset, batches, device, max_answer_len, na_threshold,
                    length_prior=length_prior)
    if metrics.dataset_version(doc) != "2.0":
        return Evaluation(nbest, metrics.score(doc, {q: v["text"] for q, v in nbest.items()}),
                          None)
    spans = {q: v["span_text"] for q, v in nbest.items()}
    na_probs = {q: v["na_prob"] for q, v in nbest.items()}
    # at the default threshold (1.0) every span is given: HasAns_f1 is the spans' own F1
    walk = metrics.score(doc, spans, na_probs)
    span_f1 = walk.get("HasAns_f1")
    if na_threshold is None:
        na_threshold = walk["best_f1_thresh"]
    result = metrics.score(doc, spans, na_probs, na_threshold)
    nbest = {q: answer_given(v, v["na_prob"] > na_threshold) for q, v in nbest.items()}
    return Evaluation(nbest, result, na_threshold, span_f1)


@dataclass(frozen=True)
class Split:
    """A prepared split and the SQuAD JSON it was prepared from (the official scorer's)."""

    dataset: SquadDataset
    doc: dict[str, Any]


def heldout_split(found: PreparedHeldout, para_limit: int | None) -> Split:
    """The held-out questions prepare set aside (data/heldout.py), as a Split to score."""
    from rcpipe.data.squad import read_json

    return Split(SquadDataset.from_parquet(found.parquet, para_limit=para_limit),
                 read_json(found.doc, str(found.doc)))


def heldout_then_dev(model: nn.Module, dev: Split, heldout: Split | None, source: str | None,
                     device: torch.device, max_answer_len: int = 15,
                     na_threshold: float | None = None,
                     length_prior: torch.Tensor | None = None
                     ) -> tuple[Evaluation, Evaluation | None]:
    """(dev's evaluation, the held-out one's or None).

    v2.0: the threshold is the fixed ``na_threshold`` (source "params"), else the
    best-threshold walk's on ``heldout`` (``source``: "heldout" or "file:<path>"), else,
    with no held-out questions, dev's own (source "dev": the oracle, named so). Dev's
    answers are given at it and its result is metrics.at_threshold's: the headline at that
    threshold, the walk on dev under "oracle".
    """
    source = "params" if na_threshold is not None else source
    held = None
    if heldout is not None:
        held = evaluate_model(model, heldout.dataset, heldout.doc, device, max_answer_len,
                              na_threshold, length_prior)
        na_threshold = held.na_threshold
    if na_threshold is None:
        source = "dev"
    ev = evaluate_model(model, dev.dataset, dev.doc, device, max_answer_len, na_threshold,
                        length_prior)
    if ev.na_threshold is not None:
        ev.result = metrics.at_threshold(ev.result, ev.na_threshold, source or "dev")
    return ev, held
