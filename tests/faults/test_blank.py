"""Issue 43: a question of only zero-width characters says nothing, as a blank one: the
service answers it 422 and `rcpipe predict` refuses it in one line (it was answered;
str.strip keeps U+200B, U+200C, U+200D, U+2060 and U+FEFF)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import HTTPException

from rcpipe.reads import blank
from rcpipe.serve.app import _check_text
from tests.faults.test_abuse import assert_one_line, rcpipe
from tests.faults.test_abuse import here as here  # noqa: F401 - the fixtures, shared
from tests.faults.test_abuse import run_dir as run_dir  # noqa: F401

INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff"


def test_zero_width_characters_are_blank_and_words_beside_them_are_not() -> None:
    assert blank(INVISIBLE) and blank(" \u200b\n") and blank("")
    assert not blank("who\u200b?") and not blank("\u00e9")


def test_the_service_answers_a_zero_width_question_422() -> None:
    with pytest.raises(HTTPException) as e:
        _check_text("question", INVISIBLE, 1000)
    assert (e.value.status_code, e.value.detail) == (422, "question is empty")


def test_predict_refuses_a_zero_width_question_in_one_line(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, err = rcpipe(capsys, "predict", "--model", "bidaf", "--question", INVISIBLE,
                       "--context", "a b c")
    assert_one_line(code, err, "error: predict: --question: give a question")
