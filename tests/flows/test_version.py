"""train-all with version=True (the nightly's setting) versions what it produced: dvc.lock
committed, data and models on the S3 remote (moto), the first champion crowned on the
held-out questions; a second night of the same models keeps it (their difference is 0, the
flow's min_gain reaching the gate), and the Prefect artifact gives the decision with its
interval."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from flows.train_all import train_all
from flows.version import decision_markdown
from tests.conftest import SynthData
from tests.dvc_project import BUCKET, make_project, sh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api", "local_ray")]


def _artifact(key: str) -> str:
    """The newest markdown artifact under ``key``."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1)
    return str(found[0].data)


def test_train_all_with_version_commits_pushes_and_runs_the_champion_gate(
        tmp_path: Path, synth_v1: SynthData, s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the flow changes into its workdir; undone afterwards
    work = make_project(tmp_path / "work", synth_v1, prefix="flow")
    out = train_all(params=str(work / "params.yaml"), variants=["bidaf"], workdir=str(work),
                    version=True)
    assert set(out["scores"]) == {"bidaf"} and "version" in out["seconds"]

    def champion() -> dict[str, Any]:
        return json.loads(s3.get_object(Bucket=BUCKET, Key="flow/rcpipe/champion.json")
                          ["Body"].read())

    crowned = champion()
    assert crowned["score"]["model"] == "bidaf"
    assert crowned["score"]["f1"] == out["scores"]["bidaf"]["f1"]  # the dev F1, reported
    lock = s3.get_object(Bucket=BUCKET, Key=crowned["dvc_lock"].removeprefix(f"s3://{BUCKET}/"))
    assert lock["Body"].read() == (work / "dvc.lock").read_bytes()
    assert "dvc.lock" in sh(work, "git", "show", "--name-only", "--format=", "HEAD").stdout

    # the gate set: prepare's held-out questions, never the dev set
    heldout = work / "data/prepared/heldout.json"
    gate = crowned["gate"]
    assert gate["set"]["source"] == "heldout" and gate["champion"] is None
    assert gate["set"]["sha256"] == hashlib.sha256(heldout.read_bytes()).hexdigest()
    questions = sum(len(p["qas"]) for a in json.loads(heldout.read_text())["data"]
                    for p in a["paragraphs"])
    assert gate["questions"] == questions > 0 and gate["candidate"]["model"] == "bidaf"
    assert "no champion yet" in _artifact("train-all-version")

    produced = ["fetch", "prepare", "train@bidaf", "evaluate@bidaf"]
    assert json.loads(sh(work, "dvc", "status", "--json", *produced).stdout) == {}
    assert json.loads(sh(work, "dvc", "status", "--cloud", "--json", *produced).stdout) == {}

    # night 2, nothing changed: the same model against itself, with the flow's min_gain
    train_all(params=str(work / "params.yaml"), variants=["bidaf"], workdir=str(work),
              version=True, min_gain=0.5)
    assert champion() == crowned
    key = max(o["Key"] for o in s3.list_objects_v2(
        Bucket=BUCKET, Prefix="flow/rcpipe/versions/")["Contents"]
        if o["Key"].endswith("/version.json"))  # run names begin with the time
    night2 = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    gate = night2["gate"]
    assert not night2["promoted"] and gate["min_gain"] == 0.5
    assert (gate["diff"], gate["low"], gate["high"]) == (0.0, 0.0, 0.0)
    assert gate["champion"]["run"] == crowned["score"]["run"]
    artifact = _artifact("train-all-version")
    assert artifact == decision_markdown(night2 | {"record": f"s3://{BUCKET}/{key}"})
    assert "**kept the champion**" in artifact and "+0.00 F1** [+0.00, +0.00] (95%" in artifact
    assert f"sha256 `{gate['set']['sha256']}`" in artifact and "min_gain 0.50" in artifact
