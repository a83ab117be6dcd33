"""dvc.yaml end to end against a real S3 endpoint (moto's server on 127.0.0.1).

One temporary copy of the project (the code, the committed .dvc/config, a tiny params.yaml
and synthetic SQuAD files) with a dvc.yaml of two variants, one recurrent and one
convolutional (`python -m rcpipe.pipeline.dvc_yaml --variants bidaf,qanet`: the project's
rows with fewer names, tests/test_dvc_pipeline.py) is reproduced once for the module; the
tests then push, wipe, pull, change one variant's params, push through an endpoint that goes
down mid-push, and version the run with the champion gate, in that order. Every variant's
model trains and answers through the same `rcpipe train` / `evaluate` code in
tests/stages/ and tests/models/; a Ray Train job more a variant here would add ~20 CPU s of
Ray Train's start-up each (docs/dev/testing.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rcpipe.scoring.metrics import score
from tests.conftest import SynthData, questions_of
from tests.dvc_project import BUCKET, make_project, sh

pytestmark = [pytest.mark.trains, pytest.mark.integration, pytest.mark.ray_train(3)]

VARIANTS = ("bidaf", "qanet")  # the workspace's dvc.yaml trains these

OUTPUTS = ("data/cache", "data/prepared", "models", "predictions", "metrics", "reports")


def ran_stages(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines()
            if line.startswith("Running stage '")}


def digests(root: Path) -> dict[str, str]:
    """sha256 of every output file (relative path -> digest)."""
    found = {}
    for top in OUTPUTS:
        for path in sorted((root / top).rglob("*")):
            # not Ray's checkpoints (runs/) and the record of them, nor an output's lock
            # file (rcpipe/locks.py, `.<output>.lock` beside it): not versioned
            lock = path.name.startswith(".") and path.name.endswith(".lock")
            if path.is_file() and "runs" not in path.parts and not lock and \
                    path.name not in {".gitignore", "runs.json"}:
                found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def remote_objects(s3: Any) -> dict[str, bytes]:
    """Every object under the DVC remote's prefix, read straight from the endpoint."""
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="dvc/"):
        for item in page.get("Contents", []):
            found[item["Key"]] = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
    return found


def assert_content_addressed(objects: dict[str, bytes]) -> int:
    """Each DVC object's md5 is its name: a torn or truncated upload would not be."""
    count = 0
    for key, body in objects.items():
        if "/files/md5/" not in key:
            continue
        prefix, rest = key.split("/files/md5/")[1].split("/")
        assert hashlib.md5(body).hexdigest() == prefix + rest.removesuffix(".dir"), key
        count += 1
    return count


@pytest.fixture(scope="module")
def project(s3: Any, tmp_path_factory: pytest.TempPathFactory, synth_v1: SynthData,
            join_local_ray: str) -> Iterator[Path]:
    """The project copied, git and DVC set up, the remote pointed at moto, `dvc repro` run."""
    root = make_project(tmp_path_factory.mktemp("dvc") / "project", synth_v1,
                        variants=VARIANTS)
    t0 = time.perf_counter()
    out = sh(root, "dvc", "repro")
    print(f"dvc repro of the whole pipeline: {time.perf_counter() - t0:.1f}s")
    expected = {"fetch", "prepare", "ensemble", "report",
                *(f"{s}@{v}" for s in ("train", "evaluate") for v in VARIANTS)}
    assert ran_stages(out.stdout) == expected
    yield root


def test_every_variant_left_the_contract_files(project: Path, synth_v1: SynthData) -> None:
    """tests/stages/test_train.py checks bidaf's in-process; here both, as run by
    `rcpipe train` / `rcpipe evaluate` from dvc.yaml."""
    dev_ids = {qa["id"] for qa in questions_of(synth_v1.dev_doc)}
    for variant in VARIANTS:
        summary = json.loads((project / f"models/{variant}/summary.json").read_text())
        assert summary["world_size"] == 1 and summary["resumed_from_step"] == 0, variant
        assert summary["steps"] == 2 and summary["device"] == "cpu", variant
        preds = json.loads((project / f"predictions/{variant}.json").read_text())
        nbest = json.loads((project / f"predictions/{variant}.nbest.json").read_text())
        assert set(preds) == set(nbest) == dev_ids, variant
        assert all(nbest[q]["text"] == preds[q] for q in preds), variant
        metrics = json.loads((project / f"metrics/{variant}.json").read_text())
        assert metrics == score(synth_v1.dev_doc, preds), variant


def test_dvc_plots_draws_every_declared_plot_from_the_run(project: Path) -> None:
    shown = json.loads(sh(project, "dvc", "plots", "show", "--json").stdout)
    assert not shown.get("errors"), shown["errors"]
    declared = yaml.safe_load((project / "dvc.yaml").read_text())["plots"]
    names = [p if isinstance(p, str) else next(iter(p)) for p in declared]
    assert set(shown["data"]) == set(names)
    models = len(VARIANTS) + 1
    for name, [plot] in shown["data"].items():
        if plot["type"] == "image":
            assert Path(plot["url"]).stat().st_size > 0, name
            continue
        rows = plot["content"]["data"]["values"]
        per_model = len(VARIANTS) if "training" in name else models
        # one series per model: a file per model, or a CSV column per model
        series = {r.get("field") or r["filename"] for r in rows}
        assert len(series) == per_model, (name, series)


def test_repro_push_wipe_pull_gives_the_same_model_then_repro_does_nothing(
        project: Path, s3: Any) -> None:
    before = digests(project)
    assert {f"models/{v}/model.pt" for v in VARIANTS} <= set(before)
    assert sh(project, "dvc", "push").returncode == 0
    assert assert_content_addressed(remote_objects(s3)) > 0

    shutil.rmtree(project / ".dvc/cache")
    for path in digests(project):  # every output; Ray's checkpoints stay (not versioned)
        (project / path).unlink()
    sh(project, "dvc", "pull")
    assert json.loads(sh(project, "dvc", "status", "--json").stdout) == {}
    assert digests(project) == before

    # the pulled model predicts exactly what it predicted before the push
    sh(project, "rcpipe", "evaluate", "bidaf")
    assert digests(project) == before
    assert json.loads(sh(project, "dvc", "status", "--json").stdout) == {}

    again = sh(project, "dvc", "repro")
    assert ran_stages(again.stdout) == set(), again.stdout
    assert "Data and pipelines are up to date" in again.stdout
    assert digests(project) == before


def test_a_changed_variants_params_retrain_only_that_variant(project: Path) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["models"]["qanet"]["hidden"] = 12
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert list((project / "models/qanet/runs").glob("run-*/step-*"))  # the old params' run
    status = json.loads(sh(project, "dvc", "status", "--json").stdout)
    assert set(status) == {"train@qanet", "evaluate@qanet"}, status  # both list models.qanet
    before = digests(project)

    out = sh(project, "dvc", "repro")
    assert ran_stages(out.stdout) == {"train@qanet", "evaluate@qanet", "ensemble", "report"}
    after = digests(project)
    changed = {path for path in before if after.get(path) != before[path]}
    assert {p for p in changed if p.startswith("models/")
            and not p.startswith("models/qanet/live/")} <= {  # live/: qanet's dev curve
        f"models/qanet/{name}" for name in ("model.pt", "summary.json", "metrics.json")}
    assert "models/qanet/model.pt" in changed
    # a fresh run from the new params: the old run's checkpoints were not resumed
    summary = json.loads((project / "models/qanet/summary.json").read_text())
    assert summary["resumed_from_step"] == 0 and summary["steps"] == 2
    assert json.loads(sh(project, "dvc", "status", "--json").stdout) == {}


class Outage:
    """A TCP proxy in front of the S3 endpoint that drops every connection, and refuses new
    ones, once ``allow`` PUT requests have gone through: the endpoint going down mid-push."""

    def __init__(self, target: int, allow: int) -> None:
        self.target, self.allow, self.puts = target, allow, 0
        self.down = threading.Event()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down.is_set():
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if requests:
                    with self.lock:
                        self.puts += data.count(b"PUT /")
                        over = self.puts > self.allow
                    if over:
                        self.cut()
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def cut(self) -> None:
        self.down.set()
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def restore(self) -> None:
        self.allow = 10**9
        self.down.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_push_while_the_endpoint_goes_down_fails_clearly_and_pushing_again_completes(
        project: Path, s3: Any) -> None:
    """The qanet retrain left new objects to push: the endpoint dies after the first few."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    outage = Outage(int(endpoint.rsplit(":", 1)[1]), allow=2)
    proxy = f"http://127.0.0.1:{outage.port}"
    sh(project, "dvc", "remote", "modify", "--local", "storage", "endpointurl", proxy)
    try:
        t0 = time.perf_counter()
        failed = sh(project, "rcpipe", "version", "--tries", "2", check=False)
        print(f"push through the outage failed after {time.perf_counter() - t0:.1f}s")
        assert failed.returncode == 2, failed.stderr[-3000:]
        lines = failed.stderr.strip().splitlines()
        assert lines[-1].startswith(f"error: s3://{BUCKET}/dvc: dvc push: the remote is "
                                    "unreachable after 2 tries"), lines[-1]
        assert "push again once it is up" in lines[-1] and "Traceback" not in failed.stderr
        assert outage.puts > 2  # it did go down in the middle of the push
        objects = remote_objects(s3)
        assert assert_content_addressed(objects) == len(
            [k for k in objects if "/files/md5/" in k])
        assert not [k for k in objects if k.startswith("dvc/rcpipe/")]  # no record of it

        outage.restore()
        sh(project, "dvc", "push")
        cloud = sh(project, "dvc", "status", "--cloud", "--json")
        assert json.loads(cloud.stdout) == {}, cloud.stdout
        assert assert_content_addressed(remote_objects(s3)) > len(objects)
    finally:
        sh(project, "dvc", "remote", "modify", "--local", "--unset", "storage", "endpointurl")
        outage.close()


def test_version_promotes_a_better_model_and_keeps_a_better_champion(
        project: Path, s3: Any) -> None:
    first = json.loads(sh(project, "rcpipe", "version", "--promote").stdout)
    assert first["promoted"] and "no champion yet" in first["reason"]
    assert first["targets"][-2:] == ["ensemble", "report"]
    # what each variant's training cost, for the nights page (version_rules.cost_of)
    assert set(first["cost"]) == set(VARIANTS)
    assert all(c["wall_s"] > 0 and c["unit"] == "CPU-worker-h" for c in first["cost"].values())
    champion = json.loads(s3.get_object(Bucket=BUCKET, Key="dvc/rcpipe/champion.json")
                          ["Body"].read())
    assert champion["score"] == first["candidate"] and champion["seq"] == 1
    assert champion["change"]["kind"] == "promotion" and first["races"] == []
    # GTO's mirror tags on the night's commit (rcpipe/stages/champions.py), in its record
    assert first["git_tags"] == ["rcpipe#champion#1", "rcpipe@v0.0.1"]
    assert sh(project, "git", "rev-list", "-n1", "rcpipe#champion#1").stdout.strip() == \
        first["git_commit"]
    assert "dvc.lock" in sh(project, "git", "show", "--name-only", "--format=", "HEAD").stdout
    lock = s3.get_object(Bucket=BUCKET, Key=f"dvc/rcpipe/versions/{first['run']}/dvc.lock")
    assert lock["Body"].read() == (project / "dvc.lock").read_bytes()
    # each variant's package beside the record, the champion's named by the pointer
    assert set(first["packages"]) == set(VARIANTS)
    prefix = f"dvc/rcpipe/versions/{first['run']}/packages/"
    keys = {item["Key"].removeprefix(prefix) for item in s3.list_objects_v2(
        Bucket=BUCKET, Prefix=prefix)["Contents"]}
    assert {f"{v}/{f}" for v in VARIANTS for f in ("model.safetensors", "config.json",
                                                   "vocab.json", "README.md")} <= keys
    assert champion["package"] == first["packages"].get(first["candidate"]["model"])

    # a champion the run cannot beat stays, and the record says why
    better = {**champion, "score": {**champion["score"], "f1": 101.0, "run": "best-ever"}}
    s3.put_object(Bucket=BUCKET, Key="dvc/rcpipe/champion.json", Body=json.dumps(better))
    time.sleep(1)  # another run id (one per second)
    second = json.loads(sh(project, "rcpipe", "version", "--promote").stdout)
    assert not second["promoted"]
    assert "does not beat the champion" in second["reason"] and "best-ever" in second["reason"]
    kept = s3.get_object(Bucket=BUCKET, Key="dvc/rcpipe/champion.json")["Body"].read()
    assert json.loads(kept) == better
    record = s3.get_object(Bucket=BUCKET, Key=f"dvc/rcpipe/versions/{second['run']}/"
                                               "version.json")
    assert json.loads(record["Body"].read())["reason"] == second["reason"]
