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
