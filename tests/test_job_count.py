"""The Ray Train jobs' guard (tests/job_count.py, tests/marker_audit/job_ledger.py): a run
in which a file starts more Ray Train jobs than its ``ray_train`` marker declares fails,
and every run prints the count; here, in the fast loop, the declarations are read from the
sources: their sum stays under the limit and docs/dev/testing.md lists each file's jobs.

The probe runs record jobs through the ledger itself (job_ledger.record, what the wrapped
DataParallelTrainer.fit calls first), not through Ray: the counting, charging and verdict
are what is tested here; that the wrapper is installed in every process is the audit's
start-up hook, shared with the marker audit (tests/test_markers.py).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests import job_count
from tests.marker_audit import job_ledger

ROOT = Path(__file__).resolve().parents[1]
TESTING_MD = ROOT / "docs" / "dev" / "testing.md"

PROBE_CONFTEST = """
from tests.markers import pytest_configure  # noqa: F401 - the ledger's file, in the env

pytest_plugins = ["tests.job_count"]
"""

DECLARED = """
import pytest

from tests.marker_audit import job_ledger

pytestmark = pytest.mark.ray_train(1)


def test_one_job():
    job_ledger.record()  # what the wrapped DataParallelTrainer.fit does first
"""

UNDECLARED = """
import subprocess
import sys


def test_a_job_in_a_subprocess():
    # as `rcpipe train` would: the subprocess imports the ledger at start-up (sitecustomize)
    subprocess.run([sys.executable, "-c", "from job_ledger import record; record()"],
                   check=True)
"""


def _probe(tmp_path: Path, files: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "conftest.py").write_text(PROBE_CONFTEST)
    (probe / "pytest.ini").write_text("[pytest]\nmarkers =\n    ray_train\n")
    for name, text in files.items():
        (probe / name).write_text(text)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RCPIPE_MARKER_AUDIT", job_ledger.LEDGER, "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    env[job_ledger.LEDGER] = str(tmp_path / "probe-jobs.jsonl")  # not this run's ledger
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args,
         "--rootdir", str(probe), "-c", str(probe / "pytest.ini"), str(probe)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_job_in_an_undeclared_file_fails_the_run_on_two_workers(tmp_path: Path) -> None:
    out = _probe(tmp_path, {"test_declared.py": DECLARED, "test_undeclared.py": UNDECLARED},
                 "-n", "2", "--dist", "loadfile")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "2 passed" in text  # the tests themselves pass: the count fails the run
    assert f"Ray Train jobs: 2 of at most {job_count.LIMIT} (tests/job_count.py): " in text
    assert ("FAILED job count: test_undeclared.py started 1 Ray Train job(s) but declares 0 "
            "(pytest.mark.ray_train(N) in its pytestmark; tests/job_count.py)") in text, text
    assert "test_declared.py started" not in text


STRAY = """
import os
import subprocess
import sys


def test_a_job_of_no_worker():
    # a process whose environment names no pytest worker of this run (a cluster started with
    # an environment of its own): no file can declare it, so it fails the run
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw9"}
    subprocess.run([sys.executable, "-c", "from job_ledger import record; record()"],
                   check=True, env=env)
"""


def test_a_job_no_worker_claims_is_counted_and_fails_the_run(tmp_path: Path) -> None:
    out = _probe(tmp_path, {"test_stray.py": STRAY}, "-p", "no:xdist")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert f"FAILED job count: {job_count.UNCLAIMED} started 1 Ray Train job(s)" in text, text


def test_a_declared_job_passes_in_one_process(tmp_path: Path) -> None:
    out = _probe(tmp_path, {"test_declared.py": DECLARED}, "-p", "no:xdist")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "Ray Train jobs: 1 of at most" in text and "test_declared.py 1" in text


def test_the_wrapped_fit_records_its_worker_and_label(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "jobs.jsonl"
    monkeypatch.setenv(job_ledger.LEDGER, str(ledger))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    monkeypatch.setenv(job_ledger.LABEL, "trained")

    class DataParallelTrainer:
        def fit(self) -> str:
            return "result"

    module = types.SimpleNamespace(DataParallelTrainer=DataParallelTrainer)
    job_ledger.patch_fit(module)
    job_ledger.patch_fit(module)  # installed twice (the pytest process): wrapped once
    assert DataParallelTrainer().fit() == "result"
    (job,) = job_ledger.read(str(ledger))
    assert (job["worker"], job["label"], job["pid"]) == ("gw7", "trained", os.getpid())
    with ledger.open("a") as f:
        f.write('{"worker": "gw')  # torn: a line being written as the file is read
    assert len(job_ledger.read(str(ledger))) == 1


def declarations() -> dict[str, int]:
    """Each test file's ``pytest.mark.ray_train(N)``, read from its source."""
    found = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == \
                    f"pytest.mark.{job_count.MARKER}":
                assert len(node.args) == 1 and isinstance(node.args[0], ast.Constant), path
                rel = str(path.relative_to(ROOT))
                assert rel not in found, f"{rel}: one ray_train marker, in its pytestmark"
                found[rel] = node.args[0].value
    return found


def documented() -> dict[str, int]:
    """docs/dev/testing.md's list of the suite's Ray Train jobs: file -> jobs."""
    text = TESTING_MD.read_text(encoding="utf-8")
    section = text.split("### The Ray Train jobs", 1)[1].split("\n#", 1)[0]
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^\| `(tests/\S+\.py)` \| (\d+) \|", section, re.M)}


def test_the_declared_jobs_fit_the_limit_and_the_docs_list_them() -> None:
    declared = declarations()
    shared = sum(job_count.SHARED_JOBS.values())
    assert sum(declared.values()) + shared <= job_count.LIMIT, (declared, shared)
    assert documented() == declared | {
        "tests/conftest.py": shared}, "docs/dev/testing.md's list of Ray Train jobs"
    for rel in declared:  # declared where pytest reads it
        assert "pytestmark" in (ROOT / rel).read_text(encoding="utf-8"), rel


def test_the_pyproject_names_the_marker() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(rf'^\s*"{job_count.MARKER}\(N\): ', text, re.M)
