"""`rcpipe train` through a cluster's Jobs API (rcpipe/train/jobs.py), and a two-node Ray
cluster on this machine that loses the node training a variant and finishes on the other."""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rcpipe import stages
from rcpipe.config import load_config
from rcpipe.errors import InputError
from rcpipe.train.jobs import entrypoint, is_jobs_api, job_config, jobs_api_address
from tests import ray_nodes
from tests.conftest import AWS_WORKER_ENV, SynthData

TINY = {"hidden": 8, "char_dim": 4, "char_hidden": 8, "layers": 1, "highway_layers": 1}


def test_a_dashboard_url_means_the_jobs_api() -> None:
    assert is_jobs_api("http://head:8265") and is_jobs_api("https://ray.example.org")
    assert not any(is_jobs_api(a) for a in (None, "auto", "127.0.0.1:6379"))


def test_ray_address_may_name_the_jobs_api_as_rays_own_cli_reads_it(
        make_config, synth_v1: SynthData, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
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
        make_config, synth_v1: SynthData, tmp_path: Path) -> None:  # noqa: ANN001
    cfg = make_config(synth_v1, train={"ray_address": "http://head:8265", "max_steps": 7})
    shared = tmp_path / "shared dir"
    shared.mkdir()
    fake = tmp_path / "bin" / "rcpipe"  # what the head's rcpipe would be handed
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$@"\npwd\ncp "$4" job.yaml\n')
    fake.chmod(0o755)
    command = entrypoint("bidaf", job_config(cfg), shared, force=True)
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                         env={"PATH": f"{fake.parent}:/usr/bin:/bin"}, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    argv, where = ran.stdout.splitlines()[:2]
    assert argv.startswith("train bidaf --params /") and argv.endswith(" --force")
    assert where == str(shared)
    again = load_config(shared / "job.yaml")  # the params as the job read them
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


# Holds the head's only CPU until killed, so the training worker can start only on the
# second node; killing it frees the head for the restarted worker group.
HOLD = textwrap.dedent("""
    import sys, ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
    ray.init(address=sys.argv[1], logging_level="ERROR")
    head = next(n["NodeID"] for n in ray.nodes()
                if n["Alive"] and "node:__internal_head__" in n["Resources"])
    hold = ray.remote(num_cpus=1)(type("Hold", (), {"ready": lambda self: True}))
    actor = hold.options(scheduling_strategy=On(head, soft=False)).remote()
    ray.get(actor.ready.remote())
    print("holding", flush=True)
    sys.stdin.read()
""")


def _checkpoints(s3: Any, prefix: str) -> list[int]:
    listed = s3.list_objects_v2(Bucket="rcpipe-test", Prefix=prefix).get("Contents", [])
    return sorted({int(o["Key"].split("step-")[1][:8]) for o in listed
                   if "/step-" in o["Key"] and o["Key"].endswith("/state.pt")})


@pytest.mark.integration
@pytest.mark.slow
def test_a_two_node_cluster_loses_the_training_node_and_the_job_finishes_on_the_other(
        make_config, synth_v1: SynthData, tmp_path: Path, s3: Any,  # noqa: ANN001
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    endpoint = s3.meta.endpoint_url
    env = ray_nodes.node_env({**AWS_WORKER_ENV, "AWS_ENDPOINT_URL": endpoint})
    short = Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp"))  # Ray's sockets: <= 107 bytes
    head, gcs, jobs_api = ray_nodes.start_head(short / "head", env, cpus=1)
    nodes = [head]
    try:
        second = ray_nodes.start(short / "second", env, "--address", gcs, "--num-cpus", "1")
        nodes.append(second)
        hold = subprocess.Popen([sys.executable, "-c", HOLD, gcs], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert hold.stdout is not None and hold.stdout.readline().strip() == "holding"

        monkeypatch.chdir(tmp_path)
        cfg = make_config(synth_v1, models={"bidaf": TINY}, train={
            "ray_address": jobs_api, "storage_path": "s3://rcpipe-test/nodes",
            "max_steps": 40, "eval_every": 4, "batch_size": 4, "epochs": 50,
            "max_failures": 2, "cpus_per_worker": 1, "threads": 1})
        stages.prepare(cfg)
        outcome: dict[str, Any] = {}
        run = threading.Thread(target=lambda: outcome.update(
            summary=stages.train(cfg, "bidaf")), daemon=True)
        caplog.set_level(logging.INFO, logger="rcpipe.train.jobs")
        run.start()
        deadline = time.monotonic() + 240
        while not (seen := _checkpoints(s3, "nodes/bidaf/checkpoints/")):
            assert run.is_alive() and time.monotonic() < deadline, caplog.messages[-20:]
            time.sleep(0.2)
        hold.kill()  # the head's CPU is free for the restarted worker group
        second.raylet().kill()  # SIGKILL: the node that trains is gone
        killed_at, last_before = time.monotonic(), max(seen)
        # past any checkpoint the lost node could still have been writing: the new group's
        while max(_checkpoints(s3, "nodes/bidaf/checkpoints/")) <= last_before + 4:
            assert run.is_alive() and time.monotonic() < deadline, caplog.messages[-20:]
            time.sleep(0.2)
        recovered_s = time.monotonic() - killed_at
        run.join(timeout=300)
        summary = outcome["summary"]
    finally:
        ray_nodes.stop_all(nodes)
    assert summary["finished"] and summary["steps"] == 40
    assert 0 < summary["resumed_from_step"] <= last_before + 4
    assert (tmp_path / "models/bidaf/model.pt").is_file()
    job_lines = [r.message for r in caplog.records if r.name == "rcpipe.train.jobs"]
    assert any("submitted Ray job" in line for line in job_lines)
    assert any("bidaf" in line and "F1" in line for line in job_lines)  # the job's own log
    print(f"\nnode lost after checkpoint step {last_before}; resumed from step "
          f"{summary['resumed_from_step']}; a checkpoint of the restarted workers "
          f"{recovered_s:.1f} s after the kill")

