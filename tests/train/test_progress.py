"""What a training run shows while it runs (train/progress.py): log lines at each dev
evaluation and the dev curve as dvclive's files, growing during the run, continued (not
wiped) by a resumed run, at the paths dvc.yaml's plots name."""

from __future__ import annotations

import csv
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rcpipe.config import load_config
from rcpipe.train.local import train_local
from rcpipe.train.progress import CURVE, DevCurve
from tests.conftest import TINY_MODEL, Prepared

ROOT = Path(__file__).resolve().parents[2]


def curve_steps(live: Path, name: str = "dev/f1") -> list[int]:
    tsv = live / "plots" / "metrics" / f"{name}.tsv"
    if not tsv.is_file():
        return []
    with tsv.open(newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f, delimiter="\t")]


@pytest.mark.trains
def test_the_dev_curve_grows_while_training_and_a_resumed_run_continues_it(
        prepared: Prepared, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    base = [f"data.out_dir={prepared.out_dir}", f"data.train_file={prepared.data.train}",
            f"data.dev_file={prepared.data.dev}", "train.batch_size=8", "train.eval_every=2",
            *(f"models.bidaf.{k}={v}" for k, v in TINY_MODEL.items())]
    live = tmp_path / "live"
    seen: list[tuple[int, list[int], bool]] = []  # (eval step, curve then, run finished?)

    def watch(message: dict[str, Any]) -> None:
        if "eval" in message:  # the curve is written before the caller hears of the point
            seen.append((message["eval"]["step"], curve_steps(live),
                         (tmp_path / "summary.json").exists()))

    caplog.set_level(logging.INFO, logger="rcpipe")
    first = train_local(load_config(prepared.cfg.source, [*base, "train.max_steps=4"]),
                        "bidaf", tmp_path, watch)
    assert [s for s, _, _ in seen][:2] == [2, 4]
    step, curve, finished = seen[0]
    assert curve == [2] and not finished  # on disk after the first evaluation, mid-run
    assert curve_steps(live) == [h["step"] for h in first["history"]]
    evals = [r.getMessage() for r in caplog.records if r.name == "rcpipe.train.progress"
             and "checkpoint" in r.getMessage()]  # one line per evaluation
    assert len(evals) == len(first["history"])
    for h, line in zip(first["history"], evals, strict=True):
        assert f"step {h['step']}: dev EM {h['em']:.2f} F1 {h['f1']:.2f}" in line

    again = train_local(load_config(prepared.cfg.source, [*base, "train.max_steps=6"]),
                        "bidaf", tmp_path)
    assert again["resumed_from_step"] == 4 and len(again["history"]) > 2
    for name, key in CURVE.items():  # every point kept, the new ones appended
        assert curve_steps(live, name) == [h["step"] for h in again["history"]]
        with (live / "plots" / "metrics" / f"{name}.tsv").open(newline="") as f:
            column = name.rsplit("/", 1)[1]  # dvclive's column: the name's last part
            values = [float(r[column]) for r in csv.DictReader(f, delimiter="\t")]
        assert values == pytest.approx([h[key] for h in again["history"]], rel=1e-6)
    assert json.loads((live / "metrics.json").read_text())["step"] == again["steps"]

    # dvc.yaml's training-curve plots name these files (models/<variant>/live/ there)
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    files = {f: column for p in plots if isinstance(p, dict) for spec in p.values()
             for f, column in spec["y"].items() if f.startswith("models/bidaf/live/")}
    assert len(files) == len(CURVE)
    for f, column in files.items():
        with (live / f.removeprefix("models/bidaf/live/")).open(newline="") as fh:
            assert column in (csv.DictReader(fh, delimiter="\t").fieldnames or [])


def _point(step: int, resumed_from: int) -> dict[str, Any]:
    return {"step": step, "epoch": 0, "em": step / 10, "f1": step / 5, "heldout_f1": step / 4,
            "loss": 1 / step, "resumed_from_step": resumed_from}


def test_a_run_resumed_from_an_older_checkpoint_drops_the_lost_points(tmp_path: Path) -> None:
    curve = DevCurve(tmp_path / "live")
    for step in (2, 4, 6):
        curve.add(_point(step, 0))
    # the checkpoint of step 6 was lost: the run resumes from step 4 and evaluates step 6 again
    DevCurve(tmp_path / "live").add(_point(6, 4))
    for name in CURVE:
        assert curve_steps(tmp_path / "live", name) == [2, 4, 6]


def test_the_curve_leaves_the_repository_alone(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No `dvc init`, no dvc.yaml, no experiment: dvclive left to itself would do the first
    in a git checkout without DVC."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    DevCurve(tmp_path / "models/bidaf/live").add(_point(2, 0))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".git", "models"]
    assert not list(tmp_path.rglob("dvc.yaml"))
    assert curve_steps(tmp_path / "models/bidaf/live") == [2]
