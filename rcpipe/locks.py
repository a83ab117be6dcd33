"""One run at a time per output: a lock beside each output a stage writes (a model's folder,
the prepared data, a package), naming its holder.

The lock is the kernel's (flock) on `<parent>/.<output>.lock`, held by the process that runs
the stage (a Ray Train job's driver, not its workers): the kernel releases it when that
process ends, however it ends, so a run killed with -9 leaves no lock that blocks the next.
The file's text says who holds it: pid, host, since when and what it is doing, for the one
line a second run prints (``error: models/bidaf: bidaf is being trained by pid 4242 on gpu-1
since 2025-05-01T09:12:03+00:00``, exit 2) or logs while it waits (``--wait``). A file that
still names a holder whose lock the kernel released is a killed run's: the next run takes
it over and says so. The lock file is never removed, so two runs cannot lock two files of
the same name.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from rcpipe import reads
from rcpipe.errors import InputError
from rcpipe.safe_open import open_lock

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


# the locks this process holds (lock file -> [thread, depth]): a stage calling another that
# locks the same output goes on; another thread of this process is refused as another run
_held: dict[Path, list[int]] = {}
_guard = threading.Lock()


@contextmanager
def hold(output: Path, doing: str, wait: bool = False) -> Iterator[None]:
    """Hold ``output``'s lock for the block; held elsewhere: an InputError naming the holder,
    or with ``wait`` a log line and the wait."""
    path, me = lock_file(output), threading.get_ident()
    with _guard:
        entry = _held.get(path)
        if entry is not None and entry[0] == me:
            entry[1] += 1
    if entry is not None and entry[0] == me:
        try:
            yield
        finally:
            with _guard:
                entry[1] -= 1
        return
    fd = _acquire(path, output, doing, wait)
    with _guard:
        _held[path] = [me, 1]
    try:
        yield
    finally:
        with _guard:
            del _held[path]
        os.ftruncate(fd, 0)  # released cleanly: the file names no one
        os.close(fd)  # the kernel's lock goes with the descriptor


def _acquire(path: Path, output: Path, doing: str, wait: bool) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = open_lock(path)  # a link, FIFO, device or directory there: one line, exit 2
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd, settle=True)
            said = holder.said() if holder else f"another run holds {path}"
            if not wait:
                os.close(fd)
                raise InputError(output, "", said) from None
            log.info("%s: %s; waiting (--wait)", output, said)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # removed by hand meanwhile: lock the file now at the path instead
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        left = _holder(fd)
        if left is not None:
            log.warning("%s: taking over the lock of a run that ended without releasing it "
                        "(killed): %s", output, left.said())
        me = Holder(os.getpid(), socket.gethostname(),
                    datetime.now(UTC).isoformat(timespec="seconds"), doing)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(me)).encode(), 0)
        return fd


def _holder(fd: int, settle: bool = False) -> Holder | None:
    """The holder the file names, or None when it names none. ``settle``: the lock is held,
    so a name is coming (its holder writes it just after locking): read again a moment."""
    for _ in range(20 if settle else 1):
        text = os.pread(fd, 4096, 0)
        if text:
            try:
                return Holder(**reads.parse_json(text, "a lock"))
            except (InputError, ValueError, TypeError):
                return None  # not a lock this version wrote: nobody to name
        if settle:
            time.sleep(0.05)
    return None
