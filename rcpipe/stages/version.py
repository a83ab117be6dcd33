"""`rcpipe version` and the flow's versioning step: commit, push, the champion gate.

After a run in a DVC workspace (a checkout holding dvc.yaml, the run's outputs in place):
`dvc commit` records the stages the run produced in dvc.lock, git commits dvc.lock, `dvc
push` sends the data and models to the remote, and the run's record and dvc.lock go beside
the remote's objects (``<remote>/rcpipe/versions/<run>/``), with each evaluated variant's
`rcpipe package` (``versions/<run>/packages/<variant>/``), so even a run whose workspace
disappears (a pod) leaves a version anyone can `dvc pull` and models anyone can download.
With ``promote`` the champion gate follows (rcpipe/release/promotion.py): the run's models
and the champion of ``<remote>/rcpipe/champion.json`` answer the same gate set (never the
dev set), the run's best there is its candidate, and rcpipe.release.rules.decide moves the
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
from rcpipe.release.gate import gate_set
from rcpipe.release.nights import earlier, keep, publish, push_commit
from rcpipe.release.promotion import champion_gate
from rcpipe.release.remote import Remote, dvc, git, identity, push
from rcpipe.release.rules import classify_failure, commit_targets, cost_of, untracked_overrides
from rcpipe.scoring.metrics import headline
from rcpipe.trained.package_dir import CONFIG, sha256
from rcpipe.variants import STUDENT

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
    models += [STUDENT] if "distill" in targets else []  # distill evaluates its student
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
        targets = commit_targets(variants, pipeline, "distill" in tracked)
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
                    for m in scores if m in (*VARIANTS, STUDENT)}
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


def push_package(cfg: Config, where: Remote, run: str, variant: str, out: Path
                 ) -> tuple[Path, str]:
    """`rcpipe package` of ``variant`` into ``out`` and beside the run's record on the
    remote (``<remote>/rcpipe/versions/<run>/packages/<variant>/``): (``out``, its URL)."""
    from rcpipe.stages.package import package

    package(cfg, variant, out)
    for file in sorted(out.iterdir()):
        where.write(file.read_bytes(), "versions", run, "packages", variant, file.name)
    return out, where._where("versions", run, "packages", variant)[1]
