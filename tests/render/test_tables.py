"""The report's tables on hand-made predictions, with the exact numbers worked out by hand."""

from __future__ import annotations

import pytest

from rcpipe.render import tables as report

SHORT = "The cat sat on the mat in Paris in 1999 while Marie Curie watched ."  # 14 words
LONG = " ".join(["Counting words is dull but someone has to do it ."] * 6)  # 66 words


def _qa(qid: str, question: str, *answers: str) -> dict:
    return {"id": qid, "question": question,
            "answers": [{"text": a, "answer_start": 0} for a in answers]}


V1 = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
    {"context": SHORT, "qas": [_qa("q1", "What sat on the mat?", "The cat"),
                               _qa("q2", "Who watched?", "Marie Curie"),
                               _qa("q3", "In what year... no, when was it?", "1999")]},
    {"context": LONG, "qas": [_qa("q4", "How many words are dull?", "one cat")]},
]}]}

# A: q1 exact ("The cat" normalises to "cat"), q2 half the gold tokens (F1 2/3), q3 wrong,
# q4 missing. B: q1 wrong, the rest exact. C: A with q3 right.
A = {"q1": "cat", "q2": "Marie", "q3": "2000"}
B = {"q1": "the mat", "q2": "Marie Curie", "q3": "1999", "q4": "one cat"}
C = {"q1": "cat", "q2": "Marie", "q3": "1999"}


def test_f1_by_question_type_per_model() -> None:
    t = report.by_question_type(V1, {"A": A, "B": B})
    # q3 opens with "In what year": its first wh-word is "what"
    assert t.groups == ["what", "who", "how many"]
    assert t.counts == [2, 1, 1]
    assert t.f1["A"] == pytest.approx([50.0, 100 * 2 / 3, 0.0])
    assert t.exact["A"] == [50.0, 0.0, 0.0]
    assert t.f1["B"] == [50.0, 100.0, 100.0]
    assert t.rows()[1] == {"question_type": "who", "questions": 1, "A": 66.67, "B": 100.0}


def test_f1_by_answer_and_context_length() -> None:
    by_answer = report.by_answer_length(V1, {"A": A, "B": B})
    assert by_answer.groups == ["1", "2"]  # "1999"; "The cat", "Marie Curie", "one cat"
    assert by_answer.counts == [1, 3]
    assert by_answer.f1["A"] == pytest.approx([0.0, 100 * (1 + 2 / 3 + 0) / 3])
    assert by_answer.f1["B"] == pytest.approx([100.0, 100 * 2 / 3])
    assert by_answer.rows(["A", "X"]) == [
        {"answer_length": "1", "min_words": 1, "questions": 1, "A": 0.0, "X": ""},
        {"answer_length": "2", "min_words": 2, "questions": 3, "A": 55.56, "X": ""}]
    by_context = report.by_context_length(V1, {"A": A, "B": B})
    assert by_context.groups == ["<50", "50-99"]
    assert by_context.counts == [3, 1]
    assert by_context.f1["A"] == pytest.approx([100 * (1 + 2 / 3) / 3, 0.0])
    assert by_context.f1["B"] == pytest.approx([100 * 2 / 3, 100.0])


def test_answerability_on_v2() -> None:
    v2 = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": SHORT, "qas": [_qa("h1", "Who watched?", "Marie Curie"),
                                   _qa("h2", "What sat?", "The cat"),
                                   _qa("n1", "Who slept?")]}]}]}
    t = report.by_answerability(v2, {"M": {"h1": "Marie Curie", "h2": "", "n1": ""},
                                     "N": {"h1": "", "h2": "", "n1": "Paris"}})
    assert t.groups == ["HasAns", "NoAns"] and t.counts == [2, 1]
    assert t.f1 == {"M": [50.0, 100.0], "N": [0.0, 0.0]}
    assert report.by_answer_length(v2, {"M": {}}).groups == ["2", report.NO_ANSWER]


def test_agreement_matrix_counts_same_texts_over_every_question() -> None:
    qids = ["q1", "q2", "q3", "q4"]
    m = report.agreement_matrix({"A": A, "B": B, "C": C}, qids)
    assert m == [[0.75, 0.0, 0.5],  # A-C: q1, q2 (q4: neither answered it)
                 [0.0, 1.0, 0.25],  # B-C: q3 "1999"
                 [0.5, 0.25, 0.75]]
    assert report.agreement_matrix({"A": {"x": ""}, "B": {"x": ""}}, ["x"]) == [[1.0, 1.0],
                                                                               [1.0, 1.0]]
    with pytest.raises(ValueError):
        report.agreement_matrix({"A": A}, [])


def test_score_rows_take_v1_and_v2_keys() -> None:
    rows = report.score_rows({
        "bidaf": {"exact_match": 61.234, "f1": 70.0},
        "ensemble": {"exact": 50.0, "f1": 55.556, "total": 3, "HasAns_f1": 40.0,
                     "NoAns_f1": 80.0, "na_threshold": 0.5, "na_threshold_source": "heldout",
                     "oracle": {"best_f1": 60.0, "best_f1_thresh": 0.4}}})
    assert rows == [{"model": "bidaf", "EM": 61.23, "F1": 70.0},
                    {"model": "ensemble", "EM": 50.0, "F1": 55.56, "HasAns_f1": 40.0,
                     "NoAns_f1": 80.0, "oracle_best_f1": 60.0}]


def test_bucket_edges() -> None:
    q = report.DevQuestion("x", "?", "w " * 50, ["a b c d e"])
    assert report.context_length_group(q) == "50-99"
    assert report.answer_length_group(q) == "4-5"
    assert report.answer_length_group(report.DevQuestion("x", "?", "", ["  "])) == "1"
    assert report.context_length_group(report.DevQuestion("x", "?", "w " * 300, [])) == "300+"


def test_a_search_table_is_best_first_and_its_curve_never_falls() -> None:
    from rcpipe.render import pages, plots
    from rcpipe.render.tables import best_so_far, trial_rows

    search = {"variant": "bidaf", "metric": "rank", "data": "the held-out articles", "minutes": 0.1,
              "budget": "6 steps", "max_steps": 6, "layer": "tune/bidaf.yaml", "rows": [
                  {"id": "a_0", "status": "stopped", "steps": 2, "minutes": 0.011, "best": 10.0,
                   "best_step": 2,
                   "settings": {"optim": {"name": "adam", "lr": 0.01}, "dropout": 0.1234567},
                   "curve": [[0.0, 2, 10.0]]},
                  {"id": "a_1", "status": "finished", "steps": 6, "best": 30.0, "best_step": 4,
                   "settings": {"optim": {"name": "adadelta", "lr": 0.5}, "dropout": 0.2},
                   "curve": [[1.0, 2, 5.0], [3.0, 4, 30.0], [6.0, 6, 20.0]]},
                  {"id": "a_2", "status": "failed", "steps": 0, "best": None,
                   "best_step": None, "settings": {"dropout": 0.3}, "curve": []}]}
    rows = trial_rows(search)
    assert [r["trial"] for r in rows] == ["a_1", "a_0", "a_2"]
    assert rows[1]["optim"] == "name=adam lr=0.01" and rows[1]["dropout"] == "0.1235"
    assert rows[2]["optim"] == ""  # a setting the trial never got
    assert rows[1]["minutes"] == 0.01 and rows[0]["minutes"] == 0.0  # none: from before
    curve = best_so_far(search)
    assert [p["best"] for p in curve] == [10.0, 10.0, 30.0, 30.0]
    assert [p["minutes"] for p in curve] == [0.0, round(1 / 60, 3), 0.05, 0.1]
    png = plots.search_png("bidaf", "rank", curve)
    assert png.startswith(b"\x89PNG")
    html = pages.search_section(search, rows, png, "tune_bidaf.csv")
    assert "Settings search: bidaf" in html and "tune/bidaf.yaml" in html
    assert "up to 6 steps each" in html


def test_the_ensembles_other_methods_stand_beside_it() -> None:
    """metrics/ensemble.json's "methods" (rcpipe ensemble): a row each for the methods
    ensemble.method did not give, the given one as the ensemble's own row."""
    rows = report.score_rows({"ensemble": {
        "exact_match": 50.0, "f1": 60.0, "method": "mean",
        "methods": {"vote": {"em": 40.0, "f1": 55.0}, "mean": {"em": 50.0, "f1": 60.0},
                    "selected": {"em": 52.0, "f1": 61.5, "weights": {"bidaf": 2}}}}})
    assert rows == [{"model": "ensemble", "EM": 50.0, "F1": 60.0},
                    {"model": "ensemble (vote)", "EM": 40.0, "F1": 55.0},
                    {"model": "ensemble (selected)", "EM": 52.0, "F1": 61.5}]
