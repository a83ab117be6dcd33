"""`rcpipe train VARIANT`: a Ray Train job (or a Ray job on a cluster's head, cluster/jobs_api.py).

A run is keyed on what it is trained from (rcpipe/fingerprints.py: the prepared data's
digests, the variant's settings, rcpipe's version): the finished model of the same
fingerprint means nothing to do; an unfinished run of it is resumed; anything else is a
new run from step 0, announced with what changed. The last finished model stays in place
until the new run finishes.

Layout (the command contract): models/<variant>/runs/run-<12 hex>/step-<n>/ (a run's Ray
Train storage: the best K by held-out F1 and the latest; or under train.storage_path, e.g.
S3), models/<variant>/runs.json (the runs and their fingerprints; the newest
train.keep_runs keep their checkpoints), models/<variant>/model.pt (the finished run's
best weights, EMA weights where the variant keeps an EMA), models/<variant>/summary.json
(with the run's fingerprint) and metrics.json (the dev curve, at the end),
models/<variant>/live/ (the same curve as it happens: dvclive's files). Messages go to the
``rcpipe.stages.train`` and ``rcpipe.train.progress`` loggers. Training code is imported
inside the functions: `rcpipe predict` and the service import the stages but not rcpipe.train.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcpipe import fingerprints, layout
from rcpipe.config import Config
from rcpipe.console import shared_progress
from rcpipe.errors import InputError, RunError
from rcpipe.fingerprints import Fingerprint
from rcpipe.locks import hold
from rcpipe.outputs import settle
from rcpipe.stages.io import load_dataset

if TYPE_CHECKING:  # heavy (torch): imported where they are used
    from rich.progress import Progress, TaskID

    from rcpipe.models import ModelInputs
    from rcpipe.train.progress import ProgressLog
    from rcpipe.train.runs import Runs

log = logging.getLogger(__name__)


def _model_inputs(cfg: Config) -> ModelInputs:
    from rcpipe.trained.model_file import prepared_inputs

    d = cfg.data.out_dir
    if not (d / "train.parquet").is_file():
        raise InputError(d, "", "no prepared data; run `rcpipe prepare` first")
    return prepared_inputs(d, cfg.data.word_dim)


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
    from rcpipe.cluster import train_job
    from rcpipe.cluster.jobs_api import jobs_api_address

    cfg.models.of(variant)  # an unknown variant is the user's mistake, found before Ray starts
    train_job.check_train_v2()  # before anything is deleted, loaded or started
    # the submitter of a Ray job may not see the prepared data: the job's driver checks it
    key = fingerprints.training(cfg, variant) \
        if (cfg.data.out_dir / "train.parquet").is_file() else None
    if jobs_api_address(cfg):  # the run is a Ray job on the cluster's head
        if key is not None and not force and (done := _finished(variant, key)) is not None:
            return _nothing_to_do(variant, done)
        return _train_as_job(cfg, variant, key, force, run, detach)
    with hold(layout.model_dir(variant), f"{variant} is being trained", wait):
        settle(layout.model_dir(variant))  # a set a killed stage committed: whole first
        if key is not None and not force and (done := _finished(variant, key)) is not None:
            return _nothing_to_do(variant, done)
        return _train_here(cfg, variant, key, force)


def _nothing_to_do(variant: str, summary: dict[str, Any]) -> dict[str, Any]:
    log.info("train %s: already finished with these inputs (%s); nothing to do", variant,
             layout.summary_file(variant))
    return summary


def _train_here(cfg: Config, variant: str, key: Fingerprint | None, force: bool
                ) -> dict[str, Any]:
    """The Ray Train job from this driver, to the model in place (under the lock)."""
    from rcpipe.cluster import train_job
    from rcpipe.train.checkpoint import RANK_METRIC, finish_run, read_meta
    from rcpipe.train.runs import Runs, run_name

    inputs = _model_inputs(cfg)
    key = key or fingerprints.training(cfg, variant)
    _check_model_config(cfg, variant, inputs)
    runs, name = Runs(variant), run_name(key)
    path, filesystem = train_job.storage(cfg, variant, layout.runs_dir(variant))
    log.info("train %s: %s", variant, _why(variant, key, runs, name, force))
    if force or (runs.get(name) or {}).get("finished"):  # a finished run's storage is spent
        train_job.forget_run(path, filesystem, name)
    runs.started(name, key)
    stored = train_job.latest_step(path, filesystem, name)  # where a resumed run goes on from
    dev_doc = load_dataset(cfg.data.dev_file, cfg.data.cache_dir, cfg.limits)
    t0 = time.perf_counter()
    result = _fit(cfg, variant, inputs, dev_doc, path, filesystem, name)
    if result.checkpoint is None:
        raise InputError(cfg.data.out_dir / "train.parquet", "",
                         "training produced no checkpoint (no batch to train on?)")
    with result.checkpoint.as_directory() as d:
        meta = read_meta(Path(d))
    best = result.get_best_checkpoint(RANK_METRIC, "max") or result.checkpoint
    with best.as_directory() as d:
        # "finished" and the fingerprint: asked for again, the run is done (_finished)
        # a run resumed at its last step trains none and writes no checkpoint: its
        # latest one's meta names the attempt before
        resumed = stored if meta["step"] == stored else meta["resumed_from_step"]
        summary = finish_run(variant, layout.model_dir(variant), meta, Path(d),
                             time.perf_counter() - t0, checkpoints=result.path,
                             finished=True, run=name, fingerprint=key.as_dict(),
                             resumed_from_step=resumed)
    runs.finished(name)
    for old in runs.stale(cfg.train.keep_runs, name):  # train.keep_runs: the newest kept
        train_job.forget_run(path, filesystem, old)
        runs.drop(old)
    return summary


def trained_is_current(cfg: Config, variant: str) -> bool:
    """Whether the model in place finished training from cfg's inputs: `train` would do
    nothing (the flow starts no Ray for such a variant)."""
    if not (cfg.data.out_dir / "train.parquet").is_file():
        return False
    return _finished(variant, fingerprints.training(cfg, variant)) is not None


def _why(variant: str, key: Fingerprint, runs: Runs, name: str, force: bool) -> str:
    """The one line that says why this run trains: resumed, or anew and what changed."""
    if force:
        return f"--force: training anew ({name})"
    if (found := runs.get(name)) is not None and not found.get("finished"):
        return f"resuming {name}, whose inputs are these, from its latest checkpoint"
    summary = _summary(variant)
    if summary is not None and "fingerprint" not in summary:
        return f"the model in place was trained before runs were keyed on their inputs; " \
               f"training anew ({name})"
    before = summary or runs.latest()
    if before is None:
        return f"first run ({name})"
    what = key.changes(Fingerprint.from_dict(before["fingerprint"]))
    return f"{what or 'the last run did not finish'}; training anew ({name})"


def _summary(variant: str) -> dict[str, Any] | None:
    """summary.json of the model in place, or None."""
    path = layout.summary_file(variant)
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError:
        return None  # half a file from an older version's crash: trained anew
    return summary if isinstance(summary, dict) else None


def _finished(variant: str, key: Fingerprint) -> dict[str, Any] | None:
    """The summary of the model in place when it finished training with ``key``'s inputs."""
    summary = _summary(variant)
    if summary is None or not summary.get("finished"):
        return None
    kept = summary.get("fingerprint")
    same = isinstance(kept, dict) and Fingerprint.from_dict(kept).digest == key.digest
    return summary if same else None


def _fit(cfg: Config, variant: str, inputs: ModelInputs, dev_doc: dict[str, Any],
         path: str, filesystem: Any, name: str) -> Any:
    """The Ray Train job, to its end; Ray Train's Result. A checkpoint store that fails
    mid-run is one RunError line, not Ray's traceback."""
    from rcpipe.cluster import train_job
    from rcpipe.train.progress import ProgressLog
    from rcpipe.train.worker import Job
    from rcpipe.trained.model_file import vocab_digest

    prepared = cfg.data.out_dir.resolve()
    with train_job.ray_cluster(cfg.train.ray_address):
        train_job.check_fits(cfg)  # before any job starts: Ray would wait forever
        job = Job(config=cfg.model_dump(mode="json"), variant=variant,
                  train_path=str(prepared / "train.parquet"),
                  dev_path=str(prepared / "dev.parquet"),
                  vocab_sha256=vocab_digest(cfg.data.out_dir))
        log.info("train %s: Ray Train job of %d worker(s), run storage %s%s/%s", variant,
                 cfg.train.num_workers, "s3://" if filesystem is not None else "", path, name)
        shown = ProgressLog(variant, layout.live_dir(variant))  # lines, the live dev curve
        with shared_progress() as bar:
            task = bar.add_task(f"train {variant}", total=cfg.train.epochs)
            try:
                result = train_job.fit(job, inputs, dev_doc, cfg, path, filesystem, name,
                                     lambda message: _show(bar, task, shown, message))
            except Exception as e:
                if (mistake := train_job.user_error(e)) is not None:
                    raise mistake from None  # a worker found it: one line, as here
                if (why := train_job.storage_failure(e)) is None:
                    raise
                raise RunError(cfg.train.storage_path or path, "", f"the checkpoint store "
                               f"failed ({why}): run the same command again once it is back, "
                               "to go on from the last checkpoint it recorded") from None
    return result


def _train_as_job(cfg: Config, variant: str, key: Fingerprint | None, force: bool,
                  run: str | None, detach: bool) -> dict[str, Any]:
    """`rcpipe train` in a Ray job (rcpipe.cluster.jobs_api); its summary, from the shared disk."""
    from rcpipe.cluster.jobs_api import submit_train

    # the job's log lines go to rcpipe.cluster.jobs_api' log
    submit_train(cfg, variant, force, run=run, detach=detach)
    summary = _finished(variant, key) if key is not None else _summary(variant)
    if summary is None or not summary.get("finished"):
        raise InputError(layout.summary_file(variant), "", "the Ray job finished but this "
                         "directory has no summary of these inputs' run: it must be on the "
                         "file system the cluster's nodes share")
    return summary


def _check_model_config(cfg: Config, variant: str, inputs: ModelInputs) -> None:
    """Build the model once here, so a bad size fails now, not on every Ray worker."""
    from rcpipe.models import build_model

    try:
        build_model(variant, cfg.models.of(variant), replace(inputs, vectors=None))
    except ValueError as e:
        raise InputError(cfg.source, f"models.{variant}", str(e)) from None


def _show(bar: Progress, task: TaskID, shown: ProgressLog, message: dict[str, Any]) -> None:
    """One progress message from rank 0 (a step, or a dev evaluation): logged and drawn
    by ``shown``, and the terminal's bar moves with every step message."""
    shown(message)
    if "eval" not in message:
        bar.update(task, completed=message["epoch"],
                   description=f"train {shown.variant} step {message['step']} loss "
                               f"{message['loss']:.3f} {message['examples_per_s']:.0f} ex/s")
