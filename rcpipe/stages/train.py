"""`rcpipe train VARIANT`: a Ray Train job (or a Ray job on a cluster's head, cluster/jobs_api.py).

A run is keyed on what it is trained from (rcpipe/fingerprints.py: the prepared data's
digests, the variant's settings, the train stage's code, rcpipe's version): the finished
model of the same fingerprint means nothing to do; an unfinished run of it is resumed;
anything else is a new run from step 0, announced with what changed. The last finished
model stays in place until the new run finishes.

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

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from rcpipe import fingerprints, layout, reads
from rcpipe.cluster import opening
from rcpipe.config import Config
from rcpipe.console import shared_progress
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError, RunError
from rcpipe.fingerprints import Fingerprint
from rcpipe.locks import hold
from rcpipe.outputs import OutputSet, output_set, settle

if TYPE_CHECKING:  # heavy (torch): imported where they are used
    from rich.progress import Progress, TaskID

    from rcpipe.models import ModelInputs
    from rcpipe.train.progress import ProgressLog
    from rcpipe.train.runs import Runs

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
    with hold(layout.model_dir(variant), f"{variant} is being trained", wait):
        settle(layout.model_dir(variant))  # a set a killed stage committed: whole first
        if key is not None and not force and (done := _finished(variant, key)) is not None:
            return _nothing_to_do(variant, done)
        if cfg.models.of(variant).seeds > 1:
            return _train_seeds(cfg, variant, key or _key(cfg, variant), force)
        kept = layout.seed_dir(variant, cfg.train.seed)  # a run of several seeds' first
        if key is not None and not force and (done := _finished_in(kept, key)) is not None:
            _copy_run(kept, layout.model_dir(variant))  # back to one seed trains nothing
            return _nothing_to_do(variant, done)
        return _train_here(cfg, variant, key, force)


def _key(cfg: Config, variant: str) -> Fingerprint:
    """What a run of ``variant`` is trained from: the train stage's row of the table
    (rcpipe/fingerprints.py `of_stage`)."""
    return fingerprints.of_stage(cfg, "train", variant)


def _nothing_to_do(variant: str, summary: dict[str, Any]) -> dict[str, Any]:
    log.info("train %s: already finished with these inputs (%s); nothing to do", variant,
             layout.summary_file(variant))
    return summary


def _train_here(cfg: Config, variant: str, key: Fingerprint | None, force: bool,
                out: Path | None = None) -> dict[str, Any]:
    """The Ray Train job from this driver, to the model in place (under the lock), or to
    ``out`` (one run of a variant of several: _train_seeds)."""
    from rcpipe.cluster import train_job
    from rcpipe.train.checkpoint import RANK_METRIC, finish_run, first_whole, read_meta, step_of
    from rcpipe.train.runs import Runs, run_name

    inputs = opening.model_inputs(cfg)
    key = key or _key(cfg, variant)
    opening.check_build(cfg, variant, inputs, f"models.{variant}",
                        lambda: cfg.models.of(variant))
    runs, name = Runs(variant), run_name(key)
    out = out or layout.model_dir(variant)
    storage = opening.run_storage(cfg, variant, layout.runs_dir(variant))
    path, filesystem = storage
    log.info("train %s: %s", variant, _why(out, key, runs, name, force))
    if force or (runs.get(name) or {}).get("finished"):  # a finished run's storage is spent
        opening.forget(storage, name)
    runs.started(name, key)
    stored = train_job.latest_step(path, filesystem, name)  # where a resumed run goes on from
    dev_doc = opening.dev_document(cfg)
    t0 = time.perf_counter()
    result, attempt = _fit(cfg, variant, inputs, dev_doc, path, filesystem, name,
                           out / layout.LIVE)
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
        by_step, by_rank = train_job.stored_checkpoints(f"{path}/{name}", filesystem), None
        if not by_step:
            raise InputError(Prepared(cfg.data.out_dir).train, "",
                             "training produced no checkpoint (no batch to train on?)")
    with ExitStack() as fetched:
        def dirs(checkpoints: list[Any]) -> Iterator[Path]:
            for c in checkpoints:
                yield Path(fetched.enter_context(c.as_directory()))

        def say(line: str) -> None:
            log.warning("train %s: %s", variant, line)

        # each checkpoint verified before use (a broken one passed by with a line): the
        # latest gives the run's facts, the best by RANK_METRIC its model
        last = first_whole(dirs(by_step), say)
        if by_rank is None and last is not None:
            best_step = read_meta(last)["best"]["step"]
            by_rank = sorted(by_step, key=lambda c: step_of(PurePosixPath(c.path).name)
                             != best_step)
        best = first_whole(dirs(by_rank or []), say)
        if last is None or best is None:
            raise RunError(result.path, "", "no whole checkpoint: every one is broken")
        meta = read_meta(last)
        # "finished" and the fingerprint: asked for again, the run is done (_finished)
        # a run resumed at its last step trains none and writes no checkpoint: its
        # latest one's meta names the attempt before
        resumed = meta["resumed_from_step"] if meta.get("attempt") == attempt else stored
        summary = finish_run(variant, out, meta, best,
                             time.perf_counter() - t0, checkpoints=result.path,
                             finished=True, run=name, fingerprint=key.as_dict(),
                             resumed_from_step=resumed)
    runs.finished(name)
    for old in runs.stale(cfg.train.keep_runs, name):  # train.keep_runs: the newest kept
        opening.forget(storage, old)
        runs.drop(old)
    return summary


def _train_seeds(cfg: Config, variant: str, key: Fingerprint, force: bool
                 ) -> dict[str, Any]:
    """models.<variant>.seeds runs (train.seed, + 1, ...), each keyed and trained as a
    variant of one run is, into models/<variant>/seeds/<seed>/ where it stays: a finished
    one is not trained again (from 3 seeds to 4 trains one; an interrupted run resumes),
    and the first is the run a single seed would train. Then the model in place holds every
    run's weights and answers with their mean distributions (models/seed_mean.py)."""
    done = []
    for k in range(cfg.models.of(variant).seeds):
        one = _one_seed(cfg, variant, k)
        out, one_key = layout.seed_dir(variant, one.train.seed), _key(one, variant)
        settle(out)  # a seed's set a killed stage committed: whole first
        if k == 0 and not force and _finished(variant, one_key) is not None:
            _copy_run(layout.model_dir(variant), out)  # the model in place is this run
        found = None if force else _finished_in(out, one_key)
        if found is not None:
            log.info("train %s: seed %d already finished with these inputs (%s)", variant,
                     one.train.seed, out)
        done.append((out, found or _train_here(one, variant, one_key, force, out)))
    return _seeds_together(cfg, variant, key, done)


def _copy_run(source: Path, out: Path) -> None:
    """A finished run's files (model, summary, curve, live/) from ``source`` to ``out``, as
    one set: the model in place to a seed's folder (from one seed to several trains only
    the others) or back (from several to the first alone trains nothing)."""
    with output_set("train", [out]) as files:
        _copy_files(files, source, out, (layout.MODEL, layout.SUMMARY, layout.CURVE))


def _copy_files(files: OutputSet, source: Path, out: Path, names: tuple[str, ...]) -> None:
    """``names`` of a run's folder and every file of its live/, from ``source`` to ``out``
    in the set ``files`` (those that are there)."""
    for f in [*(source / n for n in names), *sorted((source / layout.LIVE).rglob("*"))]:
        if f.is_file():
            files.copy(out / f.relative_to(source), f)


def _one_seed(cfg: Config, variant: str, k: int) -> Config:
    """The config of the ``k``-th run of a variant of several: train.seed + k, one network."""
    one = cfg.models.of(variant).model_copy(update={"seeds": 1})
    return cfg.model_copy(update={
        "train": cfg.train.model_copy(update={"seed": cfg.train.seed + k}),
        "models": cfg.models.model_copy(update={variant: one})})


def _seeds_together(cfg: Config, variant: str, key: Fingerprint,
                    done: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """The model in place from the seeds' runs: their weights side by side (``replicas.<k>.``,
    models/seed_mean.py), the summary their facts (the cost summed: every run was paid
    for), the curve and live/ the first run's with every run's curve beside."""
    import torch

    from rcpipe.trained.model_file import read_payload, side_by_side

    payload = side_by_side([read_payload(out / layout.MODEL, cfg.limits) for out, _ in done])
    runs = [s for _, s in done]
    summary = {
        "variant": variant, "seeds": [
            {"seed": cfg.train.seed + k} | {f: s.get(f) for f in (
                "run", "steps", "best_step", "best_dev_em", "best_dev_f1", "best_heldout_f1",
                "wall_seconds")} for k, s in enumerate(runs)],
        "world_size": runs[0]["world_size"], "device": runs[0]["device"],
        "steps": sum(s["steps"] for s in runs), "epochs": sum(s["epochs"] for s in runs),
        "wall_seconds": round(sum(s["wall_seconds"] for s in runs), 2),
        "train_seconds": round(sum(s["train_seconds"] for s in runs), 2),
        "examples_per_s": sum(s["examples_per_s"] for s in runs) / len(runs),
        "ranked_on": runs[0].get("ranked_on"), "run": ",".join(s.get("run", "") for s in runs),
        "finished": True, "fingerprint": key.as_dict()}
    model_dir, first = layout.model_dir(variant), done[0][0]
    with output_set("train", [model_dir]) as files:
        torch.save(payload, files.path(model_dir / layout.MODEL))  # staged with the rest
        files.write_json(model_dir / layout.CURVE, {
            "history": runs[0]["history"],
            "seeds": {str(cfg.train.seed + k): s["history"] for k, s in enumerate(runs)}})
        files.write_json(model_dir / layout.SUMMARY, summary)
        _copy_files(files, first, model_dir, ())  # the first run's live/
    log.info("train %s: %d runs (seeds %s) -> %s, answering with their mean distributions; "
             "best dev F1 of each %s", variant, len(runs),
             ", ".join(str(s["seed"]) for s in summary["seeds"]), layout.model_file(variant),
             ", ".join(f"{s['best_dev_f1']:.2f}" for s in runs))
    return summary


def trained_is_current(cfg: Config, variant: str) -> bool:
    """Whether the model in place finished training from cfg's inputs: `train` would do
    nothing (the flow starts no Ray for such a variant)."""
    if not Prepared(cfg.data.out_dir).train.is_dir():
        return False
    return _finished(variant, _key(cfg, variant)) is not None


def _why(out: Path, key: Fingerprint, runs: Runs, name: str, force: bool) -> str:
    """The one line that says why this run trains: resumed, or anew and what changed."""
    if force:
        return f"--force: training anew ({name})"
    if (found := runs.get(name)) is not None and not found.get("finished"):
        return f"resuming {name}, whose inputs are these, from its latest checkpoint"
    summary = _summary(out)
    if summary is not None and "fingerprint" not in summary:
        return f"the model in place was trained before runs were keyed on their inputs; " \
               f"training anew ({name})"
    before = summary or runs.latest()
    if before is None:
        return f"first run ({name})"
    what = key.changes(Fingerprint.from_dict(before["fingerprint"]))
    return f"{what or 'the last run did not finish'}; training anew ({name})"


def _summary(folder: Path) -> dict[str, Any] | None:
    """summary.json of the model in ``folder`` (models/<variant>/, a seed's), or None."""
    path = folder / layout.SUMMARY
    if not path.is_file():
        return None
    try:
        summary = reads.read_json(path)
    except InputError:
        return None  # half a file from an older version's crash: trained anew
    return summary if isinstance(summary, dict) else None


def _finished(variant: str, key: Fingerprint) -> dict[str, Any] | None:
    """The summary of the model in place when it finished training with ``key``'s inputs."""
    return _finished_in(layout.model_dir(variant), key)


def _finished_in(folder: Path, key: Fingerprint) -> dict[str, Any] | None:
    """The summary in ``folder`` (models/<variant>/, a seed's) when its run finished
    training with ``key``'s inputs."""
    summary = _summary(folder)
    if summary is None or not summary.get("finished"):
        return None
    kept = summary.get("fingerprint")
    same = isinstance(kept, dict) and Fingerprint.from_dict(kept).digest == key.digest
    return summary if same else None


def _finished_by_job(variant: str, key: Fingerprint | None) -> dict[str, Any] | None:
    """The summary the Ray job left here: of these inputs' run (any finished run's, when
    the prepared data is not here to key it on)."""
    summary = _finished(variant, key) if key is not None \
        else _summary(layout.model_dir(variant))
    return summary if summary is not None and summary.get("finished") else None


def _fit(cfg: Config, variant: str, inputs: ModelInputs, dev_doc: dict[str, Any],
         path: str, filesystem: Any, name: str, live: Path) -> tuple[Any, str]:
    """The Ray Train job, to its end; Ray Train's Result and the job's attempt (the token
    its checkpoints' meta carries). A checkpoint store that fails
    mid-run is one RunError line, not Ray's traceback."""
    from rcpipe.cluster import train_job
    from rcpipe.train.job import make_job
    from rcpipe.train.progress import ProgressLog

    with opening.on_ray(cfg):
        train_job.check_fits(cfg)  # before any job starts: Ray would wait forever
        job = make_job(cfg, variant, opening.job_data(cfg))
        log.info("train %s: Ray Train job of %d worker(s), run storage %s%s/%s", variant,
                 cfg.train.num_workers, "s3://" if filesystem is not None else "", path, name)
        shown = ProgressLog(variant, live)  # lines, the live dev curve
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
    return result, job.attempt


def _show(bar: Progress, task: TaskID, shown: ProgressLog, message: dict[str, Any]) -> None:
    """One progress message from rank 0 (a step, or a dev evaluation): logged and drawn
    by ``shown``, and the terminal's bar moves with every step message."""
    shown(message)
    if "loss" in message and "eval" not in message:  # a step's (not an evaluation, a note)
        bar.update(task, completed=message["epoch"],
                   description=f"train {shown.variant} step {message['step']} loss "
                               f"{message['loss']:.3f} {message['examples_per_s']:.0f} ex/s")


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
