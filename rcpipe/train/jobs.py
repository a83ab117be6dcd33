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
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rcpipe.config import Config, effective_yaml
from rcpipe.errors import InputError

log = logging.getLogger(__name__)
HEREDOC = "RCPIPE_PARAMS"  # ends the params in the entrypoint; no YAML line equals it


def is_jobs_api(address: str | None) -> bool:
    """A dashboard URL: submit through the Jobs API (else ray.init joins or starts a Ray)."""
    return bool(address) and str(address).startswith(("http://", "https://"))


def jobs_api_address(cfg: Config) -> str | None:
    """The Jobs API this run submits to, if any: train.ray_address when it is a dashboard
    URL, or RAY_ADDRESS when it is one (as Ray's own `ray job submit` reads it) and
    train.ray_address names no other cluster (unset, or 'auto')."""
    own = cfg.train.ray_address
    if is_jobs_api(own):
        return own
    env = os.environ.get("RAY_ADDRESS")
    return env if own in (None, "auto") and is_jobs_api(env) else None


def job_config(cfg: Config) -> str:
    """The params the job runs: exactly ``cfg``, joining the cluster the job runs on."""
    train = cfg.train.model_copy(update={"ray_address": "auto"})
    return effective_yaml(cfg.model_copy(update={"train": train}))


def entrypoint(variant: str, params_yaml: str, workdir: Path, force: bool) -> str:
    """The job's shell command: in the shared directory (or a clear failure), the params
    written to a file of the head's own, then rcpipe train. The params travel inside the
    command, so the dashboard shows exactly what ran and no file needs sharing for it."""
    if any(line == HEREDOC for line in params_yaml.splitlines()):
        raise ValueError(f"params contain the line {HEREDOC}")
    train = f"rcpipe train {shlex.quote(variant)} --params \"$params\"" + \
        (" --force" if force else "")
    where = shlex.quote(str(workdir))
    missing = shlex.quote(f"error: {workdir}: not on this node: the submitting directory "
                          "must be on the file system the cluster shares")
    return (f"set -e\ncd {where} 2>/dev/null || {{ echo {missing} >&2; exit 2; }}\n"
            f"params=$(mktemp --suffix=.yaml)\ncat > \"$params\" <<'{HEREDOC}'\n"
            f"{params_yaml.rstrip()}\n{HEREDOC}\n"
            f"exec {train}\n")


def submit_train(cfg: Config, variant: str, force: bool,
                 on_line: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``rcpipe train variant`` as a Ray job and wait for it; its final status and id.

    Each line the job prints goes to ``on_line``, by default this module's log (a Prefect
    task shows it as it comes).

    Raises InputError when the cluster cannot be reached, RuntimeError when the job fails.
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    on_line = on_line or log.info
    address = jobs_api_address(cfg)
    if address is None:
        raise ValueError("no Jobs API address: train.ray_address or RAY_ADDRESS")
    key = "train.ray_address" if is_jobs_api(cfg.train.ray_address) else "RAY_ADDRESS"
    try:
        client = JobSubmissionClient(address)
    except ConnectionError as e:
        raise InputError(cfg.source, key,
                         f"no Ray Jobs API at {address}: {str(e).splitlines()[0]}") from None
    job_id = f"rcpipe-train-{variant}-{uuid.uuid4().hex[:8]}"
    _submit(client, job_id, entrypoint(variant, job_config(cfg), Path.cwd().resolve(), force),
            {"variant": variant})
    on_line(f"train {variant}: submitted Ray job {job_id} to {address}")
    asyncio.run(_follow(client, job_id, on_line))
    status = _final_status(client, job_id)
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        raise RuntimeError(f"Ray job {job_id} ({variant}) {status.value}: "
                           f"{(info.message or '').strip()[-500:]}")
    return {"job_id": job_id, "status": status.value}


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
