"""Training filters (every drop reason), dev labelling, and the Arrow table layout."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow.parquet as pq
import pytest

from rcpipe.config import DataConfig
from rcpipe.data import features as F
from rcpipe.data.squad import Answer, Question, SquadFile, load_squad
from rcpipe.data.tokenize import Tokens, tokenize
from rcpipe.data.vocab import OOV, PAD, build_vocab
from tests.conftest import Prepared

CFG = DataConfig(train_file="train.json", dev_file="dev.json", answer_search_window=8,
                 limits={"para": 20, "question": 6, "answer": 3, "char": 4})

CTX = "Ada Lovelace wrote the first program in 1843 for the engine."
LONG = " ".join(["word"] * 30) + "."
BLANK = "   "
WINDOWS = ("windows",)

# (qid, context, question, answer text, answer start, is_impossible, expected outcome)
# outcome: a drop reason, the answer's token span (y1, y2) when kept, or WINDOWS: a context
# over data.limits.para, kept as windows (test_a_long_context_trains_as_windows)
RECORDS: list[tuple[str, str, str, str | None, int, bool, Any]] = [
    ("ok", CTX, "Who wrote the first program?", "Ada Lovelace", 0, False, (0, 1)),
    ("misplaced", CTX, "When was it written?", "1843", CTX.index("1843") - 5, False, (7, 7)),
    ("last_token", CTX, "What ends it?", ".", len(CTX) - 1, False, (11, 11)),
    ("impossible", CTX, "Who read it?", None, 0, True, (-1, -1)),
    ("blank_q", CTX, BLANK, "Ada", 0, False, "blank_question"),
    ("blank_q_impossible", CTX, "", None, 0, True, "blank_question"),
    ("empty_ctx", BLANK, "Who wrote it?", "x", 0, False, "empty_context"),
    ("empty_ctx_impossible", "", "Who wrote it?", None, 0, True, "empty_context"),
    ("long_ctx", LONG, "Which word?", "word", 0, False, WINDOWS),
    ("long_ctx_impossible", LONG, "Which word?", None, 0, True, WINDOWS),
    ("long_q", CTX, "Who of all the people wrote the very first program?", "Ada", 0, False,
     "question_too_long"),
    ("start_past_end", CTX, "Who wrote?", "Ada", len(CTX) + 3, False,
     "answer_start_out_of_range"),
    ("start_negative", CTX, "Who wrote?", "Ada", -1, False, "answer_start_out_of_range"),
    ("mismatch", CTX, "Who designed the engine?", "Babbage", 0, False, "answer_text_mismatch"),
    ("too_far", CTX, "For what?", "engine", 0, False, "answer_text_mismatch"),
    ("blank_answer", CTX, "Who wrote?", " ", 0, False, "blank_answer"),
    ("too_long", CTX, "What happened?", "Ada Lovelace wrote the first", 0, False,
     "answer_too_long"),
    ("max_len", CTX, "What happened?", "Ada Lovelace wrote", 0, False, (0, 2)),
]


def make_squad(records: list[tuple[str, str, str, str | None, int, bool, Any]]) -> SquadFile:
    contexts: list[str] = []
    questions = []
    for k, (qid, context, question, text, start, impossible, _) in enumerate(records):
        if context not in contexts:
            contexts.append(context)
        answers = () if text is None else (Answer(text, start),)
        questions.append(Question(qid, question, contexts.index(context), answers, impossible,
                                  (), f"data[0].paragraphs[0].qas[{k}]"))
    return SquadFile("train.json", "v2.0", contexts, [f"T{i}" for i in range(len(contexts))],
                     questions)


@pytest.fixture(scope="module")
def constructed() -> tuple[SquadFile, list[Tokens], list[Tokens]]:
    sq = make_squad(RECORDS)
    toks = tokenize(sq.contexts + [q.question for q in sq.questions])
    return sq, toks[: len(sq.contexts)], toks[len(sq.contexts):]


def test_label_train_drop_reasons(constructed: tuple[SquadFile, list[Tokens], list[Tokens]]
                                  ) -> None:
    sq, ctx, qs = constructed
    kept, dropped, _ = F.label_train(sq, ctx, qs, CFG)
    expected_drops = Counter(o for *_, o in RECORDS if isinstance(o, str))
    assert dropped == expected_drops
    assert {q.qid: (r.y1, r.y2) for r in kept if r.window is None
            for q in [sq.questions[r.index]]} == {
        qid: o for qid, *_, o in RECORDS if not isinstance(o, str) and o != WINDOWS}
    assert len({r.index for r in kept}) + sum(dropped.values()) == len(sq.questions)
    assert [r.index for r in kept] == sorted(r.index for r in kept)  # file order


def test_kept_spans_rejoin_to_the_answer(
        constructed: tuple[SquadFile, list[Tokens], list[Tokens]]) -> None:
    sq, ctx, qs = constructed
    kept, _, _ = F.label_train(sq, ctx, qs, CFG)
    for r in kept:
        q = sq.questions[r.index]
        if q.is_impossible or r.y1 < 0:
            assert (r.y1, r.y2) == (-1, -1)
            continue
        t = ctx[q.context_index]
        skip, end = r.window or (0, len(t.words))
        assert 0 <= r.y1 <= r.y2 < end - skip
        text = sq.contexts[q.context_index][t.starts[skip + r.y1] : t.ends[skip + r.y2]]
        assert text == q.answers[0].text


def test_answer_not_aligned() -> None:
    # an answer that no token covers: only reachable with tokens that skip characters
    sq = make_squad([("gap", "alpha beta", "Which?", "beta", 6, False, None)])
    ctx = [Tokens(["alpha"], [0], [5])]
    qs = [Tokens(["Which", "?"], [0, 5], [5, 6])]
    kept, dropped, _ = F.label_train(sq, ctx, qs, CFG)
    assert kept == [] and dropped == Counter({"answer_not_aligned": 1})
    assert F.label_dev(sq, ctx, CFG) == [F.Labelled(0, -1, -1)]


def test_a_long_context_trains_as_windows(
        constructed: tuple[SquadFile, list[Tokens], list[Tokens]]) -> None:
    # LONG is 31 tokens over a limit of 20: windows of 20 at most 10 apart, at 0, 5 and 11
    sq, ctx, qs = constructed
    kept, _, windows = F.label_train(sq, ctx, qs, CFG)
    rows = {qid: [(r.window, r.y1, r.y2) for r in kept if sq.questions[r.index].qid == qid]
            for qid in ("long_ctx", "long_ctx_impossible")}
    # "word" at token 0: the first window trains on it; v2.0: the others are "no answer"
    assert rows["long_ctx"] == [((0, 20), 0, 0), ((5, 25), -1, -1), ((11, 31), -1, -1)]
    assert rows["long_ctx_impossible"] == [((0, 20), -1, -1), ((5, 25), -1, -1),
                                           ((11, 31), -1, -1)]
    assert windows == Counter(questions=2, rows=6, no_answer=5, left_out=0)


def test_v1_windows_without_the_answer_are_left_out() -> None:
    context = " ".join(f"w{i}" for i in range(40))
    sq = make_squad([("mid", context, "Which?", "w14 w15", context.index("w14"), False, None)])
    sq = SquadFile(sq.name, "1.1", sq.contexts, sq.titles, sq.questions)
    ctx, qs = tokenize(sq.contexts), tokenize(["Which?"])
    kept, dropped, windows = F.label_train(sq, ctx, qs, CFG)
    # windows of 20 at 0, 10, 20 (stride 10): tokens 14-15 lie whole in the first two
    assert [(r.window, r.y1, r.y2) for r in kept] == [((0, 20), 14, 15), ((10, 30), 4, 5)]
    assert not dropped and windows == Counter(questions=1, rows=2, no_answer=0, left_out=1)


def test_window_rows_hold_their_tokens() -> None:
    context = " ".join(f"w{i}" for i in range(40))
    sq = make_squad([("mid", context, "Which?", "w14 w15", context.index("w14"), False, None)])
    ctx, qs = tokenize(sq.contexts), tokenize(["Which?"])
    kept, _, _ = F.label_train(sq, ctx, qs, CFG)
    table = F.build_table(sq, ctx, qs, kept, _indexer(sq, ctx, qs)).to_pylist()
    assert len(table) == len(kept) == 3
    for r, row in zip(kept, table, strict=True):
        lo, hi = r.window or (0, 0)
        assert row["context_starts"] == ctx[0].starts[lo:hi]
        assert row["context_ends"] == ctx[0].ends[lo:hi]
        assert len(row["context_word_ids"]) == len(row["context_char_ids"]) == hi - lo
        if r.y1 >= 0:  # its span, counted in the window, is the answer's text
            assert context[row["context_starts"][r.y1] : row["context_ends"][r.y2]] == \
                "w14 w15"


def test_label_dev_keeps_everything(constructed: tuple[SquadFile, list[Tokens], list[Tokens]]
                                    ) -> None:
    sq, ctx, qs = constructed
    rows = F.label_dev(sq, ctx, CFG)
    assert [r.index for r in rows] == list(range(len(sq.questions)))
    by_id = {sq.questions[r.index].qid: (r.y1, r.y2) for r in rows}
    # limits do not apply to dev: long contexts and questions keep their labels
    assert by_id["ok"] == (0, 1) and by_id["misplaced"] == (7, 7)
    assert by_id["long_ctx"] == (0, 0)
    assert by_id["long_q"] == (0, 0)
    assert by_id["too_long"] == (0, 4)
    assert by_id["blank_q"] == (0, 0)
    # no usable answer: kept without a label
    for qid in ("impossible", "mismatch", "start_past_end", "blank_answer", "empty_ctx"):
        assert by_id[qid] == (-1, -1), qid


def test_label_dev_huge_context() -> None:
    context = " ".join(f"w{i}" for i in range(5000))
    start = context.index("w4321")
    sq = make_squad([("huge", context, "", "w4321", start, False, None)])
    ctx = tokenize(sq.contexts)
    assert F.label_dev(sq, ctx, CFG) == [F.Labelled(0, 4321, 4321)]
    kept, dropped, _ = F.label_train(sq, ctx, tokenize([""]), CFG)
    assert kept == [] and dropped == Counter({"blank_question": 1})


# -------------------------------------------------------------------------------- the table


def _indexer(sq: SquadFile, ctx: list[Tokens], qs: list[Tokens]) -> F.Indexer:
    words, chars = F.count_words(sq, ctx, qs)
    return F.Indexer(build_vocab(words, 2), build_vocab(chars, 1), CFG.limits.char)


def test_build_table_matches_schema(constructed: tuple[SquadFile, list[Tokens], list[Tokens]]
                                    ) -> None:
    sq, ctx, qs = constructed
    kept, _, _ = F.label_train(sq, ctx, qs, CFG)
    kept = [r for r in kept if r.window is None]  # windows: test_window_rows_hold_their_tokens
    indexer = _indexer(sq, ctx, qs)
    table = F.build_table(sq, ctx, qs, kept, indexer)
    assert table.schema.equals(F.SCHEMA, check_metadata=True)
    assert table.num_rows == len(kept)
    rows = table.to_pylist()
    for r, row in zip(kept, rows, strict=True):
        q = sq.questions[r.index]
        c = ctx[q.context_index]
        assert row["id"] == q.qid and row["question"] == q.question
        assert row["context"] == sq.contexts[q.context_index]
        assert row["title"] == sq.titles[q.context_index]
        assert (row["y1"], row["y2"]) == (r.y1, r.y2)
        assert row["is_impossible"] == q.is_impossible
        assert row["answers"] == [a.text for a in q.answers]
        assert row["context_starts"] == c.starts and row["context_ends"] == c.ends
        assert row["context_word_ids"] == [indexer.words.id(w) for w in c.words]
        assert row["question_word_ids"] == [indexer.words.id(w) for w in qs[r.index].words]
        assert row["context_char_ids"] == [[indexer.chars.id(ch) for ch in w[:4]]
                                           for w in c.words]
        assert all(1 <= len(ids) <= 4 for ids in row["question_char_ids"])
        assert all(i != 0 for i in row["context_word_ids"])  # 0 is reserved for padding
    assert rows[0]["context_word_ids"][1] == indexer.words.id(OOV)  # "Lovelace": seen once


def test_build_table_empty() -> None:
    sq = make_squad(RECORDS[:1])
    table = F.build_table(sq, [], [], [], F.Indexer(build_vocab(Counter(), 1),
                                                    build_vocab(Counter(), 1), 4))
    assert table.num_rows == 0 and table.schema.equals(F.SCHEMA)


def test_count_words_counts_each_context_once() -> None:
    records = [("a", "x y x", "x?", "y", 2, False, None), ("b", "x y x", "z", "y", 2, False, None)]
    sq = make_squad(records)
    ctx, qs = tokenize(sq.contexts), tokenize([q.question for q in sq.questions])
    words, chars = F.count_words(sq, ctx, qs)
    assert words == Counter({"x": 3, "y": 1, "?": 1, "z": 1})
    assert chars == Counter({"x": 3, "y": 1, "?": 1, "z": 1})
    assert PAD not in words and OOV not in words



def test_words_counted_a_piece_at_a_time_are_the_splits_counts() -> None:
    """prepare counts a split article by article (add_words), its chars once at the end."""
    texts = ["Ada wrote code.", "Ada read!", "Bob?", "é è"]
    toks = tokenize(texts)
    words = Counter[str]()
    F.add_words(words, toks[:1], toks[1:2])
    F.add_words(words, toks[2:3], toks[3:])
    assert (words, F.char_counts(words)) == F.count_words(make_squad([]), toks[:2], toks[2:])


# ------------------------------------------------------------------ on the prepared synth set


def test_every_question_accounted_for(prepared: Prepared) -> None:
    for split, path in (("train", prepared.data.train), ("dev", prepared.data.dev)):
        sq = load_squad(str(path), prepared.cfg.data.cache_dir)
        table = pq.read_table(prepared.out_dir / split)
        assert table.schema.remove_metadata().equals(F.SCHEMA.remove_metadata())
        r = prepared.report[split]
        held = prepared.report["heldout"]["questions"] if split == "train" else 0
        assert r["questions"] == len(sq.questions) - held
        assert table.num_rows == r.get("rows", r["kept"])  # no synthetic context is long
        assert r["kept"] == r["questions"] - sum(r["dropped"].values())
        ids = table.column("id").to_pylist()
        assert len(set(ids)) == len(ids)
        if split == "dev":
            assert ids == [q.qid for q in sq.questions]


def test_prepared_spans_rejoin(prepared: Prepared) -> None:
    table = pq.read_table(prepared.out_dir / "train").to_pylist()
    labelled = [row for row in table if row["y1"] >= 0]
    assert len(labelled) == len(table)  # synthetic v1.1: every kept question is answerable
    for row in labelled:
        assert row["y1"] <= row["y2"] < len(row["context_word_ids"])
        text = row["context"][row["context_starts"][row["y1"]] : row["context_ends"][row["y2"]]]
        assert text == row["answers"][0]


def test_dev_labels_in_range(prepared: Prepared) -> None:
    table = pq.read_table(prepared.out_dir / "dev").to_pylist()
    assert all(-1 <= row["y1"] <= row["y2"] < len(row["context_word_ids"]) for row in table)
    assert all((row["y1"] == -1) == (row["y2"] == -1) for row in table)
