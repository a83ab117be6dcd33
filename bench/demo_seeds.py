"""The demo's dev curves over several seeds: where each variant has flattened.

    .venv/bin/python bench/demo_seeds.py [--seeds 42 43 44] [--steps-factor 2] \
        [--eval-every 50] [--variants ...] [--set key=value ...] [--lanes 2]

`make demo`'s table comes from one seed at a fixed number of steps per variant
(``models.<v>.max_steps`` in params.demo.yaml). Where those steps sit on the steep part of a
curve, another seed (another dropout mask, another shuffle) moves a variant by 20-40 F1,
and so does any change that shifts the random stream. This trains each variant on the demo
data (synth and prepare once, in a fresh directory) with each seed for ``--steps-factor``
times its demo steps (or ``--steps``), in one plain process a run (python -m
rcpipe.train.local: the Worker the demo's Ray Train jobs run, world size 1), scores dev every
``--eval-every`` steps, and reports per variant and step the mean, min and max dev F1 over
the seeds, and the first step from which the spread (max - min) stays within ``--spread``
(5 F1). Dev here is the synthetic dev set, as in the demo's table; the demo data is
generated, so nothing here touches real SQuAD.

Writes bench/out/demo_seeds.json and bench/out/demo_seeds.png (a panel per variant: each
seed's curve, the demo's step marked).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from accuracy import _sets, panels

from rcpipe.config import VARIANTS, load_config

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.demo.yaml"


def setup(work: Path, sets: list[str]) -> None:
    """rcpipe synth and prepare of the demo preset in ``work`` (as the demo's first stages)."""
    for command in ("synth", "prepare"):
        subprocess.run([sys.executable, "-m", "rcpipe", command, "--params", str(PARAMS),
                        *_sets(sets)], cwd=work, check=True, capture_output=True)


def curve(work: Path, variant: str, seed: int, steps: int, args: argparse.Namespace
          ) -> list[dict[str, Any]]:
    """One run's dev curve: [{step, f1, em}] every ``eval_every`` steps up to ``steps``."""
    run_dir = work / "runs" / (args.tag or "default") / f"{variant}-seed{seed}"
    sets = [f"train.seed={seed}", f"models.{variant}.max_steps={steps}",
            f"train.eval_every={args.eval_every}", "train.threads=1",
            # steps, not minutes or epochs, end the run: a loaded machine gets the same curve
            f"models.{variant}.max_minutes=600", "train.max_minutes=600", "train.epochs=1000",
            *args.sets]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with run_dir.with_suffix(".log").open("w") as log:
        subprocess.run([sys.executable, "-m", "rcpipe.train.local", variant,
                        "--params", str(PARAMS), "--run-dir", str(run_dir), *_sets(sets)],
                       cwd=work, check=True, stdout=subprocess.DEVNULL, stderr=log,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    history = json.loads((run_dir / "summary.json").read_text())["history"]
    print(f"  {variant} seed {seed}: {steps} steps in {time.perf_counter() - t0:.0f} s, "
          f"dev F1 {history[-1]['f1']:.1f} at the end", flush=True)
    return [{"step": h["step"], "f1": h["f1"], "em": h["em"]} for h in history]


def spread_table(curves: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per step every seed reached: mean, min, max and spread of dev F1 over the seeds."""
    by_step: dict[int, list[float]] = {}
    for points in curves.values():
        for p in points:
            by_step.setdefault(p["step"], []).append(p["f1"])
    rows = []
    for step, f1s in sorted(by_step.items()):
        if len(f1s) == len(curves):
            rows.append({"step": step, "mean": sum(f1s) / len(f1s), "min": min(f1s),
                         "max": max(f1s), "spread": max(f1s) - min(f1s)})
    return rows


def flat_from(rows: list[dict[str, Any]], spread: float) -> int | None:
    """The first step from which every later step's spread stays within ``spread``."""
    found = None
    for r in rows:
        if r["spread"] <= spread:
            found = found if found is not None else r["step"]
        else:
            found = None
    return found


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    variants = list(result["variants"])
    fig, axes = panels(len(variants), 4, 3.6)
    for ax, v in zip(axes, variants, strict=True):
        r = result["variants"][v]
        for seed, points in r["curves"].items():
            ax.plot([p["step"] for p in points], [p["f1"] for p in points], marker=".",
                    label=f"seed {seed}")
        ax.axvline(r["demo_steps"], color="grey", linestyle=":", label="demo's steps")
        ax.set(title=v, xlabel="step", ylabel="dev F1", ylim=(0, 100))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("demo preset, synthetic dev: dev F1 by step, one line a seed")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[42, 43, 44])
    ap.add_argument("--steps-factor", type=float, default=2.0,
                    help="train each variant this many times its demo steps")
    ap.add_argument("--steps", type=int, default=0, help="steps for every variant instead")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--spread", type=float, default=5.0, help="F1 spread that counts as flat")
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--workdir", type=Path, help="reuse a directory (default: a fresh one)")
    ap.add_argument("--tag", default="", help="a name for this run's runs and outputs "
                    "(demo_seeds-<tag>.json): another setting in the same directory")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rcpipe-demo-seeds-"))
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "data" / "prepared" / "train.parquet").is_file():
        setup(work, args.sets)
    cfg = load_config(PARAMS, args.sets)
    demo_steps = {v: cfg.models.of(v).max_steps for v in args.variants}
    steps = {v: args.steps or int(demo_steps[v] * args.steps_factor) for v in args.variants}
    print(f"{work}: {len(args.variants)} variants x {len(args.seeds)} seeds, "
          f"{args.lanes} at a time", flush=True)
    t0 = time.perf_counter()
    # the longest runs first, so the lanes end together
    jobs = sorted(((v, s) for v in args.variants for s in args.seeds),
                  key=lambda j: -steps[j[0]] * (cfg.models.minutes(j[0], 1) or 1))
    with ThreadPoolExecutor(args.lanes) as pool:
        futures = {j: pool.submit(curve, work, j[0], j[1], steps[j[0]], args) for j in jobs}
        curves = {j: f.result() for j, f in futures.items()}
    result: dict[str, Any] = {"workdir": str(work), "seeds": args.seeds, "sets": args.sets,
                              "spread_limit": args.spread, "eval_every": args.eval_every,
                              "wall_s": time.perf_counter() - t0, "variants": {}}
    print(f"\n{'variant':<15} {'demo steps':>10} {'F1 there: mean [min, max]':>28} "
          f"{'flat from step':>15}")
    for v in args.variants:
        per_seed = {s: curves[(v, s)] for s in args.seeds}
        rows = spread_table(per_seed)
        at_demo = next((r for r in rows if r["step"] == demo_steps[v]), None)
        flat = flat_from(rows, args.spread)
        result["variants"][v] = {"demo_steps": demo_steps[v], "steps": steps[v],
                                 "flat_from": flat, "by_step": rows, "curves": per_seed}
        there = (f"{at_demo['mean']:.1f} [{at_demo['min']:.1f}, {at_demo['max']:.1f}]"
                 if at_demo else "not scored")
        print(f"{v:<15} {demo_steps[v]:>10} {there:>28} {flat if flat else 'never':>15}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"demo_seeds{'-' + args.tag if args.tag else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / f"{stem}.png")
    print(f"-> {args.out / stem}.json, .png")


if __name__ == "__main__":
    main()
