"""A night's promotion: the champion gate of a run `rcpipe version --promote` versioned, and
its compare-and-swap of the champion record.

The run's models (its packages; its ensemble as `rcpipe ensemble` made it) and the champion
answer the gate set (gate.py); the run's best there is its candidate, and rules.decide moves
the champion only when the paired interval of the candidate's F1 minus the champion's lies
above ``version.min_gain``. A promotion's entry (record.entry_of, through ``pointer``) is
swapped in only if champion.json is still the one judged against (record.append): a night
that lost the race to another's promotion reads the record again and judges again against
the new champion, at most ``RACES`` times; the night's record (nights.keep) is written
before each swap, so champion.json never names a night the remote has no record of. GTO's
tags (champions.crown) follow a promotion, a mirror of the record.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rcpipe.config import VARIANTS, Config
from rcpipe.errors import InputError
from rcpipe.inference.combination import Combination
from rcpipe.release import record as champion_record
from rcpipe.release.champions import crown
from rcpipe.release.gate import Gate, answers, champion_answers, gate_f1, store_answers
from rcpipe.release.nights import keep
from rcpipe.release.remote import Remote
from rcpipe.release.rules import (
    Decision,
    Score,
    decide,
    dev_score,
    gate_record,
    not_compared,
    pick_candidate,
)
from rcpipe.trained.package_dir import CONFIG, sha256

log = logging.getLogger(__name__)


def pointer(record: dict[str, Any], score: dict[str, Any], members: list[str],
            packages: dict[str, Path], answers_url: str | None, decided: dict[str, Any],
            ensemble: Combination | None = None) -> dict[str, Any]:
    """The champion fields (release/record.entry_of) of ``score``'s model of the night
    ``record`` describes (its dvc_lock, git_commit, pushed packages): ``members`` answer
    for it, each pinned by its local package's (``packages``) config.json sha256."""
    return champion_record.entry_of(
        score, {v: record["packages"][v] for v in members},
        {v: sha256((packages[v] / CONFIG).read_bytes()) for v in members if v in packages},
        ensemble=ensemble.as_dict() if ensemble is not None else None,
        dvc_lock=record["dvc_lock"], git_commit=record["git_commit"], answers=answers_url,
        gate=decided)


RACES = 5  # a promotion that loses this many compare-and-swaps in a row gives up


def champion_gate(root: Path, cfg: Config, where: Remote, gate: Gate,
                  record: dict[str, Any], scores: dict[str, dict[str, Any]],
                  packages: dict[str, Path], dev_sha256: str, min_gain: float, tmp: Path
                  ) -> dict[str, Any]:
    """The champion gate of the run ``record`` describes (its run, dvc_lock, git_commit and
    pushed packages): its models (``packages``, local; the ensemble when ``scores``, the
    dev metrics, hold one) and the champion answer ``gate``; the candidate, the decision
    and its interval, and on a promotion the champion record's new entry (release/record.py),
    swapped in only if the record is still the one judged against: a night that lost the
    race to another's promotion judges again against the new champion (``races``: each
    champion it lost to). GTO's tags follow a promotion, a mirror of the record."""
    from rcpipe.scoring.compare import paired_difference
    from rcpipe.trained.model_file import device_of

    run, device = record["run"], device_of(cfg)
    # the ensemble as `rcpipe ensemble` made it: its method, weights and threshold
    combination = Combination.of(scores["ensemble"]) if "ensemble" in scores else None
    found = answers(packages, gate, device, combination)
    f1 = gate_f1(gate, found)
    candidate = dev_score(scores, pick_candidate(f1), dev_sha256, run)
    answers_url = store_answers(where, run, gate, found)
    members = [v for v in VARIANTS if v in packages] if candidate.model == "ensemble" \
        else [candidate.model]
    races: list[dict[str, Any]] = []
    for _ in range(RACES):
        head = champion_record.read(where, cfg.limits)
        current = head.entry
        champion = Score.from_dict(current["score"]) if current else None
        if current is None or champion is None:  # the first night: nothing to beat
            decision = decide(candidate, None, None, gate.info, min_gain)
        else:
            theirs, why = champion_answers(where, current, champion, gate, tmp, device)
            decision = not_compared(candidate, champion, why) if theirs is None else decide(
                candidate, champion, paired_difference(gate.doc, theirs,
                                                       found[candidate.model]),
                gate.info, min_gain)
        decided = gate_record(decision, gate.info, f1, candidate, champion, min_gain)
        if not decision.promote:
            break
        entry = pointer(record, candidate.as_dict(), members, packages, answers_url, decided,
                        combination if candidate.model == "ensemble" else None)
        # the night's record before the swap: champion.json never names a night the remote
        # has no version.json of, a kill right after the swap included (the end rewrites it)
        keep(where, record | outcome(decision, candidate, decided, answers_url, champion,
                                     races, head.seq + 1))
        try:
            written = champion_record.append(where, head, entry, "promotion", decision.reason,
                                             f"the gate of night {run}", cfg.limits)
            break
        except champion_record.Changed:
            lost = champion_record.read(where, cfg.limits)
            races.append({"judged_against": head.names(), "lost_to": lost.names()})
            log.info(f"champion: another change came first ({head.names()} -> "
                     f"{lost.names()}); judging again against the new champion")
    else:
        raise InputError(head.url, "", f"the record changed {RACES} times while this night "
                         "was judged; run `rcpipe version --promote` again")
    tags: list[str] = []
    if decision.promote and record["git_commit"]:  # GTO's tags: the record's mirror in git
        tags = crown(root, record["git_commit"], run, decided, cfg.version.git_remote)
    log.info(f"champion: {'promoted' if decision.promote else 'kept'}: {decision.reason}")
    return outcome(decision, candidate, decided, answers_url, champion, races,
                   written["seq"] if decision.promote else None) | {"git_tags": tags}


def outcome(decision: Decision, candidate: Score, decided: dict[str, Any],
            answers_url: str | None, champion: Score | None, races: list[dict[str, Any]],
            seq: int | None) -> dict[str, Any]:
    """What the night's record says of its gate (``seq``: the champion entry it made)."""
    return {"promoted": decision.promote, "reason": decision.reason, "git_tags": [],
            "candidate": candidate.as_dict(), "gate": decided, "gate_answers": answers_url,
            "champion_before": champion.as_dict() if champion else None, "races": races,
            **({"champion_entry": seq} if decision.promote else {})}
