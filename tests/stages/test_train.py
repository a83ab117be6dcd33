"""`rcpipe train` (and `rcpipe evaluate` of what it trained) end to end on tiny synthetic data.

Each Ray Train job costs ~20 CPU s before it trains on 2 cores (docs/dev/testing.md), so
the contract files are checked here on the session's `trained` run (tests/conftest.py:
bidaf); one run's life through its interruptions (killed, a worker restarted, skipped,
resumed from its end, a broken and an unrecorded checkpoint) is one sequence in
tests/faults/test_kills.py, a run of other settings on S3 in
tests/cluster/test_storage_outage.py; two variants' contract files through `dvc repro`:
tests/integration/test_nights.py."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.config import VARIANTS
from rcpipe.errors import InputError
from rcpipe.scoring.metrics import score
from tests.conftest import TINY_MODEL, SynthData, Trained, questions_of

pytestmark = [pytest.mark.integration, pytest.mark.trains, pytest.mark.ray_train(1),
              pytest.mark.usefixtures("local_ray")]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage writes models/, predictions/ and metrics/ under the current directory."""
    monkeypatch.chdir(tmp_path)


def _config(make_config, data: SynthData, **train):  # noqa: ANN001, ANN202
    models = dict.fromkeys(VARIANTS, TINY_MODEL)
    return make_config(data, train={"epochs": 1, "batch_size": 16, **train}, models=models)


def _the_contract_files(cfg, variant: str, summary: dict, synth_v1: SynthData
                        ) -> None:  # noqa: ANN001
    """What `rcpipe train` left (``summary``: what it returned), then `rcpipe evaluate`'s."""
    on_disk = json.loads(Path(f"models/{variant}/summary.json").read_text())
    assert on_disk == summary
    assert summary["world_size"] == 1 and summary["resumed_from_step"] == 0
    assert summary["steps"] > 0 and summary["examples_per_s"] > 0
    assert summary["device"] == "cpu"
    assert Path(f"models/{variant}/model.pt").is_file()
    assert list(Path(f"models/{variant}/runs").glob("run-*/step-*/model.pt"))

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


def _a_model_of_another_vocabulary_is_refused(cfg, variant: str) -> None:  # noqa: ANN001
    vocab = cfg.data.out_dir / "vocab.json"
    doc = json.loads(vocab.read_text())
    doc["words"].append("an-extra-word")
    vocab.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="another vocabulary"):
        stages.evaluate(cfg, variant)


def test_train_then_evaluate_writes_the_contract_files(trained: Trained, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """bidaf's contract on the session's run (no second Ray Train job for it), copied: the
    vocabulary is changed below. qanet's in the test after, which trains its own run."""
    run = tmp_path / "run"
    shutil.copytree(trained.root, run)
    monkeypatch.chdir(run)
    data = trained.cfg.data.model_copy(update={"out_dir": run / "data" / "prepared"})
    cfg = trained.cfg.model_copy(update={"data": data})
    _the_contract_files(cfg, "bidaf", trained.summary, trained.data)
    # the model is refused once the prepared vocabulary is not the one it was trained on
    _a_model_of_another_vocabulary_is_refused(cfg, "bidaf")


def test_an_unknown_variant_is_an_input_error(
        make_config, synth_v1: SynthData) -> None:  # noqa: ANN001
    cfg = _config(make_config, synth_v1)
    with pytest.raises(InputError, match="unknown variant"):
        stages.train(cfg, "lstm")


def test_more_workers_than_the_machine_has_is_refused_at_once(
        make_config, prepared) -> None:  # noqa: ANN001
    """On 2 CPUs, 8 workers once sat at 0 steps until killed: now one line, before any job."""

    cfg = make_config(prepared.data, data={"out_dir": str(prepared.out_dir)},
                      train={"num_workers": 8})
    t0 = time.perf_counter()
    with pytest.raises(InputError) as err:
        stages.train(cfg, "bidaf")
    assert time.perf_counter() - t0 < 30
    assert err.value.file == cfg.source and err.value.location == "train.num_workers"
    assert "2 CPU(s)" in err.value.what and "at most 2" in err.value.what
    assert not Path("models/bidaf/runs").exists()  # no job was started


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_a_machine_without_a_gpu_is_refused(make_config, prepared
                                                    ) -> None:  # noqa: ANN001
    cfg = make_config(prepared.data, data={"out_dir": str(prepared.out_dir)},
                      train={"device": "cuda"})
    with pytest.raises(InputError) as err:
        stages.train(cfg, "bidaf")
    assert err.value.location == "train.device" and "0 GPU(s)" in err.value.what
    with pytest.raises(InputError) as err:
        stages.evaluate(cfg, "bidaf")  # said before the (missing) model is looked for
    assert err.value.location == "train.device"


def _with_seeds(cfg, n: int):  # noqa: ANN001, ANN202
    bidaf = cfg.models.bidaf.model_copy(update={"seeds": n})
    return cfg.model_copy(update={"models": cfg.models.model_copy(update={"bidaf": bidaf})})


def test_a_variant_of_several_seeds_trains_each_run_once_and_answers_with_their_mean(
        trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """models.bidaf.seeds 2 over the session's run (train.seed 42): one run more (seed 43,
    this file's Ray Train job), the model in place both runs' weights answering as one;
    asked again nothing trains, and back to one seed the first run is the model in place
    again, trained by nobody (a second job would fail the file's ray_train(1))."""
    import torch

    from rcpipe.models.seed_mean import SeedMean
    from rcpipe.trained.model_file import load_model
    from rcpipe.trained.package_dir import load_package

    run = tmp_path / "run"
    shutil.copytree(trained.root, run)
    monkeypatch.chdir(run)
    # the copy's own folders: the key names a folder in the run directory by its place there
    one = trained.cfg.model_copy(update={"data": trained.cfg.data.model_copy(update={
        "out_dir": run / "data" / "prepared", "cache_dir": run / "data" / "cache"})})
    two = _with_seeds(one, 2)
    first = Path("models/bidaf/model.pt").read_bytes()
    single = load_model(one, "bidaf")[0]

    summary = stages.train(two, "bidaf")
    assert [s["seed"] for s in summary["seeds"]] == [42, 43]
    assert summary["seeds"][0]["run"] == trained.summary["run"]
    assert summary["seeds"][0]["best_dev_f1"] == trained.summary["best_dev_f1"]
    assert summary["steps"] == 2 * trained.summary["steps"]  # each run's max_steps, both paid
    assert Path("models/bidaf/seeds/42/model.pt").read_bytes() == first
    assert json.loads(Path("models/bidaf/summary.json").read_text()) == summary
    both = load_model(two, "bidaf")[0]
    assert isinstance(both, SeedMean) and len(both.replicas) == 2
    kept, new = (dict(m.state_dict()) for m in both.replicas)
    assert all(torch.equal(kept[k], v) for k, v in single.state_dict().items())
    assert not all(torch.equal(new[k], v) for k, v in single.state_dict().items())
    result = stages.evaluate(two, "bidaf")
    dev_ids = {qa["id"] for qa in questions_of(trained.data.dev_doc)}
    assert set(json.loads(Path("predictions/bidaf.json").read_text())) == dev_ids
    assert 0.0 <= result["f1"] <= 100.0
    package = stages.package(two, "bidaf")  # the answering model is the mean, packaged
    assert "2 runs (train.seed 42, 43)" in (package / "README.md").read_text()
    assert isinstance(load_package(package).model, SeedMean)

    assert stages.train(two, "bidaf") == summary  # both runs finished: nothing to do
    assert stages.train(one, "bidaf") == trained.summary  # the first run, back in place
    assert Path("models/bidaf/model.pt").read_bytes() == first
    assert not isinstance(load_model(one, "bidaf")[0], SeedMean)
