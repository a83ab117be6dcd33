"""rcpipe.stages.score: the official numbers for a predictions file, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.errors import InputError
from tests.conftest import SynthData, questions_of

# ------------------------------------------------------------------------------------ score


def test_score_direct(synth_v1: SynthData, tmp_path: Path,
                      caplog: pytest.LogCaptureFixture) -> None:
    qas = questions_of(synth_v1.dev_doc)
    preds = {qa["id"]: qa["answers"][0]["text"] for qa in qas[: len(qas) // 2]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(preds))
    with caplog.at_level("WARNING", logger="rcpipe.stages.score"):
        result = stages.score(str(synth_v1.dev), path, cache_dir=tmp_path / "cache")
    assert result["exact_match"] == pytest.approx(100.0 * len(preds) / len(qas))
    # the unanswered half is said, with the official script's rule for it
    assert f"{len(preds)} of {len(qas)} questions have a prediction" in caplog.text


def test_predictions_matching_no_question_are_an_error_not_a_zero(
        synth_v1: SynthData, tmp_path: Path) -> None:
    """Another dataset's predictions once scored 0.0, exit 0."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({f"elsewhere-{i}": "x" for i in range(5)}))
    with pytest.raises(InputError) as err:
        stages.score(str(synth_v1.dev), path, cache_dir=tmp_path / "cache")
    assert err.value.file == str(path) and "no id matches a question" in err.value.what


# --------------------------------------------------------------------------------- ensemble
