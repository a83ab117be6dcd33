"""A variant's training runs, each keyed on what it is trained from (rcpipe/fingerprints.py).

A run's Ray Train storage is named after its fingerprint (``run-<12 hex>``) under the
variant's storage (models/<variant>/runs/, or <train.storage_path>/<variant>/), so two runs
never share checkpoints and the same inputs find their own run again (Ray Train resumes
it). ``models/<variant>/runs.json`` lists the runs, oldest first, with their fingerprints,
so the next command can say what changed and `prune` can keep the newest
``train.keep_runs``. A run's folder (models/<variant>/, a seed's) holds its summary.json
with its fingerprint: ``finished_in`` says whether it finished with given inputs (the train
stage then does nothing), ``why`` what a new or resumed run says it trains for.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rcpipe import layout, reads
from rcpipe.errors import InputError
from rcpipe.fingerprints import Fingerprint


def run_name(key: Fingerprint) -> str:
    return f"run-{key.digest[:12]}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Runs:
    """models/<variant>/runs.json: [{name, fingerprint, started, finished}], oldest first."""

    def __init__(self, variant: str) -> None:
        self.path = layout.runs_record(variant)

    def all(self) -> list[dict[str, Any]]:
        try:
            found = reads.read_json(self.path).get("runs", [])
        except (InputError, AttributeError):
            return []  # none yet, or unreadable: runs are found again by name in the storage
        return [r for r in found if isinstance(r, dict) and isinstance(r.get("name"), str)]

    def get(self, name: str) -> dict[str, Any] | None:
        return next((r for r in self.all() if r["name"] == name), None)

    def latest(self) -> dict[str, Any] | None:
        found = self.all()
        return found[-1] if found else None

    def started(self, name: str, key: Fingerprint) -> None:
        """Record ``name`` as the newest run; a resumed run keeps its start time."""
        before = self.get(name)
        entry = {"name": name, "fingerprint": key.as_dict(),
                 "started": before["started"] if before else _now(), "finished": None}
        self._write([r for r in self.all() if r["name"] != name] + [entry])

    def finished(self, name: str) -> None:
        self._write([r | {"finished": _now()} if r["name"] == name else r
                     for r in self.all()])

    def drop(self, name: str) -> None:
        self._write([r for r in self.all() if r["name"] != name])

    def stale(self, keep: int, current: str) -> list[str]:
        """Runs beyond the newest ``keep`` (``current`` is always kept), oldest first."""
        others = [r["name"] for r in self.all() if r["name"] != current]
        return others[: max(0, len(others) - (keep - 1))]

    def _write(self, runs: list[dict[str, Any]]) -> None:
        layout.write_json(self.path, {"runs": runs})


def summary_in(folder: Path) -> dict[str, Any] | None:
    """summary.json of the model in ``folder`` (models/<variant>/, a seed's), or None."""
    path = folder / layout.SUMMARY
    if not path.is_file():
        return None
    try:
        summary = reads.read_json(path)
    except InputError:
        return None  # half a file from an older version's crash: trained anew
    return summary if isinstance(summary, dict) else None


def finished_in(folder: Path, key: Fingerprint) -> dict[str, Any] | None:
    """The summary in ``folder`` (models/<variant>/, a seed's) when its run finished
    training with ``key``'s inputs."""
    summary = summary_in(folder)
    if summary is None or not summary.get("finished"):
        return None
    kept = summary.get("fingerprint")
    same = isinstance(kept, dict) and Fingerprint.from_dict(kept).digest == key.digest
    return summary if same else None


def why(out: Path, key: Fingerprint, runs: Runs, name: str, force: bool) -> str:
    """The one line that says why the run ``name`` of ``key`` trains into ``out``: resumed,
    or anew and what changed."""
    if force:
        return f"--force: training anew ({name})"
    if (found := runs.get(name)) is not None and not found.get("finished"):
        return f"resuming {name}, whose inputs are these, from its latest checkpoint"
    summary = summary_in(out)
    if summary is not None and "fingerprint" not in summary:
        return f"the model in place was trained before runs were keyed on their inputs; " \
               f"training anew ({name})"
    before = summary or runs.latest()
    if before is None:
        return f"first run ({name})"
    what = key.changes(Fingerprint.from_dict(before["fingerprint"]))
    return f"{what or 'the last run did not finish'}; training anew ({name})"
