"""What a Ray Train job costs on a local Ray, in CPU seconds and wall time, with settings side
by side: each arm a fresh driver that starts a local Ray as rcpipe does
(cluster/ray_runtime.start_local_ray) and runs ``--jobs`` Ray Train jobs that do nothing
(one worker, one report), the arms alternated ``--repeats`` times; every process the arm
starts is sampled from /proc (bench/suite_cpu.Sampler), so Ray's daemons and actors count.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ray_job_cost.py [--jobs 4] [--repeats 2]

An arm is a name and the environment it adds (ARMS); run it on an otherwise idle machine:
any other process started meanwhile is counted too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.suite_cpu import RETITLED, Sampler, read_cpu, summarize  # noqa: E402

# Ray's own telemetry, which nothing of rcpipe reads on a local Ray: metrics collection and
# export (each process's metrics agent), task events (the state API's and dashboard's
# record of every task, flushed to the GCS every second)
QUIET = {"RAY_enable_metrics_collection": "0", "RAY_task_events_report_interval_ms": "0",
         "RAY_TRAIN_METRICS_ENABLED": "0"}
ARMS = {"as shipped": {}, "telemetry off": QUIET}

DRIVER = """
import sys, tempfile, time
from rcpipe.cluster.ray_runtime import start_local_ray
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

def nothing():
    ray.train.report({"done": 1})

start_local_ray(2)
storage = tempfile.mkdtemp(prefix="rjc-")
for i in range(int(sys.argv[1])):
    TorchTrainer(nothing, scaling_config=ScalingConfig(num_workers=1),
                 run_config=RunConfig(storage_path=storage, name=f"job-{i}")).fit()
ray.shutdown()
"""


def arm(env: dict[str, str], jobs: int) -> dict[str, Any]:
    """One driver's run: its wall seconds, the CPU seconds of every process it started, and
    those by process (a Ray actor's class, else the kind of process)."""
    sampler = Sampler(0.2, ignore=set(read_cpu(os.sysconf("SC_CLK_TCK"))))
    sampler.start()
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", DRIVER, str(jobs)], cwd=ROOT,
                          env=os.environ | {"PYTHONPATH": str(ROOT)} | env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    time.sleep(1.0)  # the last samples of processes that outlive the driver by a moment
    sampler.stop.set()
    sampler.join()
    if done.returncode != 0:
        raise SystemExit(f"error: the driver failed: {done.stderr[-2000:]}")
    seen = summarize(sampler.seen)
    # each process once: a Ray worker or agent by the class Ray titled it with, any other
    # by its kind (a retitled kind's CPU is its actors'; one never seen retitled counts in
    # the total alone)
    by = {a["actor"]: a["cpu_s"] for a in seen["ray_actors"]} | {
        k["kind"]: k["cpu_s"] for k in seen["kinds"] if k["kind"] not in RETITLED}
    return {"wall_s": round(wall, 1), "cpu_s": seen["total_cpu_s"], "by_process": by}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=4, help="Ray Train jobs in one driver")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of every arm")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "ray_job_cost.json")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ARMS}
    for round_ in range(args.repeats):
        names = list(ARMS) if round_ % 2 == 0 else list(reversed(ARMS))
        for name in names:
            runs[name].append(arm(ARMS[name], args.jobs))
            done = runs[name][-1]
            print(f"round {round_ + 1}, {name}: {done['cpu_s']} CPU s, {done['wall_s']} s",
                  flush=True)
    base = statistics.median(r["cpu_s"] for r in runs["as shipped"])
    print(f"\n{args.jobs} Ray Train jobs that do nothing in one driver on a local Ray, "
          f"{os.cpu_count()} cores; median of {args.repeats}")
    print("| arm | environment | CPU s | CPU s a job | wall s | CPU vs as shipped |")
    print("|---|---|---|---|---|---|")
    for name, rows in runs.items():
        cpu = statistics.median(r["cpu_s"] for r in rows)
        wall = statistics.median(r["wall_s"] for r in rows)
        env = ", ".join(f"`{k}={v}`" for k, v in ARMS[name].items()) or "(none)"
        print(f"| {name} | {env} | {cpu:.1f} | {cpu / args.jobs:.1f} | {wall:.1f} | "
              f"{cpu / base:.2f}x |")
    # where a job's CPU goes (the first arm): Ray Train's actors each start a Ray worker and
    # import ray.train (the controller torch too); the median per job over the rounds
    first = next(iter(ARMS))
    names = {k for r in runs[first] for k in r["by_process"]}
    per_job = {k: statistics.median(r["by_process"].get(k, 0.0) for r in runs[first])
               / args.jobs for k in names}
    print(f"\n{first}: CPU s a job by process (the Ray start shared by the {args.jobs} jobs)")
    print("| process | CPU s a job |")
    print("|---|---|")
    for k, v in sorted(per_job.items(), key=lambda kv: -kv[1]):
        if v >= 0.05:
            print(f"| {k} | {v:.2f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"jobs": args.jobs, "arms": ARMS, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
