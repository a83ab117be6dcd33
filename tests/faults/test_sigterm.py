"""Issue 56: `rcpipe serve` and SIGTERM, what a container runtime and systemd send to stop a
service. SIGINT exited 0 and left nothing; SIGTERM exited -6 (SIGABRT: Ray's own handler)
and left `ray::DashboardAgent` and `ray::RuntimeEnvAgent` running. SIGTERM now ends the
service as SIGINT does.

Issue 72 (item 11): a SIGTERM during the start-up, while Ray started, exited 15 (ray.init's
own handler); now every moment of it ends with 0 and nothing left of the service's session."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests import ray_nodes
from tests.faults.test_abuse import PKG, here, run_dir

__all__ = ["here", "run_dir"]  # the abuse cases' run directory: a package of bidaf

BIN = Path(sys.executable).parent
START_S = 300  # a start-up beside a busy machine's other work
STOP_S = 180  # the stop: a SIGTERM while Ray starts waits for ray.init, then shuts it down


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _session(sid: int) -> list[psutil.Process]:
    """The live processes of session ``sid``: `rcpipe serve` started in its own session, its
    local Ray's processes (GCS, raylet, agents, workers) are in it too."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(p.pid) == sid and _alive(p):
                found.append(p)
    return found


def _ray_processes(proc: psutil.Process) -> list[psutil.Process]:
    """The Ray processes ``proc`` started (its local Ray: raylet, GCS, agents, workers)."""
    found = []
    for p in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any("ray" in part for part in p.cmdline()):
                found.append(p)
    return found


class Serving:
    """`rcpipe serve` of the abuse cases' package in its own session, its output in a file."""

    def __init__(self, here: Path, log: Path) -> None:
        self.port, self.log = ray_nodes.free_port(), log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "rcpipe"), "serve", "--model", PKG, "--port", str(self.port),
                 "--set", "serve.replica_cpus=0"], cwd=here, start_new_session=True,
                env=ray_nodes.node_env({"NO_COLOR": "1"}), stdout=out, stderr=out)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def until(self, seen: Callable[[], bool], what: str) -> None:
        """Wait for an event of the start-up (no fixed sleep: a busy machine is slower)."""
        deadline = time.monotonic() + START_S
        while not seen():
            assert self.proc.poll() is None and time.monotonic() < deadline, \
                (what, self.proc.poll(), self.output()[-3000:])
            time.sleep(0.1)

    def answers(self, status: int) -> bool:
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=10
                             ).status_code == status
        return False

    def has(self, title: str) -> bool:
        with contextlib.suppress(psutil.Error):
            return any(title in " ".join(p.cmdline())
                       for p in psutil.Process(self.proc.pid).children(recursive=True))
        return False

    def stopped(self) -> None:
        """SIGTERM now: exit 0, nothing of its session left, no traceback said."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(STOP_S)
        assert code == 0, (code, self.output()[-3000:])
        deadline = time.monotonic() + 30  # Ray's processes end a moment after their driver
        while (left := _session(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, [" ".join(p.cmdline())[:60] for p in left]
        assert "Traceback" not in self.output()

    def end(self) -> None:
        """Whatever a failed run left: this test's own session only."""
        if self.proc.poll() is None:
            self.proc.kill()
        for p in _session(self.proc.pid):
            with contextlib.suppress(psutil.Error):
                p.kill()
        self.proc.wait()


@contextlib.contextmanager
def serving(here: Path, tmp_path: Path) -> Iterator[Serving]:
    s = Serving(here, tmp_path / "serve.log")
    try:
        yield s
    finally:
        s.end()


@pytest.mark.integration  # `rcpipe serve` starts its own local Ray
def test_sigterm_ends_rcpipe_serve_as_sigint_does(here: Path, tmp_path: Path) -> None:
    with serving(here, tmp_path) as s:
        s.until(lambda: s.answers(200), "the service up")
        started = _ray_processes(psutil.Process(s.proc.pid))
        titles = {" ".join(p.cmdline())[:40] for p in started}
        assert any("ray::" in t for t in titles), titles  # its agents, as the issue saw
        s.stopped()


# moments of the start-up, each an event a SIGTERM follows at once (the service up: above)
MOMENTS: dict[str, Callable[[Serving], bool]] = {
    # the guard answers 503 on the port while the models load, before any Ray
    "models_loading": lambda s: s.answers(503),
    # Ray's first process: ray.init under way (before: exit 15, ray.init's own handler)
    "ray_starting": lambda s: s.has("gcs_server"),
    # (Ray up and Serve deploying held before the fix: the service-up test above stops a
    # Serve through the same path, so that moment costs the suite no ~50 s of its own)
}


@pytest.mark.integration  # `rcpipe serve` starts its own local Ray
@pytest.mark.parametrize("moment", MOMENTS)
def test_sigterm_at_any_moment_of_the_start_up_ends_with_0_and_nothing_left(
        here: Path, tmp_path: Path, moment: str) -> None:
    with serving(here, tmp_path) as s:
        s.until(lambda: MOMENTS[moment](s), moment)
        s.stopped()


def test_a_stop_python_swallowed_in_a_finalizer_is_delivered_again(
        capsys: pytest.CaptureFixture[str]) -> None:
    """CI, 2026-12-03: the SIGTERM came while the garbage collector ran a weakref callback
    (the models loading); Python printed the KeyboardInterrupt as "Exception ignored" with
    its traceback, dropped it, and the start-up went on. It is delivered again now."""
    from rcpipe.stages.serving import sigterm_stops

    class Dropped:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs on one of these lines, in __del__
                pass

    went_on, hook = [], sys.unraisablehook
    with sigterm_stops():
        Dropped()  # collected at once
        time.sleep(30)  # the stop delivered again ends this (a moment later) or nothing does
        went_on.append(True)
    assert not went_on
    assert "Exception ignored" not in capsys.readouterr().err
    assert sys.unraisablehook is hook  # put back as it was
