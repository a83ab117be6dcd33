"""The one retry policy: a call tried again after a failure that may pass (a network's, a
remote's), waiting twice as long after each, within a number of tries and a deadline. The
download of an input (data/squad.py's ``fetch``) and `dvc push` (release/remote.py's
``push``) retry through it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class GaveUp(Exception):
    """A retried call's last failure (``error``), after ``tries`` tries."""

    def __init__(self, error: Exception, tries: int) -> None:
        super().__init__(error, tries)
        self.error, self.tries = error, tries


def retried(call: Callable[[], T], tries: int, backoff: float, *,
            retryable: Callable[[Exception], bool] = lambda e: True,
            deadline: float = float("inf"),
            waiting: Callable[[Exception, int, float], None] | None = None) -> T:
    """``call()``, tried up to ``tries`` times: after its n-th failure a wait of ``backoff *
    2 ** (n - 1)`` seconds (``waiting(error, n, seconds)`` told first). A failure that is not
    ``retryable`` propagates as it is; the last one (the tries used up, or the clock,
    ``time.monotonic()``, past ``deadline``) as GaveUp."""
    for n in range(1, tries + 1):
        try:
            return call()
        except Exception as e:
            if not retryable(e):
                raise
            if n == tries or time.monotonic() >= deadline:
                raise GaveUp(e, n) from e
            wait = backoff * 2 ** (n - 1)
            if waiting is not None:
                waiting(e, n, wait)
            time.sleep(wait)
    raise ValueError(f"tries {tries}: at least one")
