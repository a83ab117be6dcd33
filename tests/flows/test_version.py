"""train-all with version=True (the nightly's setting) versions what it produced: dvc.lock
committed, data and models on the S3 remote (moto), the first champion crowned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flows.train_all import train_all
from tests.conftest import SynthData
from tests.dvc_project import BUCKET, make_project, sh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api", "local_ray")]


def test_train_all_with_version_commits_pushes_and_runs_the_champion_gate(
        tmp_path: Path, synth_v1: SynthData, s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the flow changes into its workdir; undone afterwards
    work = make_project(tmp_path / "work", synth_v1, prefix="flow")
    out = train_all(params=str(work / "params.yaml"), variants=["bidaf"], workdir=str(work),
                    version=True)
    assert set(out["scores"]) == {"bidaf"} and "version" in out["seconds"]

    champion = json.loads(s3.get_object(Bucket=BUCKET, Key="flow/rcpipe/champion.json")
                          ["Body"].read())
    assert champion["score"]["model"] == "bidaf"
    assert champion["score"]["f1"] == out["scores"]["bidaf"]["f1"]
    lock = s3.get_object(Bucket=BUCKET, Key=champion["dvc_lock"].removeprefix(f"s3://{BUCKET}/"))
    assert lock["Body"].read() == (work / "dvc.lock").read_bytes()
    assert "dvc.lock" in sh(work, "git", "show", "--name-only", "--format=", "HEAD").stdout

    produced = ["fetch", "prepare", "train@bidaf", "evaluate@bidaf"]
    assert json.loads(sh(work, "dvc", "status", "--json", *produced).stdout) == {}
    assert json.loads(sh(work, "dvc", "status", "--cloud", "--json", *produced).stdout) == {}
