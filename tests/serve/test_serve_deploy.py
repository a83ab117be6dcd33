"""Serve as Ray users deploy it, on the module's own Ray cluster (`ray start --head` with its
dashboard, as on a VM; tests/ray_nodes.py):

1. `rcpipe serve` joining it (RAY_ADDRESS) answers 503 with Retry-After from the moment it
   listens until its app is deployed, then 200: never Serve's 404 ("no such route").
2. `serve deploy infra/serve/rcpipe.yaml` is accepted and the app answers from the champion
   (the file as written, but for what this machine differs in: the workspace and params
   paths, a free port, Readers sized for 2 CPUs).
3. Readers reserve a GPU only where serve.replica_gpus says so (no Ray needed).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from rcpipe import stages
from rcpipe.config import effective_yaml
from rcpipe.serve.app import Limits
from tests import ray_nodes
from tests.conftest import Trained
from tests.serve.conftest import champion_workspace, crown_night, light

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ASK = {"context": "Ada wrote it in 1843.", "question": "When did Ada write it?"}


@pytest.fixture(scope="module")
def head() -> Iterator[tuple[str, str]]:
    """(GCS address, dashboard URL) of a 2-CPU head on this machine, for the module."""
    short = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))  # Ray's sockets: <= 107 bytes
    node, gcs, api = ray_nodes.start_head(short / "head", ray_nodes.node_env({}), cpus=2)
    try:
        yield gcs, api
    finally:
        ray_nodes.stop_all([node])


@pytest.fixture(scope="module")
def package(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deploy") / "made" / "bidaf"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)
        return stages.package(trained.cfg, "bidaf", out)


def _params(trained: Trained, path: Path) -> Path:
    path.write_text(effective_yaml(light(trained.cfg)))  # Readers hold no Ray CPU
    return path


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.slow
def test_rcpipe_serve_answers_503_with_retry_after_until_its_app_is_up(
        head: tuple[str, str], package: Path, trained: Trained, tmp_path: Path) -> None:
    port = ray_nodes.free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / "rcpipe"), "serve", "--params", str(_params(trained, tmp_path / "p.yaml")),
         "--model", str(package), "--port", str(port)],
        env=ray_nodes.node_env({"RAY_ADDRESS": head[0]}), stdout=log, stderr=log)
    seen: list[tuple[int, str | None]] = []
    try:
        deadline = time.monotonic() + 300
        with httpx.Client(timeout=10) as client:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    r = client.get(f"http://127.0.0.1:{port}/health")
                except httpx.TransportError:  # the process is still importing: not listening
                    time.sleep(0.1)
                    continue
                seen.append((r.status_code, r.headers.get("retry-after")))
                if r.status_code == 200:
                    break
                time.sleep(0.2)
            answered = client.post(f"http://127.0.0.1:{port}/answer", json=ASK, timeout=60)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    statuses = [s for s, _ in seen]
    assert statuses and statuses[-1] == 200, (seen, (tmp_path / "serve.log").read_text()[-3000:])
    assert statuses[0] == 503 and set(statuses) == {503, 200}, seen
    assert {after for s, after in seen if s == 503} == {"2"}
    assert answered.status_code == 200 and answered.json()["model"] == str(package)
    print(f"\n{statuses.count(503)} answers 503 (Retry-After: 2) while the app deployed")


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.slow
def test_serve_deploy_accepts_the_serve_config_file(
        head: tuple[str, str], package: Path, trained: Trained, tmp_path: Path) -> None:
    where = champion_workspace(tmp_path / "work")
    crown_night(where, "n1", package, crowned=True)
    config = yaml.safe_load((REPO / "infra/serve/rcpipe.yaml").read_text())
    port = ray_nodes.free_port()
    config["http_options"]["port"] = port
    app = config["applications"][0]
    app["args"] |= {"workspace": str(tmp_path / "work"),
                    "params": str(_params(trained, tmp_path / "p.yaml")),
                    "set": ["serve.replica_cpus=0"]}  # 2 CPUs here, not 2 a replica
    (tmp_path / "rcpipe.yaml").write_text(yaml.safe_dump(config))
    env = ray_nodes.node_env({})
    serve = [str(BIN / "serve")]
    try:
        done = subprocess.run([*serve, "deploy", str(tmp_path / "rcpipe.yaml"),
                               "--address", head[1]], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        deadline, answered = time.monotonic() + 300, None
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < deadline:
                try:
                    answered = client.post(f"http://127.0.0.1:{port}/answer", json=ASK)
                    if answered.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(1)
        status = subprocess.run([*serve, "status", "--address", head[1]], env=env,
                                capture_output=True, text=True, timeout=60).stdout
    finally:
        subprocess.run([*serve, "shutdown", "-y", "--address", head[1]], env=env,
                       capture_output=True, timeout=120)
    assert answered is not None and answered.status_code == 200, status
    assert answered.json()["model"] == "champion" and answered.json()["night"] == "n1"
    assert "RUNNING" in status


def test_readers_reserve_a_gpu_only_where_the_params_say_so() -> None:
    from rcpipe.serve.deployments import Scaling, application

    def actor_options(scaling: Scaling, models: list[str]) -> list[dict[str, float]]:
        app = application({m: lambda: None for m in models}, {}, None, models, Limits(),
                          False, scaling)
        if len(models) == 1:  # the Reader holds the routes itself (Solo)
            return [app._bound_deployment.ray_actor_options]
        readers = app._bound_deployment.init_args[0]  # the Ingress's handles, bound
        return [readers[m]._bound_deployment.ray_actor_options for m in models]

    for models in (["m"], ["m", "n"]):
        assert actor_options(Scaling(), models) == [{"num_cpus": 1.0}] * len(models)
        assert actor_options(Scaling(replica_cpus=2, replica_gpus=0.5), models) == [
            {"num_cpus": 2, "num_gpus": 0.5}] * len(models)


def test_a_replica_loads_on_the_device_it_reserved() -> None:
    from rcpipe.config import load_config
    from rcpipe.trained.reader import on_device

    cpu = load_config(None, ["train.device=auto"])
    gpu = load_config(None, ["train.device=auto", "serve.replica_gpus=1"])
    assert on_device(cpu).train.device == "cpu"  # a CPU replica never takes a GPU
    assert on_device(gpu).train.device == "cuda"
    assert on_device(gpu, replica=False).train.device == "cpu"  # the driver's check
