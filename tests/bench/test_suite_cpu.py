"""bench/suite_cpu.py's reading of /proc and of the suite's timeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.suite_cpu import (
    Seen,
    command_of,
    file_processes,
    file_walls,
    heaviest,
    kind_of,
    ray_actor,
    read_cpu,
    started_at,
    summarize,
    worker_of,
)


def test_processes_are_told_apart_by_their_command_lines() -> None:
    py = "/x/.venv/bin/python"
    assert kind_of(f"{py} -u /x/ray/dashboard/agent.py --node-id=1") == "ray dashboard agent"
    assert kind_of("/x/ray/core/src/ray/gcs/gcs_server --port 1") == "ray gcs"
    assert kind_of("ray::TrainController.run") == "ray worker"
    assert kind_of(f"{py} /x/ray/_private/workers/default_worker.py --a") == "ray worker"
    assert kind_of(f"{py} -u -c import sys;exec(eval(sys.stdin.readline()))") == \
        "pytest worker"
    assert kind_of(f"{py} /x/.venv/bin/rcpipe train bidaf") == "rcpipe command"
    assert kind_of(f"{py} /x/.venv/bin/dvc repro") == "dvc"
    assert kind_of(f"{py} -m prefect.runner._workspace_supervisor s.json") == "prefect flow run"
    assert kind_of(f"{py} -c pass") == "python other"
    assert kind_of("/usr/bin/git status") == "git"
    assert ray_actor("ray::RayTrainWorker.run_train_fn") == "RayTrainWorker"
    assert ray_actor("ray::IDLE") == "IDLE" and ray_actor(f"{py} x.py") is None


def test_a_child_process_is_read_with_its_cpu() -> None:
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nend = time.time() + 0.4\nwhile time.time() < end: "
                              "pass\ntime.sleep(30)"])
    try:
        time.sleep(1.0)
        found = [v for k, v in read_cpu(os.sysconf("SC_CLK_TCK")).items()
                 if k.startswith(f"{child.pid}:")]
        assert len(found) == 1
        pid, cpu = found[0]
        command = command_of(pid)
        assert 0.2 < cpu < 1.5 and "time.sleep(30)" in command
    finally:
        child.kill()
        child.wait()


def test_cpu_is_summed_by_kind_and_by_ray_actor_and_kernel_threads_left_out() -> None:
    worker = "/x/bin/python /x/ray/_private/workers/default_worker.py"
    seen = {"1:1": Seen(3.0, worker, "ray::TrainController.run"),
            "2:1": Seen(1.0, worker, "ray::TrainController"),
            "3:1": Seen(4.5, worker, "ray::RayTrainWorker.run"),
            "4:1": Seen(2.0, "/usr/bin/git log", "/usr/bin/git log"), "5:1": Seen(9.0, "", "")}
    got = summarize(seen)
    assert got["total_cpu_s"] == 10.5
    assert got["kinds"][0] == {"kind": "ray worker", "cpu_s": 8.5, "processes": 3}
    assert got["ray_actors"] == [
        {"actor": "RayTrainWorker", "cpu_s": 4.5, "processes": 1},
        {"actor": "TrainController", "cpu_s": 4.0, "processes": 2}]


def test_the_heaviest_processes_are_listed_with_their_titles() -> None:
    worker = "/x/bin/python /x/ray/_private/workers/default_worker.py"
    seen = {"1:1": Seen(3.0, worker, "ray::TrainController.run", "gw0"),
            "2:1": Seen(7.0, "/x/bin/python -m dvc push", "/x/bin/python -m dvc push" + "x" * 300),
            "3:1": Seen(1.0, "/usr/bin/git log", "/usr/bin/git log"), "4:1": Seen(9.0, "", "")}
    got = heaviest(seen, n=2)
    assert [(p["cpu_s"], p["kind"], p["worker"]) for p in got] == [
        (7.0, "python other", ""), (3.0, "ray worker", "gw0")]
    assert len(got[0]["command"]) == 200 and got[1]["command"] == "ray::TrainController.run"


def test_a_files_wall_time_is_its_first_start_to_its_last_end_on_its_worker(
        tmp_path: Path) -> None:
    events = [("gw0", "tests/a.py::t1", "start", 10.0), ("gw0", "tests/a.py::t1", "end", 12.0),
              ("gw0", "tests/a.py::t2", "start", 12.0), ("gw0", "tests/a.py::t2", "end", 15.5),
              ("gw1", "tests/b.py::t", "start", 10.0), ("gw1", "tests/b.py::t", "end", 11.0),
              ("main", "tests/a.py::t1", "start", 10.1), ("main", "tests/a.py::t2", "end", 15.6)]
    timeline = tmp_path / "t.jsonl"
    timeline.write_text("".join(json.dumps({"worker": w, "test": n, "event": e, "t": t}) + "\n"
                                for w, n, e, t in events))
    assert file_walls(timeline) == [{"file": "tests/a.py", "worker": "gw0", "wall_s": 5.5},
                                    {"file": "tests/b.py", "worker": "gw1", "wall_s": 1.0}]


def test_a_retitled_ray_daemon_keeps_the_kind_it_was_launched_as() -> None:
    agent = Seen(2.0, "/x/bin/python -u /x/ray/dashboard/agent.py --node-id=1", "")
    assert not agent.named()  # read again until Ray titles it
    agent.title = "ray::DashboardAgent"
    assert agent.named()
    assert summarize({"1:1": agent})["kinds"] == [
        {"kind": "ray dashboard agent", "cpu_s": 2.0, "processes": 1}]
    assert Seen(1.0, "/x/ray/gcs/gcs_server --port 1", "/x/ray/gcs/gcs_server --port 1").named()


def test_a_child_is_known_by_its_pytest_worker_and_its_start() -> None:
    t0 = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env=os.environ | {"PYTEST_XDIST_WORKER": "gw7"})
    try:
        time.sleep(0.3)
        tick = os.sysconf("SC_CLK_TCK")
        key = next(k for k in read_cpu(tick) if k.startswith(f"{child.pid}:"))
        assert worker_of(child.pid) == "gw7"
        assert t0 - 1.0 < started_at(key, tick) < time.time()
    finally:
        child.kill()
        child.wait()
    assert worker_of(child.pid) == ""  # gone


def test_a_process_is_charged_to_the_file_running_on_its_worker_when_it_started(
        tmp_path: Path) -> None:
    events = [("gw0", "tests/a.py::t1", "start", 10.0), ("gw0", "tests/b.py::t", "start", 20.0),
              ("gw1", "tests/c.py::t", "start", 10.0), ("main", "tests/c.py::t", "start", 10.0)]
    timeline = tmp_path / "t.jsonl"
    timeline.write_text("".join(json.dumps({"worker": w, "test": n, "event": e, "t": t}) + "\n"
                                for w, n, e, t in events))
    worker = "/x/bin/python /x/ray/_private/workers/default_worker.py"
    seen = {"1:1": Seen(2.0, "/x/ray/gcs/gcs_server --port 1", "", "gw0", 11.0),
            "2:1": Seen(5.0, worker, "ray::RayTrainWorker.run", "gw0", 21.0),  # a's Ray, b's job
            "3:1": Seen(1.0, worker, "ray::TrainController.run", "gw1", 12.0),
            "4:1": Seen(7.0, "/usr/bin/git log", "", "", 12.0),  # no worker: not charged
            "5:1": Seen(3.0, "/usr/bin/git log", "", "gw1", 5.0)}  # before any test
    assert file_processes(seen, timeline) == [
        {"file": "tests/b.py", "cpu_s": 5.0, "processes": 1, "ray_clusters": 0,
         "ray_train_jobs": 1},
        {"file": "tests/a.py", "cpu_s": 2.0, "processes": 1, "ray_clusters": 1,
         "ray_train_jobs": 0},
        {"file": "tests/c.py", "cpu_s": 1.0, "processes": 1, "ray_clusters": 0,
         "ray_train_jobs": 0}]
