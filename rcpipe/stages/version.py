"""`rcpipe version` and the flow's versioning step: commit, push, the champion gate.

After a run in a DVC workspace (a checkout holding dvc.yaml, the run's outputs in place):
`dvc commit` records the stages the run produced in dvc.lock, git commits dvc.lock, `dvc
push` sends the data and models to the remote, and the run's record and dvc.lock go beside
the remote's objects (``<remote>/rcpipe/versions/<run>/``), with each evaluated variant's
`rcpipe package` (``versions/<run>/packages/<variant>/``), so even a run whose workspace
disappears (a pod) leaves a version anyone can `dvc pull` and models anyone can download.
With ``promote`` the champion gate follows (rcpipe/release/gate.py): the run's models and
the champion of ``<remote>/rcpipe/champion.json`` answer the same gate set (never the dev
set), the run's best there is its candidate, and rcpipe.release.rules.decide moves the
pointer (and assigns GTO's champion stage, release/champions.py) only when the paired
interval of the candidate's F1 minus the champion's lies above ``version.min_gain``; the
pointer names the winner's packages and the answers it gave, and the run's record holds the
decision with its interval. Last
(rcpipe/release/nights.py): the night's commit and tags go to the git remote
``version.git_remote`` when the workspace has one, and its report and the nights page (dev
F1 per model over every recorded night, the champion marked) to
``versions/<run>/report/``, with a presigned link the flow's artifact shows.

A failed push is retried with backoff (release/remote.py's ``push``). One versioning process
per workspace at a time (rcpipe.locks' lock helper); DVC's own lock is waited for too.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rcpipe import layout, reads
from rcpipe.config import VARIANTS, Config
from rcpipe.errors import InputError
from rcpipe.inference.combination import Combination
from rcpipe.locks import locked
from rcpipe.outputs import settle
from rcpipe.release import record as champion_record
from rcpipe.release.champions import crown
from rcpipe.release.gate import Gate, answers, champion_answers, gate_f1, gate_set, store_answers
from rcpipe.release.nights import earlier, publish, push_commit
from rcpipe.release.remote import Remote, dvc, git, identity, push
from rcpipe.release.rules import (
    Decision,
    Score,
    classify_failure,
    commit_targets,
    cost_of,
    decide,
    dev_score,
    gate_record,
    not_compared,
    pick_candidate,
    untracked_overrides,
)
from rcpipe.scoring.metrics import headline
from rcpipe.trained.package_dir import CONFIG, sha256

log = logging.getLogger(__name__)
LOCK = Path(".dvc/tmp/rcpipe-version.lock")  # one versioning process per workspace at a time
LOCK_WAIT = 3600.0  # seconds a second one waits for the first


def tracked_params(root: Path) -> dict[str, list[str]]:
    """stage address -> the params keys dvc.yaml lists for it (foreach resolved)."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return {stage.addressing: [k for d in stage.deps if isinstance(d, ParamsDependency)
                                   for k in d.params]
                for stage in repo.index.stages}


def _git_commit(root: Path, message: str) -> str | None:
    """Commit dvc.lock when the workspace is a git checkout; the commit (or HEAD) id."""
    if git(root, "rev-parse", "--is-inside-work-tree").returncode != 0:
        return None
    git(root, "add", "dvc.lock")
    if git(root, "diff", "--cached", "--quiet", "--", "dvc.lock").returncode != 0:
        name, email = identity(root)
        done = git(root, "-c", f"user.name={name}", "-c", f"user.email={email}", "commit",
                   "-q", "-m", message, "--", "dvc.lock")
        if done.returncode != 0:
            raise InputError(root / "dvc.lock", "git commit", done.stderr.strip()[:300])
    head = git(root, "rev-parse", "HEAD")
    return head.stdout.strip() if head.returncode == 0 else None


def _costs(targets: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each trained variant's training cost (release.rules.cost_of), from its summary."""
    found = {}
    for variant in (t.partition("@")[2] for t in targets if t.startswith("train@")):
        path = layout.summary_file(variant)
        if path.is_file():
            found[variant] = cost_of(reads.read_json(path))
    return found


def _scores(targets: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each model's metrics; the ensemble's with its methods (how it combines) beside."""
    models = [t.partition("@")[2] for t in targets if t.startswith("evaluate@")]
    models += ["ensemble"] if "ensemble" in targets else []
    found = {m: reads.read_json(layout.metrics(m)) for m in models}
    if "ensemble" in found and (methods := layout.methods("ensemble")).is_file():
        found["ensemble"] |= reads.read_json(methods)
    return found


def version(cfg: Config, variants: Sequence[str] | None = None, *,
            params: Path = Path("params.yaml"), overrides: Sequence[str] = (),
            remote: str | None = None, promote: bool = False, run: str | None = None,
            min_gain: float | None = None, tries: int = 3, backoff: float = 2.0
            ) -> dict[str, Any]:
    """Version the outputs of a run of ``variants`` (None: every variant dvc.yaml trains)
    in the current directory (see above); ``min_gain`` None: ``version.min_gain``."""
    import tempfile

    from rcpipe.stages.fetch import fetch
    from rcpipe.stages.report import report

    root = Path.cwd()
    if not (root / "dvc.yaml").is_file() or not (root / ".dvc").is_dir():
        raise InputError(root / "dvc.yaml", "", "not a DVC workspace (dvc.yaml and .dvc/ "
                                                "expected here)")
    if Path(params).resolve() != (root / "params.yaml").resolve():
        raise InputError(params, "", "dvc.yaml records params.yaml: only a run of "
                                     "params.yaml can be versioned")
    min_gain = cfg.version.min_gain if min_gain is None else min_gain
    if min_gain < 0:
        raise InputError("min_gain", f"{min_gain:g}", "below 0: a candidate must at least "
                                                     "beat the champion beyond chance")
    tracked = tracked_params(root)
    pipeline = [a.partition("@")[2] for a in tracked if a.startswith("train@")]
    variants = pipeline if variants is None else variants
    try:
        targets = commit_targets(variants, pipeline)
    except ValueError as e:
        raise InputError(root / "dvc.yaml", ",".join(variants), str(e)) from None
    run = run or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    with locked(root / LOCK, LOCK_WAIT, poll=0.2, late="another `rcpipe version` held the "
                f"workspace for more than {LOCK_WAIT:.0f}s"), \
            tempfile.TemporaryDirectory(prefix="rcpipe-version-") as tmp:
        where = Remote(root, remote)  # a missing remote fails before anything changes
        clashes = untracked_overrides(overrides, tracked)
        if clashes:
            item, stage, key = clashes[0]
            raise InputError("--set", item, f"dvc.yaml's {stage} tracks {key}: set it in "
                                            "params.yaml, or dvc.lock would misstate the run")
        manifest = fetch(cfg)  # the pinned checksums, and sources.json for the fetch stage
        # a missing or malformed gate set, or the dev set named as one, fails before too
        gate = gate_set(cfg, manifest["dev"]["sha256"]) if promote else None
        if promote:  # a champion record that cannot be swapped or read fails before
            if not where.swaps():  # anything is committed
                raise InputError(where.url, "", f"a {where.fs.protocol} remote: the champion "
                                 "record is changed by compare-and-swap, which rcpipe does on "
                                 "S3 and directory remotes only; version without --promote")
            champion_record.read(where, cfg.limits)
        # the earlier nights the nights page shows: a malformed one is left out, said now
        before = earlier(where, run)
        # a set a killed stage left half moved is finished first: dvc.lock never records
        # new predictions beside old metrics
        settle(*(layout.model_dir(v) for v in variants), layout.PREDICTIONS, layout.METRICS,
               layout.REPORTS, Path(cfg.data.out_dir))
        if "report" in targets:  # what dvc.lock records is this run's report
            report(cfg)
        committed = dvc(root, "commit", "--force", *targets)
        if committed.returncode != 0:
            failure = classify_failure(committed.stdout + "\n" + committed.stderr)
            raise InputError(root / "dvc.yaml", "dvc commit", failure.detail)
        scores = _scores(targets)
        git_commit = _git_commit(root, f"rcpipe version {run}: dvc.lock of "
                                       f"{', '.join(targets)}")
        push(root, targets, where, tries, backoff)
        lock_url = where.write((root / "dvc.lock").read_bytes(), "versions", run, "dvc.lock")
        record: dict[str, Any] = {
            "run": run, "targets": list(targets), "git_commit": git_commit,
            "dvc_lock": lock_url,
            "scores": {m: dict(zip(("em", "f1"), headline(s), strict=True))
                       for m, s in scores.items()},
            "cost": _costs(targets),  # the nights page's cost of each night
        }
        packages = {m: push_package(cfg, where, run, m, Path(tmp) / "packages" / m)
                    for m in scores if m in VARIANTS}
        record["packages"] = {m: url for m, (_, url) in packages.items()}
        # each package's pin (its config.json's sha256): `rcpipe champion set` checks it
        record["packages_sha256"] = {m: sha256((d / CONFIG).read_bytes())
                                     for m, (d, _) in packages.items()}
        if "ensemble" in scores:  # how the run's ensemble combines (champion set needs it)
            record["ensemble"] = Combination.of(scores["ensemble"]).as_dict()
        log.info(f"version {run}: {len(targets)} stages committed and pushed to "
                 f"{where.url}, with {len(record['packages'])} package(s)")
        if gate is not None:
            local = {m: d for m, (d, _) in packages.items()}
            record |= champion_gate(root, cfg, where, gate, record, scores, local,
                                    manifest["dev"]["sha256"], min_gain, Path(tmp))
        record["git_push"] = push_commit(root, cfg.version.git_remote, record["git_commit"],
                                         record.get("git_tags", []))
        record |= publish(where, record, before)  # the report and the nights page
        record["record"] = keep(where, record)
    return record


def keep(where: Remote, record: dict[str, Any]) -> str:
    """The night's record, ``versions/<run>/version.json`` on the remote; its URL."""
    return where.write(json.dumps(record, indent=1).encode(), "versions", record["run"],
                       "version.json")


def push_package(cfg: Config, where: Remote, run: str, variant: str, out: Path
                 ) -> tuple[Path, str]:
    """`rcpipe package` of ``variant`` into ``out`` and beside the run's record on the
    remote (``<remote>/rcpipe/versions/<run>/packages/<variant>/``): (``out``, its URL)."""
    from rcpipe.stages.package import package

    package(cfg, variant, out)
    for file in sorted(out.iterdir()):
        where.write(file.read_bytes(), "versions", run, "packages", variant, file.name)
    return out, where._where("versions", run, "packages", variant)[1]


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
