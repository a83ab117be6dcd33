"""`prefect deployment run train-all/local` against a real Prefect server, worker and a Ray
cluster of two nodes (the same deployment night after night, on the flow's own local Ray, is
tests/integration/test_nights.py).

The stack is the one `make up` starts (flows/stack.py), with a temporary PREFECT_HOME for
the server and another for the client, on a free port of 127.0.0.1 (one stack for the
module).

The distributed path on one machine: the same command against a Ray cluster of two nodes on
this machine (`ray start --head` with the Jobs API, a second `ray start --address` with its own
temp dir and ports), checkpoints on the loopback S3. The variant's Ray job trains on the second
node; that node's raylet is SIGKILLed mid-training; the run resumes from its last checkpoint
on the head and finishes with the outputs an undisturbed run gives. A second variant of the
same flow run fails (its size cannot build, found by its Ray job before training): the flow
run fails naming it, the other variant trains on regardless (the rerun that trains what
failed and skips what finished: the nights' cancelled night and its resume).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flows import stack
from tests import ray_nodes
from tests.conftest import (
    AWS_WORKER_ENV,
    RESUMED_TRAIN,
    RESUMED_VARIANT,
    TINY_MODEL,
    Prepared,
    SynthData,
    questions_of,
    write_params,
)
from tests.flow_runs import flow_run, flow_run_id

pytestmark = [pytest.mark.trains, pytest.mark.ray_train(1)]

# the run tests/conftest.py's `undisturbed` trained, with the cluster's settings on top
TRAIN = RESUMED_TRAIN | {"max_failures": 2, "cpus_per_worker": 1}


def _checkpoints(s3: Any, prefix: str) -> list[int]:
    listed = s3.list_objects_v2(Bucket="rcpipe-test", Prefix=prefix).get("Contents", [])
    return sorted({int(o["Key"].split("step-")[1][:8]) for o in listed
                   if "/step-" in o["Key"] and o["Key"].endswith("/state.pt")})


def _lose_the_training_node(s3: Any, head: ray_nodes.Node, second: ray_nodes.Node,
                            hold: subprocess.Popen[str], seen: dict[str, Any],
                            ended: threading.Event) -> None:
    """After the first checkpoint: free the head, SIGKILL the second node's raylet; then time
    until a new training worker (the restarted group's, on the head) runs. It waits on the
    run (`ended`), not on a clock: on a busy machine each of these comes minutes late."""
    while not (steps := _checkpoints(s3, f"deploy/{RESUMED_VARIANT}/run-")):
        if ended.is_set():
            return
        time.sleep(0.2)
    on_head = head.raylet()  # its workers are the raylet's children
    before = {p.pid for p in ray_nodes.train_workers(on_head)}
    hold.kill()
    second.raylet().kill()
    seen |= {"killed_at": time.monotonic(), "last_before": max(steps)}
    while not {p.pid for p in ray_nodes.train_workers(on_head)} - before:
        if ended.is_set():
            return
        time.sleep(0.1)
    seen["recovered_s"] = time.monotonic() - seen["killed_at"]


@pytest.mark.integration
@pytest.mark.slow
def test_a_deployment_run_loses_the_training_node_and_finishes_as_undisturbed(
        prefect_stack: dict, s3: Any, tmp_path: Path, synth_v1: SynthData,
        prepared: Prepared, undisturbed: dict[str, Any]) -> None:
    variant = RESUMED_VARIANT
    params = write_params(tmp_path / "params.yaml", train=TRAIN,
                          models={variant: TINY_MODEL, "qanet": TINY_MODEL},
                          data={"train_file": str(synth_v1.train),
                                "dev_file": str(synth_v1.dev)})
    env = ray_nodes.node_env({**AWS_WORKER_ENV, "AWS_ENDPOINT_URL": s3.meta.endpoint_url})
    short = Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp"))  # Ray's sockets: <= 107 bytes
    head, gcs, jobs_api = ray_nodes.start_head(short / "head", env, cpus=1)
    nodes = [head]
    work, seen, ended, killer = tmp_path / "work", {}, threading.Event(), None
    try:
        second = ray_nodes.start(short / "second", env, "--address", gcs, "--num-cpus", "1")
        nodes.append(second)
        hold = ray_nodes.hold_the_head(gcs, env)  # the job's worker starts on node 2
        killer = threading.Thread(target=_lose_the_training_node,
                                  args=(s3, head, second, hold, seen, ended), daemon=True)
        killer.start()
        run = subprocess.run(
            [stack._prefect(), "deployment", "run", "train-all/local",
             "--param", f"params={params}", "--param", f"workdir={work}",
             "--param", "synth_data=false", "--param", f'variants=["{variant}", "qanet"]',
             # qanet cannot be built with 3 heads on 8 dimensions: that variant fails
             "--param", 'overrides=["models.qanet.heads=3"]',
             "--param", f"ray_address={jobs_api}",
             "--param", "storage_path=s3://rcpipe-test/deploy",
             "--watch", "--watch-interval", "1", "--watch-timeout", "900"],
            env=stack.server_env(tmp_path / "client", str(prefect_stack["api_url"])),
            capture_output=True, text=True, timeout=1000)
    finally:
        ended.set()
        if killer is not None:
            killer.join()
        ray_nodes.stop_all(nodes)
    state, lines = flow_run(str(prefect_stack["api_url"]), flow_run_id(run.stdout))
    assert run.returncode == 1 and state.state.is_failed(), run.stdout[-3000:] + \
        run.stderr[-3000:]
    assert "1 variant(s) failed: qanet: " in state.state.message, state.state.message
    assert not (work / "models/qanet/summary.json").exists()
    assert "recovered_s" in seen, "the second node was never lost mid-training"
    resumed = json.loads((work / f"models/{variant}/summary.json").read_text())
    # from the newest checkpoint (one stored after the kill was decided may be newer still)
    assert resumed["steps"] == TRAIN["max_steps"]
    assert seen["last_before"] <= resumed["resumed_from_step"] < TRAIN["max_steps"]
    answers = json.loads((work / f"predictions/{variant}.json").read_text())
    assert len(answers) == len(questions_of(synth_v1.dev_doc))
    # the flow followed the jobs: their submission and own lines are in Prefect, each under
    # the training task's run
    relayed = [line for line in lines if line.name == "rcpipe.cluster.jobs_api"]
    assert all(line.task_run_id is not None for line in relayed)
    assert any(f"train {variant}: submitted Ray job" in line.message for line in relayed)
    assert any(f"train {variant}:" in line.message and "dev EM" in line.message
               for line in relayed)
    # qanet's job said why in one line, naming the key in the submitter's params file
    assert any(f"error: {params}: models.qanet" in line.message for line in relayed), \
        [line.message for line in relayed if "qanet" in line.message]

    # the same params, undisturbed, in one process (`undisturbed`, shared with test_kills.py's
    # test, trained on `prepared`: the data this flow prepared, byte for byte): the same
    # steps, the same dev F1 within noise (the data order, optimizer, EMA and RNG streams
    # resume with the checkpoint)
    for name in ("vocab.json", "train/part-00000.parquet", "dev/part-00000.parquet"):
        assert (work / "data/prepared" / name).read_bytes() == \
            (prepared.out_dir / name).read_bytes(), name
    assert undisturbed["steps"] == resumed["steps"]
    # the lost node's worker's stream went on where its checkpoint was (data/stream.py)
    assert resumed["reads"] == undisturbed["reads"]
    assert resumed["best_dev_f1"] == pytest.approx(undisturbed["best_dev_f1"], abs=2.0)
    print(f"\nnode lost with checkpoint step {seen['last_before']} stored; resumed from "
          f"step {resumed['resumed_from_step']} (a checkpoint every {TRAIN['eval_every']} "
          f"steps and at each epoch's end); a new training worker {seen['recovered_s']:.1f} s"
          f" after the kill; dev F1 {resumed['best_dev_f1']:.2f} vs undisturbed "
          f"{undisturbed['best_dev_f1']:.2f}")
