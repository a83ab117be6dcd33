"""`rcpipe tune` through a real head's Jobs API: ASHA over two tiny trials, each a Ray Train
job under Tune, the search a Ray job on the cluster; the best as a params layer; a re-run
resumes instead of searching again. A search that cannot run here fails before any trial
(a real local Ray); plans in steps, in minutes and with fractional GPUs on a Ray that
declares one GPU; a trial's budget and its end, without Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from rcpipe import layout, stages
from rcpipe.config import load_config
from tests import ray_nodes
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.ray_train(2)  # tests/job_count.py; docs/dev/testing.md

SPACE = {"optim": {"choice": [{"name": "adam", "lr": 0.01}, {"name": "adam", "lr": 0.001}]},
         "dropout": {"uniform": [0.0, 0.2]}}
# bidaf's search over SPACE alone: the default space's other dimensions left out
BIDAF_SPACE = {"bidaf": {"space": SPACE | {"hidden": None, "optim.ema_decay": None,
                                           "word_dropout": None}}}


def _no_placement_group_outlives_the_search(jobs_api: str) -> None:
    """No trial's placement group outlives the search (the next job would wait for it): the
    head's own state API, read over its dashboard."""
    from ray.util.state import list_placement_groups

    # Ray removes them asynchronously: 15 s was once short on a busy 2-core machine (three
    # test runs at once), 30 costs nothing where it is prompt
    deadline = time.monotonic() + 30
    while alive := list_placement_groups(address=jobs_api, filters=[("state", "!=", "REMOVED")]):
        assert time.monotonic() < deadline, alive
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.trains
def test_a_search_through_the_jobs_api_writes_the_best_as_a_params_layer_and_resumes(
        prepared_here) -> None:  # noqa: ANN001
    """`rcpipe tune` at a cluster's Jobs API: the search is a Ray job on the head (the real
    `rcpipe tune`, joining the head's Ray), ASHA over two trials one after the other (the
    second needs the CPUs the first one's workers held: search._recorder releases them when
    a trial ends), the layer lands in the submitting directory (the file system the cluster
    shares). Its budget is in training minutes (tune.max_minutes): a trial trains until they
    pass (a budget in steps: the plan and trial checks below; one search for both, as each
    Ray Train job costs ~20 CPU s before it trains). Asked again, the job finds it finished;
    its file gone, the search is restored on the cluster from its run, no trial trained
    again."""
    from ray.job_submission import JobSubmissionClient

    from rcpipe.cluster.job_runs import default_run, run_jobs

    short = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # Ray's sockets: <= 107 bytes
    head, _, url = ray_nodes.start_head(short / "head", ray_nodes.node_env({}), cpus=2)
    try:
        cfg = prepared_here(train={"batch_size": 16, "epochs": 1000, "ray_address": url,
                                   "device": "cpu"},
                            models={"bidaf": TINY_MODEL},
                            tune={"trials": 2, "max_concurrent": 1, "max_minutes": 0.05,
                                  "eval_every": 4, **BIDAF_SPACE})
        t0 = time.perf_counter()
        summary = stages.tune(cfg, "bidaf")
        print(f"search through the Jobs API: {time.perf_counter() - t0:.1f} s")
        _no_placement_group_outlives_the_search(url)
        client, run = JobSubmissionClient(url), default_run(Path.cwd().resolve(), None)
        assert [(a, j.status) for a, j in run_jobs(client, run, "tune-bidaf")] == \
            [(1, "SUCCEEDED")]  # one Ray job: rcpipe-<run>-tune-bidaf-1

        assert summary["trials"] == 2 and summary["finished"] and summary["metric"] == "rank"
        table = json.loads(layout.tune_trials("bidaf").read_text())
        assert len(table["rows"]) == 2
        for row in table["rows"]:  # the job ran these params: the dimensions left out stay out
            assert set(row["settings"]) == {"optim", "dropout"}
            assert row["status"] in {"finished", "stopped"} and row["curve"]
            assert [c[1] for c in row["curve"]] == sorted(c[1] for c in row["curve"])
        # trained until its minutes passed: how many steps fit in them is the machine's (2
        # when the suite's other worker held both cores, 20 alone)
        assert any(row["status"] == "finished" and row["minutes"] >= 0.05 and row["steps"] > 1
                   for row in table["rows"])
        text = layout.tune_params("bidaf").read_text()
        header = text.splitlines()
        assert header[0].startswith("# rcpipe tune bidaf") and "up to 0.05 minutes each" in \
            header[0]
        # ranked on prepare's held-out questions (the synthetic train set holds one out)
        assert "held-out questions (heldout" in header[1] and summary["data"] in header[1]
        assert f"--params {cfg.source} --params {layout.tune_params('bidaf')}" in header[2]
        layer = yaml.safe_load(text)
        assert set(layer) == {"models"} and set(layer["models"]["bidaf"]) == {"optim", "dropout"}
        tuned = load_config([cfg.source, layout.tune_params("bidaf")])
        assert tuned.models.bidaf.optim.lr == summary["best"]["settings"]["optim"]["lr"]
        assert tuned.models.bidaf.hidden == TINY_MODEL["hidden"]  # unsearched: the params'

        # asked again: the job finds the search finished, nothing runs
        assert stages.tune(cfg, "bidaf")["when"] == summary["when"]
        # its file gone, the search is restored from its run (a third Ray job): finished
        # trials are not run again
        runs = sorted(layout.tune_run("bidaf").glob("trials/*/checkpoint_manager_snapshot.json"))
        before = {p: p.stat().st_mtime_ns for p in runs}
        assert len(before) == 2
        layout.tune_trials("bidaf").unlink()
        again = stages.tune(cfg, "bidaf")
        assert [j.status for _, j in run_jobs(client, run, "tune-bidaf")] == ["SUCCEEDED"] * 3
    finally:
        ray_nodes.stop_all([head])
    assert again["best"]["id"] == summary["best"]["id"]
    assert {p: p.stat().st_mtime_ns for p in runs} == before


@pytest.mark.usefixtures("local_ray")
@pytest.mark.parametrize(("variant", "tune", "key"), [
    ("bidaf", {"max_steps": 4, "gpus_per_trial": 0.5}, "tune.gpus_per_trial"),
    ("bidaf", {"max_steps": 4, "cpus_per_trial": 3}, "tune.cpus_per_trial"),
    ("bidaf", {"max_steps": 0}, "tune.max_steps"),
    ("bidaf", {"max_minutes": 1}, "tune.eval_every"),  # no steps between scores
    ("qanet", {"max_steps": 4, "qanet": {"space": {"hidden": {"choice": [8, 9]}}}},
     "tune.qanet.space.hidden"),  # 9 is not divisible by the 2 heads: it cannot build
])
@pytest.mark.integration
def test_a_search_that_cannot_run_here_fails_before_any_trial(
        prepared_here, variant: str, tune: dict, key: str) -> None:  # noqa: ANN001
    from rcpipe.errors import InputError

    cfg = prepared_here(train={"max_steps": 0}, models={variant: TINY_MODEL}, tune=tune)
    t0 = time.perf_counter()
    with pytest.raises(InputError) as err:
        stages.tune(cfg, variant)
    assert err.value.location == key, err.value.line()
    assert time.perf_counter() - t0 < 10
    assert not layout.tune_run(variant).joinpath("search").exists()


PLAN = """
import json, sys, ray
from rcpipe.config import load_config
from rcpipe.cluster import search
ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, logging_level="ERROR")
print(json.dumps([search.plan(load_config(p), "bidaf").__dict__ for p in sys.argv[1:]]))
"""


@pytest.mark.integration
def test_a_plan_in_steps_or_minutes_and_trials_sharing_a_gpu(
        make_config, synth_v1, tmp_path: Path) -> None:  # noqa: ANN001
    """On a Ray of one GPU (a real Ray declaring one; no CUDA is needed to plan): a budget
    in steps, ASHA's first rung at grace_steps; in minutes, its rung a quarter of them and
    a score every eval_every steps; tune.gpus_per_trial 0.5: two trials at once, each
    worker holding half the GPU."""
    sources = []
    for name, tune in (("steps", {"max_steps": 6, "eval_every": 2, "grace_steps": 2}),
                       ("minutes", {"max_minutes": 0.05, "eval_every": 4}),
                       ("gpu", {"trials": 4, "max_steps": 4, "gpus_per_trial": 0.5,
                                "cpus_per_trial": 1})):
        cfg = make_config(synth_v1, tune={"trials": 2} | tune)
        sources.append(Path(cfg.source).rename(tmp_path / f"{name}.yaml"))
    done = subprocess.run([sys.executable, "-c", PLAN, *map(str, sources)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    steps, minutes, gpu = json.loads(done.stdout.strip().splitlines()[-1])
    assert (steps["attr"], steps["max_t"], steps["grace"], steps["eval_every"]) == \
        ("step", 6, 2, 2)
    assert (minutes["attr"], minutes["max_t"], minutes["grace"], minutes["eval_every"]) == \
        ("minutes", 0.05, 0.0125, 4)
    assert gpu["concurrent"] == 2  # 4 CPUs fit 4 trials, the one GPU two halves
    assert gpu["gpus_per_worker"] == 0.5 and gpu["cpus_per_worker"] == 1


def test_a_trial_trains_to_its_budget_in_steps_or_in_minutes(make_config, synth_v1) -> None:  # noqa: ANN001
    """A trial's params: its sample laid over the variant's (rounded, as the layer says it),
    its budget the variant's own limit; ran all of it at its last report, else ASHA
    stopped it (a time budget ends at the first score past it)."""
    from rcpipe.cluster.search import Plan, ran_it_all, trial_config

    cfg = make_config(synth_v1, train={"max_steps": 500},
                      models={"bidaf": TINY_MODEL | {"max_steps": 50}})
    sample = {"optim": {"name": "adam", "lr": 0.01}, "dropout": 0.123456}
    by_steps, by_minutes = Plan("step", 6, 2, 2, 1.0, 0.0, 1), \
        Plan("minutes", 0.05, 0.0125, 4, 1.0, 0.0, 1)
    for plan, steps, minutes in ((by_steps, 6, 0), (by_minutes, 0, 0.05)):
        trial = trial_config(cfg, "bidaf", sample, plan)
        assert trial.models.steps("bidaf", trial.train.max_steps) == steps
        assert trial.models.minutes("bidaf", trial.train.max_minutes) == minutes
        assert trial.train.eval_every == plan.eval_every
        assert trial.models.bidaf.dropout == 0.1235 and trial.models.bidaf.optim.lr == 0.01
    assert ran_it_all({"step": 6}, by_steps) and not ran_it_all({"step": 4}, by_steps)
    assert ran_it_all({"minutes": 0.0496}, by_minutes)
    assert not ran_it_all({"minutes": 0.03}, by_minutes) and not ran_it_all({}, by_minutes)


def test_a_trials_placement_groups_go_when_it_ends_and_each_end_is_a_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """TrialLines on its own, without Ray running: the queue is a list, the removal recorded."""
    import importlib

    from ray.util.queue import Empty

    from rcpipe.cluster.search import Plan, TrialLines

    class Groups(list):  # what the trials put, in the order they put it
        def get_nowait(self) -> tuple[str, str]:
            if not self:
                raise Empty
            return self.pop(0)

    removed: list[str] = []
    # the module (ray.util's own name placement_group is the function)
    placement = importlib.import_module("ray.util.placement_group")
    monkeypatch.setattr(placement, "remove_placement_group", removed.append)
    groups = Groups([("t1", "pg-a"), ("t2", "pg-b")])
    plan = Plan("step", 6, 2, 2, 1.0, 0.0, 1)
    lines = TrialLines("bidaf", 3, plan, groups)
    assert lines.callback().on_trial_complete is not None  # Tune's hooks, made on demand

    def trial(trial_id: str, step: int) -> object:
        return type("Trial", (), {"trial_id": trial_id,
                                  "last_result": {"step": step, "rank": 50.0}})()

    with caplog.at_level("INFO", logger="rcpipe.cluster.search"):
        lines.trial_ended(trial("t1", 6), failed=False)
        assert removed == ["pg-a"]  # t2 runs on: its group stays
        groups.append(("t1", "pg-late"))  # t1's dying controller started one more
        lines.trial_ended(trial("t2", 2), failed=False)
        lines.trial_ended(trial("t3", 0), failed=True)
    assert removed == ["pg-a", "pg-b", "pg-late"]  # in the order the groups came
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" at step")[0] for m in said] == [
        "tune bidaf: trial 1/3 t1 finished", "tune bidaf: trial 2/3 t2 stopped by ASHA",
        "tune bidaf: trial 3/3 t3 failed"]
    groups.append(("t4", "pg-d"))
    lines.release_all()  # the search over: every group goes
    assert removed[-1] == "pg-d"


def test_a_search_of_other_inputs_is_forgotten_and_searched_anew(
        make_config, synth_v1, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    """A search is keyed as every stage is (stages/tune.py: the prepared files, the params,
    its settings, its code): the same key goes on with what is stored; another forgets it
    with a line saying what changed, as a training run of other inputs trains anew."""
    from rcpipe.stages.tune import _key, _same_search_or_anew

    cfg = make_config(synth_v1, tune={"trials": 2, "max_steps": 6})
    run = tmp_path / "tune" / "bidaf"
    storage = (str(run), None)
    _same_search_or_anew("bidaf", storage, _key(cfg, "bidaf"))
    (run / "trials").mkdir()
    (run / "trials" / "t1").write_text("a trial's run")
    _same_search_or_anew("bidaf", storage, _key(cfg, "bidaf"))  # the same search: kept
    assert (run / "trials" / "t1").exists()
    other = make_config(synth_v1, tune={"trials": 3, "max_steps": 6})
    with caplog.at_level("INFO", logger="rcpipe.stages.tune"):
        _same_search_or_anew("bidaf", storage, _key(other, "bidaf"))
    assert "tune bidaf: settings changed (tune.trials 2 -> 3); searching anew" in caplog.text
    assert not (run / "trials").exists()
    assert json.loads((run / "search.json").read_text())["digest"] == _key(other, "bidaf").digest
