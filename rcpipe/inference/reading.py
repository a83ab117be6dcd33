"""Inference: a model's answers to a prepared split, and its official scores on dev.

``predict`` is the one decoding path (training's dev evaluation, `rcpipe evaluate`,
`rcpipe predict` and the service all use it). ``evaluate_model`` scores it the official
way and, on SQuAD v2.0, chooses the no-answer threshold by the official script's
best-threshold walk over the best non-empty spans: abstaining is decided by that threshold,
never by the raw comparison of two probabilities, which can leave a young model answering
nothing at all. ``heldout_then_dev`` chooses it on the held-out questions and gives dev's
answers at it, so the set that reports never tunes. A context longer than data.window's
length is read as overlapping windows (data/windows.py), batched with other documents'
windows, and answered by inference/window_choice.py's rule across them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rcpipe.config import Window
from rcpipe.data.dataset import SquadDataset, bucket_batches, char_limit_of
from rcpipe.data.prepared import Prepared, PreparedHeldout
from rcpipe.data.shards import Shards
from rcpipe.data.windows import Windows
from rcpipe.inference.decode import best_span, predict_no_answer
from rcpipe.inference.window_choice import Proposal, choose
from rcpipe.scoring import metrics

EVAL_BATCH = 64  # windows (questions, when short) per forward pass
# rows of a split answered at a time (Split.chunks): a dev or held-out set of this size
# (SQuAD's, the demo's) is one chunk, answered as a whole split was
EVAL_CHUNK = 32_768


@torch.no_grad()
def predict(model: nn.Module, dataset: SquadDataset, batches: Iterable[list[int]] | None,
            device: torch.device, max_answer_len: int = 15,
            na_threshold: float | None = None, token_probs: bool = False,
            length_prior: torch.Tensor | None = None, windows: Windows | None = None,
            batch_size: int = EVAL_BATCH) -> dict[str, dict[str, Any]]:
    """qid -> {"text", "start", "end", "span_text", "span", "prob", "na_prob", "window",
    "windows"}.

    Each row is read as its ``windows`` (data/windows.py; None: each row whole, cut at the
    dataset's para_limit, one window) and ``batches`` are lists of windows (None: by
    length, ``batch_size`` a batch), so windows of several documents share a forward pass.
    The document's answer is chosen across its windows by inference/window_choice.py's rule:
    ``span_text`` is its best non-empty span (``span``: its [start, end) characters in the
    whole context), ``prob`` its p_start * p_end, ``na_prob`` the lowest of its windows',
    ``window`` the window it came from of the ``windows`` read; ``text`` is the answer
    given: the span, or "" when the no-answer rule (decode.predict_no_answer with
    ``na_threshold``) abstains, with ``start``/``end`` its characters (-1 for "").
    ``token_probs`` adds "p_start" and "p_end": over the context's tokens, each from the
    window that owns it. ``length_prior`` (max_answer_len,) weighs the spans by their length
    when choosing (eval.length_prior).
    """
    model.eval()
    if windows is None:
        windows = Windows.of(dataset.context_lengths())
    if batches is None:
        batches = bucket_batches(windows.length, batch_size, shuffle=False)
    found: dict[int, list[Proposal]] = {}  # row -> its windows' proposals, rows in order
    # row -> (window, p_start, p_end over the tokens it owns) of each of its windows
    probs: dict[int, list[tuple[int, list[float], list[float]]]] = {}
    for indices in batches:
        batch = dataset.collate(indices, windows=windows).to(device)
        logits = model(batch)
        log_p1, log_p2 = logits.log_probs()  # (B, 1 + Lc) each
        p1, p2 = log_p1.exp(), log_p2.exp()
        pos = torch.arange(p1.size(1) - 1)[None, :]  # (1, Lc)
        # the windows' bounds picked on the host, where they live (NumPy)
        own = (pos >= torch.from_numpy(windows.own_lo[indices])[:, None]) & \
            (pos < torch.from_numpy(windows.own_hi[indices])[:, None])  # (B, Lc)
        # a window proposes only spans that start on a token it owns
        p_own = torch.where(own.to(p1.device), p1[:, 1:], 0.0)  # (B, Lc)
        start, end, prob = best_span(p_own, p2[:, 1:], max_answer_len, length_prior)
        na_prob = p1[:, 0] * p2[:, 0]  # (B,)
        score = logits.start.float().gather(1, start[:, None])[:, 0] + \
            logits.end.float().gather(1, end[:, None])[:, 0]  # (B,) across windows
        # the batch's answers come to the host in one copy: on a GPU each int() or float()
        # of an element would wait for the device (5 a question). float64 holds the
        # positions and the float32 values exactly
        spans = torch.stack([start.double(), end.double(), prob.double(), na_prob.double(),
                             score.double()], dim=1).cpu().tolist()  # (B, 5)
        if token_probs:
            p1, p2 = p1.cpu(), p2.cpu()  # (B, 1 + Lc) each, one copy a batch
        for b, i in enumerate(indices):
            row, first = int(windows.row[i]), int(windows.start[i])
            s, e, span_prob, window_na, span_score = spans[b]
            found.setdefault(row, []).append(Proposal(
                int(windows.index[i]), first + int(s), first + int(e),
                span_prob, window_na, span_score))
            if token_probs:
                lo, hi = int(windows.own_lo[i]), int(windows.own_hi[i])
                probs.setdefault(row, []).append((int(windows.index[i]),
                                                  p1[b, 1 + lo : 1 + hi].tolist(),
                                                  p2[b, 1 + lo : 1 + hi].tolist()))
    chosen = {row: choose(proposals) for row, proposals in found.items()}
    empty = set(windows.row[windows.length == 0].tolist())  # rows without a token
    rows = list(chosen)
    span_prob = torch.tensor([chosen[r][0].prob for r in rows], dtype=torch.float32)
    doc_na = torch.tensor([chosen[r][1] for r in rows], dtype=torch.float32)
    no_answer = predict_no_answer(span_prob, doc_na, na_threshold).tolist()  # (R,)
    out: dict[str, dict[str, Any]] = {}
    for row, abstain in zip(rows, no_answer, strict=True):
        best, na = chosen[row]
        if row not in empty:
            span_text = dataset.answer_text(row, best.start, best.end)
            span = dataset.char_span(row, best.start, best.end)
        else:  # an empty context has no span to give
            span_text, span = "", (-1, -1)
        entry = {"span_text": span_text, "span": list(span), "prob": best.prob,
                 "na_prob": na, "window": best.window, "windows": int(windows.count[row])}
        out[dataset.ids[row]] = answer_given(entry, bool(abstain))
        if token_probs:
            parts = sorted(probs[row], key=lambda t: t[0])
            out[dataset.ids[row]] |= {"p_start": [p for _, s, _ in parts for p in s],
                                      "p_end": [p for _, _, e in parts for p in e]}
    return out


def windows_of(dataset: SquadDataset, window: Window | None) -> Windows:
    """The windows ``dataset``'s rows are read as at ``window`` (data.window), or each row
    whole (cut at its para_limit) with None."""
    lengths = dataset.context_lengths()
    return Windows.of(lengths) if window is None else \
        Windows.of(lengths, window.length, window.stride)


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


def evaluate_model(model: nn.Module, dataset: SquadDataset | Iterable[SquadDataset],
                   doc: dict[str, Any],
                   device: torch.device, max_answer_len: int = 15,
                   na_threshold: float | None = None,
                   length_prior: torch.Tensor | None = None,
                   window: Window | None = None, token_probs: bool = False) -> Evaluation:
    """The model's official scores on ``doc`` (the dataset ``dataset`` was prepared from),
    each context read as ``window``'s windows (data.window; None: whole, one window);
    ``token_probs``: the n-best entries hold predict's start/end distributions too.

    v2.0: without a fixed ``na_threshold`` the threshold is the official best-threshold walk's
    best_f1_thresh over the best non-empty spans, so the scores are best_f1's and the answers
    given are the spans whose na_prob does not exceed it.
    """
    nbest: dict[str, dict[str, Any]] = {}
    # a split read a chunk at a time (Split.chunks): each chunk's rows answered alone
    for part in [dataset] if isinstance(dataset, SquadDataset) else dataset:
        nbest |= predict(model, part, None, device, max_answer_len, na_threshold,
                         token_probs, length_prior=length_prior,
                         windows=windows_of(part, window))
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
    """A prepared split and the SQuAD JSON it was prepared from (the official scorer's):
    its rows whole (``dataset``), or its parts read EVAL_CHUNK rows at a time (``shards``:
    a large dev or held-out set is never held whole while it is answered)."""

    dataset: SquadDataset | None
    doc: dict[str, Any]
    shards: Shards | None = None
    para_limit: int | None = None

    def chunks(self) -> Iterator[SquadDataset]:
        if self.shards is None:
            assert self.dataset is not None
            yield self.dataset
            return
        char_limit = char_limit_of(self.shards.folder.parent)
        for table in self.shards.chunks(EVAL_CHUNK):
            yield SquadDataset(table, self.para_limit, char_limit)


def split_of(folder: Path, doc: dict[str, Any], para_limit: int | None = None) -> Split:
    """A prepared split's folder (dev, held-out), read a chunk at a time, and its JSON."""
    return Split(None, doc, Prepared(folder.parent).shards(folder.name), para_limit)


def heldout_split(found: PreparedHeldout, para_limit: int | None, whole: bool = True
                  ) -> Split:
    """The held-out questions prepare set aside (data/heldout.py), as a Split to score:
    its rows ``whole`` (what an ensemble's weights are chosen on), else read a chunk at a
    time (scoring alone)."""
    from rcpipe.data.squad import read_json

    doc = read_json(found.doc, str(found.doc))
    if whole:
        return Split(SquadDataset.from_parquet(found.parquet, para_limit=para_limit), doc)
    return split_of(found.parquet, doc, para_limit)


def heldout_then_dev(model: nn.Module, dev: Split, heldout: Split | None, source: str | None,
                     device: torch.device, max_answer_len: int = 15,
                     na_threshold: float | None = None,
                     length_prior: torch.Tensor | None = None,
                     window: Window | None = None, token_probs: bool = False
                     ) -> tuple[Evaluation, Evaluation | None]:
    """(dev's evaluation, the held-out one's or None), contexts read as ``window``'s
    windows (evaluate_model).

    v2.0: the threshold is the fixed ``na_threshold`` (source "params"), else the
    best-threshold walk's on ``heldout`` (``source``: "heldout" or "file:<path>"), else,
    with no held-out questions, dev's own (source "dev": the oracle, named so). Dev's
    answers are given at it and its result is metrics.at_threshold's: the headline at that
    threshold, the walk on dev under "oracle".
    """
    source = "params" if na_threshold is not None else source
    held = None
    if heldout is not None:
        held = evaluate_model(model, heldout.chunks(), heldout.doc, device, max_answer_len,
                              na_threshold, length_prior, window, token_probs)
        na_threshold = held.na_threshold
    if na_threshold is None:
        source = "dev"
    ev = evaluate_model(model, dev.chunks(), dev.doc, device, max_answer_len, na_threshold,
                        length_prior, window, token_probs)
    if ev.na_threshold is not None:
        ev.result = metrics.at_threshold(ev.result, ev.na_threshold, source or "dev")
    return ev, held
