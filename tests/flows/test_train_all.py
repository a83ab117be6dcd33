"""The train-all flow on tiny data, run in-process against a real temporary Prefect API;
and its walk of the stage table (rcpipe/pipeline/stages.py), a row added, with stand-ins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flows.train_all import train_all
from tests.conftest import TINY_MODEL, SynthData, write_params
from tests.flows.conftest import flow_run_logs

pytestmark = pytest.mark.ray_train(2)  # tests/job_count.py; docs/dev/testing.md


def _params(root: Path, synth: SynthData) -> Path:
    return write_params(root / "params.yaml",
                        data={"train_file": str(synth.train), "dev_file": str(synth.dev)},
                        train={"max_steps": 3, "batch_size": 8, "max_failures": 0},
                        models=dict.fromkeys(("bidaf", "qanet"), TINY_MODEL))


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.usefixtures("prefect_api", "local_ray")
def test_a_rerun_after_one_variant_failed_skips_what_finished(
        tmp_path: Path, synth_v1: SynthData) -> None:
    params, work = _params(tmp_path, synth_v1), tmp_path / "work"
    variants = ["bidaf", "qanet"]
    # qanet cannot be built with 3 heads on 8 dimensions: that variant fails (before its Ray
    # Train job starts), the other finishes. Two jobs at once on a Ray with room for both:
    # tests/integration/test_nights.py's night 1
    state = train_all(params=str(params), variants=variants, workdir=str(work),
                      overrides=["models.qanet.heads=3"], return_state=True)
    assert state.is_failed()
    assert "qanet" in state.message
    # the training task's dev evaluations reached the Prefect UI, under that task's run
    progress = [log for log in flow_run_logs(state.state_details.flow_run_id)
                if log.name == "rcpipe.train.progress" and "dev EM" in log.message]
    assert {log.message.split(":")[0] for log in progress} == {"train bidaf"}
    assert all(log.task_run_id is not None for log in progress)
    bidaf = work / "models/bidaf"
    assert json.loads((bidaf / "summary.json").read_text())["finished"]
    assert not (work / "models/qanet/summary.json").exists()
    trained_at = (bidaf / "model.pt").stat().st_mtime_ns
    prepared_at = (work / "data/prepared/meta.json").stat().st_mtime_ns

    out = train_all(params=str(params), variants=variants, workdir=str(work))
    assert (bidaf / "model.pt").stat().st_mtime_ns == trained_at  # not retrained
    assert (work / "data/prepared/meta.json").stat().st_mtime_ns == prepared_at  # nor prepared
    assert json.loads((work / "models/qanet/summary.json").read_text())["finished"]
    assert set(out["scores"]) == {*variants, "ensemble"}
    for name in (*variants, "ensemble"):
        assert json.loads((work / f"metrics/{name}.json").read_text()) == out["scores"][name]


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
    for name, result in (("fetch", {}), ("evaluate", scores), ("report", {"html": "r"})):
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
    params = write_params(tmp_path / "params.yaml", data={"train_file": "t.json",
                                                          "dev_file": "d.json"})
    variants = ["bidaf", "qanet"]
    out = train_all(params=str(params), variants=variants, workdir=str(tmp_path / "w"))

    assert set(out["scores"]) == {*variants, "ensemble"}
    singles = [name for name, v in CALLS if not v]
    assert singles == [s.name for s in table if not s.per_variant]
    chain = [s.name for s in table if s.per_variant]
    assert chain == ["train", "evaluate", "calibrate"]
    for variant in variants:  # each variant's chain in the table's order, between the two
        assert [name for name, v in CALLS if v == variant] == chain
        runs = [i for i, (_, v) in enumerate(CALLS) if v == variant]
        assert CALLS.index(("prepare", "")) < min(runs)
        assert max(runs) < CALLS.index(("ensemble", ""))
