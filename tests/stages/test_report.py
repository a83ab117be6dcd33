"""`rcpipe report` on hand-made predictions of the synthetic dev sets (no training needed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from rcpipe import cli, stages
from rcpipe.config import VARIANTS
from rcpipe.render import tables
from rcpipe.scoring import metrics
from tests.conftest import SynthData, questions_of


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _write(path: str, obj: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj))


def _evaluated(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Three "models" as evaluate and ensemble would leave them: gold answers, the gold
    answers of every other question, and nothing at all ("")."""
    qas = questions_of(doc)
    gold = {qa["id"]: qa["answers"][0]["text"] if qa["answers"] else "" for qa in qas}
    half = {q: t if i % 2 == 0 else "" for i, (q, t) in enumerate(gold.items())}
    preds = {"bidaf": gold, "qanet": half, "ensemble": {q: "" for q in gold}}
    v2 = metrics.dataset_version(doc) == "2.0"
    for name, p in preds.items():
        _write(f"predictions/{name}.json", p)
        result = metrics.score(doc, p, dict.fromkeys(p, 0.5) if v2 else None)
        if v2:  # as evaluate and ensemble write it: the threshold's record beside the scores
            result = metrics.at_threshold(result, 0.7, "heldout")
        _write(f"metrics/{name}.json", result)
    return preds


def _assert_png(path: Path) -> None:
    with Image.open(path) as im:
        im.verify()
        assert im.format == "PNG"


def test_report_writes_html_png_and_plot_data(make_config, synth_v1: SynthData) -> None:  # noqa: ANN001
    cfg = make_config(synth_v1)
    preds = _evaluated(synth_v1.dev_doc)
    result = stages.report(cfg, Path("out"))
    names = ["scores", "f1_by_type", "f1_by_answer_length", "f1_by_context_length",
             "agreement"]
    for name in names:
        _assert_png(Path(f"out/{name}.png"))
        assert Path(f"out/{name}.csv").is_file()
    assert not Path("out/f1_by_answerability.csv").exists()  # v1.1: every question answerable
    assert set(result["files"]) == {f"out/{n}.{ext}" for n in names for ext in ("png", "csv")} \
        | {"out/report.html", "out/report.json"} | {f"out/by_type/{m}.json" for m in preds}
    # dvc plots' rows per model: the numbers `rcpipe evaluate` put in metrics/<m>.by_type.json
    for model, answers in preds.items():
        rows = json.loads(Path(f"out/by_type/{model}.json").read_text())
        official = metrics.breakdown(synth_v1.dev_doc, answers)
        assert [(r["question_type"], r["questions"], r["exact"], r["f1"]) for r in rows] == \
            [(t, s["total"], round(s["exact"], 2), round(s["f1"], 2))
             for t, s in official.items()]

    by_type = tables.by_question_type(synth_v1.dev_doc, preds)
    with open("out/f1_by_type.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["question_type"] for r in rows] == by_type.groups
    # a column for every variant, the ensemble and the student, as dvc.yaml declares them
    assert list(rows[0]) == ["question_type", "questions", *VARIANTS, "ensemble", "student"]
    assert {r["rnet"] for r in rows} == {r["student"] for r in rows} == {""}
    assert [float(r["bidaf"]) for r in rows] == [100.0] * len(rows)
    assert [float(r["qanet"]) for r in rows] == [round(v, 2) for v in by_type.f1["qanet"]]
    assert [float(r["ensemble"]) for r in rows] == [0.0] * len(rows)

    html = Path("out/report.html").read_text()
    assert html.count("data:image/png;base64,") == len(names)
    assert "https://" not in html and "<script" not in html
    for heading in ("EM / F1 per model", "F1 by question type", "F1 by answer length",
                    "F1 by context length", "Agreement between models"):
        assert heading in html
    first = by_type.groups[0]
    assert f"<tr><td>{first}</td><td>{by_type.counts[0]}</td>" in html
    # bidaf (gold) agrees with qanet on the half qanet answered, never with the ensemble ("")
    n = len(preds["bidaf"])
    matrix = json.loads(Path("out/report.json").read_text())["agreement"]["matrix"]
    assert matrix[0] == [1.0, ((n + 1) // 2) / n, 0.0]
    assert "<tr><td>bidaf</td><td>1.00</td>" in html


def test_report_on_v2_adds_has_ans_vs_no_ans(make_config, synth_v2: SynthData) -> None:  # noqa: ANN001
    cfg = make_config(synth_v2)
    _evaluated(synth_v2.dev_doc)
    stages.report(cfg, Path("reports"))
    _assert_png(Path("reports/f1_by_answerability.png"))
    rows = list(csv.DictReader(open("reports/f1_by_answerability.csv", newline="")))
    assert [r["answerability"] for r in rows] == ["HasAns", "NoAns"]
    assert [float(r["bidaf"]) for r in rows] == [100.0, 100.0]
    assert [float(r["ensemble"]) for r in rows] == [0.0, 100.0]  # "" is right on NoAns
    html = Path("reports/report.html").read_text()
    assert "HasAns_f1" in html and "oracle_best_f1" in html


def _report_error(params: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--params", params])
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_report_without_predictions_is_a_one_line_error(
        make_config, synth_v1: SynthData, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    cfg = make_config(synth_v1)
    params = str(cfg.data.out_dir.parent / "params.yaml")
    assert _report_error(params, capsys) == [
        "error: predictions/: no <variant>.json predictions; run `rcpipe evaluate VARIANT` "
        "first"]
    _write("predictions/rnet.json", {})
    assert _report_error(params, capsys) == [
        "error: metrics/rnet.json: no metrics beside predictions/rnet.json; run "
        "`rcpipe evaluate rnet` again"]
