"""The GPU kit's dry run: bench/gpu/run.py's three calls on the CPU over a tiny kit, in a
Python that imports only what the GPU box has (bench/gpu/box.py), then bench/gpu/table.py.

Between lent sessions nothing else runs the kit, so this keeps it from rotting: every step
(setup with Ray's archive arriving in two parts, the detached trainings, the audit, the Ray
Train job killed and resumed, evaluation with held-out thresholds and the ensemble, speed,
the compiled steps) runs as on the box, only small.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.gpu import box
from bench.gpu.build import pack, sha256
from tests.conftest import TINY_MODEL, Prepared, write_params

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("bidaf", "qanet")  # an RNN variant and QANet: two voters for the ensemble
TRAIN_STEPS, RAY_STEPS = 4, 30
# the box's train.buckets (the repo's params.yaml): its batches padded to these few shapes, as
# there; unbucketed, each of the tiny epoch's batches was a shape of its own, each compiled
# twice (default, reduce-overhead): ~45 s of the test's 200 on 2 busy cores
BUCKETS = yaml.safe_load((ROOT / "params.yaml").read_text())["train"]["buckets"]


def mid_epoch_every(prepared: Prepared, batch: int, steps: int) -> int:
    """A checkpoint interval none of whose steps up to ``steps`` is an epoch's last, as on the
    box (200 steps, every 50, ~250-step epochs). Chosen while a run resumed from such a step
    saved it a second time (Worker.resume did not restore saved_step; fixed, and tested in
    tests/train/test_local.py), kept so the kill, which lands where it lands, resumes from a
    mid-epoch checkpoint as the box's does."""
    from rcpipe.data.dataset import SquadDataset
    from rcpipe.train.worker import train_batches

    data = SquadDataset.from_parquet(prepared.out_dir / "train.parquet",
                                     buckets=(BUCKETS["context"], BUCKETS["question"]))
    epoch = len(train_batches(data, batch, seed=0, world=1))
    return next(e for e in range(3, steps) if all(s % epoch for s in range(e, steps + 1, e)))


def tiny_kit(root: Path, prepared: Prepared) -> Path:
    """gpu-kit/'s layout over the session's prepared synthetic split; a stand-in package
    ('kitprobe') where Ray's archive would be, packed and cut in two as build.py packs Ray."""
    kit = root / "gpu-kit"
    v1 = kit / "base" / "v1.1"
    shutil.copytree(prepared.out_dir, v1 / "prepared")
    shutil.copyfile(prepared.data.dev, v1 / "test.json")
    (root / "src" / "kitprobe").mkdir(parents=True)
    (root / "src" / "kitprobe" / "__init__.py").write_text("ARRIVED = True\n")
    archive = root / "kitprobe.tar.xz"
    parts = pack(root / "src", archive, 2, [kit / "ray-1", kit / "ray-2"])
    (kit / "base" / "manifest.json").write_text(json.dumps({"ray": {
        "wheel": "kitprobe", "archive": archive.name, "archive_sha256": sha256(archive),
        "parts": [str(p.relative_to(root)) for p in parts]}}))
    return kit


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.slow
def test_the_kit_runs_every_step_on_the_cpu(tmp_path: Path, prepared: Prepared) -> None:
    kit = tiny_kit(tmp_path, prepared)
    params = write_params(tmp_path / "params.yaml", train={"batch_size": 8, "buckets": BUCKETS},
                          models=dict.fromkeys(VARIANTS, TINY_MODEL))
    env_dir = tmp_path / "box"
    box.stand_in(env_dir)
    # no RAY_ADDRESS: `rcpipe train` starts its own local Ray, as on the box, whose worker
    # imports as the box would too
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "PYTHONPATH": str(env_dir), "OMP_NUM_THREADS": "1"}
    second_part = kit / "ray-2"
    held = shutil.move(second_part, tmp_path / "ray-2")  # call 1 carries the first part only

    def call(n: str) -> Path:
        out = tmp_path / f"out-{n}"
        done = subprocess.run(
            [sys.executable, "bench/gpu/run.py", n, "--device", "cpu", "--kit", str(kit),
             "--state", str(tmp_path / "state"), "--out", str(out), "--params", str(params),
             "--variants", *VARIANTS, "--train-steps", str(TRAIN_STEPS), "--eval-every", "2",
             "--batch", "8", "--ray-steps", str(RAY_STEPS),
             "--ray-eval-every", str(mid_epoch_every(prepared, 8, RAY_STEPS)),
             "--compile-variants", "qanet",
             "--speed-steps", "2", "--speed-repeats", "1", "--speed-warmup", "1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return out

    out1 = call("1")
    shutil.move(held, second_part)  # call 2 carries the second
    out2, out3 = call("2"), call("3")

    def read(out: Path, name: str) -> dict:
        return json.loads((out / f"{name}.json").read_text())

    assert read(out1, "setup")["ray"] == "1 of 2 parts on the box"
    assert read(out2, "setup")["ray"] == "installed"
    # the stand-in held: the trainings ran without dvclive, as on the box
    assert "not on the GPU box" in (tmp_path / "state/runs/v1.1/qanet.log").read_text()
    assert (tmp_path / "state" / "site" / "kitprobe" / "__init__.py").is_file()
    for out, steps in ((out1, {"setup", "train", "audit"}),
                       (out2, {"setup", "ray", "wait", "evaluate"}),
                       (out3, {"setup", "wait", "evaluate", "speed", "compiled"})):
        call_json = read(out, f"call-{out.name[-1]}")
        assert {s for s, r in call_json["steps"].items() if r["ok"]} == steps, call_json
        assert (out / f"call-{out.name[-1]}.json").is_file()

    audit = read(out1, "audit")["results"]
    assert set(audit) == set(VARIANTS)
    assert all(a["graphs"] >= 1 and a["kernels_per_step"] > 0 for a in audit.values())

    ray = read(out2, "ray")  # killed after a registered checkpoint, resumed from it
    assert ray["status"] == "done" and ray["backend"] == "gloo" and ray["world_size"] == 1
    assert 0 < ray["resumed_from_step"] < ray["steps"] == RAY_STEPS

    acc = read(out2, "accuracy")["versions"]["1.1"]
    assert acc["missing"] == [] and set(acc["variants"]) == set(VARIANTS)
    for v in acc["variants"].values():
        assert v["steps"] == TRAIN_STEPS and 0 <= v["test_f1"] <= 100
    assert 0 <= acc["ensemble"]["f1"] <= 100
    assert all(r["status"] == "done" for r in read(out2, "wait")["runs"])

    speed = read(out3, "speed")["results"]
    assert all(speed[v]["fp32"]["examples_per_s"] > 0 for v in VARIANTS)
    compiled = read(out3, "compiled")
    assert compiled["backend"] == "aot_eager"
    assert {m: r["examples_per_s"] > 0 for m, r in compiled["results"]["qanet"].items()} \
        == dict.fromkeys(("off", "default", "reduce-overhead"), True)

    table = subprocess.run([sys.executable, "bench/gpu/table.py", str(out1), str(out2),
                            str(out3)], cwd=ROOT, capture_output=True, text=True, check=True)
    text = table.stdout
    assert "CPU" in text.splitlines()[0]  # the device named
    assert "| `qanet` |" in text and "| ensemble |" in text
    assert "resumed from step" in text
    assert "| QANet >= 2,000 training examples/s |" in text
    assert "every target stays open" in text and "| met |" not in text


def test_the_table_weighs_gpu_figures_against_the_targets() -> None:
    """On a GPU each target is met or not met where measured, open where not."""
    from bench.gpu.table import render, targets

    def rate(x: float, **more: float) -> dict:
        return {"examples_per_s": x, "step_ms": 32000 / x} | more

    r = {"setup": {"gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "torch": "2.11.0",
                   "cuda": "13.0", "python": "3.12.3", "cpus": 16, "params": "params.yaml"},
         "speed": {"batch": 32, "results": {
             "qanet": {"fp32": rate(1500.0, gpu_busy=0.8, peak_mib=9000.0),
                       "bf16": rate(1800.0)},
             "rnet": {"fp32": rate(400.0)}, "rnet_mult": {"fp32": rate(1700.0)}}},
         "compiled": {"backend": "inductor", "results": {
             "qanet": {"off": rate(1600.0), "reduce-overhead": rate(2400.0)}}},
         "accuracy": {"minutes": 12, "steps": 0, "versions": {"1.1": {
             "abstain_all_f1": None, "ensemble": {"f1": 51.0, "exact_match": 40.0},
             "variants": {"qanet": {"test_f1": 44.0, "test_em": 33.0, "steps": 9000},
                          "bidaf": {"test_f1": 46.5, "test_em": 35.0, "steps": 7000}}}}}}
    assert [s for _, _, s in targets(r)] == [
        "met",        # QANet 2,400 ex/s (reduce-overhead)
        "met",        # 2,400 / 400 = 6x
        "not met",    # 1,700 / 400 = 4.25x
        "not met",    # bf16 1.2x
        "met",        # 80% busy
        "met",        # bidaf 46.5 in 12 minutes
        "met",        # ensemble 51
        "open"]       # no v2.0
    text = render(r)
    assert text.startswith("GPU kit results on NVIDIA H100 80GB HBM3")
    assert "| QANet >= 2,000 training examples/s | 2,400 ex/s (step reduce-overhead) | met |" \
        in text
