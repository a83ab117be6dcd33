"""job_runs.fitting and stop_followed without a Ray: a cancelled process waits until its
local fits have stopped calling Ray (so that it may shut its Ray down), and starts none."""

from __future__ import annotations

import threading
import time

import pytest

from rcpipe.cluster import job_runs


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_runs, "_cancelled", threading.Event())


def test_stop_followed_returns_once_every_fit_has_left() -> None:
    inside, events = threading.Event(), []

    def fit() -> None:  # as train_job.fit: polls, then leaves after a last Ray call
        with job_runs.fitting():
            inside.set()
            while not job_runs.cancelled():
                time.sleep(0.05)
            time.sleep(0.3)  # the abort's round trip
            events.append("fit left")

    thread = threading.Thread(target=fit)
    thread.start()
    inside.wait(5)
    job_runs.stop_followed(events.append)
    events.append("stop_followed returned")
    thread.join(5)
    assert events == ["fit left", "stop_followed returned"]
    assert job_runs.cancelled()


def test_a_cancelled_process_starts_no_fit() -> None:
    job_runs.stop_followed()
    with pytest.raises(RuntimeError, match="cancelled"), job_runs.fitting():
        pytest.fail("a fit started in a cancelled process")


def test_a_fit_that_never_leaves_is_named_and_waited_for_no_longer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_runs, "STOP_WAIT_S", 0.3)
    inside, release = threading.Event(), threading.Event()

    def stuck() -> None:
        with job_runs.fitting():
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=stuck)
    thread.start()
    inside.wait(5)
    lines: list[str] = []
    job_runs.stop_followed(lines.append)
    release.set()
    thread.join(5)
    assert lines == ["1 Ray Train job(s) still followed after 0 s: they end with this "
                     "process's Ray"]
