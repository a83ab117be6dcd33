"""`rcpipe evaluate` (stages/evaluate.py) on tiny synthetic data: the v2.0 threshold it
chooses and the errors it gives. The v1.1 contract files are checked after training, in
tests/stages/test_train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.config import VARIANTS
from rcpipe.errors import InputError
from rcpipe.eval.metrics import score
from tests.conftest import TINY_MODEL, SynthData


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage writes models/, predictions/ and metrics/ under the current directory."""
    monkeypatch.chdir(tmp_path)


def test_a_missing_model_is_an_input_error(make_config, synth_v1: SynthData  # noqa: ANN001
                                           ) -> None:
    with pytest.raises(InputError, match="no trained model"):
        stages.evaluate(make_config(synth_v1), "qanet")


@pytest.mark.usefixtures("local_ray")
def test_v2_models_predict_no_answer_probabilities(
        make_config, synth_v2: SynthData) -> None:  # noqa: ANN001
    cfg = make_config(synth_v2, train={"epochs": 1, "batch_size": 16, "max_steps": 3},
                      models=dict.fromkeys(VARIANTS, TINY_MODEL))
    stages.prepare(cfg)
    stages.train(cfg, "rnet_mult")
    result = stages.evaluate(cfg, "rnet_mult")
    assert {"HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(result)
    nbest = json.loads(Path("predictions/rnet_mult.nbest.json").read_text())
    assert len({round(v["na_prob"], 6) for v in nbest.values()}) > 1
    # the answers are given at the official best-threshold walk's threshold over the best
    # non-empty spans, which every entry keeps, so the scores are the walk's best
    chosen = json.loads(Path("models/rnet_mult/na_threshold.json").read_text())
    assert chosen["na_threshold"] == result["best_f1_thresh"] and not chosen["fixed"]
    assert result["f1"] == pytest.approx(result["best_f1"])
    for entry in nbest.values():
        assert entry["span_text"]  # every context here has a span to give
        given = entry["na_prob"] <= chosen["na_threshold"]
        assert entry["text"] == (entry["span_text"] if given else "")
    preds = json.loads(Path("predictions/rnet_mult.json").read_text())
    assert score(synth_v2.dev_doc, preds)["f1"] == pytest.approx(result["f1"])
