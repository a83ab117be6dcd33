"""What one run reads of the prepared data: the training rows, dev, prepare's held-out
questions and the answer-length prior (the Job names where they are: train/job.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rcpipe.config import Config
from rcpipe.data.dataset import SquadDataset
from rcpipe.data.prepared import Prepared, PreparedHeldout
from rcpipe.train.job import Job


@dataclass
class TrainingData:
    """A run's data, read by every rank (rank 0 alone evaluates on dev and held-out)."""

    train: SquadDataset  # bucketed by train.buckets' edges, when set
    # whole contexts, a long one read as data.window's windows, as `rcpipe evaluate` reads
    # them: the checkpoints are ranked on what evaluation will score
    dev: SquadDataset
    heldout: PreparedHeldout | None  # rank 0 ranks checkpoints on them; None: on dev
    length_prior: torch.Tensor | None  # eval.length_prior: training's answer lengths

    @classmethod
    def load(cls, job: Job, cfg: Config) -> TrainingData:
        buckets = cfg.train.buckets
        train = SquadDataset.from_parquet(
            Path(job.train_path),
            buckets=(buckets.context, buckets.question) if buckets else None)
        dev = SquadDataset.from_parquet(Path(job.dev_path))
        # prepare's held-out questions, beside the training split
        heldout = Prepared(Path(job.train_path).parent).heldout()
        prior = torch.from_numpy(train.answer_length_prior(cfg.eval.max_answer_len)) \
            if cfg.eval.length_prior else None
        return cls(train, dev, heldout, prior)
