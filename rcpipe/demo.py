"""`make demo`: the whole pipeline on synthetic data, in ./demo, then a table of results.

synth -> prepare -> train and evaluate each variant -> majority-vote ensemble, with the
CPU-sized preset params.demo.yaml. Extra arguments are `--set` overrides, e.g.
`python -m rcpipe.demo train.max_minutes=1`. (The Prefect flow takes this over as the
orchestration lands; the stages are the same functions.)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from rich.table import Table

from rcpipe import stages
from rcpipe.config import VARIANTS, load_config
from rcpipe.console import console

ROOT = Path(__file__).resolve().parents[1]


def _em(result: dict) -> float:
    return result.get("exact_match", result.get("exact", 0.0))


def main(overrides: list[str], workdir: Path = ROOT / "demo") -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # relative paths in params resolve here, as for any user
    cfg = load_config(ROOT / "params.demo.yaml", overrides)
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}

    def timed(name: str, fn, *args):  # noqa: ANN001, ANN202
        t = time.perf_counter()
        out = fn(*args)
        seconds[name] = time.perf_counter() - t
        return out

    timed("synth", stages.synth, cfg)
    report = timed("prepare", stages.prepare, cfg)
    results = {}
    for v in VARIANTS:
        timed(f"train {v}", stages.train, cfg, v)
        results[v] = timed(f"evaluate {v}", stages.evaluate, cfg, v)
    results["ensemble"] = timed("ensemble", stages.ensemble, cfg)

    tr, dv = report["train"], report["dev"]
    table = Table(title=f"rcpipe demo: {tr['kept']} synthetic training questions, "
                        f"{dv['questions']} dev questions")
    for col in ("model", "EM", "F1", "train s"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for name, r in results.items():
        table.add_row(name, f"{_em(r):.1f}", f"{r['f1']:.1f}",
                      f"{seconds.get(f'train {name}', 0):.0f}" if name != "ensemble" else "")
    console.print(table)
    console.print(f"outputs under {workdir}: data/ (synthetic SQuAD, Parquet), models/ "
                  f"(checkpoints, model.pt, summary.json), predictions/, metrics/  "
                  f"[{time.perf_counter() - t0:.0f}s in all]")


if __name__ == "__main__":
    main(sys.argv[1:])
