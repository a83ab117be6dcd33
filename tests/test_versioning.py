"""rcpipe.versioning: what a run commits, which overrides dvc.lock can absorb, which failed
pushes are retried, and the champion gate both ways; plus the fetch helpers."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rcpipe.config import VARIANTS
from rcpipe.errors import InputError
from rcpipe.stages.fetch import check_pin, fetch, sources
from rcpipe.versioning import (
    Score,
    best_score,
    classify_failure,
    commit_targets,
    decide,
    untracked_overrides,
)
from tests.conftest import SynthData

DEV = "a" * 64


def score(f1: float, model: str = "qanet", dev: str = DEV, run: str = "r1") -> Score:
    return Score(model, f1, f1 - 5, dev, run)


# ---------------------------------------------------------------------------- champion gate


def test_first_model_becomes_the_champion() -> None:
    decision = decide(score(40.0), None)
    assert decision.promote and "no champion yet" in decision.reason


def test_a_better_dev_f1_is_promoted() -> None:
    decision = decide(score(71.5, run="new"), score(70.0, model="bidaf", run="old"))
    assert decision.promote
    assert "71.50 beats the champion bidaf (run old) dev F1 70.00" in decision.reason


@pytest.mark.parametrize("f1", [70.0, 69.9])
def test_an_equal_or_worse_dev_f1_keeps_the_champion_and_says_why(f1: float) -> None:
    decision = decide(score(f1, run="new"), score(70.0, model="ensemble", run="old"))
    assert not decision.promote
    assert "does not beat the champion ensemble (run old) dev F1 70.00" in decision.reason
    assert "the champion stays" in decision.reason


def test_min_gain_keeps_a_champion_beaten_by_noise() -> None:
    assert not decide(score(70.4), score(70.0), min_gain=0.5).promote
    assert decide(score(70.6), score(70.0), min_gain=0.5).promote


def test_scores_on_another_dev_set_are_not_compared() -> None:
    decision = decide(score(99.0, dev="b" * 64), score(10.0))
    assert not decision.promote and "another dev set" in decision.reason


def test_the_candidate_is_the_runs_best_model_by_f1() -> None:
    metrics = {"bidaf": {"exact_match": 60.0, "f1": 70.0},
               "ensemble": {"exact_match": 62.0, "f1": 72.5},
               "qanet": {"exact": 61.0, "f1": 72.5}}  # a tie keeps the first listed
    assert best_score(metrics, DEV, "r") == Score("ensemble", 72.5, 62.0, DEV, "r")
    assert Score.from_dict(score(1.0).as_dict()) == score(1.0)
    with pytest.raises(ValueError):
        best_score({}, DEV, "r")


# ---------------------------------------------------------------------------- what to commit


def test_commit_targets_follow_the_variants_the_run_trained() -> None:
    assert commit_targets(["qanet", "bidaf"]) == [
        "fetch", "prepare", "train@bidaf", "train@qanet", "evaluate@bidaf", "evaluate@qanet"]
    full = commit_targets(list(VARIANTS))
    assert full[-2:] == ["ensemble", "report"] and len(full) == 2 + 2 * len(VARIANTS) + 2
    with pytest.raises(ValueError, match="unknown variant"):
        commit_targets(["bert"])


def test_overrides_of_tracked_keys_are_found() -> None:
    tracked = {"train@qanet": ["models.qanet", "train.epochs"], "prepare": ["data.limits"]}
    assert untracked_overrides(["train.device=cuda", "train.storage_path=s3://b/r",
                                "models.bidaf.hidden=3"], tracked) == []
    assert untracked_overrides(["models.qanet.hidden=64", "train.epochs=2", "data=x"],
                               tracked) == [
        ("models.qanet.hidden=64", "train@qanet", "models.qanet"),
        ("train.epochs=2", "train@qanet", "train.epochs"),
        ("data=x", "prepare", "data.limits")]


# ------------------------------------------------------------------------------ dvc failures


@pytest.mark.parametrize(("output", "kind"), [
    ('ERROR: unexpected error - Could not connect to the endpoint URL: "http://127.0.0.1:9/b"',
     "retry"),
    ("ERROR: failed to push data to the cloud - 3 files failed to upload", "retry"),
    ("ERROR: failed to push - An error occurred (SlowDown) when calling PutObject", "retry"),
    ("ERROR: config file error: no remote specified in /w/.dvc/config.", "remote"),
    ("ERROR: unexpected error - Unable to locate credentials", "credentials"),
    ("ERROR: An error occurred (InvalidAccessKeyId) when calling the PutObject", "credentials"),
    ("ERROR: An error occurred (NoSuchBucket) when calling the ListObjectsV2", "bucket"),
    ("ERROR: output 'models/x/model.pt' does not exist", "other"),
])
def test_dvc_failures_are_classified(output: str, kind: str) -> None:
    failure = classify_failure("Collecting\n" + output + "\n")
    assert failure.kind == kind
    assert failure.retryable == (kind == "retry")
    assert failure.detail == output.removeprefix("ERROR:").strip().rstrip(".")


# ---------------------------------------------------------------------------------- fetch


def test_fetch_verifies_pins_and_writes_the_manifest(make_config, synth_v1: SynthData
                                                     ) -> None:  # noqa: ANN001
    digest = hashlib.sha256(synth_v1.dev.read_bytes()).hexdigest()
    cfg = make_config(synth_v1, data={"sha256": {str(synth_v1.dev): digest.upper()}})
    assert sources(cfg) == {"train": str(synth_v1.train), "dev": str(synth_v1.dev)}
    manifest = fetch(cfg)
    assert manifest["dev"] == {"uri": str(synth_v1.dev), "sha256": digest,
                               "bytes": synth_v1.dev.stat().st_size, "pinned": True}
    assert not manifest["train"]["pinned"]
    assert json.loads((cfg.data.cache_dir / "sources.json").read_text()) == manifest

    bad = make_config(synth_v1, data={"sha256": {str(synth_v1.train): "0" * 64}})
    with pytest.raises(InputError) as e:
        fetch(bad)
    assert e.value.file == str(synth_v1.train) and "does not match data.sha256" in e.value.what
    check_pin("https://x/y.json", "f" * 64, {})  # unpinned: accepted


# ------------------------------------------------------------------------ one-line errors


def test_version_without_a_remote_is_a_one_line_error(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    subprocess.run(["git", "init", "-q"], check=True, **run)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], check=True, **run)
    (tmp_path / "dvc.yaml").write_text((repo / "dvc.yaml").read_text())
    (tmp_path / "params.yaml").write_text((repo / "params.yaml").read_text())
    out = subprocess.run([sys.executable, "-m", "rcpipe", "version"], **run)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}/.dvc/config: "), lines
    assert "dvc remote add -d storage" in lines[0]
