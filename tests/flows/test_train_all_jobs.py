"""The train-all flow through a cluster's Jobs API, cancelled in Prefect: the train task's Ray
job is stopped, none is left (flows/train_all.py, rcpipe/cluster/job_runs.py).

The flow runs as a deployment served by a real Prefect runner (`Flow.serve`, in a
subprocess, against the test's Prefect API), which is what cancels a run: it sees the run
Cancelling and sends the flow-run process SIGTERM with the intent to cancel. The Ray job is
lifecycle_jobs_api's held shell loop, so the run is cancelled mid-"training" without any.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rcpipe.cluster.job_runs import run_jobs
from tests import ray_nodes
from tests.conftest import Prepared

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

ROOT = Path(__file__).resolve().parents[2]
# loaded from its entrypoint, as a deployment's flow is (a flow object served directly
# travels pickled by value, which loses the module's `Variant` its parameters name)
SERVE = ("from prefect import flow; flow.from_source(source='.', entrypoint="
         "'flows/train_all.py:train_all').serve(name='cancel-test')")


def _until(what: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return found


def test_a_cancelled_flow_run_leaves_no_ray_job(
        prepared: Prepared, lifecycle_jobs_api: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import get_current_settings
    from prefect.states import Cancelling
    from ray.job_submission import JobSubmissionClient

    for key in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):  # they would override the URL
        monkeypatch.delenv(key, raising=False)
    jobs = JobSubmissionClient(lifecycle_jobs_api)
    env = ray_nodes.node_env({"PREFECT_API_URL": str(get_current_settings().api.url),
                              "PREFECT_RUNNER_POLL_FREQUENCY": "1", "PYTHONPATH": str(ROOT)})
    log = (tmp_path / "runner.log").open("w")
    runner = subprocess.Popen([sys.executable, "-c", SERVE], cwd=ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    work = tmp_path / "work"
    work.mkdir()
    (work / "hold").touch()  # the job "trains" until cancelled
    try:
        with get_client(sync_client=True) as client:
            _until(lambda: _deployment(client))
            run = run_deployment("train-all/cancel-test", timeout=0, parameters={
                "params": str(prepared.cfg.source), "variants": ["bidaf"],
                "workdir": str(work), "ray_address": lifecycle_jobs_api})
            job_id = f"rcpipe-{run.id}-bidaf-1"  # the flow run's id names the run
            _until(lambda: (work / "pid-bidaf").is_file()
                   and jobs.get_job_status(job_id) == "RUNNING")
            client.set_flow_run_state(run.id, Cancelling(), force=True)  # `prefect flow-run cancel`
            t0 = time.monotonic()
            _until(lambda: jobs.get_job_status(job_id).is_terminal(), timeout=60)
            stopped_s = time.monotonic() - t0
            state = _until(lambda: (s := client.read_flow_run(run.id).state).is_final() and s,
                           timeout=90)
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=60)
        log.close()
    assert state.name == "Cancelled", (tmp_path / "runner.log").read_text()[-3000:]
    assert [(j.submission_id, j.status) for _, j in run_jobs(jobs, str(run.id), "bidaf")] == \
        [(job_id, "STOPPED")]  # stopped, and no other submitted after it (the task's retry)
    print(f"\nPrefect cancellation -> Ray job STOPPED in {stopped_s:.1f} s")


def _deployment(client: Any) -> Any:
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_deployment_by_name("train-all/cancel-test")
    except ObjectNotFound:
        return None
