"""Issue 56: `rcpipe serve` and SIGTERM, what a container runtime and systemd send to stop a
service. SIGINT exited 0 and left nothing; SIGTERM exited -6 (SIGABRT: Ray's own handler)
and left `ray::DashboardAgent` and `ray::RuntimeEnvAgent` running. SIGTERM now ends the
service as SIGINT does."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests import ray_nodes
from tests.faults.test_abuse import PKG, here, run_dir

__all__ = ["here", "run_dir"]  # the abuse cases' run directory: a package of bidaf

BIN = Path(sys.executable).parent


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _ray_processes(proc: psutil.Process) -> list[psutil.Process]:
    """The Ray processes ``proc`` started (its local Ray: raylet, GCS, agents, workers)."""
    found = []
    for p in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any("ray" in part for part in p.cmdline()):
                found.append(p)
    return found


@pytest.mark.integration  # `rcpipe serve` starts its own local Ray
def test_sigterm_ends_rcpipe_serve_as_sigint_does(here: Path, tmp_path: Path) -> None:
    port = ray_nodes.free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / "rcpipe"), "serve", "--model", PKG, "--port", str(port),
         "--set", "serve.replica_cpus=0"],
        cwd=here, env=ray_nodes.node_env({"NO_COLOR": "1"}), stdout=log, stderr=log)
    started: list[psutil.Process] = []
    try:
        deadline, up = time.monotonic() + 300, False
        with httpx.Client(timeout=10) as client:
            while time.monotonic() < deadline and proc.poll() is None and not up:
                with contextlib.suppress(httpx.TransportError):
                    up = client.get(f"http://127.0.0.1:{port}/health").status_code == 200
                time.sleep(0.5)
        assert up, (tmp_path / "serve.log").read_text()[-3000:]
        started = _ray_processes(psutil.Process(proc.pid))
        titles = {" ".join(p.cmdline())[:40] for p in started}
        assert any("ray::" in t for t in titles), titles  # its agents, as the issue saw
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        assert code == 0, (code, (tmp_path / "serve.log").read_text()[-3000:])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(_alive, started)):
            time.sleep(0.5)
        left = [p.pid for p in started if _alive(p)]
        assert not left, left
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
        for p in started:  # whatever a failed run left: this test's own processes only
            with contextlib.suppress(psutil.Error):
                p.kill()
