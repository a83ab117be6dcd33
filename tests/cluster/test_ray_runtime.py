"""Joining a Ray cluster (rcpipe/cluster/ray_runtime.py) that asks for a token: a process
without it is told in one line what to set (a local Ray started the local cluster of
tests/conftest.py with token authentication on, as Ray >= 2.59 does by default)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

JOIN = """
from rcpipe.cluster.ray_runtime import ray_cluster
from rcpipe.errors import InputError
try:
    with ray_cluster({address!r}):
        print("joined")
except InputError as e:
    print(e.line())
"""


# `rcpipe train` / `tune` (ray_cluster) and `rcpipe serve` (join_ray) with neither
# train.ray_address nor RAY_ADDRESS, one after the other in one process
UNASKED = """
import ray
from rcpipe.cluster.ray_runtime import ray_cluster
from rcpipe.stages.serving import join_ray
with ray_cluster(None):
    print(ray.get_runtime_context().gcs_address)
join_ray(1)
print(ray.get_runtime_context().gcs_address)
ray.shutdown()
"""


@pytest.mark.integration
def test_a_cluster_ray_start_left_on_this_machine_is_not_joined_unasked() -> None:
    """`ray start` writes its address to <RAY_TMPDIR>/ray/ray_current_cluster, where a bare
    ray.init() finds it and joins, refusing rcpipe's CPU count with a traceback (seen with
    a real `ray start --head`: "When connecting to an existing cluster, num_cpus and
    num_gpus must not be provided"). Unasked, rcpipe starts a local Ray of its own, as
    docs/guide/training.md says; joining is train.ray_address's or RAY_ADDRESS's."""
    short = Path(tempfile.mkdtemp(prefix="rl-", dir="/tmp"))  # Ray's sockets: <= 107 bytes
    try:
        (short / "ray").mkdir()
        (short / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")  # as ray start
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
            "RAY_TMPDIR": str(short)}
        out = subprocess.run([sys.executable, "-c", UNASKED], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        started = out.stdout.split()[-2:]
        assert len(started) == 2 and "127.0.0.1:9" not in started, out.stdout
    finally:
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.integration
def test_a_cluster_that_asks_for_its_token_is_one_line_naming_what_to_set(
        local_ray: None) -> None:
    import ray

    address = ray.get_runtime_context().gcs_address
    assert os.environ.get("RAY_AUTH_MODE") == "token"  # what Ray set as it started it
    without = {k: v for k, v in os.environ.items()
               if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    out = subprocess.run([sys.executable, "-c", JOIN.format(address=address)], env=without,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == (
        f"error: Ray at {address}: RAY_AUTH_MODE: the cluster asks for its token and this "
        "process came without it: set RAY_AUTH_MODE=token and the cluster's token in "
        "RAY_AUTH_TOKEN (or ~/.ray/auth_token) where rcpipe runs (the shell, a flow run's job "
        "environment, the image)")
    # with the mode set, the same process joins (the token: ~/.ray/auth_token, Ray's own)
    joined = subprocess.run([sys.executable, "-c", JOIN.format(address=address)],
                            env=without | {"RAY_AUTH_MODE": "token"}, capture_output=True,
                            text=True, timeout=180)
    assert joined.stdout.strip().splitlines()[-1] == "joined", joined.stderr[-3000:]


@pytest.mark.integration
def test_the_local_rays_processes_carry_its_settings(local_ray: None) -> None:
    """start_local_ray's LOCAL_RAY_ENV reaches the daemons it starts: its log monitor scans
    for new log files every 5 s (nothing of rcpipe reads worker logs through it)."""
    import psutil

    from rcpipe.cluster.ray_runtime import LOCAL_RAY_ENV

    monitors = [p for p in psutil.Process().children(recursive=True)
                if any("log_monitor.py" in part for part in p.cmdline())]
    assert len(monitors) == 1, monitors
    environ = monitors[0].environ()
    assert {k: environ.get(k) for k in LOCAL_RAY_ENV} == LOCAL_RAY_ENV
    assert LOCAL_RAY_ENV["LOG_NAME_UPDATE_INTERVAL_S"] == "5"
