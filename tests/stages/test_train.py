"""`rcpipe train` / `rcpipe evaluate` end to end on tiny synthetic data.

Each Ray Train job costs ~20 s of start-up on 2 cores, so the contract files are checked
here for one recurrent and one convolutional variant (the other three: rnet_mult in the v2.0
test below, all five through `rcpipe train` in tests/integration/test_dvc_s3.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.config import VARIANTS
from rcpipe.errors import InputError
from rcpipe.eval.metrics import score
from tests.conftest import SynthData, questions_of

pytestmark = pytest.mark.usefixtures("local_ray")

TINY = {"hidden": 8, "char_dim": 4, "char_hidden": 8, "layers": 1, "heads": 2,
        "model_blocks": 1, "emb_convs": 1, "model_convs": 1, "highway_layers": 1}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage writes models/, predictions/ and metrics/ under the current directory."""
    monkeypatch.chdir(tmp_path)


def _config(make_config, data: SynthData, **train):  # noqa: ANN001, ANN202
    models = {v: TINY for v in VARIANTS}
    return make_config(data, train={"epochs": 1, "batch_size": 16, **train}, models=models)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["bidaf", "qanet"])
def test_train_then_evaluate_writes_the_contract_files(
        variant: str, make_config, synth_v1: SynthData) -> None:  # noqa: ANN001
    cfg = _config(make_config, synth_v1)
    stages.prepare(cfg)
    summary = stages.train(cfg, variant)
    on_disk = json.loads(Path(f"models/{variant}/summary.json").read_text())
    assert on_disk == summary
    assert summary["world_size"] == 1 and summary["resumed_from_step"] == 0
    assert summary["steps"] > 0 and summary["examples_per_s"] > 0
    assert summary["device"] == "cpu"
    assert Path(f"models/{variant}/model.pt").is_file()
    assert list(Path(f"models/{variant}/checkpoints").glob("step-*/model.pt"))

    result = stages.evaluate(cfg, variant)
    preds = json.loads(Path(f"predictions/{variant}.json").read_text())
    nbest = json.loads(Path(f"predictions/{variant}.nbest.json").read_text())
    dev_ids = {qa["id"] for qa in questions_of(synth_v1.dev_doc)}
    assert set(preds) == dev_ids == set(nbest)
    for qid, entry in nbest.items():
        assert entry["text"] == preds[qid]
        assert 0.0 <= entry["prob"] <= 1.0 and 0.0 <= entry["na_prob"] <= 1.0
    # the metrics file holds exactly what the official computation gives for the predictions
    assert json.loads(Path(f"metrics/{variant}.json").read_text()) == result
    assert result == score(synth_v1.dev_doc, preds)

    # the model is refused once the prepared vocabulary is not the one it was trained on
    vocab = cfg.data.out_dir / "vocab.json"
    doc = json.loads(vocab.read_text())
    doc["words"].append("an-extra-word")
    vocab.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="another vocabulary"):
        stages.evaluate(cfg, variant)


def test_finished_run_is_not_retrained_and_resume_continues(
        make_config, synth_v1: SynthData) -> None:  # noqa: ANN001
    cfg = _config(make_config, synth_v1)
    stages.prepare(cfg)
    first = stages.train(cfg, "qanet")
    mtime = Path("models/qanet/model.pt").stat().st_mtime_ns
    again = stages.train(cfg, "qanet")
    assert again == first
    assert Path("models/qanet/model.pt").stat().st_mtime_ns == mtime
    # a run that stopped before finishing (no summary) resumes from its last checkpoint
    Path("models/qanet/summary.json").unlink()
    longer = _config(make_config, synth_v1, epochs=2)
    resumed = stages.train(longer, "qanet")
    assert resumed["resumed_from_step"] == first["steps"]
    assert resumed["steps"] == 2 * first["steps"]
    assert resumed["epochs"] == 2


def test_unknown_variant_and_missing_model_are_input_errors(
        make_config, synth_v1: SynthData) -> None:  # noqa: ANN001
    cfg = _config(make_config, synth_v1)
    with pytest.raises(InputError, match="unknown variant"):
        stages.train(cfg, "lstm")
    with pytest.raises(InputError, match="no trained model"):
        stages.evaluate(cfg, "qanet")


def test_v2_models_predict_no_answer_probabilities(
        make_config, synth_v2: SynthData) -> None:  # noqa: ANN001
    cfg = _config(make_config, synth_v2, max_steps=3)
    stages.prepare(cfg)
    stages.train(cfg, "rnet_mult")
    result = stages.evaluate(cfg, "rnet_mult")
    assert {"HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(result)
    nbest = json.loads(Path("predictions/rnet_mult.nbest.json").read_text())
    assert len({round(v["na_prob"], 6) for v in nbest.values()}) > 1
