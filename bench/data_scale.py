"""Benchmark: prepare and one training worker as the data grows (synthetic SQuAD).

For each ``--questions`` N (10,000 / 100,000 / 1,000,000 by default): `rcpipe synth`
writes N training questions (params.demo.yaml's passages, 10 a paragraph, 5 paragraphs an
article), then `rcpipe prepare` and one worker, `python -m rcpipe.train.local bidaf` for
``--steps`` steps, each run as its own process: its peak memory (the largest resident set
of it and its children, wait4's ru_maxrss), wall seconds, prepare's seconds per question and
the worker's examples/s. ``--base REV`` also runs REV's worker (a `git worktree` of it
outside the repo, its own prepared folder made by its own prepare) on the same files, the
two alternating ``--rounds`` times: the loader's examples/s side by side. Writes
bench/out/data_scale.json.

    .venv/bin/python bench/data_scale.py --questions 10000 100000 1000000 --steps 300
    .venv/bin/python bench/data_scale.py --questions 10000 --base b00dde6 --rounds 3
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import OUT, ROOT, cpu, parser, set_args, write

DEMO = ROOT / "params.demo.yaml"
# `rcpipe` in this interpreter: REV's checkout too, with its folder first on PYTHONPATH
RCPIPE = [sys.executable, "-c", "import sys; from rcpipe.cli import main; main(sys.argv[1:])"]
PER_ARTICLE = 50  # 5 paragraphs of 10 questions: 1M questions is 100,000 paragraphs


def measured(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``cmd`` run to its end: its wall seconds and peak resident set (MB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out = proc.stdout.read().decode(errors="replace")  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
    return {"seconds": round(time.perf_counter() - t0, 2),
            "peak_mb": round(usage.ru_maxrss / 1024, 1), "out": out}


EXTRA: list[str] = []  # --set: the new side's (REV's may not know a key)


def sets(work: Path, n: int, steps: int, extra: bool = True) -> list[str]:
    """The bench's settings for N questions in ``work`` (``extra``: with --set's)."""
    return set_args([f"data.train_file={work}/train.json", f"data.dev_file={work}/dev.json",
                     f"data.out_dir={work}/prepared", f"data.cache_dir={work}/cache",
                     f"synth.train_articles={max(2, n // PER_ARTICLE)}",
                     "synth.questions_per_paragraph=10", f"train.max_steps={steps}",
                     f"models.bidaf.max_steps={steps}", "train.eval_every=0",
                     "train.max_minutes=0", "models.bidaf.max_minutes=0", "train.threads=1",
                     *(EXTRA if extra else [])])


def code(root: Path) -> dict[str, str]:
    """The environment that runs rcpipe from ``root`` (run from elsewhere: no cwd first)."""
    return os.environ | {"PYTHONPATH": str(root)}


def worker(work: Path, n: int, steps: int, root: Path, out: Path | None = None,
           extra: bool = True) -> dict[str, Any]:
    """One training worker of ``--steps`` steps on ``out`` (default: work's prepared)."""
    out = out or work / "prepared"
    r = measured([sys.executable, "-m", "rcpipe.train.local", "bidaf", "--params", str(DEMO),
                  *sets(work, n, steps, extra), "--set", f"data.out_dir={out}",
                  "--run-dir", str(out.parent / f"run-{time.monotonic_ns()}")], work, code(root))
    summary = json.loads(r.pop("out").strip().splitlines()[-1])
    return r | {"examples_per_s": summary["examples_per_s"], "steps": summary["steps"]}


def scale(n: int, args: Any, base: Path | None) -> dict[str, Any]:
    """N questions synthesised, prepared and trained on (and REV's worker beside)."""
    work = args.work / f"q{n}"
    work.mkdir(parents=True, exist_ok=True)
    new = code(args.code)
    measured([*RCPIPE, "synth", "--params", str(DEMO), *sets(work, n, args.steps)], work, new)
    prep = measured([*RCPIPE, "prepare", "--params", str(DEMO), *sets(work, n, args.steps)],
                    work, new)
    prep.pop("out")
    report = json.loads((work / "prepared" / "report.json").read_text())
    questions = report["train"]["questions"] + report.get("heldout", {}).get("questions", 0)
    row: dict[str, Any] = {"questions": questions, "train_rows": report["train"]["rows"],
                           "prepare": prep | {"s_per_1k_questions": round(
                               1000 * prep["seconds"] / questions, 3)}}
    row["worker"] = worker(work, n, args.steps, args.code)
    if base is not None:  # REV's prepare into its own folder, then the workers in turn
        old = args.work / f"q{n}-base"
        old.mkdir(exist_ok=True)
        measured([*RCPIPE, "prepare", "--params", str(DEMO),
                  *sets(work, n, args.steps, False), "--set", f"data.out_dir={old}/prepared"],
                 old, code(base))
        pairs = []
        for _ in range(args.rounds):  # alternating: the machine's drift falls on both
            now = worker(work, n, args.steps, args.code)
            was = worker(work, n, args.steps, base, old / "prepared", extra=False)
            pairs.append({"stream": now, "in_memory": was,
                          "ratio": round(now["examples_per_s"] / was["examples_per_s"], 3)})
        row["loader"] = pairs
    print(f"{questions:>9,} questions: prepare {prep['seconds']:.0f} s, "
          f"{prep['peak_mb']:.0f} MB; worker {row['worker']['peak_mb']:.0f} MB, "
          f"{row['worker']['examples_per_s']:.1f} ex/s", flush=True)
    return row


def main() -> None:
    ap = parser(__doc__, OUT / "data_scale.json")
    ap.add_argument("--questions", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--base", help="a commit whose in-memory loader runs beside")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rcpipe-data-scale"))
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose rcpipe runs "
                    "(default this one)")
    args = ap.parse_args()
    EXTRA.extend(args.sets)
    base = None
    if args.base:
        base = args.work / f"base-{args.base}"
        if not base.exists():
            subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base],
                           cwd=ROOT, check=True)
    rows = [scale(n, args, base) for n in args.questions]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.code,
                          capture_output=True, text=True).stdout.strip()
    write(args.out, {"commit": head, "base": args.base, "cpu": cpu(), "steps": args.steps,
                     "date": time.strftime("%Y-%m-%d"), "rows": rows})


if __name__ == "__main__":
    main()
