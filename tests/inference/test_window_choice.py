"""inference/window_choice.py and predict over windows: the answer chosen across a long context's
windows, an answer cut by a window's end found whole in the next, character offsets on
unicode text, and nothing changed for a context a model reads at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from rcpipe.config import Window
from rcpipe.data.dataset import SquadDataset, bucket_batches
from rcpipe.data.encode import TextEncoder, token_spans
from rcpipe.data.vocab import OOV, PAD, Vocab
from rcpipe.inference.answer import Reader
from rcpipe.inference.decode import best_span, predict_no_answer
from rcpipe.inference.reading import predict, windows_of
from rcpipe.inference.window_choice import Proposal, TooLong, choose
from rcpipe.models.batch import Batch
from rcpipe.models.layers import NEG_INF, SpanLogits

CPU = torch.device("cpu")
ENCODER = TextEncoder(Vocab([PAD, OOV, "alpha", "omega"]), Vocab([PAD, OOV]), 4)
ALPHA, OMEGA = 2, 3


class MarkerReader(nn.Module):
    """Starts at "alpha" and ends at "omega" where it sees them; a window holding "alpha"
    but not "omega" (the answer cut by the window's end) ends, surer still, on the window's
    last token: a cut span that would beat the whole one on probability alone."""

    def __init__(self, na: float | None = None) -> None:
        super().__init__()
        self.na = na

    def forward(self, batch: Batch) -> SpanLogits:
        cw, mask = batch.cw, batch.c_mask  # (B, Lc)
        start = torch.where(cw == ALPHA, 8.0, 0.0)
        end = torch.where(cw == OMEGA, 6.0, 0.0)
        last = mask.sum(1) - 1  # (B,) each window's last token
        cut = (cw == ALPHA).any(1) & ~(cw == OMEGA).any(1)  # (B,)
        pos = torch.arange(cw.size(1))[None, :]
        end = torch.where(cut[:, None] & (pos == last[:, None]), 12.0, end)
        na = None if self.na is None else torch.full((cw.size(0), 2), self.na)
        return SpanLogits(start.masked_fill(~mask, NEG_INF), end.masked_fill(~mask, NEG_INF),
                          na)


def _context(words: int, at: int, filler: str = "w") -> tuple[str, str]:
    """``words`` tokens with "alpha mid omega" at token ``at``; (context, the answer)."""
    tokens = [f"{filler}{k}" for k in range(words)]
    tokens[at : at + 3] = ["alpha", "mid", "omega"]
    return " ".join(tokens), "alpha mid omega"


def test_choose_takes_the_best_span_and_the_lowest_no_answer() -> None:
    # by the span's logits, not its probability, which each window normalises alone
    props = [Proposal(0, 3, 4, 0.9, 0.9, score=2.0), Proposal(1, 40, 41, 0.5, 0.3, score=7.0),
             Proposal(2, 80, 80, 0.5, 0.6, score=7.0)]
    best, na = choose(props)
    assert best == props[1] and na == 0.3  # a tie goes to the earlier window
    assert choose(props[:1]) == (props[0], 0.9)  # one window: its own, unchanged
    with pytest.raises(ValueError):
        choose([])


def test_an_answer_cut_by_a_window_end_is_found_whole_in_the_next() -> None:
    # 60 tokens, windows of 20 at 0, 10, 20, 30, 40: "alpha mid omega" at tokens 18-20 is
    # cut by the first window's end and whole in the second
    context, answer = _context(60, 18)
    ds = ENCODER.pairs([(context, "q")])
    window = Window(length=20, stride=10)
    windows = windows_of(ds, window)
    assert windows.count.tolist() == [5]
    found = predict(MarkerReader(), ds, None, CPU, windows=windows)["0"]
    assert found["text"] == answer and found["window"] == 1 and found["windows"] == 5
    assert context[found["start"] : found["end"]] == answer
    # read whole, as one window, the model finds the same span
    whole = predict(MarkerReader(), ds, None, CPU)["0"]
    assert (whole["start"], whole["end"], whole["windows"]) == (found["start"], found["end"], 1)
    # without the rule that a window proposes only spans starting on its own tokens, the
    # first window's cut span "alpha mid w19" would win
    batch = ds.collate([0], windows=windows)
    p1, p2 = (p.exp() for p in MarkerReader()(batch).log_probs())
    s, e, _ = best_span(p1[:, 1:], p2[:, 1:], 15)
    assert (int(s), int(e)) == (18, 19)


def test_offsets_round_trip_on_unicode_text() -> None:
    words = ["naïve", "東京", "😀x", "Zürich", "e\u0301t\u00e9", "ﬁne", "İstanbul"]
    tokens = [words[k % len(words)] for k in range(70)]
    tokens[52:55] = ["alpha", "mid", "omega"]
    context = "  " + " ".join(tokens) + " \u00a0"
    ds = ENCODER.pairs([(context, "q"), ("alpha b omega", "q")])
    reader = Reader(ENCODER, {"m": MarkerReader()}, CPU, window=Window(length=20, stride=10))
    long, short = reader.answer_pairs([(context, "q"), ("alpha b omega", "q")], "m",
                                      token_probs=True)
    assert not isinstance(long, TooLong) and not isinstance(short, TooLong)
    assert long["windows"] > 1 and short["windows"] == 1
    assert context[long["start"] : long["end"]] == "alpha mid omega"
    assert (long["start"], long["end"]) == (context.index("alpha"),
                                            context.index("omega") + len("omega"))
    # every token of the whole context (the tokenizer's), each with the distributions of
    # the window that answers for it
    spans = long["tokens"]
    assert spans == token_spans(ds, 0) and len(spans) > 70
    assert "".join(context[a:b] for a, b in spans) == "".join(context.split())
    assert all(not context[b:a2].strip() for (_, b), (a2, _) in zip(spans, spans[1:],
                                                                     strict=False))
    assert len(long["p_start"]) == len(long["p_end"]) == len(spans)


def test_a_context_over_the_cap_is_refused_and_the_others_answered() -> None:
    context, answer = _context(60, 40)
    reader = Reader(ENCODER, {"m": MarkerReader()}, CPU, window=Window(length=20, stride=10),
                    max_tokens=50)
    short, long = reader.answer_pairs([("alpha b omega", "q"), (context, "q")], "m")
    assert isinstance(short, dict) and short["text"] == "alpha b omega"
    assert isinstance(long, TooLong) and (long.tokens, long.cap, long.windows) == (60, 50, 5)


def test_the_document_abstains_only_when_no_window_says_the_answer_is_there() -> None:
    context, _ = _context(60, 40)
    ds = ENCODER.pairs([(context, "q")])
    windows = windows_of(ds, Window(length=20, stride=10))
    # the same no-answer logit everywhere: the document's na_prob is its windows' lowest,
    # the answer window's (whose span takes most of the softmax)
    found = predict(MarkerReader(na=4.0), ds, None, CPU, windows=windows)["0"]
    per_window = []
    for w in range(len(windows)):
        batch = ds.collate([w], windows=windows)
        p1, p2 = (p.exp() for p in MarkerReader(na=4.0)(batch).log_probs())
        per_window.append(float(p1[0, 0] * p2[0, 0]))
    assert found["na_prob"] == pytest.approx(min(per_window))
    assert found["text"] == "alpha mid omega"  # its span beats its no-answer
    none = predict(MarkerReader(na=30.0), ds, None, CPU, windows=windows)["0"]
    assert none["text"] == "" and none["span_text"] == "alpha mid omega"


# -------------------------------------------- a context read at once: nothing has changed


@torch.no_grad()
def before_windows(model: nn.Module, dataset: SquadDataset, max_answer_len: int = 15,
                   na_threshold: float | None = None) -> dict[str, dict[str, Any]]:
    """inference/reading.py's ``predict`` as it was before windows (commit 7c89058)."""
    model.eval()
    out: dict[str, dict[str, Any]] = {}
    for indices in bucket_batches(dataset.context_lengths(), 64, shuffle=False):
        batch = dataset.collate(indices)
        log_p1, log_p2 = model(batch).log_probs()
        p1, p2 = log_p1.exp(), log_p2.exp()
        start, end, prob = best_span(p1[:, 1:], p2[:, 1:], max_answer_len)
        na_prob = p1[:, 0] * p2[:, 0]
        no_answer = predict_no_answer(prob, na_prob, na_threshold)
        for b, i in enumerate(indices):
            s, e = int(start[b]), int(end[b])
            n = int(batch.c_mask[b].sum())
            out[dataset.ids[i]] = {
                "span_text": dataset.answer_text(i, s, e), "span": list(dataset.char_span(i, s, e)),
                "prob": float(prob[b]), "na_prob": float(na_prob[b]),
                "abstain": bool(no_answer[b]), "p_start": p1[b, 1 : 1 + n].tolist(),
                "p_end": p2[b, 1 : 1 + n].tolist()}
    return out


def assert_unchanged(model: nn.Module, dataset: SquadDataset,
                     na_threshold: float | None = None) -> None:
    before = before_windows(model, dataset, na_threshold=na_threshold)
    after = predict(model, dataset, None, CPU, na_threshold=na_threshold, token_probs=True,
                    windows=windows_of(dataset, Window()))
    assert list(after) == list(before)  # the same questions, in the same order
    for qid, old in before.items():
        new = after[qid]
        assert (new["span_text"], new["span"], new["windows"]) == \
            (old["span_text"], old["span"], 1), qid
        assert (new["text"] == "") == (old["abstain"] or not old["span_text"]), qid
        for key in ("prob", "na_prob"):
            assert new[key] == pytest.approx(old[key], abs=1e-6), (qid, key)
        for key in ("p_start", "p_end"):
            np.testing.assert_allclose(new[key], old[key], atol=1e-6)


@pytest.mark.integration
@pytest.mark.trains
def test_a_context_under_the_limit_is_answered_as_before(trained: Any) -> None:
    """The session's trained bidaf (and qanet at its initial weights) on its dev set."""
    from rcpipe.trained.model_file import load_model
    from tests.conftest import Trained

    assert isinstance(trained, Trained)
    dev = SquadDataset.from_parquet(trained.cfg.data.out_dir / "dev")
    assert dev.context_lengths().max() <= Window().length
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)
        for variant in trained.variants:
            model, _ = load_model(trained.cfg, variant)
            assert_unchanged(model, dev)


def test_no_answer_decisions_are_as_before_under_the_limit() -> None:
    rng = np.random.default_rng(0)
    pairs = [(" ".join(f"w{k}" for k in rng.integers(0, 50, size=int(n))), "q")
             for n in rng.integers(1, 40, size=30)]
    dataset = ENCODER.pairs(pairs)

    class Noisy(nn.Module):
        def forward(self, batch: Batch) -> SpanLogits:
            g = torch.Generator().manual_seed(int(batch.cw.sum()))
            b, lc = batch.cw.shape
            start, end = torch.randn(b, lc, generator=g), torch.randn(b, lc, generator=g)
            na = 2 * torch.randn(b, 2, generator=g)
            m = batch.c_mask
            return SpanLogits(start.masked_fill(~m, NEG_INF), end.masked_fill(~m, NEG_INF), na)

    for threshold in (None, 0.05):
        assert_unchanged(Noisy(), dataset, threshold)
