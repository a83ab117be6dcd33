"""`rcpipe train VARIANT`: a Ray Train job (or a Ray job on a cluster's head, cluster/jobs_api.py).

A run is keyed on what it is trained from (rcpipe/fingerprints.py: the prepared data's
digests, the variant's settings, the train stage's code, rcpipe's version): the finished
model of the same fingerprint means nothing to do; an unfinished run of it is resumed;
anything else is a new run from step 0, announced with what changed. The last finished
model stays in place until the new run finishes. A variant of several seeds is several
runs (train/seeds.py); each is one Ray Train job from this driver (cluster/train_run.py).

Layout (the command contract): models/<variant>/runs/run-<12 hex>/step-<n>/ (a run's Ray
Train storage: the best K by held-out F1 and the latest; or under train.storage_path, e.g.
S3), models/<variant>/runs.json (the runs and their fingerprints; the newest
train.keep_runs keep their checkpoints), models/<variant>/model.pt (the finished run's
best weights, EMA weights where the variant keeps an EMA), models/<variant>/summary.json
(with the run's fingerprint) and metrics.json (the dev curve, at the end),
models/<variant>/live/ (the same curve as it happens: dvclive's files). Messages go to the
``rcpipe.stages.train``, ``rcpipe.cluster.train_run``, ``rcpipe.train.seeds`` and
``rcpipe.train.progress`` loggers. Training code is imported inside the functions:
`rcpipe predict` and the service import the stages but not rcpipe.train.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from rcpipe import fingerprints, layout
from rcpipe.cluster import opening
from rcpipe.config import Config
from rcpipe.data.prepared import Prepared
from rcpipe.fingerprints import Fingerprint
from rcpipe.locks import hold
from rcpipe.outputs import settle

log = logging.getLogger(__name__)


def train(cfg: Config, variant: str, force: bool = False, run: str | None = None,
          detach: bool = False, wait: bool = False) -> dict[str, Any]:
    """Train one variant as a Ray Train job, keyed on its inputs (see above).

    ``force`` trains anew even when the finished model has these inputs: this fingerprint's
    checkpoints are removed first (the model in place stays until the new one finishes).
    Through a cluster's Jobs API, ``run`` names the run whose Ray job this is (one job per
    run and variant) and ``detach`` leaves the job running if the submitter is interrupted
    (rcpipe.cluster.job_runs). One run at a time per models/<variant>/ (rcpipe/locks.py, held
    by this driver; the job's driver on the head holds it through a Jobs API): a second is
    refused with the holder's line, or with ``wait`` waits for it.
    """
    opening.check_trainable(cfg, variant)  # before anything is deleted, loaded or started
    # the submitter of a Ray job may not see the prepared data: the job's driver checks it
    key = _key(cfg, variant) if Prepared(cfg.data.out_dir).train.is_dir() else None
    if opening.through_jobs_api(cfg):  # the run is a Ray job on the cluster's head
        if key is not None and not force and (done := _finished(variant, key)) is not None:
            return _nothing_to_do(variant, done)
        return opening.as_ray_job(cfg, variant, force, run, detach, "train",
                                  lambda: _finished_by_job(variant, key),
                                  layout.summary_file(variant), "summary of these inputs' run")
    from rcpipe.train import seeds

    with hold(layout.model_dir(variant), f"{variant} is being trained", wait):
        settle(layout.model_dir(variant))  # a set a killed stage committed: whole first
        key = key or _key(cfg, variant)
        if not force and (done := seeds.finished(cfg, variant, key)) is not None:
            return _nothing_to_do(variant, done)
        from rcpipe.cluster.train_run import train_run  # Ray Train's driver: heavy

        return seeds.train(cfg, variant, key, force, lambda one: _key(one, variant),
                           partial(train_run, variant=variant, force=force))


def _key(cfg: Config, variant: str) -> Fingerprint:
    """What a run of ``variant`` is trained from: the train stage's row of the table
    (rcpipe/fingerprints.py `of_stage`)."""
    return fingerprints.of_stage(cfg, "train", variant)


def _nothing_to_do(variant: str, summary: dict[str, Any]) -> dict[str, Any]:
    log.info("train %s: already finished with these inputs (%s); nothing to do", variant,
             layout.summary_file(variant))
    return summary


def trained_is_current(cfg: Config, variant: str) -> bool:
    """Whether the model in place finished training from cfg's inputs: `train` would do
    nothing (the flow starts no Ray for such a variant)."""
    if not Prepared(cfg.data.out_dir).train.is_dir():
        return False
    return _finished(variant, _key(cfg, variant)) is not None


def _finished(variant: str, key: Fingerprint) -> dict[str, Any] | None:
    """The summary of the model in place when it finished training with ``key``'s inputs."""
    from rcpipe.train.runs import finished_in

    return finished_in(layout.model_dir(variant), key)


def _finished_by_job(variant: str, key: Fingerprint | None) -> dict[str, Any] | None:
    """The summary the Ray job left here: of these inputs' run (any finished run's, when
    the prepared data is not here to key it on)."""
    from rcpipe.train.runs import summary_in

    summary = _finished(variant, key) if key is not None \
        else summary_in(layout.model_dir(variant))
    return summary if summary is not None and summary.get("finished") else None


# ------------------------------------------------------------ a flow's variants (train-all)


def check_run_name(name: str) -> str:
    """``name``, when it can name a run (a part of its Ray jobs' ids), else one InputError
    line; a flow's runs are named by the user or by the flow run's id."""
    from rcpipe.cluster.job_runs import check_run_name as checked

    return checked(name)


@contextmanager
def train_slots(cfg: Config, variants: int, needed: bool = True) -> Iterator[int]:
    """The Ray that trains ``variants`` variants, and how many go to it at once (none
    started when nothing is to be trained: each variant's stage then finds its model current).

    Through the Jobs API every variant is submitted at once: Ray queues the jobs that do not
    fit yet, and an autoscaling cluster grows to its maximum for them (the GPUs it has now
    may be none). A joined or local Ray takes as many as its resources hold now.
    """
    if opening.through_jobs_api(cfg) or not needed:
        yield variants
        return
    from rcpipe.cluster.train_job import jobs_that_fit

    with opening.on_ray(cfg):  # one Ray for every variant's job
        yield jobs_that_fit(cfg)


def stop_jobs(on_line: Callable[[str], None]) -> list[str]:
    """Stop the Ray jobs this process's train stages follow through a Jobs API, and have
    the Ray Train runs they fit on this process's Ray aborted (a flow cancelled or
    interrupted: the stages follow them in worker threads, which the signal does not
    reach), each Jobs-API job said to ``on_line``; their ids. On return no stage calls
    Ray any more: the caller may shut it down."""
    from rcpipe.cluster.job_runs import stop_followed

    return stop_followed(on_line)
