"""evaluate, ensemble and report skip their work when their inputs are those their outputs
were made from (rcpipe/fingerprints.py: Stamp), and redo it when one changed.

On a copy of the session's `trained` run: nothing is trained here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rcpipe import layout, stages
from tests.conftest import Trained

pytestmark = [pytest.mark.integration, pytest.mark.trains]


@pytest.fixture
def run(trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The trained run, copied, as the current directory; its config pointed at the copy."""
    root = tmp_path / "run"
    shutil.copytree(trained.root, root)
    monkeypatch.chdir(root)
    data = trained.cfg.data.model_copy(update={"out_dir": root / "data" / "prepared",
                                               "cache_dir": root / "data" / "cache"})
    return trained.cfg.model_copy(update={"data": data})


def _nudge(model: Path) -> None:
    """Move one weight of a saved model, as another training run would."""
    import torch

    payload = torch.load(model, weights_only=True)
    first = next(iter(payload["state_dict"].values()))
    first.view(-1)[0] += 1.0
    torch.save(payload, model)


def _mtimes(*paths: Path) -> list[int]:
    return [p.stat().st_mtime_ns for p in paths]


def test_evaluate_skips_unchanged_inputs_and_redoes_changed_ones(
        run, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    outputs = [layout.predictions("bidaf"), layout.metrics("bidaf"), layout.nbest("bidaf")]
    before = _mtimes(*outputs)
    with caplog.at_level("INFO", logger="rcpipe.stages.evaluate"):
        kept = stages.evaluate(run, "bidaf")
    assert "nothing to do" in caplog.text
    assert _mtimes(*outputs) == before
    assert kept == json.loads(layout.metrics("bidaf").read_text())

    # another setting it reads: evaluated again
    shorter = run.model_copy(update={"eval": run.eval.model_copy(update={"max_answer_len": 2})})
    caplog.clear()
    with caplog.at_level("INFO", logger="rcpipe.stages.evaluate"):
        stages.evaluate(shorter, "bidaf")
    assert "nothing to do" not in caplog.text
    assert _mtimes(*outputs) != before
    answers = json.loads(layout.predictions("bidaf").read_text())
    assert all(len(a.split()) <= 2 for a in answers.values())

    # another model file (a new training run finished): evaluated again; --force too
    for changed, force in ((True, False), (False, True)):
        if changed:  # other weights, as a new run would leave
            _nudge(layout.model_file("bidaf"))
        before = _mtimes(*outputs)
        caplog.clear()
        with caplog.at_level("INFO", logger="rcpipe.stages.evaluate"):
            stages.evaluate(shorter, "bidaf", force=force)
        assert ("nothing to do" in caplog.text) is (not changed and not force)


def test_a_lost_output_or_stamp_is_redone(run) -> None:  # noqa: ANN001
    for lost in (layout.by_type("qanet"), layout.stamp("evaluate-qanet")):
        lost.unlink()
        before = layout.metrics("qanet").stat().st_mtime_ns
        stages.evaluate(run, "qanet")
        assert lost.is_file()
        assert layout.metrics("qanet").stat().st_mtime_ns != before


def test_ensemble_and_report_skip_until_a_voter_changes(
        run, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    voters = [layout.nbest(v) for v in ("bidaf", "qanet")]
    stages.report(run)  # the session's run has no report yet
    ensembled, reported = layout.metrics("ensemble"), layout.REPORTS / "report.html"
    before = _mtimes(ensembled, reported)
    with caplog.at_level("INFO"):
        stages.ensemble(run, voters)
        assert stages.report(run)["files"] == []
    assert caplog.text.count("nothing to do") == 2
    assert _mtimes(ensembled, reported) == before

    shorter = run.model_copy(update={"eval": run.eval.model_copy(update={"max_answer_len": 2})})
    stages.evaluate(shorter, "bidaf")  # a voter's answers change
    stages.ensemble(run, voters)
    assert stages.report(run)["files"]
    assert all(a != b for a, b in zip(_mtimes(ensembled, reported), before, strict=True))
