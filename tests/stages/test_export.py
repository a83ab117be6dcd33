"""`rcpipe export`: the session's trained bidaf exported beside its model.pt (and from a
package directory), checked against the eager model on the dev questions; a Reader of the
service on `--runtime onnx` answers as the eager one does (served on Ray Serve:
tests/serve/test_rollout.py); a graph exported before the distinct words serves until exported
again; a missing, changed or unreadable model.onnx is one line and exit 2; `--model DIR`
needs no params.yaml."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.data.dataset import SquadDataset
from rcpipe.errors import InputError
from rcpipe.stages.serving import answerer
from rcpipe.trained.model_file import load_model
from rcpipe.trained.onnx import ONNX, RECORD, export_graph, export_record, sha256
from tests.conftest import Trained, questions_of

pytestmark = [pytest.mark.integration, pytest.mark.trains]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the trained run's models/ (the fixture is read-only), bidaf exported there."""
    root = tmp_path_factory.mktemp("export-run")
    shutil.copytree(trained.root / "models" / "bidaf", root / "models" / "bidaf",
                    ignore=shutil.ignore_patterns("runs", "live"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        record = stages.export(trained.cfg, "bidaf")
    assert record["check"]["max_abs_diff"] <= 1e-4
    return root


def test_export_writes_the_graph_and_what_it_was_checked_against(trained: Trained,
                                                                  run: Path) -> None:
    where = run / "models" / "bidaf"
    record = json.loads((where / RECORD).read_text())
    assert record["onnx_sha256"] == sha256((where / ONNX).read_bytes())
    assert record["source_sha256"] == sha256((where / "model.pt").read_bytes())
    check = record["check"]
    assert check["questions"] == len(questions_of(trained.data.dev_doc))  # < 256 here
    assert check["tolerance"] == 1e-4 and check["data"] == trained.cfg.data.dev_file
    # one batch of every dev question: not the 3 questions the graph was traced on
    assert [s[0] for s in check["shapes"]] == [check["questions"]] != [3]
    assert record["inputs"]["cc"] == ["batch", "context", "chars"]


def test_the_onnx_reader_answers_as_the_eager_one(trained: Trained, run: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(run)
    qs = questions_of(trained.data.dev_doc)[:6]
    contexts = {qa["id"]: p["context"] for a in trained.data.dev_doc["data"]
                for p in a["paragraphs"] for qa in p["qas"]}
    pairs = [(contexts[qa["id"]], qa["question"]) for qa in qs]
    answers = {}
    for runtime in ("torch", "onnx"):  # what each Reader replica runs on a batch
        answers[runtime] = answerer(trained.cfg, "bidaf", runtime, 0, str(run))(pairs)
    for eager, onnx in zip(answers["torch"], answers["onnx"], strict=True):
        assert (onnx["text"], onnx["start"], onnx["end"]) == \
            (eager["text"], eager["start"], eager["end"])
        assert onnx["prob"] == pytest.approx(eager["prob"], abs=1e-4)
        assert onnx["p_start"] == pytest.approx(eager["p_start"], abs=1e-4)


def test_a_graph_exported_before_the_distinct_words_serves_until_exported_again(
        trained: Trained, run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "run"
    shutil.copytree(run / "models", old / "models")
    monkeypatch.chdir(old)
    where = old / "models" / "bidaf"
    model, _ = load_model(trained.cfg, "bidaf")
    dev = SquadDataset.from_parquet(trained.cfg.data.out_dir / "dev")
    # what export wrote before: the graph over the token ids alone, and its record
    graph = export_graph(model.eval(), dataclasses.replace(
        dev.collate([0, 1, 2]), words=None, word_ids=None, cu=None, qu=None))
    check = json.loads((where / RECORD).read_text())["check"]
    (where / ONNX).write_bytes(graph)
    (where / RECORD).write_text(json.dumps(export_record("bidaf", "bidaf", where / "model.pt",
                                                         graph, check)))
    qs = questions_of(trained.data.dev_doc)[:4]
    contexts = {qa["id"]: p["context"] for a in trained.data.dev_doc["data"]
                for p in a["paragraphs"] for qa in p["qas"]}
    pairs = [(contexts[qa["id"]], qa["question"]) for qa in qs]
    eager = answerer(trained.cfg, "bidaf", "torch", 0, str(old))(pairs)
    before = answerer(trained.cfg, "bidaf", "onnx", 0, str(old))(pairs)
    assert list(json.loads((where / RECORD).read_text())["inputs"]) == ["cw", "cc", "qw", "qc"]
    record = stages.export(trained.cfg, "bidaf")  # the user exports again
    assert list(record["inputs"]) == ["cw", "cc", "qw", "qc", "words", "word_ids", "cu", "qu"]
    again = answerer(trained.cfg, "bidaf", "onnx", 0, str(old))(pairs)
    for e, b, a in zip(eager, before, again, strict=True):
        assert (b["text"], b["start"]) == (a["text"], a["start"]) == (e["text"], e["start"])


def _rcpipe(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rcpipe", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_missing_or_changed_graph_is_one_line_and_exit_2(trained: Trained, run: Path,
                                                          tmp_path: Path) -> None:
    bad = tmp_path / "run"
    shutil.copytree(run / "models", bad / "models")
    shutil.copy(trained.root / "params.yaml", bad / "params.yaml")
    onnx_file = bad / "models" / "bidaf" / ONNX
    onnx_file.write_bytes(onnx_file.read_bytes()[:-100])  # cut short
    ask = ["predict", "--model", "bidaf", "--runtime", "onnx", "--question", "q", "--context",
           "a b c"]
    out = _rcpipe(bad, *ask)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: {Path('models/bidaf') / ONNX}: refused: its sha256 is not the one "
        f"{RECORD} records (changed after export); run `rcpipe export --model bidaf` again")
    onnx_file.unlink()
    out = _rcpipe(bad, *ask)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: {Path('models/bidaf') / ONNX}: no such file: no exported model; run "
        "`rcpipe export --model bidaf` first")


def test_a_graph_onnxruntime_cannot_read_is_refused(trained: Trained, run: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(run / "models", tmp_path / "models")
    where = tmp_path / "models" / "bidaf"
    (where / ONNX).write_bytes(b"not a graph")
    record = json.loads((where / RECORD).read_text())
    (where / RECORD).write_text(json.dumps(record | {"onnx_sha256": sha256(b"not a graph")}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"model\.onnx: refused: onnxruntime cannot load it"):
        stages.predict(trained.cfg, "bidaf", "q", "a b c", runtime="onnx")
    # the weights changed after export: the graph is another model's
    (where / "model.pt").write_bytes((run / "models/bidaf/model.pt").read_bytes() + b"\0")
    with pytest.raises(InputError, match=r"refused: exported from other weights than"):
        stages.predict(trained.cfg, "bidaf", "q", "a b c", runtime="onnx")


def _cli(*argv: str) -> None:
    from rcpipe import cli

    with pytest.raises(SystemExit) as e:  # typer exits, 0 when the command succeeds
        cli.main(list(argv))
    assert e.value.code == 0


def test_a_package_exports_and_answers_with_no_params_file(
        trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """predict, serve, explain and export given a package directory, from a directory with
    no params.yaml: the params' defaults stand in (export's dev file through --set)."""
    with monkeypatch.context() as mp:
        mp.chdir(trained.root)
        pkg = stages.package(trained.cfg, "bidaf", tmp_path / "pkg")
        one = stages.predict(trained.cfg, "bidaf", "Who?", "Ada wrote it.")
    away = tmp_path / "away"  # no params.yaml; the prepared dev set explain reads
    shutil.copytree(trained.cfg.data.out_dir, away / "data" / "prepared")
    monkeypatch.chdir(away)
    _cli("export", "--model", str(pkg), "--questions", "8",
         "--set", f"data.dev_file={trained.data.dev}")
    assert json.loads(capsys.readouterr().out)["max_abs_diff"] <= 1e-4
    assert (pkg / ONNX).is_file() and (pkg / RECORD).is_file()
    for runtime in ("torch", "onnx"):
        _cli("predict", "--model", str(pkg), "--runtime", runtime, "--question", "Who?",
             "--context", "Ada wrote it.")
        got = json.loads(capsys.readouterr().out)
        assert (got["answer"], got["start"], got["end"]) == \
            (one["answer"], one["start"], one["end"])
    qid = questions_of(trained.data.dev_doc)[0]["id"]
    _cli("explain", "--model", str(pkg), "--qid", qid, "--out", str(away / "e.html"))
    assert (away / "e.html").is_file()
    served = {}
    monkeypatch.setattr(stages, "serve", lambda cfg, models, host, port, limits, threads,
                        runtime, replicas: served.update(cfg=cfg, models=models,
                                                         runtime=runtime))
    _cli("serve", "--model", str(pkg), "--runtime", "onnx")
    assert served["models"] == [str(pkg)] and served["runtime"] == "onnx"
    assert served["cfg"].source == "params defaults"
    from rcpipe import cli

    with pytest.raises(SystemExit) as e:  # a variant still needs the run's params
        cli.main(["predict", "--model", "bidaf", "--question", "q", "--context", "a"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: params.yaml: no such file"
