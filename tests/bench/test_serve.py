"""bench/serve.py's chart: requests/s by arm, drawn from the JSON a run writes, again
without running (`--replot`), as docs/results/serving.md shows it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def _report(rate: float = 90.0) -> dict:
    def run(r: float) -> dict:
        return {"requests_per_s": r, "p50_ms": 1.0}

    return {"requests": 600, "concurrency": 200, "cpus": 2,
            "runs": {"before": [run(190.0), run(260.0)], "serve-1": [run(rate), run(105.0)]}}


def _replot(report: dict, tmp_path: Path, name: str) -> bytes:
    result, png = tmp_path / f"{name}.json", tmp_path / f"{name}.png"
    result.write_text(json.dumps(report))
    done = subprocess.run([sys.executable, "bench/serve.py", "--replot", str(result), "--plot",
                           str(png)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return png.read_bytes()


def test_the_chart_is_drawn_again_from_a_runs_json_and_moves_with_its_figures(
        tmp_path: Path) -> None:
    png = _replot(_report(), tmp_path, "a")
    assert png.startswith(PNG) and len(png) > 5_000
    assert _replot(_report(), tmp_path, "b") == png  # the same figures, the same chart
    assert _replot(_report(250.0), tmp_path, "c") != png
