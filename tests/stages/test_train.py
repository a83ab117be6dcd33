"""`rcpipe train` (and `rcpipe evaluate` of what it trained) end to end on tiny synthetic data.

Each Ray Train job costs ~20 CPU s before it trains on 2 cores (docs/dev/testing.md), so
the contract files are checked here on the session's `trained` run (tests/conftest.py:
bidaf), and one bidaf run lives through its interruptions in one sequence (a worker killed,
resumed at its end, from a broken and from an unrecorded checkpoint, then anew); every
variant's contract files through `rcpipe train`: tests/integration/test_dvc_s3.py.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.config import VARIANTS
from rcpipe.errors import InputError
from rcpipe.scoring.metrics import score
from tests.conftest import TINY_MODEL, SynthData, Trained, questions_of

pytestmark = [pytest.mark.integration, pytest.mark.trains, pytest.mark.usefixtures("local_ray"),
              pytest.mark.ray_train(5)]


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


def _interrupted(variant: str) -> None:
    """As a killed `rcpipe train` leaves its model folder: no summary, the run unfinished."""
    Path(f"models/{variant}/summary.json").unlink()
    record = Path(f"models/{variant}/runs.json")
    runs = json.loads(record.read_text())["runs"]
    record.write_text(json.dumps({"runs": [r | {"finished": None} for r in runs]}))


def _checkpoints(run: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in run.glob("step-*/*")}


@pytest.mark.slow
def test_one_run_restarted_skipped_resumed_from_a_broken_and_an_unrecorded_checkpoint_then_anew(
        make_config, synth_v1: SynthData, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    """One run's life through Ray Train, as a user's nights would live it (one run for every
    case: each Ray Train job costs ~20 CPU s here; docs/dev/testing.md):

    1. a worker killed mid-run (SIGKILL, as an OOM killer or a lost node would):
       train.max_failures restarts the worker group, which resumes from a checkpoint;
    2. the same inputs, finished: nothing to do;
    3. killed before its end (no summary, the record says unfinished): the same command
       resumes the same run at its last checkpoint, training no step again;
    4. its latest checkpoint truncated: the rerun falls back to the one before, in one line
       (issue 43; every kind of damage: tests/faults/test_checkpoints.py, without Ray);
    5. Ctrl-C at a checkpoint the worker stored and Ray Train's controller never recorded:
       resumed from it (the audit's rerun logged "resuming" and trained from step 0);
    6. other settings: a new run from step 0, said in one line; train.keep_runs runs kept,
       and its model refused once the prepared vocabulary changes."""
    import psutil

    from tests import ray_nodes

    # BiDAF's two modeling layers (the paper's): with one the run can end before the kill
    train = {"max_steps": 24, "eval_every": 3, "batch_size": 4, "epochs": 50,
             "max_failures": 1, "keep_checkpoints": 3}
    models = dict.fromkeys(VARIANTS, TINY_MODEL) | {"bidaf": TINY_MODEL | {"layers": 2}}
    cfg = make_config(synth_v1, train=train, models=models)
    stages.prepare(cfg)

    # 1. a worker killed after the first recorded checkpoint, restarted by Ray Train
    killed: list[int] = []

    def kill_a_worker_after_the_first_checkpoint() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            workers = ray_nodes.train_workers(psutil.Process())  # local_ray's
            run = next(Path("models/bidaf/runs").glob("run-*"), None)
            if workers and run is not None and ray_nodes.recorded_steps(run):
                workers[0].kill()
                killed.append(workers[0].pid)
            time.sleep(0.2)

    killer = threading.Thread(target=kill_a_worker_after_the_first_checkpoint, daemon=True)
    killer.start()
    first = stages.train(cfg, "bidaf")
    killer.join()
    assert killed, "the training worker was never seen"
    assert first["steps"] == 24 and first["finished"]
    assert first["resumed_from_step"] > 0  # the restarted group went on from a checkpoint
    run = Path("models/bidaf/runs") / first["run"]

    # 2. finished with these inputs: nothing to do
    mtime = Path("models/bidaf/model.pt").stat().st_mtime_ns
    with caplog.at_level("INFO", logger="rcpipe.stages.train"):
        again = stages.train(cfg, "bidaf")
    assert again == first
    assert Path("models/bidaf/model.pt").stat().st_mtime_ns == mtime
    assert "already finished with these inputs" in caplog.text

    # 3. killed before its end: resumed at its last step, no step trained again, no
    # checkpoint rewritten
    _interrupted("bidaf")
    saved = _checkpoints(run)
    caplog.clear()
    with caplog.at_level("INFO", logger="rcpipe.stages.train"):
        resumed = stages.train(cfg, "bidaf")
    assert f"resuming {first['run']}" in caplog.text
    assert resumed["run"] == first["run"]
    assert resumed["resumed_from_step"] == resumed["steps"] == 24
    assert _checkpoints(run) == saved

    # 4. the latest checkpoint broken: the one before it kept (best by F1, or latest) is used
    steps = sorted(int(p.name.removeprefix("step-")) for p in run.glob("step-*"))
    assert steps[-1] == 24 and len(steps) >= 2
    state = run / "step-00000024" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # truncated
    _interrupted("bidaf")
    caplog.clear()
    with caplog.at_level("INFO", logger="rcpipe"):
        fell_back = stages.train(cfg, "bidaf")
    notes = [r.getMessage() for r in caplog.records if "is broken" in r.getMessage()]
    assert notes == ["train bidaf: checkpoint step-00000024 is broken (state.pt holds 1,000 "
                     "bytes, " + notes[0].split("bytes, ")[-1]], notes
    assert fell_back["run"] == first["run"]  # resumed, not retrained
    assert fell_back["resumed_from_step"] == steps[-2] and fell_back["steps"] == 24
    assert [h["step"] for h in fell_back["history"]][-1] == 24

    # 5. one checkpoint stored, none recorded by Ray Train's controller
    kept = min(p.name for p in run.glob("step-*"))
    for left in run.iterdir():
        if left.name != kept:
            shutil.rmtree(left) if left.is_dir() else left.unlink()
    _interrupted("bidaf")
    caplog.clear()
    with caplog.at_level("INFO", logger="rcpipe"):
        last = stages.train(cfg, "bidaf")
    assert f"resuming {first['run']}" in caplog.text
    assert last["resumed_from_step"] == int(kept.removeprefix("step-")) and last["steps"] == 24

    # 6. other settings: a new run from step 0 beside the old one, one run kept
    record = Path("models/bidaf/runs.json")
    shorter = make_config(synth_v1, train=train | {"max_steps": 6, "keep_runs": 1},
                          models=models)
    caplog.clear()
    with caplog.at_level("INFO", logger="rcpipe.stages.train"):
        anew = stages.train(shorter, "bidaf")
    assert "settings changed (train.max_steps 24 -> 6); training anew" in caplog.text
    assert anew["run"] != first["run"] and anew["resumed_from_step"] == 0
    assert anew["steps"] == 6
    assert [p.name for p in Path("models/bidaf/runs").iterdir()] == [anew["run"]]
    assert [r["name"] for r in json.loads(record.read_text())["runs"]] == [anew["run"]]
    stages.evaluate(shorter, "bidaf")
    _a_model_of_another_vocabulary_is_refused(shorter, "bidaf")


def test_an_unknown_variant_is_an_input_error(
        make_config, synth_v1: SynthData) -> None:  # noqa: ANN001
    cfg = _config(make_config, synth_v1)
    with pytest.raises(InputError, match="unknown variant"):
        stages.train(cfg, "lstm")


def test_more_workers_than_the_machine_has_is_refused_at_once(
        make_config, prepared) -> None:  # noqa: ANN001
    """On 2 CPUs, 8 workers once sat at 0 steps until killed: now one line, before any job."""
    import time

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
