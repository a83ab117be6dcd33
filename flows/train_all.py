"""The `train-all` Prefect flow: the pipeline's stages in the table's order
(rcpipe/pipeline/stages.py, the table dvc.yaml is made from): fetch -> prepare -> train +
evaluate each variant -> ensemble -> distill (where distill.student names a student) ->
report.

Every task is one call into rcpipe.stages, so `dvc repro`, the CLI and this flow run the
same code. A re-run skips what is done: prepare when its output matches the params and
inputs, a variant whose model finished training from the same inputs (its fingerprint,
rcpipe/fingerprints.py), evaluate, ensemble and report when what they read is unchanged;
an interrupted variant resumes from its checkpoint, a variant whose inputs changed trains
anew (rcpipe.stages.train). A variant's stages run as one chain (its train, then its
evaluate); variants train concurrently when the Ray cluster has room for more than one job,
one after another otherwise. rcpipe's log lines (each stage's, and a training run's
progress and dev evaluations) show in the Prefect UI under the task run that logged them
(flows/logs.py).

Run it as a deployment (`prefect deployment run train-all/local`, see prefect.yaml) or
directly: `python -m flows.train_all --params params.demo.yaml --synth`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import time
from collections.abc import Callable
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.logs import rcpipe_logs_to_prefect
from rcpipe import layout, stages
from rcpipe.config import VARIANTS, Config, load_config
from rcpipe.pipeline.stages import STAGES, Stage

if TYPE_CHECKING:
    from prefect.futures import PrefectFuture

T = TypeVar("T")

# the registry's names (rcpipe/variants.py): Prefect validates the parameter against them
Variant = Literal[VARIANTS]  # type: ignore[valid-type]


@task(cache_policy=NO_CACHE)
def synth(cfg: Config) -> None:
    stages.synth(cfg)


def _step_name() -> str:
    from prefect.runtime import task_run

    args = task_run.parameters
    return "-".join(filter(None, (args["name"], args.get("variant"))))


@task(cache_policy=NO_CACHE, task_run_name=_step_name)
def step(cfg: Config, name: str, variant: str = "") -> Any:
    """A stage of the table that needs no task of its own (`TASKS`): the function `rcpipe
    <name> [variant]` calls, the stage's name in its entry module."""
    function = getattr(importlib.import_module(STAGE[name].module), name)
    return function(cfg, *([variant] if variant else []))


# fetch downloads SQuAD and GloVe: retried with backoff
fetch = step.with_options(name="fetch", retries=2, retry_delay_seconds=[10, 60])


@task(cache_policy=NO_CACHE)
def prepare(cfg: Config) -> dict[str, Any]:
    changed = stages.prepared_changes(cfg)
    if changed is None:
        get_run_logger().info("prepare: %s is current; skipped", cfg.data.out_dir)
        return {"skipped": True}
    get_run_logger().info("prepare: %s; preparing", changed)
    return stages.prepare(cfg)


# a retry resumes from the last checkpoint instead of starting over; through a Jobs API it
# follows the run's unfinished Ray job (its log stream lost) instead of submitting another
@task(cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5, task_run_name="train-{variant}")
def train(cfg: Config, variant: str, run: str | None = None) -> dict[str, Any]:
    return stages.train(cfg, variant, run=run)


@task(cache_policy=NO_CACHE)
def ensemble(cfg: Config, variants: list[str]) -> dict[str, Any]:
    """The vote of this run's variants (not of every nbest file lying in predictions/)."""
    return stages.ensemble(cfg, [layout.nbest(v) for v in variants])


STAGE = {s.name: s for s in STAGES}


def _single(s: Stage, cfg: Config, variants: list[str]) -> Any:
    """Run a stage that is not per variant; its result."""
    if s.name == "fetch":
        return fetch(cfg, s.name)
    if s.name == "prepare":
        return prepare(cfg)
    if s.name == "ensemble":  # one variant: nothing to vote
        return ensemble(cfg, variants) if len(variants) > 1 else None
    if s.name == "distill":  # a student of the ensemble, where the params name one
        return step(cfg, s.name) if cfg.distill.student and len(variants) > 1 else None
    return step(cfg, s.name)


def _submit_one(s: Stage, cfg: Config, variant: str, run: str, after: list[Any]
                ) -> PrefectFuture[Any]:
    """Submit a per-variant stage of ``variant``, to start once ``after`` have finished."""
    if s.name == "train":
        return train.submit(cfg, variant, run, wait_for=after)
    return step.submit(cfg, s.name, variant, wait_for=after)


@task(cache_policy=NO_CACHE)
def artifacts(scores: dict[str, dict[str, Any]], seconds: dict[str, float],
           report_html: str | None = None) -> None:
    """Prefect artifacts: the EM/F1 table and a markdown report by question type."""
    from flows.report import by_type_markdown, report_link_markdown, score_rows

    create_table_artifact(key="train-all-scores", table=score_rows(scores),
                          description="Dev EM/F1 of every variant and the ensemble")
    create_markdown_artifact(key="train-all-report",
                             markdown=by_type_markdown(scores, layout.METRICS, seconds)
                             + (report_link_markdown(report_html) if report_html else ""),
                             description="train-all: scores, F1 by question type, timings")


@flow(name="train-all", log_prints=True)
def train_all(
    params: str = "params.demo.yaml",
    variants: list[Variant] = list(VARIANTS),  # noqa: B006 - Prefect copies parameters
    overrides: list[str] | None = None,
    synth_data: bool = False,
    workdir: str | None = None,
    ray_address: str | None = None,
    storage_path: str | None = None,
    version: bool = False,
    run_name: str | None = None,
    min_gain: float | None = None,
) -> dict[str, Any]:
    """Train and evaluate ``variants``, ensemble them, report.

    params: the params file (relative to the deployment's directory); overrides: extra
    ``dotted.key=value`` settings as for ``rcpipe --set``; synth_data: run `rcpipe synth`
    first (the demo preset's data); workdir: where data/, models/, predictions/ and
    metrics/ go (default: the current directory); ray_address / storage_path: a Ray
    cluster to join and checkpoint storage (s3://...), as train.ray_address and
    train.storage_path; version: afterwards commit the DVC state, push it to the DVC
    remote and run the champion gate (flows/version.py; the workdir must be the DVC
    workspace and params its params.yaml); run_name: through a Jobs API, the run whose Ray
    jobs these are (default: this flow run's id), as `rcpipe train --run-name`; min_gain:
    the champion gate's version.min_gain (F1 points the interval's lower end must clear).
    """
    params_path = Path(params).resolve()
    sets = list(overrides or [])
    sets += [f"train.ray_address={ray_address}"] if ray_address else []
    sets += [f"train.storage_path={storage_path}"] if storage_path else []
    sets += [f"version.min_gain={min_gain}"] if min_gain is not None else []
    if workdir:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    # back to the caller's directory afterwards: an in-process run (make demo, tests) must
    # not leave the whole process working elsewhere
    with contextlib.chdir(workdir or "."), rcpipe_logs_to_prefect():  # stage lines in the UI
        return _run(params_path, sets, list(variants), synth_data, version, run_name)


def _run(params_path: Path, sets: list[str], variants: list[str], synth_data: bool,
         version: bool, run_name: str | None) -> dict[str, Any]:
    from prefect.runtime import flow_run

    cfg = load_config(params_path, sets)
    # one Ray job per run and variant: a retried task or a rescheduled flow run follows it
    run = stages.check_run_name(run_name) if run_name else str(flow_run.get_id())
    seconds: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., T], *args: Any) -> T:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            seconds[name] = round(time.perf_counter() - t0, 2)

    if synth_data:
        timed("synth", synth, cfg)
    done: dict[str, Any] = {}  # stage -> its result; a per-variant one's: variant -> result
    for per_variant, rows in groupby(STAGES, key=lambda s: s.per_variant):
        group = list(rows)
        if not per_variant:
            for s in group:
                done[s.name] = timed(s.name, _single, s, cfg, variants)
            continue
        results, failed = timed("+".join(s.name for s in group), _variants, cfg, group,
                                variants, run)
        if failed:  # nothing is versioned: yesterday's models and champion stay
            kept = "; nothing versioned, the champion stays" if version else ""
            raise RuntimeError(f"train-all: {len(failed)} variant(s) failed: "
                               + "; ".join(f"{v}: {why[:300]}" for v, why in failed.items())
                               + kept)
        done |= results
    scores = done["evaluate"] | ({"ensemble": done["ensemble"]} if done["ensemble"] else {}) \
        | ({layout.STUDENT: done["distill"]["metrics"]} if done["distill"] else {})
    timed("artifacts", artifacts, scores, seconds, done["report"]["html"])
    if version:  # DVC commit + push of this run, then the champion gate
        from flows.version import version_run

        timed("version", version_run, cfg, str(params_path), sets, list(variants))
    return {"scores": scores, "seconds": seconds, "workdir": str(Path.cwd())}


def _variants(cfg: Config, chain: list[Stage], variants: list[str], run: str
              ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each variant's ``chain`` of stages, in slots of as many variants as train at once
    (stages.train_slots); a failed variant's others go on. Returns ({stage: {variant:
    result}} of the variants that finished, why each other one failed)."""
    # a night whose variants are all trained from these inputs starts no Ray
    stale = [v for v in variants if not stages.trained_is_current(cfg, v)]
    with stages.train_slots(cfg, len(variants), bool(stale)) as slots:
        get_run_logger().info("train: %d variant(s) to train, %d at a time (%s trained "
                              "from these inputs already)", len(stale), slots,
                              ", ".join(sorted(set(variants) - set(stale))) or "none")
        try:
            return _in_slots(cfg, chain, variants, slots, run)
        except BaseException as e:
            # Prefect's cancellation (TerminationSignal) or Ctrl-C reach this thread only;
            # the train tasks follow their Ray jobs in worker threads: stop the jobs here
            if not isinstance(e, Exception):
                stages.stop_jobs(get_run_logger().warning)
            raise


def _submit(cfg: Config, chain: list[Stage], variant: str, run: str
            ) -> dict[str, PrefectFuture[Any]]:
    """One variant's stages as a chain of tasks on the flow's runner, each started when the
    one before it has finished; stage -> its future."""
    futures: dict[str, PrefectFuture[Any]] = {}
    for s in chain:
        futures[s.name] = _submit_one(s, cfg, variant, run, list(futures.values())[-1:])
    return futures


def _in_slots(cfg: Config, chain: list[Stage], variants: list[str], slots: int, run: str
              ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Keep ``slots`` variants' chains going at once; a freed slot takes the next variant.

    The longest time limits start first, so that no long job ends up running alone at the
    end.
    """
    from prefect.futures import as_completed

    def minutes(v: str) -> float:  # 0: no limit, the longest
        return cfg.models.minutes(v, cfg.train.max_minutes) or float("inf")

    pending = sorted(variants, key=minutes, reverse=True)  # stable: ties keep their order
    running: dict[Any, tuple[str, dict[str, Any]]] = {}  # last task run id -> (variant, chain)
    finished: dict[str, dict[str, Any]] = {}  # variant -> stage -> result
    failed: dict[str, str] = {}
    while pending or running:
        while pending and len(running) < slots:
            variant = pending.pop(0)
            futures = _submit(cfg, chain, variant, run)
            running[futures[chain[-1].name].task_run_id] = (variant, futures)
        last = next(as_completed([f[chain[-1].name] for _, f in running.values()]))
        variant, futures = running.pop(last.task_run_id)
        try:
            finished[variant] = {name: f.result() for name, f in futures.items()}
        except Exception as e:  # noqa: BLE001 - the others go on; reported by the caller
            failed[variant] = f"{type(e).__name__}: {e}"
    return {s.name: {v: finished[v][s.name] for v in variants if v in finished}
            for s in chain}, failed


def flow_args(flow_name: str, variants: list[str]) -> argparse.Namespace:
    """The command line of a flow run in this process (`python -m flows.<flow>`)."""
    ap = argparse.ArgumentParser(description=f"Run the {flow_name} flow in this process.")
    ap.add_argument("--params", default="params.demo.yaml")
    ap.add_argument("--variants", nargs="*", default=variants)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--synth", action="store_true", help="run `rcpipe synth` first")
    ap.add_argument("--workdir")
    return ap.parse_args()


def main() -> None:
    args = flow_args("train-all", list(VARIANTS))
    train_all(params=args.params, variants=args.variants, overrides=args.overrides,
              synth_data=args.synth, workdir=args.workdir)


if __name__ == "__main__":
    main()
