"""The champion record: ``<remote>/rcpipe/champion.json``, the one registry of which model
answers, and ``<remote>/rcpipe/champion-history/``, every change it ever took.

Each change (a night's promotion by the gate, `rcpipe champion set`, `rcpipe champion
rollback`) is an *entry*: the champion (its score, its packages and their sha256 pins, how an
ensemble combines its voters), what changed it (``change``: the kind, the night or person,
the reason, when, the entry it replaced) and its number ``seq`` (1, 2, ...; a record from
before numbering reads as 0). champion.json holds the newest entry;
``champion-history/<seq>.json`` each one, written once and never changed.

A change is a compare-and-swap of champion.json (Remote.write_if: S3's conditional PUT, a
directory remote's lock): read it with its version tag, judge, write only if it is still that
version. A writer that lost (``Changed``) reads again and judges against the new champion;
two nights promoting at once cannot both win. The head's history entry is written right
after its swap, and again by the next writer if that one died in between (the head holds the
whole entry), so the history misses none.

Every entry is checked as it is read (``check``): a record that is not an object, names no
package, or has no sha256 pin for what it names is one located line, never served unchecked
(fail closed); one over limits.record_kb is refused as its bytes arrive.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rcpipe import layout, reads
from rcpipe.config import ReadLimits
from rcpipe.errors import InputError
from rcpipe.inference.combination import Combination
from rcpipe.release.remote import Changed, Remote

HEAD = "champion.json"
HISTORY = "champion-history"
KINDS = ("promotion", "rollback", "set")
ENSEMBLE = layout.ENSEMBLE
_SHA256 = re.compile(r"[0-9a-f]{64}")
COMMIT = re.compile(r"[0-9a-f]{7,64}")  # a git commit id: what `--ref` hands to git checkout
# what a person writes into the record (--reason, --by): a few lines' worth, one line each,
# so every entry stays far below limits.record_kb and the listing shows what was written
WRITTEN_CHARS = {"reason": 2000, "by": 200}

__all__ = ["Changed", "Head", "append", "check", "entry_at", "entry_of", "history", "read"]


@dataclass(frozen=True)
class Head:
    """champion.json as read: its entry (checked; None when there is none yet), the version
    tag a swap must find, and where it is."""

    entry: dict[str, Any] | None
    tag: str | None
    url: str

    @property
    def seq(self) -> int:
        return int(self.entry.get("seq", 0)) if self.entry else 0

    def names(self) -> str:
        """The entry in a few words: "#3 (night 20261127T0100Z, bidaf)"."""
        return named(self.entry)


def named(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "no champion"
    score = entry["score"]
    return f"#{entry.get('seq', 0)} (night {score['run']}, {score['model']})"


def _pin(found: Any, source: str, where: str) -> str:
    if not isinstance(found, str) or not _SHA256.fullmatch(found):
        what = "missing" if found in (None, "") else f"{str(found)[:80]!r} is not a sha256"
        raise InputError(source, where, f"{what}: a champion is served only with the "
                         "sha256 of its package's config.json (fail closed)")
    return found


def check(entry: Any, source: str) -> dict[str, Any]:
    """``entry`` (a parsed champion.json or history entry), checked: an object naming its
    model (score.run, score.model) and what answers for it, each package pinned by a sha256;
    else one located InputError naming ``source`` and the field."""
    if not isinstance(entry, dict):
        raise InputError(source, "", f"expected a JSON object, found {type(entry).__name__}")
    seq = entry.get("seq", 0)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise InputError(source, "seq", "expected a whole number from 0")
    score = entry.get("score")
    if not isinstance(score, dict) or not all(
            isinstance(score.get(k), str) and score.get(k) for k in ("run", "model")):
        raise InputError(source, "score", "expected an object with the run and model")
    if score["model"] == ENSEMBLE:
        packages, pins = entry.get("packages"), entry.get("packages_sha256")
        if not isinstance(packages, dict) or not packages or not all(
                isinstance(u, str) and u for u in packages.values()):
            raise InputError(source, "packages", "expected voter -> its package's URL")
        try:
            how = Combination.parse(entry.get("ensemble"))
        except ValueError as e:
            raise InputError(source, "ensemble", str(e)) from None
        if not isinstance(pins, dict):
            pins = {}
        for v in how.voters(sorted(packages)):
            _pin(pins.get(v), source, f"packages_sha256.{v}")
    else:
        url = entry.get("package")
        if not isinstance(url, str) or not url:
            raise InputError(source, "package", "missing: the champion's package URL")
        _pin(entry.get("package_sha256"), source, "package_sha256")
    commit = entry.get("git_commit")
    if commit is not None and not (isinstance(commit, str) and COMMIT.fullmatch(commit)):
        raise InputError(source, "git_commit", f"{str(commit)[:80]!r} is not a git commit "
                         "id (7 to 64 hex digits)")
    change = entry.get("change")
    if change is not None and (not isinstance(change, dict) or change.get("kind") not in KINDS):
        raise InputError(source, "change.kind", f"expected one of {', '.join(KINDS)}")
    return entry


def entry_of(score: Mapping[str, Any], packages: Mapping[str, str],
             pins: Mapping[str, str], *, ensemble: Mapping[str, Any] | None,
             dvc_lock: str | None, git_commit: str | None, answers: str | None,
             gate: Mapping[str, Any] | None) -> dict[str, Any]:
    """The champion fields of an entry, built in this one place for the gate's promotion
    (release/promotion.py) and `rcpipe champion set` (stages/registry.py); ``append`` adds
    its number and change. ``packages``: what answers for ``score``'s model (its package,
    or an ensemble's voters), ``pins``: each one's config.json sha256, which pins every
    other file of it (the champion app checks both); ``ensemble``: how an ensemble's
    voters are combined (Combination.as_dict); ``answers``: its gate answers' URL."""
    model = score["model"]
    own = model != ENSEMBLE  # an ensemble has no package of its own
    return {"score": dict(score), "dvc_lock": dvc_lock, "git_commit": git_commit,
            "package": packages[model] if own else None,
            "package_sha256": pins.get(model) if own else None,
            "packages": dict(packages), "packages_sha256": dict(pins),
            # no "ensemble" key: how a promotion from before it reads (the vote)
            **({} if own or ensemble is None else {"ensemble": dict(ensemble)}),
            "answers": answers, "gate": None if gate is None else dict(gate)}


def written(field: str, text: str) -> str:
    """``text`` for the record's ``change.<field>`` (reason, by), else one line: printable
    (a newline would forge a line of `rcpipe champion`'s listing) and within its cap."""
    cap = WRITTEN_CHARS[field]
    if len(text) > cap:
        raise InputError(f"--{field}", f"{len(text)} characters",
                         f"over {cap}: the record keeps a short {field}")
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise InputError(f"--{field}", f"character {text.index(bad)}",
                         f"{bad!r} is a control character: the record keeps one line")
    return text


def read(where: Remote, limits: ReadLimits) -> Head:
    """champion.json, read within limits.record_kb and checked, with its version tag."""
    data, tag = where.read_tagged(limits.record_bytes(), HEAD)
    url = where._where(HEAD)[1]
    if data is None:
        return Head(None, None, url)
    try:
        found = reads.parse_json(data, url, limits.depth)
    except ValueError:
        raise InputError(url, "", "not valid JSON") from None
    return Head(check(found, url), tag, url)


def append(where: Remote, seen: Head, champion: Mapping[str, Any], kind: str, reason: str,
           by: str, limits: ReadLimits) -> dict[str, Any]:
    """Make ``champion`` (pointer fields: score, packages, pins...) the new head, if
    champion.json is still ``seen``: the entry written (seq ``seen.seq + 1``, its change
    and the entry it replaced), then its history entry. Raises Changed when another writer
    came first (nothing written: read again and judge again)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}")
    reason, by = written("reason", reason), written("by", by)
    if seen.entry is not None:
        _keep(where, seen.entry, limits)  # the head's own, if its writer died before it
    before = seen.entry
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # champion.json deleted by hand: the numbering goes on after the history's last entry
    seq = seen.seq + 1 if before is not None else _last(where) + 1
    entry = {**champion, "seq": seq,
             "change": {"kind": kind, "reason": reason, "by": by, "at": at,
                        "before": None if before is None else {
                            "seq": before.get("seq", 0), "run": before["score"]["run"],
                            "model": before["score"]["model"]}}}
    check(entry, "the new champion entry")  # never write what a reader would refuse
    data = json.dumps(entry, indent=1).encode()
    if len(data) > limits.record_bytes():  # nor what it could not read back
        raise InputError(seen.url, "", f"the new entry is {len(data) / 1024:.0f} KB, over "
                         f"limits.record_kb ({limits.record_kb:g} KB): nothing written")
    try:
        where.write_if(data, seen.tag, HEAD)
    except Changed:
        # a PUT applied whose answer was lost is sent again and finds its own write there:
        # that is this change, made, not another writer's
        if read(where, limits).entry != entry:
            raise
    _keep(where, entry, limits)
    return entry


def _keep(where: Remote, entry: Mapping[str, Any], limits: ReadLimits) -> None:
    """``entry``'s history entry, written once (create-only; one already there is kept)."""
    seq = int(entry.get("seq", 0))
    if seq == 0:  # a record from before numbering: the history starts after it
        return
    try:
        where.write_if(json.dumps(entry, indent=1).encode(), None, HISTORY, f"{seq:08d}.json")
    except Changed:
        pass


def _numbers(where: Remote) -> list[int]:
    return [int(n[:8]) for n in where.list(HISTORY) if re.fullmatch(r"\d{8}\.json", n)]


def _last(where: Remote) -> int:
    return max(_numbers(where), default=0)


def history(where: Remote, limits: ReadLimits) -> list[dict[str, Any]]:
    """Every entry of the history, oldest first, each checked."""
    return [entry_at(where, seq, limits) for seq in sorted(_numbers(where))]


def entry_at(where: Remote, seq: int, limits: ReadLimits) -> dict[str, Any]:
    """The history's entry ``seq``, checked; one line when it is not there."""
    data, _ = where.read_tagged(limits.record_bytes(), HISTORY, f"{seq:08d}.json")
    url = where._where(HISTORY, f"{seq:08d}.json")[1]
    if data is None:
        raise InputError(url, "", f"no history entry #{seq} on the remote")
    try:
        found = check(reads.parse_json(data, url, limits.depth), url)
    except ValueError:
        raise InputError(url, "", "not valid JSON") from None
    if found.get("seq") != seq:
        raise InputError(url, "seq", f"{found.get('seq')!r}, not its name's {seq}")
    return found
