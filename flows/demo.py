"""`make demo`: the train-all flow on the demo preset, here, then a table of the results.

synth -> prepare -> train and evaluate the five variants (Ray Train jobs on a local Ray)
-> majority-vote ensemble -> report, all as one Prefect flow run (an embedded Prefect API
starts when none is configured). Outputs land in the project directory: data/, models/,
predictions/ and metrics/<variant>.json, metrics/ensemble.json. Extra arguments are
`--set` overrides, e.g. `python -m flows.demo train.max_minutes=1`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# the embedded Prefect server must not try to phone home: a laptop demo may be offline
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from rich.table import Table  # noqa: E402 - after the environment above

from flows.report import score_rows  # noqa: E402
from flows.train_all import train_all  # noqa: E402
from rcpipe.console import console  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(overrides: list[str]) -> None:
    t0 = time.perf_counter()
    out = train_all(params=str(ROOT / "params.demo.yaml"), overrides=overrides,
                    synth_data=True, workdir=str(ROOT))
    wall = time.perf_counter() - t0
    table = Table(title="rcpipe demo: dev scores on synthetic SQuAD")
    rows = score_rows(out["scores"])
    for col in rows[0]:
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    shares = ", ".join(f"{k} {v:.0f}s ({100 * v / wall:.0f}%)"
                       for k, v in out["seconds"].items())
    console.print(f"{wall:.0f}s in all: {shares}")
    console.print(f"outputs under {out['workdir']}: data/ (synthetic SQuAD, Parquet), "
                  "models/<variant>/ (checkpoints, model.pt, summary.json, live/: the dev "
                  "curve for `dvc plots show`), predictions/, "
                  "metrics/<variant>.json and metrics/ensemble.json")


if __name__ == "__main__":
    main(sys.argv[1:])
