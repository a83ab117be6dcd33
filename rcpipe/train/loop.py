"""The plain PyTorch training loop: one step, EMA, the optimiser and its lr schedule.

No files and no process groups here: train/worker.py (one rank of a run, with Ray Train or
in one process) calls these functions, so a step means the same thing everywhere.
Prediction and evaluation live in eval/predict.py.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rcpipe.config import OptimConfig
from rcpipe.models.batch import Batch
from rcpipe.models.layers import span_loss


def make_optimizer(model: nn.Module, cfg: OptimConfig
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    # on a GPU every parameter's update in one fused kernel (Adam) or a few multi-tensor ones
    # (Adadelta's foreach, its default there), not a handful of kernels per parameter
    on_gpu = bool(params) and all(p.is_cuda for p in params)
    if cfg.name == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(
            params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
            weight_decay=cfg.weight_decay, fused=on_gpu or None)
    else:
        opt = torch.optim.Adadelta(params, lr=cfg.lr, rho=cfg.rho, eps=cfg.eps,
                                   weight_decay=cfg.weight_decay, foreach=on_gpu or None)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup(cfg.warmup_steps))


def warmup(steps: int) -> Callable[[int], float]:
    """QANet's warm-up: the lr grows as log(step + 1) / log(steps), then stays."""
    if steps <= 1:
        return lambda step: 1.0
    return lambda step: min(1.0, math.log(step + 1) / math.log(steps))


class EMA:
    """Exponential moving average of the weights (QANet: 0.9999), used for evaluation.

    The decay ramps up as min(decay, (1 + n) / (10 + n)) so early averages are not
    dominated by the random initialisation.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.updates = 0
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()
                       if v.dtype.is_floating_point}
        self._live: tuple[int, list[torch.Tensor], list[torch.Tensor]] | None = None

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
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        shadow, live = self._pairs(model)
        # shadow = d * shadow + (1 - d) * live for every tensor at once: one multi-tensor
        # kernel instead of two per tensor (QANet has ~300)
        torch._foreach_lerp_(shadow, live, 1 - d)

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """Swap the averaged weights in for the duration (evaluation, saving)."""
        backup = copy.deepcopy(model.state_dict())
        model.load_state_dict({**backup, **self.shadow})
        try:
            yield
        finally:
            model.load_state_dict(backup)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay, self.updates = state["decay"], state["updates"]
        for k, v in state["shadow"].items():
            self.shadow[k].copy_(v)


def train_step(model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, grad_clip: float,
               ema: EMA | None = None, raw: nn.Module | None = None,
               bf16: bool = False) -> torch.Tensor:
    """One optimisation step on one batch; returns the loss, detached, on the device.

    The loss is not read here: reading it (``float``, ``.item()``) waits for the GPU to
    finish the step, so callers read a sum of many steps' losses now and then.
    ``model`` may be a DDP wrapper of ``raw`` (whose weights the EMA follows); ``bf16``
    runs the forward pass under CUDA bf16 autocast (the loss and the update stay fp32;
    recurrent layers run in fp32 inside it, see layers.float32_recurrence).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = model(batch)
    loss = span_loss(logits, batch.y1, batch.y2)  # log_probs() computes in fp32
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    scheduler.step()
    if ema is not None:
        ema.update(raw if raw is not None else model)
    return loss.detach()
