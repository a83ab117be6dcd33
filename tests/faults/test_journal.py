"""Issue 56: a set's journal (`models/.bidaf.<set>.commit`, rcpipe/outputs.py) is input like
any other file. A forged one, `{"set": "e", "moves": [["../../a", "../../b"]], "removes":
["/an/absolute/dir"]}`, made `rcpipe evaluate bidaf --force` and `rcpipe package bidaf`
delete the directory and move the file outside the run directory, exit 0. Every path of a
journal is now confined to the set it names (relative, inside its folder or the run
directory once `..` and links are followed, a staged file moved to its own place); one that
is not is one located line, exit 2, with nothing touched."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcpipe.errors import InputError
from rcpipe.outputs import OutputSet, settle
from tests.faults.test_abuse import assert_one_line, here, rcpipe, run_dir
from tests.faults.test_half_moved import commit_killed

__all__ = ["here", "run_dir"]  # the abuse cases' run directory: a model file and a package

J = "models/.bidaf.evil.commit"


def _victims(root: Path) -> tuple[Path, Path]:
    """A directory and a file outside the run directory ``root``, each holding a secret."""
    outside = root.parent / f"outside-{root.name}"
    (outside / "dir").mkdir(parents=True, exist_ok=True)
    (outside / "dir" / "keep.txt").write_text("secret")
    (outside / "a").write_text("secret")
    return outside / "dir", outside / "a"


def _untouched(root: Path) -> None:
    outside = root.parent / f"outside-{root.name}"
    assert (outside / "dir" / "keep.txt").read_text() == "secret"
    assert (outside / "a").read_text() == "secret"
    assert not (outside / "b").exists()


def _up(root: Path, to: Path) -> str:
    return os.path.relpath(to, root / "models")  # ../../outside-.../a


Journal = Callable[[Path], dict[str, Any]]
FORGED: dict[str, tuple[Journal, str]] = {
    "the_issues_own": (lambda r: {"set": "e", "moves": [
        [_up(r, _victims(r)[1]), _up(r, _victims(r)[1].with_name("b"))]],
        "removes": [str(_victims(r)[0])]},
                       f"error: {J}: set: refused: 'e' is not the set its name says"),
    "a_move_up_and_out": (lambda r: {"set": "evil", "moves": [
        [_up(r, _victims(r)[1]), _up(r, _victims(r)[1].with_name("b"))]], "removes": []},
        f"error: {J}: moves[0][0]: refused: ../../outside-{{root}}/a leaves models"),
    "an_absolute_remove": (lambda r: {"set": "evil", "moves": [],
                                      "removes": [str(_victims(r)[0])]},
                           f"error: {J}: removes[0]: refused: an absolute path "
                           f"({{outside}}/dir)"),
    "a_remove_up_and_out": (lambda r: {"set": "evil", "moves": [],
                                       "removes": [_up(r, _victims(r)[0])]},
                            f"error: {J}: removes[0]: refused: ../../outside-{{root}}/dir "
                            "leaves models"),
    "a_remove_through_a_link": (lambda r: {"set": "evil", "moves": [],
                                           "removes": ["out/keep.txt"]},
                                f"error: {J}: removes[0]: refused: out/keep.txt passes a link "
                                f"out of models (to {{outside}}/dir)"),
    "a_move_into_a_link": (lambda r: {"set": "evil", "moves": [
        [".out.evil.new-0a/keep.txt", "out/keep.txt"]], "removes": []},
        f"error: {J}: moves[0][1]: refused: out/keep.txt passes a link out of models (to "
        f"{{outside}}/dir)"),
    "a_move_of_a_file_not_staged": (lambda r: {"set": "evil", "moves": [
        ["bidaf/model.pt", "bidaf/elsewhere.pt"]], "removes": []},
        f"error: {J}: moves[0]: refused: bidaf/model.pt is not a file of the set evil "
        "staged for bidaf/elsewhere.pt"),
    "not_a_journal": (lambda r: {"set": "evil", "moves": "rm -rf /"},
                      f"error: {J}: refused: not a set journal (set, moves, removes)"),
}
COMMANDS = {"evaluate": ["evaluate", "bidaf", "--force"], "package": ["package", "bidaf"]}


def _plant(root: Path, case: str) -> str:
    """The forged journal of ``case`` planted in root/models; the line it must give."""
    make, expected = FORGED[case]
    _victims(root)
    link = root / "models" / "out"
    if not link.is_symlink():
        link.symlink_to(root.parent / f"outside-{root.name}" / "dir")
    (root / "models" / ".evil").mkdir(exist_ok=True)  # staged folders the moves could name
    (root / J).write_text(json.dumps(make(root)))
    return expected.format(root=root.name, outside=root.parent / f"outside-{root.name}")


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_journal_is_refused_and_nothing_outside_is_touched(
        here: Path, capsys: pytest.CaptureFixture[str], case: str, command: str) -> None:
    expected = _plant(here, case)
    try:
        code, err = rcpipe(capsys, *COMMANDS[command])
        assert_one_line(code, err, expected)
        _untouched(here)
        assert (here / "models" / "bidaf" / "model.pt").is_file()
        assert (here / J).is_file()  # left for a person to look at
    finally:
        (here / J).unlink(missing_ok=True)


def test_a_settled_forged_journal_is_refused_through_settle(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    root = tmp_path / "run"
    (root / "models" / "bidaf").mkdir(parents=True)
    monkeypatch.chdir(root)
    expected = _plant(root, "a_move_up_and_out")
    with pytest.raises(InputError) as e:
        settle(Path("models/bidaf"))
    assert e.value.line() == expected
    assert e.value.exit_code == 2
    _untouched(root)


def test_a_sets_own_journal_across_folders_still_settles(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # `rcpipe report --out /elsewhere`: the journal beside /elsewhere, a stamp in the run
    # directory (a path with `..` that stays in the run directory, as its writer wrote it)
    run, elsewhere = tmp_path / "run", tmp_path / "far" / "reports"
    run.mkdir()
    monkeypatch.chdir(run)
    stamps = run / ".rcpipe" / "stamps"
    stamps.mkdir(parents=True)
    (stamps / "report.json").write_text("{}")
    files = OutputSet("report", [elsewhere, stamps])
    files.write(elsewhere / "index.html", "<p>")
    files.write(stamps / "new.json", "{}")
    files.remove(stamps / "report.json")
    commit_killed(monkeypatch, files, at=2)  # killed after the commit point
    assert ".." in files.journal.read_text()
    settle(elsewhere)
    assert (elsewhere / "index.html").read_text() == "<p>"
    assert (stamps / "new.json").is_file() and not (stamps / "report.json").exists()
    assert not files.journal.exists()
