"""Issue 43: a checkpoint is verified before use (each file's size and sha256, recorded at
save in sums.json). A run killed after two checkpoints whose latest is then truncated
resumes from the one before, says so in one line, and records where it resumed
(`resumed_from_step`); the audit's rerun ended in a `PytorchStreamReader ... corrupted`
traceback. Without Ray: the Worker, its resume and its checkpoints are the same in a Ray
Train worker (train/local.py's LocalSession stands for the Ray session)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from rcpipe.config import load_config
from rcpipe.train.checkpoint import broken
from rcpipe.train.local import train_local
from tests.conftest import TINY_MODEL, Prepared

pytestmark = pytest.mark.trains  # every test trains: train_local or Ray Train


def _cfg(prepared: Prepared, steps: int) -> object:
    return load_config(prepared.cfg.source, [
        f"data.out_dir={prepared.out_dir}", f"data.train_file={prepared.data.train}",
        f"data.dev_file={prepared.data.dev}", "train.batch_size=8", "train.eval_every=1",
        "train.keep_checkpoints=3", f"train.max_steps={steps}",
        *(f"models.bidaf.{k}={v}" for k, v in TINY_MODEL.items())])


@pytest.mark.parametrize("damage", ["truncated", "flipped", "sums_missing"])
def test_a_broken_latest_checkpoint_falls_back_to_the_one_before(
        prepared: Prepared, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        damage: str) -> None:
    train_local(_cfg(prepared, 2), "bidaf", tmp_path)  # checkpoints at steps 1 and 2
    latest = tmp_path / "step-00000002"
    assert broken(latest) is None and broken(tmp_path / "step-00000001") is None
    state = latest / "state.pt"
    if damage == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
        why = f"state.pt holds {state.stat().st_size:,} bytes"
    elif damage == "flipped":  # same size, one byte changed
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
        why = "state.pt's sha256 is not the one recorded"
    else:
        (latest / "sums.json").unlink()
        why = "no sums.json (its files were not all written)"
    (tmp_path / "summary.json").unlink()
    with caplog.at_level(logging.WARNING, logger="rcpipe"):
        again = train_local(_cfg(prepared, 3), "bidaf", tmp_path)
    notes = [r.getMessage() for r in caplog.records if "is broken" in r.getMessage()]
    assert len(notes) == 1 and "checkpoint step-00000002 is broken (" in notes[0], notes
    assert why in notes[0]
    assert again["resumed_from_step"] == 1 and again["steps"] == 3
    assert [h["step"] for h in again["history"]] == [1, 2, 3]
    assert broken(latest) is None  # step 2 trained again and stored whole
    assert json.loads((tmp_path / "summary.json").read_text())["resumed_from_step"] == 1


def test_a_run_whose_every_checkpoint_is_broken_starts_anew(
        prepared: Prepared, tmp_path: Path) -> None:
    train_local(_cfg(prepared, 1), "bidaf", tmp_path)
    (tmp_path / "step-00000001" / "model.pt").write_bytes(b"")
    again = train_local(_cfg(prepared, 2), "bidaf", tmp_path)
    assert again["resumed_from_step"] == 0 and again["steps"] == 2


# ------------------------------------------------------------------ through Ray Train


def _ray_run(make_config, synth_v1, steps: int):  # noqa: ANN001, ANN202
    return make_config(synth_v1, train={"epochs": 1, "batch_size": 8, "eval_every": 1,
                                        "max_steps": steps, "keep_checkpoints": 3},
                       models={"bidaf": TINY_MODEL})


def _interrupted(variant: str = "bidaf") -> None:
    """As a killed `rcpipe train` leaves its model folder: no summary, the run unfinished."""
    Path(f"models/{variant}/summary.json").unlink()
    record = Path(f"models/{variant}/runs.json")
    runs = json.loads(record.read_text())["runs"]
    record.write_text(json.dumps({"runs": [r | {"finished": None} for r in runs]}))


@pytest.mark.integration
@pytest.mark.usefixtures("local_ray")
def test_ray_a_broken_then_an_unrecorded_latest_checkpoint_is_resumed_from_the_one_before(
        make_config, synth_v1, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
        caplog: pytest.LogCaptureFixture) -> None:
    """One run through Ray Train, interrupted twice as a user's nights would be (one run
    for both cases: each Ray Train job costs ~27 CPU s here):

    1. its latest checkpoint truncated: the rerun falls back to the one before, in one line;
    2. then Ctrl-C at the first checkpoint: the worker had stored it, Ray Train's
       controller had not recorded it. The audit's rerun logged "resuming" and trained from
       step 0."""
    from rcpipe import stages

    monkeypatch.chdir(tmp_path)
    cfg = _ray_run(make_config, synth_v1, 2)
    stages.prepare(cfg)
    first = stages.train(cfg, "bidaf")
    run = Path("models/bidaf/runs") / first["run"]

    # 1. the latest checkpoint broken
    state = run / "step-00000002" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # truncated
    _interrupted()
    with caplog.at_level("INFO", logger="rcpipe"):
        again = stages.train(cfg, "bidaf")
    notes = [r.getMessage() for r in caplog.records if "is broken" in r.getMessage()]
    assert notes == ["train bidaf: checkpoint step-00000002 is broken (state.pt holds 1,000 "
                     "bytes, " + notes[0].split("bytes, ")[-1]], notes
    # step 2 trained again from step 1 (the last step: the run is resumed, not retrained)
    assert again["run"] == first["run"]
    assert again["resumed_from_step"] == 1 and again["steps"] == 2
    assert [h["step"] for h in again["history"]] == [1, 2]

    # 2. the first checkpoint stored, nothing recorded by the controller
    for left in run.iterdir():  # the first checkpoint alone, no controller's record
        if left.name != "step-00000001":
            shutil.rmtree(left) if left.is_dir() else left.unlink()
    _interrupted()
    caplog.clear()
    with caplog.at_level("INFO", logger="rcpipe"):
        last = stages.train(cfg, "bidaf")
    assert f"resuming {first['run']}" in caplog.text
    assert last["resumed_from_step"] == 1 and last["steps"] == 2
    assert [h["step"] for h in last["history"]] == [1, 2]
