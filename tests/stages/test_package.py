"""`rcpipe package`: the session's trained bidaf as a package; served and asked in a fresh
interpreter that cannot import training code, it answers as `rcpipe predict` on the run does;
its model card's numbers are metrics/<v>.json's; a tampered package is one line, exit 2."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rcpipe import stages
from rcpipe.trained.package_dir import CARD, CONFIG, VOCAB, WEIGHTS
from tests.conftest import Trained, questions_of, write_params

ROOT = Path(__file__).resolve().parents[2]

# a fresh interpreter in which any import of rcpipe.train fails, answering with the package:
# a whole file through `rcpipe predict --input` and one question through the service
FRESH = """
import importlib.abc, json, sys
class NoTraining(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "rcpipe.train" or name.startswith("rcpipe.train."):
            raise ImportError(f"training code imported: {name}")
sys.meta_path.insert(0, NoTraining())
pkg, dev, out, context, question = sys.argv[1:6]
from rcpipe.cli import main
try:
    main(["predict", "--model", pkg, "--input", dev, "--out", out])
except SystemExit as e:
    assert not e.code, e.code
from rcpipe.config import load_config
from rcpipe.stages.serving import answerer
# what a Reader replica of `rcpipe serve --model PKG` runs: the package loaded, a batch answered
answer = answerer(load_config("params.yaml"), pkg, "torch", 0, ".")
served = answer([(context, question)])[0]
print(json.dumps({"served": served,
                  # rcpipe.train and its modules, not rcpipe.trained
                  "train": sorted(m for m in sys.modules if m.split(".")[:2] == ["rcpipe",
                                                                                 "train"])}))
"""


@pytest.fixture(scope="module")
def packaged(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("package") / "bidaf"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)  # models/, metrics/ are relative to the run
        assert stages.package(trained.cfg, "bidaf", out) == out
    return out


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def _table(card: str, heading: str) -> dict[str, list[str]]:
    """The rows of the markdown table under ``heading``: first cell -> the others."""
    section = card.split(heading, 1)[1].split("\n#", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")]
    return {r[0]: r[1:] for r in rows[1:]}  # without the header row


@pytest.mark.integration
@pytest.mark.trains
def test_a_package_holds_its_files_and_their_digests(trained: Trained, packaged: Path) -> None:
    names = {p.name for p in packaged.iterdir()}
    assert names == {WEIGHTS, CONFIG, VOCAB, CARD}  # v1.1: no threshold file
    config = _read(packaged / CONFIG)
    assert config["variant"] == "bidaf" and "Seo et al. 2017" in config["paper"]
    assert config["sha256"] == {n: hashlib.sha256((packaged / n).read_bytes()).hexdigest()
                                for n in names - {CONFIG}}
    assert config["model_config"]["hidden"] == trained.cfg.models.bidaf.hidden
    assert config["data"]["limits"] == trained.cfg.data.limits.model_dump()
    assert (packaged / VOCAB).read_bytes() == \
        (trained.cfg.data.out_dir / "vocab.json").read_bytes()
    assert [s["sha256"] for s in config["data"]["sources"]] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in (trained.data.train,
                                                             trained.data.dev)]


@pytest.mark.integration
@pytest.mark.trains
def test_the_model_cards_numbers_are_the_metrics_files(trained: Trained,
                                                        packaged: Path) -> None:
    card = (packaged / CARD).read_text()
    metrics = _read(trained.root / "metrics/bidaf.json")
    assert _read(packaged / CONFIG)["metrics"] == metrics
    table = _table(card, "## Metrics")
    assert set(table) == set(metrics) >= {"exact_match", "f1"}
    for key, value in metrics.items():
        assert float(table[key][0]) == pytest.approx(value, abs=0.005), key
    by_type = _read(trained.root / "metrics/bidaf.by_type.json")
    rows = _table(card, "### By question type")
    assert set(rows) == set(by_type)
    for kind, m in by_type.items():
        assert [float(x) for x in rows[kind]] == pytest.approx(
            [m["exact"], m["f1"], m["total"]], abs=0.005), kind
    summary = _read(trained.root / "models/bidaf/summary.json")
    assert summary["steps"] == 3  # the round trip: a model trained 3 steps
    assert "- steps: 3," in card
    assert f"training time: {summary['train_seconds']} s" in card
    assert f"on {summary['device']}" in card
    assert re.search(r"params digest .*`[0-9a-f]{64}`", card)
    for data in (trained.data.train, trained.data.dev):
        assert hashlib.sha256(data.read_bytes()).hexdigest() in card
    assert "Intended use and limits" in card
    # a model hub's metadata, read back by huggingface_hub itself
    from huggingface_hub import ModelCard

    hub = ModelCard(card).data
    assert hub.license == "mit" and hub.datasets == ["rajpurkar/squad"]
    assert hub.pipeline_tag == "question-answering"
    found = {r.metric_type: r.metric_value for r in hub.eval_results}
    assert found == pytest.approx({"exact_match": metrics["exact_match"],
                                   "f1": metrics["f1"]}, abs=0.005)
    assert {r.dataset_type for r in hub.eval_results} == {"rajpurkar/squad"}


@pytest.mark.integration
@pytest.mark.trains
def test_the_package_answers_as_the_run_does_without_training_code(
        trained: Trained, packaged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    qa = questions_of(trained.data.dev_doc)[0]
    context = next(p["context"] for a in trained.data.dev_doc["data"]
                   for p in a["paragraphs"] if any(q["id"] == qa["id"] for q in p["qas"]))
    with monkeypatch.context() as mp:  # `rcpipe predict` on the run, with the variant
        mp.chdir(trained.root)
        run = tmp_path / "run" / "bidaf.json"
        stages.predict(trained.cfg, "bidaf", input_file=str(trained.data.dev), out=run)
        one = stages.predict(trained.cfg, "bidaf", qa["question"], context)
    away = tmp_path / "away"  # nothing of the run here: a params file of another run
    write_params(away / "params.yaml")
    out = subprocess.run(
        [sys.executable, "-c", FRESH, str(packaged), str(trained.data.dev),
         str(away / "pkg.json"), context, qa["question"]],
        cwd=away, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["train"] == []
    assert _read(away / "pkg.json") == _read(run)
    mine, theirs = _read(away / "pkg.nbest.json"), _read(run.with_suffix(".nbest.json"))
    for qid, entry in theirs.items():
        assert mine[qid]["text"] == entry["text"]
        assert mine[qid]["prob"] == pytest.approx(entry["prob"], rel=1e-5, abs=1e-9)
    served = got["served"]
    assert (served["text"], served["start"], served["end"]) == \
        (one["answer"], one["start"], one["end"])
    assert served["prob"] == pytest.approx(one["prob"], rel=1e-5, abs=1e-9)


@pytest.mark.integration
@pytest.mark.trains
def test_a_tampered_package_is_one_line_and_exit_2(trained: Trained, packaged: Path,
                                                   tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(packaged, bad)
    data = bytearray((bad / WEIGHTS).read_bytes())
    data[-4] ^= 0x10  # one bit of a weight
    (bad / WEIGHTS).write_bytes(bytes(data))
    write_params(tmp_path / "params.yaml")
    with socket.socket() as s:  # a free port for serve, which refuses before listening long
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for argv in (["predict", "--model", str(bad), "--question", "q", "--context", "a b c"],
                 ["serve", "--model", str(bad), "--port", port]):
        out = subprocess.run([sys.executable, "-m", "rcpipe", *argv], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 2, out.stderr[-2000:]
        assert out.stderr.strip().splitlines()[-1] == (
            f"error: {bad / WEIGHTS}: refused: its sha256 is not the one recorded in "
            "config.json (changed after packaging); package again")
        assert "Traceback" not in out.stderr


@pytest.mark.integration
@pytest.mark.trains
def test_explain_takes_a_package(trained: Trained, packaged: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(trained.root)
    qid = questions_of(trained.data.dev_doc)[0]["id"]
    mine, _ = stages.explain(trained.cfg, str(packaged), qid, tmp_path / "pkg.html")
    theirs, _ = stages.explain(trained.cfg, "bidaf", qid, tmp_path / "run.html")
    assert (mine.variant, mine.answer, mine.start, mine.end) == \
        (theirs.variant, theirs.answer, theirs.start, theirs.end)


@pytest.mark.integration
@pytest.mark.trains
def test_packaging_needs_an_evaluated_variant(trained: Trained, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no models/, no metrics/
    from rcpipe.errors import InputError

    with pytest.raises(InputError, match=r"run `rcpipe evaluate rnet` first"):
        stages.package(trained.cfg, "rnet", tmp_path / "out")


def test_a_v2_package_carries_the_threshold_evaluate_chose(
        make_config: Any, synth_v2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rcpipe.trained.package_dir import THRESHOLD, load_package
    from tests.conftest import TINY_MODEL, save_untrained_model

    cfg = make_config(synth_v2, models={"qanet": TINY_MODEL})
    monkeypatch.chdir(tmp_path)
    stages.prepare(cfg)
    save_untrained_model(cfg, "qanet", no_answer=True)
    stages.evaluate(cfg, "qanet")
    out = stages.package(cfg, "qanet")
    chosen = _read(tmp_path / "models/qanet/na_threshold.json")
    assert _read(out / THRESHOLD) == chosen and chosen["na_threshold"] is not None
    pkg = load_package(out)
    assert pkg.inputs.no_answer and pkg.na_threshold == chosen["na_threshold"]
    card = (out / CARD).read_text()
    assert chosen["source"] == "heldout"
    assert f"{chosen['na_threshold']} (chosen on {cfg.data.train_file} (held-out articles)" \
        in card and "never on dev (source heldout)" in card
    assert "oracle best_f1 (dev's own best threshold" in card
    assert {"HasAns", "NoAns"} <= set(_table(card, "### By question type"))
    assert "Not recorded (no models/qanet/summary.json)" in card
