"""Checkpoints on S3 (loopback): the store goes away in the middle of a run: a clear error,
no checkpoint left half-written in the run's record, and the same command, once the store
is back, resumes and finishes; a run of other settings with --force starts anew and the
first is pruned from the store. The run is DDP's, two workers:
each checkpoint holds both replicas' weight digests, equal after every step."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rcpipe import stages
from rcpipe.errors import RunError
from rcpipe.stages.train import _key
from rcpipe.train.runs import run_name
from tests.conftest import TINY_MODEL, SynthData, start_s3
from tests.planned_reads import planned_reads

pytestmark = pytest.mark.ray_train(3)  # tests/job_count.py; docs/dev/testing.md

VARIANT = "qanet"


@pytest.fixture
def own_s3(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A loopback S3 this test may stop and start again on the same port (moto keeps its
    buckets in this process, so what was written survives the outage)."""
    server, port, client = start_s3(monkeypatch, "outage", AWS_MAX_ATTEMPTS="2")
    state = {"server": server, "port": port, "client": client}
    yield state
    state["server"].stop()


@pytest.mark.trains
@pytest.mark.usefixtures("local_ray")
@pytest.mark.integration
def test_the_store_goes_down_mid_run_a_rerun_finishes_and_runs_resume_from_it(
        prepared_here, make_config, synth_v1: SynthData, own_s3: Any,  # noqa: ANN001
        caplog: pytest.LogCaptureFixture) -> None:
    """One run on the store for all of it: each Ray Train job costs ~20 CPU s before it
    trains (docs/dev/testing.md)."""
    from moto.server import ThreadedMotoServer

    # two workers, one CPU each, on the 2-CPU local Ray: DDP's replicas (the weights
    # compared below), as a cluster's job trains
    train = {"storage_path": "s3://outage/runs", "max_steps": 20, "eval_every": 4,
             "batch_size": 4, "epochs": 50, "max_failures": 1, "threads": 1,
             "num_workers": 2}
    cfg = prepared_here(models={VARIANT: TINY_MODEL}, train=train)
    s3 = own_s3["client"]

    def steps() -> list[str]:
        listed = s3.list_objects_v2(Bucket="outage", Prefix=f"runs/{VARIANT}/").get("Contents", [])
        return sorted(o["Key"] for o in listed)

    ended = threading.Event()

    def stop_after_the_first_checkpoint() -> None:
        # waits on the run, not on a clock: on a busy machine the first checkpoint may come
        # minutes after the start
        while not ended.is_set():
            if any(k.endswith("/state.pt") for k in steps()):
                own_s3["server"].stop()
                return
            time.sleep(0.1)

    stopper = threading.Thread(target=stop_after_the_first_checkpoint, daemon=True)
    stopper.start()
    try:
        with pytest.raises(RunError) as failed:
            stages.train(cfg, VARIANT)
    finally:
        ended.set()
        stopper.join()
    line = failed.value.line()
    assert line.startswith("error: s3://outage/runs: the checkpoint store failed (")
    assert "\n" not in line and failed.value.exit_code == 1
    assert not Path(f"models/{VARIANT}/model.pt").exists()  # no half-made model, no summary
    assert not Path(f"models/{VARIANT}/summary.json").exists()

    back = ThreadedMotoServer(ip_address="127.0.0.1", port=own_s3["port"], verbose=False)
    back.start()
    own_s3["server"] = back
    written = steps()
    for step in {k.rsplit("/", 1)[0] for k in written if "/step-" in k}:  # every step whole
        assert {f"{step}/{f}" for f in ("meta.json", "model.pt", "state.pt")} <= set(written)
    summary = stages.train(cfg, VARIANT)  # the same command, the store back
    assert summary["finished"] and summary["steps"] == 20
    assert summary["world_size"] == 2 and summary["replicas_in_sync"]
    # each Ray Train worker streamed its own rows (data/stream.py), none twice across the
    # two, and the rerun went on where each worker's stream was at its checkpoint
    assert summary["reads"] == planned_reads(cfg.data.out_dir, 4, cfg.train.seed, 2, 20)
    _replicas_held_identical_weights(s3, steps())
    assert Path(f"models/{VARIANT}/model.pt").is_file()
    print(f"\nstore stopped after checkpoint {written[-1]}; the rerun resumed from step "
          f"{summary['resumed_from_step']}")

    # the run lives on the store, named after its inputs: its checkpoints there, nothing
    # local but the model and the record of runs
    def stored_runs() -> set[str]:
        return {k.split("/")[2] for k in steps() if "/step-" in k}

    keys = set(steps())
    (name,) = stored_runs()
    assert name == summary["run"] and name.startswith("run-")
    assert f"runs/{VARIANT}/{name}/step-00000020/model.pt" in keys
    assert f"runs/{VARIANT}/{name}/step-00000020/state.pt" in keys
    assert not Path(f"models/{VARIANT}/runs").exists()
    # other settings (max_steps is keyed: rcpipe/fingerprints.py; shorter than the first, as
    # nothing asserted here needs its steps) with --force: a new run from step 0, said in
    # one line, the old one pruned from the store by train.keep_runs 1 (unkeyed) once the
    # new one finishes (what changed, in the line without --force: tests/test_fingerprints.py)
    other = make_config(synth_v1, train=train | {"max_steps": 8, "keep_runs": 1},
                        models={VARIANT: TINY_MODEL})
    # a checkpoint of these settings already on the store (as an earlier attempt would leave
    # it, here the first run's step 4): without --force the run would resume from it
    planted = f"runs/{VARIANT}/{run_name(_key(other, VARIANT))}/step-00000004"
    for key in [k for k in keys if f"/{name}/step-00000004/" in k]:
        s3.copy_object(Bucket="outage", Key=f"{planted}/{key.rsplit('/', 1)[1]}",
                       CopySource={"Bucket": "outage", "Key": key})
    with caplog.at_level("INFO", logger="rcpipe.cluster.train_run"):
        anew = stages.train(other, VARIANT, force=True)
    assert planted.split("/")[2] == anew["run"]
    assert anew["resumed_from_step"] == 0 and anew["steps"] == 8 and anew["run"] != name
    assert f"--force: training anew ({anew['run']})" in caplog.text  # forgotten, not resumed
    assert stored_runs() == {anew["run"]}
    record = json.loads(Path(f"models/{VARIANT}/runs.json").read_text())
    assert [r["name"] for r in record["runs"]] == [anew["run"]]


def _replicas_held_identical_weights(s3: Any, keys: list[str]) -> None:
    """Each rank hashed its own weights into every checkpoint's meta; DDP kept them bitwise
    equal, and they moved between two checkpoints (so equal is not trivially equal)."""
    metas = [json.loads(s3.get_object(Bucket="outage", Key=k)["Body"].read())
             for k in keys if k.endswith("/meta.json")]
    assert len(metas) >= 2
    for meta in metas:
        assert len(meta["replica_digests"]) == 2, meta["step"]
        assert meta["replica_digests"][0] == meta["replica_digests"][1], meta["step"]
    assert len({m["replica_digests"][0] for m in metas}) == len(metas)


def test_a_run_error_is_one_line_and_exit_code_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from rcpipe import cli

    def store_gone(*_: object, **__: object) -> None:
        raise RunError("s3://b/runs", "", "the checkpoint store failed (AWS Error ...)")

    monkeypatch.setattr(stages, "train", store_gone)
    with pytest.raises(SystemExit) as done:
        cli.main(["train", "bidaf"])
    assert done.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: s3://b/runs: the checkpoint store failed (AWS Error ...)"]
