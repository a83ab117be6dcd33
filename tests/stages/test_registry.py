"""`rcpipe champion` set and rollback (rcpipe/stages/registry.py) on a directory remote holding
versioned nights: each change a new entry through the record's compare-and-swap, with its
reason and author; refused in one line, the record untouched, when a package is missing or
its config.json no longer has the sha256 pinned when the night was versioned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rcpipe.config import ReadLimits
from rcpipe.errors import InputError
from rcpipe.release import record
from rcpipe.release.remote import Remote
from rcpipe.stages import registry
from rcpipe.trained.package_dir import sha256
from tests.release.test_record import workspace

LIMITS = ReadLimits()


def version_night(where: Remote, run: str, variants: tuple[str, ...] = ("bidaf",)) -> None:
    """versions/<run>/: a package a variant (a config.json is enough here) and version.json
    as `rcpipe version` writes it, the gate's candidate the first variant."""
    urls, pins = {}, {}
    for v in variants:
        config = json.dumps({"variant": v, "run": run}).encode()
        where.write(config, "versions", run, "packages", v, "config.json")
        urls[v] = where._where("versions", run, "packages", v)[1]
        pins[v] = sha256(config)
    night = {"run": run, "dvc_lock": f"{run}/dvc.lock", "git_commit": None,
             "packages": urls, "packages_sha256": pins,
             "scores": {v: {"em": 40.0, "f1": 50.0} for v in variants},
             "candidate": {"model": variants[0], "f1": 50.0, "em": 40.0,
                           "dev_sha256": "d" * 64, "run": run}}
    where.write(json.dumps(night).encode(), "versions", run, "version.json")


def runs(where: Remote) -> list[tuple[int, str, str]]:
    return [(e["seq"], e["change"]["kind"], e["score"]["run"])
            for e in record.history(where, LIMITS)]


def test_set_and_rollback_are_entries_with_their_reason_and_author(tmp_path: Path) -> None:
    where = workspace(tmp_path / "work")
    root = tmp_path / "work"
    for run in ("n1", "n2"):
        version_night(where, run, ("bidaf", "qanet"))
    registry.set_champion(root, None, "n1", None, "first by hand", "ann", LIMITS)
    two = registry.set_champion(root, None, "n2", "qanet", "qanet reads better", "bo", LIMITS)
    assert two["score"]["model"] == "qanet" and two["change"]["by"] == "bo"
    assert two["package_sha256"] == sha256(json.dumps({"variant": "qanet", "run": "n2"}
                                                      ).encode())
    back = registry.rollback(root, None, None, "qanet regressed", "ann", LIMITS)
    assert (back["seq"], back["score"]["run"], back["score"]["model"]) == (3, "n1", "bidaf")
    assert back["change"]["before"] == {"seq": 2, "run": "n2", "model": "qanet"}
    again = registry.rollback(root, None, 2, "", "ann", LIMITS)
    assert again["change"]["reason"] == "back to #2" and again["score"]["run"] == "n2"
    assert runs(where) == [(1, "set", "n1"), (2, "set", "n2"), (3, "rollback", "n1"),
                           (4, "rollback", "n2")]
    shown = registry.show(root, None, LIMITS)
    assert [e["seq"] for e in shown["history"]] == [4, 3, 2, 1] and shown["disagree"] is None
    text = "\n".join(registry.lines(shown))
    assert text.startswith("* #4  rollback  night n2  qanet") and "qanet regressed" in text


@pytest.mark.parametrize("fault", ["missing", "changed", "no pins", "unknown run",
                                   "unknown model"])
def test_a_change_to_what_cannot_be_served_is_refused_and_changes_nothing(
        tmp_path: Path, fault: str) -> None:
    where = workspace(tmp_path / "work")
    root = tmp_path / "work"
    version_night(where, "n1")
    version_night(where, "n2")
    registry.set_champion(root, None, "n1", None, "", "ann", LIMITS)
    package = Path(where.path, "rcpipe", "versions", "n2", "packages", "bidaf", "config.json")
    run, model = "n2", None
    if fault == "missing":
        package.unlink()
    elif fault == "changed":
        package.write_bytes(package.read_bytes() + b" ")
    elif fault == "no pins":
        night = Path(where.path, "rcpipe", "versions", "n2", "version.json")
        found = json.loads(night.read_text())
        del found["packages_sha256"]
        night.write_text(json.dumps(found))
    elif fault == "unknown run":
        run = "n9"
    else:
        model = "qanet"
    before = Path(where.path, "rcpipe", record.HEAD).read_bytes()
    with pytest.raises(InputError) as e:
        registry.set_champion(root, None, run, model, "", "ann", LIMITS)
    said = {"missing": "missing on the remote", "changed": "changed since it was versioned",
            "no pins": "before packages were pinned", "unknown run": "no night n9",
            "unknown model": "no package of qanet"}[fault]
    assert said in e.value.line() and "\n" not in e.value.line()
    assert Path(where.path, "rcpipe", record.HEAD).read_bytes() == before
    assert runs(where) == [(1, "set", "n1")]


def test_the_cli_sets_rolls_back_and_refuses_in_one_line(tmp_path: Path) -> None:
    where = workspace(tmp_path / "work")
    for run in ("n1", "n2"):
        version_night(where, run)
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"}

    def rcpipe(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rcpipe", "champion", *args],
                              cwd=tmp_path / "work", env=env, capture_output=True, text=True)

    assert rcpipe("set", "n1", "--reason", "first", "--by", "ann").returncode == 0
    assert rcpipe("set", "n2", "--reason", "second").returncode == 0
    done = rcpipe("rollback", "--reason", "n2 answers worse")
    assert done.returncode == 0 and json.loads(done.stdout)["champion"]["run"] == "n1"
    shown = rcpipe()
    assert shown.returncode == 0 and shown.stdout.splitlines()[0].startswith(
        "* #3  rollback  night n1  bidaf"), shown.stdout
    refused = rcpipe("set", "n9", "--reason", "x")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "no night n9 versioned" in refused.stderr
