"""A run's state: where it is (``RunState``), what its steps change (``Trainee``), and the
checkpoint files rank 0 writes and every rank resumes from (checkpoint.py says what each
file holds).

A resumed run is the run that was interrupted, bit for bit: the weights, the optimiser and
its lr schedule, the EMA, the position in the epoch's batches and each rank's RNG stream
come back from state.pt (on a GPU the device's RNG stream with the CPU's).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.data.stream import ids_digest
from rcpipe.layout import CHECKPOINT_META, MODEL, STATE
from rcpipe.models import ModelInputs, build_model
from rcpipe.train.checkpoint import seal
from rcpipe.train.loop import EMA, make_optimizer


@dataclass
class RunState:
    """Where a run is: everything a checkpoint restores besides the tensors' owners."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # global batches of this epoch already trained on
    elapsed: float = 0.0  # training seconds, all attempts (max_minutes spans resumes)
    seen: int = 0  # examples in this attempt, for examples/s
    started: float = 0.0  # perf_counter at this attempt's start
    before: float = 0.0  # training seconds of earlier attempts
    saved_step: int = -1
    best: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_from_step: int = 0
    # what this rank trained on, epoch by epoch: [rows, their ids' digest] (data/stream.py's
    # ids_digest); every rank's is in each checkpoint: an epoch read each row once
    reads: list[list[int]] = field(default_factory=list)
    world: int = 1  # the world size the checkpoint resumed from was written by

    def read(self, ids: list[str]) -> None:
        """Count a batch this rank trained on in the current epoch."""
        while len(self.reads) <= self.epoch:
            self.reads.append([0, 0])
        rows, digest = self.reads[self.epoch]
        self.reads[self.epoch] = [rows + len(ids), (digest + ids_digest(ids)) % 2**64]

    def rate(self) -> float:
        seconds = time.perf_counter() - self.started
        return round(self.seen / seconds, 2) if seconds > 0 else 0.0


RESUMED = ("step", "epoch", "batch_in_epoch", "elapsed", "best", "history")


@dataclass
class Trainee:
    """What the steps change: the model (``raw``: never a DDP wrapper), its optimiser and lr
    schedule, and the EMA of its weights (rank 0 alone keeps one, where the variant has it)."""

    raw: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    ema: EMA | None

    @classmethod
    def build(cls, variant: str, mcfg: ModelConfig, inputs: ModelInputs,
              device: torch.device, rank: int, lr_tensor: bool) -> Trainee:
        """The fresh model and its optimiser; the caller seeds torch first (every rank
        draws the same initial weights). ``lr_tensor``: see loop.make_optimizer."""
        raw = build_model(variant, mcfg, inputs).to(device)
        optimizer, scheduler = make_optimizer(raw, mcfg.optim, lr_tensor=lr_tensor)
        ema = EMA(raw, mcfg.optim.ema_decay) if mcfg.optim.ema_decay and rank == 0 else None
        return cls(raw, optimizer, scheduler, ema)

    def decay_lr(self, factor: float) -> None:
        # the schedule multiplies base_lrs (saved with it, so a resumed run keeps them)
        self.scheduler.base_lrs = [lr * factor for lr in self.scheduler.base_lrs]
        for group in self.optimizer.param_groups:
            group["lr"] *= factor

    def served_weights(self) -> dict[str, torch.Tensor]:
        """The weights model.pt keeps: the EMA's where there is one."""
        weights = dict(self.raw.state_dict())
        if self.ema is not None:
            weights.update(self.ema.shadow)
        return weights


def weights_digest(model: nn.Module) -> str:
    """sha256 of every weight's bytes: equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The RNG streams a step draws from: torch's CPU generator (the data's order, BiDAF's
    CPU dropout) and on a GPU the device's own (dropout and stochastic depth draw there)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor] | torch.Tensor, device: torch.device
                  ) -> None:
    """``rng_state``'s streams back; a bare tensor is a checkpoint from before the device's
    stream was kept (the CPU's alone)."""
    streams = state if isinstance(state, dict) else {"cpu": state}
    torch.set_rng_state(streams["cpu"].cpu())  # loaded onto the device with the rest
    if device.type == "cuda" and "cuda" in streams:
        torch.cuda.set_rng_state(streams["cuda"].cpu(), device)


def restore(trainee: Trainee, d: Path, device: torch.device, rank: int, world: int
            ) -> RunState:
    """Load the checkpoint in ``d`` into ``trainee`` and this rank's RNG; the run's state."""
    saved = torch.load(d / STATE, map_location=device, weights_only=True)
    trainee.raw.load_state_dict(saved["model"])
    trainee.optimizer.load_state_dict(saved["optimizer"])
    trainee.scheduler.load_state_dict(saved["scheduler"])
    if trainee.ema is not None and saved["ema"] is not None:
        trainee.ema.load_state_dict(saved["ema"])
    rngs = saved["rng"]
    if len(rngs) == world:  # the same world size: each rank continues its streams
        set_rng_state(rngs[rank], device)
    run = RunState(**{k: saved[k] for k in RESUMED}, world=len(rngs))
    reads = saved.get("reads")  # a checkpoint from before the streams has none
    if reads and len(reads) == world:
        run.reads = [list(r) for r in reads[rank]]
    run.resumed_from_step, run.before = run.step, run.elapsed
    # the step resumed from is saved: an epoch's end there must not save it again
    run.saved_step = run.step
    return run


def write_checkpoint(d: Path, trainee: Trainee, run: RunState,
                     rngs: list[dict[str, torch.Tensor]],
                     payload: dict[str, Any], meta: dict[str, Any],
                     reads: list[list[list[int]]] | None = None) -> None:
    """state.pt (what ``restore`` reads back), model.pt (``payload``: the servable model)
    and meta.json (``meta``) in ``d``."""
    ema = trainee.ema
    torch.save({"model": trainee.raw.state_dict(), "optimizer": trainee.optimizer.state_dict(),
                "scheduler": trainee.scheduler.state_dict(),
                "ema": ema.state_dict() if ema is not None else None,
                "rng": rngs, "reads": reads or [run.reads], "step": run.step,
                "epoch": run.epoch,
                "batch_in_epoch": run.batch_in_epoch, "elapsed": run.elapsed,
                "best": run.best, "history": run.history}, d / STATE)
    torch.save(payload, d / MODEL)
    (d / CHECKPOINT_META).write_text(json.dumps(meta, indent=1))
    seal(d)  # last: a checkpoint cut short has no sums, or sums its files do not match
