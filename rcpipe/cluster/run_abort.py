"""Abort a Ray Train run that this process fits, when the process is cancelled.

A cancelled process (job_runs.stop_followed: the train-all flow's main thread, when
Prefect cancels the run) stops its runs before it shuts its Ray down. Shutting a local Ray
down alone is no stop: Prefect's runner sends SIGTERM to the flow run's whole process
group, the local Ray's raylet and workers included, and the Ray Train workers, orphaned,
went on training for seconds (a cancelled night's short runs stored their last steps'
checkpoints after the cancellation). Train V2 aborts a run through its controller (what
Ctrl-C does when ``fit`` runs in the main thread; rcpipe fits in worker threads, where Ray
installs no handler), and the driver holds no handle to that controller:
``AnnounceController``, a Train V2 controller callback, puts it on the run's progress
queue as the controller starts, and ``abort`` stops the run through it. The hook is Train
V2's internal ``ControllerCallback`` (RunConfig passes it through as it is) at the locked
Ray; tests/cluster/test_run_abort.py fails if a Ray upgrade moves it (and night 3 of
tests/integration/test_nights.py aborts real runs through it).
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback

log = logging.getLogger(__name__)

CONTROLLER = "controller"  # the progress message's key that carries the handle
ABORT_WAIT_S = 5.0  # ~1 s: Train V2 kills the worker group, then the controller exits


class AnnounceController(ControllerCallback):
    """Puts ``{"controller": <its actor handle>}`` on the progress queue as the controller
    starts (in the controller's process; fire and forget: a controller hook must not block
    on another actor)."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def after_controller_start(self, train_run_context: Any) -> None:
        me = ray.get_runtime_context().current_actor
        self.progress.actor.put_nowait.remote({CONTROLLER: me})


def abort(controller: Any, name: str) -> None:
    """Abort the run of ``controller`` (its workers killed, the checkpoints it recorded
    kept), waiting ABORT_WAIT_S at most."""
    try:
        ray.get(controller.abort.remote(), timeout=ABORT_WAIT_S)
    except ray.exceptions.RayActorError:
        pass  # the controller exits as its abort ends: the reply may not come back
    except Exception as e:  # noqa: BLE001 - the cancellation goes on: Ray's shutdown ends it
        log.warning("Ray Train run %s: abort failed (%.200r); it ends with this process's "
                    "Ray", name, e)
