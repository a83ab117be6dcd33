"""Benchmark: `rcpipe train` starting a local Ray of its own against joining one already
running (`ray start --head`, then RAY_ADDRESS), as `dvc repro`'s train stages run one
command after another.

In a temporary workspace on params.demo.yaml's synthetic data (`rcpipe synth`, `rcpipe
prepare`), a head is started with `ray start` under a RAY_TMPDIR of its own; then
``--repeats`` rounds each run `rcpipe train VARIANT --force` for ``--steps`` steps twice, once
without RAY_ADDRESS (its own local Ray) and once with the head's address, the arm that goes
first alternating. Prints each command's wall time, the medians and their ratio; stops the
head by its processes (never `ray stop`, which stops every Ray on the machine).

    OMP_NUM_THREADS=1 .venv/bin/python bench/ray_join.py [--repeats 3] [--variant bidaf]

Run it on an otherwise idle machine and name the machine with the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    """The command's wall seconds; its output's tail and exit 2 if it fails."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({done.returncode}): {done.stderr[-1500:]}")
    return time.perf_counter() - t0


def stop_head(tmp: Path) -> None:
    """Every process of the head started under ``tmp``: its command line or files there, or
    RAY_TMPDIR in its environment (Ray retitles its agents, which outlive a killed raylet)."""
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(str(tmp) in c for c in p.info["cmdline"] or []) or \
                    any(f.path.startswith(str(tmp)) for f in p.open_files()) or \
                    p.environ().get("RAY_TMPDIR") == str(tmp):
                p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="bidaf")
    ap.add_argument("--steps", type=int, default=2, help="training steps a command")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ray-join-"))
    tmp = Path(tempfile.mkdtemp(prefix="rj", dir="/tmp"))  # Ray's sockets: <= 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_TMPDIR": str(tmp), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    try:
        shutil.copy(ROOT / "params.demo.yaml", work / "params.yaml")
        rcpipe = str(BIN / "rcpipe")
        run([rcpipe, "synth"], work, env)
        run([rcpipe, "prepare"], work, env)
        run([str(BIN / "ray"), "start", "--head", "--num-cpus", str(os.cpu_count()),
             "--include-dashboard", "false", "--disable-usage-stats"], work, env)
        address = (tmp / "ray" / "ray_current_cluster").read_text().strip()
        train = [rcpipe, "train", args.variant, "--force", "--set",
                 f"models.{args.variant}.max_steps={args.steps}", "--set",
                 "train.eval_every=0"]
        arms = {"its own local Ray": env, "joins the running head": env | {
            "RAY_ADDRESS": address}}
        walls: dict[str, list[float]] = {name: [] for name in arms}
        for r in range(args.repeats):
            for name in (list(arms) if r % 2 == 0 else list(reversed(arms))):
                walls[name].append(run(train, work, arms[name]))
                print(f"round {r + 1}, {name}: {walls[name][-1]:.1f} s", flush=True)
    finally:
        stop_head(tmp)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    own, joined = (statistics.median(walls[name]) for name in arms)
    print(f"\n`rcpipe train {args.variant}` ({args.steps} steps, params.demo.yaml's synthetic "
          f"data), {os.cpu_count()} cores, median of {args.repeats}")
    print("| arm | wall s, median | each |")
    print("|---|---|---|")
    for name, rows in walls.items():
        print(f"| {name} | {statistics.median(rows):.1f} | "
              f"{', '.join(f'{w:.1f}' for w in rows)} |")
    print(f"joining saves {own - joined:.1f} s a command ({joined / own:.2f}x the wall time)")


if __name__ == "__main__":
    main()
