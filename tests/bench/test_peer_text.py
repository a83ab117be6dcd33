"""bench/peer_text.py: the real-text tensors bench/peers.py feeds both sides, built from a
small SQuAD-format file (the shared data is not in a user's clone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.peer_text import OOV, read_text_batch


def article(title: str, context: str, questions: list[str]) -> dict:
    return {"title": title, "paragraphs": [{"context": context, "qas": [
        {"id": f"{title}{i}", "question": q, "answers": []} for i, q in enumerate(questions)]}]}


@pytest.fixture
def squad(tmp_path: Path) -> Path:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"version": "1.1", "data": [
        article("short", "Too short.", ["Why?"]),  # passed over: under 6 context tokens
        article("a", "The cat sat on the mat, the cat did.", ["Where did the cat sit?"]),
        article("b", "Supercalifragilistic words get cut at four chars.", ["Who cuts?", "Why?"]),
    ]}))
    return path


def test_rows_are_each_articles_first_tokens_with_ids_by_frequency(squad: Path) -> None:
    text = read_text_batch(squad, batch=2, context=6, question=3, word_rows=6, char_limit=4)
    assert text.cw.shape == (2, 6) and text.qw.shape == (2, 3)
    assert text.cc.shape == (2, 6, 4) and text.qc.shape == (2, 3, 4)
    # row 0: "The cat sat on the mat" / "Where did the"; "the" is the most frequent word
    assert text.cw[0, 4] == 2 and text.qw[0, 2] == 2 and text.cw[0, 0] != 2  # cased
    assert (text.cw > 0).all() and (text.qw > 0).all()  # no padding
    assert (text.cw == OOV).any()  # a table of 6 rows holds 4 words beside PAD and OOV
    # each word's chars from its spelling, the same word the same row, cut at char_limit
    assert torch.equal(text.cc[0, 4], text.qc[0, 2]) and not text.cc[0, 4, 3]  # "the"
    assert (text.cc[1, 0] > 0).all()  # "Supercalifragilistic": its first 4 chars
    assert text.char_vocab > int(text.cc.max()) and text.distinct <= 18
    assert ((0 <= text.y1) & (text.y1 <= text.y2) & (text.y2 < 6)).all()


def test_too_few_articles_is_said(squad: Path) -> None:
    with pytest.raises(ValueError, match="2 articles hold 6 context"):
        read_text_batch(squad, batch=3, context=6, question=3, word_rows=100)
