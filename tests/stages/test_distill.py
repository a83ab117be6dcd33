"""`rcpipe distill`: the student trained on the session's ensemble (tests/conftest.py
`trained`: bidaf and qanet, their vote) as one Ray Train job, then evaluated as a variant
is; again with nothing changed it trains nothing, and its key moves with what it learns
from."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rcpipe import layout, stages
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError
from rcpipe.stages.distill import student_key
from tests.conftest import Trained, questions_of

pytestmark = [pytest.mark.integration, pytest.mark.trains, pytest.mark.ray_train(1),
              pytest.mark.usefixtures("local_ray")]


def test_the_student_learns_from_the_vote_once_and_is_evaluated_as_a_variant(
        trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "run"
    shutil.copytree(trained.root, root)
    monkeypatch.chdir(root)
    cfg = trained.cfg.model_copy(update={"distill": trained.cfg.distill.model_copy(
        update={"student": "bidaf", "temperature": 2.0, "alpha": 0.5})})
    with caplog.at_level(logging.INFO):
        out = stages.distill(cfg)

    # the teacher: the vote's two voters, equally, over every training row
    about = json.loads((layout.teacher_dir() / "teacher.json").read_text())["teacher"]
    assert about["method"] == "vote" and about["members"] == ["bidaf", "qanet"]
    train = Prepared(cfg.data.out_dir).shards("train")
    table = pq.read_table(sorted(layout.teacher_dir().glob("part-*.parquet")))
    assert table.num_rows == train.rows and table.column("id") == train.read_all(["id"])[0]
    for p in table.column("teacher_start").to_pylist()[:20]:
        assert abs(sum(p) - 1) < 1e-4 and p[0] < 1e-6  # v1.1: no answer has no mass

    # trained as a variant is: its run, model and summary under models/student/
    summary = out["summary"]
    assert summary["finished"] and summary["variant"] == "bidaf" and summary["steps"] == 3
    # the same network, seed, data and steps as the session's bidaf: only its teacher's
    # term can move its training loss off bidaf's
    assert summary["history"][-1]["loss"] != trained.summary["history"][-1]["loss"]
    assert summary["history"][-1]["step"] == trained.summary["history"][-1]["step"] == 3
    assert json.loads(layout.summary_file(layout.STUDENT).read_text()) == summary
    assert list(layout.runs_dir(layout.STUDENT).glob("run-*/step-*/model.pt"))
    # and evaluated as one: every dev question answered, the official scores
    preds = json.loads(layout.predictions(layout.STUDENT).read_text())
    assert set(preds) == {q["id"] for q in questions_of(trained.data.dev_doc)}
    assert out["metrics"] == json.loads(layout.metrics(layout.STUDENT).read_text())
    assert 0 <= out["metrics"]["f1"] <= 100

    # nothing changed: nothing trained, nothing evaluated (no second Ray Train job)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = stages.distill(cfg)
    assert again["summary"] == summary and "nothing to train" in caplog.text
    assert "evaluate student: the model, data and settings are those" in caplog.text
    # a run resumed after a kill (cluster/train_run.py, as a variant's: tests/faults/) reads
    # the very targets its checkpoint streamed: the teacher's folder of this key is kept
    from rcpipe.stages.distill import _targets, teacher_of

    parts = {p: p.stat().st_mtime_ns for p in layout.teacher_dir().glob("part-*.parquet")}
    assert _targets(cfg, *teacher_of(cfg), student_key(cfg)) == layout.teacher_dir()
    assert {p: p.stat().st_mtime_ns for p in layout.teacher_dir().glob("part-*")} == parts

    # a model like the others: packaged (its card names its teacher), and the gate weighs
    # it beside the ensemble as one model, never as one of the ensemble's voters
    import torch

    from rcpipe.inference.combination import Combination
    from rcpipe.release.gate import answers, gate_set
    from rcpipe.trained.package_dir import load_package

    made = {m: stages.package(cfg, m, tmp_path / "packages" / m)
            for m in ("bidaf", "qanet", layout.STUDENT)}
    package = load_package(made[layout.STUDENT])
    assert package.variant == "bidaf"
    config = json.loads((made[layout.STUDENT] / "config.json").read_text())
    assert config["distilled_from"]["members"] == ["bidaf", "qanet"]
    assert "- distilled from: the ensemble of `bidaf`, `qanet` (vote)" in \
        (made[layout.STUDENT] / "README.md").read_text()
    gate = gate_set(cfg, "0" * 64)
    cpu = torch.device("cpu")
    found = answers(made, gate, cpu, Combination())
    voters = {m: made[m] for m in ("bidaf", "qanet")}
    assert found.keys() == {"bidaf", "qanet", "ensemble", layout.STUDENT}
    assert found["ensemble"] == answers(voters, gate, cpu, Combination())["ensemble"]

    # and by its name in the workspace, as a variant is: predict, serve (its Serve app
    # built; tests/serve/ runs the app itself) and export
    from rcpipe.serve.app import Limits
    from rcpipe.stages.serving import application

    context = trained.data.dev_doc["data"][0]["paragraphs"][0]["context"]
    said = stages.predict(cfg, layout.STUDENT, "Who was it?", context)
    assert said["model"] == layout.STUDENT and said["answer"] in context
    assert application(cfg, [layout.STUDENT], Limits())[1] == [layout.STUDENT]
    exported = stages.export(cfg, layout.STUDENT, questions=4)
    assert exported["variant"] == "bidaf" and (layout.model_dir(layout.STUDENT) / "model.onnx"
                                               ).is_file()

    # the report shows it beside the ensemble: its scores, its column in every chart's
    # data, its question-type rows (and the report's key holds its files)
    stages.report(cfg)
    record = json.loads((layout.REPORTS / layout.REPORT_DATA).read_text())
    assert record["models"] == ["bidaf", "qanet", "ensemble", layout.STUDENT]
    assert [r["model"] for r in record["scores"]][-1] == layout.STUDENT
    assert layout.STUDENT in (layout.REPORTS / "f1_by_type.csv").read_text().split("\n")[0]
    assert (layout.REPORTS / "by_type" / f"{layout.STUDENT}.json").is_file()

    # the key moves with the teacher's members and the student's own settings alone
    key = student_key(cfg)
    hotter = cfg.model_copy(update={"distill": cfg.distill.model_copy(
        update={"temperature": 4.0})})
    assert student_key(hotter).digest != key.digest
    served = cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"replicas": 3})})
    assert student_key(served).digest == key.digest
    member = layout.model_file("qanet")
    member.write_bytes(member.read_bytes() + b"\0")
    assert student_key(cfg).digest != key.digest


def test_no_ensemble_or_no_student_is_one_line_before_anything_starts(
        trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    student = trained.cfg.model_copy(update={"distill": trained.cfg.distill.model_copy(
        update={"student": "bidaf"})})
    with pytest.raises(InputError, match="no ensemble to distill; run `rcpipe ensemble`"):
        stages.distill(student)
    assert trained.cfg.distill.student is None  # the params' default: no student
    with pytest.raises(InputError, match="distill.student: null: there is no student"):
        stages.distill(trained.cfg)
    assert not Path("models").exists()
