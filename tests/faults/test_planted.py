"""Issue 43: what is planted at the name of a file rcpipe writes beside its outputs (a lock,
a stamp's temporary file, a set's journal) neither redirects the write nor blocks it: a
link is not followed (its target is left as it was), a FIFO, a device or a directory is the
one line `error: <file>: refused: ...` and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from rcpipe import layout
from rcpipe.errors import InputError
from rcpipe.fingerprints import Fingerprint, Stamp
from rcpipe.locks import lock_file
from rcpipe.outputs import output_set

VICTIM = b"someone else's file\n"


def _victim(root: Path) -> Path:
    victim = root / "victim.txt"
    victim.write_bytes(VICTIM)
    return victim


PLANTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "a_link_to_a_file": (lambda p: p.symlink_to(p.parent.parent / "victim.txt"),
                         "a symbolic link"),
    "a_link_to_dev_zero": (lambda p: p.symlink_to("/dev/zero"), "a symbolic link"),
    "a_fifo": (lambda p: os.mkfifo(p), "a FIFO"),
    "a_directory": (lambda p: p.mkdir(), "a directory"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_lock_planted_is_refused_in_one_line_and_its_target_untouched(
        workdir: Path, plant: str) -> None:
    make, what = PLANTS[plant]
    victim = _victim(workdir)
    lock = lock_file(workdir / "models" / "bidaf")
    lock.parent.mkdir(parents=True)
    make(lock)
    # the real command, as the audit ran it: `rcpipe evaluate --force` truncated the target
    run = subprocess.run([sys.executable, "-m", "rcpipe", "evaluate", "bidaf", "--force"],
                         cwd=workdir, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_COLOR": "1", "TERM": "dumb"})
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines() == [
        f"error: {lock}: refused: {what}, not a regular file (rcpipe writes it)"], run.stderr
    assert run.returncode == 2
    assert victim.read_bytes() == VICTIM


def test_a_link_planted_at_an_atomic_writes_temporary_file_is_not_followed(
        workdir: Path) -> None:
    victim = _victim(workdir)
    stamp = Stamp("evaluate-bidaf", Fingerprint({}, {}))
    tmp = layout.stamp(stamp.name).with_name(f".{layout.stamp(stamp.name).name}.tmp")
    tmp.parent.mkdir(parents=True)
    tmp.symlink_to(victim)
    stamp.keep()
    assert victim.read_bytes() == VICTIM  # the link went, not the file it named
    assert stamp.is_current([])
    assert not tmp.exists() and not tmp.is_symlink()


def test_a_link_planted_at_a_sets_journal_is_not_followed(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    journal_tmp = tmp_path / ".out.s.commit.tmp"
    with output_set("s", [out]) as files:
        files.write(out / "a.txt", "new")
        journal_tmp.symlink_to(victim)  # planted while the set is written
    assert (out / "a.txt").read_text() == "new"
    assert victim.read_bytes() == VICTIM


def test_a_fifo_stamp_is_one_line_not_a_wait(workdir: Path) -> None:
    stamp = Stamp("report", Fingerprint({}, {}))
    layout.stamp(stamp.name).parent.mkdir(parents=True)
    os.mkfifo(layout.stamp(stamp.name))
    said: list[BaseException] = []

    def check() -> None:
        try:
            stamp.is_current([])
        except InputError as e:
            said.append(e)

    reader = threading.Thread(target=check, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # waiting for a writer: release it, then fail
        os.close(os.open(layout.stamp(stamp.name), os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the stamp's FIFO was waited on")
    assert [e.line() for e in said] == [  # type: ignore[attr-defined]
        f"error: {layout.stamp(stamp.name)}: refused: a FIFO, not a regular file"]



def test_a_link_planted_as_a_sets_journal_is_refused_not_followed(tmp_path: Path) -> None:
    from rcpipe.data.prepared import Prepared

    victim = _victim(tmp_path)
    (tmp_path / "prepared").mkdir()
    journal = tmp_path / ".prepared.prepare.commit"
    journal.symlink_to(victim)
    with pytest.raises(InputError) as e:
        Prepared(tmp_path / "prepared")  # a reader finishes the sets committed there first
    assert e.value.line() == (f"error: {journal}: refused: a symbolic link, not a regular "
                              "file (rcpipe writes it)")
    assert victim.read_bytes() == VICTIM
