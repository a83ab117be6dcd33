"""A stage's files written as one set: a kill at any moment leaves the old set or the new one.

Each new file is written into a hidden folder beside its destination's folder, never inside
a folder DVC tracks whole (`models/.bidaf.evaluate-bidaf.new-<txn>/na_threshold.json` for
`models/bidaf/na_threshold.json`, `data/.prepared.prepare.new-<txn>/` for
`data/prepared/`). The set is committed by one atomic rename, its journal's
(`models/.bidaf.evaluate-bidaf.commit`: each staged file and its destination, the files the
new set no longer has); the journal's moves then put every file in place and the journal
goes. So:

- killed before the journal: the old set stands; the next writer of the set removes the
  staged folders;
- killed after it: the next writer of the set, or a stage about to read it (`settle`),
  finishes the moves first. An old file goes only when its replacement is moved over it
  (`--force` deletes nothing before the new set is committed).

Moves are renames, so each destination's folder and its staging folder share a file system.
Writers hold the output's lock (rcpipe/locks.py): one writer of a set at a time.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import lock_descriptor

from rcpipe import reads
from rcpipe.errors import InputError
from rcpipe.safe_open import create_new, disk_full, is_disk_full, open_lock, write_new

log = logging.getLogger(__name__)

JOURNAL = "commit"  # .<dir>.<set>.commit beside the set's first folder: the commit point
JOURNAL_BYTES = 10 * reads.MB  # a journal names each file of its set once (a few KB)


def _abs(path: Path) -> Path:
    return Path(os.path.abspath(path))  # not resolve(): a symlinked run dir stays itself


def _fsync_dir(path: Path) -> None:
    """A rename is durable once its folder is synced (a power cut, not only a kill)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse a folder's fsync; the rename stands either way
    finally:
        os.close(fd)


class OutputSet:
    """The files one stage writes together (``name``: the set, unique among the writers of
    ``dirs``' parents, e.g. ``evaluate-bidaf``), in the folders ``dirs``."""

    def __init__(self, name: str, dirs: Sequence[Path]) -> None:
        if not dirs:
            raise ValueError(f"the output set {name} needs a folder")
        # the name is a part of file names, between dots: a file's name may bring its own
        self.name = name.replace(".", "_").replace("/", "_")
        self.dirs = [_abs(d) for d in dirs]
        self.journal = self._beside(self.dirs[0], JOURNAL)
        self._txn = uuid.uuid4().hex[:12]
        self._moves: dict[Path, Path] = {}  # destination -> staged file
        self._removes: set[Path] = set()

    def _beside(self, folder: Path, what: str) -> Path:
        return folder.parent / f".{folder.name}.{self.name}.{what}"

    def _staging(self, folder: Path) -> Path:
        return self._beside(folder, f"new-{self._txn}")

    def recover(self) -> list[str]:
        """Finish a committed set's moves, remove an uncommitted set's staged files; what
        was done, as lines for the log (empty when nothing was left)."""
        done = []
        if self.journal.is_file():
            moved = finish(self.journal)
            done.append(f"finished moving {moved} file(s) of {self.name}, committed before a "
                        f"kill ({self.journal.name})")
        for folder in self.dirs:
            for left in folder.parent.glob(f".{folder.name}.{self.name}.new-*"):
                shutil.rmtree(left, ignore_errors=True)
                done.append(f"removed {left}, the files of an interrupted {self.name}")
        self._beside(self.dirs[0], f"{JOURNAL}.tmp").unlink(missing_ok=True)
        return done

    def path(self, dest: Path) -> Path:
        """Where ``dest``'s new content is written (its folder exists)."""
        dest = _abs(dest)
        folder = next((d for d in self.dirs if dest.is_relative_to(d)), None)
        if folder is None:
            raise ValueError(f"{dest} is outside the set {self.name}'s folders {self.dirs}")
        staged = self._staging(folder) / dest.relative_to(folder)
        staged.parent.mkdir(parents=True, exist_ok=True)
        self._moves[dest] = staged
        self._removes.discard(dest)
        return staged

    def write(self, dest: Path, data: bytes | str) -> None:
        write_new(self.path(dest), data, name=_shown(_abs(dest)))

    def write_json(self, dest: Path, obj: Any) -> None:
        self.write(dest, self.json_bytes(obj))

    @staticmethod
    def json_bytes(obj: Any) -> bytes:
        """The bytes ``write_json`` writes for ``obj`` (a digest of the file before it is)."""
        return (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode()

    def copy(self, dest: Path, source: Path) -> None:
        with open(source, "rb") as src, os.fdopen(create_new(self.path(dest)), "wb") as out:
            shutil.copyfileobj(src, out)

    def remove(self, dest: Path) -> None:
        """The new set has no ``dest``: it goes when the set is committed, not before."""
        dest = _abs(dest)
        if dest not in self._moves:
            self._removes.add(dest)

    def commit(self) -> None:
        """The commit point: the journal's rename. Then the moves, then the journal goes."""
        for staged in self._moves.values():  # the staged files are on disk before the journal
            with open(staged, "rb") as f:  # (a writer such as pyarrow's syncs nothing)
                os.fsync(f.fileno())
            _fsync_dir(staged.parent)
        home = self.journal.parent
        record = {"set": self.name,
                  "moves": [[os.path.relpath(s, home), os.path.relpath(d, home)]
                            for d, s in self._moves.items()],
                  "removes": [os.path.relpath(d, home) for d in sorted(self._removes)]}
        tmp = self._beside(self.dirs[0], f"{JOURNAL}.tmp")
        write_new(tmp, json.dumps(record))
        os.replace(tmp, self.journal)
        _fsync_dir(home)
        finish(self.journal)
        self.discard()  # the staging folders, empty now

    def discard(self) -> None:
        """Remove this writer's staged files (the old set stands)."""
        for folder in self.dirs:
            shutil.rmtree(self._staging(folder), ignore_errors=True)


def finish(journal: Path) -> int:
    """Put a committed set's files in place and remove the journal; how many moved. Each
    step may be done twice (a kill during the first finisher): a staged file already moved
    is skipped. Finishers take turns on the journal's own flock, so a reader may finish a
    set without its writers' lock: a second finisher finds the journal gone and stops. The
    journal is data, not a lock file (one made at its name would be a journal): it is
    locked on its own descriptor (filelock's lock_descriptor, the flock rcpipe.locks takes)."""
    try:  # no link followed, no FIFO waited on: one line, exit 2
        fd = open_lock(journal, create=False)
    except FileNotFoundError:
        return 0  # finished meanwhile
    try:
        lock_descriptor(fd)
        try:
            same = os.stat(journal, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            return 0  # finished by the one before us in line
        with os.fdopen(os.dup(fd), "rb") as f:
            data = reads.read_up_to(f, JOURNAL_BYTES + 1)
        shown = _shown(_abs(journal))
        if len(data) > JOURNAL_BYTES:
            raise reads.too_big(shown, f"over {reads.size_text(JOURNAL_BYTES)}",
                                JOURNAL_BYTES, "a set journal's cap")
        moves, removes = confined(journal, reads.parse_json(data, shown))
        return _moved(journal, moves, removes)
    finally:
        os.close(fd)


Moves = list[tuple[Path, Path, Path]]  # (staged file, destination, its staging folder)


def confined(journal: Path, record: Any) -> tuple[Moves, list[Path]]:
    """A journal's moves (staged file, destination, staging folder) and removes, each path
    checked to stay in the set the journal names before anything is done: relative, inside
    the journal's folder or the run directory once ``..`` and links are followed, and each
    staged file in a staging folder of this set (``.<F>.<set>.new-<txn>/R``) moved to the
    same place in its folder (``F/R``). A journal is input like any other file: a forged
    one (a move to ``../../a``, a remove of ``/home``) is one located line, exit 2, with
    nothing done."""
    shown = _shown(_abs(journal))
    if not isinstance(record, dict) or set(record) != {"set", "moves", "removes"}:
        raise InputError(shown, "", "refused: not a set journal (set, moves, removes)")
    name = record["set"]
    if not isinstance(name, str) or not re.fullmatch(r"[^./]+", name) \
            or not journal.name.endswith(f".{name}.{JOURNAL}"):
        raise InputError(shown, "set", f"refused: {str(name)[:80]!r} is not the set its name "
                         "says")
    moves, removes = record["moves"], record["removes"]
    if not isinstance(moves, list) or not all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m)
            for m in moves):
        raise InputError(shown, "moves", "refused: expected a list of [staged, destination]")
    if not isinstance(removes, list) or not all(isinstance(p, str) for p in removes):
        raise InputError(shown, "removes", "refused: expected a list of paths")
    home = _abs(journal.parent)
    roots = [home, _abs(Path.cwd())]
    staging = re.compile(rf"\.(.+)\.{re.escape(name)}\.new-[0-9a-f]+")

    def inside(where: str, path: str) -> Path:
        if os.path.isabs(path):
            raise InputError(shown, where, f"refused: an absolute path ({path[:200]})")
        target = Path(os.path.normpath(home / path))
        if not any(target.is_relative_to(r) and target != r for r in roots):
            raise InputError(shown, where, f"refused: {path[:200]} leaves {_shown(home)}")
        real = Path(os.path.realpath(target.parent))  # a link on the way: where it leads
        if not any(real.is_relative_to(os.path.realpath(r)) for r in roots):
            raise InputError(shown, where, f"refused: {path[:200]} passes a link out of "
                             f"{_shown(home)} (to {real})")
        return target

    checked = []
    for i, (staged_rel, dest_rel) in enumerate(moves):
        staged, dest = inside(f"moves[{i}][0]", staged_rel), inside(f"moves[{i}][1]", dest_rel)
        folder = next((p for p in staged.parents if p.parent != p and staging.fullmatch(p.name)),
                      None)
        if folder is None or dest != folder.parent / staging.fullmatch(folder.name)[1] / \
                staged.relative_to(folder):
            raise InputError(shown, f"moves[{i}]", f"refused: {staged_rel[:200]} is not a file "
                             f"of the set {name} staged for {dest_rel[:200]}")
        checked.append((staged, dest, folder))
    return checked, [inside(f"removes[{i}]", p) for i, p in enumerate(removes)]


def _moved(journal: Path, moves: Moves, removes: list[Path]) -> int:
    home = _abs(journal.parent)
    moved, folders = 0, set()
    for staged, target, _ in moves:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(staged, target)
            moved += 1
            folders.add(target.parent)
        except FileNotFoundError:
            pass  # moved already
    for target in removes:
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)  # a link: the link, never what it names
        folders.add(target.parent)
    for folder in folders:
        _fsync_dir(folder)
    for staged, _, staging in moves:  # the staging folders, empty now (a live writer's
        for empty in staged.parents:  # have other names: never this set's)
            if not empty.is_relative_to(staging):
                break
            try:
                os.rmdir(empty)
            except OSError:
                break  # not empty (another of the set's files), or gone
    journal.unlink(missing_ok=True)
    _fsync_dir(home)
    return moved


def settle(*dirs: Path) -> None:
    """Finish every set committed into ``dirs`` (by any stage) before reading them, with a
    line for each: a reader then never sees a set half moved by a killed writer (old and
    new files side by side). A reader needs no writer's lock for it (``finish``)."""
    for folder in map(_abs, dirs):
        for journal in folder.parent.glob(f".{folder.name}.*.{JOURNAL}"):
            moved = finish(journal)
            if moved:
                log.warning("%s: finished moving %d file(s) of a set committed before a kill "
                            "(%s), before reading it", _shown(folder), moved, journal.name)


@contextmanager
def output_set(name: str, dirs: Sequence[Path]) -> Iterator[OutputSet]:
    """An OutputSet, what an earlier writer left recovered first; committed when the block
    ends, discarded when it raises (the old set stands)."""
    out = OutputSet(name, dirs)
    for line in out.recover():
        log.info(line)
    try:
        yield out
    except BaseException as e:
        out.discard()
        if is_disk_full(e):  # pyarrow's and shutil's words, located here
            raise disk_full(_shown(out.dirs[0])) from None
        raise
    out.commit()  # a full disk here is safe_open's line; the next writer removes the rest


def _shown(path: Path) -> Path:
    """``path`` as the user named it: relative to the run directory when inside it."""
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
