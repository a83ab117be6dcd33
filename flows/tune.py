"""The `tune` Prefect flow: prepare -> `rcpipe tune` for each chosen variant, one at a time.

Each search takes the whole Ray cluster (its trials share it), so the variants go one after
another. Every task is one call into rcpipe.stages; a re-run skips a finished search and
resumes an interrupted one (rcpipe.stages.tune). The best settings land in
tune/<variant>.yaml, a params layer: `train-all` with `overrides`, or `rcpipe train V
--params params.yaml --params tune/V.yaml`, trains with them.

Run it on the GPU cluster as the deployment `tune/cluster` (prefect.yaml, the only one of
this flow: `prefect deployment run tune/cluster --param 'variants=["bidaf"]'`), where each
search is a Ray job on the head that writes tune/ on the volume the flow-run pod shares
(infra/prefect/README.md), or here, directly:
`python -m flows.tune --params params.demo.yaml --variants bidaf --synth`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.logs import rcpipe_logs_to_prefect
from flows.train_all import Variant, flow_args, prepare, synth
from rcpipe import stages
from rcpipe.config import Config, load_config


# a retry resumes the search: finished trials are kept, unfinished ones go on from their
# checkpoints; through a Jobs API it follows the run's unfinished Ray job
@task(cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5, task_run_name="tune-{variant}")
def search(cfg: Config, variant: str, run: str | None = None) -> dict[str, Any]:
    return stages.tune(cfg, variant, run=run)


@flow(name="tune", log_prints=True)
def tune(
    params: str = "params.demo.yaml",
    variants: list[Variant] = ["bidaf"],  # noqa: B006 - Prefect copies parameters
    overrides: list[str] | None = None,
    synth_data: bool = False,
    workdir: str | None = None,
    ray_address: str | None = None,
    storage_path: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Search the settings of ``variants``; the parameters are train-all's (flows/train_all.py).
    """
    from prefect.runtime import flow_run

    sets = list(overrides or [])
    sets += [f"train.ray_address={ray_address}"] if ray_address else []
    sets += [f"train.storage_path={storage_path}"] if storage_path else []
    params_path = Path(params).resolve()
    if workdir:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(workdir or "."), rcpipe_logs_to_prefect():
        cfg = load_config(params_path, sets)
        run = run_name or str(flow_run.get_id())
        if synth_data:
            synth(cfg)
        prepare(cfg)
        found = {v: search(cfg, v, run) for v in variants}
    create_table_artifact(key="tune-best", description="The best trial of each search",
                          table=[{"variant": v, "trials": s["trials"], "metric": s["metric"],
                                  "best": round(s["best"]["best"], 2),
                                  "settings": str(s["best"]["settings"]), "layer": s["layer"]}
                                 for v, s in found.items()])
    return found


def main() -> None:
    args = flow_args("tune", ["bidaf"])
    tune(params=args.params, variants=args.variants, overrides=args.overrides,
         synth_data=args.synth, workdir=args.workdir)


if __name__ == "__main__":
    main()
