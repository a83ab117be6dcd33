"""Rank 0's evaluation of a checkpoint (train/evaluation.py): what the scores so far decide.
(The ranking on the held-out questions: tests/train/test_local.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from rcpipe.config import OptimConfig
from rcpipe.train.evaluation import decide


def _history(*steps: int) -> list[dict[str, Any]]:
    return [{"step": s} for s in steps]


@pytest.mark.parametrize(("steps", "best", "patience", "stop"), [
    ((1, 2, 3), 1, 2, True),  # two evaluations after the best: patience spent
    ((1, 2), 1, 2, False),
    ((1, 2, 3), 3, 2, False),  # the latest is the best
    ((1, 2, 3, 4, 5), 1, 0, False),  # patience 0: no early stopping
])
def test_early_stopping_counts_evaluations_since_the_best(steps: tuple[int, ...], best: int,
                                                          patience: int, stop: bool) -> None:
    assert decide(_history(*steps), {"step": best}, patience, OptimConfig())[0] is stop


def test_the_lr_decays_every_plateau_patience_evaluations_without_a_better_rank() -> None:
    optim = OptimConfig(plateau_factor=0.5, plateau_patience=2)
    decays = [decide(_history(*range(1, n + 1)), {"step": 1}, 0, optim)[1]
              for n in range(1, 7)]
    assert decays == [False, False, True, False, True, False]  # 2 and 4 since the best
    assert not decide(_history(1, 2, 3), {"step": 1}, 0, OptimConfig())[1]  # factor 1: never
