"""Versioning a run with DVC, and the champion gate: the decisions, as pure functions.

rcpipe.stages.version does the I/O (dvc and git commands, the records on the remote); what
to commit, whether a run's --set overrides leave dvc.lock truthful, whether a failed push is
worth retrying, which of a run's models stands for it and whether it replaces the champion
(its paired F1 difference on the gate set, beyond chance) are decided here, from plain data,
so each rule is tested without a remote.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from rcpipe.config import VARIANTS
from rcpipe.scoring.compare import PairedDifference
from rcpipe.scoring.metrics import headline

# ---------------------------------------------------------------------------- what to commit


def commit_targets(variants: Sequence[str], pipeline: Sequence[str] = VARIANTS,
                   student: bool = False) -> list[str]:
    """dvc.yaml stages a run of ``variants`` produced, in a dvc.yaml that trains
    ``pipeline`` (rcpipe/pipeline/dvc_yaml.py --variants) and, with ``student``, distills;
    ensemble, distill and report need every variant it trains."""
    unknown = [v for v in variants if v not in pipeline]
    if unknown:
        raise ValueError(f"dvc.yaml trains no variant {unknown}; it trains {list(pipeline)}")
    ordered = [v for v in pipeline if v in variants]
    targets = ["fetch", "prepare", *(f"train@{v}" for v in ordered),
               *(f"evaluate@{v}" for v in ordered)]
    whole = ["ensemble", *(["distill"] if student else []), "report"]
    return targets + (whole if len(ordered) == len(pipeline) else [])


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

LEVEL = 0.95  # the paired interval's level: promote when its lower end clears min_gain


@dataclass(frozen=True)
class Score:
    """One model of a run and its dev score (what the run reports; the gate never reads it)."""

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


def dev_score(metrics: Mapping[str, Mapping[str, Any]], model: str, dev_sha256: str,
              run: str) -> Score:
    """``model``'s dev score among the run's ``metrics`` (model -> official result)."""
    em, f1 = headline(metrics[model])
    return Score(model, f1, em, dev_sha256, run)


@dataclass(frozen=True)
class GateSet:
    """The questions candidate and champion both answer: the same from night to night
    while their file is, never the dev set that reports."""

    source: str  # "heldout" (data.heldout's slice), "file:<uri>" (data.heldout.file) or
    #              "version.gate_file"
    uri: str  # the SQuAD file read
    sha256: str  # of its bytes: a champion's stored answers count only on the same set
    questions: int
    paragraphs: int

    def line(self) -> str:
        return (f"{self.source} ({self.questions} questions, {self.paragraphs} paragraphs, "
                f"sha256 {self.sha256[:12]})")


def pick_candidate(gate_f1: Mapping[str, float]) -> str:
    """The run's candidate: its model (a variant or the ensemble) with the highest F1 on the
    gate set (ties: the first listed). The dev set reports and chooses nothing; choosing the
    best of several on the questions the gate then judges it on flatters the winner
    (docs/guide/versioning.md, "the champion")."""
    if not gate_f1:
        raise ValueError("no gate scores: nothing was evaluated")
    return max(gate_f1, key=lambda m: gate_f1[m])  # max keeps the first of equals


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    # the candidate's gate F1 minus the champion's, paragraph-bootstrapped; None without one
    interval: PairedDifference | None = None


def _named(s: Score) -> str:
    return f"{s.model} (run {s.run})"


def decide(candidate: Score, champion: Score | None, interval: PairedDifference | None,
           gate: GateSet, min_gain: float = 0.0) -> Decision:
    """Promote ``candidate`` when there is no champion, or when the paired interval of its
    gate-set F1 minus the champion's (both answering ``gate``) lies above ``min_gain``: its
    lower end, not the point difference, must clear it, so two runs of the same settings,
    whose difference is noise, leave the champion in place."""
    if min_gain < 0:
        raise ValueError(f"min_gain {min_gain} is below 0")
    if champion is None:
        return Decision(True, f"{_named(candidate)}: no champion yet; gate set {gate.line()}")
    if interval is None:
        raise ValueError("a champion to beat needs the paired interval")
    d = interval
    measured = (f"on the gate set {gate.line()}: gate F1 {d.f1_a:.2f} -> {d.f1_b:.2f}, "
                f"{d.diff:+.2f} [{d.low:+.2f}, {d.high:+.2f}] ({d.level:.0%}, "
                f"{d.paragraphs} paragraphs bootstrapped)")
    if d.low > min_gain:
        return Decision(True, f"{_named(candidate)} beats the champion {_named(champion)} "
                              f"{measured}; the lower end is above min_gain {min_gain:.2f}", d)
    return Decision(False, f"{_named(candidate)} does not beat the champion "
                           f"{_named(champion)} beyond chance {measured}; the lower end is "
                           f"not above min_gain {min_gain:.2f}: the champion stays", d)


def not_compared(candidate: Score, champion: Score, why: str) -> Decision:
    """The champion could not answer the gate set (``why``): it stays, and says so."""
    return Decision(False, f"{_named(candidate)} is not compared with the champion "
                           f"{_named(champion)}: {why}; the champion stays (delete "
                           "rcpipe/champion.json on the remote to crown the next run)")


def gate_record(decision: Decision, gate: GateSet, gate_f1: Mapping[str, float],
                candidate: Score, champion: Score | None, min_gain: float) -> dict[str, Any]:
    """What the version record, champion.json and the flow's artifact say of a decision."""
    d = decision.interval
    return {
        "promoted": decision.promote, "reason": decision.reason, "set": asdict(gate),
        "min_gain": min_gain, "level": d.level if d else LEVEL,
        "f1": dict(gate_f1),  # every model of the run on the gate set
        "candidate": {"model": candidate.model, "run": candidate.run,
                      "f1": gate_f1[candidate.model]},
        "champion": None if champion is None else {
            "model": champion.model, "run": champion.run, "f1": d.f1_a if d else None},
        "diff": d.diff if d else None, "low": d.low if d else None,
        "high": d.high if d else None, "se": d.se if d else None,
        "questions": d.questions if d else gate.questions,
        "paragraphs": d.paragraphs if d else gate.paragraphs,
    }


def cost_of(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What a variant's training cost, from its summary.json: the run that finished (a
    night that did not retrain it finds the same run), its wall time and device-hours
    (wall time x workers: one GPU a worker on CUDA; on the CPU a worker is whatever CPUs
    train.cpus_per_worker gave it, so "CPU-worker-h")."""
    wall, workers = float(summary.get("wall_seconds", 0.0)), int(summary.get("world_size", 1))
    gpu = str(summary.get("device", "cpu")).startswith("cuda")
    return {"run": summary.get("run"), "wall_s": round(wall, 1), "workers": workers,
            "hours": round(wall * workers / 3600, 4), "unit": "GPU-h" if gpu else "CPU-worker-h"}
