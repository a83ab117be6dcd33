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
from rcpipe.scoring.metrics import at_threshold, score
from tests.conftest import TINY_MODEL, SynthData, save_untrained_model


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage writes models/, predictions/ and metrics/ under the current directory."""
    monkeypatch.chdir(tmp_path)


def test_a_missing_model_is_an_input_error(make_config, synth_v1: SynthData  # noqa: ANN001
                                           ) -> None:
    with pytest.raises(InputError, match="no trained model"):
        stages.evaluate(make_config(synth_v1), "qanet")


@pytest.mark.trains
def test_v2_models_predict_no_answer_probabilities(
        make_config, synth_v2: SynthData) -> None:  # noqa: ANN001
    """A v2.0 model trained 3 steps in one process (train_local: the Worker a Ray Train rank
    runs, no Ray Train job for what is evaluate's test) into models/rnet_mult/."""
    from rcpipe.train.local import train_local

    cfg = make_config(synth_v2, train={"epochs": 1, "batch_size": 16, "max_steps": 3},
                      models=dict.fromkeys(VARIANTS, TINY_MODEL))
    stages.prepare(cfg)
    train_local(cfg, "rnet_mult", Path("models/rnet_mult"))
    result = stages.evaluate(cfg, "rnet_mult")
    assert {"HasAns_f1", "NoAns_f1", "na_threshold", "oracle"} <= set(result)
    assert {"best_f1", "best_f1_thresh"} <= set(result["oracle"]) and "best_f1" not in result
    nbest = json.loads(Path("predictions/rnet_mult.nbest.json").read_text())
    assert len({round(v["na_prob"], 6) for v in nbest.values()}) > 1
    # the answers are given at the official best-threshold walk's threshold on the held-out
    # articles, over the best non-empty spans, which every entry keeps
    chosen = json.loads(Path("models/rnet_mult/na_threshold.json").read_text())
    assert chosen["na_threshold"] == result["na_threshold"] and not chosen["fixed"]
    assert chosen["source"] == result["na_threshold_source"] == "heldout"
    spans = {q: v["span_text"] for q, v in nbest.items()}
    na = {q: v["na_prob"] for q, v in nbest.items()}
    t = chosen["na_threshold"]
    assert result == at_threshold(score(synth_v2.dev_doc, spans, na, t), t, "heldout")
    for entry in nbest.values():
        assert entry["span_text"]  # every context here has a span to give
        given = entry["na_prob"] <= chosen["na_threshold"]
        assert entry["text"] == (entry["span_text"] if given else "")
    preds = json.loads(Path("predictions/rnet_mult.json").read_text())
    assert score(synth_v2.dev_doc, preds)["f1"] == pytest.approx(result["f1"])
    # the distributions `rcpipe ensemble` averages: a row a question, held-out and dev, a
    # probability a context token (the n-best file keeps none of them)
    from rcpipe.data.dataset import SquadDataset
    from rcpipe.data.prepared import Prepared
    from rcpipe.inference.distributions import parse

    dists = parse(Path("predictions/rnet_mult.dists.parquet").read_bytes(), "dists")
    dev = SquadDataset.from_parquet(Prepared(cfg.data.out_dir).dev)
    assert sorted(dists["dev"]) == sorted(dev.ids) and dists["heldout"]
    for row, q in enumerate(dev.ids):
        d = dists["dev"][q]
        assert len(d.p_start) == len(d.p_end) == len(dev.cw.row(row))
        assert d.na_prob == pytest.approx(nbest[q]["na_prob"])
        assert "p_start" not in nbest[q]


def test_a_fixed_threshold_is_the_params_source(make_config, synth_v2: SynthData  # noqa: ANN001
                                                ) -> None:
    cfg = make_config(synth_v2, models={"qanet": TINY_MODEL}, eval={"na_threshold": 0.25})
    stages.prepare(cfg)
    save_untrained_model(cfg, "qanet", no_answer=True)
    result = stages.evaluate(cfg, "qanet")
    assert result["na_threshold"] == 0.25 and result["na_threshold_source"] == "params"
    chosen = json.loads(Path("models/qanet/na_threshold.json").read_text())
    assert chosen == {"na_threshold": 0.25, "fixed": True, "source": "params",
                      "chosen_on": None}


def test_a_named_heldout_file_is_the_source(make_config, synth_v2: SynthData  # noqa: ANN001
                                            ) -> None:
    cfg = make_config(synth_v2, models={"qanet": TINY_MODEL},
                      data={"heldout": {"file": str(synth_v2.train)}})
    stages.prepare(cfg)
    save_untrained_model(cfg, "qanet", no_answer=True)
    result = stages.evaluate(cfg, "qanet")
    assert result["na_threshold_source"] == f"file:{synth_v2.train}"
    chosen = json.loads(Path("models/qanet/na_threshold.json").read_text())
    assert chosen["source"] == result["na_threshold_source"]
    assert chosen["chosen_on"] == str(synth_v2.train)


def test_v2_without_heldout_or_a_fixed_threshold_is_refused(
        make_config, synth_v2: SynthData) -> None:  # noqa: ANN001
    cfg = make_config(synth_v2, models={"qanet": TINY_MODEL}, data={"heldout": {"fraction": 0}})
    stages.prepare(cfg)
    save_untrained_model(cfg, "qanet", no_answer=True)
    with pytest.raises(InputError, match="no held-out questions to choose the no-answer "
                       "threshold on") as info:
        stages.evaluate(cfg, "qanet")
    assert info.value.location == "heldout"
