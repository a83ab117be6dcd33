"""One rank's training run: resume, epochs of steps, dev evaluation and checkpoints.

Every Ray Train worker runs a ``Worker`` (cluster/train_job.py hands it a Ray session), and so
does one plain process without Ray (train/local.py, world size 1): the same steps, the same
checkpoints, so a GPU box with only PyTorch, numpy, pyarrow and pydantic can train and
measure from prepared Parquet files. Nothing here imports Ray, spaCy or Prefect.

Rank 0 alone keeps the EMA, evaluates and writes each checkpoint (checkpoint.py says what it
holds): checkpoints are ranked on the held-out questions prepare set aside beside
train.parquet (data.heldout; on dev only when it held none out), and the dev curve is dev
at the held-out no-answer threshold; every rank takes its shard of each global batch, so
the global batch stays ``batch_size`` whatever the world size, and DDP averages the
gradients.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rcpipe.config import Config
from rcpipe.data.dataset import Batch, SquadDataset, ahead, bucket_batches
from rcpipe.data.heldout import prepared_heldout
from rcpipe.inference.reading import Split, heldout_split
from rcpipe.models import ModelInputs, build_model
from rcpipe.scoring.metrics import headline
from rcpipe.train.checkpoint import META, MODEL, RANK_METRIC, STATE
from rcpipe.train.loop import EMA, TrainStep, make_optimizer
from rcpipe.trained.model_file import model_payload

PROGRESS_EVERY = 10  # steps between progress messages (and loss reads) from rank 0


@dataclass
class Job:
    """What every rank needs to train one variant (plain data: Ray pickles it)."""

    config: dict[str, Any]  # Config.model_dump(mode="json")
    variant: str
    train_path: str  # Parquet, a path every rank can read
    dev_path: str
    vocab_sha256: str
    threads: int = 0  # torch CPU threads; 0: leave torch's default


class Session(Protocol):
    """Where a rank runs: Ray Train's worker context, or one plain process (local.py)."""

    rank: int
    world: int
    device: torch.device

    def inputs(self) -> ModelInputs: ...

    def dev_doc(self) -> dict[str, Any]: ...

    def latest(self) -> AbstractContextManager[Path | None]:
        """The directory of the checkpoint to resume from, or None for a fresh run."""
        ...

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """DDP-wrap (and place) the model for this world; the identity for one process."""
        ...

    def report(self, metrics: dict[str, Any], directory: Path | None, name: str) -> None:
        """Persist the checkpoint in ``directory`` (rank 0; None on the others) as ``name``."""
        ...

    def progress(self, message: dict[str, Any]) -> None: ...


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

    def rate(self) -> float:
        seconds = time.perf_counter() - self.started
        return round(self.seen / seconds, 2) if seconds > 0 else 0.0


RESUMED = ("step", "epoch", "batch_in_epoch", "elapsed", "best", "history")


def weights_digest(model: nn.Module) -> str:
    """sha256 of every weight's bytes: equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class Scores:
    """One evaluation of a checkpoint: dev's official result (v2.0: at the held-out
    threshold), the held-out one's (None without held-out questions) and the rank."""

    dev: dict[str, Any]
    heldout: dict[str, Any] | None
    rank: float  # what checkpoints are kept by


def scores(model: nn.Module, dev: Split, heldout: Split | None, source: str | None,
           cfg: Config, device: torch.device, ema: EMA | None = None,
           length_prior: torch.Tensor | None = None) -> Scores:
    """The official scores of ``model`` (its EMA weights, if any) on the held-out questions
    and on dev (inference/reading.py: heldout_then_dev), and the rank checkpoints are kept by:
    held-out F1 (dev's without held-out questions; v2.0: at the held-out set's best
    threshold), ties broken by how good the spans are (v2.0: a checkpoint whose best
    threshold is to answer nothing is not kept over one with better spans)."""
    from rcpipe.inference.reading import heldout_then_dev

    with ema.applied(model) if ema is not None else nullcontext():
        ev, held = heldout_then_dev(model, dev, heldout, source, device,
                                    cfg.eval.max_answer_len, cfg.eval.na_threshold,
                                    length_prior, cfg.data.window)
    by = held or ev
    return Scores(ev.result, held.result if held else None,
                  headline(by.result)[1] + 1e-4 * (by.span_f1 or 0.0))


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
        self.cfg = cfg = Config.model_validate(job.config)
        self.mcfg = cfg.models.of(job.variant)
        if job.threads:
            torch.set_num_threads(job.threads)
        self.rank, self.world, self.device = session.rank, session.world, session.device
        self.inputs = session.inputs()
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
        self.raw = build_model(job.variant, self.mcfg, self.inputs).to(self.device)
        self.optimizer, self.scheduler = make_optimizer(
            self.raw, self.mcfg.optim, lr_tensor=cfg.train.compile != "off")
        self.ema = EMA(self.raw, self.mcfg.optim.ema_decay) \
            if self.mcfg.optim.ema_decay and self.rank == 0 else None
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
        self.model = self.session.prepare_model(self.raw)
        self.step = TrainStep(self.model, self.optimizer, self.scheduler,
                              self.mcfg.optim.grad_clip, self.ema, raw=self.raw, bf16=self.bf16,
                              compile=self.cfg.train.compile,
                              backend=self.cfg.train.compile_backend)
        buckets = self.cfg.train.buckets
        self.train_set = SquadDataset.from_parquet(
            Path(self.job.train_path),
            buckets=(buckets.context, buckets.question) if buckets else None)
        # whole contexts, a long one read as data.window's windows, as `rcpipe evaluate`
        # reads them: the checkpoints are ranked on what evaluation will score
        self.dev_set = SquadDataset.from_parquet(Path(self.job.dev_path))
        # prepare's held-out questions, beside train.parquet: rank 0 ranks checkpoints on them
        self.heldout = prepared_heldout(Path(self.job.train_path).parent)
        self.heldout_split: Split | None = None
        self.length_prior = torch.from_numpy(self.train_set.answer_length_prior(
            self.cfg.eval.max_answer_len)) if self.cfg.eval.length_prior else None
        self.run.started = time.perf_counter()
        stop = self.run.step > 0 and self.stop_now(check_time=True)
        with mixed_precision(self.device, self.cfg.train.tf32):
            while self.run.epoch < self.cfg.train.epochs and not stop:
                stop = self.epoch()

    def resume(self) -> None:
        """Weights, optimizer, schedule, EMA, position and this rank's RNG from the latest
        checkpoint, if the session has one."""
        with self.session.latest() as d:
            if d is None:
                return
            saved = torch.load(d / STATE, map_location=self.device, weights_only=True)
        self.raw.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        if self.ema is not None and saved["ema"] is not None:
            self.ema.load_state_dict(saved["ema"])
        rngs = saved["rng"]
        if len(rngs) == self.world:  # the same world size: each rank continues its stream
            torch.set_rng_state(rngs[self.rank].cpu())
        self.run = RunState(**{k: saved[k] for k in RESUMED})
        self.run.resumed_from_step, self.run.before = self.run.step, self.run.elapsed
        # the step resumed from is saved: an epoch's end there must not save it again
        self.run.saved_step = self.run.step

    def epoch(self) -> bool:
        """Train the rest of the current epoch; True when a step or time limit stopped it."""
        run, cfg = self.run, self.cfg
        batches = train_batches(self.train_set, self.batch_size, cfg.train.seed + run.epoch,
                                self.world)
        losses: list[torch.Tensor] = []  # on the device: read only when shown or saved
        stop = False
        for indices, batch in self._collated(batches[run.batch_in_epoch:]):
            losses.append(self.step(batch))
            run.step += 1
            run.batch_in_epoch += 1
            run.seen += len(indices)
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
        if run.batch_in_epoch >= len(batches):
            run.epoch, run.batch_in_epoch = run.epoch + 1, 0
        self.checkpoint(losses)
        return stop or self.exhausted

    def _collated(self, batches: list[list[int]]) -> Iterator[tuple[list[int], Batch]]:
        """(global batch, this rank's share of it on the device); on a GPU collated and
        pinned on another thread while the previous steps run."""
        def share(indices: list[int]) -> tuple[list[int], Batch]:
            batch = self.train_set.collate(indices[self.rank::self.world])
            return indices, batch.pin() if self.device.type == "cuda" else batch

        shares = map(share, batches)
        for indices, batch in ahead(shares) if self.device.type == "cuda" else shares:
            yield indices, batch.to(self.device)

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
        mine = (torch.get_rng_state(), weights_digest(self.raw))
        ranks = [mine]
        if self.world > 1:
            ranks = [None] * self.world
            torch.distributed.all_gather_object(ranks, mine)
        rngs, digests = [r for r, _ in ranks], [d for _, d in ranks]
        name = f"step-{run.step:08d}"
        if self.rank != 0:
            self.session.report({"step": run.step}, None, name)
            stop, decay = self._rank0_verdicts(False, False)
            self.exhausted = stop
            if decay:
                self._decay_lr()
            return
        s = scores(self.raw, Split(self.dev_set, self.session.dev_doc()), self._heldout(),
                   self.heldout.source if self.heldout else None, self.cfg, self.device,
                   self.ema, self.length_prior)
        em, f1 = headline(s.dev)
        rank = s.rank
        # em, f1: dev (v2.0 at the held-out threshold), the curve people read; heldout_*:
        # what the checkpoints are ranked by
        point = {"epoch": run.epoch, "step": run.step, "loss": loss, "em": em, "f1": f1}
        if s.heldout is not None:
            point |= dict(zip(("heldout_em", "heldout_f1"), headline(s.heldout), strict=True))
        run.history.append(point | {"minutes": round(run.elapsed / 60, 3)})
        if run.best is None or rank > run.best.get("rank", run.best["f1"]):
            run.best = {"em": em, "f1": f1, "rank": rank, "step": run.step,
                        "epoch": run.epoch, "heldout_f1": point.get("heldout_f1")}
        # early stopping (train.patience evaluations without a better rank) and the lr's
        # decay on a plateau (optim.plateau_factor every optim.plateau_patience of them),
        # decided before the checkpoint is written, so that a resumed run has them
        since_best = sum(1 for h in run.history if h["step"] > run.best["step"])
        patience, optim = self.cfg.train.patience, self.mcfg.optim
        stop = bool(patience) and since_best >= patience
        decay = optim.plateau_factor < 1 and since_best > 0 \
            and since_best % optim.plateau_patience == 0
        if decay:
            self._decay_lr()
        with tempfile.TemporaryDirectory() as tmp:
            self._write(Path(tmp), rngs, digests, em, f1)
            # "minutes": training time so far, a time-budgeted search's clock (cluster/search.py)
            self.session.report({"step": run.step, "epoch": run.epoch, "dev_em": em,
                                 "dev_f1": f1, RANK_METRIC: rank,
                                 "minutes": run.history[-1]["minutes"]}, Path(tmp), name)
        # the curve's point, once its checkpoint is stored (train/progress.py logs and draws it)
        self.session.progress({"eval": run.history[-1] | {
            "checkpoint": name, "resumed_from_step": run.resumed_from_step}})
        self.exhausted, _ = self._rank0_verdicts(stop, decay)

    def _heldout(self) -> Split | None:
        """The held-out Split, read once (rank 0 alone evaluates)."""
        if self.heldout is not None and self.heldout_split is None:
            self.heldout_split = heldout_split(self.heldout, None)
        return self.heldout_split

    def _rank0_verdicts(self, stop: bool, decay: bool) -> tuple[bool, bool]:
        """Rank 0's (stop, decay) on every rank; each calls this after its report."""
        if self.world == 1:
            return stop, decay
        t = torch.tensor([float(stop), float(decay)], device=self.device)
        torch.distributed.broadcast(t, src=0)
        return bool(t[0].item()), bool(t[1].item())

    def _decay_lr(self) -> None:
        factor = self.mcfg.optim.plateau_factor
        # the schedule multiplies base_lrs (saved with it, so a resumed run keeps them)
        self.scheduler.base_lrs = [lr * factor for lr in self.scheduler.base_lrs]
        for group in self.optimizer.param_groups:
            group["lr"] *= factor

    def _write(self, d: Path, rngs: list[torch.Tensor], digests: list[str], em: float,
               f1: float) -> None:
        run, ema, raw = self.run, self.ema, self.raw
        weights = dict(raw.state_dict())
        if ema is not None:
            weights.update(ema.shadow)
        meta = {"step": run.step, "epoch": run.epoch, "dev_em": em, "dev_f1": f1,
                "best": run.best,
                "ranked_on": self.heldout.source if self.heldout else "dev",
                "history": run.history, "world_size": self.world,
                "replica_digests": digests,  # DDP keeps every rank's weights identical
                "resumed_from_step": run.resumed_from_step, "elapsed": run.elapsed,
                "examples_per_s": run.rate(), "device": str(self.device)}
        torch.save({"model": raw.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "ema": ema.state_dict() if ema is not None else None,
                    "rng": rngs, "step": run.step, "epoch": run.epoch,
                    "batch_in_epoch": run.batch_in_epoch, "elapsed": run.elapsed,
                    "best": run.best, "history": run.history}, d / STATE)
        torch.save(model_payload(self.job.variant, self.mcfg, self.inputs, weights,
                                 self.job.vocab_sha256), d / MODEL)
        (d / META).write_text(json.dumps(meta, indent=1))


def train_batches(data: SquadDataset, batch_size: int, seed: int, world: int
                  ) -> list[list[int]]:
    """One epoch's global batches, in order. Every rank needs a share of every step; with
    train.buckets every batch is full too (the last, partial one is left out: the rows are
    shuffled anew each epoch), so an epoch has at most one shape per pair of bucket edges."""
    smallest = batch_size if data.buckets else world
    return [b for b in bucket_batches(data.context_lengths(), batch_size, shuffle=True,
                                      seed=seed) if len(b) >= smallest]


def _mean(losses: list[torch.Tensor]) -> float:
    """The mean of a run of step losses, read from the device once."""
    return float(torch.stack(losses).mean()) if losses else float("nan")
