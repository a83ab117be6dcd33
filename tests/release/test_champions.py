"""The champion record and its git mirror (rcpipe/release/record.py, the registry on the DVC
remote; rcpipe/release/champions.py, GTO's stage assignments), as nights write them and clones
read them: a workspace with a bare git remote and a DVC remote (a local directory), three
nights (A crowned, B crowned, C rejected), and a clone made after night 1 that follows with
the documentation's own commands (docs/guide/versioning.md, the block marked `tested: a
clone follows the champion`), ending on B's commit with B's model pulled; then a rollback,
which the record takes and GTO's tags do not, said by `rcpipe champion` on the clone."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rcpipe.config import ReadLimits
from rcpipe.release import record
from rcpipe.release.champions import crown, history
from rcpipe.release.nights import push_commit
from rcpipe.release.remote import Remote
from rcpipe.trained.package_dir import sha256
from tests.dvc_project import BIN, REPO, sh

MARK = "<!-- tested: a clone follows the champion -->"
GUIDE = REPO / "docs" / "guide" / "versioning.md"  # where a user reads the block


def guide_block() -> str:
    text = GUIDE.read_text()
    found = re.search(re.escape(MARK) + r"\s*```[^\n]*\n(.*?)^```", text, re.S | re.M)
    assert found, f"{GUIDE.relative_to(REPO)}: no block after {MARK}"
    return found.group(1)


def _decided(run: str, model: str, f1: float, before: str | None) -> dict[str, Any]:
    """A gate decision as release.rules.gate_record writes it (the fields the tag keeps)."""
    gain = None if before is None else (3.1, 1.2, 5.0)
    reason = f"{model} of {run}: no champion yet" if before is None else \
        f"{model} of {run} beats the champion of {before} by +3.10 F1 [+1.20, +5.00]"
    return {"candidate": {"model": model, "run": run, "f1": f1},
            "champion": None if before is None else {"model": model, "run": before},
            "reason": reason, "diff": gain and gain[0], "low": gain and gain[1],
            "high": gain and gain[2], "min_gain": 0.0, "set": {"sha256": "ab" * 32}}


def _git(root: Path, *args: str) -> str:
    return sh(root, "git", *args).stdout.strip()


def _night(work: Path, run: str, model: str, crowned: dict[str, Any] | None) -> str:
    """One night: its model file versioned by DVC, committed, pushed; crowned or not."""
    (work / "model.txt").write_text(model)
    sh(work, "dvc", "add", "-q", "model.txt")
    _git(work, "add", "model.txt.dvc", ".gitignore")
    _git(work, "commit", "-qm", f"night {run}")
    sh(work, "dvc", "push", "-q")
    commit = _git(work, "rev-parse", "HEAD")
    tags = []
    if crowned:  # the record first (the registry), then its mirror in git, as the gate does
        where = Remote(work, None)
        config = json.dumps({"variant": crowned["candidate"]["model"], "run": run}).encode()
        where.write(config, "versions", run, "packages", "m", "config.json")
        url = where._where("versions", run, "packages", "m")[1]
        entry = {"score": crowned["candidate"] | {"run": run}, "git_commit": commit,
                 "package": url, "package_sha256": sha256(config),
                 "packages": {crowned["candidate"]["model"]: url}, "gate": crowned}
        record.append(where, record.read(where, ReadLimits()), entry, "promotion",
                      crowned["reason"], f"the gate of night {run}", ReadLimits())
        tags = crown(work, commit, run, crowned, "origin")
    pushed = push_commit(work, "origin", commit, tags)
    assert pushed["pushed"], pushed
    return commit


def _follow(clone: Path) -> subprocess.CompletedProcess[str]:
    env_path = f"PATH={BIN}:$PATH"
    return sh(clone, "bash", "-euo", "pipefail", "-c", f"export {env_path}\n{guide_block()}")


@pytest.mark.slow
def test_a_clone_that_had_the_old_champion_follows_two_promotions_and_a_rejection(
        tmp_path: Path) -> None:
    origin, work, clone = tmp_path / "origin.git", tmp_path / "work", tmp_path / "clone"
    sh(tmp_path, "git", "init", "-q", "--bare", "-b", "main", str(origin))
    sh(tmp_path, "git", "init", "-q", "-b", "main", str(work))
    for key, value in (("user.name", "night"), ("user.email", "night@localhost")):
        _git(work, "config", key, value)
    _git(work, "remote", "add", "origin", str(origin))
    sh(work, "dvc", "init", "-q")
    sh(work, "dvc", "remote", "add", "-d", "storage", str(tmp_path / "dvc-store"))
    _git(work, "add", ".dvc", ".dvcignore")
    _git(work, "commit", "-qm", "dvc")

    a = _night(work, "n1", "model A", _decided("n1", "bidaf", 70.0, None))
    sh(tmp_path, "git", "clone", "-q", str(origin), str(clone))
    _follow(clone)
    assert _git(clone, "rev-parse", "HEAD") == a
    assert (clone / "model.txt").read_text() == "model A"

    b = _night(work, "n2", "model B", _decided("n2", "qanet", 73.1, "n1"))
    rejected = _night(work, "n3", "model C", None)  # the gate kept B: no tag
    out = _follow(clone).stdout
    assert _git(clone, "rev-parse", "HEAD") == b != rejected
    assert (clone / "model.txt").read_text() == "model B"
    # the history, newest first: which night made which champion, and why
    assert out.index("night n2  qanet") < out.index("night n1  bidaf")
    assert "beats the champion of n1 by +3.10 F1" in out and "gain +3.10 F1 [+1.20, +5.00]" \
        in out
    found = history(clone)
    assert [(p["gate"]["run"], p["commit"], p["version"]) for p in found] == \
        [("n2", b, "rcpipe@v0.0.2"), ("n1", a, "rcpipe@v0.0.1")]
    # nothing moved: the first assignment still names night 1 on the remote and the clone
    for where in (origin, clone):
        assert _git(where, "rev-list", "-n1", "rcpipe#champion#1") == a
    listed = json.loads(sh(clone, "rcpipe", "champion", "--json").stdout)
    assert listed["tags"] == json.loads(json.dumps(found)) and listed["disagree"] is None
    assert [(e["seq"], e["score"]["run"]) for e in listed["history"]] == [(2, "n2"),
                                                                         (1, "n1")]
    # a rollback changes the record, the registry; GTO's tags do not follow, and the clone
    # is told so
    sh(work, "rcpipe", "champion", "rollback", "--reason", "B answers worse")
    shown = sh(clone, "rcpipe", "champion").stdout
    assert shown.startswith("* #3  rollback  night n1  bidaf"), shown
    assert "note: this clone's GTO tags name night n2" in shown
    assert sh(clone, "rcpipe", "champion", "--ref").stdout.strip() == "rcpipe@v0.0.1"


def test_no_champion_yet_is_one_line(tmp_path: Path) -> None:
    sh(tmp_path, "git", "init", "-q")
    sh(tmp_path, "dvc", "init", "-q")
    sh(tmp_path, "dvc", "remote", "add", "-d", "storage", str(tmp_path / "store"))
    out = sh(tmp_path, "rcpipe", "champion", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("error: ") and len(out.stderr.splitlines()) == 1
