"""Rank 0's evaluation of a checkpoint: its official scores on prepare's held-out questions
and on dev, the rank checkpoints are kept by, the dev curve's point, and what the scores so
far decide (early stopping, the lr's decay on a plateau).

Checkpoints are ranked on the held-out questions (on dev only when prepare held none out),
and the dev curve is dev at the held-out no-answer threshold: the dev set that reports a
model's scores never chooses its checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rcpipe.config import Config, OptimConfig
from rcpipe.inference.reading import Split, heldout_split, split_of
from rcpipe.scoring.metrics import headline
from rcpipe.train.loop import EMA
from rcpipe.train.state import RunState
from rcpipe.train.training_data import TrainingData


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


@dataclass(frozen=True)
class Verdict:
    """What one evaluation says: dev's EM and F1 (the curve people read), the rank, and
    whether to stop (train.patience) and to decay the lr (optim.plateau_factor)."""

    em: float
    f1: float
    rank: float
    stop: bool
    decay: bool


class Evaluation:
    """Rank 0's judge of its checkpoints: scores each one, records it in the run's history
    and best, and says what the evaluations so far decide."""

    def __init__(self, cfg: Config, optim: OptimConfig, data: TrainingData,
                 dev_doc: Callable[[], dict[str, Any]], device: torch.device) -> None:
        self.cfg, self.optim, self.data, self.device = cfg, optim, data, device
        self.dev_doc = dev_doc  # the dev set's JSON, fetched at the first evaluation
        self._heldout: Split | None = None

    @property
    def ranked_on(self) -> str:
        """What checkpoints are ranked on: the held-out questions' source, or dev."""
        return self.data.heldout.source if self.data.heldout else "dev"

    def heldout(self) -> Split | None:
        """The held-out Split, read once."""
        if self.data.heldout is not None and self._heldout is None:
            self._heldout = heldout_split(self.data.heldout, None, whole=False)
        return self._heldout

    def judge(self, model: nn.Module, ema: EMA | None, run: RunState, loss: float
              ) -> Verdict:
        """Score ``model`` at ``run``'s step, append the curve's point to ``run.history``,
        keep ``run.best``, and decide."""
        data = self.data
        s = scores(model, split_of(data.dev, self.dev_doc()), self.heldout(),
                   data.heldout.source if data.heldout else None, self.cfg, self.device,
                   ema, data.length_prior)
        em, f1 = headline(s.dev)
        # em, f1: dev (v2.0 at the held-out threshold), the curve people read; heldout_*:
        # what the checkpoints are ranked by
        point = {"epoch": run.epoch, "step": run.step, "loss": loss, "em": em, "f1": f1}
        if s.heldout is not None:
            point |= dict(zip(("heldout_em", "heldout_f1"), headline(s.heldout), strict=True))
        run.history.append(point | {"minutes": round(run.elapsed / 60, 3)})
        if run.best is None or s.rank > run.best.get("rank", run.best["f1"]):
            run.best = {"em": em, "f1": f1, "rank": s.rank, "step": run.step,
                        "epoch": run.epoch, "heldout_f1": point.get("heldout_f1")}
        stop, decay = decide(run.history, run.best, self.cfg.train.patience, self.optim)
        return Verdict(em, f1, s.rank, stop, decay)


def decide(history: list[dict[str, Any]], best: dict[str, Any], patience: int,
           optim: OptimConfig) -> tuple[bool, bool]:
    """(stop, decay) after the evaluations in ``history``: early stopping (``patience``
    evaluations, train.patience, without a better rank than ``best``'s) and the lr's decay
    on a plateau (optim.plateau_factor every optim.plateau_patience of them), decided
    before the checkpoint is written, so that a resumed run has them."""
    since_best = sum(1 for h in history if h["step"] > best["step"])
    stop = bool(patience) and since_best >= patience
    decay = optim.plateau_factor < 1 and since_best > 0 \
        and since_best % optim.plateau_patience == 0
    return stop, decay
