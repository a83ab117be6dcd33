"""`rcpipe train VARIANT` submitted to a running Ray cluster through its Jobs API.

Ray's documentation advises against Ray Client (``ray://``) for Ray Train: a driver outside
the cluster loses the run when its connection drops. With ``train.ray_address`` set to the
cluster's dashboard (``http://head:8265``) the train stage instead submits itself as a Ray
job: the job's driver runs on the head node, joins the cluster (``train.ray_address=auto``)
and runs the same ``rcpipe train`` a laptop runs. The submitter follows the job's log and
status and reads the run's files when it ends.

The job works in the submitter's directory, which must be on the file system every node
shares (the prepared Parquet files already must be): ``models/<variant>/`` appears there as
if the run had been local. Ray queues jobs that do not fit yet; an autoscaling cluster
grows to take them.

A job is never doubled nor orphaned (cluster/job_runs.py): its submission id names the run
and the variant, a submitter finds its run's unfinished job and follows it instead of
submitting another, and a submitter that is interrupted (Ctrl-C, SIGTERM, a Prefect
cancellation) stops the job it follows unless it was asked to ``detach``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rcpipe.cluster import job_runs
from rcpipe.config import NAMED_AS_ENV, Config, effective_yaml
from rcpipe.errors import InputError

log = logging.getLogger(__name__)
HEREDOC = "RCPIPE_PARAMS"  # ends the params in the entrypoint; no YAML line equals it
# Where Ray's job client looks, first to last, before the address it is handed: the same
# order as `ray job submit` (ray/dashboard/utils.py, get_address_for_submission_client,
# in Ray 2.60: RAY_API_SERVER_ADDRESS, else RAY_ADDRESS, else --address)
API_SERVER_ENV, ADDRESS_ENV = "RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"


def is_jobs_api(address: str | None) -> bool:
    """A dashboard URL: submit through the Jobs API (else ray.init joins or starts a Ray)."""
    return bool(address) and str(address).startswith(("http://", "https://"))


def jobs_api_address(cfg: Config) -> str | None:
    """The Jobs API this run submits to, if any.

    train.ray_address when it is a dashboard URL; else, when train.ray_address names no
    other cluster (unset, or 'auto'), RAY_API_SERVER_ADDRESS (any form Ray's client takes)
    or RAY_ADDRESS when it is a dashboard URL, in the order Ray's own `ray job submit`
    reads them. A RAY_ADDRESS that is a cluster's GCS means joining it (inside a job Ray
    sets it so). Ray's client lets these variables override the address it is handed, so a
    dashboard URL in the params beside another one in the environment is refused, in one
    line, rather than submitted to the environment's cluster.
    """
    own = cfg.train.ray_address
    env = next(((k, v) for k in (API_SERVER_ENV, ADDRESS_ENV) if (v := os.environ.get(k))),
               None)
    if is_jobs_api(own):
        if env is not None and env[1].rstrip("/") != str(own).rstrip("/"):
            raise InputError(cfg.source, "train.ray_address",
                             f"{own} beside {env[0]}={env[1]}, which Ray's job client would "
                             f"use instead: unset one of them")
        return own
    if own not in (None, "auto") or env is None:
        return None
    return env[1] if env[0] == API_SERVER_ENV or is_jobs_api(env[1]) else None


def job_config(cfg: Config) -> str:
    """The params the job runs: exactly ``cfg``, joining the cluster the job runs on."""
    train = cfg.train.model_copy(update={"ray_address": "auto"})
    return effective_yaml(cfg.model_copy(update={"train": train}))


def entrypoint(variant: str, params_yaml: str, workdir: Path, force: bool,
               command: str = "train", named_as: str = "params.yaml") -> str:
    """The job's shell command: in the shared directory (or a clear failure), the params
    written to a file of the head's own, then rcpipe train (or tune). The params travel inside the
    command, so the dashboard shows exactly what ran and no file needs sharing for it.
    RAY_API_SERVER_ADDRESS, were the head's environment to hold it, is dropped: the job
    joins the cluster it runs on instead of submitting itself once more. Its lines and
    records (the search's "train with it" line) name ``named_as``, the submitter's file."""
    if any(line == HEREDOC for line in params_yaml.splitlines()):
        raise ValueError(f"params contain the line {HEREDOC}")
    train = f"rcpipe {command} {shlex.quote(variant)} --params \"$params\"" + \
        (" --force" if force else "")
    where = shlex.quote(str(workdir))
    missing = shlex.quote(f"error: {workdir}: not on this node: the submitting directory "
                          "must be on the file system the cluster shares")
    return (f"set -e\ncd {where} 2>/dev/null || {{ echo {missing} >&2; exit 2; }}\n"
            f"params=$(mktemp --suffix=.yaml)\ncat > \"$params\" <<'{HEREDOC}'\n"
            f"{params_yaml.rstrip()}\n{HEREDOC}\n"
            f"unset {API_SERVER_ENV}\nexport {NAMED_AS_ENV}={shlex.quote(named_as)}\n"
            f"exec {train}\n")


def submit_train(cfg: Config, variant: str, force: bool,
                 on_line: Callable[[str], None] | None = None, run: str | None = None,
                 detach: bool = False, command: str = "train") -> dict[str, Any]:
    """Run ``rcpipe train variant`` (``command``: or ``tune``) as the Ray job of ``run``
    and wait for it; its final status and id.

    ``run`` names the run (a flow run's id, a user's --run-name; by default the directory
    and checkpoint storage it trains into, job_runs.default_run): an unfinished job of the
    same run and variant is followed instead of a second one submitted. Interrupted, the
    submitter stops the job it follows, unless ``detach``: then the job runs on and the
    same command follows it again. Each line the job prints goes to ``on_line``, by default
    this module's log (a Prefect task shows it as it comes).

    Raises InputError when the cluster cannot be reached, RuntimeError when the job fails.
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    on_line = on_line or log.info
    address = jobs_api_address(cfg)
    if address is None:
        raise ValueError("no Jobs API address: train.ray_address, RAY_API_SERVER_ADDRESS "
                         "or RAY_ADDRESS")
    run = job_runs.check_run_name(run) if run is not None else \
        job_runs.default_run(Path.cwd().resolve(), cfg.train.storage_path)
    key = "train.ray_address" if is_jobs_api(cfg.train.ray_address) else \
        next(k for k in (API_SERVER_ENV, ADDRESS_ENV) if os.environ.get(k))
    try:
        client = JobSubmissionClient(address)
    except ConnectionError as e:
        raise InputError(cfg.source, key,
                         f"no Ray Jobs API at {address}: {str(e).splitlines()[0]}") from None
    script = entrypoint(variant, job_config(cfg), Path.cwd().resolve(), force, command,
                        cfg.source)
    # a search is its own job beside the variant's training: rcpipe-<run>-tune-<v>-<n>
    what = variant if command == "train" else f"{command}-{variant}"
    job_id, attached = job_runs.attach_or_submit(
        client, run, what, script, lambda i: _submit(client, i, script, {
            job_runs.RUN_KEY: run, job_runs.VARIANT_KEY: what}))
    on_line(f"{command} {variant}: {'following the unfinished' if attached else 'submitted'} "
            f"Ray job {job_id} at {address}")
    with job_runs.following(client, job_id, detach, on_line):
        asyncio.run(_follow(client, job_id, on_line))
        status = _final_status(client, job_id)
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        raise RuntimeError(f"Ray job {job_id} ({variant}) {status.value}: "
                           f"{(info.message or '').strip()[-500:]}")
    return {"job_id": job_id, "status": status.value, "attached": attached}


def _submit(client: Any, job_id: str, command: str, metadata: dict[str, str],
            wait: float = 60.0) -> None:
    """submit_job, waiting out a head that has just started (its job agent not yet up)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            client.submit_job(entrypoint=command, submission_id=job_id, metadata=metadata)
            return
        except RuntimeError as e:
            if "No available agent" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


async def _follow(client: Any, job_id: str, on_line: Callable[[str], None]) -> None:
    """Every line the job prints, as it prints it (until the job ends)."""
    async for chunk in client.tail_job_logs(job_id):
        for line in chunk.splitlines():
            on_line(line)


def _final_status(client: Any, job_id: str, timeout: float = 60.0) -> Any:
    """The job's terminal status (the log stream may close a moment before it is set)."""
    deadline = time.monotonic() + timeout
    while not (status := client.get_job_status(job_id)).is_terminal():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray job {job_id}: its log ended but it is still {status}")
        time.sleep(0.5)
    return status
