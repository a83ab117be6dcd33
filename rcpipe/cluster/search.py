"""`rcpipe tune VARIANT`: an ASHA search on Ray Tune, each trial one Ray Train job.

Ray Train V2 runs under Tune as the Ray documentation's "Hyperparameter Tuning with Ray Tune"
(Train V2) shows: each trial is a Tune function (``trial``) that lays its sampled settings
over the params, builds the same TorchTrainer `rcpipe train` fits (train_job.make_trainer)
and calls its ``fit()``; Ray Train's ``TuneReportCallback`` hands every report of rank 0
(the step and RANK_METRIC, at each evaluation) to Tune, where ASHA stops the trials that
trail at its rungs. A trial's Train run lives at ``<run>/trials/<trial id>``, so a trial
started again (the search resumed, Tuner.restore) resumes from its own checkpoints.

The trial functions take no CPU of their own (TRIAL_RESOURCES); the trials at once are as
many as the workers' CPUs (GPUs, fractions allowed) fit, by the search algorithm's
max_concurrent. Nothing here writes the stage's files: the trials' table comes back as
plain data (stages/tune.py writes it).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcpipe.config import Config, lay
from rcpipe.errors import InputError
from rcpipe.models import ModelInputs
from rcpipe.train.checkpoint import RANK_METRIC
from rcpipe.train.job import make_job

log = logging.getLogger(__name__)
EXPERIMENT = "search"  # the Tune run's folder under the search's storage
TRIALS = "trials"  # the trials' Ray Train runs: <storage>/trials/<trial id>/
# A trial function only waits on its Train job, whose workers hold the CPUs and GPUs. Tune
# refuses a trial of no resources at all, and any share of a CPU would leave the last
# trial's workers short of a whole one: it holds a MiB of Ray's memory resource instead.
TRIAL_RESOURCES = {"CPU": 0, "memory": 2**20}


@dataclass(frozen=True)
class Plan:
    """What a search runs: each trial's budget (``max_t`` of ``attr``, the steps or the
    training minutes a trial reports), ASHA's first rung, the resources of a trial."""

    attr: str  # "step" or "minutes": what ASHA counts a trial's progress in
    max_t: float
    grace: float
    eval_every: int
    cpus_per_worker: float
    gpus_per_worker: float
    concurrent: int

    @property
    def budget(self) -> str:
        """A trial's budget in words: "300 steps", "3 minutes"."""
        return f"{self.max_t:g} {'steps' if self.attr == 'step' else 'minutes'}"


def plan(cfg: Config, variant: str) -> Plan:
    """The search's plan on the cluster this process joined; a search that cannot run here
    (no budget, more GPUs or CPUs a trial than a node has) fails now, in one line.

    A budget in minutes (tune.max_minutes) ranks settings by what they reach in the time a
    run will have, as bench/accuracy.py compares them: a smaller model's extra steps count.
    A budget in steps ranks them at equal steps, the same on any machine."""
    import ray

    t, s = cfg.train, cfg.tune
    steps = s.max_steps or cfg.models.steps(variant, t.max_steps)
    if not (s.max_minutes or steps):
        raise InputError(cfg.source, "tune.max_steps", "a search needs a budget per trial "
                         "(ASHA's max_t): set tune.max_minutes, tune.max_steps or models."
                         f"{variant}.max_steps")
    every = s.eval_every or t.eval_every
    if s.max_minutes:
        if not every:  # a step budget's default, steps // 8, means nothing in minutes
            raise InputError(cfg.source, "tune.eval_every", "a budget in minutes needs the "
                             "steps between a trial's scores (ASHA decides at them): set "
                             "tune.eval_every or train.eval_every")
        attr, max_t = "minutes", s.max_minutes
        grace = min(max_t, s.grace_minutes or max_t / 4)
    else:
        every = every or max(1, steps // 8)
        attr, max_t = "step", steps
        grace = min(steps, s.grace_steps or max(every, steps // 4))
    cpus_trial = s.cpus_per_trial or (t.cpus_per_worker or 1) * t.num_workers
    have = ray.cluster_resources()
    cpus, gpus = have.get("CPU", 0), have.get("GPU", 0)
    node_gpus = max((n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]),
                    default=0)
    if s.gpus_per_trial > max(node_gpus, 1 if gpus else 0) and not _autoscales():
        raise InputError(cfg.source, "tune.gpus_per_trial", f"{s.gpus_per_trial:g} GPUs a "
                         f"trial, but the largest node of this Ray has {node_gpus:g}: a "
                         "trial's workers would wait for them forever")
    if cpus_trial > cpus and not _autoscales():
        raise InputError(cfg.source, "tune.cpus_per_trial", f"{cpus_trial:g} CPUs a trial, "
                         f"but this Ray has {cpus:g}")
    fit = int(cpus // cpus_trial) if cpus_trial else s.trials
    if s.gpus_per_trial:
        fit = min(fit, int(gpus // s.gpus_per_trial + 1e-9))
    return Plan(attr, max_t, grace, every, cpus_trial / t.num_workers,
                s.gpus_per_trial / t.num_workers,
                min(s.trials, s.max_concurrent or max(1, fit)))


def _autoscales() -> bool:
    """A joined cluster (train.ray_address, or a job on its head) may grow to fit a trial."""
    from rcpipe.cluster.ray_runtime import joined

    return joined() is not None


def param_space(cfg: Config, variant: str) -> dict[str, Any]:
    """tune.<variant>.space as Ray Tune's samplers, one flat key per dimension."""
    from ray import tune

    kinds = {"choice": lambda a: tune.choice(a), "uniform": lambda a: tune.uniform(*a),
             "loguniform": lambda a: tune.loguniform(*a),
             "randint": lambda a: tune.randint(a[0], a[1] + 1)}  # [lo, hi] both included
    return {key: kinds[kind](arg) for key, spec in cfg.tune.of(variant).space.items()
            for kind, arg in spec.items()}


def trial_config(cfg: Config, variant: str, sample: dict[str, Any], p: Plan) -> Config:
    """The params of one trial: its sample laid over ``cfg`` (shallower keys first, so an
    ``optim`` mapping comes before ``optim.ema_decay``), with the search's step budget."""
    data = cfg.model_dump(mode="json")
    sample = rounded(sample)
    for key in sorted(sample, key=lambda k: k.count(".")):
        section, path = ("train", key[6:]) if key.startswith("train.") else \
            ("models", f"{variant}.{key}")
        data[section] = lay(data[section], path, sample[key])
    # the budget is the variant's own limit (a variant's max_steps would cap the minutes)
    own = {"max_steps": 0, "max_minutes": p.max_t} if p.attr == "minutes" else \
        {"max_steps": int(p.max_t)}
    data["models"] = lay(data["models"], variant, own)
    data["train"] |= {"eval_every": p.eval_every, "cpus_per_worker": p.cpus_per_worker,
                      "threads": cfg.train.threads or max(1, math.floor(p.cpus_per_worker))}
    return Config.model_validate(data)  # the trial's own settings: validated here, once


def rounded(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample with its floats at 4 significant digits: what the trial trains with and the
    layer says are the same number, and a readable one."""
    return {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in sample.items()}


def _trial_dir(trial: Any) -> str:
    return str(trial.trial_id)  # not Tune's default, which spells out the settings


def chosen_layer(variant: str, sample: dict[str, Any]) -> dict[str, Any]:
    """A trial's settings as a params layer: only the searched keys, nested."""
    layer: dict[str, Any] = {}
    sample = rounded(sample)
    for key in sorted(sample, key=lambda k: k.count(".")):
        path = key if key.startswith("train.") else f"models.{variant}.{key}"
        layer = lay(layer, path, sample[key])
    return layer


def _recorder(groups: Any, trial_id: str) -> Any:
    """A Ray Train callback (in the trial's controller) that sends each placement group its
    worker group takes to the driver, under the trial's id.

    Tune ends a trial by ending its function's actor, and the Train controller with it: the
    workers' placement group outlives them (Ray scopes it to the job), and Train's own
    cleaner asks the State API, which a Ray without its dashboard (the local one) lacks, so
    the next trials would wait for those CPUs forever. The driver removes them instead
    (TrialLines). Ray Train lets a run's callbacks be its internal ones ("custom
    workarounds built on top of internal callbacks", DataParallelTrainer)."""
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback

    class _Record(WorkerGroupCallback):  # type: ignore[misc]
        def after_worker_group_start(self, worker_group: Any) -> None:
            pg = worker_group._worker_group_state.placement_group_handle.placement_group
            groups.put_nowait((trial_id, pg))

    return _Record()


def trial(sample: dict[str, Any], *, base: Config, variant: str, p: Plan,
          paths: dict[str, str], refs: dict[str, Any], storage: tuple[str, Any],
          groups: dict[str, Any]) -> None:
    """One trial (a Tune function): its Ray Train job to the end, every report to Tune;
    its workers' placement groups go to ``groups["queue"]`` (the driver removes them)."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from rcpipe.cluster import train_job

    cfg = trial_config(base, variant, sample, p)
    job = make_job(cfg, variant, paths)
    trial_id = tune.get_context().get_trial_id()
    trainer = train_job.make_trainer(
        job, cfg, refs | {"progress": None}, f"{storage[0]}/{TRIALS}", storage[1],
        name=trial_id, callbacks=(TuneReportCallback(), _recorder(groups["queue"], trial_id)),
        gpus_per_worker=p.gpus_per_worker)
    trainer.fit()


class TrialLines:
    """A line per finished trial with its score, and the trials' placement groups removed
    as they end (see _recorder): what the driver does at Tune's hooks (``callback``)."""

    def __init__(self, variant: str, trials: int, p: Plan, groups: Any) -> None:
        self.variant, self.trials, self.plan = variant, trials, p
        self.groups = groups  # the queue of (trial id, placement group) the trials fill
        self.done = 0
        self.held: dict[str, list[Any]] = {}  # trial id -> its placement groups
        self.ended: set[str] = set()
        self.drained = 0.0  # when the queue was last read (monotonic seconds)

    def callback(self) -> Any:
        """These lines as a Ray Tune Callback (RunConfig's callbacks)."""
        return _tune_callback(self)

    def step(self) -> None:
        """Tune's loop went round: read the queue, a second apart at most."""
        if time.monotonic() - self.drained > 1.0:
            self._drain()

    def trial_ended(self, trial: Any, failed: bool) -> None:
        """A trial finished, was stopped by ASHA or failed: its groups go, its line is said."""
        self.ended.add(trial.trial_id)
        self._drain()
        if failed:
            how = "failed"
        else:
            how = "finished" if ran_it_all(trial.last_result or {}, self.plan) \
                else "stopped by ASHA"
        self._line(trial, how)

    def release_all(self) -> None:
        """After the search: every trial ended, every placement group goes."""
        self._drain(every=True)

    def _drain(self, every: bool = False) -> None:
        """Read the queue; remove every placement group of a trial that ended (``every``: of
        every trial, the search being over).

        A stopped trial's controller may still see its workers go (their group removed) and
        start a new group before it dies itself: that group comes in after the trial ended,
        so it is removed here, not kept for ever."""
        from ray.util.placement_group import remove_placement_group
        from ray.util.queue import Empty

        self.drained = time.monotonic()
        while True:
            try:
                trial_id, pg = self.groups.get_nowait()
            except Empty:
                break
            self.held.setdefault(trial_id, []).append(pg)
        for trial_id in [t for t in self.held if every or t in self.ended]:  # held's order
            for pg in self.held.pop(trial_id):
                try:
                    remove_placement_group(pg)
                except Exception:  # noqa: BLE001, S110 - removed already by Train
                    pass

    def _line(self, trial: Any, how: str) -> None:
        self.done += 1
        last = trial.last_result or {}
        score = last.get(RANK_METRIC)
        log.info("tune %s: trial %d/%d %s %s at step %s: %s %s", self.variant, self.done,
                 self.trials, trial.trial_id, how, last.get("step", 0), RANK_METRIC,
                 f"{score:.2f}" if score is not None else "-")


def _tune_callback(lines: TrialLines) -> Any:
    """A Ray Tune Callback that hands its three hooks to ``lines`` (Tune's base class does
    nothing at the others). Made when a search runs: importing rcpipe loads no Ray."""
    from ray.tune import Callback

    class Hooks(Callback):  # type: ignore[misc]
        def on_step(self, iteration: int, trials: list[Any], **info: Any) -> None:
            lines.step()

        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any,
                              **info: Any) -> None:
            lines.trial_ended(trial, failed=False)

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any,
                           **info: Any) -> None:
            lines.trial_ended(trial, failed=True)

    return Hooks()


def run(cfg: Config, variant: str, inputs: ModelInputs, dev_doc: dict[str, Any],
        paths: dict[str, str], storage: tuple[str, Any], p: Plan
        ) -> tuple[list[dict[str, Any]], bool]:
    """The search, started or resumed at ``storage`` (path, pyarrow filesystem or None),
    to its end; every trial as plain data (see ``trials_table``), and whether every trial
    ended (False: the search was interrupted, Ctrl-C; the same command resumes it)."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    path, filesystem = storage
    # Tune's own table of trials and its banner stay off (RunConfig's verbose=0 alone does
    # not hold them back): a line per trial comes from TrialLines
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    from ray.util.queue import Queue

    groups = Queue(actor_options={"num_cpus": 0})  # the trials' placement groups
    trainable = tune.with_resources(tune.with_parameters(
        trial, base=cfg, variant=variant, p=p, paths=paths,
        refs={"inputs": ray.put(inputs), "dev_doc": ray.put(dev_doc)}, storage=storage,
        groups={"queue": groups}), TRIAL_RESOURCES)
    experiment = f"{path}/{EXPERIMENT}"
    lines = TrialLines(variant, cfg.tune.trials, p, groups)
    if tune.Tuner.can_restore(experiment, storage_filesystem=filesystem):
        log.info("tune %s: resuming the search at %s", variant, experiment)
        tuner = tune.Tuner.restore(experiment, trainable, resume_unfinished=True,
                                   resume_errored=True, storage_filesystem=filesystem)
    else:
        log.info("tune %s: %d trials, %d at once, up to %s each (ASHA: grace %g, 1/%g go "
                 "on), run storage %s", variant, cfg.tune.trials, p.concurrent, p.budget,
                 p.grace, cfg.tune.reduction_factor, experiment)
        tuner = tune.Tuner(
            trainable, param_space=param_space(cfg, variant),
            tune_config=tune.TuneConfig(
                metric=RANK_METRIC, mode="max", num_samples=cfg.tune.trials,
                trial_dirname_creator=_trial_dir,
                search_alg=BasicVariantGenerator(random_state=cfg.tune.seed,
                                                 max_concurrent=p.concurrent),
                scheduler=ASHAScheduler(time_attr=p.attr, max_t=p.max_t,
                                        grace_period=p.grace,
                                        reduction_factor=cfg.tune.reduction_factor)),
            run_config=tune.RunConfig(name=EXPERIMENT, storage_path=path,
                                      storage_filesystem=filesystem, verbose=0,
                                      callbacks=[lines.callback()]))
    t0 = time.perf_counter()
    grid = tuner.fit()
    lines.release_all()  # (a failed search ends its Ray job, which removes them all)
    ended = grid.num_terminated + grid.num_errors == len(grid)
    log.info("tune %s: search %s after %.1f min", variant, "done" if ended else
             "interrupted (the same command resumes it)", (time.perf_counter() - t0) / 60)
    return trials_table(grid, p), ended


def ran_it_all(last: dict[str, Any], p: Plan) -> bool:
    """Whether a trial's last report is at its budget's end (else ASHA stopped it); a
    time budget ends at the first evaluation past it."""
    return float(last.get(p.attr, 0)) >= p.max_t * (0.99 if p.attr == "minutes" else 1)


def trials_table(grid: Any, p: Plan) -> list[dict[str, Any]]:
    """Each trial of a ResultGrid: id, settings, status, best score and its step, steps
    (and training minutes) trained, and its curve: (seconds since the search began, step,
    score) per report."""
    frames = [(r, r.metrics_dataframe) for r in grid]
    starts = [f["timestamp"].min() for _, f in frames if f is not None and len(f)]
    began = min(starts) if starts else 0
    rows = []
    for result, frame in frames:
        curve: list[list[float]] = []
        last: dict[str, Any] = {}
        if frame is not None and RANK_METRIC in frame:
            frame = frame.dropna(subset=[RANK_METRIC])
            curve = [[float(t - began), int(step), float(score)] for t, step, score in
                     zip(frame["timestamp"], frame["step"], frame[RANK_METRIC], strict=True)]
            last = frame.iloc[-1].to_dict() if len(frame) else {}
        best = max(curve, key=lambda c: c[2], default=None)
        status = "failed" if result.error is not None else \
            "finished" if ran_it_all(last, p) else "stopped"
        rows.append({"id": (result.metrics or {}).get("trial_id", Path(result.path).name),
                     "settings": dict(result.config),
                     "status": status, "steps": curve[-1][1] if curve else 0,
                     "minutes": float(last.get("minutes") or 0.0),  # (NaN: not reported)
                     "best": best[2] if best else None, "best_step": best[1] if best else None,
                     "curve": curve})
    return sorted(rows, key=lambda r: r["id"])
