"""One rank's training run: the step loop, its limits, and a checkpoint at each evaluation.

Every Ray Train worker runs a ``Worker`` (cluster/train_job.py hands it a Ray session), and so
does one plain process without Ray (train/local.py, world size 1): the same steps, the same
checkpoints, so a GPU box with only PyTorch, numpy, pyarrow and pydantic can train and
measure from prepared Parquet files. Nothing here imports Ray, spaCy or Prefect.

The parts: the Job (job.py: what every rank is given), the data it reads
(training_data.py), what its steps change and a checkpoint holds (state.py: the model, the
optimiser, the EMA, the position, written and resumed), rank 0's evaluation of each
checkpoint (evaluation.py), and here the loop that ties them. Rank 0 alone keeps the EMA,
evaluates and writes each checkpoint; every rank streams its own share of each epoch
(data/stream.py) in batches of ``batch_size // world`` rows, so the global batch stays
``batch_size`` whatever the world size, and DDP averages the gradients.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rcpipe.data.dataset import Batch, ahead
from rcpipe.models import ModelInputs
from rcpipe.train.checkpoint import RANK_METRIC, first_whole
from rcpipe.train.evaluation import Evaluation, Verdict
from rcpipe.train.job import Job
from rcpipe.train.loop import Distill, TrainStep
from rcpipe.train.state import (
    RunState,
    Trainee,
    restore,
    rng_state,
    weights_digest,
    write_checkpoint,
)
from rcpipe.train.training_data import TrainingData
from rcpipe.trained.model_file import model_payload

PROGRESS_EVERY = 10  # steps between progress messages (and loss reads) from rank 0


class Session(Protocol):
    """Where a rank runs: Ray Train's worker context, or one plain process (local.py)."""

    rank: int
    world: int
    device: torch.device

    def inputs(self) -> ModelInputs: ...

    def dev_doc(self) -> dict[str, Any]: ...

    def stored(self) -> AbstractContextManager[Iterable[Path]]:
        """The directories of the run's checkpoints to resume from, newest first (none for
        a fresh run); each is verified before use (checkpoint.broken)."""
        ...

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """DDP-wrap (and place) the model for this world; the identity for one process."""
        ...

    def report(self, metrics: dict[str, Any], directory: Path | None, name: str) -> str:
        """Persist the checkpoint in ``directory`` (rank 0; None on the others) as ``name``
        (or the folder name the session chose instead: train/checkpoint.py's step_dir);
        the name it was stored under."""
        ...

    def progress(self, message: dict[str, Any]) -> None: ...


@contextmanager
def mixed_precision(device: torch.device, tf32: bool) -> Iterator[None]:
    """TF32 matmuls and convolutions on CUDA for the block (fp32 weights, ~2x the matmul
    rate on Ampere and later); nothing changes on the CPU."""
    if device.type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


class Worker:
    """One rank of one variant's training run."""

    def __init__(self, job: Job, session: Session) -> None:
        self.job, self.session = job, session
        self.cfg = cfg = job.config
        self.mcfg = cfg.models.of(job.variant)  # one network: the Job's (train/job.py)
        if job.threads:
            torch.set_num_threads(job.threads)
        self.rank, self.world, self.device = session.rank, session.world, session.device
        self.inputs = session.inputs()
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
        self.trainee = Trainee.build(job.variant, self.mcfg, self.inputs, self.device,
                                     self.rank, lr_tensor=cfg.train.compile != "off")
        self.run = RunState()
        torch.manual_seed(cfg.train.seed + 1000 * self.rank)  # its own dropout masks per rank
        self.bf16 = self.device.type == "cuda" and self.mcfg.bf16
        self.batch_size = self.mcfg.batch_size or cfg.train.batch_size
        self.limit_steps = cfg.models.steps(job.variant, cfg.train.max_steps)
        self.limit_s = cfg.models.minutes(job.variant, cfg.train.max_minutes) * 60
        self.exhausted = False  # early stopping's verdict after the latest evaluation

    # ------------------------------------------------------------------ the run

    def train(self) -> None:
        """Resume if there is a checkpoint, then train to the step, time or epoch limit."""
        self.resume()
        t = self.trainee
        self.step = TrainStep(self.session.prepare_model(t.raw), t.optimizer, t.scheduler,
                              self.mcfg.optim.grad_clip, t.ema, raw=t.raw, bf16=self.bf16,
                              compile=self.cfg.train.compile,
                              backend=self.cfg.train.compile_backend, distill=self._distill())
        self.data = TrainingData.load(self.job, self.cfg, self.rank, self.world,
                                      self.batch_size)
        self.evaluation = Evaluation(self.cfg, self.mcfg.optim, self.data,
                                     self.session.dev_doc, self.device)
        if (d := self.step.distill) is not None:
            self._note(f"a student: its loss (1 - {d.alpha}) x the gold span's + {d.alpha} x "
                       f"T^2 x KL(teacher || student) at T = {d.temperature}, the teacher's "
                       f"targets {self.job.teacher_path}")
        self.run.started = time.perf_counter()
        stop = self.run.step > 0 and self.stop_now(check_time=True)
        with mixed_precision(self.device, self.cfg.train.tf32):
            while self.run.epoch < self.cfg.train.epochs and not stop:
                stop = self.epoch()

    def _distill(self) -> Distill | None:
        """A student's loss (its Job names its teacher's targets), else None."""
        d = self.cfg.distill
        return Distill(d.alpha, d.temperature) if self.job.teacher_path else None

    def resume(self) -> None:
        """The trainee, position and this rank's RNG from the newest whole checkpoint the
        session has, if any: a broken one (truncated, half copied) is passed by for the one
        before, with one line (rank 0's), and resumed_from_step says which was used."""
        with self.session.stored() as found:
            d = first_whole(found, self._note)
            if d is not None:
                self.run = restore(self.trainee, d, self.device, self.rank, self.world)
        run = self.run
        if run.world != self.world and run.batch_in_epoch:  # another world: another plan
            self._note(f"resumed with {self.world} workers from a checkpoint of "
                       f"{run.world}: epoch {run.epoch}'s rows were shared otherwise, so "
                       f"training goes on at epoch {run.epoch + 1}'s start (data/stream.py)")
            run.epoch, run.batch_in_epoch = run.epoch + 1, 0

    def _note(self, line: str) -> None:
        if self.rank == 0:
            self.session.progress({"note": line})

    def epoch(self) -> bool:
        """Train the rest of the current epoch; True when a step or time limit stopped it."""
        run, cfg = self.run, self.cfg
        plan = self.data.train.epoch(run.epoch)  # this rank's share (data/stream.py)
        losses: list[torch.Tensor] = []  # on the device: read only when shown or saved
        stop = False
        for batch in self._collated(plan.batches(run.batch_in_epoch)):
            losses.append(self.step(batch))
            run.step += 1
            run.batch_in_epoch += 1
            run.seen += len(batch.ids) * self.world  # each rank's share: about the same
            run.read(batch.ids)
            shown = run.step % PROGRESS_EVERY == 0
            if self.rank == 0 and shown:
                self.session.progress({"step": run.step, "epoch": run.epoch,
                                       "loss": _mean(losses[-PROGRESS_EVERY:]),
                                       "examples_per_s": run.rate()})
            # one rank reads its clock for free; several agree by an all-reduce, now and then
            stop = self.stop_now(check_time=shown or self.world == 1)
            if stop:
                break
            if cfg.train.eval_every and run.step % cfg.train.eval_every == 0:
                self.checkpoint(losses[-cfg.train.eval_every:])
                if self.exhausted:
                    stop = True
                    break
        if run.batch_in_epoch >= len(plan):
            run.epoch, run.batch_in_epoch = run.epoch + 1, 0
        self.checkpoint(losses)
        return stop or self.exhausted

    def _collated(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """This rank's batches on the device; on a GPU read, collated and pinned on another
        thread while the previous steps run."""
        if self.device.type != "cuda":
            yield from (b.to(self.device) for b in batches)
            return
        for batch in ahead(b.pin() for b in batches):
            yield batch.to(self.device)

    def stop_now(self, check_time: bool) -> bool:
        """The step limit (every step: all ranks agree by themselves) and, when
        ``check_time``, the time limit (with several ranks that takes an all-reduce, which
        waits for the GPU, so the caller asks every ``PROGRESS_EVERY`` steps)."""
        run, limit = self.run, self.limit_steps
        if limit and run.step >= limit:
            return True
        if not (self.limit_s and check_time):
            return False
        over = run.before + time.perf_counter() - run.started > self.limit_s
        if self.world == 1:
            return over
        flag = torch.tensor([float(over)], device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())  # every rank stops at the same step

    # ---------------------------------------------------------------- checkpoints

    def checkpoint(self, losses: list[torch.Tensor]) -> None:
        """Evaluate (rank 0), write a checkpoint (rank 0) and report it (every rank)."""
        run = self.run
        if run.saved_step == run.step:
            return  # an eval_every checkpoint at an epoch's last step is that epoch's one
        run.saved_step = run.step
        run.elapsed = run.before + time.perf_counter() - run.started
        loss = _mean(losses)
        rngs, digests, reads = self._replicas()
        name = f"step-{run.step:08d}"
        if self.rank != 0:
            self.session.report({"step": run.step}, None, name)
            stop, decay = self._rank0_verdicts(False, False)
            self.exhausted = stop
            if decay:
                self.trainee.decay_lr(self.mcfg.optim.plateau_factor)
            return
        v = self.evaluation.judge(self.trainee.raw, self.trainee.ema, run, loss)
        if v.decay:
            self.trainee.decay_lr(self.mcfg.optim.plateau_factor)
        with tempfile.TemporaryDirectory() as tmp:
            self._write(Path(tmp), rngs, digests, reads, v)
            # "minutes": training time so far, a time-budgeted search's clock (cluster/search.py)
            name = self.session.report({"step": run.step, "epoch": run.epoch, "dev_em": v.em,
                                        "dev_f1": v.f1, RANK_METRIC: v.rank,
                                        "minutes": run.history[-1]["minutes"]}, Path(tmp),
                                       name)
        # the curve's point, once its checkpoint is stored (train/progress.py logs and draws it)
        self.session.progress({"eval": run.history[-1] | {
            "checkpoint": name, "resumed_from_step": run.resumed_from_step}})
        self.exhausted, _ = self._rank0_verdicts(v.stop, v.decay)

    def _replicas(self) -> tuple[list[dict[str, torch.Tensor]], list[str], list[Any]]:
        """Every rank's (RNG streams, weights digest, reads), gathered: a checkpoint resumes
        each rank's streams and records that DDP kept the replicas identical and what each
        rank read."""
        mine = (rng_state(self.device), weights_digest(self.trainee.raw), self.run.reads)
        ranks = [mine]
        if self.world > 1:
            ranks = [None] * self.world
            torch.distributed.all_gather_object(ranks, mine)
        return [r[0] for r in ranks], [r[1] for r in ranks], [r[2] for r in ranks]

    def _rank0_verdicts(self, stop: bool, decay: bool) -> tuple[bool, bool]:
        """Rank 0's (stop, decay) on every rank; each calls this after its report."""
        if self.world == 1:
            return stop, decay
        t = torch.tensor([float(stop), float(decay)], device=self.device)
        torch.distributed.broadcast(t, src=0)
        return bool(t[0].item()), bool(t[1].item())

    def _write(self, d: Path, rngs: list[dict[str, torch.Tensor]], digests: list[str],
               reads: list[Any], v: Verdict) -> None:
        run = self.run
        meta = {"step": run.step, "epoch": run.epoch, "dev_em": v.em, "dev_f1": v.f1,
                "best": run.best, "ranked_on": self.evaluation.ranked_on,
                "history": run.history, "world_size": self.world,
                "replica_digests": digests,  # DDP keeps every rank's weights identical
                "reads": reads,  # each rank's [rows, ids digest] per epoch (data/stream.py)
                "resumed_from_step": run.resumed_from_step, "attempt": self.job.attempt,
                "elapsed": run.elapsed,
                "examples_per_s": run.rate(), "device": str(self.device)}
        payload = model_payload(self.job.variant, self.mcfg, self.inputs,
                                self.trainee.served_weights(), self.job.vocab_sha256)
        write_checkpoint(d, self.trainee, run, rngs, payload, meta, reads)


def _mean(losses: list[torch.Tensor]) -> float:
    """The mean of a run of step losses, read from the device once."""
    return float(torch.stack(losses).mean()) if losses else float("nan")
