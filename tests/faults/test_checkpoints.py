"""Issue 43: a checkpoint is verified before use (each file's size and sha256, recorded at
save in sums.json). A run killed after two checkpoints whose latest is then truncated
resumes from the one before, says so in one line, and records where it resumed
(`resumed_from_step`); the audit's rerun ended in a `PytorchStreamReader ... corrupted`
traceback. Without Ray: the Worker, its resume and its checkpoints are the same in a Ray
Train worker (train/local.py's LocalSession stands for the Ray session)."""

from __future__ import annotations

import json
import logging
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


# Through Ray Train (a broken, then an unrecorded latest checkpoint, resumed from the one
# before): one run's life in tests/stages/test_train.py, which shares the Ray Train jobs
