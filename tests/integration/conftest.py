"""Fixtures of the integration tests: a real Prefect stack (server, process work pool,
worker) as `make up` starts it (flows/stack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flows import stack
from tests.ray_nodes import free_port


@pytest.fixture(scope="session")
def prefect_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The stack `make up` starts, with a temporary PREFECT_HOME, on a free port of
    127.0.0.1; one per pytest worker, shared by the modules that deploy (a server, its
    migration, the deployment and a worker take ~30 s and ~35 CPU s on 2 cores), as one
    team's server holds night after night of runs. Clients talk to it through
    ``stack.server_env(<a home of their own>, running["api_url"])``."""
    home = tmp_path_factory.mktemp("prefect") / "server"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DO_NOT_TRACK", "1")
        # the worker asks for scheduled runs every second, not every 10 s (Prefect's
        # default, fine for a nightly): each deployment run here starts ~5 s sooner
        mp.setenv("PREFECT_WORKER_QUERY_SECONDS", "1")
        mp.delenv("PREFECT_API_URL", raising=False)
        running = stack.up(free_port(), home)
    try:
        yield running
    finally:
        stack.down(home)
