"""The tune flow: prepare once, then one `rcpipe tune` task per chosen variant, in order.

The search itself is tests/cluster/test_search.py's (a real Ray Tune run); here stages.tune
is a stand-in, so the test is the flow's wiring on a real Prefect API, in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import flows.tune
from rcpipe.config import Config
from tests.conftest import Prepared

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]


def test_the_tune_flow_searches_each_variant_once_with_the_flows_params(
        prepared: Prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Config, str | None]] = []

    def fake_tune(cfg: Config, variant: str, run: str | None = None) -> dict[str, Any]:
        calls.append((variant, cfg, run))
        return {"trials": 2, "metric": "rank", "layer": f"tune/{variant}.yaml",
                "best": {"best": 50.0, "settings": {"dropout": 0.1}}}

    monkeypatch.setattr(flows.tune.stages, "tune", fake_tune)
    monkeypatch.chdir(tmp_path)
    found = flows.tune.tune(params=prepared.cfg.source, variants=["qanet", "bidaf"],
                            overrides=["tune.trials=3"], workdir=str(tmp_path / "work"),
                            run_name="nightly-1")
    assert [v for v, _, _ in calls] == ["qanet", "bidaf"]
    assert all(cfg.tune.trials == 3 and run == "nightly-1" for _, cfg, run in calls)
    assert set(found) == {"qanet", "bidaf"}
    assert Path.cwd() == tmp_path  # the flow went back to the caller's directory
