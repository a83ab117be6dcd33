"""The markers' guard (tests/markers.py, tests/marker_audit/sitecustomize.py): a test that
starts Ray, Prefect or an S3 server unmarked `integration`, or trains unmarked `trains`,
fails; make test-fast runs the rest under the audit.

Why this shape: the audit is what makes the fast selection trustworthy, and it runs where
that selection runs (make test-fast is the audited run), so it costs no second run of the
~1,070 fast tests inside this file; this file proves the audit refuses each kind of start
(in the test, in a fixture, in a subprocess, by fixture name) on a probe suite of one-line
tests, cheaply, since it refuses before starting anything, and keeps make test-fast on the
audit and the marker expression. The fixture check (tests/markers.py) runs in every run,
make test (CI) included.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.marker_audit import job_ledger
from tests.marker_audit import sitecustomize as audit
from tests.markers import HEAVY_FIXTURES

ROOT = Path(__file__).resolve().parents[1]

PROBE_CONFTEST = """
import pytest

from tests.markers import (  # noqa: F401
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_runtest_setup,
)


@pytest.fixture(scope="session")
def local_ray():  # its name is what the fixture check reads
    yield
"""

PROBE = '''
import os
import subprocess
import sys

import pytest

from tests.marker_audit import sitecustomize as audit


def test_ray_init():
    import ray
    ray.init(num_cpus=1, include_dashboard=False)


def test_ray_start(tmp_path):
    subprocess.run([sys.executable.replace("python", "ray"), "start", "--head"], check=False)


def test_moto():
    from moto.server import ThreadedMotoServer
    ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False).start()


def test_prefect():
    from prefect.server.api.server import SubprocessASGIServer
    SubprocessASGIServer().start()


def test_trains():
    from rcpipe.train.worker import Worker
    Worker.train(None)


def test_trains_in_a_subprocess():
    # as `rcpipe train` would, in an environment of its own: the command fails, the test
    # does not look
    subprocess.run([sys.executable, "-c",
                    "from rcpipe.train.worker import Worker; Worker.train(None)"],
                   capture_output=True, env={"PATH": os.environ["PATH"]})


def test_uses_local_ray(local_ray):
    pass


def test_light():
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True,
                          check=True).stdout == b"1\\n"


@pytest.mark.integration
def test_marked_integration(local_ray):
    for kind in ("ray", "prefect", "s3"):
        audit.hit(kind, "probe")


@pytest.mark.trains
def test_marked_trains():
    audit.hit("train", "probe")


@pytest.mark.integration
@pytest.mark.trains
def test_ray_train_job_unmarked_ray_train():
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    DataParallelTrainer.fit(None)


@pytest.mark.trains
def test_trains_marked_but_starts_ray():
    import ray
    ray.init(num_cpus=1, include_dashboard=False)
'''

REFUSED = {
    "test_ray_init": "starts Ray (ray.init) but is not marked integration",
    "test_ray_start": "starts Ray (`ray start`) but is not marked integration",
    "test_moto": "starts an S3 server (ThreadedMotoServer.start) but is not marked integration",
    "test_prefect": "starts a Prefect server (SubprocessASGIServer.start) but is not marked "
                    "integration",
    "test_trains": "trains a model (rcpipe.train.worker.Worker.train) but is not marked trains",
    "test_trains_in_a_subprocess": "trains a model (rcpipe.train.worker.Worker.train) but is "
                                   "not marked trains",
    "test_uses_local_ray": "uses the fixture local_ray but is not marked integration",
    "test_trains_marked_but_starts_ray": "starts Ray (ray.init) but is not marked integration",
    "test_ray_train_job_unmarked_ray_train": "starts a Ray Train job (DataParallelTrainer.fit) "
                                             "but is not marked ray_train",
}
PASSED = {"test_light", "test_marked_integration", "test_marked_trains"}


def test_audit_fails_each_unmarked_start(tmp_path: Path) -> None:
    """The probe suite under the audit: each unmarked start fails its test with the audit's
    line (and starts nothing: the audit refuses first), the light and the marked pass."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "conftest.py").write_text(PROBE_CONFTEST)
    (probe / "test_probe.py").write_text(PROBE)
    (probe / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    integration\n    trains\n    ray_train\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCPIPE_MARKER_AUDIT")}
    env |= {audit.SWITCH: "1", "PYTHONPATH": str(ROOT),
            job_ledger.LEDGER: str(tmp_path / "probe-jobs.jsonl")}  # not this run's
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "-rfEp", "--rootdir", str(probe), "-c", str(probe / "pytest.ini"), str(probe)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    refused = set(re.findall(r"^(?:FAILED|ERROR) \S+::(\w+)", text, re.M))
    passed = set(re.findall(r"^PASSED \S+::(\w+)", text, re.M))
    assert (refused, passed) == (set(REFUSED), PASSED), text
    for name, line in REFUSED.items():
        assert f"test_probe.py::{name} {line}" in text, (name, text)


@pytest.mark.parametrize("args, kind", [
    (["/x/.venv/bin/ray", "start", "--head"], "ray"),
    ("ray start --address 127.0.0.1:1", "ray"),
    (["prefect", "server", "start", "--port", "1"], "prefect"),
    (["moto_server", "-p", "0"], "s3"),
    (["ray", "status"], None),
    (["prefect", "deployment", "run", "x"], None),
    (["rcpipe", "train", "bidaf"], None),  # audited in the subprocess itself
])
def test_command_kinds(args: list[str] | str, kind: str | None) -> None:
    found = audit._command_kind(args)
    assert (found[0] if found else None) == kind


def test_fixture_markers_name_known_markers() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    for marker in {*HEAVY_FIXTURES.values(), *audit.ALLOWS}:
        assert re.search(rf'^\s*"{marker}(\(N\))?: ', text, re.M), marker


def test_make_test_fast_is_the_audited_rest() -> None:
    """make test-fast runs the tests with none of the heavy markers, under the audit; make
    test runs every test (no -m: CI's run)."""
    make = (ROOT / "Makefile").read_text()
    fast = re.search(r"^FAST_TESTS := (.+)$", make, re.M)
    assert fast and fast.group(1) == "not integration and not trains and not slow"
    rules = {m.group(1): m.group(2) for m in re.finditer(r"^([\w-]+):.*\n((?:\t.*\n)+)",
                                                          make, re.M)}
    assert f"{audit.SWITCH}=1" in rules["test-fast"]
    assert '-m "$(FAST_TESTS)"' in rules["test-fast"]
    assert ' -m "' not in rules["test"] and audit.SWITCH not in rules["test"]
