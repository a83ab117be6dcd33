"""Run `rcpipe ...` or `python -m rcpipe.train.local ...` and kill it with SIGKILL just
before its N-th file-system step (a rename, a removal, an fsync: the points where a half-done
run differs from a whole one), or never (N = 0).

The kill is the kernel's -9 on the run's own process, as the OOM killer or a lost machine
would: no handler, no cleanup runs. Each run is a process forked from this one, which has
imported rcpipe, torch, pyarrow and spaCy once (on a busy 2-core machine those imports take
most of a tiny run's time). One request a line on stdin, one answer a line on stdout:

    {"at": N, "cwd": DIR, "log": FILE, "which": "rcpipe" | "local", "args": [...]}
    {"returncode": -9 | 0 | 2 ..., "steps": steps taken (a run that was not killed)}

    python -m tests.faults.killer
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

STEPS = ("replace", "rename", "unlink", "remove", "rmdir", "fsync")


def _armed(at: int, counter: list[int], fn: Callable[..., Any]) -> Callable[..., Any]:
    def step(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        if counter[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args, **kwargs)

    return step


def _child(request: dict[str, Any], steps: int) -> None:
    """The run, in the forked process: never returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        counter = [0]
        for name in STEPS:
            setattr(os, name, _armed(request["at"], counter, getattr(os, name)))
        shutil.rmtree = _armed(request["at"], counter, shutil.rmtree)  # type: ignore[assignment]
        if request["which"] == "rcpipe":
            from rcpipe.cli import main as run
        else:
            from rcpipe.train.local import main as run
        try:
            run(request["args"])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        os.write(steps, str(counter[0]).encode())
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    import pyarrow.parquet  # noqa: F401
    import spacy  # noqa: F401
    import torch  # noqa: F401

    import rcpipe.cli  # noqa: F401
    import rcpipe.train.local  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        read, write = os.pipe()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _child(request, write)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        taken = os.read(read, 64)
        os.close(read)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sys.stdout.write(json.dumps({"returncode": code, "steps": int(taken or 0)}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
