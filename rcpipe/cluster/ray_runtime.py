"""The Ray this process trains on: join a cluster, reuse this process's, or start a local
one (started once more when its node misses Ray's start-up time on a busy machine); which
one it joined (a joined cluster may autoscale; a local Ray is what this machine has); and
the check that this Ray resumes runs (Train V2).

Imported by the stages that start Ray (train, tune), by the flow through them, and by the
image's build (infra/docker/Dockerfile checks Train V2 there).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rcpipe.cluster.job_runs import cancelled
from rcpipe.errors import InputError

log = logging.getLogger(__name__)


# A local Ray is one machine that no cloud preempts, running short jobs: no preemption
# watcher (one process less to start per job) and the controller polls its workers every
# 0.5 s instead of 2 s (a job's end is seen sooner). ~2.5 s less per job on 2 cores.
# (0.2 s saved 1.4 s more a job, but then the controller of a trial that Tune had just
# stopped saw its workers gone before it died itself and started a new worker group, whose
# placement group outlived the search: cluster/search.py now removes those too.)
# Its log monitor scans the logs folder for new files every 0.1 s (until 1,000 files) to
# forward their lines to drivers; rcpipe's drivers take none (log_to_driver=False), so a scan
# every 5 s loses nothing: idle, 0.8% of a core instead of 1.9% (117 log files, 30 s here).
# Serve's controller gives a starting proxy 5 s to answer its ready check and a running one
# 10 s its health check, then kills it: on 2 cores at load 12-18 (`make test` beside two CPU
# hogs, 2026-12-03) the session's proxy was killed before it ran ("killed by `ray.kill`")
# and every Serve test after it errored. A local Ray is one machine, not a network: 30 s.
LOCAL_RAY_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                 "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
                 "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "5",
                 "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
                 "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}


_joined: str | None = None  # the address of the cluster this process joined; None: local


# What ray.init raises when its raylet has not registered within Ray's fixed 30 s
# (ray/_private/node.py): seen on a 2-core machine busy with other Ray and Prefect start-ups
NODE_STARTUP_TIMEOUT = "timed out during startup"


def start_local_ray(num_cpus: int | None = None) -> None:
    """ray.init of a new local cluster; its processes inherit LOCAL_RAY_ENV (unless set).

    Always a new one: a bare ray.init() joins the cluster that a `ray start` on this machine
    left in <RAY_TMPDIR or /tmp>/ray/ray_current_cluster, and refuses ``num_cpus`` there
    with a traceback. Joining a cluster is asked for (train.ray_address, RAY_ADDRESS)."""
    import ray

    global _joined
    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)
    start_once_more_if_slow(lambda: ray.init(
        address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
        logging_level="WARNING", log_to_driver=False), ray.shutdown)
    _joined = None


def start_once_more_if_slow(start: Callable[[], Any], stop: Callable[[], Any]) -> None:
    """``start()``; when the node did not come up in Ray's time (a busy machine, not a
    broken setup: the same start passes when the load has passed), ``stop()`` what it left
    and start once more, with a line saying so. Any other error is raised as it is."""
    try:
        start()
    except Exception as e:  # noqa: BLE001 - ray.init raises a bare Exception for this
        if NODE_STARTUP_TIMEOUT not in str(e):
            raise
        log.warning("the local Ray did not start within Ray's 30 s (a busy machine?): "
                    "starting it once more")
        stop()
        start()


# What Ray's GCS answers a process that comes without the cluster's token (Ray >= 2.52 with
# token authentication: on by default for local clusters since Ray 2.59, for all in 2.61);
# ray.init wraps it, after ~20 s of retries, in a ConnectionError whose cause's text has it
UNAUTHENTICATED = "InvalidAuthToken"


def join(address: str) -> None:
    """ray.init of the cluster at ``address``; a cluster that refuses this process for want
    of its token is one line saying what to set, not Ray's three chained tracebacks."""
    import ray

    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except ConnectionError as e:
        said = " ".join(str(x) for x in (e, e.__cause__, e.__context__) if x is not None)
        if UNAUTHENTICATED not in said:
            raise
        raise InputError(f"Ray at {address}", "RAY_AUTH_MODE", "the cluster asks for its "
                         "token and this process came without it: set RAY_AUTH_MODE=token "
                         "and the cluster's token in RAY_AUTH_TOKEN (or ~/.ray/auth_token) "
                         "where rcpipe runs (the shell, a flow run's job environment, the "
                         "image)") from None


def joined() -> str | None:
    """The address of the cluster this process joined (it may autoscale); None: local."""
    return _joined


def connect(address: str | None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` or RAY_ADDRESS's (a cluster's job environment), else
    start a new local one (of ``num_cpus``)."""
    global _joined
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        join(address)
        _joined = address
    else:
        start_local_ray(num_cpus)


@contextmanager
def ray_cluster(address: str | None) -> Iterator[None]:
    """Join the Ray cluster at ``address``, reuse this process's, or start a local one."""
    import ray

    global _joined
    if ray.is_initialized():
        yield
        return
    if cancelled():  # a retried task of a cancelled flow: its Ray is being shut down
        raise RuntimeError("this process was cancelled: it starts no Ray")
    connect(address)
    try:
        yield
    finally:
        ray.shutdown()
        _joined = None


# Ray's switch for Train V2, and the first Ray that has it on by default
TRAIN_V2_SWITCH = "RAY_TRAIN_V2_ENABLED"
TRAIN_V2_DEFAULT_SINCE = "2.51"


def check_train_v2() -> None:
    """Refuse, in one line, a Ray whose Train V2 is off.

    rcpipe resumes a run by starting the same RunConfig(storage_path, name) again: V2 finds
    the run's checkpoints there, V1 would quietly train from step 0 (it resumes only through
    Trainer.restore). Whether V2 is on is Ray's own decision, asked as ray.train asks it
    (is_v2_enabled: RAY_TRAIN_V2_ENABLED, else the Ray version's default).
    """
    import ray

    where = f"ray {ray.__version__}"
    try:
        from ray.train.v2._internal.constants import is_v2_enabled
    except ImportError:  # a Ray from before Train V2
        raise InputError(where, TRAIN_V2_SWITCH, "this Ray has no Train V2, which rcpipe "
                         "needs to resume a run: install the locked Ray (make setup)") from None
    if is_v2_enabled():
        return
    value = os.environ.get(TRAIN_V2_SWITCH)
    if value is not None:
        raise InputError(where, TRAIN_V2_SWITCH, f"Ray Train V2 is off ({TRAIN_V2_SWITCH}="
                         f"{value}), and rcpipe resumes a run only through V2: unset "
                         f"{TRAIN_V2_SWITCH} or set it to 1")
    raise InputError(where, TRAIN_V2_SWITCH, "Ray Train V2 is off by default before Ray "
                     f"{TRAIN_V2_DEFAULT_SINCE}, and rcpipe resumes a run only through V2: "
                     f"set {TRAIN_V2_SWITCH}=1 or install the locked Ray (make setup)")
