"""What one run reads of the prepared data: the rank's training stream, dev, prepare's
held-out questions and the answer-length prior (the Job names where they are:
train/job.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rcpipe.config import Config
from rcpipe.data.dataset import answer_length_prior, char_limit_of
from rcpipe.data.prepared import Prepared, PreparedHeldout
from rcpipe.data.stream import TrainStream
from rcpipe.data.teacher import TeacherTargets
from rcpipe.train.job import Job


@dataclass
class TrainingData:
    """A run's data, read by every rank (rank 0 alone evaluates on dev and held-out)."""

    # this rank's share of each epoch, a buffer at a time (bucketed by train.buckets' edges,
    # when set)
    train: TrainStream
    # dev's folder: rank 0 reads it a chunk at a time at each evaluation, whole contexts, a
    # long one read as data.window's windows, as `rcpipe evaluate` reads them: the
    # checkpoints are ranked on what evaluation will score
    dev: Path
    heldout: PreparedHeldout | None  # rank 0 ranks checkpoints on them; None: on dev
    length_prior: torch.Tensor | None  # eval.length_prior: training's answer lengths

    @classmethod
    def load(cls, job: Job, cfg: Config, rank: int = 0, world: int = 1,
             batch_size: int | None = None) -> TrainingData:
        """Rank ``rank`` of ``world``'s data; ``batch_size``: the global batch (default
        train.batch_size), each rank taking its world-th of it."""
        batch_size = batch_size or cfg.train.batch_size
        folder = Path(job.train_path)
        prepared = Prepared(folder.parent)
        shards = prepared.shards(folder.name)
        buckets = cfg.train.buckets
        teacher = TeacherTargets.open(Path(job.teacher_path), shards) \
            if job.teacher_path else None  # a student's run: its targets beside its rows
        train = TrainStream(shards, batch_size // world, cfg.train.seed, rank, world,
                            cfg.train.shuffle_buffer,
                            (buckets.context, buckets.question) if buckets else None,
                            char_limit_of(prepared.out_dir), teacher)
        dev = Path(job.dev_path)
        prepared.shards(dev.name)  # there, and of this layout: found before the first step
        heldout = prepared.heldout()  # prepare's held-out questions, beside the training split
        prior = torch.from_numpy(answer_length_prior(shards, cfg.eval.max_answer_len)) \
            if cfg.eval.length_prior else None
        return cls(train, dev, heldout, prior)
