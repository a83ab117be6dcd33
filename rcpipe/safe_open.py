"""Opening the files rcpipe writes beside its outputs (a lock, a stamp's or a set's temporary
file, a staged file, a download) so that whatever was planted at their names can neither
redirect nor block the write.

- A symbolic link is never followed (O_NOFOLLOW): a lock or `.tmp` file linked to another
  file would otherwise truncate and overwrite that file, with the writer's rights.
- A temporary file is always a new file (O_EXCL): a leftover of the same name (a killed
  run's, or a link planted there) is unlinked first, which removes a link, never its target.
- Opening never waits (O_NONBLOCK: a FIFO would wait for a reader), and what was opened is
  checked on its descriptor (fstat), so it cannot be swapped in between: a FIFO, a device
  or a directory is one located line, exit 2.
- A write that finds the disk full is one located line naming the file, exit 1
  (errors.RunError): the caller's old set stands, since nothing was moved over it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rcpipe.errors import InputError, RunError
from rcpipe.reads import kind_of

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# what opening a lock file says of a link (O_NOFOLLOW), a directory, a socket, a file not ours
REFUSALS = (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EACCES)


def refused(path: Path, e: OSError) -> InputError:
    """An open refused for what lies at ``path`` (a link, a directory), or the OS's word."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return InputError(path, "", f"cannot open: {e.strerror or e}")
    what = "a symbolic link" if stat.S_ISLNK(mode) else kind_of(mode)
    return InputError(path, "", f"refused: {what}, not a regular file (rcpipe writes it)")


def not_regular(path: Path, fd: int) -> InputError | None:
    """The refusal of what ``fd`` (opened at ``path``) is when it is not a regular file."""
    mode = os.fstat(fd).st_mode
    return None if stat.S_ISREG(mode) else InputError(
        path, "", f"refused: {kind_of(mode)}, not a regular file (rcpipe writes it)")


def _regular(fd: int, path: Path) -> int:
    if (refusal := not_regular(path, fd)) is not None:
        os.close(fd)
        raise refusal
    os.set_blocking(fd, True)
    return fd


def open_lock(path: Path, create: bool = True) -> int:
    """A lock file's descriptor, read-write, created when absent (else, ``create`` False:
    FileNotFoundError); refused (one line, exit 2) when the name holds a link, a FIFO, a
    device or a directory."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0) | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno in REFUSALS:
            raise refused(path, e) from None
        raise
    return _regular(fd, path)


def create_new(path: Path) -> int:
    """A new, empty regular file at ``path`` open for writing: what was there (a killed
    run's leftover, a link) is unlinked first; a directory there is refused."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError) as e:
        raise refused(path, e) from None
    try:
        return os.open(path, _NEW, 0o644)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise disk_full(path) from None
        if e.errno == errno.EEXIST:  # planted again in between: refused, never followed
            raise refused(path, e) from None
        raise


def disk_full(path: Path | str) -> RunError:
    return RunError(path, "", "no space left on device; nothing of the new set was moved "
                    "into place (the previous one stands)")


def is_disk_full(e: BaseException) -> bool:
    """ENOSPC, as the OS says it or as pyarrow words it (its OSError carries no errno)."""
    return isinstance(e, OSError) and (
        e.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(e))


def write_new(path: Path, data: bytes | str, name: Path | str | None = None) -> None:
    """``data`` in a new file at ``path`` (create_new), synced: on a full disk one line
    naming ``name`` (the file the user knows it as; default ``path``), the partial file
    removed."""
    fd = create_new(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        Path(path).unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full(path if name is None else name) from None
        raise
