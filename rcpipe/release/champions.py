"""The champion record's mirror in git: GTO's stage assignments (`gto`).

The registry is the champion record on the DVC remote (release/record.py); a promotion
(promotion.py's ``champion_gate``) is mirrored here, where the night ran in a git
checkout, by assigning the stage ``champion`` of the artifact ``rcpipe`` to the night's
commit: GTO writes two annotated tags that never move, ``rcpipe@v0.0.N`` (the version) and
``rcpipe#champion#M`` (the assignment, M counting every promotion), the latter's message
saying which night made this champion and why the gate let it through. A clone fetches the
new tags (nothing is moved or forced), and ``gto show rcpipe#champion --ref`` names the
newest assignment's version on any clone, no rcpipe needed. A rollback or a champion set by
hand (stages/registry.py) changes the record only; `rcpipe champion` says when a clone's
tags name another champion than the record.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rcpipe import reads
from rcpipe.errors import InputError
from rcpipe.release.remote import git, identity

ARTIFACT, STAGE = "rcpipe", "champion"
GATE = "gate: "  # the message's last line: the decision's numbers, as JSON
VERSION_TAG = re.compile(rf"{ARTIFACT}@v\d+\.\d+\.\d+")  # GTO's version tags


def crown(root: Path, commit: str, run: str, decided: dict[str, Any],
          remote: str | None) -> list[str]:
    """Assign ``champion`` to ``commit`` (the night ``run``; ``decided``: gate_record's
    decision); the GTO tags on ``commit``, to push. The remote's tags are fetched first, so
    the numbering goes on from every earlier promotion (a clash is refused by the push,
    never forced)."""
    from gto.api import assign

    if remote and git(root, "remote", "get-url", remote).returncode == 0:
        git(root, "fetch", "-q", "--tags", remote)
    name, email = identity(root)
    assign(str(root), ARTIFACT, STAGE, ref=commit, message=message(run, decided),
           author=name, author_email=email)
    return tags_on(root, commit)


def tags_on(root: Path, commit: str) -> list[str]:
    """The registry's tags on ``commit`` (its version, its assignments)."""
    listed = git(root, "tag", "--points-at", commit, "-l", f"{ARTIFACT}@*", f"{ARTIFACT}#*")
    return listed.stdout.split()


def message(run: str, decided: dict[str, Any]) -> str:
    """The assignment tag's message: the night and model (its subject), the gate's reason,
    and its numbers as one JSON line."""
    cand, before = decided["candidate"], decided.get("champion")
    numbers = {"run": run, "model": cand["model"], "gate_f1": cand["f1"],
               "champion_before": before and before["run"], "diff": decided.get("diff"),
               "low": decided.get("low"), "high": decided.get("high"),
               "min_gain": decided.get("min_gain"),
               "gate_set": decided.get("set", {}).get("sha256")}
    return (f"night {run}: {cand['model']} is the champion\n\n{decided['reason']}\n\n"
            f"{GATE}{json.dumps(numbers, sort_keys=True)}")


def history(root: Path) -> list[dict[str, Any]]:
    """Every promotion the clone's tags record, newest first: the assignment tag, the
    version, the commit, when, the night, the model and the gate's reason and numbers."""
    fields = ["%(refname:strip=2)", "%(*objectname)", "%(taggerdate:iso-strict)",
              "%(contents)"]
    out = git(root, "for-each-ref", f"refs/tags/{ARTIFACT}#{STAGE}#*",
              "--format=" + "%00".join(fields) + "%00%1e").stdout
    versions = {}
    for line in git(root, "for-each-ref", f"refs/tags/{ARTIFACT}@*",
                    "--format=%(*objectname) %(refname:strip=2)").stdout.splitlines():
        commit, _, tag = line.partition(" ")
        versions[commit] = tag
    found = []
    for entry in filter(str.strip, out.split("\x1e")):
        tag, commit, when, text = entry.strip("\n").split("\x00")[:4]
        number = re.fullmatch(rf"{re.escape(ARTIFACT)}#{STAGE}#(\d+)", tag)
        if not number:
            continue
        paragraphs = text.strip().split("\n\n")
        try:  # a tag someone wrote by hand may lack the numbers
            gate = reads.parse_json(paragraphs[-1].removeprefix(GATE), tag)
        except (InputError, ValueError):
            gate = {}
        found.append({"tag": tag, "number": int(number.group(1)),
                      "version": versions.get(commit), "commit": commit, "at": when,
                      "subject": paragraphs[0], "reason": " ".join(paragraphs[1:-1]),
                      "gate": gate})
    return sorted(found, key=lambda p: -p["number"])
