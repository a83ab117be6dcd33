"""A run's state (train/state.py): what a checkpoint writes is what a resumed rank reads back,
bit for bit, and a plateau's decay lands in what is saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rcpipe.config import load_config
from rcpipe.data.dataset import SquadDataset
from rcpipe.data.prepared import Prepared
from rcpipe.layout import CHECKPOINT_META, CHECKPOINT_SUMS, MODEL, STATE
from rcpipe.train.loop import train_step
from rcpipe.train.state import (
    RunState,
    Trainee,
    restore,
    rng_state,
    set_rng_state,
    weights_digest,
    write_checkpoint,
)
from rcpipe.trained.model_file import prepared_inputs
from tests.conftest import TINY_MODEL
from tests.conftest import Prepared as PreparedFixture

CPU = torch.device("cpu")


def _trainee(prepared: PreparedFixture, seed: int) -> Trainee:
    sets = [f"models.bidaf.{k}={v}" for k, v in TINY_MODEL.items()]
    cfg = load_config(prepared.cfg.source, [*sets, "models.bidaf.optim.ema_decay=0.9"])
    torch.manual_seed(seed)
    inputs = prepared_inputs(prepared.out_dir, cfg.data.word_dim)
    return Trainee.build("bidaf", cfg.models.of("bidaf"), inputs, CPU, rank=0, lr_tensor=False)


def test_a_checkpoint_restores_the_weights_optimiser_ema_position_and_rng(
        prepared: PreparedFixture, tmp_path: Path) -> None:
    trained = _trainee(prepared, seed=1)
    rows = SquadDataset.from_parquet(Prepared(prepared.out_dir).train)
    t = trained
    train_step(t.raw, rows.collate(list(range(4))), t.optimizer, t.scheduler, 5.0, t.ema)
    run = RunState(step=1, epoch=0, batch_in_epoch=1, elapsed=2.5,
                   best={"f1": 1.0, "step": 1}, history=[{"step": 1, "f1": 1.0}])
    rng = torch.get_rng_state()
    write_checkpoint(tmp_path, trained, run, [rng_state(CPU)], {"weights": "of model.pt"},
                     {"step": 1})
    assert {p.name for p in tmp_path.iterdir()} == {STATE, MODEL, CHECKPOINT_META,
                                                    CHECKPOINT_SUMS}

    fresh = _trainee(prepared, seed=2)  # other initial weights, no optimiser state
    torch.manual_seed(99)  # another RNG position: the checkpoint's comes back
    back = restore(fresh, tmp_path, CPU, rank=0, world=1)
    assert weights_digest(fresh.raw) == weights_digest(trained.raw)
    assert torch.equal(torch.get_rng_state(), rng)
    assert fresh.ema is not None and trained.ema is not None
    assert fresh.ema.updates == trained.ema.updates == 1
    assert all(torch.equal(fresh.ema.shadow[k], v) for k, v in trained.ema.shadow.items())
    assert fresh.optimizer.state_dict()["state"].keys() == \
        trained.optimizer.state_dict()["state"].keys()
    assert (back.step, back.epoch, back.batch_in_epoch, back.elapsed) == (1, 0, 1, 2.5)
    # resumed from step 1: its time counts before this attempt, and step 1 is not saved again
    assert (back.resumed_from_step, back.before, back.saved_step) == (1, 2.5, 1)
    assert back.history == run.history and back.best == run.best


def test_a_checkpoint_from_before_the_devices_stream_was_kept_resumes_the_cpus(
        prepared: PreparedFixture, tmp_path: Path) -> None:
    """Checkpoints written before the device's stream was kept hold each rank's CPU
    state as a bare tensor: they resume as before."""
    trainee = _trainee(prepared, seed=1)
    rng = torch.get_rng_state()
    write_checkpoint(tmp_path, trainee, RunState(), [rng], {}, {})
    torch.manual_seed(7)
    restore(trainee, tmp_path, CPU, rank=0, world=1)
    assert torch.equal(torch.get_rng_state(), rng)


def test_on_a_gpu_the_devices_rng_stream_is_kept_and_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU dropout and stochastic depth draw from the device's generator, not the
    CPU's: a resumed run continues that stream too, or it would draw its first steps'
    masks again. The CPU has no CUDA generator: torch.cuda's two calls are played here."""
    cuda = torch.device("cuda")
    device_rng = {"state": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: device_rng["state"])
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda state, device: device_rng.update(state=state))
    saved = rng_state(cuda)
    assert torch.equal(saved["cuda"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    device_rng["state"] = torch.tensor([9], dtype=torch.uint8)  # the stream moved on
    set_rng_state(saved, cuda)
    assert torch.equal(device_rng["state"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    assert "cuda" not in rng_state(CPU)  # the CPU's generator is the one stream there


def test_another_world_size_starts_its_own_rng_streams(prepared: PreparedFixture,
                                                       tmp_path: Path) -> None:
    trainee = _trainee(prepared, seed=1)
    write_checkpoint(tmp_path, trainee, RunState(), [torch.get_rng_state()] * 2, {}, {})
    torch.manual_seed(7)
    mine = torch.get_rng_state()
    restore(trainee, tmp_path, CPU, rank=0, world=1)  # saved by 2 ranks, resumed by 1
    assert torch.equal(torch.get_rng_state(), mine)


def test_a_plateaus_decay_scales_the_lr_and_the_schedules_base(prepared: PreparedFixture
                                                                ) -> None:
    trainee = _trainee(prepared, seed=1)
    lr = trainee.optimizer.param_groups[0]["lr"]
    base = trainee.scheduler.base_lrs[0]
    trainee.decay_lr(0.5)
    assert trainee.optimizer.param_groups[0]["lr"] == pytest.approx(lr / 2)
    assert trainee.scheduler.base_lrs == [pytest.approx(base / 2)]


def test_model_pt_keeps_the_ema_weights(prepared: PreparedFixture) -> None:
    trainee = _trainee(prepared, seed=1)
    assert trainee.ema is not None
    name = next(iter(trainee.ema.shadow))
    trainee.ema.shadow[name].add_(1.0)
    served = trainee.served_weights()
    assert torch.equal(served[name], trainee.ema.shadow[name])
    assert not torch.equal(served[name], trainee.raw.state_dict()[name])
