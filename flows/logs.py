"""rcpipe's log lines in the Prefect UI.

The stages log through the ``rcpipe.*`` loggers (rcpipe/logs.py). Prefect sends a logger's
records to its API when the logger is named in ``PREFECT_LOGGING_EXTRA_LOGGERS``, but reads
that setting once, when ``prefect`` is first imported: too early for a flow module to set it
in a deployment's flow-run process, which imports prefect before the flow. So the flow
attaches the same handlers itself for as long as it runs: each record goes to the flow or
task run it was logged in (a training task's progress lines to that task run).

On the console rcpipe's own handler prints them (rcpipe/logs.py), not Prefect's root
handler: that one writes to the stderr it found at start-up, past the redirect of rich's
live progress bars, and in a terminal each line would leave a torn copy of the bars behind.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from rcpipe.logs import ROOT, StderrHandler


@contextmanager
def rcpipe_logs_to_prefect() -> Iterator[None]:
    """Within the block, rcpipe's INFO records and above go to Prefect's API, as with
    ``PREFECT_LOGGING_EXTRA_LOGGERS=rcpipe`` (which, when set, this leaves as it is), and
    to stderr through rcpipe's own handler."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger(ROOT)
    extra = logging.getLogger("prefect.extra")  # Prefect's handlers for extra loggers
    handlers = [h for h in extra.handlers or [APILogHandler()] if h not in logger.handlers]
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        handlers.append(StderrHandler())
    level, propagate = logger.level, logger.propagate
    if level == logging.NOTSET:  # the root's WARNING would drop the stages' INFO lines
        logger.setLevel(extra.level or logging.INFO)
    logger.propagate = False  # printed once, by StderrHandler
    for handler in handlers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
