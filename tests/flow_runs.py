"""A deployment's flow runs as a Prefect server holds them: the id `prefect deployment run`
prints, the run's state and its log lines (tests/integration: the nights, the lost node)."""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID


def flow_run_id(stdout: str) -> str:
    """The id of the flow run `prefect deployment run` says it created."""
    found = re.search(r"UUID:?\s*([0-9a-f-]{36})|id[^0-9a-f]*([0-9a-f-]{36})", stdout)
    assert found, stdout
    return found.group(1) or found.group(2)


def flow_run(api_url: str, run_id: str) -> tuple[Any, list[Any]]:
    """The flow run as the server at ``api_url`` holds it, and its log lines as the UI shows
    them (each with the task run that logged it)."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    only = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(run_id)]))
    lines: list[Any] = []
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as c:
        while page := c.read_logs(only, limit=200, offset=len(lines)):  # the API's pages
            lines += page
        return c.read_flow_run(UUID(run_id)), lines
