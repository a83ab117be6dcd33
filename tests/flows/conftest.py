"""A real (temporary) Prefect API for flow tests: its own PREFECT_HOME, analytics off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    home: Path = tmp_path_factory.mktemp("prefect-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_HOME", str(home))
        mp.setenv("DO_NOT_TRACK", "1")
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        mp.delenv("PREFECT_API_URL", raising=False)
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=180):
            yield


def flow_run_logs(flow_run_id: UUID) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # the handler sends in batches
    with get_client(sync_client=True) as client:
        return client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
