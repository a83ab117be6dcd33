"""Tokenized SQuAD -> Arrow tables: training filters, span labels, word and char ids.

Pure functions, no file I/O (stages.prepare does the reading and writing). One row per
question, self-contained (context ids repeated per question) so any worker can read any
shard; Parquet's dictionary encoding keeps the repeated context text small on disk.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa

from rcpipe.config import DataConfig
from rcpipe.data.squad import SquadFile, check_answer
from rcpipe.data.tokenize import Tokens, char_span_to_token_span
from rcpipe.data.vocab import Vocab

_ids = pa.list_(pa.int32())
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("context", pa.string()),
        pa.field("question", pa.string()),
        pa.field("context_word_ids", _ids),  # (Lc,)
        pa.field("context_char_ids", pa.list_(_ids)),  # (Lc, <=char_limit)
        pa.field("context_starts", _ids),  # (Lc,) char offset of each token
        pa.field("context_ends", _ids),  # (Lc,) one past its last char
        pa.field("question_word_ids", _ids),  # (Lq,)
        pa.field("question_char_ids", pa.list_(_ids)),  # (Lq, <=char_limit)
        pa.field("y1", pa.int32()),  # answer start token, -1 when none
        pa.field("y2", pa.int32()),  # answer end token (inclusive), -1 when none
        pa.field("is_impossible", pa.bool_()),
        pa.field("answers", pa.list_(pa.string())),  # gold texts, for inspection
    ],
    metadata={"rcpipe": "prepared SQuAD split, one row per question"},
)


@dataclass(frozen=True)
class Labelled:
    """A question kept for a split, with its answer token span (-1, -1 when none)."""

    index: int  # into SquadFile.questions
    y1: int
    y2: int


def label_train(sq: SquadFile, ctx: list[Tokens], qs: list[Tokens], cfg: DataConfig
                ) -> tuple[list[Labelled], Counter[str]]:
    """Keep the questions a model can learn from; count every other one by its reason."""
    kept: list[Labelled] = []
    dropped: Counter[str] = Counter()
    lim = cfg.limits
    for i, q in enumerate(sq.questions):
        context = sq.contexts[q.context_index]
        c_tok, q_tok = ctx[q.context_index], qs[i]
        reason = None
        if not q.question.strip() or not q_tok.words:
            reason = "blank_question"
        elif not context.strip() or not c_tok.words:
            reason = "empty_context"
        elif len(c_tok.words) > lim.para:
            reason = "context_too_long"
        elif len(q_tok.words) > lim.question:
            reason = "question_too_long"
        if reason:
            dropped[reason] += 1
            continue
        if q.is_impossible:
            kept.append(Labelled(i, -1, -1))
            continue
        span = check_answer(context, q.answers[0], cfg.answer_search_window)
        if isinstance(span, str):
            dropped[span] += 1
            continue
        tok = char_span_to_token_span(c_tok, *span)
        if tok is None:
            dropped["answer_not_aligned"] += 1
        elif tok[1] - tok[0] + 1 > lim.answer:
            dropped["answer_too_long"] += 1
        else:
            kept.append(Labelled(i, *tok))
    return kept, dropped


def label_dev(sq: SquadFile, ctx: list[Tokens], cfg: DataConfig) -> list[Labelled]:
    """Every dev question, however long or odd; a span label only where one aligns."""
    out = []
    for i, q in enumerate(sq.questions):
        tok = None
        if q.answers:
            span = check_answer(sq.contexts[q.context_index], q.answers[0],
                                cfg.answer_search_window)
            if not isinstance(span, str):
                tok = char_span_to_token_span(ctx[q.context_index], *span)
        out.append(Labelled(i, *(tok or (-1, -1))))
    return out


class Indexer:
    """Word and char ids, with each distinct word's char ids computed once."""

    def __init__(self, words: Vocab, chars: Vocab, char_limit: int) -> None:
        self.words, self.chars, self.char_limit = words, chars, char_limit
        self._char_cache: dict[str, list[int]] = {}

    def word_ids(self, tokens: Tokens) -> list[int]:
        return [self.words.id(w) for w in tokens.words]

    def char_ids(self, tokens: Tokens) -> list[list[int]]:
        out = []
        for w in tokens.words:
            ids = self._char_cache.get(w)
            if ids is None:
                ids = [self.chars.id(c) for c in w[: self.char_limit]]
                self._char_cache[w] = ids
            out.append(ids)
        return out


def build_table(sq: SquadFile, ctx: list[Tokens], qs: list[Tokens], rows: list[Labelled],
                indexer: Indexer) -> pa.Table:
    """One row per labelled question, typed by SCHEMA."""
    # contexts are indexed once and shared by their questions
    ctx_words: dict[int, list[int]] = {}
    ctx_chars: dict[int, list[list[int]]] = {}
    cols: dict[str, list] = {f.name: [] for f in SCHEMA}
    for r in rows:
        q = sq.questions[r.index]
        c = q.context_index
        if c not in ctx_words:
            ctx_words[c] = indexer.word_ids(ctx[c])
            ctx_chars[c] = indexer.char_ids(ctx[c])
        cols["id"].append(q.qid)
        cols["title"].append(sq.titles[c])
        cols["context"].append(sq.contexts[c])
        cols["question"].append(q.question)
        cols["context_word_ids"].append(ctx_words[c])
        cols["context_char_ids"].append(ctx_chars[c])
        cols["context_starts"].append(ctx[c].starts)
        cols["context_ends"].append(ctx[c].ends)
        cols["question_word_ids"].append(indexer.word_ids(qs[r.index]))
        cols["question_char_ids"].append(indexer.char_ids(qs[r.index]))
        cols["y1"].append(r.y1)
        cols["y2"].append(r.y2)
        cols["is_impossible"].append(q.is_impossible)
        cols["answers"].append([a.text for a in q.answers])
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def count_words(sq: SquadFile, ctx: list[Tokens], qs: list[Tokens]
                ) -> tuple[Counter[str], Counter[str]]:
    """Word and char counts over a split: each context once, each question once."""
    words: Counter[str] = Counter()
    for t in ctx:
        words.update(t.words)
    for t in qs:
        words.update(t.words)
    chars: Counter[str] = Counter()
    for w, n in words.items():
        for ch in w:
            chars[ch] += n
    return words, chars
