"""`rcpipe champion`: the champion record (release/record.py) shown, set by hand, rolled back.

``show`` reads the remote's record and history, newest first, and says where this clone's
GTO tags (release/champions.py, a mirror written by promotions where a git commit exists)
name another champion. ``set`` makes a versioned night's model the champion, ``rollback``
the champion before the current one (or entry ``--to``): both through the record's
compare-and-swap, both with a reason and who did it, both refused in one line when the
packages they name are not on the remote or their config.json no longer has the sha256
pinned when they were versioned.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

from rcpipe import layout
from rcpipe.config import VARIANTS, ReadLimits
from rcpipe.errors import InputError
from rcpipe.release import record
from rcpipe.release.nights import check_night
from rcpipe.release.remote import Remote, git, identity
from rcpipe.trained.package_dir import CONFIG, sha256

ENSEMBLE = layout.ENSEMBLE


def who(root: Path) -> str:
    """Who changes the record by hand: the checkout's git identity, else the login name."""
    if git(root, "rev-parse", "--is-inside-work-tree").returncode == 0:
        name, email = identity(root)
        if email != "rcpipe@localhost":
            return f"{name} <{email}>"
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def show(root: Path, remote: str | None, limits: ReadLimits) -> dict[str, Any]:
    """{"head": the record's entry or None, "history": every entry newest first,
    "tags": what this clone's GTO tags say, "disagree": a line when they name another
    champion than the record, else None}."""
    from rcpipe.release.champions import history as gto_history

    where = Remote(root, remote)
    head = record.read(where, limits)
    entries = list(reversed(record.history(where, limits)))
    tags = gto_history(root) if git(root, "rev-parse", "--git-dir").returncode == 0 else []
    disagree = None
    if tags and head.entry is not None:
        said = tags[0]["gate"].get("run")
        if said != head.entry["score"]["run"]:
            disagree = (f"this clone's GTO tags name night {said} ({tags[0]['tag']}); the "
                        f"record, the registry, names {head.names()}: `git fetch --tags`, "
                        "or the record changed by a rollback or set, which tags do not mirror")
    return {"head": head.entry, "history": entries, "tags": tags, "disagree": disagree}


def _pins(where: Remote, entry: dict[str, Any], limits: ReadLimits, what: str) -> None:
    """Every package ``entry`` names is on the remote with the config.json it pins."""
    urls = {entry["score"]["model"]: entry["package"]} if entry.get("package") \
        else dict(entry["packages"])
    pins = {entry["score"]["model"]: entry["package_sha256"]} if entry.get("package") \
        else entry.get("packages_sha256") or {}
    for name, url in sorted(urls.items()):
        if name not in pins:
            continue  # an ensemble's voter it weighs 0 (record.check pins every other)
        data, _ = where.read_tagged(limits.json_bytes(), *where._parts(url), CONFIG,
                                    key="limits.json_mb")
        if data is None:
            raise InputError(url, CONFIG, f"missing on the remote: {what} cannot be served")
        if sha256(data) != pins[name]:
            raise InputError(url, CONFIG, f"sha256 {sha256(data)[:12]} is not the pinned "
                             f"{pins[name][:12]}: the package changed since it was versioned")


def _night(where: Remote, run: str, limits: ReadLimits) -> dict[str, Any]:
    url = where._where("versions", run, "version.json")[1]  # refused if it leads out
    found = where.read_json("versions", run, "version.json", cap=limits.json_bytes())
    if found is None:
        raise InputError(url, "", f"no night {run} versioned on this remote")
    return check_night(found, url)


def entry_of_night(where: Remote, run: str, model: str | None, limits: ReadLimits
                   ) -> dict[str, Any]:
    """The champion fields (as the gate's promotion writes them, promotion.pointer) of the
    night ``run``'s ``model`` (default: the night's gate candidate, else its only
    package), from its versions/<run>/version.json."""
    night = _night(where, run, limits)
    source = where._where("versions", run, "version.json")[1]
    packages = night.get("packages") or {}
    pins = night.get("packages_sha256")
    candidate = night.get("candidate") or {}
    if model is None:
        model = candidate.get("model") or (next(iter(packages)) if len(packages) == 1
                                           else None)
        if model is None:
            raise InputError(source, "packages", "name the model: --model one of "
                             f"{', '.join([*packages, ENSEMBLE])}")
    voters = [v for v in VARIANTS if v in packages] if model == ENSEMBLE else [model]
    if not voters or any(v not in packages for v in voters):
        raise InputError(source, "packages", f"the night has no package of {model} "
                         f"(it has {', '.join(packages) or 'none'})")
    if not isinstance(pins, dict):
        raise InputError(source, "packages_sha256", "missing: the night was versioned "
                         "before packages were pinned; only its gate could promote it")
    if model == ENSEMBLE and not night.get("ensemble"):
        raise InputError(source, "ensemble", "missing: the night's ensemble was not "
                         "versioned (no ensemble stage that night)")
    scores = night.get("scores", {}).get(model) or {}
    score = {"model": model, "f1": scores.get("f1", 0.0), "em": scores.get("em", 0.0),
             "dev_sha256": candidate.get("dev_sha256", ""), "run": run}
    return record.entry_of(score, {v: packages[v] for v in voters},
                           {v: pins[v] for v in voters if v in pins},
                           ensemble=night.get("ensemble"), dvc_lock=night.get("dvc_lock"),
                           git_commit=night.get("git_commit"),
                           answers=night.get("gate_answers"), gate=None)


def _changed(where: Remote, head: record.Head, entry: dict[str, Any], kind: str,
             reason: str, by: str, limits: ReadLimits) -> dict[str, Any]:
    record.check(entry, f"the {kind}'s entry")
    _pins(where, entry, limits, f"night {entry['score']['run']}'s {entry['score']['model']}")
    try:
        return record.append(where, head, entry, kind, reason, by, limits)
    except record.Changed:
        now = record.read(where, limits)
        raise InputError(head.url, "", f"the record changed while this {kind} was made "
                         f"({head.names()} -> {now.names()}): look again and run it again"
                         ) from None


def set_champion(root: Path, remote: str | None, run: str, model: str | None, reason: str,
                 by: str, limits: ReadLimits) -> dict[str, Any]:
    """`rcpipe champion set`: the night ``run``'s model becomes the champion."""
    where = Remote(root, remote)
    head = record.read(where, limits)
    entry = entry_of_night(where, run, model, limits)
    return _changed(where, head, entry, "set", reason, by, limits)


def rollback(root: Path, remote: str | None, to: int | None, reason: str, by: str,
             limits: ReadLimits) -> dict[str, Any]:
    """`rcpipe champion rollback`: the entry before the current one (``to``: entry
    ``to`` of the history) answers again, as a new entry."""
    where = Remote(root, remote)
    head = record.read(where, limits)
    if head.entry is None:
        raise InputError(head.url, "", "no champion yet: nothing to roll back")
    before = (head.entry.get("change") or {}).get("before")
    seq = to if to is not None else (before or {}).get("seq")
    if not seq:
        raise InputError(head.url, "change.before", f"{head.names()} replaced no numbered "
                         "entry: name one with --to (see `rcpipe champion`)")
    if seq == head.seq:
        raise InputError(head.url, "seq", f"{head.names()} is already the champion")
    old = record.entry_at(where, seq, limits)
    entry = {k: v for k, v in old.items() if k not in ("seq", "change")}
    return _changed(where, head, entry, "rollback", reason or f"back to #{seq}", by, limits)


def ref(found: dict[str, Any]) -> str:
    """`rcpipe champion --ref`: the champion's GTO version tag on this clone, else its git
    commit; each checked, as it is handed to `git checkout` (a ``-f`` would be an option)."""
    from rcpipe.release.champions import VERSION_TAG

    head = found["head"]
    commit = head.get("git_commit")  # record.check: a commit id or None
    tag = next((t["version"] for t in found["tags"]
                if t["commit"] == commit and t["version"]), None)
    if tag is not None and not VERSION_TAG.fullmatch(tag):
        raise InputError("git tags", tag[:80], "not a GTO version tag (rcpipe@vX.Y.Z)")
    if not (tag or commit):
        raise InputError("champion.json", "git_commit", "the champion's night had no git "
                         "commit (a workspace without git)")
    return tag or commit


def shown(value: Any) -> str:
    """A record's text as one line of the listing: a control character written escaped
    (an entry written before `record.written` refused them cannot forge a line)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


def lines(found: dict[str, Any]) -> list[str]:
    """`rcpipe champion`'s text: the record's entries, newest first."""
    out = []
    head = found["head"]
    entries = found["history"] or ([head] if head else [])
    for e in entries:
        c, s = e.get("change") or {}, e["score"]
        mark = "*" if head and e.get("seq") == head.get("seq") else " "
        gate = e.get("gate") if c.get("kind", "promotion") == "promotion" else None
        gain = "" if not isinstance(gate, dict) or gate.get("low") is None else \
            f"  gain {gate['diff']:+.2f} F1 [{gate['low']:+.2f}, {gate['high']:+.2f}]"
        out.append(shown(f"{mark} #{e.get('seq', 0)}  {c.get('kind', 'promotion'):<9} night "
                         f"{s['run']}  {s['model']}  "
                         f"{c.get('at') or e.get('promoted_at', '')}  by {c.get('by', '?')}")
                   + gain)
        if c.get("reason"):
            out.append(f"      {shown(c['reason'])}")
    if found["disagree"]:
        out.append(f"note: {shown(found['disagree'])}")
    return out
