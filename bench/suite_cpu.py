"""Benchmark: where the test suite's CPU goes, by kind of process, and each file's wall time.

`make test` on two cores is CPU-bound (both cores busy ~95% of its wall time), so it gets
faster only by doing less work: this script says which work. It runs the suite's own
command (`make test`'s pytest line: two workers, one torch thread each) while a sampler
reads /proc every ``--interval`` seconds: each process's CPU seconds (user + system, all its
threads) and its command line (a Ray worker's read again until Ray has retitled it
``ray::TrainController``, so Ray's actors are told apart; its kind is the command it was
launched with). Processes that live less than
one interval are missed (their CPU is small). A pytest plugin (``-p bench.suite_cpu``)
records when each test started and finished on which worker; a process is charged to the
test file that was running on the pytest worker named in its environment
(``PYTEST_XDIST_WORKER``, which a Ray node's daemons and the workers they launch inherit
from the process that started the node) when the process started: so each file's Ray
clusters (GCS servers), Ray Train jobs (RayTrainWorker actors) and CPU are counted.

    .venv/bin/python bench/suite_cpu.py                 # the whole suite
    .venv/bin/python bench/suite_cpu.py tests/stages    # a part of it, any pytest arguments

Prints the suite's wall time, the CPU by kind of process (with the count and the CPU per
process), Ray's actors by class, the files that held a worker longest and the files whose
processes took most CPU (with their Ray clusters and Ray Train jobs); writes
bench/out/suite_cpu.json. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
TIMELINE_ENV = "RCPIPE_SUITE_TIMELINE"  # the plugin appends to the file this names

# (kind, what in a command line marks it), first match wins: the raylet and the GCS first (the
# raylet's own command line names the agent's and the workers' scripts it launches)
KINDS = (
    ("ray raylet", "/raylet/raylet "),
    ("ray gcs", "/gcs/gcs_server "),
    ("ray dashboard agent", "ray/dashboard/agent.py"),
    ("ray dashboard agent", "ray::DashboardAgent"),  # its title, if first seen retitled
    ("ray runtime-env agent", "runtime_env/agent/main.py"),
    ("ray runtime-env agent", "ray::RuntimeEnvAgent"),
    ("ray dashboard", "ray/dashboard/dashboard.py"),
    ("ray log monitor", "ray/_private/log_monitor.py"),
    ("ray autoscaler monitor", "autoscaler/_private/monitor.py"),
    ("ray worker", "workers/default_worker.py"),
    ("ray worker", "workers/setup_worker.py"),
    ("ray worker", "ray::"),
    ("pytest worker", "import sys;exec(eval(sys.stdin.readline()))"),  # xdist's
    ("prefect server", "prefect.server"),
    ("prefect server", "prefect server start"),
    ("prefect flow run", "prefect.runner"),
    ("prefect flow run", "prefect.engine"),
    ("prefect other", "prefect"),
    ("dvc", "/bin/dvc"),
    ("rcpipe command", "/bin/rcpipe"),
    ("rcpipe command", "-m rcpipe"),
    ("bench script", "bench/"),
    ("pytest", "pytest"),
)

RETITLED = {"ray worker", "ray dashboard agent", "ray runtime-env agent"}  # ray::<class>


def kind_of(command: str) -> str:
    """The kind of process a command line is (KINDS), else its program's name."""
    for kind, mark in KINDS:
        if mark in command:
            return kind
    program = command.split(" ", 1)[0]
    return "python other" if "python" in program else Path(program).name or "unnamed"


def ray_actor(command: str) -> str | None:
    """A Ray worker's actor class (``ray::TrainController.run`` -> TrainController)."""
    found = re.match(r"ray::(\w+)", command)
    return found.group(1) if found else None


def read_cpu(tick: float) -> dict[str, tuple[int, float]]:
    """Every process now: ``pid:start`` -> (pid, CPU seconds so far); ``start`` is in clock
    ticks after boot (started_at turns it into a time)."""
    now: dict[str, tuple[int, float]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone between listing and reading
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
        now[f"{pid}:{fields[19]}"] = (int(pid), (int(fields[11]) + int(fields[12])) / tick)
    return now


@functools.cache
def boot_time() -> float:
    return next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))


def started_at(key: str, tick: float) -> float:
    """The wall time a process started, from read_cpu's ``pid:start`` key."""
    return boot_time() + int(key.split(":")[1]) / tick


def worker_of(pid: int) -> str:
    """The pytest worker named in a process's environment ('' when none or unreadable)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    mark = b"PYTEST_XDIST_WORKER="
    return next((e[len(mark):].decode() for e in environ if e.startswith(mark)), "")


def command_of(pid: int) -> str:
    """A process's command line as it reads now ('' once gone, or for a kernel thread)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return ""


@dataclass
class Seen:
    """A process started during the run: its CPU seconds so far (all of them count), the
    command it was launched with (its kind) and its title now (a Ray actor's class)."""

    cpu: float
    launch: str
    title: str
    worker: str = ""  # the pytest worker in its environment (worker_of)
    started: float = 0.0  # its start, wall time (started_at)

    def named(self) -> bool:
        """Whether its title is final: Ray retitles the processes it launches, a worker
        first ``ray::IDLE``, then its actor's class."""
        return kind_of(self.launch) not in RETITLED or \
            ray_actor(self.title) not in (None, "IDLE")


class Sampler(threading.Thread):
    """Reads /proc until stopped: each process's CPU seconds, its command line once, and
    a Ray process's again until Ray has named it."""

    def __init__(self, interval: float, ignore: set[str]) -> None:
        super().__init__(daemon=True)
        self.interval, self.ignore = interval, ignore
        self.seen: dict[str, Seen] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self.stop.is_set():
            for key, (pid, cpu) in read_cpu(tick).items():
                if key in self.ignore:
                    continue
                entry = self.seen.get(key)
                if entry is None:
                    command = command_of(pid)
                    self.seen[key] = Seen(cpu, command, command, worker_of(pid),
                                          started_at(key, tick))
                    continue
                entry.cpu = cpu
                if not entry.named():
                    entry.title = command_of(pid) or entry.title
            self.stop.wait(self.interval)


def summarize(seen: dict[str, Seen]) -> dict[str, Any]:
    """CPU seconds by kind of process (as launched) and by Ray actor class (as titled)."""
    kinds: Counter[str] = Counter()
    count: Counter[str] = Counter()
    actors: Counter[str] = Counter()
    actor_count: Counter[str] = Counter()
    for process in seen.values():
        if not process.launch:  # a kernel thread
            continue
        kind = kind_of(process.launch)
        kinds[kind] += process.cpu
        count[kind] += 1
        actor = ray_actor(process.title)
        if actor:
            actors[actor] += process.cpu
            actor_count[actor] += 1
    return {"total_cpu_s": round(sum(kinds.values()), 1),
            "kinds": [{"kind": k, "cpu_s": round(v, 1), "processes": count[k]}
                      for k, v in kinds.most_common()],
            "ray_actors": [{"actor": a, "cpu_s": round(v, 1), "processes": actor_count[a]}
                           for a, v in actors.most_common()]}


def heaviest(seen: dict[str, Seen], n: int = 40) -> list[dict[str, Any]]:
    """The ``n`` processes that used most CPU: each one's CPU seconds, kind, pytest worker
    and command line as titled (cut to 200 characters): what a kind's total is made of."""
    top = sorted((p for p in seen.values() if p.launch), key=lambda p: -p.cpu)[:n]
    return [{"cpu_s": round(p.cpu, 1), "kind": kind_of(p.launch), "worker": p.worker,
             "command": p.title[:200]} for p in top]


def file_walls(timeline: Path) -> list[dict[str, Any]]:
    """Each test file's wall seconds on the worker that ran it (first start to last end)."""
    events = [json.loads(line) for line in timeline.read_text().splitlines()]
    if any(e["worker"] != "main" for e in events):  # xdist's controller hears them all too
        events = [e for e in events if e["worker"] != "main"]
    spans: dict[tuple[str, str], list[float]] = {}
    for event in events:
        key = (event["worker"], event["test"].split("::")[0])
        span = spans.setdefault(key, [event["t"], event["t"]])
        span[0], span[1] = min(span[0], event["t"]), max(span[1], event["t"])
    return sorted(({"file": f, "worker": w, "wall_s": round(b - a, 1)}
                   for (w, f), (a, b) in spans.items()), key=lambda r: -r["wall_s"])


def file_processes(seen: dict[str, Seen], timeline: Path) -> list[dict[str, Any]]:
    """Per test file, what its processes cost: each process with a pytest worker in its
    environment is charged to the test that had last started on that worker when the
    process started (the file's fixtures included); its CPU, its Ray clusters (GCS
    servers) and its Ray Train jobs (RayTrainWorker actors, one per job of one worker)."""
    starts: dict[str, list[tuple[float, str]]] = {}
    for line in timeline.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "start" and event["worker"] != "main":
            starts.setdefault(event["worker"], []).append((event["t"], event["test"]))
    for events in starts.values():
        events.sort()
    rows: dict[str, dict[str, Any]] = {}
    for process in seen.values():
        events = starts.get(process.worker, [])
        last = bisect.bisect_right(events, process.started, key=lambda e: e[0])  # started after
        if not last or not process.launch:
            continue
        file = events[last - 1][1].split("::")[0]
        row = rows.setdefault(file, {"file": file, "cpu_s": 0.0, "processes": 0,
                                     "ray_clusters": 0, "ray_train_jobs": 0})
        row["cpu_s"] += process.cpu
        row["processes"] += 1
        row["ray_clusters"] += kind_of(process.launch) == "ray gcs"
        row["ray_train_jobs"] += ray_actor(process.title) == "RayTrainWorker"
    for row in rows.values():
        row["cpu_s"] = round(row["cpu_s"], 1)
    return sorted(rows.values(), key=lambda r: -r["cpu_s"])


# --------------------------------------------------------------- the pytest plugin (-p)


def _record(nodeid: str, event: str) -> None:
    path = os.environ.get(TIMELINE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": nodeid, "event": event, "t": time.time(),
                                "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}) + "\n")


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _record(nodeid, "start")


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _record(nodeid, "end")


# ------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pytest_args", nargs="*", help="what pytest runs (default: the suite)")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--workers", default="2", help="pytest -n, as `make test` (2)")
    args = ap.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    timeline = OUT / "suite_timeline.jsonl"
    timeline.unlink(missing_ok=True)
    # `make test`'s command, with the plugin; one torch thread a process, as there
    command = [sys.executable, "-m", "pytest", "-n", args.workers, "--dist", "loadfile",
               "--no-loadscope-reorder", "-q", "-p", "bench.suite_cpu", *args.pytest_args]
    env = os.environ | {"OMP_NUM_THREADS": "1", TIMELINE_ENV: str(timeline),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                    os.environ.get("PYTHONPATH")]))}
    sampler = Sampler(args.interval, ignore=set(read_cpu(os.sysconf("SC_CLK_TCK"))))
    sampler.start()
    t0 = time.perf_counter()
    ran = subprocess.run(command, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()

    result = {"command": " ".join(command[1:]), "returncode": ran.returncode,
              "wall_s": round(wall, 1), "cores": os.cpu_count(),
              **summarize(sampler.seen), "heaviest": heaviest(sampler.seen),
              "files": file_walls(timeline) if timeline.exists() else [],
              "file_processes": file_processes(sampler.seen, timeline)
              if timeline.exists() else []}
    result["busy_share"] = round(result["total_cpu_s"] / (wall * (os.cpu_count() or 1)), 2)
    (OUT / "suite_cpu.json").write_text(json.dumps(result, indent=1) + "\n")

    print(f"\nsuite: {wall:.0f} s wall, exit {ran.returncode}; {result['total_cpu_s']:.0f} "
          f"CPU s on {result['cores']} cores (busy {result['busy_share']:.0%})")
    print(f"{'kind of process':28} {'CPU s':>8} {'share':>6} {'procs':>6} {'CPU s each':>10}")
    for row in result["kinds"][:16]:
        print(f"{row['kind']:28} {row['cpu_s']:8.1f} "
              f"{row['cpu_s'] / max(result['total_cpu_s'], 1e-9):6.0%} {row['processes']:6d} "
              f"{row['cpu_s'] / row['processes']:10.1f}")
    print(f"\n{'Ray actor':28} {'CPU s':>8} {'procs':>6} {'CPU s each':>10}")
    for row in result["ray_actors"][:12]:
        print(f"{row['actor']:28} {row['cpu_s']:8.1f} {row['processes']:6d} "
              f"{row['cpu_s'] / row['processes']:10.1f}")
    print(f"\n{'test file (longest on a worker)':60} {'worker':>6} {'wall s':>7}")
    for row in result["files"][:15]:
        print(f"{row['file']:60} {row['worker']:>6} {row['wall_s']:7.1f}")
    jobs = sum(r["ray_train_jobs"] for r in result["file_processes"])
    clusters = sum(r["ray_clusters"] for r in result["file_processes"])
    print(f"\n{'test file (its processes)':52} {'CPU s':>7} {'procs':>6} {'Ray':>4} "
          f"{'Train jobs':>10}   (in all: {clusters} Ray clusters, {jobs} Ray Train jobs)")
    for row in result["file_processes"][:25]:
        print(f"{row['file']:52} {row['cpu_s']:7.1f} {row['processes']:6d} "
              f"{row['ray_clusters']:4d} {row['ray_train_jobs']:10d}")
    print(f"\nwritten: {OUT / 'suite_cpu.json'}")
    sys.exit(ran.returncode)


if __name__ == "__main__":
    main()
