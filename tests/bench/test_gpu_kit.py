"""The GPU kit's dry run: bench/gpu/run.py's two calls (bench/gpu/plan.json) on the CPU over a
tiny kit, in a Python that imports only what the GPU box has (bench/gpu/box.py), the draw
recorded (bench/gpu/results.py), then bench/gpu/table.py; and the plan held to one draw's
device-minutes and a call's carry.

Between lent sessions nothing else runs the kit, so this keeps it from rotting: every step
(setup with Ray's slimmed archive carried by call 2 only, speed, the compiled step in its
capped child, the trainings for the minutes left, evaluation with held-out thresholds and the
ensemble, the Ray Train job killed and resumed, bench/peers.py beside a stand-in peer, the
audit, and call 3's bench/peer_accuracy.py over build.py's shared-vectors folder) runs as on
the box, only small.
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

from bench.gpu import box, results
from bench.gpu.build import pack
from bench.gpu.run import CALLS
from rcpipe.reads import sha256_of
from tests.conftest import TINY_MODEL, Prepared, write_params

pytestmark = pytest.mark.ray_train(2)  # tests/job_count.py; docs/dev/testing.md

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
    from rcpipe.data.stream import TrainStream

    epoch = len(TrainStream.of(prepared.out_dir, batch, buckets=(
        BUCKETS["context"], BUCKETS["question"])).epoch(0))
    return next(e for e in range(3, steps) if all(s % epoch for s in range(e, steps + 1, e)))


def tiny_kit(root: Path, prepared: Prepared) -> Path:
    """gpu-kit/'s layout over the session's prepared synthetic split; a stand-in package
    ('kitprobe') where Ray's slimmed archive would be, packed as build.py packs Ray; a
    stand-in shaped as chrischute/squad's BiDAF where its archive would be, beside a small
    real-text batch (the real peers are not in a user's clone), and call 3's folder as
    build.py prepares it, over a synthetic article split."""
    from bench.gpu.build import peer_accuracy_data
    from bench.peer_text import read_text_batch, save_text_batch
    from rcpipe.data import synth
    from tests.bench.peer_stand_in import chrischute
    from tests.bench.test_peers import article

    kit = root / "gpu-kit"
    v1 = kit / "base" / "v1.1"
    shutil.copytree(prepared.out_dir, v1 / "prepared")
    shutil.copyfile(prepared.data.dev, v1 / "test.json")
    peers = kit / "base" / "peers"
    chrischute(peers / box.PEERS["bidaf"][2])
    split = root / "split"
    split.mkdir()
    for name, seed, articles in (("train", 13, 6), ("test", 14, 2)):
        synth.write(synth.generate(seed, articles, 3, 4, title_prefix=f"t-{name}",
                                   facts_per_paragraph=(2, 3)), split / f"{name}-v1.1.json")
    peer_accuracy_data(split, kit / "peer-accuracy")
    squad = root / "articles.json"
    squad.write_text(json.dumps({"data": [
        article("a", "The cat sat on the mat, the cat did.", "Where did the cat sit?"),
        article("b", "A dog ran in the park all day long.", "Where did the dog run?")]}))
    save_text_batch(read_text_batch(squad, 2, 6, 3, 8), 8, peers / box.PEER_TEXT)
    (root / "src" / "kitprobe").mkdir(parents=True)
    (root / "src" / "kitprobe" / "__init__.py").write_text("ARRIVED = True\n")
    archive = pack(root / "src", kit / "ray" / "kitprobe.tar.xz")
    (kit / "base" / "manifest.json").write_text(json.dumps({"ray": {
        "wheel": "kitprobe", "archive": archive.name, "archive_sha256": sha256_of(archive),
        "path": str(archive.relative_to(root))}}))
    return kit


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.slow
# pytest's 900 s a test is a net for hangs: its three calls took 645 s beside two CPU hogs
# and other sessions' tests (load 9), 220 s on a quiet machine
@pytest.mark.timeout(1800)
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
    ray_dir = kit / "ray"
    held = shutil.move(ray_dir, tmp_path / "ray")  # call 1 does not carry Ray

    def call(n: str, *more: str) -> Path:
        out = tmp_path / f"out-{n}"
        done = subprocess.run(
            [sys.executable, "bench/gpu/run.py", n, "--device", "cpu", "--kit", str(kit),
             "--state", str(tmp_path / "state"), "--out", str(out), "--params", str(params),
             "--variants", *VARIANTS, "--train-steps", str(TRAIN_STEPS), "--eval-every", "2",
             "--batch", "8", "--ray-steps", str(RAY_STEPS),
             "--ray-eval-every", str(mid_epoch_every(prepared, 8, RAY_STEPS)),
             "--speed-steps", "2", "--speed-repeats", "1", "--speed-warmup", "1",
             "--peer-models", "bidaf", "--peer-repeats", "1",
             # the box's time guards, loosened: two busy cores are not an H100
             "--budget", "900", "--speed-seconds", "300", "--compile-seconds", "300", *more],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return out

    out1 = call("1")
    shutil.move(held, ray_dir)  # call 2 carries it
    out2 = call("2")
    # a checkpoint every step on both sides: whichever side the machine's load lets train
    # further, its run and its capped rerun share steps to compare (at 6 and 20, a busy
    # machine's rcpipe trained 3 steps in its 0.1 minute, the peer 8: nothing in common)
    out3 = call("3", "--peer-minutes", "0.1", "--peer-every", "1", "1")

    def read(out: Path, name: str) -> dict:
        return json.loads((out / f"{name}.json").read_text())

    assert read(out1, "setup")["ray"] == "not carried by this call"
    assert read(out2, "setup")["ray"] == "installed"
    # the stand-in held: the trainings ran without dvclive, as on the box
    assert "not on the GPU box" in (tmp_path / "state/runs/v1.1/qanet.log").read_text()
    assert (tmp_path / "state" / "site" / "kitprobe" / "__init__.py").is_file()
    for out, n in ((out1, "1"), (out2, "2"), (out3, "3")):
        call_json = read(out, f"call-{n}")
        assert {s for s, r in call_json["steps"].items() if r["ok"]} == set(CALLS[n]), call_json
        # what comes back from $OUT: at most 8 files a call (the device tool's limit)
        assert len(list(out.iterdir())) <= 8, sorted(p.name for p in out.iterdir())

    speed = read(out1, "speed")["results"]
    assert all(speed[v]["fp32"]["examples_per_s"] > 0 for v in VARIANTS)
    compiled = read(out1, "compiled")
    assert compiled["backend"] == "aot_eager"
    assert {m: r["examples_per_s"] > 0 for m, r in compiled["results"]["qanet"].items()} \
        == {"off": True, "default": True, "reduce-overhead": True}
    assert compiled["results"]["qanet"]["default"]["shapes"] == 1  # --compile-shapes
    assert compiled["results"]["qanet"]["reduce-overhead"]["cudagraph_skips"] == 0  # no CUDA

    acc = read(out1, "accuracy")["versions"]["1.1"]
    assert acc["missing"] == [] and set(acc["variants"]) == set(VARIANTS)
    for v in acc["variants"].values():
        assert v["steps"] == TRAIN_STEPS and 0 <= v["test_f1"] <= 100
    assert 0 <= acc["ensemble"]["f1"] <= 100
    assert all(r["status"] == "done" for r in read(out1, "wait")["runs"])

    ray = read(out2, "ray")  # killed after a registered checkpoint, resumed from it
    assert ray["status"] == "done" and ray["backend"] == "gloo" and ray["world_size"] == 1
    assert 0 < ray["resumed_from_step"] < ray["steps"] == RAY_STEPS
    pair = read(out2, "peers")["results"]["bidaf"]  # rcpipe's bidaf beside the stand-in
    assert pair["device"].endswith("CPU, 1 torch thread(s)") and pair["batch"] == 2
    assert all(pair["steps"][k]["ratio_median"] > 0 for k in ("train", "inference"))
    audit = read(out2, "audit")["results"]
    assert set(audit) == set(VARIANTS)
    assert all(a["graphs"] >= 1 and a["kernels_per_step"] > 0 for a in audit.values())

    # call 3: rcpipe's bidaf through its worker beside the stand-in peer, by their recipes
    accuracy = read(out3, "peer_accuracy")["results"]["bidaf"]
    one = accuracy["runs"]["42"]
    steps = one["steps"]
    assert steps["equal"] == min(steps["rcpipe"], steps["peer"]) > 0
    assert [h["step"] for h in one["peer"]["history"]][-1] == steps["peer"]
    assert one["peer"]["recipe"]["optimizer"] == "Adadelta"
    for faster in (s for s in ("rcpipe", "peer") if steps[s] > steps["equal"]):
        same = one["same_first_steps"]  # its first S steps again: the same steps
        assert same["steps"] and same["largest_heldout_f1_gap"] == 0, same
        assert one[f"{faster}_steps"]["steps"] == steps["equal"]
    for at in ("minutes", "steps"):
        assert accuracy["compared"][at]["verdict"] in ("gain", "loss", "chance")
        assert "95%" in accuracy["compared"][at]["line"]
    assert accuracy["device"].endswith("CPU, 1 thread a side")
    assert (out3 / "peer-accuracy-bidaf.png").stat().st_size > 0  # the curves come back

    # the draw kept: a CPU draw is recorded like a GPU one but leaves every step open
    drawn = results.record([out1, out2, out3], "2-core CPU (the dry run)", tmp_path / "results",
                           at="2026-01-02", sha="abc1234")
    assert json.loads(drawn.read_text())["figures"]["ray"]["status"] == "done"
    assert results.open_steps(tmp_path / "results") == {s for c in CALLS.values()
                                                         for s in c} - {"setup"}
    table = subprocess.run([sys.executable, "bench/gpu/table.py", "--results",
                            str(tmp_path / "results")], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert "### 2026-01-02: 2-core CPU (the dry run) (commit `abc1234`)" in table
    assert "| `qanet` |" in table and "| ensemble |" in table
    assert "resumed from step" in table
    assert "| `bidaf` beside chrischute/squad BiDAF |" in table
    assert "every target stays open" in table and "(met)" not in table


def test_the_plan_fits_one_draw() -> None:
    """bench/gpu/plan.json: the box's start and every call within the draw's device-minutes
    (room left for one failed start), each call's runner inside its timeout, each call's
    MiB limit under the tool's 64 and, where `make gpu-kit` built the kit here, what it
    measured under each limit; bench/gpu/README.md's plan table the plan's."""
    plan = results.PLAN
    calls = plan["calls"]
    assert plan["start_minutes"] + sum(c["device_minutes"] for c in calls) \
        <= plan["budget_minutes"] <= 12
    assert calls[0]["device_minutes"] <= 8  # call 1 alone brings back the headline figures
    for c in results.CALLS:  # `then`'s too: each fits a draw of its own
        assert c["budget_s"] < c["timeout_s"] <= 60 * c["device_minutes"], c
        assert 0 < c["mib_limit"] <= plan["carry_limit_mib"] <= 64, c
        assert plan["start_minutes"] + c["device_minutes"] <= plan["budget_minutes"], c
    manifest = ROOT / "gpu-kit" / "base" / "manifest.json"
    if manifest.is_file() and "mib" in (built := json.loads(manifest.read_text())):
        assert all(built["mib"].get(c["call"], 0) <= c["mib_limit"] for c in results.CALLS), \
            built["mib"]
    readme = (ROOT / "bench" / "gpu" / "README.md").read_text()
    assert results.plan_table() in readme


def test_the_box_lacks_what_the_kit_cuts_from_ray(tmp_path: Path) -> None:
    """The stand-in refuses the parts of Ray the kit does not carry, so the dry run's Ray
    job proves the training path does without them."""
    box.stand_in(tmp_path)
    probe = ("import importlib\nfor m in ('ray.rllib', 'ray.serve', 'ray.llm'):\n"
             "    try:\n        importlib.import_module(m)\n    except ModuleNotFoundError"
             " as e:\n        print('refused', m, 'not on the GPU box' in str(e))\n")
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ,
                          "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                          check=True)
    assert done.stdout.split("\n")[:3] == [f"refused {m} True" for m in box.RAY_MODULES_LEFT_OUT]


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
             "qanet": {"off": rate(1600.0),
                       "reduce-overhead": rate(2400.0, cudagraph_skips=1)}}},
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
    assert "Graphs reduce-overhead left uncaptured (torch's `cudagraph_skips`): `qanet` 1." \
        in text


def test_a_later_draw_runs_only_what_no_gpu_draw_has(tmp_path: Path) -> None:
    """results.open_steps reads the recorded draws; run.py --steps open keeps setup and the
    steps still open, call by call."""
    from bench.gpu.run import chosen_steps, parse

    gpu = {"gpu": "NVIDIA H100 80GB HBM3", "device": "cuda"}
    every = dict.fromkeys(results.VARIANTS, {"fp32": {}, "bf16": {}})
    one = tmp_path / "one"
    one.mkdir()
    (one / "setup.json").write_text(json.dumps(gpu))
    (one / "speed.json").write_text(json.dumps({"results": every}))
    (one / "ray.json").write_text(json.dumps({"status": "not resumed"}))
    results.record([one], "one NVIDIA H100", tmp_path / "r", at="2026-12-01", sha="a")
    assert results.open_steps(tmp_path / "r") == {"compiled", "train", "wait", "evaluate",
                                                  "ray", "peers", "audit", "peer_accuracy"}
    args = parse(["1", "--steps", "open", "--results", str(tmp_path / "r")])
    assert chosen_steps(args) == ("1", ["setup", "compiled", "train", "wait", "evaluate"])
    # a CPU draw with every figure counts for nothing: the targets are the GPU's
    (one / "setup.json").write_text(json.dumps({"device": "cpu", "gpu": None}))
    (one / "ray.json").write_text(json.dumps({"status": "done"}))
    results.record([one], "2-core CPU", tmp_path / "r", at="2026-12-02", sha="b")
    assert "ray" in results.open_steps(tmp_path / "r")
    assert [d["commit"] for d in results.draws(tmp_path / "r")] == ["b", "a"]  # newest first


def test_the_gpu_results_page_shows_every_recorded_draw() -> None:
    """docs/results/gpu.md holds bench/gpu/table.py's rendering of bench/gpu/results/ as it
    is: a draw recorded (or the table's code changed) without the page is a stale page."""
    from bench.gpu.table import every_draw

    page = (ROOT / "docs" / "results" / "gpu.md").read_text()
    assert every_draw(results.draws()) in page


def test_a_later_call_adds_the_variants_an_earlier_one_could_not(tmp_path: Path) -> None:
    """record merges per-variant results: the first draw's third call measured R-Net where
    the first had only QANet; its skipped entry for what it then measured goes."""
    first, third = tmp_path / "1", tmp_path / "3"
    for d in (first, third):
        d.mkdir()
    (first / "speed.json").write_text(json.dumps({
        "results": {"qanet": {"fp32": {"examples_per_s": 287.0}}},
        "skipped": {"rnet": "the call's time", "bidaf": "the call's time"}}))
    (third / "speed.json").write_text(json.dumps({
        "results": {"rnet": {"fp32": {"examples_per_s": 155.0}}},
        "skipped": {"bidaf": "ran past the call's time"}}))
    (third / "compiled.json").write_text(json.dumps({
        "results": {}, "skipped": {"qanet default": "TypeError: ..."}}))
    got = results.merged([first, third])
    assert got["speed"]["results"] == {"qanet": {"fp32": {"examples_per_s": 287.0}},
                                       "rnet": {"fp32": {"examples_per_s": 155.0}}}
    assert got["speed"]["skipped"] == {"bidaf": "ran past the call's time"}
    assert got["compiled"]["skipped"] == {"qanet default": "TypeError: ..."}
