"""`make demo` as a user on a fresh, busy machine runs it: a new PREFECT_HOME, CPU-bound
processes beside it, a fresh directory; timed, with every variant's steps and scores.

    .venv/bin/python bench/demo_under_load.py [--burners 2] [--set key=value ...]
    .venv/bin/python bench/demo_under_load.py --burners 0 --seeds 42 43 44 \\
        --plot docs/results/demo-seeds.png                                   # docs/results/demo.md

The demo (`python -m flows.demo`) runs with PREFECT_HOME new (its first run migrates the
database; the demo's own line says how long, against Prefect's 20 s start-up limit) beside
``--burners`` busy processes (0: the idle run). ``--seeds S ...`` runs it once per
``train.seed``, each afresh, and ends with every model's dev F1 as mean [min, max] over the
seeds: the demo table of docs/results/demo.md (README.md shows it). Writes
bench/out/demo_under_load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import OUT, ROOT, parser, write

SPIN = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass"


def run_demo(work: Path, home: Path, sets: list[str]) -> tuple[int, str, float]:
    """The demo in ``work`` with ``home`` as PREFECT_HOME: (exit code, its output, seconds);
    its lines are shown as they come."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1"}
    # this checkout's rcpipe in the Ray workers too (they inherit the environment, not the
    # directory), even where the venv's editable install is another checkout's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "flows.demo", "--workdir", str(work), *sets]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    return proc.wait(), "".join(lines), time.perf_counter() - t0


def variant_rows(work: Path) -> dict[str, dict[str, float]]:
    rows = {}
    for summary in sorted(work.glob("models/*/summary.json")):
        v = summary.parent.name
        s = json.loads(summary.read_text())
        m = json.loads((work / "metrics" / f"{v}.json").read_text())
        rows[v] = {"steps": s["steps"], "examples_per_s": s["examples_per_s"],
                   "best_step": s.get("best_step"), "em": m["exact_match"], "f1": m["f1"]}
    ensemble = work / "metrics" / "ensemble.json"
    if ensemble.is_file():
        m = json.loads(ensemble.read_text())
        rows["ensemble"] = {"em": m["exact_match"], "f1": m["f1"]}
    return rows


def one_demo(args: argparse.Namespace, sets: list[str]) -> dict[str, Any]:
    """The demo once, in a fresh directory and PREFECT_HOME, with the burners beside it."""
    base = Path(tempfile.mkdtemp(prefix="rcpipe-demo-under-load-"))
    work, home = base / "work", base / "prefect-home"
    burners = [subprocess.Popen([sys.executable, "-c", SPIN, str(args.burn_minutes * 60)])
               for _ in range(args.burners)]
    try:
        code, out, wall = run_demo(work, home, sets)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    migration = re.search(r"Prefect's database ready in (\d+) s", out)
    result = {"burners": args.burners, "cpus": os.cpu_count(), "exit_code": code,
              "wall_s": round(wall, 1), "migration_s": int(migration[1]) if migration else None,
              "prefect_startup_limit_s": 20, "sets": sets, "dir": str(base),
              "variants": variant_rows(work) if code == 0 else {}}
    print(f"\n{args.burners} burner(s) on {os.cpu_count()} CPUs: exit {code}, "
          f"{wall / 60:.1f} min; Prefect's database migrated in "
          f"{result['migration_s']} s (Prefect's start-up limit: 20 s)")
    print(f"{'model':<15} {'steps':>6} {'best at':>7} {'ex/s':>6} {'EM':>6} {'F1':>6}")
    for v, r in result["variants"].items():
        print(f"{v:<15} {r.get('steps', ''):>6} {r.get('best_step', ''):>7} "
              f"{r.get('examples_per_s', ''):>6} {r['em']:>6.1f} {r['f1']:>6.1f}")
    return result


def over_seeds(runs: dict[int, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each model's dev F1 and EM over the seeds' demos: mean, min and max."""
    models = next(iter(runs.values()))["variants"]
    table = {}
    for m in models:
        f1s = [r["variants"][m]["f1"] for r in runs.values()]
        ems = [r["variants"][m]["em"] for r in runs.values()]
        table[m] = {"f1_mean": sum(f1s) / len(f1s), "f1_min": min(f1s), "f1_max": max(f1s),
                    "em_mean": sum(ems) / len(ems)}
    return table


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--burners", type=int, default=2, help="CPU-bound processes beside it")
    ap.add_argument("--burn-minutes", type=float, default=60,
                    help="each burner stops by itself after this long")
    ap.add_argument("--seeds", nargs="*", type=int, default=[],
                    help="one demo per train.seed, one after another; a mean [min, max] table")
    ap.add_argument("--plot", type=Path, help="with --seeds: also draw each model's dev F1 "
                    "over the seeds into this PNG (bench/charts.py; docs/results/demo.md)")
    args = ap.parse_args()
    if not args.seeds:
        result = one_demo(args, args.sets)
    else:
        runs = {s: one_demo(args, [*args.sets, f"train.seed={s}"]) for s in args.seeds}
        failed = [s for s, r in runs.items() if r["exit_code"] != 0]
        result = {"seeds": args.seeds, "runs": runs,
                  "exit_code": runs[failed[0]]["exit_code"] if failed else 0,
                  "wall_s": [r["wall_s"] for r in runs.values()],
                  "over_seeds": {} if failed else over_seeds(runs)}
        print(f"\n{len(args.seeds)} seeds {args.seeds}: minutes "
              + ", ".join(f"{r['wall_s'] / 60:.1f}" for r in runs.values()))
        print(f"{'model':<15} {'dev F1 mean [min, max]':>24} {'EM mean':>8}")
        for m, r in result["over_seeds"].items():
            print(f"{m:<15} {r['f1_mean']:>8.1f} [{r['f1_min']:.1f}, {r['f1_max']:.1f}]"
                  f"{r['em_mean']:>8.1f}")
    write(OUT / "demo_under_load.json", result)
    if args.plot and result.get("over_seeds"):
        from charts import demo_seeds  # bench/charts.py, beside this script

        args.plot.write_bytes(demo_seeds(result))
        print(f"-> {args.plot}")
    sys.exit(result["exit_code"])


if __name__ == "__main__":
    main()
