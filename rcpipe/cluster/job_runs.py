"""Which Ray job is a run's, and what becomes of it when its submitter stops.

A run's job has the submission id ``rcpipe-<run>-<variant>-<attempt>``: the run is a Prefect
flow run's id, a user's ``--run-name``, or (neither given) the place the run trains into.
Ray refuses a second job under an id it has ever seen, finished or not, so the run and the
variant alone cannot be the id: a run whose job finished (failed, stopped, or succeeded and
trained again with --force) takes the next attempt. Before submitting, the submitter lists
the run's jobs: an unfinished one (PENDING or RUNNING) is followed instead, so a retried
task, a second terminal or a rescheduled flow-run pod never doubles it. Two submitters
racing to the same next attempt both end up following the one job Ray took (the other's
submit_job is refused: "already exists").

A submitter that is interrupted (Ctrl-C, SIGTERM, a Prefect cancellation) stops the job it
follows, unless asked to detach; one whose log stream broke (an Exception, not an
interruption) leaves it running, for its retry or the same command to follow again.

A process cancelled as a whole (stop_followed: the train-all flow's main thread, when
Prefect cancels the run) starts no job any more, and the Ray Train jobs its threads fit on
this process's own Ray (cluster/train_job.py, ``fitting``) give up following them before
that Ray is shut down: a thread calling Ray after the shutdown would start a new local
Ray for itself (Ray's auto-init), and the cancelled process would not end.
"""

from __future__ import annotations

import hashlib
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rcpipe.errors import InputError

log = logging.getLogger(__name__)
RUN_KEY, VARIANT_KEY = "rcpipe_run", "rcpipe_variant"  # the job's metadata
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a part of a Ray submission id
STOP_WAIT_S = 10.0  # Ray kills an entrypoint 3 s after its SIGTERM (RAY_JOB_STOP_WAIT_TIME_S)

_lock = threading.Lock()
_followed: dict[str, Any] = {}  # submission id -> its client: the jobs this process follows
_cancelled = threading.Event()  # stop_followed was called: no job starts any more
_fits = threading.Condition(_lock)  # notified when a local fit stops following its job
_fitting = 0  # how many local Ray Train fits follow their jobs in this process now


def check_run_name(name: str) -> str:
    if not RUN_NAME.fullmatch(name):
        raise InputError("--run-name", name, "a run name is 1 to 64 letters, digits, '.', "
                         "'_' or '-', starting with a letter or digit")
    return name


def default_run(workdir: Path, storage_path: str | None) -> str:
    """A run with no name is the place it trains into (the directory the job works in and
    its checkpoint storage): the same command from the same directory is the same run."""
    return "dir-" + hashlib.sha256(f"{workdir}\0{storage_path or ''}".encode()).hexdigest()[:12]


def submission_id(run: str, variant: str, attempt: int) -> str:
    return f"rcpipe-{run}-{variant}-{attempt}"


def run_jobs(client: Any, run: str, variant: str) -> list[tuple[int, Any]]:
    """(attempt, JobDetails) of every job of ``run`` and ``variant`` on the cluster, oldest
    first."""
    prefix = submission_id(run, variant, 0)[:-1]
    found = []
    for job in client.list_jobs():
        sid, meta = job.submission_id or "", job.metadata or {}
        if (meta.get(RUN_KEY), meta.get(VARIANT_KEY)) == (run, variant) and \
                sid.startswith(prefix) and sid[len(prefix):].isdigit():
            found.append((int(sid[len(prefix):]), job))
    return sorted(found, key=lambda found: found[0])


def attach_or_submit(client: Any, run: str, variant: str, entrypoint: str,
                     submit: Callable[[str], None]) -> tuple[str, bool]:
    """(submission id, whether it was already there): the run's unfinished job, else a new
    one through ``submit(id)`` under the next attempt.

    Raises InputError when the unfinished job runs other params (following it would train
    what was not asked for; a second one would train into the same storage).
    """
    for _ in range(5):  # each lost race means another submitter's job now exists
        if _cancelled.is_set():
            raise RuntimeError("this process was cancelled: it starts no Ray job")
        jobs = run_jobs(client, run, variant)
        unfinished = [job for _, job in jobs if not job.status.is_terminal()]
        if unfinished:
            job = unfinished[-1]
            if job.entrypoint != entrypoint:
                raise InputError("--run-name", run, f"Ray job {job.submission_id} of this run "
                                 f"is still training {variant} with other params or "
                                 f"directory: stop it (`ray job stop {job.submission_id}`) "
                                 "or name another run")
            return job.submission_id, True
        job_id = submission_id(run, variant, (jobs[-1][0] if jobs else 0) + 1)
        try:
            submit(job_id)
            return job_id, False
        except RuntimeError as e:
            if "already exists" not in str(e):
                raise
    raise RuntimeError(f"run {run} {variant}: kept losing the race to submit its Ray job")


@contextmanager
def following(client: Any, job_id: str, detach: bool,
              on_line: Callable[[str], None]) -> Iterator[None]:
    """While the caller follows ``job_id``: an interruption (KeyboardInterrupt, SystemExit,
    SIGTERM here in the main thread, Prefect's TerminationSignal, a cancelled task: the
    BaseExceptions that are not Exceptions) stops the job unless ``detach``."""
    with _lock:
        cancelled = _cancelled.is_set()
        if not (detach or cancelled):
            _followed[job_id] = client  # stop_followed, from another thread, stops it
    if cancelled:  # stop_followed ran between this job's submission and now
        if not detach:
            stop(client, job_id, on_line)
        raise RuntimeError("this process was cancelled: it follows no Ray job")
    try:
        with _sigterm_raises():
            yield
    except Exception:
        raise  # the log stream lost, ...: the job runs on for a retry to follow
    except BaseException:
        if detach:
            on_line(f"Ray job {job_id} left running (--detach): the same command follows "
                    f"it again; `ray job stop {job_id}` stops it")
        else:
            stop(client, job_id, on_line)
        raise
    finally:
        with _lock:
            _followed.pop(job_id, None)


def stop_followed(on_line: Callable[[str], None] = log.warning) -> list[str]:
    """Stop every job this process follows, and start no more; the ids stopped. Returns
    once the local fits have stopped calling Ray too (STOP_WAIT_S at most), so that the
    caller may shut this process's Ray down, which ends their jobs.

    For another thread to call when the process is cancelled: the train-all flow's main
    thread does when Prefect cancels the run, since its train tasks follow their jobs in
    worker threads that no signal reaches.
    """
    with _lock:
        _cancelled.set()
        jobs = dict(_followed)
    for job_id, client in jobs.items():
        stop(client, job_id, on_line)
    with _fits:
        if not _fits.wait_for(lambda: _fitting == 0, timeout=STOP_WAIT_S):
            on_line(f"{_fitting} Ray Train job(s) still followed after {STOP_WAIT_S:.0f} s: "
                    "they end with this process's Ray")
    return list(jobs)


def cancelled() -> bool:
    """Whether stop_followed was called: this process follows and starts no Ray job."""
    return _cancelled.is_set()


@contextmanager
def fitting() -> Iterator[None]:
    """While a thread follows a Ray Train job on this process's Ray (train_job.fit): it
    polls ``cancelled()``, and once that is true calls Ray no more and leaves. Raises
    RuntimeError at once in a cancelled process (no job starts)."""
    global _fitting
    with _fits:
        if _cancelled.is_set():
            raise RuntimeError("this process was cancelled: it starts no Ray job")
        _fitting += 1
    try:
        yield
    finally:
        with _fits:
            _fitting -= 1
            _fits.notify_all()


def stop(client: Any, job_id: str, on_line: Callable[[str], None]) -> None:
    """stop_job, then wait (a few seconds) until Ray has it ended."""
    try:
        client.stop_job(job_id)
        deadline = time.monotonic() + STOP_WAIT_S
        while not (status := client.get_job_status(job_id)).is_terminal() and \
                time.monotonic() < deadline:
            time.sleep(0.2)
    except Exception as e:  # noqa: BLE001 - the interruption goes on; say what is left
        on_line(f"Ray job {job_id} may still run: stopping it failed ({e!r:.200}); "
                f"`ray job stop {job_id}`")
        return
    on_line(f"Ray job {job_id} stopped ({status.value})" if status.is_terminal() else
            f"Ray job {job_id} asked to stop; still {status.value} after {STOP_WAIT_S:.0f} s")


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM (a pod evicted, `kill`) raises SystemExit, as Ctrl-C raises
    KeyboardInterrupt, so the job is stopped on the way out; Python's default would end
    the process at once. Only in the main thread, only over the default handler (Prefect
    installs its own in a flow run)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
