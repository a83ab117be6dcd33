"""Answering questions with trained models: the one path behind predict and serve.

Text goes through data/encode.py (prepare's own tokenizer, vocab and schema) and the model
through inference/reading.py's ``predict`` (the function `rcpipe evaluate` uses), at the no-answer
threshold evaluate chose, so an answer here is the answer evaluate gives for the same
context and question; a context longer than data.window's length is read as its windows,
as evaluate reads one, and one over data.window.max_tokens is refused (inference/window_choice.py:
TooLong). ``ensemble`` is the majority vote of inference/ensemble.py over every loaded variant.

No file I/O: rcpipe/stages/predict.py loads the models and the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from rcpipe import layout
from rcpipe.config import Window
from rcpipe.data.dataset import SquadDataset
from rcpipe.data.encode import TextEncoder, token_spans
from rcpipe.data.windows import Windows
from rcpipe.inference.distributions import Dist
from rcpipe.inference.ensemble import averaged_spans, majority_vote
from rcpipe.inference.reading import EVAL_BATCH, predict, windows_of
from rcpipe.inference.window_choice import TooLong, over_cap

ENSEMBLE = layout.ENSEMBLE


@dataclass
class Reader:
    """Trained models (variant -> model, in eval mode on ``device``) and how to decode them."""

    encoder: TextEncoder
    models: dict[str, nn.Module]
    device: torch.device
    max_answer_len: int = 15
    # variant -> the no-answer threshold it answers at (trained/model_file.py: na_threshold); a
    # variant without one abstains when na_prob beats its best span's prob
    na_thresholds: dict[str, float | None] = field(default_factory=dict)
    # context tokens encoded (None: all of them, read as ``window``'s windows)
    para_limit: int | None = None
    no_answer: bool = False  # SQuAD v2.0 models: na_prob is meaningful
    batch_size: int = EVAL_BATCH  # windows per forward pass
    length_prior: torch.Tensor | None = None  # eval.length_prior's weights, or None
    window: Window | None = None  # data.window: how a long context is read; None: whole
    max_tokens: int | None = None  # answer_pairs refuses a longer context (TooLong)

    def answer_dataset(self, ds: SquadDataset, name: str, token_probs: bool = False
                       ) -> dict[str, dict[str, Any]]:
        """qid -> {"text", "prob", "na_prob", "start", "end", "window", "windows"} (+ "votes"
        for the ensemble; + "p_start"/"p_end" per context token with ``token_probs``)."""
        windows = windows_of(ds, self.window)
        if name != ENSEMBLE:
            return self._predict(name, ds, windows, token_probs)
        nbests = [self._predict(v, ds, windows, token_probs) for v in self.models]
        return vote(nbests, token_probs)

    def answer_pairs(self, pairs: Sequence[tuple[str, str]], name: str,
                     token_probs: bool = False) -> list[dict[str, Any] | TooLong]:
        """One answer per (context, question) pair, in order; with ``token_probs`` each
        also holds "tokens": the (start, end) characters of the context's tokens. A context
        over ``max_tokens`` gets a TooLong in its place (the others are answered): it is
        refused, never cut."""
        ds = self.encoder.pairs(pairs, self.para_limit)
        refused = over_cap(ds.context_lengths(), self.max_tokens, self.window)
        if refused:
            keep = [i for i in range(len(pairs)) if i not in refused]
            answered = iter(self.answer_pairs([pairs[i] for i in keep], name, token_probs)
                            if keep else [])
            return [refused[i] if i in refused else next(answered) for i in range(len(pairs))]
        found = self.answer_dataset(ds, name, token_probs)
        out: list[dict[str, Any] | TooLong] = [found[qid] for qid in ds.ids]
        if token_probs:
            for i, entry in enumerate(out):
                entry["tokens"] = token_spans(ds, i)  # type: ignore[index]
        return out

    def _predict(self, variant: str, ds: SquadDataset, windows: Windows, token_probs: bool
                 ) -> dict[str, dict[str, Any]]:
        return predict(self.models[variant], ds, None, self.device, self.max_answer_len,
                       self.na_thresholds.get(variant), token_probs, self.length_prior,
                       windows, self.batch_size)


def vote(nbests: list[dict[str, dict[str, Any]]], token_probs: bool = False
         ) -> dict[str, dict[str, Any]]:
    """The majority vote, with the winning text's span from its most confident voter and,
    with ``token_probs``, the voters' start/end distributions averaged."""
    voted = majority_vote(nbests)
    for qid, entry in voted.items():
        answers = [n[qid] for n in nbests if qid in n]
        best = max((a for a in answers if a["text"] == entry["text"]), key=lambda a: a["prob"])
        entry["start"], entry["end"] = best["start"], best["end"]
        entry["window"], entry["windows"] = best["window"], best["windows"]
        if token_probs:
            for key in ("p_start", "p_end"):
                dists = torch.tensor([a[key] for a in answers])  # (models, Lc)
                entry[key] = dists.mean(0).tolist()
    return voted


def voted(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """One question's answer from its voters' (each answered with ``token_probs``): their
    majority vote as `rcpipe evaluate` votes, with the context's tokens they share (the
    answer service's ensemble and an ensemble champion)."""
    found = vote([{"q": a} for a in answers], token_probs=True)["q"]
    return found | {"tokens": answers[0]["tokens"]}


def averaged(answers: list[dict[str, Any]], weights: list[float], context: str,
             max_answer_len: int, na_threshold: float | None = None) -> dict[str, Any]:
    """One question's answer from its members' (each answered with ``token_probs``, over the
    same tokens of ``context``): their start/end distributions averaged with ``weights``,
    then the best span, as `rcpipe ensemble`'s mean (inference/ensemble.py: averaged_spans);
    v2.0: "" where the averaged na_prob exceeds ``na_threshold``."""
    tokens = answers[0]["tokens"]  # (start, end) characters of each context token

    def span_of(_: int, s: int, e: int) -> tuple[str, list[int]]:
        return context[tokens[s][0] : tokens[e][1]], [tokens[s][0], tokens[e][1]]

    members = [{"q": Dist(np.asarray(a["p_start"], np.float32),
                          np.asarray(a["p_end"], np.float32), float(a["na_prob"]))}
               for a in answers]
    found = averaged_spans(members, weights, ["q"], span_of, max_answer_len, na_threshold)["q"]
    w = torch.tensor(weights, dtype=torch.float32) / sum(weights)  # (M,)
    return found | {"start": found["span"][0], "end": found["span"][1], "tokens": tokens,
                    "window": answers[0].get("window", 0),
                    "windows": answers[0].get("windows", 1),
                    **{key: (w @ torch.tensor([a[key] for a in answers])).tolist()
                       for key in ("p_start", "p_end")}}  # (Lc,) each
