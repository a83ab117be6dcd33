"""`rcpipe train` through a cluster's Jobs API (rcpipe/cluster/jobs_api.py, job_runs.py); a
two-node cluster that loses a node under a deployment's run is
tests/integration/test_prefect_deployment.py, a Prefect cancellation of the flow's train
task tests/flows/test_train_all_jobs.py.

A job's life (one per run and variant, stopped with its interrupted submitter) is tested with
the real `rcpipe train` submitting to a real Jobs API (lifecycle_jobs_api) whose job is a
shell loop that holds while ./hold exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcpipe import cli, stages
from rcpipe.cluster.job_runs import default_run, run_jobs
from rcpipe.cluster.jobs_api import entrypoint, is_jobs_api, job_config, jobs_api_address
from rcpipe.errors import InputError
from tests import ray_nodes
from tests.conftest import SynthData

TINY = {"hidden": 8, "char_dim": 4, "char_hidden": 8, "layers": 1, "highway_layers": 1}


def test_a_dashboard_url_means_the_jobs_api() -> None:
    assert is_jobs_api("http://head:8265") and is_jobs_api("https://ray.example.org")
    assert not any(is_jobs_api(a) for a in (None, "auto", "127.0.0.1:6379"))


def test_ray_address_may_name_the_jobs_api_as_rays_own_cli_reads_it(
        make_config, synth_v1: SynthData, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert jobs_api_address(make_config(synth_v1)) == "http://head:8265"
    assert jobs_api_address(make_config(synth_v1, train={"ray_address": "auto"})) == \
        "http://head:8265"
    # a cluster named in the params wins; inside a job RAY_ADDRESS is the cluster's GCS
    assert jobs_api_address(make_config(synth_v1, train={"ray_address": "10.0.0.1:6379"})) \
        is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert jobs_api_address(make_config(synth_v1, train={"ray_address": "auto"})) is None


def test_the_job_runs_the_same_config_in_the_same_directory(
        make_config, synth_v1: SynthData, tmp_path: Path,  # noqa: ANN001
        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(synth_v1, train={"ray_address": "http://head:8265", "max_steps": 7})
    shared = tmp_path / "shared dir"
    shared.mkdir()
    fake = tmp_path / "bin" / "rcpipe"  # what the head's rcpipe would be handed
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$@"\npwd\necho "$RCPIPE_PARAMS_NAMED_AS"\n'
                    'cp "$4" job.yaml\n')
    fake.chmod(0o755)
    command = entrypoint("bidaf", job_config(cfg), shared, force=True,
                         named_as="their params.yaml")
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                         env={"PATH": f"{fake.parent}:/usr/bin:/bin"}, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    argv, where, named = ran.stdout.splitlines()[:3]
    assert argv.startswith("train bidaf --params /") and argv.endswith(" --force")
    assert where == str(shared)
    # the params as the job read them, its lines and records naming the submitter's file
    monkeypatch.setenv(named_as_env := "RCPIPE_PARAMS_NAMED_AS", named)
    again = cli._config([shared / "job.yaml"], None)
    assert again.source == "their params.yaml"
    monkeypatch.delenv(named_as_env)
    assert again.train.ray_address == "auto"
    assert again.model_dump() == cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"ray_address": "auto"})}).model_dump()
    gone = subprocess.run(["bash", "-c", entrypoint("bidaf", "x: 1", tmp_path / "nope", False)],
                          capture_output=True, text=True)
    assert gone.returncode == 2 and "not on this node" in gone.stderr


def test_no_jobs_api_at_the_address_is_one_located_error(
        make_config, synth_v1: SynthData) -> None:  # noqa: ANN001
    address = f"http://127.0.0.1:{ray_nodes.free_port()}"  # nothing listens there
    cfg = make_config(synth_v1, train={"ray_address": address})
    with pytest.raises(InputError) as err:
        stages.train(cfg, "bidaf")
    assert err.value.location == "train.ray_address" and address in err.value.what


def test_ray_api_server_address_comes_first_as_in_rays_cli(
        make_config, synth_v1: SynthData, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """ray/dashboard/utils.py (get_address_for_submission_client): RAY_API_SERVER_ADDRESS,
    else RAY_ADDRESS, and either overrides the address the job client is handed."""
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://api:8265")
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert jobs_api_address(make_config(synth_v1)) == "http://api:8265"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a GCS: no Jobs API of its own
    assert jobs_api_address(make_config(synth_v1, train={"ray_address": "auto"})) == \
        "http://api:8265"
    same = make_config(synth_v1, train={"ray_address": "http://api:8265/"})
    assert jobs_api_address(same) == "http://api:8265/"
    # the params name another Jobs API: Ray's client would go to the environment's; refused
    with pytest.raises(InputError) as err:
        jobs_api_address(make_config(synth_v1, train={"ray_address": "http://other:8265"}))
    assert err.value.location == "train.ray_address"
    assert "RAY_API_SERVER_ADDRESS=http://api:8265" in err.value.what
    # a cluster to join (ray.init) named in the params is no Jobs API, whatever the env says
    assert jobs_api_address(make_config(synth_v1, train={"ray_address": "10.0.0.1:6379"})) \
        is None
    # the job itself joins its cluster: the entrypoint drops the variable
    script = entrypoint("bidaf", "x: 1", Path("/shared"), force=False)
    assert script.index("unset RAY_API_SERVER_ADDRESS\n") < script.index("exec rcpipe train")


def test_a_bad_run_name_is_one_line_and_exit_2(make_config, synth_v1: SynthData,  # noqa: ANN001
                                                tmp_path: Path) -> None:
    make_config(synth_v1)  # tmp_path/params.yaml
    out = subprocess.run([sys.executable, "-m", "rcpipe", "train", "bidaf", "--set",
                          "train.ray_address=http://127.0.0.1:9", "--run-name", "no/slash"],
                         cwd=tmp_path, env=ray_nodes.node_env({}), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: --run-name: no/slash: a run name is 1 to 64 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit"]


# ------------------------------------------------------------- a job's life (a real Jobs API)


def _submitter(cwd: Path, url: str, *args: str) -> subprocess.Popen[str]:
    """`rcpipe train bidaf` submitting to ``url``, its lines in cwd/submitter-<n>.log."""
    log = cwd / f"submitter-{len(list(cwd.glob('submitter-*.log')))}.log"
    with log.open("w") as out:
        # SIGINT as in a terminal, even where this test runs in the background (ignored)
        return subprocess.Popen(
            [sys.executable, "-m", "rcpipe", "train", "bidaf", "--set",
             f"train.ray_address={url}", *args], cwd=cwd, env=ray_nodes.node_env({}),
            stdout=out, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _until(what: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def _held_job(client: Any, run: str, cwd: Path) -> Any:
    """The run's one job once its shell loop runs (it wrote its pid)."""
    def running() -> Any:
        jobs = run_jobs(client, run, "bidaf")
        return jobs[-1][1] if jobs and (cwd / "pid-bidaf").is_file() and \
            jobs[-1][1].status == "RUNNING" else None
    return _until(running)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def jobs_client(lifecycle_jobs_api: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from ray.job_submission import JobSubmissionClient

    for key in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):  # they would override the URL
        monkeypatch.delenv(key, raising=False)
    return JobSubmissionClient(lifecycle_jobs_api)


@pytest.mark.integration
def test_ctrl_c_stops_the_job_and_a_detached_one_is_followed_again(
        make_config, synth_v1: SynthData, tmp_path: Path, lifecycle_jobs_api: str,  # noqa: ANN001
        jobs_client: Any) -> None:
    make_config(synth_v1)  # tmp_path/params.yaml
    (tmp_path / "hold").touch()
    detached = _submitter(tmp_path, lifecycle_jobs_api, "--run-name", "ctrl-c", "--detach")
    job = _held_job(jobs_client, "ctrl-c", tmp_path)
    assert job.submission_id == "rcpipe-ctrl-c-bidaf-1"
    # SIGTERM (a pod evicted) is an interruption as Ctrl-C is: here it leaves the job running
    detached.send_signal(signal.SIGTERM)
    assert detached.wait(timeout=60) == 128 + signal.SIGTERM
    assert "left running (--detach)" in (tmp_path / "submitter-0.log").read_text()
    assert jobs_client.get_job_status(job.submission_id) == "RUNNING"

    # the same command, not detached, follows that job; Ctrl-C now stops it
    follower = _submitter(tmp_path, lifecycle_jobs_api, "--run-name", "ctrl-c")
    log = tmp_path / "submitter-1.log"
    _until(lambda: "following the unfinished Ray job rcpipe-ctrl-c-bidaf-1" in log.read_text()
           and "rcpipe train bidaf" in log.read_text())  # it relays the job's lines
    follower.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    _until(lambda: jobs_client.get_job_status(job.submission_id) == "STOPPED", timeout=30)
    stopped_s = time.monotonic() - t0
    assert follower.wait(timeout=30) != 0
    assert stopped_s < 10, stopped_s
    assert not _alive(tmp_path / "pid-bidaf")  # the job's process is gone, not just marked
    assert "Ray job rcpipe-ctrl-c-bidaf-1 stopped (STOPPED)" in log.read_text()
    assert [j.submission_id for _, j in run_jobs(jobs_client, "ctrl-c", "bidaf")] == \
        ["rcpipe-ctrl-c-bidaf-1"]
    print(f"\nCtrl-C -> job STOPPED in {stopped_s:.1f} s")


@pytest.mark.integration
def test_submitting_twice_makes_one_job_and_a_rerun_the_next_attempt(
        make_config, synth_v1: SynthData, tmp_path: Path, lifecycle_jobs_api: str,  # noqa: ANN001
        jobs_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(synth_v1, train={"ray_address": lifecycle_jobs_api})
    (tmp_path / "hold").touch()
    # two at once: whichever lists or submits second follows the first one's job
    both = [_submitter(tmp_path, lifecycle_jobs_api) for _ in range(2)]
    run = default_run(tmp_path.resolve(), None)  # no run name: the directory's run
    job = _held_job(jobs_client, run, tmp_path)
    logs = [tmp_path / f"submitter-{i}.log" for i in range(2)]
    _until(lambda: all("rcpipe train bidaf" in log.read_text() for log in logs))
    said = sorted("following the unfinished" in log.read_text() for log in logs)
    assert said == [False, True]  # one submitted, one followed
    (tmp_path / "hold").unlink()  # the job finishes; both submitters end with it
    assert [p.wait(timeout=60) for p in both] == [0, 0]
    assert [j.submission_id for _, j in run_jobs(jobs_client, run, "bidaf")] == \
        [job.submission_id]
    assert job.submission_id == f"rcpipe-{run}-bidaf-1"

    # finished, its id is spent: the same train again (here in-process) is the next attempt
    monkeypatch.chdir(tmp_path)
    assert stages.train(cfg, "bidaf") == {"finished": True}  # the job's summary
    assert [(a, j.status) for a, j in run_jobs(jobs_client, run, "bidaf")] == \
        [(1, "SUCCEEDED"), (2, "SUCCEEDED")]
