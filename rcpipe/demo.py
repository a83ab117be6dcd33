"""`make demo`: the pipeline as far as it is built, on synthetic data, in a fresh folder.

Runs synth -> prepare -> a lexical baseline scored by the official metric, then prints what
it did and where the outputs are. (Training, the Prefect flow and ensembling of trained
variants join here as they land.)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from rich.table import Table

from rcpipe import stages
from rcpipe.config import load_config
from rcpipe.console import console

ROOT = Path(__file__).resolve().parents[1]


def baseline_predictions(prepared: Path) -> dict[str, str]:
    import pyarrow.parquet as pq

    from rcpipe.eval.baseline import lexical_answer

    t = pq.read_table(prepared / "dev.parquet",
                      columns=["id", "context", "context_starts", "context_ends", "question"])
    rows = t.to_pylist()
    return {r["id"]: lexical_answer(r["context"], r["context_starts"], r["context_ends"],
                                    r["question"]) for r in rows}


def main(workdir: Path = ROOT / "demo") -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    params = ROOT / "params.demo.yaml"
    os.chdir(workdir)  # relative paths in params resolve here, as for any user
    cfg = load_config(params)
    t0 = time.perf_counter()
    stages.synth(cfg)
    report = stages.prepare(cfg)
    preds = baseline_predictions(cfg.data.out_dir)
    stages.write_json(Path("predictions/lexical_baseline.json"), preds)
    result = stages.score(cfg.data.dev_file, Path("predictions/lexical_baseline.json"))
    stages.write_json(Path("metrics/lexical_baseline.json"), result)

    table = Table(title="rcpipe demo (synthetic SQuAD)")
    table.add_column("step")
    table.add_column("result")
    tr, dv = report["train"], report["dev"]
    table.add_row("synth", f"{tr['questions']} train / {dv['questions']} dev questions")
    table.add_row("prepare", f"train kept {tr['kept']}, dropped {sum(tr['dropped'].values())}; "
                  f"dev kept {dv['kept']} (Parquet in {cfg.data.out_dir})")
    em = result.get("exact_match", result.get("exact"))
    table.add_row("score", f"lexical baseline EM {em:.1f} F1 {result['f1']:.1f} (official metric)")
    console.print(table)
    console.print(f"outputs under {workdir}: data/synth, {cfg.data.out_dir}, predictions/, "
                  f"metrics/  ({time.perf_counter() - t0:.1f}s)")
    console.print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "demo")
