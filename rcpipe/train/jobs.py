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
import shlex
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rcpipe.config import Config, effective_yaml
from rcpipe.errors import InputError

log = logging.getLogger(__name__)
JOBS_DIR = Path(".rcpipe/jobs")  # each job's effective params, under the shared directory


def is_jobs_api(address: str | None) -> bool:
    """A dashboard URL: submit through the Jobs API (else ray.init joins or starts a Ray)."""
    return bool(address) and str(address).startswith(("http://", "https://"))


def job_config(cfg: Config) -> str:
    """The params the job runs: exactly ``cfg``, joining the cluster the job runs on."""
    train = cfg.train.model_copy(update={"ray_address": "auto"})
    return effective_yaml(cfg.model_copy(update={"train": train}))


def entrypoint(variant: str, params: Path, workdir: Path, force: bool) -> str:
    """The job's shell command: in the shared directory (or a clear failure), rcpipe train."""
    command = ["rcpipe", "train", variant, "--params", str(params)]
    command += ["--force"] if force else []
    where = shlex.quote(str(workdir))
    return (f"cd {where} || {{ echo 'error: {workdir}: not on this node: the submitting "
            f"directory must be on the file system every node shares' >&2; exit 2; }}; "
            f"exec {shlex.join(command)}")


def submit_train(cfg: Config, variant: str, force: bool,
                 on_line: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``rcpipe train variant`` as a Ray job and wait for it; its final status and id.

    Each line the job prints goes to ``on_line``, by default this module's log (a Prefect
    task shows it as it comes).

    Raises InputError when the cluster cannot be reached, RuntimeError when the job fails.
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    on_line = on_line or log.info
    address = str(cfg.train.ray_address)
    try:
        client = JobSubmissionClient(address)
    except ConnectionError as e:
        raise InputError(cfg.source, "train.ray_address",
                         f"no Ray Jobs API at {address}: {str(e).splitlines()[0]}") from None
    job_id = f"rcpipe-train-{variant}-{uuid.uuid4().hex[:8]}"
    params = (JOBS_DIR / f"{job_id}.yaml").resolve()
    params.parent.mkdir(parents=True, exist_ok=True)
    params.write_text(job_config(cfg))
    _submit(client, job_id, entrypoint(variant, params, Path.cwd().resolve(), force),
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
