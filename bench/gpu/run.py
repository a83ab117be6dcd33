"""The GPU kit's runner: each device call runs one call's steps on the box (bench/gpu/README.md).

    python3 bench/gpu/run.py [options] 1|2|all|STEP...      (bash bench/gpu/run.sh does it)

The calls and their steps are bench/gpu/plan.json's; each step writes <step>.json to --out
($OUT on the box) as soon as it has a figure, so a call stopped at its limit still returns
what was done. speed and compiled stop at --speed-seconds and --compile-seconds only where a
training follows them in the call (it needs the rest); otherwise they take the call's time.
The trainings run detached, so that one call can start them and a later one evaluate them;
the box's state (installed site, runs) lives in --state. ``--steps open`` keeps only the
steps whose figures no GPU draw in bench/gpu/results/ has yet. ``--device cpu`` with a tiny
kit goes through every step with no GPU (tests/bench/test_gpu_kit.py): compiled uses the
aot_eager backend there.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench.gpu.results, rcpipe: the repo is the working tree

from bench.common import parser, set_args  # noqa: E402 - the repo root first
from bench.gpu.results import CALLS as PLANNED  # noqa: E402
from bench.gpu.results import VARIANTS, open_steps  # noqa: E402

# speed and compiled steps, most wanted first (the targets' variants): the time guard drops
# the tail
SPEED_ORDER = ("qanet", "rnet", "rnet_mult", "bidaf", "bidaf_selfattn")
CALLS = {c["call"]: tuple(c["steps"]) for c in PLANNED}
CALLS["all"] = tuple(dict.fromkeys(s for steps in CALLS.values() for s in steps))
BUDGETS = {c["call"]: c["budget_s"] for c in PLANNED}
# the compiled step's variants and modes, in this order, each as far as the step's time goes:
# reduce-overhead (CUDA graphs) is the cure the launch counts point to (QANet's eager step:
# 4,074 kernels, 111 ms)
COMPILE_VARIANTS, COMPILE_MODES = ("qanet",), ("off", "default", "reduce-overhead")
# seconds a step leaves for the ones after it; the trainings' processes take to reach their
# first step; kept after the trainings for the evaluation
RESERVE, START_RESERVE, EVAL_RESERVE = 30.0, 25.0, 40.0


@dataclass
class Kit:
    args: argparse.Namespace
    started: float = field(default_factory=time.monotonic)
    steps: dict[str, Any] = field(default_factory=dict)
    chosen: list[str] = field(default_factory=list)  # this call's steps, in order

    def capped(self, seconds: float) -> float:
        """A step's cap: ``seconds`` where a training follows in this call (it needs the
        rest), else the call's time left."""
        return seconds if "train" in self.chosen else self.left()

    @property
    def state(self) -> Path:
        return self.args.state

    def left(self) -> float:
        """Seconds of this call's budget left."""
        return self.args.budget - (time.monotonic() - self.started)

    def prepared(self, version: str) -> Path:
        return self.args.kit / "base" / f"v{version}" / "prepared"

    def test_file(self, version: str) -> Path:
        return self.args.kit / "base" / f"v{version}" / "test.json"

    def data_sets(self, version: str) -> list[str]:
        """The overrides every run on one version shares: the kit's Parquet, its test file as
        the dev set (scored, never tuned on), no word vectors, this device, one process."""
        return [f"data.out_dir={self.prepared(version)}",
                f"data.dev_file={self.test_file(version)}",
                f"data.cache_dir={self.state / 'cache'}", "data.word_vectors=null",
                f"train.device={self.args.device}", "train.num_workers=1", *self.args.sets]

    def env(self, threads: int = 0) -> dict[str, str]:
        """A child's environment (main put the kit's site and the repo on PYTHONPATH)."""
        return {**os.environ, "PYTHONUNBUFFERED": "1"} | (
            {"OMP_NUM_THREADS": str(threads)} if threads else {})

    def write(self, name: str, data: dict[str, Any]) -> None:
        """<name>.json in --out (what comes back) and in the state (what later calls read)."""
        for d in (self.args.out, self.state):
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def spawn(kit: Kit, argv: list[str], log_file: Path, cwd: Path = ROOT, threads: int = 0,
          session: bool = True) -> subprocess.Popen[bytes]:
    """A child left running, its output in ``log_file``."""
    with log_file.open("w") as f:
        return subprocess.Popen(argv, cwd=cwd, env=kit.env(threads), stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=session)


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.is_file() else ""


# ----------------------------------------------------------------------------- setup

def setup(kit: Kit) -> dict[str, Any]:
    """Install what the kit carries (once per box) and say what the box is."""
    base, site = kit.args.kit / "base", kit.state / "site"
    manifest = json.loads((base / "manifest.json").read_text())
    wheels = sorted((base / "wheels").glob("*.whl"))
    done = kit.state / "wheels.installed"
    if wheels and not done.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                        *map(str, wheels)], check=True)
        done.write_text("\n".join(w.name for w in wheels))
    ray = ray_archive(kit, manifest.get("ray"), site)
    importlib.invalidate_caches()  # the site's new packages, for this process's later steps
    import torch

    cuda = torch.cuda.is_available()
    return {"params": kit.args.params.name, "python": sys.version.split()[0],
            "torch": torch.__version__, "cuda": torch.version.cuda, "device": kit.args.device,
            "gpu": torch.cuda.get_device_name() if cuda else None, "cpus": os.cpu_count(),
            "wheels": [w.name for w in wheels], "ray": ray, "kit_calls": manifest.get("calls")}


def ray_archive(kit: Kit, ray: dict[str, Any] | None, site: Path) -> str:
    """Where the call carries Ray's slimmed archive: check its sha256, unpack it into the
    site (once a box)."""
    if not ray:
        return "not in the kit"
    if (kit.state / "ray.unpacked").exists():
        return "installed"
    archive = kit.args.kit.parent / ray["path"]
    if not archive.is_file():
        return "not carried by this call"
    from rcpipe.reads import sha256_of

    if sha256_of(archive) != ray["archive_sha256"]:
        raise RuntimeError(f"{archive.name}: not the archive the kit was built with")
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(site, filter="data")
    (kit.state / "ray.unpacked").write_text(ray["wheel"])
    return "installed"


# ------------------------------------------------------------------ trainings (detached)

class NotYet(Exception):
    """A step whose inputs are not ready in this call: a later call runs it."""


def train(kit: Kit) -> dict[str, Any]:
    """Every variant of every version at once on the one device, each its own session
    (a fresh start: an earlier call's runs and their evaluation are removed)."""
    a = kit.args
    if (before := trainings(kit, False)) and any(alive(r["pid"]) for r in before["runs"]):
        raise RuntimeError("trainings of an earlier call still run on this box")
    shutil.rmtree(kit.state / "runs", ignore_errors=True)
    (kit.state / "accuracy.json").unlink(missing_ok=True)
    runs = []
    threads = max(1, (os.cpu_count() or 1) // (len(a.variants) * len(a.versions)))
    # --minutes 0: the minutes the call has left, less the processes' start (a run's clock
    # starts at its first step) and the evaluation after them
    minutes = a.minutes or max(0.5, (kit.left() - START_RESERVE - EVAL_RESERVE) / 60)
    for version in a.versions:
        for v in a.variants:
            run_dir = kit.state / "runs" / f"v{version}" / v
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            budget = ([f"train.max_steps={a.train_steps}", f"models.{v}.max_steps={a.train_steps}",
                       "train.max_minutes=0"] if a.train_steps else
                      [f"train.max_minutes={minutes:.2f}", f"models.{v}.max_minutes={minutes:.2f}",
                       f"models.{v}.max_steps=0", "train.max_steps=0"])
            argv = [sys.executable, "-m", "rcpipe.train.local", v, "--params", str(a.params),
                    "--run-dir", str(run_dir),
                    *set_args([*kit.data_sets(version), *budget, "train.epochs=1000",
                               f"train.eval_every={a.eval_every}", f"train.threads={threads}"])]
            proc = spawn(kit, argv, run_dir.with_suffix(".log"), threads=threads)
            runs.append({"version": version, "variant": v, "pid": proc.pid,
                         "run_dir": str(run_dir), "log": str(run_dir.with_suffix(".log"))})
            log(f"train v{version} {v}: pid {proc.pid}")
    log(f"train: {len(runs)} runs, " + (f"{a.train_steps} steps" if a.train_steps
                                         else f"{minutes:.2f} minutes") + " each")
    return {"started": time.time(), "minutes": 0 if a.train_steps else round(minutes, 2),
            "steps": a.train_steps, "threads": threads, "eval_every": a.eval_every,
            "params": str(a.params), "runs": runs}


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not reaped, does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def trainings(kit: Kit, needed: bool = True) -> dict[str, Any] | None:
    """What the train step started on this box (None where it started nothing)."""
    path = kit.state / "trainings.json"
    if path.is_file():
        return json.loads(path.read_text())
    if needed:
        raise RuntimeError(f"no trainings on this box ({kit.state}): the machine was given "
                           "back since call 1?")
    return None


def wait(kit: Kit) -> dict[str, Any]:
    """Until every training has ended, or until the call must keep EVAL_RESERVE seconds."""
    started = trainings(kit)
    while True:
        running = [r for r in started["runs"] if alive(r["pid"])]
        if not running or kit.left() < EVAL_RESERVE:  # time left to evaluate
            break
        log(f"wait: {len(running)} training(s) running, {kit.left():.0f} s of the call left")
        # every 2 s: a finished training's evaluation starts at once (each idle second is
        # the draw's device time; a dry run's 4-step trainings end within one)
        time.sleep(min(2.0, max(0.5, kit.left() - EVAL_RESERVE)))
    for r in started["runs"]:
        done = (Path(r["run_dir"]) / "summary.json").is_file()
        r["status"] = "running" if alive(r["pid"]) else "done" if done else "failed"
        if r["status"] == "failed":
            log(f"{r['variant']} v{r['version']} failed:\n" + tail(Path(r["log"])))
    return {"runs": started["runs"],
            "minutes_since_start": (time.time() - started["started"]) / 60}


def evaluate(kit: Kit) -> dict[str, Any]:
    """Per version: each variant's training summary and its best model's test scores at the
    no-answer threshold chosen on the held-out slice, then their majority-vote ensemble."""
    from bench.accuracy import abstain_all, best_evaluations, voted
    from rcpipe.scoring import metrics

    started = trainings(kit)
    if running := [f"{r['variant']} v{r['version']}" for r in started["runs"]
                   if alive(r["pid"])]:
        raise NotYet(f"still training: {', '.join(running)}; a later call evaluates")
    out: dict[str, Any] = {k: started[k] for k in ("minutes", "steps", "eval_every")}
    out["versions"] = {}
    for version in sorted({r["version"] for r in started["runs"]}):
        runs = [r for r in started["runs"] if r["version"] == version]
        summaries = {r["variant"]: json.loads(s.read_text()) for r in runs
                     if (s := Path(r["run_dir"]) / "summary.json").is_file()}
        test = kit.test_file(version)
        r: dict[str, Any] = {"abstain_all_f1": abstain_all(test), "variants": {},
                             "missing": sorted({x["variant"] for x in runs} - set(summaries))}
        if summaries:
            answers, dev, _ = best_evaluations(list(summaries), kit.state / "runs" /
                                               f"v{version}", kit.args.params,
                                               kit.prepared(version), test)
            for v, s in summaries.items():
                res = answers[v][0].result
                r["variants"][v] = {
                    "test_f1": res["f1"], "test_em": res.get("exact_match", res.get("exact")),
                    "na_threshold": answers[v][0].na_threshold,
                    "best_heldout_f1": s.get("best_heldout_f1"), "best_step": s["best_step"],
                    "steps": s["steps"], "train_minutes": s["train_seconds"] / 60,
                    "examples_per_s": s["examples_per_s"], "device": s["device"]}
                log(f"v{version} {v:<15} test F1 {res['f1']:6.2f} ({s['steps']} steps)")
            if len(summaries) > 1:
                r["ensemble"] = metrics.score(dev.doc, voted(answers))
                log(f"v{version} {'ensemble':<15} test F1 {r['ensemble']['f1']:6.2f}")
        out["versions"][version] = r
    return out


# ------------------------------------------------------------------- Ray Train job

def _checkpointed(checkpoints: Path) -> bool:
    """Whether Ray Train's controller registered a reported checkpoint (not only files)."""
    try:
        return "step-" in (checkpoints / "checkpoint_manager_snapshot.json").read_text()
    except OSError:
        return False


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process under it at once, as a lost machine would: the
    driver, its local Ray (GCS, raylet) and the Ray Train worker, which Ray starts in process
    groups of their own (killing the driver's group alone lets the worker train on for a
    moment, long enough to finish a short run)."""
    import psutil

    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=30)


def steps_saved(checkpoints: Path) -> list[int]:
    return sorted(int(d.name.removeprefix("step-")) for d in checkpoints.glob("step-*"))


def ray(kit: Kit) -> dict[str, Any]:
    """`rcpipe train qanet`, a Ray Train job with one worker (NCCL on CUDA), killed with
    SIGKILL (driver, its local Ray and the worker) once a checkpoint is registered, then the
    same command again: Ray Train resumes the run from that checkpoint."""
    try:
        import ray as _  # noqa: F401 - only whether it is there
    except ImportError:
        return {"status": "open", "why": "no Ray on this box yet (its parts still arriving)"}
    a, variant = kit.args, "qanet"
    work = kit.state / "ray-job"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sets = [*kit.data_sets(a.versions[0]), f"train.max_steps={a.ray_steps}",
            f"models.{variant}.max_steps={a.ray_steps}", "train.max_minutes=0",
            "train.epochs=1000", f"train.eval_every={a.ray_eval_every}", "train.max_failures=0"]
    argv = [sys.executable, "-m", "rcpipe", "train", variant, "--params", str(a.params),
            *set_args(sets)]
    logs = work / "first.log", work / "resumed.log"
    t0 = time.monotonic()
    proc = spawn(kit, argv, logs[0], cwd=work)
    runs = work / "models" / variant / "runs"  # the one run, named after its inputs

    def run_dir() -> Path:
        return next(runs.glob("run-*"), runs / "none-yet")

    while not _checkpointed(checkpoints := run_dir()):
        if proc.poll() is not None or kit.left() < RESERVE:
            kill_tree(proc.pid) if proc.poll() is None else None
            raise RuntimeError("no checkpoint before the kill:\n" + tail(logs[0]))
        time.sleep(0.5)
    kill_tree(proc.pid)
    proc.wait()
    killed = {"variant": variant, "checkpoints_at_kill": steps_saved(checkpoints),
              "killed_after_s": round(time.monotonic() - t0, 1)}
    log(f"ray: killed after {killed['killed_after_s']:.0f} s, checkpoints "
        f"{killed['checkpoints_at_kill']}; resuming")
    again = spawn(kit, argv, logs[1], cwd=work, session=False)
    try:
        again.wait(timeout=max(1.0, kit.left() - RESERVE))
    except subprocess.TimeoutExpired:
        kill_tree(again.pid)
        again.wait()
        log("ray: the resumed job ran past the call's time:\n" + tail(logs[1], 1500))
        return {"status": "ran past the call's time", **killed,
                "checkpoints_after": steps_saved(run_dir()),
                "wall_s": round(time.monotonic() - t0, 1)}
    if again.returncode != 0:
        raise RuntimeError("the resumed job failed:\n" + tail(logs[1]))
    s = json.loads((work / "models" / variant / "summary.json").read_text())
    resumed = 0 < s["resumed_from_step"] < s["steps"] == a.ray_steps
    return {"status": "done" if resumed else "not resumed", **killed,
            **{k: s[k] for k in ("steps", "resumed_from_step", "world_size", "device",
                                 "examples_per_s", "best_dev_f1")},
            "backend": "nccl" if s["device"].startswith("cuda") else "gloo",
            "wall_s": round(time.monotonic() - t0, 1)}


# ------------------------------------------------------------------ one child a job

def in_children(kit: Kit, name: str, seconds: float, jobs: dict[str, tuple[list[str], Path]],
                keep: Callable[[str, Any], dict[str, Any]],
                top: Callable[[Any], dict[str, Any]] = lambda got: {}) -> dict[str, Any]:
    """Each job (key: its child's argv, the JSON it writes) a child Python in turn, none past
    the call's time or ``seconds`` in all; ``keep(key, got)`` is the key's results by
    variant, ``top(got)`` what goes beside the results. A job that runs past its time or
    fails leaves the others' results, and <name>.json is written after each: a call stopped
    at its limit keeps them."""
    out: dict[str, Any] = {"results": {}, "skipped": {}}
    ends = time.monotonic() + seconds

    def left() -> float:
        return min(kit.left() - RESERVE / 2, ends - time.monotonic())

    for key, (argv, written) in jobs.items():
        if left() < RESERVE / 2:
            out["skipped"][key] = "the call's time"
            continue
        written.unlink(missing_ok=True)
        try:  # a child Python on the kit's path, its output in the call's log
            code = subprocess.run([sys.executable, *argv], env=kit.env(), cwd=ROOT,
                                  timeout=max(1.0, left()), check=False).returncode
        except subprocess.TimeoutExpired:
            out["skipped"][key] = "ran past the call's time"
            continue
        if code != 0 or not written.is_file():
            out["skipped"][key] = f"failed (exit {code}), see the log"
            continue
        got = json.loads(written.read_text())
        for variant, found in keep(key, got).items():  # a variant's modes from several jobs
            out["results"][variant] = out["results"].get(variant, {}) | found
        out["skipped"] |= got.get("skipped", {})  # a mode that failed in the child, say
        out |= top(got)
        kit.write(name, out)  # so far
    return out


def train_speed(kit: Kit, name: str, seconds: float, jobs: dict[str, tuple[str, list[str]]]
                ) -> dict[str, Any]:
    """bench/train_speed.py, each job (key: its variant, its options) a process of its own (its
    compile state its own), stopped at ``seconds`` in all."""
    a = kit.args
    written = "train_audit.json" if name == "audit" else "train_speed.json"
    children = {key: (["bench/train_speed.py", "--prepared", str(kit.prepared(a.versions[0])),
                       "--params", str(a.params), *set_args(kit.data_sets(a.versions[0])),
                       "--devices", a.device, "--batch", str(a.batch), "--variants", v, *extra,
                       "--out", str(kit.state / name / key / "train_speed.json")],
                      kit.state / name / key / written)
                for key, (v, extra) in jobs.items()}

    def beside(got: dict[str, Any]) -> dict[str, Any]:  # the audit names its one device
        on = got["devices"][a.device] if "devices" in got else {"name": got["device"]}
        found = {k: got[k] for k in ("batch", "mean_context_tokens", "buckets") if k in got}
        return found | {"device": on["name"]} | (
            {"backend": on["step_backend"]} if "step_backend" in on else {})

    return in_children(kit, name, seconds, children,
                       lambda _, got: got["results"] if name == "audit"
                       else got["devices"][a.device]["results"], beside)


def speed(kit: Kit) -> dict[str, Any]:
    """bench/train_speed.py in fp32 (TF32 on CUDA) and bf16 (CUDA only)."""
    a = kit.args
    return train_speed(kit, "speed", kit.capped(a.speed_seconds), {
        v: (v, ["--modes", "fp32", "bf16", "--steps", str(a.speed_steps), "--repeats",
                str(a.speed_repeats), "--warmup", str(a.speed_warmup)])
        for v in SPEED_ORDER if v in a.variants})


def compiled(kit: Kit) -> dict[str, Any]:
    """bench/train_speed.py --step-modes alone (the Worker's TrainStep; inductor on CUDA,
    aot_eager on the CPU), a process a variant and mode: a compile cannot be stopped once
    begun in a process."""
    a = kit.args
    return train_speed(kit, "compiled", kit.capped(a.compile_seconds), {
        f"{v} {mode}": (v, ["--modes", "--step-modes", mode, "--step-shapes",
                            str(a.compile_shapes), "--steps", str(a.speed_steps),
                            "--repeats", str(a.speed_repeats)])
        for v in SPEED_ORDER if v in COMPILE_VARIANTS for mode in COMPILE_MODES})


def audit(kit: Kit) -> dict[str, Any]:
    """bench/train_speed.py --audit: graphs, breaks, host syncs, kernels per step."""
    a = kit.args
    return train_speed(kit, "audit", kit.capped(a.speed_seconds),
                       {v: (v, ["--audit"]) for v in SPEED_ORDER if v in a.variants})


def peers(kit: Kit) -> dict[str, Any]:
    """bench/peers.py for each --peer-models on the device, its peer and the real-text batch
    from the kit (box.PEERS), one process a pair."""
    from bench.gpu.box import PEER_TEXT, PEERS

    a, where = kit.args, kit.args.kit / "base" / "peers"
    jobs = {m: (["-m", "bench.peers", m, str(where / PEERS[m][2]), "--text",
                 str(where / PEER_TEXT), "--device", a.device, "--repeats", str(a.peer_repeats),
                 "--out", str(kit.state / "peers" / f"{m}.json")],
                kit.state / "peers" / f"{m}.json") for m in a.peer_models}
    return in_children(kit, "peers", float("inf"), jobs, lambda m, got: {m: got})


# steps between checkpoints on the GPU, the same on both sides of a pair: a guess of about
# ten a side in 3 minutes at d 32, where a step is launch-bound (the first draw's QANet at
# paper sizes: ~4,000 kernels, 117 ms a step; BiDAF's cuDNN LSTMs far fewer); the CPU's
# cadence would score every few seconds, inside rcpipe's clock. A draw's steps correct it
PEER_EVERY = {"bidaf": 1000, "qanet": 200}


def peer_accuracy(kit: Kit) -> dict[str, Any]:
    """bench/peer_accuracy.py on the device, one seed: each --peer-models pair its own process,
    the pairs at once (four trainings on the one GPU), over the kit's shared-vectors folder.
    A pair costs its minutes M, the faster side's first S steps again (at most M) and the
    scoring, so M is what the call leaves, halved, less a minute."""
    from bench.gpu.box import PEERS

    a, where = kit.args, kit.args.kit / "peer-accuracy"
    minutes = a.peer_minutes or (kit.left() - RESERVE - 60) / 120
    if minutes < 0.5 and not a.peer_minutes:
        raise NotYet(f"{minutes:.2f} min a side: the call's time is too short")
    a.out.mkdir(parents=True, exist_ok=True)  # where the charts go, were this step alone
    children = {}
    for m in a.peer_models:
        out, every = kit.state / "peer-accuracy" / m, a.peer_every or [PEER_EVERY[m]] * 2
        shutil.rmtree(out, ignore_errors=True)  # one seed's figures, this call's
        out.mkdir(parents=True)
        children[m] = out, spawn(kit, [
            sys.executable, "-m", "bench.peer_accuracy", "--models", m, "--seeds", "1",
            "--minutes", f"{minutes:.2f}", "--device", a.device, "--every", *map(str, every),
            "--prepared", str(where / "prepared"), "--split", str(where),
            f"--{m}-peer", str(a.kit / "base" / "peers" / PEERS[m][2]), "--out", str(out)],
            out / "log", session=False)
    got: dict[str, Any] = {"minutes": round(minutes, 2), "results": {}, "skipped": {}}
    for m, (out, child) in children.items():
        try:
            code = child.wait(timeout=max(1.0, kit.left() - RESERVE / 2))
        except subprocess.TimeoutExpired:
            child.kill()
            code = "killed at the call's time"
        if code == 0:
            found = json.loads((out / "peer-accuracy.json").read_text())
            got["results"][m] = found["models"][m] | {"device": found["device"]}
            shutil.copyfile(out / "peer-accuracy.png", a.out / f"peer-accuracy-{m}.png")
        else:
            got["skipped"][m] = f"exit {code}: {' '.join(tail(out / 'log', 600).split())}"
    return got


# ----------------------------------------------------------------------------- main

STEPS: dict[str, Callable[[Kit], dict[str, Any]]] = {
    "setup": setup, "train": train, "audit": audit, "ray": ray, "wait": wait,
    "evaluate": evaluate, "speed": speed, "compiled": compiled, "peers": peers,
    "peer_accuracy": peer_accuracy}


def run_step(kit: Kit, name: str) -> None:
    if name == "evaluate" and (kit.state / "accuracy.json").is_file():
        kit.steps[name] = {"ok": True, "note": "evaluated in an earlier call"}
        return
    t0 = time.monotonic()
    log(f"== {name} ({kit.left():.0f} s of the call left)")
    try:
        result = STEPS[name](kit)
        kit.write({"train": "trainings", "evaluate": "accuracy"}.get(name, name), result)
        kit.steps[name] = {"ok": True}
    except NotYet as e:
        log(f"{name}: {e}")
        kit.steps[name] = {"ok": True, "note": str(e)}
    except Exception as e:  # noqa: BLE001 - one step's failure must not cost the others
        traceback.print_exc()
        sys.stdout.flush()
        kit.steps[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:2000]}"}
        if name == "setup":
            raise
    kit.steps[name]["seconds"] = round(time.monotonic() - t0, 1)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser(__doc__, Path(os.environ.get("OUT") or ROOT / "bench" / "out" / "gpu"))
    ap.add_argument("steps", nargs="+", choices=[*CALLS, *STEPS], metavar="CALL|STEP",
                    help=f"a call ({', '.join(CALLS)}) or steps ({', '.join(STEPS)})")
    ap.add_argument("--steps", dest="which", default="all", choices=["all", "open"])
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "gpu" / "results")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--kit", type=Path, default=ROOT / "gpu-kit")
    ap.add_argument("--state", type=Path, default=Path("/tmp/rcpipe-kit"))
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--versions", nargs="+", default=["1.1"], choices=["1.1", "2.0"])
    ap.add_argument("--minutes", type=float, default=0.0, help="a variant's (0: what is left)")
    ap.add_argument("--train-steps", type=int, default=0, help="steps instead of minutes")
    ap.add_argument("--eval-every", type=int, default=200, help="steps between checkpoints")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--speed-steps", type=int, default=8)
    ap.add_argument("--speed-repeats", type=int, default=3)
    ap.add_argument("--speed-warmup", type=int, default=2)
    ap.add_argument("--speed-seconds", type=float, default=90.0, help="speed's and audit's cap")
    ap.add_argument("--compile-shapes", type=int, default=1, help="the epoch's most frequent")
    ap.add_argument("--compile-seconds", type=float, default=75.0)
    # 100 steps, a checkpoint at 50: on the H200 (2026-11-27) the first run reached its
    # checkpoint at 50 after 47 s, Ray's start included, and 200 steps left the resumed run
    # 150 steps and three evaluations it could not finish in the call
    ap.add_argument("--ray-steps", type=int, default=100)
    ap.add_argument("--ray-eval-every", type=int, default=50)
    ap.add_argument("--peer-models", nargs="+", default=["bidaf", "qanet"],
                    choices=["bidaf", "qanet"])
    ap.add_argument("--peer-repeats", type=int, default=10)
    ap.add_argument("--peer-minutes", type=float, default=0.0,
                    help="peer_accuracy's minutes a side (0: from the call's time)")
    ap.add_argument("--peer-every", type=int, nargs=2, metavar=("RCPIPE", "PEER"),
                    help="peer_accuracy's checkpoint cadence (default: PEER_EVERY)")
    ap.add_argument("--budget", type=float, default=0.0, help="seconds (0: plan.json's, or 555)")
    args = ap.parse_args(argv)
    args.params, args.kit, args.state, args.out, args.results = (
        p.resolve() for p in (args.params, args.kit, args.state, args.out, args.results))
    args.call = args.steps[0] if len(args.steps) == 1 and args.steps[0] in CALLS else "steps"
    args.budget = args.budget or BUDGETS.get(args.call, 555.0)
    return args


def chosen_steps(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The call's name and its steps; with --steps open, setup and the steps still open."""
    steps = [s for x in args.steps for s in CALLS.get(x, (x,))]
    if args.which == "open":
        still = open_steps(args.results, args.versions)
        steps = [s for s in steps if s == "setup" or s in still]
    return args.call, steps


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    call, steps = chosen_steps(args)
    site = args.state / "site"
    site.mkdir(parents=True, exist_ok=True)  # a missing path entry would be cached as such
    sys.path[:0] = [str(site), str(ROOT)]  # setup's wheels and Ray, rcpipe and bench/
    os.environ["PYTHONPATH"] = os.pathsep.join(  # every child: Ray's workers too
        filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH")]))
    kit = Kit(args, chosen=steps)
    log(f"call {call}: {' '.join(steps)} on {args.device}; kit {args.kit}, state {args.state}, "
        f"{args.budget:.0f} s")
    try:
        for name in steps:
            run_step(kit, name)
    finally:
        kit.write(f"call-{call}", {"call": call, "device": args.device, "steps": kit.steps,
                                   "budget_s": args.budget,
                                   "seconds": round(time.monotonic() - kit.started, 1)})
    failed = [s for s, r in kit.steps.items() if not r["ok"]]
    log(f"call {call} done in {time.monotonic() - kit.started:.0f} s"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
