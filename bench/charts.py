"""The charts the results pages show (docs/results/), drawn from a bench's own JSON.

Each bench that a results page plots calls its chart here with ``--plot PNG``; a chart can
be drawn again from the JSON the bench wrote, without running it again:

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


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


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


CHARTS = {"serve": serve_throughput}


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
