"""`make demo`: the train-all flow on the demo preset, here, then a table of the results.

synth -> prepare -> train and evaluate the five variants (Ray Train jobs on a local Ray)
-> majority-vote ensemble -> a bidaf student distilled from it (params.demo.yaml's
distill.student) -> report, all as one Prefect flow run (an embedded Prefect API starts when
none is configured). Outputs land in the project directory: data/, models/, predictions/
and metrics/<variant>.json, metrics/ensemble.json, metrics/student.json. Extra arguments are
`--set` overrides, e.g. `python -m flows.demo models.bidaf.max_steps=100`; `--workdir DIR`
puts the outputs elsewhere (a fresh one each, for several seeds side by side).

Each variant trains a fixed number of steps (params.demo.yaml, models.<v>.max_steps) and no
time limit, so a busy machine gets the same table as an idle one, only later. The table
shows README's range beside each F1 and says which rows land far outside it (another CPU's
kernels part the random trajectories; a run stopped by a time limit set by hand), so a
newcomer knows at once whether the run is the one README describes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

# the embedded Prefect server must not try to phone home: a laptop demo may be offline
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# Prefect gives its embedded server 20 s to answer; prepare_prefect_database() takes a first
# run's migration out of that, and this margin covers the rest of a busy machine's start-up
# (11 s measured on 2 quiet cores, the first start registering Prefect's block types)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from rich.table import Table  # noqa: E402 - after the environment above

from flows.report import score_rows  # noqa: E402
from flows.train_all import train_all  # noqa: E402
from rcpipe import layout, reads  # noqa: E402
from rcpipe.config import Config, load_config  # noqa: E402
from rcpipe.console import console  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SQLITE = "sqlite+aiosqlite:///"  # Prefect's default database: $PREFECT_HOME/prefect.db
README = ROOT / "README.md"
# README's table to expect: "| `bidaf` | 96.9 [95.2, 98.0] | 96.8 | 800 |" -> bidaf's range
README_ROW = re.compile(r"^\| `?([a-z_ -]+?)`? \| [\d.]+ \[([\d.]+), ([\d.]+)\] \|")
# F1 points outside README's range that mark a row: the fixed steps' own rule (three seeds'
# curves within 5 F1, params.demo.yaml); a new CPU's kernels move a row by a few points
FAR = 5.0
FIRST_MIGRATION_S = 15  # measured (import and migration): 12 s on 2 quiet cores, 14 s busy


def prepare_prefect_database() -> Path | None:
    """Migrate the embedded Prefect API's new database here, before its server starts.

    The first run in a PREFECT_HOME creates and migrates the SQLite database inside the
    embedded server's start-up, which Prefect times (20 s); on a busy machine that alone took
    longer. Done here first (Prefect's own migration, as `prefect server database upgrade`
    runs it), the server finds the database current. Nothing to do when a Prefect API is
    configured (its server keeps its own database) or the database exists already (a newer
    Prefect's few migrations fit the server's start-up). Returns the database created.
    """
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    url = settings.server.database.connection_url
    url_text = url.get_secret_value() if url is not None else ""
    if settings.api.url or not url_text.startswith(SQLITE):
        return None
    db = Path(url_text.removeprefix(SQLITE))
    if db.exists():
        return None
    from prefect.server.database import provide_database_interface

    console.print(f"preparing Prefect's database (first run, ~{FIRST_MIGRATION_S} s): {db}",
                  soft_wrap=True)  # one line, for whoever greps it
    t0 = time.perf_counter()
    db.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(provide_database_interface().create_db())
    console.print(f"Prefect's database ready in {time.perf_counter() - t0:.0f} s")
    return db


def main(overrides: list[str], workdir: Path = ROOT) -> None:
    t0 = time.perf_counter()
    prepare_prefect_database()
    out = train_all(params=str(ROOT / "params.demo.yaml"), overrides=overrides,
                    synth_data=True, workdir=str(workdir))
    wall = time.perf_counter() - t0
    cfg = load_config(ROOT / "params.demo.yaml", overrides)
    rows, far = checked_rows(score_rows(out["scores"]), Path(out["workdir"]), cfg,
                             readme_ranges())
    table = Table(title="rcpipe demo: dev scores on synthetic SQuAD")
    for col in rows[0]:
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    for line in far:
        console.print(f"[bold]{line}[/bold]", soft_wrap=True)
    console.print(f"outputs under {out['workdir']}: data/ (synthetic SQuAD, Parquet), "
                  "models/<variant>/ (checkpoints, model.pt, summary.json, live/: the dev "
                  "curve for `dvc plots show`), models/student/ (where distill.student names "
                  "one), predictions/, metrics/<variant>.json, metrics/ensemble.json and "
                  "metrics/student.json")
    shares = ", ".join(f"{k} {v:.0f}s ({100 * v / wall:.0f}%)"
                       for k, v in out["seconds"].items())
    console.print(f"demo done in {wall / 60:.1f} minutes ({shares}); every variant trains "
                  "its fixed steps, so a busy machine gets this same table, only later")


def readme_ranges(readme: Path = README) -> dict[str, tuple[float, float]]:
    """README's table to expect: model -> its dev F1 [min, max] over the seeds and CPUs
    measured ("ensemble" for its majority-vote row)."""
    found: dict[str, tuple[float, float]] = {}
    for line in (readme.read_text() if readme.is_file() else "").splitlines():
        if m := README_ROW.match(line):
            found[layout.ENSEMBLE if "ensemble" in m[1] else m[1]] = float(m[2]), float(m[3])
    return found


def checked_rows(rows: list[dict[str, Any]], workdir: Path, cfg: Config,
                 ranges: dict[str, tuple[float, float]]
                 ) -> tuple[list[dict[str, Any]], list[str]]:
    """The table's rows with each variant's steps (its summary.json; "412 of 750, time
    limit" where a time limit ended it first) and README's range; and a line for each row
    more than FAR F1 outside that range."""
    out, far = [], []
    for row in rows:
        model, f1 = str(row["model"]), float(row["F1"])
        summary = workdir / layout.summary_file(model)
        steps: int | str = ""
        if summary.is_file():
            steps = reads.read_json(summary)["steps"]
            # the student trains its network's steps (models.<distill.student>)
            planned = cfg.models.steps(cfg.network_of(model), cfg.train.max_steps)
            if planned and steps < planned:
                steps = f"{steps} of {planned}, time limit"
        low, high = ranges.get(model, (float("-inf"), float("inf")))
        out.append(row | {"steps": steps,
                          "README's F1": f"[{low}, {high}]" if model in ranges else ""})
        if not low - FAR <= f1 <= high + FAR:
            why = ("a time limit ended its training before its steps" if "time" in str(steps)
                   else "not the table README measured: see docs/results/demo.md, "
                        "'Far outside README's ranges'")
            far.append(f"{model}: F1 {f1} is far outside README's range [{low}, {high}]: {why}")
    return out, far


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="make demo: the train-all flow on the demo preset")
    ap.add_argument("overrides", nargs="*", help="dotted.key=value, as rcpipe --set")
    ap.add_argument("--workdir", type=Path, default=ROOT, help="where the outputs go")
    args = ap.parse_args()
    main(args.overrides, args.workdir.resolve())
