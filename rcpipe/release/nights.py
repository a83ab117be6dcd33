"""A versioned night where people look: its report and the nights page on the DVC remote,
and its git commit on the workspace's git remote.

`rcpipe version` (and the nightly flow's version step) calls these after the champion gate:

- ``keep``: the night's record, ``<remote>/rcpipe/versions/<run>/version.json`` (written
  before a promotion's swap too, release/promotion.py), which ``earlier`` reads back;

- ``publish``: the run's report (every file `rcpipe report` wrote under reports/) goes to
  ``<remote>/rcpipe/versions/<run>/report/``, and beside it the nights page
  (``nights.html``, ``nights.png``, ``nights.csv``): each model's dev F1 over every night the
  remote holds a record of, the champion after each night marked, and each night's training
  cost (the record's ``cost``); the latest page is also
  ``<remote>/rcpipe/nights.html``. Links are presigned HTTPS URLs where the remote signs
  (S3, a week), else the remote's own URL: never a path inside the pod that ran the night.
- ``push_commit``: the night's dvc.lock commit and a promotion's registry tags
  (release/champions.py) to the git remote
  ``version.git_remote`` when the workspace has it, so `dvc metrics diff` and `dvc exp show`
  compare nights on any clone (`git fetch`, `dvc pull`). The cluster's nightly runs without
  git (the image's ``core.no_scm``): its nights are compared on the nights page alone.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, StrictFloat, StrictStr, ValidationError

from rcpipe import layout
from rcpipe.config.load import located
from rcpipe.errors import InputError
from rcpipe.release.remote import git

if TYPE_CHECKING:
    from rcpipe.release.remote import Remote

log = logging.getLogger(__name__)
LINK_SECONDS = 7 * 24 * 3600  # a presigned link lasts a week: until the next weekly look


def publish(where: Remote, record: dict[str, Any], before: list[dict[str, Any]]
            ) -> dict[str, Any]:
    """The night's report and the nights page (``before``: the earlier nights' records,
    ``earlier``) on the remote; their URLs and links."""
    from rcpipe.render import pages, plots, tables

    run = record["run"]
    sent = {}
    if layout.REPORTS.is_dir():
        for file in sorted(p for p in layout.REPORTS.rglob("*") if p.is_file()):
            name = file.relative_to(layout.REPORTS).as_posix()
            sent[name] = where.write(file.read_bytes(), "versions", run, "report", name)
    records = before + [record]
    rows = tables.night_rows(records)
    models = sorted({k for r in rows for k in r} - {"night", "promoted", "champion",
                                                    "gate gain"},
                    key=lambda m: (m == "ensemble", m))
    report_link = where.link(LINK_SECONDS, "versions", run, "report", layout.REPORT_PAGE) \
        if layout.REPORT_PAGE in sent else None
    png = plots.nights_png(rows, models)
    html = pages.nights_html(rows, models, png, report_link,
                             tables.night_costs(records)).encode()
    out = {"report": sent.get(layout.REPORT_PAGE), "report_link": report_link}
    table = _csv(rows, ["night", "promoted", "gate gain", "champion", *models])
    for parts in ((), ("versions", run, "report")):  # the latest, and this night's
        out["nights"] = where.write(html, *parts, "nights.html")
        where.write(png, *parts, "nights.png")
        where.write(table, *parts, "nights.csv")
    out["nights_link"] = where.link(LINK_SECONDS, "versions", run, "report", "nights.html")
    log.info(f"version {run}: report and nights page ({len(rows)} night(s)) -> "
             f"{out['nights']}")
    return out


Number = StrictFloat  # an int too; never a string or a bool


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # a record keeps fields these pages never read


class _Score(_Open):
    f1: Number
    em: Number


class _Cost(_Open):
    run: StrictStr | None = None
    wall_s: Number
    hours: Number
    unit: StrictStr


class _Gate(_Open):
    diff: Number | None = None
    low: Number | None = None
    high: Number | None = None


class _Night(_Open):
    """What the nights page and `rcpipe champion set` read of a night's version.json."""

    run: StrictStr
    scores: dict[str, _Score]
    cost: dict[str, _Cost] | None = None
    gate: _Gate | None = None
    candidate: dict[str, Any] | None = None
    packages: dict[str, StrictStr] | None = None
    packages_sha256: dict[str, StrictStr] | None = None


def keep(where: Remote, record: dict[str, Any]) -> str:
    """The night's record, ``versions/<run>/version.json`` on the remote; its URL."""
    return where.write(json.dumps(record, indent=1).encode(), "versions", record["run"],
                       "version.json")


def check_night(found: Any, url: str) -> dict[str, Any]:
    """A night's version.json, parsed, checked as its readers use it; else one located
    InputError (``scores.bidaf.f1: Input should be a valid number``)."""
    try:
        _Night.model_validate(found)
    except ValidationError as e:
        raise InputError(url, *located(e)) from None
    return found


def earlier(where: Remote, run: str) -> list[dict[str, Any]]:
    """Every earlier night's record on the remote, oldest first (run names start with the
    time), each checked; one that cannot be read or is malformed is left out, and said in
    one line naming its file (`rcpipe version` reads them before it commits anything)."""
    found = []
    for name in where.list("versions"):
        if name == run:
            continue
        try:
            record = where.read_json("versions", name, "version.json")
            if record is not None:
                found.append(check_night(record, where._where("versions", name,
                                                              "version.json")[1]))
        except InputError as e:  # one bad record must not hide the others
            log.warning(f"nights: left out: {e.line().removeprefix('error: ')}")
    return sorted(found, key=lambda r: r["run"])


def _csv(rows: list[dict[str, Any]], header: list[str]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def push_commit(root: Path, remote: str | None, commit: str | None, tags: list[str]
                ) -> dict[str, Any]:
    """Push the night's commit (HEAD's branch) and, when promoted, the registry's tags
    (release/champions.py: new tags, never forced, so a clone fetches them)."""
    if remote is None or commit is None:
        return {"pushed": False, "why": "no git remote set" if commit else "no git commit"}
    if git(root, "remote", "get-url", remote).returncode != 0:
        log.info(f"version: the workspace has no git remote {remote!r}: the night's commit "
                 "stays here (version.git_remote)")
        return {"pushed": False, "why": f"no git remote {remote!r}"}
    refs = ["HEAD"] + [f"refs/tags/{t}" for t in tags]
    done = git(root, "push", "-q", remote, *refs)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["git push failed"])[-1][:300]
        log.warning(f"version: git push to {remote} failed ({why}); the night is on the DVC "
                    "remote, its commit only here")
        return {"pushed": False, "why": why}
    return {"pushed": True, "remote": remote, "commit": commit}

