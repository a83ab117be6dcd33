"""`make dvc-demo` as a new user runs it, in a fresh copy of the project (every file git
tracks, committed in a repository of its own, the project's .venv beside it): params.yaml
becomes the demo's, every key DVC reads in it; the synthetic files are written; `dvc repro`
runs. Here its first stages (`DVC_TARGETS=prepare`: fetch and prepare run by DVC from the
demo's params): the training stages it runs after them are the same `rcpipe` commands
tests/integration/test_nights.py runs through `dvc repro`, and five of them would be five
Ray Train jobs (docs/dev/testing.md). Then again (up to date), and a params.yaml of the
user's refused in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # dvc and rcpipe processes: ~40 s


def _fresh_copy(to: Path) -> Path:
    """The tracked files as a clone has them (their times kept, so make finds the .venv
    newer than pyproject.toml and uv.lock: no setup again), committed."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a file deleted in the working tree is not the clone's
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    (to / ".venv").symlink_to(ROOT / ".venv")
    for cmd in (["init", "-q"], ["add", "-A"],
                ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clone"]):
        subprocess.run(["git", *cmd], cwd=to, check=True, capture_output=True)
    return to


def _make(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")} | {
        "DVC_NO_ANALYTICS": "1", "NO_COLOR": "1"}
    return subprocess.run(["make", "--no-print-directory", "dvc-demo", *args], cwd=where,
                          env=env, capture_output=True, text=True, timeout=600)


def test_make_dvc_demo_runs_the_demo_preset_through_dvc(tmp_path: Path) -> None:
    work = _fresh_copy(tmp_path / "rcpipe")
    first = _make(work, "DVC_TARGETS=prepare")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Running stage 'fetch'" in first.stdout and "Running stage 'prepare'" in first.stdout
    params = yaml.safe_load((work / "params.yaml").read_text())
    demo = yaml.safe_load((ROOT / "params.demo.yaml").read_text())
    assert params["data"]["train_file"] == demo["data"]["train_file"]
    assert {"sha256", "limits", "window"} <= set(params["data"])  # every key, not a layer
    assert (work / params["data"]["train_file"]).is_file()
    assert (work / params["data"]["out_dir"] / "train" / "part-00000.parquet").is_file()
    assert "prepare" in (work / "dvc.lock").read_text()

    again = _make(work, "DVC_TARGETS=prepare")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Running stage" not in again.stdout  # nothing changed: nothing ran

    (work / "params.yaml").write_text((ROOT / "params.yaml").read_text() + "# mine\n")
    refused = _make(work, "DVC_TARGETS=prepare")
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[0] == (
        "error: params.yaml: has changes of yours; commit or move them, then make dvc-demo "
        "again (git restore params.yaml undoes them)")
    assert (work / "params.yaml").read_text().endswith("# mine\n")  # not overwritten
