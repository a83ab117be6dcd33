"""`rcpipe predict`: the answers `rcpipe evaluate` gives, for one question or a whole file;
model files that are not what the params describe are refused in one line."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from rcpipe import stages
from rcpipe.cli import main
from rcpipe.config import load_config
from tests.conftest import (
    TINY_MODEL,
    SynthData,
    Trained,
    questions_of,
    save_untrained_model,
    write_params,
)


@pytest.fixture
def in_run(trained: Trained, monkeypatch: pytest.MonkeyPatch) -> Trained:
    monkeypatch.chdir(trained.root)
    return trained


def _read(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.mark.integration
@pytest.mark.trains
def test_predict_input_file_gives_evaluates_answers(in_run: Trained, tmp_path: Path) -> None:
    for model in (*in_run.variants, "ensemble"):
        out = tmp_path / f"{model}.json"
        stages.predict(in_run.cfg, model, input_file=str(in_run.data.dev), out=out)
        assert _read(out) == _read(f"predictions/{model}.json"), model
        mine, theirs = _read(tmp_path / f"{model}.nbest.json"), \
            _read(f"predictions/{model}.nbest.json")
        for qid, entry in theirs.items():
            assert mine[qid]["text"] == entry["text"]
            assert mine[qid]["prob"] == pytest.approx(entry["prob"], rel=1e-5, abs=1e-9)
            assert mine[qid]["na_prob"] == pytest.approx(entry["na_prob"], abs=1e-9)


@pytest.mark.integration
@pytest.mark.trains
def test_predict_one_question_gives_evaluates_answer_and_its_span(in_run: Trained) -> None:
    nbest = {m: _read(f"predictions/{m}.nbest.json") for m in (*in_run.variants, "ensemble")}
    contexts = {qa["id"]: p["context"] for a in in_run.data.dev_doc["data"]
                for p in a["paragraphs"] for qa in p["qas"]}
    for qa in questions_of(in_run.data.dev_doc)[:1]:
        context = contexts[qa["id"]]
        for model, answers in nbest.items():
            got = stages.predict(in_run.cfg, model, qa["question"], context)
            # v1.1: no na_prob; windows: how many the context was read as (a paragraph: 1)
            assert set(got) == {"model", "answer", "start", "end", "prob", "windows"}
            assert got["windows"] == 1
            assert got["answer"] == answers[qa["id"]]["text"]
            assert context[got["start"] : got["end"]] == got["answer"]
            assert got["prob"] == pytest.approx(answers[qa["id"]]["prob"], rel=1e-5, abs=1e-9)


@pytest.mark.integration
@pytest.mark.trains
def test_cli_prints_json_and_a_mistake_is_one_line(in_run: Trained, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    passage = tmp_path / "passage.txt"
    passage.write_text("Ada Lovelace wrote the first program in 1843 in London.")
    assert _exit_code(["predict", "--model", "bidaf", "--context-file", str(passage),
                       "--question", "When did Ada Lovelace write the first program?"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["model"] == "bidaf" and 0.0 <= got["prob"] <= 1.0
    assert passage.read_text()[got["start"] : got["end"]] == got["answer"] != ""
    for argv, message in [
        (["--model", "bert", "--context", "c", "--question", "q"], "error: --model: bert: "),
        (["--context", "c"], "error: predict: --question: give a question"),
        (["--question", "q"], "error: predict: give one of --context"),
        (["--context-file", str(tmp_path / "nope.txt"), "--question", "q"], "no such file"),
    ]:
        assert _exit_code(["predict", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


class _Exploit:
    """A pickle that would run code on load, as a model.pt from a stranger might."""

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (Path("pwned"),))


@pytest.mark.integration
@pytest.mark.trains
def test_a_model_file_that_is_not_what_the_params_say_is_refused(
        trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained.root / "models" / "bidaf", "models/bidaf",
                    ignore=shutil.ignore_patterns("runs"))
    params = str(trained.root / "params.yaml")
    ask = ["predict", "--params", params, "--model", "bidaf", "--context", "c", "--question", "q"]

    assert _exit_code([*ask, "--set", "models.bidaf.hidden=12"]) == 2
    err = capsys.readouterr().err
    assert err == "error: models/bidaf/model.pt: model_config.hidden: 8 in the file, 12 in " \
                  "models.bidaf of the params; train again\n"

    saved = torch.load("models/bidaf/model.pt", weights_only=True)
    torch.save({**saved, "extra": _Exploit()}, "models/bidaf/model.pt")
    assert _exit_code(ask) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: models/bidaf/model.pt: refused: not a weights-only model "
                          "file (") and err.count("\n") == 1, err
    assert not Path("pwned").exists()  # and nothing ran

    Path("models/bidaf/model.pt").write_bytes(pickle.dumps(["not", "torch"])[:-3])
    assert _exit_code(ask) == 2
    assert "refused: not a weights-only model file" in capsys.readouterr().err

    torch.save({"variant": "bidaf", "vocab_sha256": saved["vocab_sha256"]},
               "models/bidaf/model.pt")
    assert _exit_code(ask) == 2
    assert "refused: not an rcpipe model file" in capsys.readouterr().err


def test_a_v2_model_reports_its_no_answer_probability(
        synth_v2: SynthData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Untrained weights are enough: this is about what predict reports, not the answer."""
    monkeypatch.chdir(tmp_path)
    cfg = load_config(write_params(tmp_path / "params.yaml", data={
        "train_file": str(synth_v2.train), "dev_file": str(synth_v2.dev)},
        models={"rnet_mult": TINY_MODEL}))
    stages.prepare(cfg)
    save_untrained_model(cfg, "rnet_mult", no_answer=True)
    got = stages.predict(cfg, "rnet_mult", "Who?", "Nobody was there at all.")
    assert 0.0 < got["na_prob"] < 1.0 and got["prob"] + got["na_prob"] <= 1.0 + 1e-6
    # evaluate chooses the no-answer threshold on the held-out questions and predict
    # answers at it
    stages.evaluate(cfg, "rnet_mult")
    chosen = _read("models/rnet_mult/na_threshold.json")["na_threshold"]
    assert chosen == _read("metrics/rnet_mult.json")["na_threshold"]
    stages.predict(cfg, "rnet_mult", input_file=str(synth_v2.dev), out=tmp_path / "p.json")
    assert _read(tmp_path / "p.json") == _read("predictions/rnet_mult.json")
    # an explicit eval.na_threshold still wins
    never = load_config(tmp_path / "params.yaml", ["eval.na_threshold=1.0"])
    stages.predict(never, "rnet_mult", input_file=str(synth_v2.dev), out=tmp_path / "n.json")
    assert all(_read(tmp_path / "n.json").values())  # na_prob > 1 never: every one answered
