"""The train-all flow in-process against a real temporary Prefect API: the variants through a
Jobs API all at once, and its walk of the stage table (rcpipe/pipeline/stages.py), a row
added, with stand-ins. The flow training for real: as a deployment's nights
(tests/integration/test_nights.py: a variant cancelled, then the rerun resuming it and
skipping what finished) and a deployment run that loses a node while one of its variants
fails (tests/integration/test_prefect_deployment.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows.train_all import train_all
from tests.conftest import SynthData, write_params


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.usefixtures("prefect_api", "local_ray")
def test_through_the_jobs_api_every_variant_goes_at_once(
        make_config, synth_v1: SynthData, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Ray queues what does not fit and an autoscaler grows to its maximum for it: the flow
    does not size the parallel variants from the GPUs the cluster has when it starts (none,
    scaled down) and joins no Ray of its own for it."""
    from rcpipe import stages
    from rcpipe.cluster import ray_runtime, train_job

    def no_ray(*_: object) -> None:
        pytest.fail("the flow sized the jobs from a Ray of its own")

    monkeypatch.setattr(ray_runtime, "ray_cluster", no_ray)
    monkeypatch.setattr(train_job, "jobs_that_fit", no_ray)
    cfg = make_config(synth_v1, train={"ray_address": "http://head:8265"})
    with stages.train_slots(cfg, 4) as slots:
        assert slots == 4


CALLS: list[tuple[str, str]] = []  # (stage, variant or "") as the stand-ins are called


def calibrate(cfg: object, variant: str) -> dict[str, Any]:
    """The stand-in of a stage added after evaluate: its row's entry is this module."""
    CALLS.append(("calibrate", variant))
    return {}


@pytest.mark.integration
@pytest.mark.usefixtures("prefect_api")
def test_the_flow_walks_the_stage_table_a_new_row_included(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flow's stages and their order are the table's: a row added after evaluate runs
    for each variant after its evaluate, with nothing of the flow changed."""
    import importlib

    from flows import train_all as flow
    from rcpipe import stages
    from rcpipe.pipeline.stages import STAGES, Stage

    def stand_in(name: str, result: Any = None) -> Any:
        def run(cfg: object, variant: Any = "", *_: object, **__: object) -> Any:
            CALLS.append((name, variant if isinstance(variant, str) else ""))
            return result
        return run

    scores = {"exact_match": 1.0, "f1": 1.0}
    for name, result in (("fetch", {}), ("evaluate", scores), ("report", {"html": "r"}),
                         ("distill", {"summary": {}, "metrics": scores})):
        monkeypatch.setattr(importlib.import_module(f"rcpipe.stages.{name}"), name,
                            stand_in(name, result))
    for name, result in (("prepare", {}), ("train", {}), ("ensemble", scores)):
        monkeypatch.setattr(stages, name, stand_in(name, result))
    monkeypatch.setattr(stages, "prepared_changes", lambda cfg: "a test")
    monkeypatch.setattr(stages, "trained_is_current", lambda cfg, v: True)  # no Ray
    at = [s.name for s in STAGES].index("evaluate") + 1
    row = Stage("calibrate", f"{__name__.replace('.', '/')}.py", "a stage added",
                (), deps=lambda v: [], outs=lambda v: [], per_variant=True)
    table = (*STAGES[:at], row, *STAGES[at:])
    monkeypatch.setattr(flow, "STAGES", table)
    monkeypatch.setattr(flow, "STAGE", {s.name: s for s in table})
    CALLS.clear()
    # a student named: distill runs after the ensemble, its scores beside the others
    params = write_params(tmp_path / "params.yaml", data={"train_file": "t.json",
                                                          "dev_file": "d.json"},
                          distill={"student": "bidaf"})
    variants = ["bidaf", "qanet"]
    out = train_all(params=str(params), variants=variants, workdir=str(tmp_path / "w"))

    assert set(out["scores"]) == {*variants, "ensemble", "student"}
    singles = [name for name, v in CALLS if not v]
    assert singles == [s.name for s in table if not s.per_variant]
    chain = [s.name for s in table if s.per_variant]
    assert chain == ["train", "evaluate", "calibrate"]
    for variant in variants:  # each variant's chain in the table's order, between the two
        assert [name for name, v in CALLS if v == variant] == chain
        runs = [i for i, (_, v) in enumerate(CALLS) if v == variant]
        assert CALLS.index(("prepare", "")) < min(runs)
        assert max(runs) < CALLS.index(("ensemble", ""))
