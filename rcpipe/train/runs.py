"""A variant's training runs, each keyed on what it is trained from (rcpipe/fingerprints.py).

A run's Ray Train storage is named after its fingerprint (``run-<12 hex>``) under the
variant's storage (models/<variant>/runs/, or <train.storage_path>/<variant>/), so two runs
never share checkpoints and the same inputs find their own run again (Ray Train resumes
it). ``models/<variant>/runs.json`` lists the runs, oldest first, with their fingerprints,
so the next command can say what changed and `prune` can keep the newest
``train.keep_runs``.
"""

from __future__ import annotations

import time
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
