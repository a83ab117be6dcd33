"""Where people watch a run in a terminal: the progress bars and rich's log lines
(rcpipe/logs.py) share one console on stderr, so stdout carries only results that other
tools parse (``rcpipe score`` prints JSON there). Off a terminal (Ray job logs, Prefect, a
file) the bars stay off and the log lines are plain."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


def progress(disable: bool = False) -> Progress:
    """A bar on the console; off where stderr is no terminal, where rich would print each
    bar's last frame as a line of box characters into the log."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=disable or not console.is_terminal,
    )


class _SharedProgress:
    """One live progress display for every concurrent user in this process.

    rich allows one live display per console, and the train-all flow trains several
    variants at once on threads of one process: each takes a task row in the same bar.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        self._users = 0

    @contextmanager
    def __call__(self) -> Iterator[Progress]:
        with self._lock:
            if self._bar is None:
                self._bar = progress()
                self._bar.start()
            self._users += 1
            bar = self._bar
        try:
            yield bar
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    bar.stop()
                    self._bar = None


shared_progress = _SharedProgress()
