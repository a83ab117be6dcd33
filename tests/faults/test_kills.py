"""Nothing lost (issue 36, item 7): kill -9 at seeded points of prepare, train, evaluate,
package and export, then the same command again.

Each stage runs once whole (its old set, and how many file-system steps a run takes), then
for each kill its inputs change, the command is killed just before a step drawn from
random.Random(SEED) (tests/faults/killer.py), and:

- what is on disk is the old set or the new one, each file parsing and the files belonging
  together (after what the next command does first: a set committed before the kill is
  moved into place, rcpipe/outputs.py), compared with the old set and with the new set the
  rerun leaves;
- the same command again finishes.

`rcpipe train` through Ray is killed once, after its first checkpoint, with a second
`train` and a `train --force` refused beside it (its checkpoints untouched), and the same
command resumes it to the dev F1 of the run never interrupted; the same run then lives
through a worker's restart and two more interruptions (one Ray Train run for all).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rcpipe.outputs import JOURNAL, finish
from tests.conftest import (
    RESUMED_TRAIN,
    RESUMED_VARIANT,
    TINY_MODEL,
    Prepared,
    SynthData,
    save_untrained_model,
    write_params,
)
from tests.planned_reads import planned_reads

pytestmark = [pytest.mark.slow, pytest.mark.ray_train(3)]

ROOT = Path(__file__).resolve().parents[2]
SEED = 36
VARIANT = "bidaf"
# what differs between two runs of the same inputs: times and speeds, not results
VOLATILE = {"seconds", "phases", "wall_seconds", "train_seconds", "examples_per_s",
            "resumed_from_step", "elapsed",
            # a package's digests: safetensors' bytes of the same weights differ from run
            # to run; the check (load_package) ties each file to them instead
            "sha256"}


@dataclass
class Tally:
    """The figure in docs/results/faults.md: cases tried, kills survived, sets a rerun finished."""

    cases: int = 0
    killed: int = 0
    committed_before_the_kill: int = 0  # a journal the next command finished
    stages: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        return (f"kill -9 faults: {self.cases} cases ({self.stages}), {self.killed} killed, "
                f"{self.committed_before_the_kill} mid-commit, every rerun finished, "
                f"nothing lost")


TALLY = Tally()


@pytest.fixture(scope="module", autouse=True)
def _figure(killer: subprocess.Popen) -> Iterator[None]:
    yield
    print("\n" + TALLY.line())


@dataclass
class Ran:
    returncode: int
    stderr: str


@pytest.fixture(scope="module")
def killer() -> Iterator[subprocess.Popen]:
    """tests/faults/killer.py: each run forked from one process that imported rcpipe."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.faults.killer"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    global _KILLER
    _KILLER = proc
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


_KILLER: subprocess.Popen | None = None


def _run(cwd: Path, at: int, which: str, *args: str) -> tuple[Ran, int]:
    """The command killed before its ``at``-th step (0: never); (how it ended, its steps)."""
    assert _KILLER is not None and _KILLER.stdin and _KILLER.stdout
    log = cwd / ".run.log"
    _KILLER.stdin.write(json.dumps({"at": at, "cwd": str(cwd), "log": str(log),
                                    "which": which, "args": list(args)}) + "\n")
    _KILLER.stdin.flush()
    answer = json.loads(_KILLER.stdout.readline())
    return Ran(answer["returncode"], log.read_text()), answer["steps"]


def _snapshot(files: list[Path]) -> dict[str, Any]:
    """Each file's content (JSON without its times), None where there is none."""
    snap: dict[str, Any] = {}
    for path in files:
        if not path.is_file():
            snap[path.name] = None
        elif path.suffix == ".json":
            obj = json.loads(path.read_text())
            snap[path.name] = {k: v for k, v in obj.items() if k not in VOLATILE} \
                if isinstance(obj, dict) else obj
        else:
            snap[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return snap


def _next_command_first(folders: list[Path]) -> int:
    """What any writer of these folders does first: finish a set committed before a kill."""
    journals = [j for f in folders for j in f.resolve().parent.glob(f".{f.name}.*.{JOURNAL}")]
    for journal in journals:
        finish(journal)
    return len(journals)


def _kills(stage: str, cwd: Path, which: str, command: Callable[[int], list[str]],
           files: list[Path], check: Callable[[], None], points: int,
           between: Callable[[int], None] = lambda i: None,
           compared: list[Path] | None = None) -> None:
    """The whole first run, then ``points`` kills, each of run i + 1 (after ``between(i)``)
    at a seeded step, with the checks above; old and new sets compared on ``compared``
    (default: every file; the files whose bytes a second run of the same inputs repeats)."""
    compared = files if compared is None else compared
    rng = random.Random(f"{SEED}-{stage}")
    folders = sorted({f.parent for f in files})
    proc, steps = _run(cwd, 0, which, *command(0))
    assert proc.returncode == 0, proc.stderr[-3000:]
    check()
    before = _snapshot(compared)
    for i in range(points):
        between(i)
        at = rng.randint(1, steps)
        killed, _ = _run(cwd, at, which, *command(i + 1))
        assert killed.returncode in (-signal.SIGKILL, 0), killed.stderr[-3000:]
        TALLY.cases += 1
        TALLY.stages[stage] = TALLY.stages.get(stage, 0) + 1
        TALLY.killed += killed.returncode == -signal.SIGKILL
        TALLY.committed_before_the_kill += _next_command_first(folders)
        if any(_snapshot(files).values()):  # none yet: the first run's set was the old one
            check()
        left = _snapshot(compared)
        proc, steps = _run(cwd, 0, which, *command(i + 1))
        assert proc.returncode == 0, f"the rerun after a kill at step {at}: " + \
            proc.stderr[-3000:]
        check()
        after = _snapshot(compared)
        assert left in (before, after), f"{stage}: killed at step {at} of {steps}: a " \
            f"mixed set: {_differences(left, before, after)}"
        assert not [p for f in folders for p in f.resolve().parent.glob(f".{f.name}.*.new-*")]
        before = after


def _differences(left: dict, before: dict, after: dict) -> list[str]:
    return [f"{name}: {'old' if left[name] == before.get(name) else ''}"
            f"{'new' if left[name] == after.get(name) else ''}" for name in left]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------ prepare


def test_prepare_killed_leaves_the_old_or_the_new_prepared_data(
        tmp_path: Path, synth_v1: SynthData) -> None:
    import pyarrow.parquet as pq

    write_params(tmp_path / "params.yaml", data={
        "train_file": str(synth_v1.train), "dev_file": str(synth_v1.dev),
        "out_dir": "data/prepared", "cache_dir": "data/cache"})
    out = tmp_path / "data/prepared"
    # each split a folder of parts: the synthetic ones fit one part each (data/shards.py)
    names = ("train/part-00000.parquet", "dev/part-00000.parquet",
             "heldout/part-00000.parquet", "heldout.json", "vocab.json", "report.json",
             "meta.json")

    def rows(name: str) -> int:
        return pq.read_metadata(out / name / "part-00000.parquet").num_rows

    def check() -> None:  # every file parses; the counts of one run
        report = json.loads((out / "report.json").read_text())
        meta = json.loads((out / "meta.json").read_text())
        held = json.loads((out / "heldout.json").read_text())
        assert report["train"]["rows"] == rows("train")
        assert report["dev"]["kept"] == rows("dev")
        assert report["heldout"]["kept"] == rows("heldout") == \
            meta["heldout"]["questions"] == \
            sum(len(p["qas"]) for a in held["data"] for p in a["paragraphs"])
        assert meta["words"] == len(json.loads((out / "vocab.json").read_text())["words"])

    # the held-out slice alternates: every file of the set changes between two runs
    _kills("prepare", tmp_path, "rcpipe",
           lambda i: ["prepare", "--set", f"data.heldout.fraction={(0.2, 0.4)[i % 2]}"],
           [out / n for n in names], check, points=3)


# ------------------------------------------------------------- train (one process, no Ray)


def _model_workdir(root: Path, prepared: Prepared, **train: Any) -> Path:
    write_params(root / "params.yaml", data={
        "train_file": str(prepared.data.train), "dev_file": str(prepared.data.dev),
        "out_dir": str(prepared.out_dir), "cache_dir": str(root / "cache")},
        train={"batch_size": 4, "eval_every": 2, "threads": 1, "num_workers": 1,
               "keep_checkpoints": 1} | train,
        models={VARIANT: TINY_MODEL})
    return root


@pytest.mark.trains
def test_train_killed_leaves_the_old_or_the_new_model(tmp_path: Path,
                                                      prepared: Prepared) -> None:
    import torch

    cwd = _model_workdir(tmp_path, prepared)
    run = tmp_path / "run"

    def check() -> None:  # the model is the summary's best checkpoint, the curve its history
        summary = json.loads((run / "summary.json").read_text())
        assert json.loads((run / "metrics.json").read_text())["history"] == summary["history"]
        payload = torch.load(run / "model.pt", weights_only=True)
        assert payload["variant"] == summary["variant"] == VARIANT
        best = run / f"step-{summary['best_step']:08d}" / "model.pt"
        if best.is_file():  # pruned once a later run ranks another best
            assert _sha256(best) == _sha256(run / "model.pt")

    # each run trains 4 steps more, resuming from the last one's checkpoints
    _kills("train", cwd, "local",
           lambda i: [VARIANT, "--run-dir", str(run), "--set", f"train.max_steps={4 * (i + 1)}"],
           [run / "model.pt", run / "summary.json", run / "metrics.json"], check, points=3)


# ------------------------------------------------------------------- evaluate, package, export


@pytest.fixture
def two_models(tmp_path: Path, prepared: Prepared, monkeypatch: pytest.MonkeyPatch
               ) -> Callable[[int], None]:
    """A workdir with models/bidaf/model.pt, and a function putting model 0 or 1 in place
    (the same architecture, other weights: other answers)."""
    import torch

    from rcpipe.config import load_config

    _model_workdir(tmp_path, prepared)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(tmp_path / "params.yaml")
    kept = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = save_untrained_model(cfg, VARIANT)
        kept.append(path.read_bytes())

    def put(i: int) -> None:
        (tmp_path / "models" / VARIANT / "model.pt").write_bytes(kept[i % 2])

    put(0)
    return put


def test_evaluate_killed_leaves_the_old_or_the_new_scores(
        tmp_path: Path, prepared: Prepared, two_models: Callable[[int], None]) -> None:
    from rcpipe.scoring import metrics

    files = [tmp_path / "predictions" / f"{VARIANT}.json",
             tmp_path / "predictions" / f"{VARIANT}.nbest.json",
             tmp_path / "metrics" / f"{VARIANT}.json",
             tmp_path / "metrics" / f"{VARIANT}.by_type.json",
             tmp_path / "models" / VARIANT / "na_threshold.json"]
    dev = json.loads(prepared.data.dev.read_text())

    def check() -> None:  # the metrics are the predictions' scores, nbest their answers
        preds, nbest, scores, by_type, threshold = (json.loads(f.read_text()) for f in files)
        assert {q: v["text"] for q, v in nbest.items()} == preds
        official = metrics.score(dev, preds)
        assert (scores["exact_match"], scores["f1"]) == \
            (official["exact_match"], official["f1"])
        assert by_type and "na_threshold" in threshold

    # the model in place alternates (a new model: evaluate runs again)
    _kills("evaluate", tmp_path, "rcpipe", lambda i: ["evaluate", VARIANT], files, check,
           points=2, between=lambda i: two_models(i + 1))


def test_package_killed_leaves_the_old_or_the_new_package(
        tmp_path: Path, two_models: Callable[[int], None]) -> None:
    from rcpipe.trained.package_dir import load_package

    assert _run(tmp_path, 0, "rcpipe", "evaluate", VARIANT)[0].returncode == 0
    out = tmp_path / "packages" / VARIANT
    names = ("model.safetensors", "config.json", "vocab.json", "README.md")

    def check() -> None:  # every file is the one config.json's digest names
        load_package(out)

    # the decoding settings alternate: config.json and the card change
    _kills("package", tmp_path, "rcpipe",
           lambda i: ["package", VARIANT, "--set", f"eval.max_answer_len={(15, 17)[i % 2]}"],
           [out / n for n in names], check, points=3, compared=[out / n for n in names[1:]])


def test_export_killed_leaves_the_old_or_the_new_graph(
        tmp_path: Path, two_models: Callable[[int], None]) -> None:
    folder = tmp_path / "models" / VARIANT
    weights = set()

    def check() -> None:  # the record names this graph and the weights it was made from
        record = json.loads((folder / "export.json").read_text())
        assert record["onnx_sha256"] == _sha256(folder / "model.onnx")
        assert record["source_sha256"] in weights

    def between(i: int) -> None:
        two_models(i + 1)
        weights.add(_sha256(folder / "model.pt"))

    weights.add(_sha256(folder / "model.pt"))
    _kills("export", tmp_path, "rcpipe",
           lambda i: ["export", "--model", VARIANT, "--questions", "4"],
           [folder / "model.onnx", folder / "export.json"], check, points=2, between=between,
           compared=[])  # the graph's bytes differ from export to export: check() ties them


# ------------------------------------------------------------- rcpipe train through Ray


def _interrupted(cwd: Path) -> None:
    """As a killed `rcpipe train` leaves its model folder: no summary, the run unfinished."""
    (cwd / "models" / VARIANT / "summary.json").unlink()
    record = cwd / "models" / VARIANT / "runs.json"
    runs = json.loads(record.read_text())["runs"]
    record.write_text(json.dumps({"runs": [r | {"finished": None} for r in runs]}))


def _step(path: Path) -> int:
    from rcpipe.train.checkpoint import step_of

    step = step_of(path.name)
    assert step is not None, path
    return step


def _job_gone(timeout: float = 300) -> None:
    """Until no Ray Train controller or worker is left on this process's Ray (local_ray's,
    joined: its raylet, and so every actor, below us); the timeout is a safety net."""
    import psutil

    from tests import ray_nodes

    deadline = time.monotonic() + timeout
    while left := [p for title in ("TrainController", "RayTrainWorker")
                   for p in ray_nodes.actors(title, psutil.Process())]:
        assert time.monotonic() < deadline, f"left of the killed job: {left}"
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.trains
def test_one_ray_train_run_killed_refused_restarted_skipped_and_resumed_three_ways(
        tmp_path: Path, prepared: Prepared, join_local_ray: str, undisturbed: dict,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """One run's life through Ray Train, as a user's nights would live it (one run for every
    case: each Ray Train job costs ~20 CPU s before it trains; docs/dev/testing.md):

    1. `rcpipe train` stopped after its second checkpoint: a second `train` and a
       `train --force` refused beside it (its checkpoints untouched); then killed -9;
    2. its latest checkpoint truncated (issue 43; every kind of damage:
       tests/faults/test_checkpoints.py, without Ray), the same command resumes it from the
       one before, in one line, a Ray Train worker killed mid-run on the way (SIGKILL, as
       an OOM killer or a lost node would: train.max_failures restarts the worker group
       from a later checkpoint), to the dev F1 of the run never interrupted
       (`undisturbed`, tests/conftest.py, shared with the lost-node test);
    3. the same inputs, finished: nothing to do;
    4. killed at its end (no summary, the record unfinished) before Ray Train's controller
       recorded its checkpoints, which a worker stores before the controller records them
       (a Ctrl-C at the first checkpoint once trained from step 0 so): resumed from the
       newest stored, its last, no step trained again, no checkpoint rewritten.

    A run of other settings (anew, the old one pruned): tests/cluster/test_storage_outage.py,
    on S3. The driver killed with the local Ray it started: the GPU kit's ray step
    (tests/bench/test_gpu_kit.py)."""
    import psutil

    from rcpipe import stages
    from rcpipe.config import load_config
    from tests import ray_nodes

    assert VARIANT == RESUMED_VARIANT  # the run `undisturbed` trained
    # no restart of a dead worker in step 1: the rerun alone resumes it; three checkpoints
    # kept (the best by F1, and the latest) so that step 2 has one before the latest
    cwd = _model_workdir(tmp_path, prepared, **RESUMED_TRAIN, max_failures=0,
                         keep_checkpoints=3)
    command = [sys.executable, "-m", "rcpipe", "train", VARIANT]
    runs = cwd / "models" / VARIANT / "runs"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, cwd=cwd, start_new_session=True, stdout=log, stderr=log)
    # a safety net, not the wait: a Ray Train job's start is ~20 CPU s, minutes on a busy box
    deadline = time.monotonic() + 600
    # two checkpoints its controller recorded: the latest to break, one to resume from
    while max((len(ray_nodes.recorded_steps(r)) for r in runs.glob("*")), default=0) < 2:
        assert first.poll() is None and time.monotonic() < deadline, \
            (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.2)
    # 1. stopped, not ended: it holds its lock while the next two commands start (seconds on
    # a busy machine, longer than its last steps)
    os.killpg(first.pid, signal.SIGSTOP)
    # its workers too (not in the driver's group): left running, they trained on through
    # the refused commands, on a slow day to step 36 of 40, leaving step 2's resumed run no
    # later checkpoint to kill a worker past but its last (a race with its end)
    paused = ray_nodes.train_workers(psutil.Process())
    for worker in paused:
        worker.suspend()
    held = {p.parent.name: p.name for p in sorted(runs.glob("*/step-*"))}  # run -> newest
    line = re.compile(rf"error: models/{VARIANT}: {VARIANT} is being trained by pid "
                      rf"{first.pid} on \S+ since \S+\n")
    for extra in ([], ["--force"]):
        second = subprocess.run(command + extra, cwd=cwd, capture_output=True, text=True)
        assert second.returncode == 2, second.stderr[-2000:]
        assert line.fullmatch(second.stderr), second.stderr[-2000:]
    # nothing of the running job's was removed (--force would remove its run's folder): its
    # newest checkpoint, or a newer one (a worker may have stored one as it was paused)
    now = {p.parent.name: p.name for p in sorted(runs.glob("*/step-*"))}
    assert held.keys() == now.keys() and all(now[r] >= held[r] for r in held)
    os.killpg(first.pid, signal.SIGKILL)  # the driver: its lock goes with it
    first.wait()
    # its workers killed as they stand: resumed, they trained on until Ray ended the job
    for worker in paused:
        with contextlib.suppress(psutil.Error):
            worker.kill()
    # and the job's controller gone, which outlives the driver: it may still record a
    # checkpoint a worker reported before the pause, and a resumed run would go on from that
    # one, not the one broken below (no "is broken" line; seen on a busy machine)
    _job_gone()
    TALLY.cases += 1
    TALLY.killed += 1
    TALLY.stages["train (Ray)"] = 1
    assert not (cwd / "models" / VARIANT / "summary.json").exists()  # no set: the old one
    (run,) = runs.iterdir()
    killed_at = max(_step(p) for p in run.glob("step-*"))
    # 2. the latest its controller recorded (what a resumed run goes on from; its workers
    # may have stored newer ones) truncated
    latest = max(ray_nodes.recorded_steps(run))
    state = run / f"step-{latest:08d}" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])

    # 2. resumed from the one before; a worker killed once a checkpoint past the killed
    # run's latest is recorded
    killed: list[int] = []
    ended = threading.Event()  # the resumed command's end: no worker left to kill

    def kill_a_worker_past(step: int) -> None:
        while not (killed or ended.is_set()):
            workers = ray_nodes.train_workers(psutil.Process())  # local_ray's, joined
            if workers and max(ray_nodes.recorded_steps(run), default=0) > step:
                workers[0].kill()
                killed.append(workers[0].pid)
            time.sleep(0.1)

    killer = threading.Thread(target=kill_a_worker_past, args=(killed_at,), daemon=True)
    killer.start()
    try:
        again = subprocess.run(command + ["--set", "train.max_failures=1"], cwd=cwd,
                               capture_output=True, text=True)
    finally:
        ended.set()
    killer.join()
    assert again.returncode == 0, again.stderr[-3000:]
    assert killed, "no Ray Train worker was seen past the resume point"
    notes = [line for line in again.stderr.splitlines() if "is broken" in line]
    assert len(notes) == 1 and f"train {VARIANT}: checkpoint step-{latest:08d} is broken " \
        "(state.pt holds 1,000 bytes, " in notes[0], notes  # passed by for the one before
    assert f"resuming {run.name}" in again.stderr  # resumed, not retrained
    # that step saved again in a folder of its own: Ray Train's record of the broken one,
    # evicted, deletes its folder (it deleted the new checkpoint, then failed the run)
    assert f"checkpoint step-{latest:08d}-r1 saved" in again.stderr
    summary = json.loads((cwd / "models" / VARIANT / "summary.json").read_text())
    assert summary["resumed_from_step"] > killed_at  # the restarted group: a later one
    assert summary["steps"] == undisturbed["steps"] == RESUMED_TRAIN["max_steps"]
    # the same data order, optimizer, EMA and RNG streams: the same result, within noise
    assert summary["best_dev_f1"] == pytest.approx(undisturbed["best_dev_f1"], abs=2.0)
    # its data stream went on where the checkpoint left it: the rows of steps 1-40, each
    # once, as the undisturbed run read them (not the epoch's start again)
    assert summary["reads"] == undisturbed["reads"] == planned_reads(
        prepared.out_dir, RESUMED_TRAIN["batch_size"], 42, 1,
        RESUMED_TRAIN["max_steps"])
    assert json.loads((cwd / "models" / VARIANT / "metrics.json").read_text())["history"] == \
        summary["history"]

    # 3. and 4. in this process, on the same run (its Ray: the one `rcpipe train` joined)
    monkeypatch.chdir(cwd)
    cfg = load_config(cwd / "params.yaml")
    last = RESUMED_TRAIN["max_steps"]
    model = cwd / "models" / VARIANT / "model.pt"
    mtime = model.stat().st_mtime_ns
    with caplog.at_level("INFO", logger="rcpipe"):
        assert stages.train(cfg, VARIANT) == summary
    assert model.stat().st_mtime_ns == mtime
    assert "already finished with these inputs" in caplog.text

    # 4. killed at its end, before its controller recorded its last checkpoints (the worker
    # stores one before the controller records it): resumed from the newest stored, its
    # last, with no step trained again and no checkpoint rewritten
    (run / "checkpoint_manager_snapshot.json").unlink()
    assert not ray_nodes.recorded_steps(run)
    _interrupted(cwd)
    saved = {p: p.stat().st_mtime_ns for p in run.glob("step-*/*")}
    caplog.clear()
    with caplog.at_level("INFO", logger="rcpipe"):
        at_end = stages.train(cfg, VARIANT)
    assert f"resuming {summary['run']}" in caplog.text and at_end["run"] == summary["run"]
    assert at_end["resumed_from_step"] == at_end["steps"] == last
    assert {p: p.stat().st_mtime_ns for p in run.glob("step-*/*")} == saved
    shutil.rmtree(runs, ignore_errors=True)
