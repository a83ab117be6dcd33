"""The charts the results pages show (docs/results/), drawn from a bench's own JSON.

Each bench that a results page plots calls its chart here with ``--plot PNG``; a chart can
be drawn again from the JSON the bench wrote, without running it again:

    .venv/bin/python -m bench.charts demo bench/out/demo_under_load.json docs/results/demo-seeds.png
    .venv/bin/python -m bench.charts serve bench/out/serve.json docs/results/serve-throughput.png

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot, no
display), as rcpipe/render/plots.py draws the report's.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

DPI = 110
SEED_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e")


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def demo_seeds(result: dict[str, Any]) -> bytes:
    """`bench/demo_under_load.py --seeds ...`'s result: each model's dev F1, a bar at the
    mean over the seeds and a dot per seed."""
    runs = result["runs"]  # seed (a JSON key: str) -> one demo's result
    models = list(result["over_seeds"])
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    means = [result["over_seeds"][m]["f1_mean"] for m in models]
    ax.bar(range(len(models)), means, color="#d9d9d9", edgecolor="#636363",
           label="mean over the seeds")
    for i, (seed, run) in enumerate(runs.items()):
        f1s = [run["variants"][m]["f1"] for m in models]
        offset = (i - (len(runs) - 1) / 2) * 0.18  # the seeds side by side on each bar
        ax.scatter([x + offset for x in range(len(models))], f1s, zorder=3, s=22,
                   color=SEED_COLOURS[i % len(SEED_COLOURS)], label=f"seed {seed}")
    for x, mean in enumerate(means):
        ax.annotate(f"{mean:.1f}", (x, mean), textcoords="offset points", xytext=(0, 4),
                    ha="center", fontsize=8)
    ax.set_xticks(range(len(models)), models, fontsize=8)
    ax.set_ylabel("dev F1")
    ax.set_ylim(0, 118)  # room above the bars for the legend
    ax.set_title("make demo: dev F1 per model over train.seed", fontsize=10)
    ax.legend(fontsize=7, loc="upper right", ncols=2)
    return _png(fig)


def serve_throughput(report: dict[str, Any]) -> bytes:
    """`bench/serve.py`'s report: requests per second by arm, a dot per repeat and a bar at
    the best, the arms in the order they ran."""
    runs: dict[str, list[dict[str, Any]]] = report["runs"]
    arms = list(runs)
    fig = Figure(figsize=(6, 3.2))
    ax = fig.add_subplot()
    best = [max(r["requests_per_s"] for r in runs[a]) for a in arms]
    ax.barh(range(len(arms)), best, color="#d9d9d9", edgecolor="#636363", label="best")
    for y, arm in enumerate(arms):
        rates = [r["requests_per_s"] for r in runs[arm]]
        ax.scatter(rates, [y] * len(rates), color="#2166ac", zorder=3, s=22,
                   label="each repeat" if y == 0 else None)
        ax.annotate(f"{best[y]:.0f} req/s", (best[y], y), textcoords="offset points",
                    xytext=(4, -3), fontsize=8)
    ax.set_yticks(range(len(arms)), arms, fontsize=8)
    ax.invert_yaxis()  # the first arm on top
    ax.set_xlabel("requests per second")
    ax.set_xlim(0, max(best) * 1.25)
    ax.set_title(f"{report['requests']} questions, {report['concurrency']} clients, "
                 f"{report['cpus']} CPUs", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    return _png(fig)


CHARTS = {"demo": demo_seeds, "serve": serve_throughput}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chart", choices=sorted(CHARTS))
    ap.add_argument("result", type=Path, help="the JSON the bench wrote")
    ap.add_argument("png", type=Path)
    args = ap.parse_args()
    args.png.write_bytes(CHARTS[args.chart](json.loads(args.result.read_text())))
    print(f"-> {args.png}")


if __name__ == "__main__":
    main()
