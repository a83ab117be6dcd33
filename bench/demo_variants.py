"""Every variant through the CLI on the demo preset, in a fresh directory, timed.

    .venv/bin/python bench/demo_variants.py [--lanes 2] [--variants ...] [--set key=value ...]

synth and prepare once, then `rcpipe train V` followed by `rcpipe evaluate V` for each
variant, ``--lanes`` variants at a time (the demo preset gives each job one CPU, so two
lanes fill a 2-core machine; the longest time limits go first). Prints, per variant, the
dev EM/F1 and the wall seconds of its train and evaluate commands (Ray's start-up
included); writes bench/out/demo_variants.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rcpipe.config import VARIANTS, load_config

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.demo.yaml"


def rcpipe(work: Path, *args: str, sets: list[str]) -> float:
    """Run one rcpipe command in ``work``; its wall seconds."""
    cmd = [sys.executable, "-m", "rcpipe", *args, "--params", str(PARAMS)]
    cmd += [a for s in sets for a in ("--set", s)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rcpipe {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - t0


def lane(work: Path, variant: str, sets: list[str]) -> dict[str, float]:
    train_s = rcpipe(work, "train", variant, sets=sets)
    evaluate_s = rcpipe(work, "evaluate", variant, sets=sets)
    metrics = json.loads((work / "metrics" / f"{variant}.json").read_text())
    summary = json.loads((work / "models" / variant / "summary.json").read_text())
    return {"em": metrics["exact_match"], "f1": metrics["f1"], "train_s": train_s,
            "evaluate_s": evaluate_s, "steps": summary["steps"],
            "examples_per_s": summary["examples_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rcpipe-demo-variants-"))
    t0 = time.perf_counter()
    setup = {"synth_s": rcpipe(work, "synth", sets=args.sets),
             "prepare_s": rcpipe(work, "prepare", sets=args.sets)}
    cfg = load_config(PARAMS, args.sets)
    order = sorted(args.variants, reverse=True,
                   key=lambda v: cfg.models.minutes(v, cfg.train.max_minutes) or float("inf"))
    with ThreadPoolExecutor(args.lanes) as pool:
        futures = {v: pool.submit(lane, work, v, args.sets) for v in order}
        results = {v: futures[v].result() for v in args.variants}
    wall = time.perf_counter() - t0
    print(f"\n{'variant':<15} {'EM':>6} {'F1':>6} {'train s':>8} {'evaluate s':>10} "
          f"{'steps':>6} {'ex/s':>6}   ({args.lanes} lanes, {work})")
    for v, r in results.items():
        print(f"{v:<15} {r['em']:>6.1f} {r['f1']:>6.1f} {r['train_s']:>8.0f} "
              f"{r['evaluate_s']:>10.0f} {r['steps']:>6} {r['examples_per_s']:>6.0f}")
    print(f"synth {setup['synth_s']:.0f}s, prepare {setup['prepare_s']:.0f}s, "
          f"{wall:.0f}s in all")
    out = ROOT / "bench" / "out" / "demo_variants.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workdir": str(work), "lanes": args.lanes, "sets": args.sets,
                               "setup": setup, "wall_s": wall, "results": results},
                              indent=1) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
