"""`rcpipe train VARIANT`: a Ray Train job (or a Ray job on a cluster's head, train/jobs.py).

Layout (the command contract): models/<variant>/checkpoints/step-<n>/ (Ray Train's run
storage: the best K by dev F1 and the latest; or under train.storage_path, e.g. S3),
models/<variant>/model.pt (the best weights by dev F1, EMA weights where the variant keeps
an EMA), models/<variant>/summary.json and metrics.json (the dev curve, at the end),
models/<variant>/live/ (the same curve as it happens: dvclive's files). Messages go to the
``rcpipe.stages.train`` and ``rcpipe.train.progress`` loggers. Training code is imported
inside the functions: `rcpipe predict` and the service import the stages but not rcpipe.train.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcpipe import layout
from rcpipe.config import Config
from rcpipe.console import shared_progress
from rcpipe.errors import InputError, RunError
from rcpipe.stages.io import load_dataset

if TYPE_CHECKING:  # heavy (torch): imported where they are used
    from rich.progress import Progress, TaskID

    from rcpipe.models import ModelInputs
    from rcpipe.train.progress import ProgressLog

log = logging.getLogger(__name__)


def _model_inputs(cfg: Config) -> ModelInputs:
    from rcpipe.eval.trained import prepared_inputs

    d = cfg.data.out_dir
    if not (d / "train.parquet").is_file():
        raise InputError(d, "", "no prepared data; run `rcpipe prepare` first")
    return prepared_inputs(d, cfg.data.word_dim)


def train(cfg: Config, variant: str, force: bool = False, run: str | None = None,
          detach: bool = False) -> dict[str, Any]:
    """Train one variant as a Ray Train job; resume from its latest checkpoint if any.

    ``force`` starts over: the local checkpoints and summary are removed first. Through a
    cluster's Jobs API, ``run`` names the run whose Ray job this is (one job per run and
    variant) and ``detach`` leaves the job running if the submitter is interrupted
    (rcpipe.train.job_runs).
    """
    from rcpipe.train import cluster
    from rcpipe.train.checkpoint import RANK_METRIC, finish_run, read_meta
    from rcpipe.train.jobs import jobs_api_address

    cfg.models.of(variant)  # an unknown variant is the user's mistake, found before Ray starts
    cluster.check_train_v2()  # before anything is deleted, loaded or started
    if jobs_api_address(cfg):  # the run is a Ray job on the cluster's head
        return _train_as_job(cfg, variant, force, run, detach)
    out = layout.model_dir(variant)
    summary_path = out / "summary.json"
    if force:
        cluster.forget_run(*cluster.storage(cfg, variant, out))
        shutil.rmtree(out, ignore_errors=True)
    if (done := _finished(summary_path)) is not None:
        log.info("train %s: already finished (%s); nothing to do", variant, summary_path)
        return done
    inputs = _model_inputs(cfg)
    _check_model_config(cfg, variant, inputs)
    dev_doc = load_dataset(cfg.data.dev_file, cfg.data.cache_dir)
    t0 = time.perf_counter()
    result = _fit(cfg, variant, inputs, dev_doc, out)
    if result.checkpoint is None:
        raise InputError(cfg.data.out_dir / "train.parquet", "",
                         "training produced no checkpoint (no batch to train on?)")
    with result.checkpoint.as_directory() as d:
        meta = read_meta(Path(d))
    best = result.get_best_checkpoint(RANK_METRIC, "max") or result.checkpoint
    with best.as_directory() as d:
        # "finished": asked for again, the run is done (_finished)
        return finish_run(variant, out, meta, Path(d), time.perf_counter() - t0,
                          checkpoints=result.path, finished=True)


def _fit(cfg: Config, variant: str, inputs: ModelInputs, dev_doc: dict[str, Any],
         out: Path) -> Any:
    """The Ray Train job, to its end; Ray Train's Result. A checkpoint store that fails
    mid-run is one RunError line, not Ray's traceback."""
    from rcpipe.eval.trained import vocab_digest
    from rcpipe.train import cluster
    from rcpipe.train.progress import ProgressLog
    from rcpipe.train.worker import Job

    prepared = cfg.data.out_dir.resolve()
    with cluster.ray_cluster(cfg.train.ray_address):
        cluster.check_fits(cfg)  # before any job starts: Ray would wait forever
        job = Job(config=cfg.model_dump(mode="json"), variant=variant,
                  train_path=str(prepared / "train.parquet"),
                  dev_path=str(prepared / "dev.parquet"),
                  vocab_sha256=vocab_digest(cfg.data.out_dir))
        path, filesystem = cluster.storage(cfg, variant, out)
        log.info("train %s: Ray Train job of %d worker(s), run storage %s%s", variant,
                 cfg.train.num_workers, "s3://" if filesystem is not None else "", path)
        shown = ProgressLog(variant, layout.live_dir(variant))  # lines, the live dev curve
        with shared_progress() as bar:
            task = bar.add_task(f"train {variant}", total=cfg.train.epochs)
            try:
                result = cluster.fit(job, inputs, dev_doc, cfg, path, filesystem,
                                     lambda message: _show(bar, task, shown, message))
            except Exception as e:
                if (why := cluster.storage_failure(e)) is None:
                    raise
                raise RunError(cfg.train.storage_path or path, "", f"the checkpoint store "
                               f"failed ({why}): run the same command again once it is back, "
                               "to go on from the last checkpoint it recorded") from None
    return result


def _finished(summary_path: Path) -> dict[str, Any] | None:
    """The summary of a run that finished, or None."""
    if not summary_path.is_file():
        return None
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    return summary if summary.get("finished") else None


def _train_as_job(cfg: Config, variant: str, force: bool, run: str | None,
                  detach: bool) -> dict[str, Any]:
    """`rcpipe train` in a Ray job (rcpipe.train.jobs); its summary, from the shared disk."""
    from rcpipe.train.jobs import submit_train

    # the job's log lines go to rcpipe.train.jobs' log
    submit_train(cfg, variant, force, run=run, detach=detach)
    summary_path = layout.model_dir(variant) / "summary.json"
    if (summary := _finished(summary_path)) is None:
        raise InputError(summary_path, "", "the Ray job finished but this directory has no "
                         "summary: it must be on the file system the cluster's nodes share")
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
