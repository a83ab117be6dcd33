"""bench/charts.py: the results pages' charts drawn from a bench's own JSON, as the benches
write it (the shape below is bench/serve.py's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import charts

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def _serve() -> dict:
    def run(rate: float) -> dict:
        return {"requests_per_s": rate, "p50_ms": 1.0}

    return {"requests": 600, "concurrency": 200, "cpus": 2,
            "runs": {"before": [run(190.0), run(260.0)], "serve-1": [run(90.0), run(105.0)]}}


def test_each_chart_is_a_png_that_changes_with_its_figures() -> None:
    png = charts.serve_throughput(_serve())
    assert png.startswith(PNG) and len(png) > 5_000
    other = _serve()
    other["runs"]["serve-1"][0]["requests_per_s"] = 250.0
    assert charts.serve_throughput(other) != charts.serve_throughput(_serve())


def test_a_chart_is_drawn_again_from_the_benchs_json(tmp_path: Path) -> None:
    result = tmp_path / "serve.json"
    result.write_text(json.dumps(_serve()))
    png = tmp_path / "serve-throughput.png"
    done = subprocess.run([sys.executable, "-m", "bench.charts", "serve", str(result), str(png)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert png.read_bytes() == charts.serve_throughput(_serve())
