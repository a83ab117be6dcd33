"""The Ray Train job ledger (RCPIPE_JOB_LEDGER=<file>, set by tests/markers.py in every run):
each Ray Train job the suite starts, wherever it starts, is one line of the file.

A job is one ``fit`` of Ray Train V2's DataParallelTrainer (TorchTrainer is one; a Tune
trial's trainer too): each starts Ray Train's five actors, ~20 CPU s on this project's
2-core machine before it trains (docs/dev/testing.md), so the suite keeps their number
down and tests/markers.py checks it. The fit runs in the pytest worker (``stages.train``),
an ``rcpipe`` command, a dvc stage, a Prefect flow run or a Ray actor: every one of them is a
Python process that imports this file through the audit's ``sitecustomize`` (its directory
on PYTHONPATH, completed into a subprocess's own env= as the audit does), and records

    {"worker": <the pytest worker, PYTEST_XDIST_WORKER or "main">, "t": <time.time()>,
     "label": <RCPIPE_JOB_LABEL: a shared fixture building, else "">, "pid": ...}

The pytest worker named there then charges the job to the test it was running at that time
(a long-lived process, a Prefect worker or a Ray node, keeps the env of the test that
started it, so the time decides, not the env), or to the shared fixture its label names.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

LEDGER = "RCPIPE_JOB_LEDGER"  # the file: a JSON line a job
LABEL = "RCPIPE_JOB_LABEL"  # a shared fixture that trains sets it while it builds
FIT = "ray.train.v2.api.data_parallel_trainer"  # the module whose DataParallelTrainer.fit


def record() -> None:
    """One line for a job starting now in this process."""
    path = os.environ.get(LEDGER)
    if not path:
        return
    line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "t": time.time(),
            "label": os.environ.get(LABEL, ""), "pid": os.getpid()}
    with open(path, "a", encoding="utf-8") as f:  # one short write: whole lines
        f.write(json.dumps(line) + "\n")


def patch_fit(module: Any) -> None:
    """Wrap DataParallelTrainer.fit of ``module`` (FIT) to record each call first."""
    cls = module.DataParallelTrainer
    original: Callable[..., Any] = cls.fit
    if getattr(original, "__job_ledger__", False):
        return

    @functools.wraps(original)
    def fit(*args: Any, **kwargs: Any) -> Any:
        record()
        return original(*args, **kwargs)

    fit.__job_ledger__ = True  # type: ignore[attr-defined]
    cls.fit = fit


def read(path: str) -> list[dict[str, Any]]:
    """The jobs recorded so far (a torn last line, written as the file is read, skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    jobs = []
    for line in lines:
        try:
            jobs.append(json.loads(line))
        except ValueError:
            continue
    return jobs
