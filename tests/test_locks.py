"""rcpipe/locks.py: one run at a time per output, the holder named, a killed one's lock
taken over."""

from __future__ import annotations

import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rcpipe.errors import InputError
from rcpipe.locks import hold, lock_file

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from rcpipe.locks import hold
with hold(Path(sys.argv[1]), "bidaf is being trained"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(output: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT)), str(output),
                             str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_second_run_is_told_who_holds_the_output(tmp_path: Path) -> None:
    output = tmp_path / "models" / "bidaf"
    proc = _holder(output, 30)
    try:
        with pytest.raises(InputError) as e, hold(output, "bidaf is being evaluated"):
            pass
        pattern = (rf"error: {re.escape(str(output))}: bidaf is being trained by pid "
                   rf"{proc.pid} on {re.escape(socket.gethostname())} since "
                   r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")
        assert re.fullmatch(pattern, e.value.line()), e.value.line()
        assert e.value.exit_code == 2
    finally:
        proc.kill()
        proc.wait()
    assert lock_file(output) == tmp_path / "models" / ".bidaf.lock"  # beside, not in it


def test_wait_waits_for_the_holder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    output = tmp_path / "prepared"
    proc = _holder(output, 1.5)
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, "rcpipe.locks"), hold(output, "preparing", wait=True):
        waited = time.monotonic() - t0
    proc.wait()
    assert waited > 0.5
    assert f"by pid {proc.pid}" in caplog.text and "waiting (--wait)" in caplog.text


def test_a_killed_holders_lock_is_taken_over_with_a_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    output = tmp_path / "packages" / "bidaf"
    proc = _holder(output, 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with caplog.at_level(logging.WARNING, "rcpipe.locks"), hold(output, "packaging"):
        pass
    assert "taking over the lock of a run that ended without releasing it (killed): bidaf " \
        f"is being trained by pid {proc.pid}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "rcpipe.locks"), hold(output, "packaging"):
        pass  # released cleanly this time: nothing to take over
    assert caplog.text == ""


def test_a_stage_inside_a_stage_goes_on_another_thread_is_refused(tmp_path: Path) -> None:
    output = tmp_path / "models" / "bidaf"
    refused: list[str] = []

    def other() -> None:
        try:
            with hold(output, "evaluating"):
                pass
        except InputError as e:
            refused.append(e.line())

    with hold(output, "bidaf is being trained"), hold(output, "bidaf is being packaged"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(refused) == 1 and "bidaf is being trained by pid" in refused[0]
    with hold(output, "again"):  # released at the end of the outer block
        pass


def test_the_command_says_the_line_and_exits_2(workdir: Path) -> None:
    proc = _holder(workdir / "models" / "bidaf", 30)
    try:
        run = subprocess.run([sys.executable, "-m", "rcpipe", "evaluate", "bidaf"],
                             cwd=workdir, capture_output=True, text=True)
    finally:
        proc.kill()
        proc.wait()
    assert run.returncode == 2
    assert re.fullmatch(rf"error: models/bidaf: bidaf is being trained by pid {proc.pid} on "
                        r"\S+ since \S+\n", run.stderr), run.stderr
