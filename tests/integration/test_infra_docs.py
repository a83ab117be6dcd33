"""infra/'s Prefect steps as a new user runs them: every fenced block that infra/README.md and
infra/prefect/README.md mark `<!-- tested -->` runs as written (bash, from the project root)
against a fresh Prefect server (SQLite, its own PREFECT_HOME, analytics off; no pool, no
deployment beforehand), in the order the docs give them; then the server holds what the docs
promise: the Kubernetes pool with the template's job configuration, every prefect.yaml
deployment of that pool with its schedules, the nightly's run and its alerts. A doc that
drifts from prefect.yaml or from Prefect (`prefect deploy --all` once stopped at a pool only
`make up` creates) fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows import stack
from tests.ray_nodes import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "infra/README.md", ROOT / "infra/prefect/README.md"]
MARK = "<!-- tested -->"
POOL = "rcpipe-gpu"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def marked_blocks(doc: Path) -> list[str]:
    """The fenced blocks of ``doc`` right after a MARK line, in order."""
    text = doc.read_text()
    return [m.group(1) for m in FENCE.finditer(text)
            if text[:m.start()].rstrip().endswith(MARK)]


def test_every_prefect_command_of_infra_docs_is_in_a_tested_block() -> None:
    """A `prefect` or `python -m flows` line added outside a marked block is untested
    (unless it says it needs the cluster: a Kubernetes worker)."""
    for doc in DOCS:
        text = doc.read_text()
        tested = "".join(marked_blocks(doc))
        loose = [line for m in FENCE.finditer(text) for line in m.group(1).splitlines()
                 if re.match(r"(prefect|python -m flows)\b", line) and line not in tested
                 and "needs the cluster" not in line]
        assert not loose, f"{doc.relative_to(ROOT)}: untested commands {loose}"


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A fresh server and a client environment of its own (PATH: this venv's prefect)."""
    home = tmp_path_factory.mktemp("prefect") / "server"
    running = stack.start_server(free_port(), home)
    env = stack.server_env(tmp_path_factory.mktemp("client"), str(running["api_url"]))
    env |= {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
            "PREFECT_CLI_PROMPT": "false",  # a script, not a terminal: no questions asked
            # a webhook nothing calls: the alerts only fire on a failed or stuck run
            "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/rcpipe-test"}
    try:
        yield env
    finally:
        stack.down(home, quiet=True)


def _client(env: dict[str, str]) -> Any:
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}), \
            get_client(sync_client=True) as client:
        pool = client.read_work_pool(POOL)
        deployments = {f"{d.name}": d for d in client.read_deployments()}
        runs = client.read_flow_runs()
        automations = client.read_automations()
    return pool, deployments, runs, automations


@pytest.mark.integration
@pytest.mark.slow
def test_the_documented_prefect_steps_deploy_on_a_fresh_server(
        bare_server: dict[str, str]) -> None:
    for doc in DOCS:
        blocks = marked_blocks(doc)
        assert blocks, f"{doc}: no {MARK} block"
        for block in blocks:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT,
                                  env=bare_server, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, f"{doc.name}:\n{block}\n{done.stdout[-2000:]}" \
                                         f"{done.stderr[-3000:]}"
    pool, deployments, runs, automations = _client(bare_server)
    template = json.loads((ROOT / "infra/prefect/base-job-template.json").read_text())
    assert pool.type == "kubernetes"
    assert pool.base_job_template == template

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    in_pool = [d for d in spec if d["work_pool"]["name"] == POOL]
    assert {d["name"] for d in in_pool} == {"nightly", "cluster"}
    for want in in_pool:
        got = deployments[want["name"]]
        assert got.work_pool_name == POOL
        crons = [(s.schedule.cron, s.schedule.timezone) for s in got.schedules]
        assert crons == [(s["cron"], s["timezone"]) for s in want.get("schedules", [])]
        assert got.parameters == want["parameters"]
    assert "local" not in deployments  # the laptop's pool was never created here
    assert [r.deployment_id for r in runs] == [deployments["nightly"].id]
    assert len([a for a in automations if a.name.startswith("train-all/nightly")]) == 2
