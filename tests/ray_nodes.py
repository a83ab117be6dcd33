"""Ray nodes started as a cluster's are (`ray start`), each with its own temp dir, on this
machine: the head with the dashboard's Jobs API, more nodes joining it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from rcpipe.cluster.ray_runtime import LOCAL_RAY_ENV

RAY = str(Path(sys.executable).parent / "ray")
# detect a lost node in ~3 s instead of ~30 s (Ray's defaults suit real networks)
FAST_FAILURE = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
                "RAY_health_check_timeout_ms": "1000"}
# Ray Train's controller polls its workers as on rcpipe's local Ray (cluster/ray_runtime.py's
# LOCAL_RAY_ENV): a job's end is seen sooner than at Ray's 2 s
POLL = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
FAST_POLL = {POLL: LOCAL_RAY_ENV[POLL]}


def recorded_steps(run: Path) -> list[int]:
    """The steps of a Ray Train run's checkpoints that its controller recorded (its checkpoint
    manager's snapshot under the run's storage: what a resumed run goes on from), not only
    stored as files; [] before the first."""
    try:
        snapshot = (run / "checkpoint_manager_snapshot.json").read_text()
    except OSError:
        return []
    return sorted({int(n) for n in re.findall(r"step-(\d{8})", snapshot)})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    temp_dir: Path

    def raylet(self) -> psutil.Process:
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if cmd and cmd[0].endswith("raylet") and any(str(self.temp_dir) in c for c in cmd):
                return p
        raise LookupError(f"no raylet under {self.temp_dir}")


def train_workers(under: psutil.Process | None = None) -> list[psutil.Process]:
    """Ray Train worker processes (Ray titles them RayTrainWorker): this machine's, or only
    those descending from ``under`` (a local Ray's raylet is its driver's child), so that a
    test kills its own cluster's worker, never another run's on a shared machine."""
    return actors("RayTrainWorker", under)


def actors(title: str, under: psutil.Process | None = None) -> list[psutil.Process]:
    """Ray actor processes whose title (``ray::<class>``) holds ``title``: this machine's,
    or only those descending from ``under``."""
    found = under.children(recursive=True) if under is not None else psutil.process_iter()
    alive = []
    for p in found:
        with contextlib.suppress(psutil.Error):
            if any(title in part for part in p.cmdline()):
                alive.append(p)
    return alive


def node_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment, Ray's token auth off (a stray ~/.ray/auth_token would turn it on),
    rcpipe's command on PATH for job entrypoints, and ``extra``."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           **FAST_FAILURE, **FAST_POLL, **extra}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("RAY_ADDRESS", None)
    return env


def start(temp_dir: Path, env: dict[str, str], *args: str) -> Node:
    started(temp_dir, env, lambda: list(args))
    return Node(temp_dir)


def start_head(temp_dir: Path, env: dict[str, str], cpus: int) -> tuple[Node, str, str]:
    """(the head, its GCS address, its Jobs API URL)."""
    chosen: dict[str, int] = {}

    def head_args() -> list[str]:
        chosen.update(port=free_port(), dashboard=free_port())
        return ["--head", "--port", str(chosen["port"]), "--num-cpus", str(cpus),
                "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                "--dashboard-port", str(chosen["dashboard"]),
                # the Ray Client server's default port, 10001, is one per machine
                "--ray-client-server-port", str(free_port())]

    started(temp_dir, env, head_args)
    return (Node(temp_dir), f"127.0.0.1:{chosen['port']}",
            f"http://127.0.0.1:{chosen['dashboard']}")


def started(temp_dir: Path, env: dict[str, str], node_args: Callable[[], list[str]],
            attempts: int = 3) -> None:
    """`ray start` under ``temp_dir`` with ``node_args()``. A port picked free can be taken
    by another process before Ray binds it (two pytest workers, each beside Ray daemons that
    bind random ports): a start that fails is cleared away and tried again on fresh ports;
    the last failure raises with what `ray start` printed."""
    for _ in range(attempts):
        temp_dir.mkdir(parents=True, exist_ok=True)
        # every agent port its own: two nodes on one machine (or any other Ray here) would
        # otherwise both take the default ports, and the second node's job agent fails to bind
        ports = [a for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                "--metrics-export-port", "--runtime-env-agent-port")
                 for a in (flag, str(free_port()))]
        done = subprocess.run([RAY, "start", "--temp-dir", str(temp_dir), "--node-ip-address",
                               "127.0.0.1", "--object-store-memory", str(100 * 2**20),
                               "--disable-usage-stats", *ports, *node_args()],
                              env=env, capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return
        kill_under([str(temp_dir)])
        shutil.rmtree(temp_dir, ignore_errors=True)
    printed = (done.stdout + done.stderr).strip().splitlines()[-15:]
    raise RuntimeError(f"`ray start` under {temp_dir} failed {attempts} times, exit "
                       f"{done.returncode}; its last lines:\n" + "\n".join(printed))


def stop_all(nodes: list[Node]) -> None:
    """Every process of these nodes (not `ray stop`: that stops every Ray on the machine):
    those whose command line or open files are under a node's temp dir. Ray retitles its
    dashboard agent and workers (``ray::DashboardAgent``), so the command line alone missed
    them: the agent of a killed raylet then spun at a third of a core for minutes."""
    kill_under([str(node.temp_dir) for node in nodes])
    for node in nodes:
        shutil.rmtree(node.temp_dir.parent, ignore_errors=True)


def kill_under(dirs: list[str]) -> None:
    """Kill every process whose command line or open files lie under one of ``dirs``."""
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(d in c for c in p.info["cmdline"] or [] for d in dirs) or \
                    any(f.path.startswith(d) for f in p.open_files() for d in dirs):
                p.kill()


# Holds the head's only CPU until killed, so that a training worker can start only on another
# node; killing it frees the head for a restarted worker group.
HOLD = textwrap.dedent("""
    import sys, ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
    ray.init(address=sys.argv[1], logging_level="ERROR")
    head = next(n["NodeID"] for n in ray.nodes()
                if n["Alive"] and "node:__internal_head__" in n["Resources"])
    hold = ray.remote(num_cpus=1)(type("Hold", (), {"ready": lambda self: True}))
    actor = hold.options(scheduling_strategy=On(head, soft=False)).remote()
    ray.get(actor.ready.remote())
    print("holding", flush=True)
    sys.stdin.read()
""")


def hold_the_head(gcs: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """A driver holding the head's CPU (kill it to let go)."""
    hold = subprocess.Popen([sys.executable, "-c", HOLD, gcs], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert hold.stdout is not None and hold.stdout.readline().strip() == "holding"
    return hold
