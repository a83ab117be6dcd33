"""The nights page's pieces: rows from the version records, the chart, the page."""

from __future__ import annotations

from rcpipe.render import pages, plots, tables


def _record(run: str, promoted: bool, model: str, **f1: float) -> dict:
    return {"run": run, "promoted": promoted, "candidate": {"model": model},
            "gate": {"diff": 1.5, "low": -0.25, "high": 3.0},
            "scores": {m: {"em": v - 5, "f1": v} for m, v in f1.items()}}


def test_the_champion_after_each_night_is_the_last_promoted_candidate() -> None:
    rows = tables.night_rows([
        _record("n1", True, "bidaf", bidaf=50.0, qanet=40.0),
        _record("n2", False, "qanet", bidaf=50.0, qanet=51.0),  # kept: within chance
        _record("n3", True, "qanet", bidaf=49.0, qanet=60.123),
    ])
    assert [r["champion"] for r in rows] == ["bidaf", "bidaf", "qanet"]
    assert [r["promoted"] for r in rows] == [True, False, True]
    assert rows[2]["qanet"] == 60.12
    assert rows[1]["gate gain"] == "+1.50 [-0.25, +3.00]"  # the decision with its interval


def test_the_page_lists_every_night_newest_first_with_its_chart() -> None:
    rows = tables.night_rows([_record("n1", True, "bidaf", bidaf=50.0),
                              _record("n2", False, "bidaf", bidaf=48.0)])
    png = plots.nights_png(rows, ["bidaf"])
    assert png.startswith(b"\x89PNG")
    html = pages.nights_html(rows, ["bidaf"], png, "https://x/report.html?sig=1")
    assert html.index("<td>n2</td>") < html.index("<td>n1</td>")
    assert 'href="https://x/report.html?sig=1"' in html and "data:image/png" in html


def test_each_night_costs_what_it_trained_and_nothing_for_what_it_kept() -> None:
    """Night 2 retrained nothing (the same runs as night 1): it cost nothing; night 3
    retrained qanet alone on 4 GPUs."""
    from rcpipe.release.rules import cost_of

    bidaf = cost_of({"run": "run-b1", "wall_seconds": 1800, "world_size": 1, "device": "cpu"})
    qanet = cost_of({"run": "run-q1", "wall_seconds": 3600, "world_size": 4,
                     "device": "cuda:0"})
    longer = cost_of({"run": "run-q2", "wall_seconds": 5400, "world_size": 4,
                      "device": "cuda:0"})
    assert (qanet["hours"], qanet["unit"]) == (4.0, "GPU-h")
    assert (bidaf["hours"], bidaf["unit"]) == (0.5, "CPU-worker-h")
    records = [_record("n1", True, "bidaf", bidaf=50.0) | {"cost": {"bidaf": bidaf,
                                                                     "qanet": qanet}},
               _record("n2", False, "bidaf", bidaf=50.0) | {"cost": {"bidaf": bidaf,
                                                                      "qanet": qanet}},
               _record("n3", False, "bidaf", bidaf=50.0) | {"cost": {"bidaf": bidaf,
                                                                      "qanet": longer}}]
    costs = tables.night_costs(records)
    assert costs[0] == {"night": "n1", "bidaf": "30.0 min, 0.50 CPU-worker-h",
                        "qanet": "60.0 min, 4.00 GPU-h",
                        "total": "0.50 CPU-worker-h, 4.00 GPU-h"}
    assert costs[1] == {"night": "n2", "total": "0"}
    assert costs[2] == {"night": "n3", "qanet": "90.0 min, 6.00 GPU-h", "total": "6.00 GPU-h"}
    rows = tables.night_rows(records)
    html = pages.nights_html(rows, ["bidaf", "qanet"], plots.nights_png(rows, ["bidaf"]),
                             None, costs)
    assert "What each night cost" in html and "<td>90.0 min, 6.00 GPU-h</td>" in html
