"""Ray Train V2 or nothing: a Ray whose Train V2 is off is refused in one line, exit code 2.

rcpipe resumes a run by starting the same RunConfig(storage_path, name) again, which only
Train V2 does; on V1 a rerun would quietly start from step 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from rcpipe.cluster import ray_runtime
from rcpipe.errors import InputError
from tests.conftest import write_params

SWITCH = "RAY_TRAIN_V2_ENABLED"
PREFIX = f"error: ray {ray.__version__}: {SWITCH}: "


def refusal() -> str:
    with pytest.raises(InputError) as raised:
        ray_runtime.check_train_v2()
    line = str(raised.value)
    assert line.startswith(PREFIX) and "\n" not in line, line
    return line


def test_the_locked_ray_runs_train_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SWITCH, raising=False)
    ray_runtime.check_train_v2()
    monkeypatch.setenv(SWITCH, "1")
    ray_runtime.check_train_v2()


@pytest.mark.parametrize("value", ["0", "false", ""])
def test_v2_switched_off_is_refused_naming_the_switch(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(SWITCH, value)  # Ray counts anything but 1/true as off
    assert refusal().endswith(f"V2 is off ({SWITCH}={value}), and rcpipe resumes a run "
                              f"only through V2: unset {SWITCH} or set it to 1")


def test_a_ray_with_v2_off_by_default_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray 2.40 to 2.50: V2 is there but opt-in. Ray's own answer is what counts."""
    from ray.train.v2._internal import constants

    monkeypatch.delenv(SWITCH, raising=False)
    monkeypatch.setattr(constants, "is_v2_enabled", lambda: False)
    assert refusal().endswith(f"set {SWITCH}=1 or install the locked Ray (make setup)")


def test_a_ray_without_train_v2_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray.train.v2._internal.constants", None)
    assert "this Ray has no Train V2" in refusal()


def test_rcpipe_train_refuses_before_anything_starts(tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml")
    done = subprocess.run(
        [sys.executable, "-m", "rcpipe", "train", "qanet", "--params", str(params)],
        cwd=tmp_path, env=os.environ | {SWITCH: "0"}, capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [PREFIX + f"Ray Train V2 is off ({SWITCH}=0), and "
                                        f"rcpipe resumes a run only through V2: unset "
                                        f"{SWITCH} or set it to 1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing ran
