"""A process cancelled mid-training (job_runs.stop_followed: the train-all flow's main
thread, when Prefect cancels the run) starts no Ray and no Ray job. That it aborts its
running Ray Train runs through their controllers (the workers gone within seconds, no
checkpoint stored after, nothing put in place, nothing left on the cluster) is night 3 of
tests/integration/test_nights.py, on a real Prefect cancellation (one Ray Train run for
both: docs/dev/testing.md)."""

from __future__ import annotations

import threading

import pytest

from rcpipe.cluster import job_runs


def test_a_cancelled_process_starts_no_ray_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """A retried task of a cancelled flow: train_job.fit's first step refuses."""
    cancelled = threading.Event()
    cancelled.set()
    monkeypatch.setattr(job_runs, "_cancelled", cancelled)
    with pytest.raises(RuntimeError, match="cancelled: it starts no Ray job"), \
            job_runs.fitting():
        pytest.fail("a job was followed")


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


def test_the_train_v2_hooks_the_abort_reaches_for_are_there() -> None:
    """run_abort rides on Train V2 internals (a controller callback announcing the
    controller, the controller's abort): a Ray upgrade that moves them fails here, at once,
    before night 3 of tests/integration/test_nights.py finds its runs never aborted."""
    from ray.train.v2._internal.execution.controller import TrainController

    from rcpipe.cluster.run_abort import AnnounceController

    assert callable(AnnounceController.after_controller_start)
    assert callable(TrainController.abort)

