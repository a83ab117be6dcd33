"""Where rcpipe's log lines go: the ``rcpipe.*`` loggers of the standard ``logging`` module.

Every stage and the training driver log through ``logging.getLogger(__name__)``, so whoever
runs rcpipe decides where the lines land: the `rcpipe` command and
``python -m rcpipe.train.local`` call ``setup()``, which writes them to stderr (through rich,
beside the progress bars, in a terminal; as plain timestamped lines otherwise: Ray job logs,
CI, a file); the Prefect flows hand them to Prefect's API instead (flows/logs.py), so the
Prefect UI shows them. Nothing here imports rich until a terminal asks for it: a GPU box
with only PyTorch can train and log (train/local.py).
"""

from __future__ import annotations

import logging
import sys

ROOT = "rcpipe"  # the parent of every rcpipe logger: the name handlers attach to
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def is_terminal() -> bool:
    """Whether stderr, where the lines and the bars go, is a terminal now."""
    try:
        from rcpipe.console import console
    except ImportError:  # no rich on this box: plain lines
        return sys.stderr.isatty()
    return console.is_terminal


class StderrHandler(logging.Handler):
    """rich's log lines on the shared console in a terminal (they print above a live
    progress bar instead of through it), plain lines otherwise.

    Decided at each record, and written to whatever ``sys.stderr`` is then (a test's
    capture, a redirect), so one handler serves the whole life of the process.
    """

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(PLAIN_FORMAT))
        self._rich: logging.Handler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if is_terminal():
            self._rich_handler().handle(record)
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never stop the run
            self.handleError(record)

    def _rich_handler(self) -> logging.Handler:
        if self._rich is None:
            from rich.logging import RichHandler

            from rcpipe.console import console

            self._rich = RichHandler(console=console, show_path=False, markup=False,
                                     log_time_format="[%X]")
        return self._rich


def setup(level: int = logging.INFO) -> logging.Logger:
    """Send rcpipe's records at ``level`` and above to stderr (once per process)."""
    logger = logging.getLogger(ROOT)
    logger.setLevel(level)
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        logger.addHandler(StderrHandler())
    return logger
