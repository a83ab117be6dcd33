"""Tokenized SQuAD -> Arrow tables: training filters, span labels, word and char ids.

Pure functions, no file I/O (stages.prepare does the reading and writing). One row per
question, self-contained (context ids repeated per question) so any worker can read any
shard; Parquet's dictionary encoding keeps the repeated context text small on disk.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa

from rcpipe.config import DataConfig
from rcpipe.data.schema import IDS, SCHEMA
from rcpipe.data.squad import SquadFile, check_answer
from rcpipe.data.tokenize import Tokens, char_span_to_token_span
from rcpipe.data.vocab import Vocab
from rcpipe.data.windows import window_starts


@dataclass(frozen=True)
class Labelled:
    """A row kept for a split: a question, with its answer token span (-1, -1 when none);
    with ``window``, the row reads only the context's tokens [start, end) and its span is
    counted from ``start`` (a training context over data.limits.para: data/windows.py)."""

    index: int  # into SquadFile.questions
    y1: int
    y2: int
    window: tuple[int, int] | None = None


def label_train(sq: SquadFile, ctx: list[Tokens], qs: list[Tokens], cfg: DataConfig
                ) -> tuple[list[Labelled], Counter[str], Counter[str]]:
    """Keep the questions a model can learn from; count every other one by its reason.

    A context over data.limits.para becomes windows of that many tokens
    (DataConfig.train_window): each window holding the whole answer is a row trained on its
    span; for SQuAD v2.0 each window holding none of it is a no-answer row (what the model
    must say of a window without the answer: inference/window_choice.py takes the document's lowest
    no-answer probability), for v1.1, whose models have no no-answer score, it is left out,
    as is a window holding part of the answer. An unanswerable question's windows are all
    no-answer rows. Returns (rows, dropped questions by reason, window counts: "questions"
    read as windows, "rows" they gave, of which "no_answer", and "left_out" windows).
    """
    kept: list[Labelled] = []
    dropped: Counter[str] = Counter()
    windows: Counter[str] = Counter()
    lim = cfg.limits
    length, stride = cfg.train_window()
    v2 = "2.0" in sq.version
    for i, q in enumerate(sq.questions):
        context = sq.contexts[q.context_index]
        c_tok, q_tok = ctx[q.context_index], qs[i]
        reason = None
        if not q.question.strip() or not q_tok.words:
            reason = "blank_question"
        elif not context.strip() or not c_tok.words:
            reason = "empty_context"
        elif len(q_tok.words) > lim.question:
            reason = "question_too_long"
        if reason:
            dropped[reason] += 1
            continue
        n = len(c_tok.words)
        if q.is_impossible:
            tok = (-1, -1)
        else:
            span = check_answer(context, q.answers[0], cfg.answer_search_window)
            if isinstance(span, str):
                dropped[span] += 1
                continue
            found = char_span_to_token_span(c_tok, *span)
            if found is None:
                dropped["answer_not_aligned"] += 1
                continue
            if found[1] - found[0] + 1 > lim.answer:
                dropped["answer_too_long"] += 1
                continue
            tok = found
        if n <= lim.para:
            kept.append(Labelled(i, *tok))
            continue
        rows = window_rows(i, tok, window_starts(n, length, stride), length, v2)
        if not any(r.y1 >= 0 for r in rows) and tok[0] >= 0:
            dropped["answer_across_windows"] += 1  # no window holds it whole
            continue
        count = len(window_starts(n, length, stride))
        windows.update(questions=1, rows=len(rows), left_out=count - len(rows),
                       no_answer=sum(r.y1 < 0 for r in rows))
        kept.extend(rows)
    return kept, dropped, windows


def window_rows(i: int, tok: tuple[int, int], starts: list[int], length: int, v2: bool
                ) -> list[Labelled]:
    """Question i's training rows over windows of ``length`` tokens at ``starts``, its
    answer at tokens ``tok`` ((-1, -1): none) of the whole context (label_train's rule)."""
    y1, y2 = tok
    rows = []
    for s in starts:
        e = s + length
        if y1 >= 0 and s <= y1 and y2 < e:  # the whole answer: its span, from s
            rows.append(Labelled(i, y1 - s, y2 - s, (s, e)))
        elif v2 and (y1 < 0 or y2 < s or y1 >= e):  # none of it: "no answer" here
            rows.append(Labelled(i, -1, -1, (s, e)))
    return rows


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
    """Word and char ids as Arrow list columns, each distinct surface form looked up once.

    Arrow dictionary-encodes the tokens (C++), Python maps only the distinct forms to ids,
    and ``take`` on the forms' ids yields every token's word id and char ids.
    """

    def __init__(self, words: Vocab, chars: Vocab, char_limit: int) -> None:
        self.words, self.chars, self.char_limit = words, chars, char_limit
        self._chars: dict[str, list[int]] = {}

    def _char_ids(self, form: str) -> list[int]:
        ids = self._chars.get(form)
        if ids is None:
            ids = self._chars[form] = [self.chars.id(c) for c in form[: self.char_limit]]
        return ids

    def encode(self, tokens: list[Tokens]) -> dict[str, pa.Array]:
        """One row per Tokens: word_ids, char_ids, starts, ends (list columns)."""
        flat = pa.array(list(chain.from_iterable(t.words for t in tokens)), type=pa.string())
        encoded = flat.dictionary_encode()
        forms = encoded.dictionary.to_pylist()  # distinct surface forms
        idx = encoded.indices  # (total tokens,) into forms
        word_of = pa.array([self.words.id(f) for f in forms], type=pa.int32())
        chars_of = pa.array([self._char_ids(f) for f in forms], type=IDS)
        n = len(flat)
        offsets = pa.array(np.cumsum([0] + [len(t.words) for t in tokens], dtype=np.int32))
        columns = {
            "word_ids": word_of.take(idx),
            "char_ids": chars_of.take(idx),
            "starts": pa.array(np.fromiter(chain.from_iterable(t.starts for t in tokens),
                                           np.int32, n)),
            "ends": pa.array(np.fromiter(chain.from_iterable(t.ends for t in tokens),
                                         np.int32, n)),
        }
        return {k: pa.ListArray.from_arrays(offsets, v) for k, v in columns.items()}


def build_table(sq: SquadFile, ctx: list[Tokens], qs: list[Tokens], rows: list[Labelled],
                indexer: Indexer) -> pa.Table:
    """One row per labelled question, typed by SCHEMA."""
    questions = [sq.questions[r.index] for r in rows]
    # contexts are encoded once; rows then gather them by position (Arrow take)
    used = sorted({q.context_index for q in questions})
    pos = {c: i for i, c in enumerate(used)}
    gather = pa.array([pos[q.context_index] for q in questions], type=pa.int32())
    c_enc = {k: v.take(gather) for k, v in indexer.encode([ctx[c] for c in used]).items()}
    if any(r.window is not None for r in rows):  # windows: each row its tokens alone
        starts = np.array([r.window[0] if r.window else 0 for r in rows], dtype=np.int64)
        ends = np.array([r.window[1] if r.window else len(ctx[q.context_index].words)
                         for r, q in zip(rows, questions, strict=True)], dtype=np.int64)
        c_enc = {k: slice_lists(v, starts, ends - starts) for k, v in c_enc.items()}
    q_enc = indexer.encode([qs[r.index] for r in rows])
    cols = {
        "id": [q.qid for q in questions],
        "title": pa.array([sq.titles[c] for c in used]).take(gather),
        "context": pa.array([sq.contexts[c] for c in used]).take(gather),
        "question": [q.question for q in questions],
        "context_word_ids": c_enc["word_ids"],
        "context_char_ids": c_enc["char_ids"],
        "context_starts": c_enc["starts"],
        "context_ends": c_enc["ends"],
        "question_word_ids": q_enc["word_ids"],
        "question_char_ids": q_enc["char_ids"],
        "y1": [r.y1 for r in rows],
        "y2": [r.y2 for r in rows],
        "is_impossible": [q.is_impossible for q in questions],
        "answers": [[a.text for a in q.answers] for q in questions],
    }
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def slice_lists(column: pa.ListArray, starts: np.ndarray, lengths: np.ndarray
                ) -> pa.ListArray:
    """Row i of ``column`` cut to its items [starts[i], starts[i] + lengths[i])."""
    offsets = column.offsets.to_numpy()[:-1] + starts  # (N,) where each row's cut begins
    owner = np.repeat(np.arange(len(lengths)), lengths)  # (T,) each kept item's row
    before = np.cumsum(lengths) - lengths  # (N,) items kept ahead of each row
    take = offsets[owner] + np.arange(len(owner)) - before[owner]  # (T,) into the values
    values = column.values.take(pa.array(take, type=pa.int64()))
    new = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(new), values)


def count_words(sq: SquadFile, ctx: list[Tokens], qs: list[Tokens]
                ) -> tuple[Counter[str], Counter[str]]:
    """Word and char counts over a split: each context once, each question once."""
    words: Counter[str] = Counter()
    add_words(words, ctx, qs)
    return words, char_counts(words)


def add_words(words: Counter[str], ctx: list[Tokens], qs: list[Tokens]) -> None:
    """Count an article's words into ``words`` (prepare counts a split article by article)."""
    for t in chain(ctx, qs):
        words.update(t.words)


def char_counts(words: Counter[str]) -> Counter[str]:
    """Each character's count: a word's count for each time it holds the character."""
    chars: Counter[str] = Counter()
    for w, n in words.items():
        for ch in w:
            chars[ch] += n
    return chars
