"""Night 2 against night 1: the train-all flow run twice on the demo preset, nothing changed.

    python bench/nights.py [--workdir DIR] [--out bench/out/nights.json] [--set k=v ...]

Night 1 synthesises the demo data, prepares it, trains and evaluates the five variants,
ensembles and reports (what `make demo` does). Night 2 runs the same flow again: its
fingerprints and stamps (rcpipe/fingerprints.py) find every output current, so it trains,
evaluates, ensembles and reports nothing. Both nights run in this process, one after the
other, on the same machine; the figure is night 2's wall time as a share of night 1's, with
each night's stage timings from the flow.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from common import OUT, ROOT, cpu, parser, write

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def main() -> None:
    ap = parser(__doc__, OUT / "nights.json")
    ap.add_argument("--workdir", type=Path, help="default: a fresh temporary directory")
    args = ap.parse_args()

    from flows.demo import prepare_prefect_database
    from flows.train_all import train_all

    work = args.workdir or Path(tempfile.mkdtemp(prefix="rcpipe-nights-"))
    prepare_prefect_database()
    nights = []
    for night in (1, 2):
        t0 = time.perf_counter()
        out = train_all(params=str(ROOT / "params.demo.yaml"), overrides=args.sets,
                        synth_data=True, workdir=str(work))
        wall = time.perf_counter() - t0
        summaries = {v: json.loads((work / f"models/{v}/summary.json").read_text())
                     for v in out["scores"] if v != "ensemble"}
        nights.append({"night": night, "wall_s": round(wall, 1), "seconds": out["seconds"],
                       "runs": {v: s["run"] for v, s in summaries.items()},
                       "f1": {m: round(s["f1"], 2) for m, s in out["scores"].items()}})
        print(f"night {night}: {wall:.0f} s; stages {out['seconds']}")
    first, second = nights
    assert first["runs"] == second["runs"] and first["f1"] == second["f1"]
    result = {"device": f"{cpu()}, {os.cpu_count()} cores", "workdir": str(work), "nights": nights,
              "night2_over_night1": round(second["wall_s"] / first["wall_s"], 3)}
    print(f"night 2 / night 1 wall time: {result['night2_over_night1']:.3f} "
          f"({second['wall_s']:.0f} s / {first['wall_s']:.0f} s)")
    write(args.out, result)


if __name__ == "__main__":
    main()
