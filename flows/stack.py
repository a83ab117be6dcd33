"""`make up` / `make down`: the embedded Prefect stack on 127.0.0.1, in the background.

up:   a Prefect server (SQLite under .prefect/ in the project), the process work pool
      `rcpipe-local`, the deployment train-all/local applied from prefect.yaml, a worker;
      then PREFECT_API_URL is set in the caller's Prefect profile, so that
      `prefect deployment run train-all/local --watch` talks to this server.
down: stops the worker and the server, and unsets PREFECT_API_URL again.

    python -m flows.stack up [--port 4200] [--home .prefect]
    python -m flows.stack down [--home .prefect]

The process ids and the API URL are kept in <home>/stack.json; logs in <home>/*.log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POOL = "rcpipe-local"


def _prefect() -> str:
    return shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"


def server_env(home: Path, api_url: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api_url,
            "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false"}


def _wait_healthy(api_url: str, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"error: {log}: the Prefect server did not answer within {timeout:.0f}s")


def _run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> None:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(args[1:4])}: {done.stderr.strip()[-500:]}")


def start_server(port: int, home: Path) -> dict[str, object]:
    """A bare Prefect server (no pool, no deployment) on 127.0.0.1:port, its SQLite in
    ``home``, once it answers; ``down(home)`` stops it. `up` builds on it, and
    tests/integration/test_infra_docs.py runs infra/'s documented commands against it."""
    home.mkdir(parents=True, exist_ok=True)
    if (home / "stack.json").exists():
        down(home, quiet=True)
    api_url = f"http://127.0.0.1:{port}/api"
    server = subprocess.Popen(
        [_prefect(), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=server_env(home, api_url), cwd=ROOT, stdout=(home / "server.log").open("w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    stack: dict[str, object] = {"api_url": api_url, "server": server.pid}
    (home / "stack.json").write_text(json.dumps(stack))
    print(f"prefect server: starting on {api_url} (first start migrates SQLite: ~1 min)")
    try:
        _wait_healthy(api_url, home / "server.log")
    except BaseException:
        down(home, quiet=True)
        raise
    return stack


def up(port: int, home: Path) -> dict[str, object]:
    stack = start_server(port, home)
    api_url = str(stack["api_url"])
    env = server_env(home, api_url)
    prefect = _prefect()
    try:
        _run([prefect, "work-pool", "create", POOL, "--type", "process", "--overwrite"], env)
        _run([prefect, "--no-prompt", "deploy", "--name", "local"], env)
        worker = subprocess.Popen(
            [prefect, "worker", "start", "--pool", POOL, "--type", "process"],
            env=env, cwd=ROOT, stdout=(home / "worker.log").open("w"),
            stderr=subprocess.STDOUT, start_new_session=True)
    except BaseException:
        down(home, quiet=True)  # no server left behind by a half-started stack
        raise
    stack["worker"] = worker.pid
    (home / "stack.json").write_text(json.dumps(stack))
    # the caller's profile (its own PREFECT_HOME) learns where the server is
    _run([prefect, "config", "set", f"PREFECT_API_URL={api_url}"],
         {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"})
    print(f"up: server {api_url}, work pool {POOL}, worker, deployment train-all/local.\n"
          "  prefect deployment run train-all/local --watch")
    return stack


def down(home: Path, quiet: bool = False) -> None:
    path = home / "stack.json"
    if not path.exists():
        if not quiet:
            print("down: nothing is running")
        return
    stack = json.loads(path.read_text())
    for name in ("worker", "server"):
        pid = stack.get(name)
        if isinstance(pid, int):
            _stop(pid)
    path.unlink()
    if not quiet:
        subprocess.run([_prefect(), "config", "unset", "PREFECT_API_URL", "-y"],
                       capture_output=True)
        print("down: worker and server stopped")


def _stop(pid: int, grace: float = 20) -> None:
    """SIGTERM the process group (the process and its children), SIGKILL after ``grace``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:  # reap it when it is our own child (tests); else init does
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--port", type=int, default=4200)
    ap.add_argument("--home", type=Path, default=ROOT / ".prefect")
    args = ap.parse_args()
    if args.action == "up":
        up(args.port, args.home.resolve())
    else:
        down(args.home.resolve())


if __name__ == "__main__":
    main()
