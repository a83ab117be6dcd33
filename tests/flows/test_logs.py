"""rcpipe's log lines reach the Prefect API (flows/logs.py): a flow run's logs, as the UI
shows them, hold the stages' lines under the task run that logged them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prefect import flow, task

from flows.logs import rcpipe_logs_to_prefect
from rcpipe import stages
from rcpipe.config import load_config
from tests.conftest import write_params
from tests.flows.conftest import flow_run_logs

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]


@task
def synth(params: str) -> None:
    stages.synth(load_config(Path(params)))


@flow
def synth_flow(params: str) -> None:
    with rcpipe_logs_to_prefect():  # as the train-all flow does
        synth(params)


def test_a_flow_runs_logs_hold_rcpipes_lines(tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml", data={
        "train_file": str(tmp_path / "train.json"), "dev_file": str(tmp_path / "dev.json")})
    state = synth_flow(str(params), return_state=True)
    assert state.is_completed()
    logs = flow_run_logs(state.state_details.flow_run_id)
    lines = [log for log in logs if log.name == "rcpipe.stages.data"]
    assert [log.message.split(":")[1].strip() for log in lines] == ["train", "dev"]
    assert all(log.level == logging.INFO and log.task_run_id is not None for log in lines)
    # only for the flow's length: afterwards nothing of rcpipe's goes to the API
    from prefect.logging.handlers import APILogHandler

    assert not any(isinstance(h, APILogHandler) for h in logging.getLogger("rcpipe").handlers)
