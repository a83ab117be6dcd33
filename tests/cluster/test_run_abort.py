"""A process cancelled mid-training (job_runs.stop_followed: the train-all flow's main
thread, when Prefect cancels the run) aborts its Ray Train run through the run's controller:
on a real local Ray, the worker is gone within seconds, no checkpoint is stored after the
abort, nothing is put in place, and the process starts no more training."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from rcpipe import stages
from rcpipe.cluster import job_runs, run_abort
from tests import ray_nodes
from tests.cluster.test_train_job import _run_dir
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.ray_train(1)  # tests/job_count.py; docs/dev/testing.md


def _steps() -> list[str]:
    return sorted(p.name for p in _run_dir("bidaf").glob("step-*"))


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.usefixtures("local_ray")
def test_a_cancelled_process_aborts_its_run_and_trains_no_more(
        prepared_here, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(job_runs, "_cancelled", threading.Event())  # this test's process
    # far more steps than it trains before the cancellation (~6 a second here)
    cfg = prepared_here(train={"max_steps": 5000, "eval_every": 4, "batch_size": 4,
                               "epochs": 5000}, models={"bidaf": TINY_MODEL})
    failed: list[BaseException] = []

    def train() -> None:  # as the flow's train task does, in a worker thread
        try:
            stages.train(cfg, "bidaf")
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            failed.append(e)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    deadline = time.monotonic() + 180
    while not ray_nodes.recorded_steps(_run_dir("bidaf")):
        assert trainer.is_alive() and time.monotonic() < deadline, failed
        time.sleep(0.1)

    t0 = time.monotonic()
    lines: list[str] = []
    job_runs.stop_followed(lines.append)  # returns once the fit has aborted its run
    stopped_s = time.monotonic() - t0
    trainer.join(10)
    assert not trainer.is_alive() and not lines, lines  # no "still followed" line
    assert len(failed) == 1 and isinstance(failed[0], RuntimeError), failed
    assert "cancelled" in str(failed[0]) and "stopped" in str(failed[0])
    assert stopped_s < run_abort.ABORT_WAIT_S  # Ray confirmed the abort; no time-out
    deadline = time.monotonic() + 10
    while ray_nodes.train_workers(psutil.Process()):  # killed by Train V2's abort
        assert time.monotonic() < deadline, "the Ray Train worker outlived the abort"
        time.sleep(0.2)
    stored = _steps()
    time.sleep(2)
    assert _steps() == stored and stored  # nothing stored after the abort; its checkpoints kept
    assert not Path("models/bidaf/summary.json").exists()  # nothing put in place
    print(f"\ncancelled -> Ray Train run aborted in {stopped_s:.1f} s, {len(stored)} "
          "checkpoint(s) kept")

    with pytest.raises(RuntimeError, match="cancelled: it starts no Ray job"):
        stages.train(cfg, "bidaf")  # a retried task of the cancelled flow


def test_a_cancelled_process_starts_no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from rcpipe.cluster.ray_runtime import ray_cluster

    cancelled = threading.Event()
    cancelled.set()
    monkeypatch.setattr(job_runs, "_cancelled", cancelled)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    with pytest.raises(RuntimeError, match="cancelled: it starts no Ray"), ray_cluster(None):
        pass
