"""Ray Train on a real local Ray cluster: a user's mistake found in a worker, the local Ray
started once more, the credentials a job carries (DDP replicas: test_storage_outage.py;
worker death, kill -9 of the driver and resume: tests/faults/test_kills.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.errors import InputError
from tests.conftest import TINY_MODEL, SynthData

pytestmark = pytest.mark.ray_train(1)  # tests/job_count.py; docs/dev/testing.md


# DDP's two replicas holding identical weights after every step: the two-worker run of
# tests/cluster/test_storage_outage.py (each Ray Train job costs ~20 CPU s before it trains);
# a worker killed mid-run and restarted by train.max_failures, kill -9 of `rcpipe train` and
# the same command resuming to the undisturbed run's dev F1: one run's life in
# tests/faults/test_kills.py (one Ray Train run for those and three more cases)


def test_no_credential_travels_with_the_checkpoint_filesystem(
        make_config, synth_v1: SynthData, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    import pickle

    from rcpipe.cluster.train_job import storage

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEYID0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example/secret/never/pickled")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "example-session-token")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    cfg = make_config(synth_v1, train={"storage_path": "s3://bucket/runs"})
    path, filesystem = storage(cfg, "bidaf", Path("models/bidaf"))
    assert path == "bucket/runs/bidaf"
    shipped = pickle.dumps(filesystem)  # what Ray hands every worker
    for secret in ("AKIAEXAMPLEKEYID0001", "example/secret", "example-session-token"):
        assert secret.encode() not in shipped
    assert b"127.0.0.1:9" in shipped  # the endpoint does travel: it is no secret


def test_a_local_ray_that_did_not_come_up_in_time_is_started_once_more(
        caplog: pytest.LogCaptureFixture) -> None:
    """ray.init's own words when its raylet has not registered in 30 s (a busy machine):
    stopped and started again, with a line; any other failure, or a second timeout, raised.
    (Checked once against a real ray.init whose node check was held back for 31 s.)"""
    from rcpipe.cluster.ray_runtime import NODE_STARTUP_TIMEOUT, start_once_more_if_slow

    calls: list[str] = []

    def start_failing(times: int, message: str):  # noqa: ANN202
        def start() -> None:
            calls.append("start")
            if calls.count("start") <= times:
                raise Exception(f"The current node {message}.")  # as ray.init raises it
        return start

    with caplog.at_level("WARNING"):
        start_once_more_if_slow(start_failing(1, NODE_STARTUP_TIMEOUT),
                                lambda: calls.append("stop"))
    assert calls == ["start", "stop", "start"]
    assert "starting it once more" in caplog.text
    for times, message in ((2, NODE_STARTUP_TIMEOUT), (1, "has no CPUs")):
        calls.clear()
        with pytest.raises(Exception, match=message):
            start_once_more_if_slow(start_failing(times, message), lambda: calls.append("stop"))
        assert calls.count("start") == (2 if message == NODE_STARTUP_TIMEOUT else 1)


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.usefixtures("local_ray")
def test_a_users_mistake_found_in_a_ray_train_worker_is_one_line_at_the_driver(
        prepared_here) -> None:  # noqa: ANN001
    """The worker reads the dev split's parts (the driver checks the training split's only): a
    broken one is found there, and the driver says the worker's InputError, not Ray's
    WorkerGroupError traceback."""
    # no restarts: the mistake fails every attempt alike, and each restart of the worker group
    # (train.max_failures, 2 by default: tests/faults/test_kills.py restarts one) only repeats it
    cfg = prepared_here(train={"max_steps": 2, "batch_size": 8, "max_failures": 0},
                        models={"bidaf": TINY_MODEL})
    part = cfg.data.out_dir / "dev" / "part-00000.parquet"
    part.write_bytes(b"not parquet")
    with pytest.raises(InputError) as found:
        stages.train(cfg, "bidaf")
    assert found.value.file in (str(part), str(part.resolve()))
    assert "not a readable Parquet file" in found.value.what
    assert found.value.exit_code == 2 and "\n" not in found.value.line()
    assert not Path("models/bidaf/summary.json").exists()


def test_a_worker_whose_raylet_has_gone_stores_and_trains_nothing_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefect's SIGTERM reaches a cancelled flow's local Ray too: its raylet ends, and the
    orphaned worker (re-parented) must not store another checkpoint nor train on."""
    import os

    from rcpipe.cluster.train_job import RaySession

    session = RaySession.__new__(RaySession)  # the fields a running worker's session has
    session.rank, session._raylet, session._queue = 0, os.getppid(), None
    session.check_node()  # its raylet is there
    session.progress({"step": 10})
    monkeypatch.setattr(os, "getppid", lambda: 1)  # orphaned: init adopted it
    with pytest.raises(RuntimeError, match="Ray node is gone"):
        session.report({"step": 12}, None, "step-00000012")
    with pytest.raises(RuntimeError, match="Ray node is gone"):
        session.progress({"step": 20})


def test_a_step_saved_again_after_a_broken_one_gets_a_folder_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that passed by its broken latest checkpoint on resume saves that step again:
    Ray Train still records the broken one, and evicting that record deletes its folder
    (the kill sequence's resume lost its new step-24 so, then failed on deleting it twice:
    tests/faults/test_kills.py). The new checkpoint goes to step-...-r1, which the listings
    read as the same step, after the first."""
    import ray.train

    from rcpipe.cluster.train_job import RaySession, latest_step, stored_checkpoints
    from rcpipe.train.checkpoint import step_dir, step_of

    assert step_dir(24) == "step-00000024"
    assert step_dir(24, {"step-00000024", "step-00000024-r1"}) == "step-00000024-r2"
    assert [step_of(n) for n in ("step-00000024", "step-00000024-r3", "step-24", "x")] == \
        [24, 24, None, None]
    run = tmp_path / "run-a"
    for name in ("step-00000020", "step-00000024", "step-00000024-r1", "step-x", ".tmp"):
        (run / name).mkdir(parents=True)
    newest_first = [Path(c.path).name for c in stored_checkpoints(str(run), None)]
    assert newest_first == ["step-00000024-r1", "step-00000024", "step-00000020"]
    assert latest_step(str(tmp_path), None, "run-a") == 24

    reported: list[str] = []
    monkeypatch.setattr(ray.train, "report", lambda metrics, checkpoint, checkpoint_dir_name:
                        reported.append(checkpoint_dir_name))
    session = RaySession.__new__(RaySession)  # the fields a resumed worker's session has
    session.rank, session._raylet, session._queue = 0, os.getppid(), None
    session._taken = {"step-00000020", "step-00000024"}  # stored at its resume
    assert session.report({"step": 24}, None, "step-00000024") == "step-00000024-r1"
    assert session.report({"step": 28}, None, "step-00000028") == "step-00000028"
    assert reported == ["step-00000024-r1", "step-00000028"]
