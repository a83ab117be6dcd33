"""The one lock helper (``locked``: filelock's kernel lock on a file), and one run at a time
per output (``hold``): a lock beside each output a stage writes (a model's folder, the
prepared data, a package), naming its holder.

``locked`` holds the kernel's lock (flock, through filelock) on a lock file for a block: the
kernel releases it when the holder's process ends, however it ends, so a process killed with
-9 leaves no lock that blocks the next; the file is never removed (so two processes cannot
lock two files of the same name) and never followed where a link was planted (a link, FIFO,
device or directory at its name is one located line, exit 2). The versioning workspace's
lock (`rcpipe version`) and a directory remote's record locks (release/remote.py) are
``locked`` too; a set's journal, which is data and not a lock file, is locked on its own
descriptor (outputs.finish).

``hold`` locks `<parent>/.<output>.lock`, held by the process that runs the stage (a Ray
Train job's driver, not its workers). The file's text says who holds it: pid, host, since
when and what it is doing, for the one line a second run prints (``error: models/bidaf:
bidaf is being trained by pid 4242 on gpu-1 since 2025-05-01T09:12:03+00:00``, exit 2) or
logs while it waits (``--wait``). A file that still names a holder whose lock the kernel
released is a killed run's: the next run takes it over and says so.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from filelock import FileLock, Timeout

from rcpipe import reads
from rcpipe.errors import InputError
from rcpipe.safe_open import REFUSALS, not_regular, open_lock, refused

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its file says."""

    pid: int
    host: str
    since: str  # ISO 8601, UTC
    doing: str  # "bidaf is being trained"

    def said(self) -> str:
        return f"{self.doing} by pid {self.pid} on {self.host} since {self.since}"


def lock_file(output: Path) -> Path:
    """Beside the output, never in it: data/prepared/ is one DVC output, hashed whole."""
    output = Path(os.path.abspath(output))
    return output.parent / f".{output.name}.lock"


# the outputs this process holds (lock file -> its thread): a stage calling another that
# locks the same output goes on; another thread of this process is refused as another run
_held: dict[Path, int] = {}
_guard = threading.Lock()


@contextmanager
def locked(path: Path, timeout: float = -1, *, poll: float = 0.05,
           busy: Callable[[], None] | None = None, taken: Callable[[int], None] | None = None,
           late: str | None = None) -> Iterator[int]:
    """Hold the kernel's lock on the file ``path`` for the block (its descriptor given), made
    with its folder when absent. Held elsewhere: ``busy()`` first (it may refuse by raising),
    then a wait of up to ``timeout`` seconds (-1: as long as it takes), polled every ``poll``,
    past which an InputError naming ``path`` says ``late``. ``taken(fd)`` runs once it is
    held. A link, FIFO, device or directory at ``path`` is refused in one line, exit 2."""

    def checked(fd: int) -> None:
        if (refusal := not_regular(path, fd)) is not None:
            raise refusal
        if taken is not None:
            taken(fd)
        held.append(fd)

    held: list[int] = []
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, mode=0o644, fallback_to_soft=False, preserve_lock_file=True,
                    on_acquired=checked)  # no soft lock: the kernel's or none
    try:
        try:
            lock.acquire(blocking=False)
        except Timeout:
            if busy is not None:
                busy()
            lock.acquire(timeout, poll_interval=poll)
    except Timeout:
        raise InputError(path, "", late or f"held elsewhere for more than {timeout:g}s"
                         ) from None
    except OSError as e:
        if e.errno in REFUSALS:
            raise refused(path, e) from None
        raise
    try:
        yield held[0]
    finally:
        lock.release()


@contextmanager
def hold(output: Path, doing: str, wait: bool = False) -> Iterator[None]:
    """Hold ``output``'s lock for the block; held elsewhere: an InputError naming the holder,
    or with ``wait`` a log line and the wait."""
    path, me = lock_file(output), threading.get_ident()
    with _guard:
        mine = _held.get(path) == me
    if mine:
        yield
        return

    def busy() -> None:
        holder = _named(path)
        said = holder.said() if holder else f"another run holds {path}"
        if not wait:
            raise InputError(output, "", said)
        log.info("%s: %s; waiting (--wait)", output, said)

    def taken(fd: int) -> None:
        left = _holder(os.pread(fd, 4096, 0))
        if left is not None:
            log.warning("%s: taking over the lock of a run that ended without releasing it "
                        "(killed): %s", output, left.said())
        me = Holder(os.getpid(), socket.gethostname(),
                    datetime.now(UTC).isoformat(timespec="seconds"), doing)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(me)).encode(), 0)

    with locked(path, busy=busy, taken=taken) as fd:
        with _guard:
            _held[path] = me
        try:
            yield
        finally:
            with _guard:
                del _held[path]
            os.ftruncate(fd, 0)  # released cleanly: the file names no one


def _named(path: Path) -> Holder | None:
    """The holder a held lock's file names: its holder writes it just after locking, so an
    empty file is read again a moment."""
    try:
        fd = open_lock(path, create=False)
    except FileNotFoundError:
        return None
    try:
        for _ in range(20):
            if text := os.pread(fd, 4096, 0):
                return _holder(text)
            time.sleep(0.05)
        return None
    finally:
        os.close(fd)


def _holder(text: bytes) -> Holder | None:
    """The holder a lock file's text names; None when it names none."""
    if not text:
        return None
    try:
        return Holder(**reads.parse_json(text, "a lock"))
    except (InputError, ValueError, TypeError):
        return None  # not a lock this version wrote: nobody to name
