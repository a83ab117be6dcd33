"""The tensors bench/peers.py feeds both sides: real text, as a batch of it repeats words.

Each row is one article of a SQuAD file: its first ``context`` tokens (paragraphs in order)
and the first ``question`` tokens of its questions, tokenized as `rcpipe prepare` does
(spaCy's rule-based English). Word ids count from 2 by frequency in the batch (0 = padding,
1 = out of vocabulary: a word past the table); char ids likewise, each word's chars from its
spelling, cut at ``char_limit`` (data.limits.char). No row has padding: an article short of
either length is passed over.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rcpipe.data.tokenize import tokenize

PAD, OOV = 0, 1


@dataclass(frozen=True)
class TextBatch:
    cw: torch.Tensor  # (B, Lc) word ids
    cc: torch.Tensor  # (B, Lc, W) char ids
    qw: torch.Tensor  # (B, Lq)
    qc: torch.Tensor  # (B, Lq, W)
    y1: torch.Tensor  # (B,) a span inside each context: labels do not move the time
    y2: torch.Tensor  # (B,)
    char_vocab: int  # rows a char table needs (ids and padding)
    distinct: int  # distinct words among the batch's tokens


def article_tokens(squad: dict, articles: int, context: int, question: int
                   ) -> list[tuple[list[str], list[str]]]:
    """The first ``articles`` articles with enough text: (context words, question words)."""
    rows: list[tuple[list[str], list[str]]] = []
    for article in squad["data"]:
        paragraphs = [p["context"] for p in article["paragraphs"]]
        questions = [q["question"] for p in article["paragraphs"] for q in p["qas"]]
        c, q = (sum((t.words for t in tokenize(texts, quiet=True)), [])
                for texts in (_enough(paragraphs, context), _enough(questions, question)))
        if len(c) >= context and len(q) >= question:
            rows.append((c[:context], q[:question]))
        if len(rows) == articles:
            return rows
    raise ValueError(f"{len(rows)} articles hold {context} context and {question} question "
                     f"tokens, not {articles}")


def _enough(texts: Sequence[str], tokens: int) -> list[str]:
    """The texts from the first until they surely hold ``tokens`` tokens (a token has at
    least one char), so that a long article is not tokenized whole."""
    out, chars = [], 0
    for text in texts:
        out.append(text)
        chars += len(text)
        if chars >= 8 * tokens and len(" ".join(out).split()) >= tokens:
            break
    return out


def ids_by_count(items: Counter[str], rows: int) -> dict[str, int]:
    """Ids from 2 (after PAD and OOV), the most frequent first, at most ``rows`` ids in
    all; ties in first-seen order (Counter.most_common keeps it)."""
    return {w: i + 2 for i, (w, _) in enumerate(items.most_common(max(rows - 2, 0)))}


def text_batch(rows: list[tuple[list[str], list[str]]], word_rows: int,
               char_limit: int = 16) -> TextBatch:
    """Word and char ids of ``rows`` (equal lengths), for a table of ``word_rows`` words."""
    words = ids_by_count(Counter(w for c, q in rows for w in c + q), word_rows)
    chars = ids_by_count(Counter(ch for c, q in rows for w in c + q for ch in w), 1 << 20)

    def encode(part: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = [r[part] for r in rows]
        w = torch.tensor([[words.get(t, OOV) for t in row] for row in tokens])  # (B, L)
        c = torch.zeros(*w.shape, char_limit, dtype=torch.long)  # (B, L, W)
        for b, row in enumerate(tokens):
            for i, token in enumerate(row):
                spelt = [chars[ch] for ch in token[:char_limit]]
                c[b, i, : len(spelt)] = torch.tensor(spelt)
        return w, c

    (cw, cc), (qw, qc) = encode(0), encode(1)
    n, lc = cw.shape
    y1 = (torch.arange(n) * 37) % max(lc - 10, 1)  # (B,)
    distinct = len({t for c, q in rows for t in c + q})
    return TextBatch(cw, cc, qw, qc, y1, y1 + torch.arange(n) % 10, len(chars) + 2, distinct)


def read_text_batch(path: Path, batch: int, context: int, question: int, word_rows: int,
                    char_limit: int = 16) -> TextBatch:
    squad = json.loads(path.read_text(encoding="utf-8"))
    return text_batch(article_tokens(squad, batch, context, question), word_rows, char_limit)


def save_text_batch(text: TextBatch, word_rows: int, path: Path) -> Path:
    """The batch as one file, for a machine without spaCy (the GPU kit carries it):
    its tensors and counts, and the word table's rows it was built for."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**dataclasses.asdict(text), "word_rows": word_rows}, path)
    return path


def load_text_batch(path: Path, word_rows: int | None = None) -> tuple[TextBatch, int]:
    """A batch save_text_batch wrote, and the word table's rows it was built for;
    ``word_rows``, where given, must be those (its ids index that table: another size would
    read past it or leave rows unused)."""
    saved = torch.load(path, weights_only=True)
    built_for = int(saved.pop("word_rows"))
    if word_rows is not None and built_for != word_rows:
        raise ValueError(f"{path}: built for a table of {built_for} words, a different "
                         f"number of words than --words {word_rows}")
    return TextBatch(**saved), built_for
