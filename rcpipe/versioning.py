"""Versioning a run with DVC, and the champion gate: the decisions, as pure functions.

rcpipe.stages.version does the I/O (dvc and git commands, the records on the remote); what
to commit, whether a run's --set overrides leave dvc.lock truthful, whether a failed push is
worth retrying and whether a new model replaces the champion are decided here, from plain
data, so each rule is tested without a remote.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from rcpipe.config import VARIANTS
from rcpipe.eval.metrics import headline

# ---------------------------------------------------------------------------- what to commit


def commit_targets(variants: Sequence[str]) -> list[str]:
    """dvc.yaml stages a run of ``variants`` produced; ensemble and report need all five."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {VARIANTS}")
    ordered = [v for v in VARIANTS if v in variants]
    targets = ["fetch", "prepare", *(f"train@{v}" for v in ordered),
               *(f"evaluate@{v}" for v in ordered)]
    return targets + (["ensemble", "report"] if len(ordered) == len(VARIANTS) else [])


def untracked_overrides(overrides: Iterable[str], tracked: Mapping[str, Iterable[str]]
                        ) -> list[tuple[str, str, str]]:
    """(override, stage, key) for each ``--set key=value`` that touches a key a stage tracks.

    dvc.lock records params.yaml's values; an override of a tracked key (or of a section
    holding one, or of a field inside a tracked section) would make it describe another run.
    """
    clashes = []
    for item in overrides:
        key = item.partition("=")[0].strip()
        for stage, keys in tracked.items():
            for tracked_key in keys:
                if _overlaps(key, tracked_key):
                    clashes.append((item, stage, tracked_key))
    return clashes


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


# ------------------------------------------------------------------------------ dvc failures

Kind = Literal["retry", "remote", "credentials", "bucket", "other"]

_FAILURES: list[tuple[Kind, re.Pattern[str], str]] = [
    ("remote", re.compile(r"no remote specified|remote '[^']*' doesn't exist|"
                          r"unsupported URL type", re.I),
     "no usable DVC remote: `dvc remote add -d storage s3://BUCKET/PREFIX`"),
    ("credentials", re.compile(r"unable to locate credentials|InvalidAccessKeyId|"
                               r"SignatureDoesNotMatch|ExpiredToken|AccessDenied|Forbidden|"
                               r"\b403\b|NoCredentialsError|PermissionError", re.I),
     "the remote refused the credentials: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
     "(or `dvc remote modify --local`)"),
    ("bucket", re.compile(r"NoSuchBucket|bucket does not exist|specified bucket", re.I),
     "no such bucket: create it first (`aws s3 mb s3://BUCKET`)"),
    ("retry", re.compile(r"could not connect|connection (?:refused|reset|aborted)|"
                         r"connect timeout|read timeout|timed out|endpoint url|"
                         r"failed to (?:upload|download)|SlowDown|ServiceUnavailable|"
                         r"InternalError|\b50[0-4]\b|temporarily|"
                         r"ClientConnectorError|ServerDisconnected", re.I),
     "the remote is unreachable"),
]


@dataclass(frozen=True)
class Failure:
    kind: Kind
    what: str  # the one-line explanation for people
    detail: str  # dvc's own last error line

    @property
    def retryable(self) -> bool:
        return self.kind == "retry"


def classify_failure(output: str) -> Failure:
    """What a failed dvc command's output says went wrong (first matching rule wins)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["(no output)"]
    detail = errors[-1].removeprefix("ERROR:").strip().rstrip(".")
    for kind, pattern, what in _FAILURES:
        if pattern.search(output):
            return Failure(kind, what, detail)
    return Failure("other", "dvc failed", detail)


# ---------------------------------------------------------------------------- champion gate


@dataclass(frozen=True)
class Score:
    """One model's dev score, and what makes two scores comparable."""

    model: str  # a variant or "ensemble"
    f1: float
    em: float
    dev_sha256: str  # the dev set it was scored on
    run: str  # the version it belongs to

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Score:
        return cls(str(d["model"]), float(d["f1"]), float(d["em"]), str(d["dev_sha256"]),
                   str(d["run"]))


def best_score(metrics: Mapping[str, Mapping[str, Any]], dev_sha256: str, run: str) -> Score:
    """The run's candidate: its model with the highest dev F1 (ties: the first listed)."""
    if not metrics:
        raise ValueError("no scores: nothing was evaluated")
    model, result = max(metrics.items(), key=lambda kv: kv[1]["f1"])  # max keeps the first
    em, f1 = headline(result)
    return Score(model, f1, em, dev_sha256, run)


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str


def decide(candidate: Score, champion: Score | None, min_gain: float = 0.0) -> Decision:
    """Promote ``candidate`` only if its dev F1 beats the champion's by more than min_gain.

    Scores on different dev sets are not comparable: the champion stays (a person may
    promote by hand after checking).
    """
    new = f"{candidate.model} (run {candidate.run}) dev F1 {candidate.f1:.2f}"
    if champion is None:
        return Decision(True, f"{new}: no champion yet")
    old = f"the champion {champion.model} (run {champion.run}) dev F1 {champion.f1:.2f}"
    if champion.dev_sha256 != candidate.dev_sha256:
        return Decision(False, f"{new}: not comparable with {old}, scored on another dev set "
                               f"(sha256 {champion.dev_sha256[:12]}, now "
                               f"{candidate.dev_sha256[:12]}); the champion stays")
    if candidate.f1 > champion.f1 + min_gain:
        return Decision(True, f"{new} beats {old}")
    gain = f" by more than {min_gain:.2f}" if min_gain else ""
    return Decision(False, f"{new} does not beat {old}{gain}; the champion stays")
