"""rcpipe/outputs.py: a stage's files as one set, whatever moment a kill comes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rcpipe.outputs import JOURNAL, OutputSet, output_set, settle

ROOT = Path(__file__).resolve().parents[1]


def _write(root: Path, tag: str, extra: bool = True) -> None:
    with output_set("stage", [root / "a", root / "b"]) as files:
        files.write(root / "a" / "x.txt", tag)
        files.write_json(root / "b" / "y.json", {"tag": tag})
        if extra:
            files.write(root / "a" / "sub" / "z.txt", tag)
        else:
            files.remove(root / "a" / "sub" / "z.txt")


def _set(root: Path) -> dict[str, str | None]:
    found = {}
    for name in ("a/x.txt", "b/y.json", "a/sub/z.txt"):
        path = root / name
        text = path.read_text() if path.is_file() else None
        found[name] = json.loads(text)["tag"] if text and name.endswith(".json") else text
    return found


def test_a_set_is_written_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    _write(tmp_path, "old")
    assert _set(tmp_path) == {"a/x.txt": "old", "b/y.json": "old", "a/sub/z.txt": "old"}
    _write(tmp_path, "new", extra=False)  # z.txt is not in the new set: it goes at commit
    assert _set(tmp_path) == {"a/x.txt": "new", "b/y.json": "new", "a/sub/z.txt": None}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_failing_stage_leaves_the_old_set(tmp_path: Path) -> None:
    _write(tmp_path, "old")
    with pytest.raises(RuntimeError), output_set("stage", [tmp_path / "a"]) as files:
        files.write(tmp_path / "a" / "x.txt", "new")
        raise RuntimeError("the stage failed")
    assert _set(tmp_path)["a/x.txt"] == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


KILLED = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.test_outputs import _write
at, n = int(sys.argv[1]), [0]
real = os.replace
def replace(a, b):
    n[0] += 1
    if n[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
    real(a, b)
os.replace = replace
_write(Path(sys.argv[2]), "new", extra=False)
"""


@pytest.mark.parametrize("at", [1, 2, 3, 4])
def test_a_kill_at_each_rename_leaves_the_old_set_or_one_the_next_run_finishes(
        tmp_path: Path, at: int) -> None:
    """Renames 1 (the journal's), 2 and 3 (the files' moves), 4: none (the run ends)."""
    _write(tmp_path, "old")
    run = subprocess.run([sys.executable, "-c", KILLED.format(root=str(ROOT)), str(at),
                          str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == (-signal.SIGKILL if at < 4 else 0), run.stderr
    journal = tmp_path / f".a.stage.{JOURNAL}"
    old = {"a/x.txt": "old", "b/y.json": "old", "a/sub/z.txt": "old"}
    new = {"a/x.txt": "new", "b/y.json": "new", "a/sub/z.txt": None}
    if at == 1:  # killed before the commit point: the old set, staged files left
        assert not journal.exists() and _set(tmp_path) == old
        assert list(tmp_path.glob(".a.stage.new-*"))
    elif at < 4:  # committed: the next writer (or a reader, settle) finishes the moves
        assert journal.is_file()
        settle(tmp_path / "a")
        assert _set(tmp_path) == new
    OutputSet("stage", [tmp_path / "a", tmp_path / "b"]).recover()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    assert _set(tmp_path) == (old if at == 1 else new)


def test_finishing_a_set_twice_moves_nothing_twice(tmp_path: Path) -> None:
    _write(tmp_path, "old")
    files = OutputSet("stage", [tmp_path / "a"])
    files.write(tmp_path / "a" / "x.txt", "new")
    real = os.replace

    def stop_after_the_journal(a: Path, b: Path) -> None:  # as a kill just after it would
        if not str(b).endswith(JOURNAL):
            raise InterruptedError
        real(a, b)

    os.replace = stop_after_the_journal  # type: ignore[assignment]
    try:
        with pytest.raises(InterruptedError):
            files.commit()
    finally:
        os.replace = real
    journal = tmp_path / f".a.stage.{JOURNAL}"
    saved = journal.read_text()
    settle(tmp_path / "a")
    journal.write_text(saved)  # a second finisher reading the same journal
    settle(tmp_path / "a")
    assert _set(tmp_path)["a/x.txt"] == "new" and not journal.exists()
