"""The product's night-after-night sequence on one DVC workspace: a user's first `dvc repro`
by hand, then scheduled retraining as nights (`prefect deployment run train-all/local` with
version=True, on a real Prefect server and worker, a Ray cluster the flow joins
(``ray_address``: the pytest worker's local Ray, as a nightly joins its team's cluster) and
the S3 endpoint on loopback as the DVC remote). The workspace's dvc.yaml trains two variants,
one recurrent and one convolutional (`python -m rcpipe.pipeline.dvc_yaml --variants
bidaf,qanet`: the project's rows with fewer names, tests/test_dvc_pipeline.py); every
variant's model trains and answers through the same `rcpipe train` / `evaluate` code in
tests/stages/ and tests/models/. The tests run in order, each on what the one before left:

1. `dvc repro` runs every stage; every output is what its contract says; `dvc plots show`
   draws every declared plot;
2. a push through an endpoint that goes down mid-push fails in one line, pushing again
   completes, and the outputs wiped and pulled are the same bytes (then `dvc repro` does
   nothing);
3. `rcpipe version --promote` crowns the first champion on prepare's held-out questions;
4. night 1: nothing changed since the repro: the flow trains nothing and evaluates nothing
   (the stamps the repro's commands wrote), and keeps the champion against itself at the
   flow's min_gain (a difference of 0; the Prefect artifact says so with its interval);
5. night 2: qanet's params changed (wider, longer): DVC finds its two stages stale; the
   night trains qanet alone and is cancelled once the new run has a checkpoint: the flow run
   ends by itself (its Ray Train run aborted through its controller:
   rcpipe/cluster/run_abort.py), well before Prefect's SIGKILL, leaves nothing running on
   the cluster it joined, stores no checkpoint after it ended and puts no model in place;
6. night 3: the cancelled run resumes from its checkpoint; nothing else trains or is
   evaluated again but what reads qanet; the gate decides, and the workspace is what
   `dvc repro` calls up to date;
7. night 4: new training data (more articles): both train anew, at once; every night's
   commit is on the git remote, `dvc metrics diff` between two nights, the nights page
   behind a link;
8. a champion the run cannot beat stays, and the record says why.

One sequence rather than a DVC test and a nights test that each train from nothing: each
Ray Train job costs ~20 CPU s of Ray Train's start-up (docs/dev/testing.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from flows import stack
from flows.version import decision_markdown
from rcpipe.config import VARIANTS as REGISTERED
from rcpipe.data import synth
from rcpipe.release.champions import history
from rcpipe.scoring.metrics import score
from rcpipe.train.checkpoint import first_whole, step_of
from tests import ray_nodes
from tests.conftest import AWS_WORKER_ENV, SynthData, questions_of
from tests.dvc_project import (
    BUCKET,
    Outage,
    assert_content_addressed,
    digests,
    make_project,
    ran_stages,
    remote_objects,
    sh,
)
from tests.flow_runs import flow_run, flow_run_id

pytestmark = [pytest.mark.integration, pytest.mark.trains, pytest.mark.slow,
              pytest.mark.ray_train(6)]

VOTERS = ("bidaf", "qanet")  # the workspace's dvc.yaml trains these
PREFIX = "nights"
# checkpoints every 4 steps of 24 (the 24 steps are ~3 s of a ~20 s run: the rest is Ray
# Train's start-up, which fewer steps do not cut). One CPU a worker: the joined Ray
# (tests/conftest.py's local_ray, 2 CPUs) trains both voters at once on a night
# (rcpipe.cluster.train_job.jobs_that_fit) instead of one after the other; where and how
# fast to train is no key dvc.yaml tracks (nor a run's fingerprint), so no night's decision
# depends on it
TRAIN = {"max_steps": 24, "eval_every": 4, "batch_size": 4, "epochs": 50,
         "cpus_per_worker": 1}
# qanet's max_steps from night 2 on: from its run's first checkpoint to its end takes longer
# than a cancellation takes to land, on a slow machine too (see night 2)
LONGER = 80


@dataclass
class Workspace:
    """The one workspace, its surroundings, and what a step leaves the next."""

    work: Path
    origin: Path  # the team's git remote: each versioned night's commit goes there
    env: dict[str, str]  # a Prefect client's, RAY_ADDRESS the joined Ray's
    s3_env: dict[str, str]  # the flow run's
    api_url: str
    params: dict[str, Any]
    seen: dict[str, Any] = field(default_factory=dict)

    def night(self, *more: str) -> tuple[float, str]:
        return _night(self.env, self.work, self.s3_env, *more)

    def write_params(self) -> None:
        (self.work / "params.yaml").write_text(yaml.safe_dump(self.params, sort_keys=False))


@pytest.fixture(scope="module")
def ws(prefect_stack: dict, tmp_path_factory: pytest.TempPathFactory, synth_v1: SynthData,
       s3: Any, join_local_ray: str) -> Workspace:
    """The workspace, its dvc.yaml of the two voters, its first `dvc repro` by hand."""
    root = tmp_path_factory.mktemp("nights")
    work = make_project(root / "work", synth_v1, prefix=PREFIX, variants=VOTERS)
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["train"] |= TRAIN
    params["models"] = {v: params["models"][v] for v in VOTERS}
    origin = root / "origin.git"
    sh(root, "git", "init", "-q", "--bare", str(origin))
    sh(work, "git", "remote", "add", "origin", str(origin))
    sh(work, "git", "push", "-q", "origin", "HEAD")
    env = stack.server_env(root / "client", str(prefect_stack["api_url"]))
    assert env["RAY_ADDRESS"] == join_local_ray  # the flows join it (_deployment_run)
    s3_env = {**AWS_WORKER_ENV, "AWS_ENDPOINT_URL": s3.meta.endpoint_url,
              # the joined Ray asks for its token (Ray turned token auth on in this process
              # as it started local_ray; the flow run's process, a child of the Prefect
              # worker started before it, is told so as a nightly's environment would be)
              **{k: os.environ[k] for k in ("RAY_AUTH_MODE",) if k in os.environ}}
    ws = Workspace(work, origin, env, s3_env, str(prefect_stack["api_url"]), params)
    ws.write_params()
    t0 = time.perf_counter()
    out = sh(work, "dvc", "repro")  # `rcpipe train` joins the pytest worker's Ray too
    print(f"dvc repro of the whole pipeline: {time.perf_counter() - t0:.1f}s")
    ws.seen["repro"] = out.stdout
    return ws


def test_the_first_repro_ran_every_stage_and_left_the_contract_files(
        ws: Workspace, synth_v1: SynthData) -> None:
    """tests/stages/test_train.py checks bidaf's in-process; here both, as `dvc repro` ran
    `rcpipe train` / `rcpipe evaluate` from dvc.yaml."""
    assert ran_stages(ws.seen["repro"]) == {
        "fetch", "prepare", "ensemble", "report",
        *(f"{s}@{v}" for s in ("train", "evaluate") for v in VOTERS)}
    dev_ids = {qa["id"] for qa in questions_of(synth_v1.dev_doc)}
    for variant in VOTERS:
        summary = json.loads((ws.work / f"models/{variant}/summary.json").read_text())
        assert summary["world_size"] == 1 and summary["resumed_from_step"] == 0, variant
        assert summary["steps"] == TRAIN["max_steps"] and summary["device"] == "cpu", variant
        preds = json.loads((ws.work / f"predictions/{variant}.json").read_text())
        nbest = json.loads((ws.work / f"predictions/{variant}.nbest.json").read_text())
        assert set(preds) == set(nbest) == dev_ids, variant
        assert all(nbest[q]["text"] == preds[q] for q in preds), variant
        metrics = json.loads((ws.work / f"metrics/{variant}.json").read_text())
        assert metrics == score(synth_v1.dev_doc, preds), variant
    for name in (*VOTERS, "ensemble"):
        result = json.loads((ws.work / f"metrics/{name}.json").read_text())
        # the official v1.1 keys alone: `dvc metrics show` is a row of EM/F1 a model
        assert set(result) == {"exact_match", "f1"}
        if name == "ensemble":  # evaluate keeps distributions: all three methods scored,
            # beside; the answers given are params.yaml's method's (tests/dvc_project.py)
            how = json.loads((ws.work / "metrics/ensemble.methods.json").read_text())
            assert how["method"] == "selected"
            assert set(how["methods"]) == {"vote", "mean", "selected"}
            assert result["f1"] == how["methods"]["selected"]["f1"]
        answers = json.loads((ws.work / f"predictions/{name}.json").read_text())
        assert len(answers) == len(questions_of(synth_v1.dev_doc))
    # `dvc metrics show`: a row of EM/F1 a model, nothing else
    shown = json.loads(sh(ws.work, "dvc", "metrics", "show", "--json").stdout)
    rows = {f: d["data"] for w in shown.values() for f, d in w["data"].items()}
    assert set(rows) == {f"metrics/{m}.json" for m in (*VOTERS, "ensemble")}
    assert all(set(row) == {"exact_match", "f1"} for row in rows.values()), rows


def test_dvc_plots_draws_every_declared_plot_from_the_run(ws: Workspace) -> None:
    shown = json.loads(sh(ws.work, "dvc", "plots", "show", "--json").stdout)
    assert not shown.get("errors"), shown["errors"]
    declared = yaml.safe_load((ws.work / "dvc.yaml").read_text())["plots"]
    names = [p if isinstance(p, str) else next(iter(p)) for p in declared]
    assert set(shown["data"]) == set(names)
    models = len(VOTERS) + 1
    for name, [plot] in shown["data"].items():
        if plot["type"] == "image":
            assert Path(plot["url"]).stat().st_size > 0, name
            continue
        rows = plot["content"]["data"]["values"]
        per_model = len(VOTERS) if "training" in name else models
        # one series per model: a file per model, or a CSV column per model
        series = {r.get("field") or r["filename"] for r in rows}
        assert len(series) == per_model, (name, series)


def test_a_push_through_an_outage_fails_clearly_and_wiped_outputs_pull_back_the_same(
        ws: Workspace, s3: Any) -> None:
    """The repro's outputs pushed through an endpoint that dies after the first few PUTs;
    pushed again; then every output and the cache wiped and pulled."""
    project = ws.work
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
        assert lines[-1].startswith(f"error: s3://{BUCKET}/{PREFIX}: dvc push: the remote "
                                    "is unreachable after 2 tries"), lines[-1]
        assert "push again once it is up" in lines[-1] and "Traceback" not in failed.stderr
        assert outage.puts > 2  # it did go down in the middle of the push
        objects = remote_objects(s3, PREFIX)
        assert assert_content_addressed(objects) == len(
            [k for k in objects if "/files/md5/" in k])
        assert not [k for k in objects if k.startswith(f"{PREFIX}/rcpipe/")]  # no record

        outage.restore()
        sh(project, "dvc", "push")
        cloud = sh(project, "dvc", "status", "--cloud", "--json")
        assert json.loads(cloud.stdout) == {}, cloud.stdout
        assert assert_content_addressed(remote_objects(s3, PREFIX)) > len(objects)
    finally:
        sh(project, "dvc", "remote", "modify", "--local", "--unset", "storage", "endpointurl")
        outage.close()

    before = digests(project)
    assert {f"models/{v}/model.pt" for v in VOTERS} <= set(before)
    shutil.rmtree(project / ".dvc/cache")
    for path in before:  # every output; Ray's checkpoints stay (not versioned)
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


def test_version_crowns_the_first_champion_on_the_heldout_questions(
        ws: Workspace, s3: Any) -> None:
    work = ws.work
    first = json.loads(sh(work, "rcpipe", "version", "--promote").stdout)
    assert first["promoted"] and "no champion yet" in first["reason"]
    # dvc.yaml's variants, then the ensemble and report: all of what it trains
    assert first["targets"][-2:] == ["ensemble", "report"]
    assert [t for t in first["targets"] if t.startswith("train@")] == \
        [f"train@{v}" for v in VOTERS]
    # what each variant's training cost, for the nights page (release.rules.cost_of)
    assert set(first["cost"]) == set(VOTERS)
    assert all(c["wall_s"] > 0 and c["unit"] == "CPU-worker-h" for c in first["cost"].values())
    champion = _champion(s3)
    assert champion["score"] == first["candidate"] and champion["seq"] == 1
    assert champion["change"]["kind"] == "promotion" and first["races"] == []
    # GTO's mirror tags on the versioned commit (rcpipe/release/champions.py), in its record
    assert first["git_tags"] == ["rcpipe#champion#1", "rcpipe@v0.0.1"]
    assert sh(work, "git", "rev-list", "-n1", "rcpipe#champion#1").stdout.strip() == \
        first["git_commit"]
    assert "dvc.lock" in sh(work, "git", "show", "--name-only", "--format=", "HEAD").stdout
    key = champion["dvc_lock"].removeprefix(f"s3://{BUCKET}/")
    assert key == f"{PREFIX}/rcpipe/versions/{first['run']}/dvc.lock"
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == \
        (work / "dvc.lock").read_bytes()
    # each variant's package beside the record, the champion's named by the pointer
    assert set(first["packages"]) == set(VOTERS)
    prefix = f"{PREFIX}/rcpipe/versions/{first['run']}/packages/"
    keys = {item["Key"].removeprefix(prefix) for item in s3.list_objects_v2(
        Bucket=BUCKET, Prefix=prefix)["Contents"]}
    assert {f"{v}/{f}" for v in VOTERS for f in ("model.safetensors", "config.json",
                                                   "vocab.json", "README.md")} <= keys
    assert champion["package"] == first["packages"].get(first["candidate"]["model"])
    assert champion["score"]["model"] in (*VOTERS, "ensemble")
    heldout = work / "data/prepared/heldout.json"  # the gate set, never the dev set
    gate = champion["gate"]
    assert gate["set"]["source"] == "heldout" and gate["champion"] is None
    assert gate["set"]["sha256"] == hashlib.sha256(heldout.read_bytes()).hexdigest()
    questions = sum(len(p["qas"]) for a in json.loads(heldout.read_text())["data"]
                    for p in a["paragraphs"])
    assert gate["questions"] == questions > 0
    assert json.loads(sh(work, "dvc", "status", "--json").stdout) == {}
    assert json.loads(sh(work, "dvc", "status", "--cloud", "--json").stdout) == {}
    ws.seen["champion"] = champion


def test_night_1_after_the_repro_trains_nothing_and_keeps_the_champion(
        ws: Workspace, s3: Any) -> None:
    """Nothing changed since the repro: nothing trained or evaluated again (a run's summary
    holds its wall time; a stage's stamp is rewritten when it runs. The outputs' own times
    are DVC's: `dvc commit` links them from its cache again); the champion stays."""
    assert _default_variants(ws.api_url) == list(REGISTERED)
    watched = [ws.work / f".rcpipe/stamps/{s}.json" for s in
               ("evaluate-bidaf", "evaluate-qanet", "ensemble-ensemble", "report")]
    before = [_mtime(p) for p in watched]
    repro = _summaries(ws.work)
    # the flow's min_gain reaches the gate
    took, _ = ws.night("--param", "min_gain=0.5")
    print(f"\nnight 1 (nothing changed since the repro) took {took:.0f} s")
    assert _summaries(ws.work) == repro
    assert [_mtime(p) for p in watched] == before
    decisions = _decisions(s3)
    assert len(decisions) == 2 and decisions[-1]["promoted"] is False
    champion = ws.seen["champion"]
    assert _champion(s3) == champion
    _kept_against_itself(s3, decisions[-1], champion, ws.api_url)
    ws.seen |= {"night1": repro, "watched": dict(zip(watched, before, strict=True))}


def test_night_2_one_variants_params_changed_it_alone_trains_and_is_cancelled(
        ws: Workspace, join_local_ray: str, s3: Any) -> None:
    """qanet wider and longer: DVC finds its two stages stale, the night trains qanet alone
    and is cancelled once the new run has a checkpoint."""
    work, night1 = ws.work, ws.seen["night1"]
    ws.params["models"]["qanet"] |= {"hidden": 12, "max_steps": LONGER}
    ws.write_params()
    status = json.loads(sh(work, "dvc", "status", "--json").stdout)
    assert set(status) == {"train@qanet", "evaluate@qanet"}, status  # both list models.qanet
    ws.seen["digests"] = digests(work)
    free = _free_cpus(join_local_ray)  # the joined cluster before the night
    run_id = _deployment_run(ws.env, work, ws.s3_env, watch=False)
    assert isinstance(run_id, str)
    deadline = time.monotonic() + 400
    while not _recorded_step(work, "qanet", night1):
        assert time.monotonic() < deadline, "night 2 never checkpointed qanet's new run"
        time.sleep(0.2)
    t0 = time.monotonic()
    _cancel(ws.env, run_id)  # as `prefect flow-run cancel` does, without its ~2 s start-up
    _wait_until_final(ws.env, run_id)
    cancelled_s = time.monotonic() - t0
    stored = _stored(work)
    assert _summaries(work) == night1  # nothing put in place: qanet interrupted, bidaf idle
    assert not _new_runs(work, "bidaf", night1)
    assert len(_decisions(s3)) == 2 and _champion(s3) == ws.seen["champion"]  # unversioned
    assert cancelled_s < 30  # the flow's process group ended by itself: no runner's SIGKILL
    _nothing_left_on(join_local_ray, free)  # its Ray Train run aborted, its workers gone
    assert _stored(work) == stored  # no checkpoint stored after the flow run ended
    # read once the run's workers and controller are gone: a checkpoint a worker reported
    # as the cancellation landed is recorded by its controller after the flow run has ended
    resume = _resume_point(work, "qanet", night1)
    assert 0 < resume < LONGER
    print(f"night 2 cancelled: the flow run ended {cancelled_s:.1f} s after the "
          f"cancellation; qanet's run interrupted at step {resume} of {LONGER}")
    ws.seen["resume"] = resume


def test_night_3_resumes_the_cancelled_run_and_trains_nothing_else(
        ws: Workspace, s3: Any) -> None:
    work, night1 = ws.work, ws.seen["night1"]
    stamps = {p.name: _mtime(p) for p in ws.seen["watched"]}
    _, said = ws.night()
    # the training's lines (relayed from its Ray Train workers) reached the Prefect UI, each
    # under the training task's run
    _, lines = flow_run(ws.api_url, flow_run_id(said))
    progress = [line for line in lines if line.name == "rcpipe.train.progress"
                and "dev EM" in line.message]
    assert progress and {line.message.split(":")[0] for line in progress} == {"train qanet"}
    assert all(line.task_run_id is not None for line in progress)
    night3 = _summaries(work)
    assert night3["bidaf"] == night1["bidaf"]
    # the cancelled night's run of the new params, from the checkpoint it recorded last or,
    # if none, stored; not night 1's run
    (cancelled,) = _new_runs(work, "qanet", night1)
    assert night3["qanet"]["run"] == cancelled.name != night1["qanet"]["run"]
    assert night3["qanet"]["resumed_from_step"] == ws.seen["resume"], night3["qanet"]
    assert night3["qanet"]["steps"] == LONGER
    before, after = ws.seen["digests"], digests(work)
    changed = {path for path in before if after.get(path) != before[path]}
    assert {p for p in changed if p.startswith("models/")
            and not p.startswith("models/qanet/live/")} <= {  # live/: qanet's dev curve
        f"models/qanet/{name}" for name in ("model.pt", "summary.json", "metrics.json")}
    assert "models/qanet/model.pt" in changed
    # qanet evaluated again, and what reads it; bidaf's answers left as they were
    now = {p.name: _mtime(p) for p in ws.seen["watched"]}
    assert [n for n in now if now[n] != stamps[n]] == [
        "evaluate-qanet.json", "ensemble-ensemble.json", "report.json"]
    # what the night versioned is what DVC calls up to date
    assert json.loads(sh(work, "dvc", "status", "--json").stdout) == {}
    again = sh(work, "dvc", "repro")
    assert ran_stages(again.stdout) == set(), again.stdout
    decisions = _decisions(s3)
    assert len(decisions) == 3 and isinstance(decisions[-1]["promoted"], bool)
    assert decisions[-1]["reason"]
    ws.seen["night3"] = night3


def test_night_4_new_data_trains_both_anew_at_once(ws: Workspace, s3: Any) -> None:
    work, night3 = ws.work, ws.seen["night3"]
    train = json.loads((work / "data/synth/train.json").read_text())
    more = synth.generate(11, 4, 3, 3, version="1.1", title_prefix="t-more")
    synth.write({**train, "data": train["data"] + more["data"]}, work / "data/synth/train.json")
    ws.night()
    night4 = _summaries(work)
    for v in VOTERS:
        assert night4[v]["run"] != night3[v]["run"] and night4[v]["resumed_from_step"] == 0
    # two jobs fit the joined 2-CPU Ray at one CPU each: both voters trained at once
    (a0, a1), (b0, b1) = (_trained_during(work, v, night4) for v in VOTERS)
    assert a0 < b1 and b0 < a1, (a0, a1, b0, b1)
    assert all(_mtime(p) != t for p, t in ws.seen["watched"].items())
    decisions = _decisions(s3)
    assert len(decisions) == 4
    _nights_a_person_can_compare(work, ws.origin, decisions)


def test_a_champion_the_run_cannot_beat_stays(ws: Workspace, s3: Any) -> None:
    champion = _champion(s3)
    better = {**champion, "score": {**champion["score"], "f1": 101.0, "run": "best-ever"}}
    key = f"{PREFIX}/rcpipe/champion.json"
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(better))
    time.sleep(1)  # another run id (one per second)
    second = json.loads(sh(ws.work, "rcpipe", "version", "--promote").stdout)
    assert not second["promoted"]
    assert "does not beat the champion" in second["reason"] and "best-ever" in second["reason"]
    assert json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()) == better
    record = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/rcpipe/versions/{second['run']}/"
                                               "version.json")
    assert json.loads(record["Body"].read())["reason"] == second["reason"]


def _deployment_run(env: dict[str, str], work: Path, s3_env: dict[str, str],
                    watch: bool = True, *more: str) -> subprocess.CompletedProcess[str] | str:
    """One night: the finished command (``watch``), else the started flow run's id;
    ``more``: further --param arguments. The flow joins the Ray at env's RAY_ADDRESS."""
    cmd = [stack._prefect(), "deployment", "run", "train-all/local",
           "--param", f"params={work / 'params.yaml'}", "--param", f"workdir={work}",
           "--param", f"variants={json.dumps(VOTERS)}", "--param", "version=true",
           "--param", "synth_data=false", "--param", f"ray_address={env['RAY_ADDRESS']}",
           *more,
           "--job-variable", f"env={json.dumps(s3_env)}"]
    if not watch:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return flow_run_id(out.stdout)
    return subprocess.run(cmd + ["--watch", "--watch-interval", "1", "--watch-timeout", "900"],
                          env=env, capture_output=True, text=True, timeout=1000)


def _night(env: dict[str, str], work: Path, s3_env: dict[str, str], *more: str
           ) -> tuple[float, str]:
    t0 = time.monotonic()
    run = _deployment_run(env, work, s3_env, True, *more)
    assert isinstance(run, subprocess.CompletedProcess)
    assert run.returncode == 0 and "Completed" in run.stdout, \
        run.stdout[-3000:] + run.stderr[-3000:]
    return time.monotonic() - t0, run.stdout


def _version_keys(s3: Any) -> list[str]:
    """Every night's version record's key on the remote, oldest first (run names are
    times)."""
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/rcpipe/versions/")
    return sorted(o["Key"] for o in listed.get("Contents", [])
                  if o["Key"].endswith("/version.json"))


def _decisions(s3: Any) -> list[dict[str, Any]]:
    """Every night's version record on the remote, oldest first."""
    return [json.loads(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read())
            for k in _version_keys(s3)]


def _champion(s3: Any) -> dict[str, Any]:
    key = f"{PREFIX}/rcpipe/champion.json"
    return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _default_variants(api_url: str) -> list[str]:
    """The variants a `prefect deployment run train-all/local` with no --param trains, as the
    Prefect API holds the deployment's parameter schema and parameters."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as c:
        deployment = c.read_deployment_by_name("train-all/local")
    return deployment.parameters.get(
        "variants", deployment.parameter_openapi_schema["properties"]["variants"]["default"])


def _artifact(api_url: str, key: str) -> str:
    """The newest markdown artifact under ``key``, as the Prefect API holds it."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as c:
        found = c.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1)
    return str(found[0].data)


def _summaries(work: Path) -> dict[str, dict[str, Any]]:
    return {v: json.loads((work / f"models/{v}/summary.json").read_text()) for v in VOTERS}


def _mtime(path: Path) -> int:
    return path.stat().st_mtime_ns


def _stored(work: Path) -> set[str]:
    """Every checkpoint folder the voters' runs hold."""
    return {str(p.relative_to(work)) for v in VOTERS
            for p in work.glob(f"models/{v}/runs/run-*/step-*")}


def _trained_during(work: Path, variant: str, night: dict[str, dict[str, Any]]
                    ) -> tuple[float, float]:
    """(start, end) of ``variant``'s job on ``night``: its run's last checkpoint (their
    folders are no DVC output: `dvc commit` leaves their times alone) and its summary's wall
    seconds before it."""
    summary = night[variant]
    end = max(p.stat().st_mtime for p in
              (work / f"models/{variant}/runs/{summary['run']}").glob("step-*/meta.json"))
    return end - summary["wall_seconds"], end


def _free_cpus(address: str) -> float:
    """The CPUs free on the joined cluster (this process's Ray, at ``address``)."""
    import ray

    assert ray.get_runtime_context().gcs_address == address
    return ray.available_resources().get("CPU", 0.0)


def _nothing_left_on(address: str, free: float, timeout: float = 60) -> None:
    """The cancelled night left nothing holding the joined cluster: as many CPUs free as
    before it (its runs' workers and placement groups gone) and no Train controller left
    (one outlives its workers: it records a checkpoint they reported as the cancellation
    landed, seen 0 -> 4 after the CPUs were free), so the next night, or the next test on
    this Ray, finds it as it was."""
    deadline = time.monotonic() + timeout
    while (now := _free_cpus(address)) < free:
        assert time.monotonic() < deadline, f"{now:g} CPUs free, {free:g} before the night"
        time.sleep(0.5)
    # the joined Ray is local_ray, this process's: its raylet, and so every actor, below us
    while left := ray_nodes.actors("TrainController", psutil.Process()):
        assert time.monotonic() < deadline, f"Train controllers left: {left}"
        time.sleep(0.5)



def _kept_against_itself(s3: Any, night2: dict[str, Any], champion: dict[str, Any],
                         api_url: str) -> None:
    """Night 2's gate: the champion's own models against themselves, a difference of 0,
    kept at the flow's min_gain; the Prefect artifact says so with its interval."""
    gate = night2["gate"]
    assert gate["min_gain"] == 0.5 and gate["champion"]["run"] == champion["score"]["run"]
    assert (gate["diff"], gate["low"], gate["high"]) == (0.0, 0.0, 0.0)
    artifact = _artifact(api_url, "train-all-version")
    key = _version_keys(s3)[-1]
    assert artifact == decision_markdown(night2 | {"record": f"s3://{BUCKET}/{key}"})
    assert "**kept the champion**" in artifact and "+0.00 F1** [+0.00, +0.00] (95%" in artifact
    assert f"sha256 `{gate['set']['sha256']}`" in artifact and "min_gain 0.50" in artifact



def _nights_a_person_can_compare(work: Path, origin: Path,
                                 decisions: list[dict[str, Any]]) -> None:
    """Every night's commit on the git remote (`dvc metrics diff` between two nights), its
    report and the nights page behind a link a browser opens."""
    pushed = set(sh(origin, "git", "log", "--format=%H").stdout.split())
    assert all(d["git_push"]["pushed"] and d["git_commit"] in pushed for d in decisions)
    assert len({d["git_commit"] for d in decisions}) == 3  # night 1 changed no dvc.lock
    promoted = [d for d in decisions if d["promoted"]]
    # one GTO assignment per promotion on the git remote, newest first
    assert [p["commit"] for p in history(origin)] == [d["git_commit"] for d in promoted][::-1]
    # night 3 retrained qanet alone: its dev metrics moved, bidaf's did not
    night3 = decisions[2]["git_commit"]
    diff = json.loads(sh(work, "dvc", "metrics", "diff", f"{night3}~1", night3,
                         "--json").stdout)
    assert "metrics/qanet.json" in diff and "metrics/bidaf.json" not in diff

    last = decisions[-1]
    page = urllib.request.urlopen(last["nights_link"], timeout=30).read().decode()
    assert last["nights_link"].startswith("http://127.0.0.1")  # presigned, not a pod's path
    assert all(d["run"] in page for d in decisions) and "champion" in page
    report = urllib.request.urlopen(last["report_link"], timeout=30).read().decode()
    assert "rcpipe evaluation report" in report



def _new_runs(work: Path, variant: str, before: dict[str, dict[str, Any]]) -> list[Path]:
    """The storage of ``variant``'s runs other than ``before``'s."""
    return [run for run in work.glob(f"models/{variant}/runs/run-*")
            if run.name != before[variant]["run"]]


def _recorded_step(work: Path, variant: str, before: dict[str, dict[str, Any]]) -> int:
    """The latest checkpoint Ray Train's controller recorded for a run of ``variant`` other
    than ``before``'s; 0: none."""
    return max((step for run in _new_runs(work, variant, before)
                for step in ray_nodes.recorded_steps(run)), default=0)


def _resume_point(work: Path, variant: str, before: dict[str, dict[str, Any]]) -> int:
    """The step a resumed run of ``variant`` goes on from (train_job's Session.stored): the
    checkpoint its controller recorded last or, with none recorded, the newest whole one it
    stored (a worker stores a checkpoint before its controller records it: a cancellation
    landing between the two left qanet's step 4 stored, unrecorded); 0: none."""
    recorded = _recorded_step(work, variant, before)
    if recorded:
        return recorded
    stored = sorted((d for run in _new_runs(work, variant, before) for d in run.glob("step-*")
                     if step_of(d.name) is not None), key=lambda d: d.name, reverse=True)
    whole = first_whole(stored, lambda line: None)
    return step_of(whole.name) or 0 if whole is not None else 0


@contextmanager
def _client(env: dict[str, str]) -> Iterator[Any]:
    """A Prefect client of the stack's API (``env``'s)."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}), \
            get_client(sync_client=True) as client:
        yield client


def _cancel(env: dict[str, str], run_id: str) -> None:
    """Set the flow run Cancelling, as `prefect flow-run cancel` does: the worker sees it
    and sends the flow run's process group SIGTERM."""
    from prefect.states import Cancelling

    with _client(env) as client:
        client.set_flow_run_state(run_id, Cancelling())


def _wait_until_final(env: dict[str, str], run_id: str, timeout: float = 120) -> None:
    """Until the cancelled flow run is Cancelled (its process gone)."""
    deadline = time.monotonic() + timeout
    with _client(env) as client:
        while True:
            state = client.read_flow_run(run_id).state
            if state is not None and state.is_final():
                assert state.is_cancelled(), state
                return
            assert time.monotonic() < deadline, f"still {state}"
            time.sleep(1)
