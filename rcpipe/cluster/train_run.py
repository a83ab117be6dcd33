"""One training run of one network on Ray Train, from this driver to its finished model
(`rcpipe train`: train/seeds.py hands it each run of a variant).

The run is named after its key (train/runs.py) in the variant's run storage
(models/<variant>/runs/, or under train.storage_path): resumed where its storage holds
checkpoints, or trained anew (--force, or a finished run's spent storage), said in one line;
fitted as one Ray Train job (train_job.py's ``fit``; rank 0's progress drawn on the
terminal's bar and logged by train/progress.py); then its model and summary from the
checkpoints Ray's result names (``picked``), and the runs beyond train.keep_runs forgotten.
Ray is imported inside train_job's functions: importing this loads none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from rcpipe import layout
from rcpipe.cluster import opening, train_job
from rcpipe.config import Config
from rcpipe.console import shared_progress
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError, RunError
from rcpipe.fingerprints import Fingerprint
from rcpipe.train.checkpoint import RANK_METRIC, finish_run, first_whole, read_meta, step_of
from rcpipe.train.job import make_job
from rcpipe.train.progress import ProgressLog
from rcpipe.train.runs import Runs, run_name, why

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from rcpipe.models import ModelInputs

log = logging.getLogger(__name__)


def train_run(cfg: Config, key: Fingerprint, out: Path, *, variant: str, force: bool,
              model: str = "", teacher: Path | None = None) -> dict[str, Any]:
    """The run of ``key`` (cfg: one network's) to its end, its model and summary in ``out``
    (the model in place, or a seed's folder); ``force``: its checkpoints removed first.
    ``model``: the model's name, where its runs live (default ``variant``: the student of
    `rcpipe distill` is another); ``teacher``: a student's targets (data/teacher.py)."""
    model = model or variant
    inputs = opening.model_inputs(cfg)
    opening.check_build(cfg, variant, inputs, f"models.{variant}",
                        lambda: cfg.models.of(variant))
    runs, name = Runs(model), run_name(key)
    storage = opening.run_storage(cfg, model, layout.runs_dir(model))
    path, filesystem = storage
    log.info("train %s: %s", model, why(out, key, runs, name, force))
    if force or (runs.get(name) or {}).get("finished"):  # a finished run's storage is spent
        opening.forget(storage, name)
    runs.started(name, key)
    stored = train_job.latest_step(path, filesystem, name)  # where a resumed run goes on from
    dev_doc = opening.dev_document(cfg)
    t0 = time.perf_counter()
    result, attempt = _fit(cfg, variant, inputs, dev_doc, path, filesystem, name,
                           out / layout.LIVE, model, teacher)

    def say(line: str) -> None:
        log.warning("train %s: %s", model, line)

    with picked(result, f"{path}/{name}", filesystem, say,
                Prepared(cfg.data.out_dir).train) as (last, best):
        meta = read_meta(last)
        # "finished" and the fingerprint: asked for again, the run is done (train/runs.py)
        # a run resumed at its last step trains none and writes no checkpoint: its
        # latest one's meta names the attempt before
        resumed = meta["resumed_from_step"] if meta.get("attempt") == attempt else stored
        summary = finish_run(variant, out, meta, best,
                             time.perf_counter() - t0, checkpoints=result.path,
                             finished=True, run=name, fingerprint=key.as_dict(),
                             resumed_from_step=resumed,
                             **({"model": model} if model != variant else {}))
    runs.finished(name)
    for old in runs.stale(cfg.train.keep_runs, name):  # train.keep_runs: the newest kept
        opening.forget(storage, old)
        runs.drop(old)
    return summary


@contextmanager
def picked(result: Any, run: str, filesystem: Any, say: Callable[[str], None],
           data: Path) -> Iterator[tuple[Path, Path]]:
    """The run's latest whole checkpoint (its facts) and its best whole one by RANK_METRIC
    (its model), fetched for the block, from Ray Train's ``result`` of the run stored at
    ``run``; each verified before use, a broken one passed by with a line to ``say``.
    ``data``: the prepared data, named when the run trained nothing at all."""
    if result.checkpoint is not None:  # Ray's record: the latest, and the kept ones
        kept = list(result.best_checkpoints)
        by_step = [result.checkpoint, *[c for c, _ in sorted(
            kept, key=lambda cm: cm[1].get("step", 0), reverse=True)]]
        by_rank = [c for c, _ in sorted(
            kept, key=lambda cm: cm[1].get(RANK_METRIC, float("-inf")), reverse=True)]
    else:
        # a run resumed at its end trains nothing and reports no checkpoint: where its
        # controller never recorded the last ones (killed between a worker storing and the
        # controller recording them), the stored ones are the run's, newest first, and the
        # best is the one the latest's meta names
        by_step, by_rank = train_job.stored_checkpoints(run, filesystem), None
        if not by_step:
            raise InputError(data, "", "training produced no checkpoint (no batch to train on?)")
    with ExitStack() as fetched:
        def dirs(checkpoints: list[Any]) -> Iterator[Path]:
            for c in checkpoints:
                yield Path(fetched.enter_context(c.as_directory()))

        last = first_whole(dirs(by_step), say)
        if by_rank is None and last is not None:
            best_step = read_meta(last)["best"]["step"]
            by_rank = sorted(by_step, key=lambda c: step_of(PurePosixPath(c.path).name)
                             != best_step)
        best = first_whole(dirs(by_rank or []), say)
        if last is None or best is None:
            raise RunError(result.path, "", "no whole checkpoint: every one is broken")
        yield last, best


def _fit(cfg: Config, variant: str, inputs: ModelInputs, dev_doc: dict[str, Any],
         path: str, filesystem: Any, name: str, live: Path, model: str,
         teacher: Path | None) -> tuple[Any, str]:
    """The Ray Train job, to its end; Ray Train's Result and the job's attempt (the token
    its checkpoints' meta carries). A checkpoint store that fails
    mid-run is one RunError line, not Ray's traceback."""
    with opening.on_ray(cfg):
        train_job.check_fits(cfg)  # before any job starts: Ray would wait forever
        job = make_job(cfg, variant, opening.job_data(cfg),
                       str(teacher.resolve()) if teacher is not None else "")
        log.info("train %s: Ray Train job of %d worker(s), run storage %s%s/%s", model,
                 cfg.train.num_workers, "s3://" if filesystem is not None else "", path, name)
        shown = ProgressLog(model, live)  # lines, the live dev curve
        with shared_progress() as bar:
            task = bar.add_task(f"train {model}", total=cfg.train.epochs)
            try:
                result = train_job.fit(job, inputs, dev_doc, cfg, path, filesystem, name,
                                       lambda message: _show(bar, task, shown, message))
            except Exception as e:
                if (mistake := train_job.user_error(e)) is not None:
                    raise mistake from None  # a worker found it: one line, as here
                if (why_not := train_job.storage_failure(e)) is None:
                    raise
                raise RunError(cfg.train.storage_path or path, "", f"the checkpoint store "
                               f"failed ({why_not}): run the same command again once it is "
                               "back, to go on from the last checkpoint it recorded") from None
    return result, job.attempt


def _show(bar: Progress, task: TaskID, shown: ProgressLog, message: dict[str, Any]) -> None:
    """One progress message from rank 0 (a step, or a dev evaluation): logged and drawn
    by ``shown``, and the terminal's bar moves with every step message."""
    shown(message)
    if "loss" in message and "eval" not in message:  # a step's (not an evaluation, a note)
        bar.update(task, completed=message["epoch"],
                   description=f"train {shown.variant} step {message['step']} loss "
                               f"{message['loss']:.3f} {message['examples_per_s']:.0f} ex/s")
