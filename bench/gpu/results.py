"""The GPU kit's draws, kept one after another: each lent box's figures committed as one JSON
under bench/gpu/results/, and what is still missing from all of them.

    .venv/bin/python bench/gpu/results.py record --device "REPLY'S DEVICE" FILES_AT [...]
    .venv/bin/python bench/gpu/results.py open
    .venv/bin/python bench/gpu/results.py plan

``record`` merges the calls' $OUT folders (a later folder's file replaces an earlier one's)
into results/<date>-<commit>.json: the date, the device the device tool's reply named, the
commit the calls ran, and the figures (setup, speed, compiled, accuracy, ray, peers, audit,
peer_accuracy).
``open`` prints the steps whose figures no GPU draw holds yet: what `run.py --steps open`
runs (bench/gpu/README.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "gpu" / "results"
PLAN = json.loads((ROOT / "bench" / "gpu" / "plan.json").read_text())
VARIANTS = ("bidaf", "bidaf_selfattn", "rnet", "rnet_mult", "qanet")
CALLS = PLAN["calls"] + PLAN["then"]  # one draw's, then those for the time it has left
FIGURES = ("setup", "speed", "compiled", "accuracy", "ray", "peers", "audit", "wait",
           "peer_accuracy")
PEER_MODELS = ("bidaf", "qanet")  # bench/peers.py's pairs (box.PEERS)


def draws(results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every committed draw, newest first."""
    found = [json.loads(p.read_text()) | {"file": p.name}
             for p in sorted(results.glob("*.json"))]
    return sorted(found, key=lambda d: (d["date"], d["file"]), reverse=True)


def on_gpu(figures: dict[str, Any]) -> bool:
    setup = figures.get("setup", {})
    return bool(setup.get("gpu")) and setup.get("device") == "cuda"


def has(figures: dict[str, Any], step: str, versions: list[str]) -> bool:
    """Whether a draw's figures hold what ``step`` measures, for every variant it covers."""
    if step == "speed":
        got = figures.get("speed", {}).get("results", {})
        return all({"fp32", "bf16"} <= set(got.get(v, {})) for v in VARIANTS)
    if step == "compiled":
        return "default" in figures.get("compiled", {}).get("results", {}).get("qanet", {})
    if step in ("train", "wait", "evaluate"):
        acc = figures.get("accuracy", {}).get("versions", {})
        return all(v in acc and not acc[v]["missing"] and "ensemble" in acc[v]
                   for v in versions)
    if step == "ray":
        return figures.get("ray", {}).get("status") == "done"
    if step in ("peers", "peer_accuracy"):
        return set(PEER_MODELS) <= set(figures.get(step, {}).get("results", {}))
    if step == "audit":
        return set(VARIANTS) <= set(figures.get("audit", {}).get("results", {}))
    return False  # setup: every call's


def open_steps(results: Path = RESULTS, versions: list[str] | None = None) -> set[str]:
    """The plan's steps no GPU draw has the figures of yet."""
    versions = versions or ["1.1"]
    gpu = [d["figures"] for d in draws(results) if on_gpu(d["figures"])]
    steps = {s for c in CALLS for s in c["steps"]} - {"setup"}
    return {s for s in steps if not any(has(f, s, versions) for f in gpu)}


def plan_table(plan: dict[str, Any] = PLAN) -> str:
    """plan.json as bench/gpu/README.md's table (a test holds the README to it)."""
    def row(name: str, c: dict[str, Any], most: str = "") -> str:
        return (f"| {name} | {', '.join(c['steps'])} | "
                f"{', '.join(f'`{p}`' for p in c['carry'])} | {c['mib_limit']} | "
                f"{most}{c['timeout_s']} | {most}{c['device_minutes']:g} |")

    lines = ["| | steps | carry | MiB at most | timeout_s | device-min |",
             "|---|---|---|---|---|---|",
             f"| start | the machine starts | | | | {plan['start_minutes']:g} |",
             *(row(f"call {c['call']}", c) for c in plan["calls"])]
    total = plan["start_minutes"] + sum(c["device_minutes"] for c in plan["calls"])
    lines.append(f"| in all | | | | | {total:g} of {plan['budget_minutes']} |")
    lines += [row(f"then, time left: call {c['call']}", c, "at most ") for c in plan["then"]]
    return "\n".join(lines) + "\n"


def measured(results: dict[str, Any], skipped: str) -> bool:
    """Whether ``results`` holds what a skipped entry named: "qanet", or "qanet default"."""
    variant, _, mode = skipped.partition(" ")
    return variant in results and (not mode or mode in results[variant])


def merged(dirs: list[Path]) -> dict[str, Any]:
    """The calls' figures, a later folder's file replacing an earlier one's; where both hold
    per-variant ``results`` (speed, compiled, peers, audit), variant by variant, so a call
    that measured the variants an earlier one could not adds to its figures."""
    found: dict[str, Any] = {}
    for d in dirs:
        for path in sorted(d.glob("*.json")):
            if path.stem not in FIGURES:
                continue
            new, old = json.loads(path.read_text()), found.get(path.stem, {})
            if "results" in new and "results" in old:
                results = {**old["results"], **new["results"]}
                skipped = {k: why for k, why in {**old.get("skipped", {}),
                                                  **new.get("skipped", {})}.items()
                           if not measured(results, k)}
                new = {**old, **new, "results": results, "skipped": skipped}
            found[path.stem] = new
    return found


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True, check=True).stdout.strip()


def record(dirs: list[Path], device: str, results: Path = RESULTS, at: str | None = None,
           sha: str | None = None) -> Path:
    """One draw's JSON under ``results``."""
    figures = merged(dirs)
    if not figures:
        raise SystemExit(f"no figures in {', '.join(map(str, dirs))}")
    at, sha = at or time.strftime("%Y-%m-%d"), sha or commit()
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{at}-{sha}.json"
    path.write_text(json.dumps({"date": at, "device": device, "commit": sha,
                                "figures": figures}, indent=1) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="keep one draw's figures")
    rec.add_argument("dirs", nargs="+", type=Path, help="the calls' files_at folders, in order")
    rec.add_argument("--device", required=True, help="the device the tool's reply named")
    rec.add_argument("--results", type=Path, default=RESULTS)
    op = sub.add_parser("open", help="the steps no GPU draw has the figures of")
    op.add_argument("--results", type=Path, default=RESULTS)
    op.add_argument("--versions", nargs="+", default=["1.1"])
    sub.add_parser("plan", help="plan.json as bench/gpu/README.md's table")
    args = ap.parse_args()
    if args.command == "plan":
        print(plan_table(), end="")
    elif args.command == "record":
        print(record(args.dirs, args.device, args.results))
    else:
        print(" ".join(s for c in CALLS for s in c["steps"]
                       if s in open_steps(args.results, args.versions)) or "nothing open")


if __name__ == "__main__":
    main()
