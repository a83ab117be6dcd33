"""Scheduled retraining tested as nights: `prefect deployment run train-all/local` with
version=True, on a real Prefect server and worker, a Ray cluster the flow joins
(``ray_address``: the pytest worker's local Ray, as a nightly joins its team's cluster) and
the S3 endpoint on loopback (the DVC remote), night after night in one DVC workspace:

1. trains both voters, versions, crowns the first champion;
2. nothing changed: trains nothing, evaluates nothing, in a fraction of night 1's time;
   the champion stays;
3. new training data (more articles) and longer runs, cancelled mid-training: the flow
   run ends by itself (its Ray Train runs aborted through their controllers:
   rcpipe/cluster/run_abort.py), well before Prefect's SIGKILL, leaves nothing running on
   the cluster it joined, stores no checkpoint after it ended and puts no model in place;
4. the same data again: the cancelled night's checkpoints resume, the rest trains anew on
   the new data, everything is evaluated again and the gate decides;
5. one variant's params changed: only it trains.

Each night's versioning is checked where it happens: night 1 commits dvc.lock, pushes data
and models to the remote and crowns the first champion on prepare's held-out questions
(never dev); night 2, with the flow's min_gain, keeps it (the same models: a difference of
0), and the Prefect artifact gives the decision with its interval.

The voters are two (one recurrent, one convolutional): every variant's own path is
covered by tests/integration/test_dvc_s3.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from flows import stack
from flows.version import decision_markdown
from rcpipe.config import VARIANTS
from rcpipe.data import synth
from rcpipe.stages.champions import history
from rcpipe.train.checkpoint import first_whole
from tests import ray_nodes
from tests.conftest import AWS_WORKER_ENV, SynthData, questions_of
from tests.dvc_project import BUCKET, make_project, sh

pytestmark = [pytest.mark.integration, pytest.mark.trains, pytest.mark.slow,
              pytest.mark.ray_train(7)]

VOTERS = ["bidaf", "qanet"]
PREFIX = "nights"
# checkpoints every 4 steps of 24, so a cancelled night leaves some behind (the 24 steps
# are ~3 s of a ~20 s run: the rest is Ray Train's start-up, which fewer steps do not cut).
# One CPU a worker: the joined Ray (tests/conftest.py's local_ray, 2 CPUs) trains both voters
# at once (rcpipe.cluster.train_job.jobs_that_fit) instead of one after the other, ~15 s less a
# night that trains both; where and how fast to train is no key dvc.yaml tracks (nor a
# run's fingerprint), so no night's decision depends on it
TRAIN = {"max_steps": 24, "eval_every": 4, "batch_size": 4, "epochs": 50,
         "cpus_per_worker": 1}
LONGER = 48  # the max_steps of nights 3 to 5 (see night 3)


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
        found = re.search(r"UUID:?\s*([0-9a-f-]{36})|id[^0-9a-f]*([0-9a-f-]{36})",
                          out.stdout)
        assert found, out.stdout
        return found.group(1) or found.group(2)
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


def test_four_nights_and_a_cancelled_one_train_only_what_changed(
        prefect_stack: dict, tmp_path: Path, synth_v1: SynthData, s3: Any,
        join_local_ray: str) -> None:
    assert _default_variants(str(prefect_stack["api_url"])) == list(VARIANTS)
    work = make_project(tmp_path / "work", synth_v1, prefix=PREFIX)
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["train"] |= TRAIN
    params["models"] = {v: params["models"][v] for v in VOTERS}
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    origin = tmp_path / "origin.git"  # the team's git remote: each night's commit goes there
    sh(tmp_path, "git", "init", "-q", "--bare", str(origin))
    sh(work, "git", "remote", "add", "origin", str(origin))
    sh(work, "git", "push", "-q", "origin", "HEAD")
    env = stack.server_env(tmp_path / "client", str(prefect_stack["api_url"]))
    assert env["RAY_ADDRESS"] == join_local_ray  # the flows join it (_deployment_run)
    s3_env = {**AWS_WORKER_ENV, "AWS_ENDPOINT_URL": s3.meta.endpoint_url,
              # the joined Ray asks for its token (Ray turned token auth on in this process
              # as it started local_ray; the flow run's process, a child of the Prefect
              # worker started before it, is told so as a nightly's environment would be)
              **{k: os.environ[k] for k in ("RAY_AUTH_MODE",) if k in os.environ}}

    # night 1: trains, versions, promotes
    first_s, _ = _night(env, work, s3_env)
    night1 = _summaries(work)
    assert all(s["finished"] and s["resumed_from_step"] == 0 for s in night1.values())
    # two jobs fit the joined 2-CPU Ray at one CPU each: both voters trained at once
    (a0, a1), (b0, b1) = (_trained_during(work, v, night1) for v in VOTERS)
    assert a0 < b1 and b0 < a1, (a0, a1, b0, b1)
    (decided,) = _decisions(s3)
    assert decided["promoted"] is True
    champion = _champion(s3)
    _first_champion(work, s3, champion, str(prefect_stack["api_url"]))
    for name in (*VOTERS, "ensemble"):
        result = json.loads((work / f"metrics/{name}.json").read_text())
        # the official v1.1 keys; the ensemble's also its method and every method's scores
        assert set(result) == {"exact_match", "f1"} | (
            {"method", "methods"} if name == "ensemble" else set())
        if name == "ensemble":  # the nights' evaluate keeps distributions: all three scored
            # the answers given are params.yaml's method's (tests/dvc_project.py: selected)
            assert result["method"] == "selected"
            assert set(result["methods"]) == {"vote", "mean", "selected"}
            assert result["f1"] == result["methods"]["selected"]["f1"]
        answers = json.loads((work / f"predictions/{name}.json").read_text())
        assert len(answers) == len(questions_of(synth_v1.dev_doc))

    # night 2: nothing changed: nothing trained or evaluated again; the champion stays
    # (a run's summary holds its wall time; a stage's stamp is rewritten when it runs. The
    # outputs' own times are DVC's: `dvc commit` links them from its cache again)
    watched = [work / f".rcpipe/stamps/{s}.json" for s in
               ("evaluate-bidaf", "evaluate-qanet", "ensemble-ensemble", "report")]
    before = [_mtime(p) for p in watched]
    # the flow's min_gain reaches the gate
    second_s, _ = _night(env, work, s3_env, "--param", "min_gain=0.5")
    assert _summaries(work) == night1
    assert [_mtime(p) for p in watched] == before
    decisions = _decisions(s3)
    assert len(decisions) == 2 and decisions[-1]["promoted"] is False
    assert _champion(s3) == champion
    _kept_against_itself(s3, decisions[-1], champion, str(prefect_stack["api_url"]))
    print(f"\nnight 2 (nothing changed) took {second_s:.0f} s, night 1 {first_s:.0f} s: "
          f"{second_s / first_s:.2f}x")
    assert second_s < 0.6 * first_s

    # night 3: more training articles and longer runs (from a run's first checkpoint to its
    # end then takes longer than a cancellation takes to land, on a slow machine too);
    # cancelled once a new run has a checkpoint
    params["train"]["max_steps"] = LONGER
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    train = json.loads((work / "data/synth/train.json").read_text())
    more = synth.generate(11, 4, 3, 3, version="1.1", title_prefix="t-more")
    synth.write({**train, "data": train["data"] + more["data"]}, work / "data/synth/train.json")
    free = _free_cpus(join_local_ray)  # the joined cluster before the night
    run_id = _deployment_run(env, work, s3_env, watch=False)
    assert isinstance(run_id, str)
    deadline = time.monotonic() + 400
    while not _a_new_run_checkpointed(work, night1):
        assert time.monotonic() < deadline, "night 3 never checkpointed a new run"
        time.sleep(0.5)
    t0 = time.monotonic()
    _cancel(env, run_id)  # as `prefect flow-run cancel` does, without its ~2 s start-up
    _wait_until_final(env, run_id)
    cancelled_s = time.monotonic() - t0
    stored = _stored(work)
    night3 = _summaries(work)
    # a run that finished before the cancellation landed is in place, whole, on the new data
    interrupted = [v for v in VOTERS if night3[v] == night1[v]]
    for v in set(VOTERS) - set(interrupted):
        assert night3[v]["finished"] and night3[v]["steps"] == LONGER, night3[v]
    assert interrupted  # the run that set the cancellation off had 44 steps to go
    assert len(_decisions(s3)) == 2 and _champion(s3) == champion  # nothing versioned
    assert cancelled_s < 30  # the flow's process group ended by itself: no runner's SIGKILL
    _nothing_left_on(join_local_ray, free)  # its Ray Train runs aborted, their workers gone
    assert _stored(work) == stored  # no checkpoint stored after the flow run ended
    # read once the runs' workers and controllers are gone: a checkpoint a worker reported
    # as the cancellation landed is recorded by its controller after the flow run has ended
    resumes = {v: _resume_point(work, v, night1) for v in interrupted}
    print(f"night 3 cancelled: the flow run ended {cancelled_s:.1f} s after the "
          f"cancellation; runs interrupted at the steps {resumes} of {LONGER}")

    # night 4: the cancelled night's runs resume; every variant ends on the new data
    _night(env, work, s3_env)
    night4 = _summaries(work)
    for v in VOTERS:
        assert night4[v]["run"] != night1[v]["run"]  # trained on the new data
        assert night4[v]["steps"] == LONGER
    for v in interrupted:  # from the last checkpoint night 3 recorded or, if none, stored
        assert night4[v]["resumed_from_step"] == resumes[v], (v, night4[v], resumes)
    for v in set(VOTERS) - set(interrupted):
        assert night4[v] == night3[v]  # not trained again
    assert all(_mtime(p) != t for p, t in zip(watched, before, strict=True))
    decisions = _decisions(s3)
    assert len(decisions) == 3 and isinstance(decisions[-1]["promoted"], bool)
    assert decisions[-1]["reason"]

    # night 5: qanet's params changed: qanet alone trains
    params["models"]["qanet"]["hidden"] = 12
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _, out = _night(env, work, s3_env)
    night5 = _summaries(work)
    assert night5["bidaf"] == night4["bidaf"]
    assert night5["qanet"]["run"] != night4["qanet"]["run"]
    assert night5["qanet"]["resumed_from_step"] == 0
    decisions = _decisions(s3)
    assert len(decisions) == 4
    _nights_a_person_can_compare(work, origin, decisions)


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


def _first_champion(work: Path, s3: Any, crowned: dict[str, Any], api_url: str) -> None:
    """Night 1 versioned what it produced: dvc.lock committed and on the remote, data and
    models pushed, the first champion crowned on prepare's held-out questions."""
    assert crowned["score"]["model"] in (*VOTERS, "ensemble")
    key = crowned["dvc_lock"].removeprefix(f"s3://{BUCKET}/")
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == \
        (work / "dvc.lock").read_bytes()
    assert "dvc.lock" in sh(work, "git", "show", "--name-only", "--format=", "HEAD").stdout
    heldout = work / "data/prepared/heldout.json"  # the gate set, never the dev set
    gate = crowned["gate"]
    assert gate["set"]["source"] == "heldout" and gate["champion"] is None
    assert gate["set"]["sha256"] == hashlib.sha256(heldout.read_bytes()).hexdigest()
    questions = sum(len(p["qas"]) for a in json.loads(heldout.read_text())["data"]
                    for p in a["paragraphs"])
    assert gate["questions"] == questions > 0
    assert "no champion yet" in _artifact(api_url, "train-all-version")
    produced = ["fetch", "prepare", *(f"{s}@{v}" for v in VOTERS for s in ("train", "evaluate"))]
    assert json.loads(sh(work, "dvc", "status", "--json", *produced).stdout) == {}
    assert json.loads(sh(work, "dvc", "status", "--cloud", "--json", *produced).stdout) == {}


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
    assert len({d["git_commit"] for d in decisions}) == 3  # night 2 changed no dvc.lock
    promoted = [d for d in decisions if d["promoted"]]
    # one GTO assignment per promotion on the git remote, newest first
    assert [p["commit"] for p in history(origin)] == [d["git_commit"] for d in promoted][::-1]
    # night 5 retrained qanet alone: its dev metrics moved, bidaf's did not
    diff = json.loads(sh(work, "dvc", "metrics", "diff", "HEAD~1", "HEAD", "--json").stdout)
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
    stored = sorted((d for run in _new_runs(work, variant, before)
                     for d in run.glob("step-" + "[0-9]" * 8)), key=lambda d: d.name,
                    reverse=True)
    whole = first_whole(stored, lambda line: None)
    return int(whole.name[5:]) if whole is not None else 0


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


def _a_new_run_checkpointed(work: Path, before: dict[str, dict[str, Any]]) -> bool:
    """Whether a variant's run other than ``before``'s has recorded a checkpoint."""
    return any(_recorded_step(work, v, before) for v in before)


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
