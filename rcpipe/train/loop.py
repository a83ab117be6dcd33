"""The plain PyTorch training loop: one step, EMA, the optimiser and its lr schedule.

No files and no process groups here: train/worker.py (one rank of a run, with Ray Train or
in one process) calls these functions, so a step means the same thing everywhere.
Prediction and evaluation live in inference/reading.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from rcpipe.config import OptimConfig
from rcpipe.models.batch import Batch
from rcpipe.models.layers import distillation_loss, span_loss


def make_optimizer(model: nn.Module, cfg: OptimConfig, lr_tensor: bool = False
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The paper's optimiser and its warm-up schedule. ``lr_tensor``: Adam's lr a tensor on
    the parameters' device, so a compiled step reads the warm-up's new lr every step
    instead of compiling again for each value (train.compile)."""
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    if cfg.name == "adam":
        # fused, on a GPU and on the CPU alike: every parameter's update in one kernel, and
        # no host read of the step count (the per-tensor Adam calls .item() on it each step)
        lr: float | torch.Tensor = torch.tensor(cfg.lr, device=device) if lr_tensor \
            else cfg.lr
        opt: torch.optim.Optimizer = torch.optim.Adam(
            params, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
            weight_decay=cfg.weight_decay, fused=bool(params) or None)
    else:
        # a few multi-tensor kernels per step; the lr stays a float: Adadelta reads a
        # tensor lr on the host, and the papers keep it constant (a plateau decay changes
        # it rarely: a compiled step compiles once more then)
        opt = torch.optim.Adadelta(params, lr=cfg.lr, rho=cfg.rho, eps=cfg.eps,
                                   weight_decay=cfg.weight_decay, foreach=bool(params) or None)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup(cfg.warmup_steps))


def warmup(steps: int) -> Callable[[int], float]:
    """QANet's warm-up: the lr grows as log(step + 1) / log(steps), then stays."""
    if steps <= 1:
        return lambda step: 1.0
    return lambda step: min(1.0, math.log(step + 1) / math.log(steps))


class EMA:
    """Exponential moving average of the trained weights (QANet: 0.9999), used for
    evaluation.

    The decay ramps up as min(decay, (1 + n) / (10 + n)) so early averages are not
    dominated by the random initialisation. n lives on the weights' device and the decay
    is computed there: an update reads nothing from the host that changes between steps,
    so a compiled step (train.compile) captures it once. Only parameters that train are
    averaged: a frozen pretrained table (300 floats for each SQuAD word GloVe knows) never
    changes, and averaging it would copy it through memory every step.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        trained = {name for name, p in model.named_parameters() if p.requires_grad}
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()
                       if k in trained}
        device = next(iter(self.shadow.values())).device if self.shadow else None
        self.count = torch.zeros((), device=device)  # updates so far, as a float tensor
        self._live: tuple[int, list[torch.Tensor], list[torch.Tensor]] | None = None

    @property
    def updates(self) -> int:
        return int(self.count)  # a host read: for checkpoints, not for steps

    def _pairs(self, model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(shadow tensors, the model's tensors), in the same order; cached per model (its
        tensors are updated in place, load_state_dict included, so the references hold)."""
        if self._live is None or self._live[0] != id(model):
            live = model.state_dict()
            self._live = (id(model), [self.shadow[k] for k in self.shadow],
                          [live[k].detach() for k in self.shadow])
        return self._live[1], self._live[2]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.count += 1
        d = torch.clamp((1 + self.count) / (10 + self.count), max=self.decay)  # ()
        shadow, live = self._pairs(model)
        # shadow += (1 - d) (live - shadow) for every tensor at once: one multi-tensor
        # kernel (QANet has ~300 tensors); a weight per tensor, since the 0-dim tensor
        # overload would read d on the host
        torch._foreach_lerp_(shadow, live, [1 - d] * len(shadow))

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """Swap the averaged weights in for the duration (evaluation, saving)."""
        shadow, live = self._pairs(model)
        backup = [t.clone() for t in live]
        torch._foreach_copy_(live, shadow)
        try:
            yield
        finally:
            torch._foreach_copy_(live, backup)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = state["decay"]
        self.count.fill_(state["updates"])
        for k, v in state["shadow"].items():
            if k in self.shadow:  # checkpoints before the frozen table was left out have it
                self.shadow[k].copy_(v)


Compile = Literal["off", "default", "reduce-overhead"]


@dataclass(frozen=True)
class Distill:
    """A student's loss (`rcpipe distill`, config/distill.py): (1 - alpha) x the gold span's
    cross-entropy + alpha x distillation_loss at ``temperature``, on batches that carry the
    teacher's targets."""

    alpha: float
    temperature: float


class TrainStep:
    """One optimisation step on one batch, eager or compiled (train.compile).

    ``model`` may be a DDP wrapper of ``raw`` (whose weights the EMA follows); ``bf16`` runs
    the forward pass under CUDA bf16 autocast (the loss and the update stay fp32; recurrent
    layers run in fp32 inside it, see layers.float32_recurrence). Compiled, the step is two
    graphs: the forward with the loss (AOTAutograd compiles its backward), and the update:
    gradient clipping, the optimiser step and the EMA. With "reduce-overhead" each is
    replayed as a CUDA graph per input shape (train.buckets keeps those few). The lr
    schedule stays outside: it writes the new lr into the optimiser (a tensor, for Adam)
    and the compiled update reads it from there.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, grad_clip: float,
                 ema: EMA | None = None, raw: nn.Module | None = None, bf16: bool = False,
                 compile: Compile = "off", backend: str = "inductor",
                 distill: Distill | None = None) -> None:
        self.model, self.raw = model, raw if raw is not None else model
        self.distill = distill
        self.optimizer, self.scheduler, self.ema = optimizer, scheduler, ema
        self.grad_clip, self.bf16 = grad_clip, bf16
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._loss: Callable[[Batch], torch.Tensor] = self.loss
        self._update: Callable[[], None] = self.update
        # CUDA graphs (reduce-overhead) replay into the same memory every step, so a step's
        # outputs are overwritten by the next one's (and read then, torch raises)
        self.graphs = compile == "reduce-overhead"
        if self.graphs and ema is not None:
            # a captured graph may update in place only tensors that keep their address:
            # parameters, buffers, the optimiser's state (torch marks it) and tensors marked
            # so; cudagraph trees run any other such graph uncaptured. The EMA's keep theirs
            for t in (*ema.shadow.values(), ema.count):
                torch._dynamo.mark_static_address(t)
        if compile != "off":
            mode = None if compile == "default" else compile
            self._loss = torch.compile(self.loss, mode=mode, backend=backend)
            if all(p.is_cuda for p in self.params):
                # on a GPU the update joins the captured step (one CUDA graph, no launch
                # per tensor); on the CPU there is nothing to capture, its fused and
                # multi-tensor kernels stay as they are, and compiling them cost 1-2
                # minutes per variant (measured, 2 cores)
                self._update = torch.compile(self.update, mode=mode, backend=backend)

    def loss(self, batch: Batch) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(batch)
        gold = span_loss(logits, batch.y1, batch.y2)  # log_probs() computes in fp32
        if self.distill is None or batch.teacher_start is None or batch.teacher_end is None:
            return gold
        alpha, temperature = self.distill.alpha, self.distill.temperature
        return (1 - alpha) * gold + alpha * distillation_loss(
            logits, batch.teacher_start, batch.teacher_end, temperature)

    def update(self) -> None:
        nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update(self.raw)

    def __call__(self, batch: Batch) -> torch.Tensor:
        """The step; returns the loss, detached, on the device.

        The loss is not read here: reading it (``float``, ``.item()``) waits for the GPU to
        finish the step, so callers read a sum of many steps' losses now and then.
        """
        self.model.train()
        if self.graphs:  # a new step: the last one's graph outputs may now be written over
            torch.compiler.cudagraph_mark_step_begin()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(batch)
        # the Worker keeps each step's loss until its next progress line or checkpoint:
        # under CUDA graphs a copy (one scalar), as the graph's own memory is reused
        kept = loss.detach().clone() if self.graphs else loss.detach()
        loss.backward()
        self._update()
        self.scheduler.step()
        return kept


def train_step(model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, grad_clip: float,
               ema: EMA | None = None, raw: nn.Module | None = None,
               bf16: bool = False) -> torch.Tensor:
    """One eager step (TrainStep, for a caller that keeps no step object)."""
    return TrainStep(model, optimizer, scheduler, grad_clip, ema, raw, bf16)(batch)
