"""What every rank of a run needs to train one variant: the ``Job``, built in one place."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from rcpipe.config import Config
from rcpipe.train.seeds import run_config


@dataclass
class Job:
    """What every rank needs to train one variant (Ray pickles it to each rank)."""

    # validated once, where the params were loaded: a rank reads it as it is (a frozen
    # pydantic model pickles whole), never validating again; one network's (seeds.py)
    config: Config
    variant: str
    train_path: str  # Parquet, a path every rank can read
    dev_path: str
    vocab_sha256: str
    threads: int = 0  # torch CPU threads; 0: leave torch's default
    # a student's run (`rcpipe distill`): its teacher's targets beside the training split
    # (data/teacher.py), a path every rank can read; "": trained on the gold spans alone
    teacher_path: str = ""
    # this attempt's token, in each checkpoint's meta it writes: the driver tells a
    # checkpoint of this attempt from one of the attempt before (cluster/train_run.py)
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


def make_job(cfg: Config, variant: str, data: dict[str, str], teacher: str = "") -> Job:
    """``variant``'s Job under ``cfg``, one network's run (train/seeds.py's ``run_config``:
    a variant of several seeds is several runs); ``data``: the prepared data's paths and
    vocabulary digest as ``Prepared.job_fields()`` gives them (read once on the driver: a
    search's trials share them); ``teacher``: a student's targets (Job.teacher_path). A Ray
    Train job sets ``threads`` from its scaling (cluster/train_job.py); one process takes
    train.threads."""
    return Job(config=run_config(cfg, variant), variant=variant, **data,
               threads=cfg.train.threads, teacher_path=teacher)
