"""The markers' rules, as pytest hooks (tests/conftest.py imports them).

Two checks, both cheap:

- Always: a test that asks for a fixture that starts Ray, Prefect or S3, or trains, must
  carry that fixture's marker (HEAVY_FIXTURES; pytest's fixture closure includes the
  fixtures a fixture asks for). Read from what pytest collected, so it also catches a test
  that would only reuse a session fixture another test started, which no run-time check
  sees; the test fails before its fixtures start.
- With RCPIPE_MARKER_AUDIT=1 (make test-fast): the run-time audit of
  tests/marker_audit/sitecustomize.py, for what a test starts itself, in its body, in a
  helper, in a fixture of its module or in a subprocess. In the fast selection nothing
  heavy may start at all, so a start there is never hidden behind a marked test that
  started the thing first.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.marker_audit import job_ledger
from tests.marker_audit import sitecustomize as audit

AUDIT_DIR = Path(audit.__file__).resolve().parent
_SEEN = pytest.StashKey[int]()  # a test's refusals already reported

# the shared fixtures that start something heavy, and the marker each asks of a test
HEAVY_FIXTURES = {
    "local_ray": "integration",  # ray.init (and join_local_ray, trained, serve's through it)
    "lifecycle_jobs_api": "integration",  # `ray start` of a head
    "s3": "integration",  # moto's server
    "prefect_api": "integration",  # prefect_test_harness
    "prefect_stack": "integration",  # `prefect server start`, a worker
    "trained": "trains",  # stages.train on Ray Train
    "undisturbed": "trains",  # train_local
}


def fixture_violations(item: pytest.Item) -> list[str]:
    names = getattr(item, "fixturenames", ())
    return [f"{item.nodeid} uses the fixture {name} but is not marked {marker}"
            for name, marker in HEAVY_FIXTURES.items()
            if name in names and item.get_closest_marker(marker) is None]


def audit_on() -> bool:
    return os.environ.get(audit.SWITCH) == "1"


def pytest_configure(config: pytest.Config) -> None:
    """The job ledger in every run (tests/job_count.py reads it), the audit where asked;
    both through every Python subprocess's start-up (this directory on PYTHONPATH)."""
    if not os.environ.get(job_ledger.LEDGER):  # xdist's workers inherit the controller's
        fd, ledger = tempfile.mkstemp(prefix="rcpipe-ray-train-jobs-", suffix=".jsonl")
        os.close(fd)
        os.environ[job_ledger.LEDGER] = ledger
    if audit_on() and not os.environ.get(audit.LOG):
        fd, log = tempfile.mkstemp(prefix="rcpipe-marker-audit-", suffix=".log")
        os.close(fd)
        os.environ[audit.LOG] = log
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(AUDIT_DIR) not in paths:  # every Python subprocess imports the audit
        os.environ["PYTHONPATH"] = os.pathsep.join([str(AUDIT_DIR), *filter(None, paths)])
    audit.install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    found = fixture_violations(item)
    if found:
        pytest.fail("\n".join(found) + " (pyproject.toml's markers)", pytrace=False)


def _allowed(item: pytest.Item) -> str:
    return ",".join(kind for marker, kinds in audit.ALLOWS.items()
                    if item.get_closest_marker(marker) for kind in kinds)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if not audit_on():
        yield
        return
    os.environ[audit.TEST] = item.nodeid
    os.environ[audit.ALLOWED] = _allowed(item)
    try:
        yield
    finally:
        os.environ[audit.TEST] = os.environ[audit.ALLOWED] = ""


def _refusals(nodeid: str) -> list[str]:
    try:
        lines = Path(os.environ[audit.LOG]).read_text(encoding="utf-8").splitlines()
    except (KeyError, OSError):
        return []
    return [line for line in lines if line.split("\t", 1)[0] == nodeid]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A refusal fails the test even where the test passed: a subprocess refused (its
    command failed) where the test expected a failure, or caught the error."""
    outcome = yield
    if not audit_on():
        return
    report = outcome.get_result()
    found = _refusals(item.nodeid)
    seen = item.stash.get(_SEEN, 0)
    if len(found) > seen:
        item.stash[_SEEN] = len(found)
        if not report.failed:
            report.outcome = "failed"
            report.longrepr = "marker audit: " + "\n".join(
                f"{test} {audit.VERB[kind]} ({what}) but is not marked "
                f"{audit.MARKER_OF[kind]} [in process {pid}]"
                for test, kind, what, pid in (line.split("\t") for line in found[seen:]))

