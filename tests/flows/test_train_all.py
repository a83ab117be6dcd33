"""The train-all flow on tiny data, run in-process against a real temporary Prefect API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.train_all import train_all
from tests.conftest import SynthData, write_params

pytestmark = pytest.mark.usefixtures("prefect_api", "local_ray")

TINY = {"hidden": 8, "char_dim": 4, "char_hidden": 8, "heads": 2, "model_blocks": 1,
        "emb_convs": 1, "model_convs": 1, "highway_layers": 1}


def _params(root: Path, synth: SynthData) -> Path:
    return write_params(root / "params.yaml",
                        data={"train_file": str(synth.train), "dev_file": str(synth.dev)},
                        train={"max_steps": 3, "batch_size": 8, "max_failures": 0},
                        models={"bidaf": TINY, "qanet": TINY})


def test_a_rerun_after_one_variant_failed_skips_what_finished(
        tmp_path: Path, synth_v1: SynthData) -> None:
    params, work = _params(tmp_path, synth_v1), tmp_path / "work"
    # qanet cannot be built with 3 heads on 8 dimensions: that variant fails, bidaf finishes
    state = train_all(params=str(params), variants=["bidaf", "qanet"], workdir=str(work),
                      overrides=["models.qanet.heads=3"], return_state=True)
    assert state.is_failed()
    assert "qanet" in state.message
    bidaf = work / "models/bidaf"
    assert json.loads((bidaf / "summary.json").read_text())["finished"]
    assert not (work / "models/qanet/summary.json").exists()
    trained_at = (bidaf / "model.pt").stat().st_mtime_ns
    prepared_at = (work / "data/prepared/meta.json").stat().st_mtime_ns

    out = train_all(params=str(params), variants=["bidaf", "qanet"], workdir=str(work))
    assert (bidaf / "model.pt").stat().st_mtime_ns == trained_at  # not retrained
    assert (work / "data/prepared/meta.json").stat().st_mtime_ns == prepared_at  # nor prepared
    assert json.loads((work / "models/qanet/summary.json").read_text())["finished"]
    assert set(out["scores"]) == {"bidaf", "qanet", "ensemble"}
    for name in ("bidaf", "qanet", "ensemble"):
        assert json.loads((work / f"metrics/{name}.json").read_text()) == out["scores"][name]
