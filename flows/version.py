"""The train-all flow's last step with ``version=True``: one task over rcpipe.stages.version.

It commits the run's DVC state, pushes data and models to the DVC remote and runs the
champion gate (see rcpipe/stages/version.py and release/promotion.py); the decision, with the paired
interval it rests on and the gate set it was measured on, becomes a Prefect artifact, so a
scheduled run says why it kept or replaced the champion.
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
        markdown=decision_markdown(record))
    return record


def _f1(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def decision_markdown(record: dict[str, Any]) -> str:
    """The version and the gate's decision: candidate and champion F1 on the gate set, the
    difference with its interval, the gate set and its sha256."""
    gate = record["gate"]
    verdict = "promoted" if record["promoted"] else "kept the champion"
    lines = [f"# Version {record['run']}", "", f"**{verdict}**: {record['reason']}", ""]
    if record.get("report_link") or record.get("nights_link"):
        lines += [" · ".join(f"[{name}]({record[key]})" for name, key in
                             (("this night's report", "report_link"),
                              ("night after night", "nights_link")) if record.get(key)), ""]
    lines += ["| model | dev EM | dev F1 |", "|---|---|---|"]
    lines += [f"| {m} | {s['em']:.2f} | {s['f1']:.2f} |"
              for m, s in record.get("scores", {}).items()]
    lines += [""]
    rows = [("candidate", gate["candidate"])] + \
        ([("champion", gate["champion"])] if gate["champion"] else [])
    lines += ["| | model | run | gate F1 |", "|---|---|---|---|"]
    lines += [f"| {who} | {m['model']} | {m['run']} | {_f1(m['f1'])} |" for who, m in rows]
    if gate["diff"] is not None:
        lines += ["", f"candidate - champion: **{gate['diff']:+.2f} F1** "
                      f"[{gate['low']:+.2f}, {gate['high']:+.2f}] ({gate['level']:.0%}, "
                      f"paragraph bootstrap); promoted only when the lower end is above "
                      f"min_gain {gate['min_gain']:.2f}"]
    s = gate["set"]
    lines += ["", f"- gate set: {s['source']} `{s['uri']}` ({gate['questions']} questions, "
                  f"{gate['paragraphs']} paragraphs), sha256 `{s['sha256']}`",
              f"- dvc.lock: `{record['dvc_lock']}`",
              f"- git commit: `{record['git_commit'] or '(no git checkout)'}`",
              f"- record: `{record.get('record', '')}`", ""]
    return "\n".join(lines)
