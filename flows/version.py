"""The train-all flow's last step with ``version=True``: one task over rcpipe.stages.version.

It commits the run's DVC state, pushes data and models to the DVC remote and runs the
champion gate (see rcpipe/stages/version.py); the decision and its reason become a Prefect
artifact, so a scheduled run says why it kept or replaced the champion.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from rcpipe.config import Config


# serialised per workspace by a file lock inside; a failed push is retried there
@task(cache_policy=NO_CACHE)
def version_run(cfg: Config, params: str, overrides: list[str], variants: list[str]
                ) -> dict[str, Any]:
    from rcpipe.stages.version import version

    run = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{flow_run.name or 'local'}"
    record = version(cfg, variants, params=Path(params), overrides=overrides, promote=True,
                     run=run)
    verdict = "promoted" if record["promoted"] else "kept the champion"
    get_run_logger().info("version %s: %s: %s", run, verdict, record["reason"])
    create_markdown_artifact(
        key="train-all-version", description="DVC version and champion gate of this run",
        markdown=(f"# Version {run}\n\n**{verdict}**: {record['reason']}\n\n"
                  f"- dvc.lock: `{record['dvc_lock']}`\n- git commit: "
                  f"`{record['git_commit'] or '(no git checkout)'}`\n"
                  f"- record: `{record['record']}`\n"))
    return record
