"""flows/alerts.py: the nightly's automations, read by Prefect's own models, then applied to
a real Prefect server (the session's, tests/flows/conftest.py) and set off by flow runs
whose states the server itself turns into events: a failure of each kind is reported, a
run left Running is reported as stuck, a completed run or another deployment's failure
is not."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
import yaml

from flows import alerts

REPO = Path(__file__).resolve().parents[2]


def server_trigger(automation: Any) -> Any:
    """The trigger as the server loads it (its own schema validates the templates too)."""
    from prefect.server.events.schemas.automations import AutomationCore

    return AutomationCore.model_validate(automation.model_dump(mode="json")).trigger


def state_event(name: str, deployment_id: UUID) -> Any:
    """A flow run's state-change event, shaped as prefect.server.models.events makes it."""
    from prefect.server.events.schemas.events import ReceivedEvent

    return ReceivedEvent(
        occurred=time.time(), event=f"prefect.flow-run.{name}", id=uuid4(),
        resource={"prefect.resource.id": f"prefect.flow-run.{uuid4()}",
                  "prefect.state-name": name},
        related=[{"prefect.resource.id": f"prefect.deployment.{deployment_id}",
                  "prefect.resource.role": "deployment"},
                 {"prefect.resource.id": f"prefect.flow.{uuid4()}",
                  "prefect.resource.role": "flow"}])


def test_the_nightly_is_named_as_prefect_yaml_deploys_it() -> None:
    from prefect.cli.deploy._models import PrefectYamlModel

    from flows.train_all import train_all

    flow, name = alerts.DEPLOYMENT.split("/")
    model = PrefectYamlModel.model_validate(yaml.safe_load((REPO / "prefect.yaml").read_text()))
    nightly = next(d for d in model.deployments if d.name == name)
    assert nightly.entrypoint == "flows/train_all.py:train_all" and train_all.name == flow
    assert nightly.triggers is None, "a deployment trigger could only re-run the nightly"


def test_failures_and_stuck_runs_through_prefects_models() -> None:
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import Posture

    nightly, other, block = uuid4(), uuid4(), uuid4()
    failed, stuck = alerts.nightly_alerts(alerts.DEPLOYMENT, nightly, block, timedelta(hours=7))
    assert (failed.name, stuck.name) == alerts.names(alerts.DEPLOYMENT)
    for automation in (failed, stuck):
        trigger = automation.trigger
        assert trigger.match_related.root == {
            "prefect.resource.id": f"prefect.deployment.{nightly}",
            "prefect.resource.role": "deployment"}
        assert trigger.match.root == {"prefect.resource.id": "prefect.flow-run.*"}
        (action,) = automation.actions
        assert isinstance(action, SendNotification) and action.block_document_id == block
        assert automation.owner_resource is None  # `prefect deploy` would delete it

    assert failed.trigger.posture == Posture.Reactive and failed.trigger.threshold == 1
    assert failed.trigger.expect >= {"prefect.flow-run.Failed", "prefect.flow-run.Crashed",
                                     "prefect.flow-run.Cancelled"}
    assert stuck.trigger.posture == Posture.Proactive
    assert stuck.trigger.within == timedelta(hours=7)
    assert stuck.trigger.after == {"prefect.flow-run.Running"}
    assert stuck.trigger.for_each == {"prefect.resource.id"}  # one bucket per run

    # the server's own matching, on events shaped as the server makes them
    on_failure, on_stuck = server_trigger(failed), server_trigger(stuck)
    for state in ("Failed", "Crashed", "Cancelled", "TimedOut"):
        assert on_failure.covers(state_event(state, nightly)), state
        assert not on_failure.covers(state_event(state, other)), state
        assert on_stuck.expects(f"prefect.flow-run.{state}"), state  # a finish, not stuck
    for state in ("Completed", "Running", "Pending", "Scheduled", "Cancelling"):
        assert not on_failure.covers(state_event(state, nightly)), state
    assert on_stuck.starts_after("prefect.flow-run.Running")
    assert on_stuck.expects("prefect.flow-run.Completed")
    assert not on_stuck.expects("prefect.flow-run.Running")
    assert on_stuck.meets_threshold(0) and not on_stuck.meets_threshold(1)


class Webhook(BaseHTTPRequestHandler):
    """Collects what a custom-webhook notification block posts."""

    received: queue.Queue[dict[str, str]]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.received.put(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, queue.Queue[dict[str, str]]]]:
    received: queue.Queue[dict[str, str]] = queue.Queue()
    handler = type("Handler", (Webhook,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", received
    finally:
        server.shutdown()


def run_through(client: Any, deployment_id: UUID, *states: Any) -> str:
    """A flow run of the deployment taken through ``states``; returns its name."""
    run = client.create_flow_run_from_deployment(deployment_id)
    for state in states:
        client.set_flow_run_state(run.id, state, force=True)
    return run.name


@pytest.mark.integration
def test_applied_alerts_fire_on_a_real_server(
        prefect_api: None, webhook: tuple[str, queue.Queue[dict[str, str]]],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from prefect import get_client
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.states import Cancelled, Completed, Crashed, Failed, Running

    url, received = webhook
    notes: list[dict[str, str]] = []

    def until(told: Callable[[], bool], what: str, at_least: float = 0.0) -> None:
        """Collect the notifications until ``told()`` (90 s at most; the proactive check
        runs every 5 s after its 30 s) and ``at_least`` seconds have passed."""
        start = time.monotonic()
        while not told() or time.monotonic() < start + at_least:
            assert time.monotonic() < start + 90, f"no {what}: only {notes}"
            try:
                notes.append(received.get(timeout=0.5))
            except queue.Empty:
                pass

    def told_of(run: str) -> Callable[[], bool]:
        return lambda: any(f" {run} " in n["subject"] for n in notes)

    CustomWebhookNotificationBlock(
        name="rcpipe-test", url=url, json_data={"subject": "{{subject}}", "body": "{{body}}"},
    ).save("rcpipe-alerts-test", overwrite=True)
    block = "custom-webhook/rcpipe-alerts-test"
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("train-all")
        nightly = client.create_deployment(flow_id, "nightly")
        local = client.create_deployment(flow_id, "local")
        with pytest.raises(SystemExit, match="no such block"):
            alerts.apply(client, alerts.DEPLOYMENT, "slack-webhook/nowhere")
        with pytest.raises(SystemExit, match="no such deployment"):
            alerts.apply(client, "train-all/nowhere", block)
        # the command first (the default 20 h), then again: replaced, not doubled
        monkeypatch.setattr("sys.argv", ["flows.alerts", "--block", block])
        alerts.main()
        assert f"notify through {block}" in capsys.readouterr().out
        # stuck after 30 s: with 10 s, a busy machine's server once took the completed run's
        # Completed event in over 10 s late and told that run as stuck (a clean-clone suite)
        ids = alerts.apply(client, alerts.DEPLOYMENT, block, timedelta(seconds=30))
        stored = [a for n in alerts.names(alerts.DEPLOYMENT)
                  for a in client.read_automations_by_name(n)]
        assert sorted(a.id for a in stored) == sorted(ids)
        assert [a.trigger.within for a in stored] == [timedelta(0), timedelta(seconds=30)]
        assert {a.actions[0].block_document_id for a in stored} == {
            client.read_block_document_by_name("rcpipe-alerts-test", "custom-webhook").id}

        # first: its 30 s run while the others are made
        stuck = run_through(client, nightly, Running())
        # the failures one after another, each told before the next, as nights fail: five
        # at once made the server's SQLite refuse a trigger's write ("database is locked")
        # four times within 0.1 s on a busy machine, and Prefect dropped that event
        failures = {}
        for state, kind in ((Failed(message="boom"), "Failed"), (Crashed(), "Crashed"),
                            (Cancelled(), "Cancelled"), (Failed(name="TimedOut"), "TimedOut")):
            run = run_through(client, nightly, Running(), state)
            failures[run] = kind
            until(told_of(run), f"notification of {run} {kind}")
        completed = run_through(client, nightly, Running(), Completed())
        elsewhere = run_through(client, local, Running(), Failed())

    # the stuck run told, and 5 s for anything that would wrongly follow the last two runs
    until(lambda: any(f" {stuck} " in n["subject"] and "still running" in n["subject"]
                      for n in notes), "stuck run's notification", at_least=5.0)

    # Prefect's in-process messaging is at-least-once: a trigger that hits "database is
    # locked" on a busy SQLite is redelivered, so a run may be told twice, never two ways
    reported = {n["subject"].split(": ")[1].split()[0]: n for n in notes}
    assert all(n == reported[n["subject"].split(": ")[1].split()[0]] for n in notes), \
        "a run reported in two different ways"
    assert set(reported) == {*failures, stuck}, (completed, elsewhere, notes)
    for run, state in failures.items():
        assert f"{run} {state}" in reported[run]["subject"]
        assert f"train-all/nightly: flow run {run} ended {state}" in reported[run]["body"]
    assert "still running after" in reported[stuck]["subject"]
    assert f"flow run {stuck} has been running" in reported[stuck]["body"]
