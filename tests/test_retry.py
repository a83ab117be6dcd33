"""rcpipe/retry.py: the one retry policy, and `dvc push` through it (release/remote.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rcpipe import retry
from rcpipe.errors import InputError
from rcpipe.release import remote
from rcpipe.retry import GaveUp, retried


def test_each_wait_is_twice_the_last_and_the_last_failure_is_given_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", sleeps.append)
    calls: list[int] = []

    def down() -> None:
        calls.append(1)
        raise OSError(f"down {len(calls)}")

    with pytest.raises(GaveUp) as e:
        retried(down, 3, 2.0)
    assert sleeps == [2.0, 4.0] and e.value.tries == 3 and str(e.value.error) == "down 3"
    told: list[tuple[int, float]] = []
    assert retried(lambda: len(calls), 2, 1.0, waiting=lambda e, n, s: told.append((n, s))
                   ) == 3 and told == []  # a call that succeeds is called once


def test_a_failure_no_retry_mends_and_a_passed_deadline_end_it_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry.time, "sleep", lambda s: pytest.fail("waited"))

    def refused() -> None:
        raise InputError("x", "", "refused")

    with pytest.raises(InputError):
        retried(refused, 3, 1.0, retryable=lambda e: not isinstance(e, InputError))
    with pytest.raises(GaveUp) as e:
        retried(lambda: 1 / 0, 3, 1.0, deadline=time.monotonic())
    assert e.value.tries == 1 and isinstance(e.value.error, ZeroDivisionError)


def _push(monkeypatch: pytest.MonkeyPatch, errors: list[str], tries: int = 3
          ) -> tuple[list[float], list[Any]]:
    """`push` with dvc answering ``errors`` in turn (then success), no real wait."""
    sleeps: list[float] = []
    calls: list[Any] = []
    monkeypatch.setattr(retry.time, "sleep", sleeps.append)

    def dvc(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        err = errors[len(calls) - 1] if len(calls) <= len(errors) else ""
        return subprocess.CompletedProcess(args, 1 if err else 0, "", err)

    monkeypatch.setattr(remote, "dvc", dvc)
    where = SimpleNamespace(name="storage", url="s3://bucket/prefix")
    remote.push(Path("."), ["train@bidaf"], where, tries)  # type: ignore[arg-type]
    return sleeps, calls


def test_push_retries_an_unreachable_remote_with_backoff_then_says_so_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    down = "ERROR: failed to push data to the cloud - Could not connect to the endpoint URL"
    sleeps, calls = _push(monkeypatch, [down, down])
    assert sleeps == [2.0, 4.0] and len(calls) == 3
    assert calls[0] == ("push", "-r", "storage", "train@bidaf")
    with pytest.raises(InputError) as e:
        _push(monkeypatch, [down] * 2, tries=2)
    assert e.value.line() == (
        "error: s3://bucket/prefix: dvc push: the remote is unreachable after 2 tries "
        "(failed to push data to the cloud - Could not connect to the endpoint URL); what "
        "was uploaded is complete: push again once it is up")


def test_push_gives_up_at_once_on_refused_credentials(monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    with pytest.raises(InputError) as e:
        _push(monkeypatch, ["ERROR: unexpected error - Unable to locate credentials"])
    assert "the remote refused the credentials" in e.value.line()
    assert "after" not in e.value.line()
