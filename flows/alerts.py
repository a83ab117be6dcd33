"""The nightly's alerts: two Prefect automations on train-all/nightly, each sending a
notification block's message, one when a run fails, crashes, times out or is cancelled,
one when a run is still running after N hours (stuck, or a pod that died without a word:
Prefect then keeps its run Running for ever).

Applied once after `prefect deploy`, and again whenever the deployment is re-created
(infra/README.md, step 5); applying twice replaces, never doubles:

    python -m flows.alerts [--block slack-webhook/rcpipe-alerts] [--hours 20]
        [--deployment train-all/nightly]

Why a module, not prefect.yaml: a deployment's `triggers:` become automations whose one
action is to run that deployment again (prefect.events.schemas.automations.Trigger.actions,
RunDeployment), so they cannot notify anyone; and `prefect deploy` deletes every automation
the deployment owns on each deploy (prefect.cli.deploy._triggers._create_deployment_triggers),
so these own nothing and are found again by name. Why not an SLA: `prefect deploy` applies
SLAs on Prefect Cloud only, and the nightly may report to a self-hosted server.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TYPE_CHECKING
from uuid import UUID

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.events.schemas.automations import AutomationCore

DEPLOYMENT = "train-all/nightly"  # prefect.yaml: the flow's name / the deployment's name
BLOCK = "slack-webhook/rcpipe-alerts"  # <block type slug>/<block name>, as `prefect block` names it
# the cron fires daily at 02:00 and cancels a new run while one is going (prefect.yaml,
# CANCEL_NEW): past 20 h someone still has time to act before the next one is lost
STUCK_AFTER_HOURS = 20.0

# A flow run's state-change event is named after the state's *name*, not its type
# (prefect.server.models.events.flow_run_state_change_event), and a flow that passes its
# timeout ends Failed under the name TimedOut (prefect.flow_engine, handle_timeout).
FAILED = ("prefect.flow-run.Failed", "prefect.flow-run.Crashed",
          "prefect.flow-run.Cancelled", "prefect.flow-run.TimedOut")
FINISHED = ("prefect.flow-run.Completed", *FAILED)

FAILED_BODY = """\
{{ flow.name }}/{{ deployment.name }}: flow run {{ flow_run.name }} ended \
{{ flow_run.state.name }} at {{ flow_run.state.timestamp }}.
State message: {{ flow_run.state.message }}
{{ flow_run|ui_url or '' }}"""
STUCK_BODY = """\
{{ flow.name }}/{{ deployment.name }}: flow run {{ flow_run.name }} has been running \
since {{ flow_run.start_time }} and is still {{ flow_run.state.name }}.
{{ flow_run|ui_url or '' }}"""


def names(deployment: str) -> tuple[str, str]:
    """The two automations' names: stable, so that applying again finds and replaces them."""
    return f"{deployment}: failed, crashed or cancelled", f"{deployment}: still running"


def nightly_alerts(deployment: str, deployment_id: UUID, block_document_id: UUID,
                   stuck_after: timedelta) -> list[AutomationCore]:
    """The automations, as Prefect's own models: a reactive trigger on the runs' failure
    events and a proactive one expecting a finish within ``stuck_after`` of Running, both
    scoped to the deployment's runs, both notifying through the block."""
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    runs = {"prefect.resource.id": "prefect.flow-run.*"}
    # a flow run's event names its deployment as a related resource (role "deployment")
    of_deployment = {"prefect.resource.id": f"prefect.deployment.{deployment_id}",
                     "prefect.resource.role": "deployment"}
    failed, stuck = names(deployment)
    hours = stuck_after.total_seconds() / 3600
    return [
        AutomationCore(
            name=failed,
            description=f"A run of {deployment} ended Failed, Crashed, TimedOut or Cancelled.",
            trigger=EventTrigger(match=runs, match_related=of_deployment,
                                 expect=set(FAILED), posture=Posture.Reactive, threshold=1,
                                 within=timedelta(0)),
            actions=[SendNotification(
                block_document_id=block_document_id, body=FAILED_BODY,
                subject=f"{deployment}: {{{{ flow_run.name }}}} {{{{ flow_run.state.name }}}}")],
        ),
        AutomationCore(
            name=stuck,
            description=f"A run of {deployment} still running {hours:g} h after it started.",
            # each run its own bucket (for_each): Running opens it, any finish closes it;
            # none within `stuck_after` fires
            trigger=EventTrigger(match=runs, match_related=of_deployment,
                                 after={"prefect.flow-run.Running"}, expect=set(FINISHED),
                                 for_each={"prefect.resource.id"}, posture=Posture.Proactive,
                                 threshold=1, within=stuck_after),
            actions=[SendNotification(
                block_document_id=block_document_id, body=STUCK_BODY,
                subject=f"{deployment}: {{{{ flow_run.name }}}} still running after "
                        f"{hours:g} h")],
        ),
    ]


def apply(client: SyncPrefectClient, deployment: str = DEPLOYMENT, block: str = BLOCK,
          stuck_after: timedelta = timedelta(hours=STUCK_AFTER_HOURS)) -> list[UUID]:
    """Create the automations on the client's server, replacing any of the same names;
    returns their ids. A missing deployment or block is one line naming what to do."""
    from prefect.exceptions import ObjectNotFound

    block_type, _, block_name = block.partition("/")
    try:
        deployment_id = client.read_deployment_by_name(deployment).id
    except ObjectNotFound:
        raise SystemExit(f"error: {deployment}: no such deployment on this server; "
                         "run `prefect deploy --all` first") from None
    try:
        block_id = client.read_block_document_by_name(block_name, block_type).id
    except ObjectNotFound:
        raise SystemExit(f"error: {block}: no such block on this server; create it first "
                         f"(infra/README.md: `prefect block create {block_type}`)") from None
    for name in names(deployment):
        for old in client.read_automations_by_name(name):
            client.delete_automation(old.id)
    return [client.create_automation(a)
            for a in nightly_alerts(deployment, deployment_id, block_id, stuck_after)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default=DEPLOYMENT, help="<flow>/<deployment>")
    ap.add_argument("--block", default=BLOCK,
                    help="the notification block, <block type slug>/<block name>")
    ap.add_argument("--hours", type=float, default=STUCK_AFTER_HOURS,
                    help="a run still running this long after it started is reported")
    args = ap.parse_args()
    from prefect import get_client

    with get_client(sync_client=True) as client:
        apply(client, args.deployment, args.block, timedelta(hours=args.hours))
    failed, stuck = names(args.deployment)
    print(f"alerts: {failed!r} and {stuck!r} ({args.hours:g} h) notify through {args.block}")


if __name__ == "__main__":
    main()
