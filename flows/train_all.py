"""The `train-all` Prefect flow: prepare -> train + evaluate each variant -> ensemble -> report.

Every task is one call into rcpipe.stages, so `dvc repro`, the CLI and this flow run the
same code. A re-run skips what is done: prepare when its output matches the params and
inputs, a variant whose model finished training from the same inputs (its fingerprint,
rcpipe/fingerprints.py), evaluate, ensemble and report when what they read is unchanged;
an interrupted variant resumes from its checkpoint, a variant whose inputs changed trains
anew (rcpipe.stages.train). Variants train concurrently when the Ray cluster has room
for more than one job, one after another otherwise. rcpipe's log lines (each stage's, and
a training run's progress and dev evaluations) show in the Prefect UI under the task run
that logged them (flows/logs.py).

Run it as a deployment (`prefect deployment run train-all/local`, see prefect.yaml) or
directly: `python -m flows.train_all --params params.demo.yaml --synth`.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.logs import rcpipe_logs_to_prefect
from rcpipe import layout, stages
from rcpipe.config import VARIANTS, Config, load_config

if TYPE_CHECKING:
    from prefect.futures import PrefectFuture

T = TypeVar("T")

# the registry's names (rcpipe/variants.py): Prefect validates the parameter against them
Variant = Literal[VARIANTS]  # type: ignore[valid-type]


@task(cache_policy=NO_CACHE)
def synth(cfg: Config) -> None:
    stages.synth(cfg)


# prepare may download SQuAD and GloVe: retried with backoff
@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[10, 60])
def prepare(cfg: Config) -> dict[str, Any]:
    if stages.prepared_is_current(cfg):
        get_run_logger().info("prepare: %s is current; skipped", cfg.data.out_dir)
        return {"skipped": True}
    return stages.prepare(cfg)


# a retry resumes from the last checkpoint instead of starting over; through a Jobs API it
# follows the run's unfinished Ray job (its log stream lost) instead of submitting another
@task(cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5, task_run_name="train-{variant}")
def train(cfg: Config, variant: str, run: str | None = None) -> dict[str, Any]:
    return stages.train(cfg, variant, run=run)


@task(cache_policy=NO_CACHE, task_run_name="evaluate-{variant}")
def evaluate(cfg: Config, variant: str) -> dict[str, Any]:
    return stages.evaluate(cfg, variant)


@task(cache_policy=NO_CACHE)
def ensemble(cfg: Config, variants: list[str]) -> dict[str, Any]:
    return stages.ensemble(cfg, [layout.nbest(v) for v in variants])


@task(cache_policy=NO_CACHE)
def evaluation_report(cfg: Config) -> str:
    """`rcpipe report`: the run's HTML report with plots; returns its path."""
    return stages.report(cfg)["html"]


@task(cache_policy=NO_CACHE)
def report(scores: dict[str, dict[str, Any]], seconds: dict[str, float],
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
    timed("prepare", prepare, cfg)

    # a night whose variants are all trained from these inputs starts no Ray
    stale = [v for v in variants if not stages.trained_is_current(cfg, v)]
    with stages.train_slots(cfg, len(variants), bool(stale)) as slots:
        get_run_logger().info("train: %d variant(s) to train, %d at a time (%s trained "
                              "from these inputs already)", len(stale), slots,
                              ", ".join(sorted(set(variants) - set(stale))) or "none")
        try:
            scores, failed = timed("train+evaluate", _train_and_evaluate, cfg,
                                   list(variants), slots, run)
        except BaseException as e:
            # Prefect's cancellation (TerminationSignal) or Ctrl-C reach this thread only;
            # the train tasks follow their Ray jobs in worker threads: stop the jobs here
            if not isinstance(e, Exception):
                stages.stop_jobs(get_run_logger().warning)
            raise
    if failed:  # nothing is versioned: yesterday's models and champion stay
        kept = "; nothing versioned, the champion stays" if version else ""
        raise RuntimeError(f"train-all: {len(failed)} variant(s) failed: "
                           + "; ".join(f"{v}: {why[:300]}" for v, why in failed.items())
                           + kept)
    if len(variants) > 1:
        scores["ensemble"] = timed("ensemble", ensemble, cfg, list(variants))
    report_html = timed("evaluation report", evaluation_report, cfg)
    timed("report", report, scores, seconds, report_html)
    if version:  # DVC commit + push of this run, then the champion gate
        from flows.version import version_run

        timed("version", version_run, cfg, str(params_path), sets, list(variants))
    return {"scores": scores, "seconds": seconds, "workdir": str(Path.cwd())}


def _submit(cfg: Config, variant: str, run: str) -> PrefectFuture[Any]:
    """Train then evaluate one variant as a pair of tasks running on the flow's runner."""
    train_run = train.submit(cfg, variant, run)
    return evaluate.submit(cfg, variant, wait_for=[train_run])


def _train_and_evaluate(cfg: Config, variants: list[str], slots: int, run: str
                        ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Keep ``slots`` variants training at once; a freed slot takes the next variant.

    The longest time limits start first, so that no long job ends up running alone at the
    end. Returns (scores of the variants that finished, why each other one failed).
    """
    from prefect.futures import as_completed

    def minutes(v: str) -> float:  # 0: no limit, the longest
        return cfg.models.minutes(v, cfg.train.max_minutes) or float("inf")

    pending = sorted(variants, key=minutes, reverse=True)  # stable: ties keep their order
    running: dict[Any, tuple[str, Any]] = {}  # task run id -> (variant, its future)
    scores: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    while pending or running:
        while pending and len(running) < slots:
            variant = pending.pop(0)
            future = _submit(cfg, variant, run)
            running[future.task_run_id] = (variant, future)
        done = next(as_completed([future for _, future in running.values()]))
        variant, _ = running.pop(done.task_run_id)
        try:
            scores[variant] = done.result()
        except Exception as e:  # noqa: BLE001 - the others go on; reported by the caller
            failed[variant] = f"{type(e).__name__}: {e}"
    return {v: scores[v] for v in variants if v in scores}, failed


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
