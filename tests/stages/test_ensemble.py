"""rcpipe.stages.ensemble: the majority vote's files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rcpipe import stages
from rcpipe.config import load_config
from rcpipe.errors import InputError
from rcpipe.scoring.metrics import score
from tests.conftest import SynthData, questions_of, write_params

# ------------------------------------------------------------------------------------ score


def _nbest(answers: dict[str, str], prob: float = 0.5, na_prob: float = 0.1
           ) -> dict[str, dict[str, Any]]:
    return {q: {"text": t, "prob": prob, "na_prob": na_prob} for q, t in answers.items()}


def _write(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


@pytest.fixture
def ens_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synth_v1: SynthData) -> Path:
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path / "params.yaml", data={"dev_file": str(synth_v1.dev)})
    return tmp_path


def test_ensemble_majority_vote_files(ens_dir: Path, synth_v1: SynthData) -> None:
    gold = {qa["id"]: qa["answers"][0]["text"] for qa in questions_of(synth_v1.dev_doc)}
    wrong = {q: "nothing like it" for q in gold}
    first = next(iter(gold))
    _write(Path("predictions/bidaf.nbest.json"), _nbest(gold, 0.3))
    _write(Path("predictions/rnet.nbest.json"), _nbest({**wrong, first: gold[first]}, 0.9))
    _write(Path("predictions/qanet.nbest.json"), _nbest(gold, 0.4, na_prob=0.4))
    result = stages.ensemble(load_config("params.yaml"))

    # no distributions beside the nbest files: the vote alone, named
    assert result == {"exact_match": 100.0, "f1": 100.0, "method": "vote",
                      "methods": {"vote": {"em": 100.0, "f1": 100.0}}}
    assert json.loads(Path("predictions/ensemble.json").read_text()) == gold
    # the metrics file the chosen method's EM/F1 alone; how it combines beside it
    assert json.loads(Path("metrics/ensemble.json").read_text()) == {"exact_match": 100.0,
                                                                     "f1": 100.0}
    assert json.loads(Path("metrics/ensemble.methods.json").read_text()) == {
        "method": "vote", "methods": {"vote": {"em": 100.0, "f1": 100.0}}}
    voted = json.loads(Path("predictions/ensemble.nbest.json").read_text())
    assert voted[first] == {"text": gold[first], "prob": 0.9, "votes": 3,
                            "na_prob": pytest.approx(0.2)}
    other = next(q for q in gold if q != first)
    assert voted[other]["votes"] == 2 and voted[other]["prob"] == 0.4
    by_type = json.loads(Path("metrics/ensemble.by_type.json").read_text())
    assert sum(v["total"] for v in by_type.values()) == len(gold)


def test_ensemble_tie_goes_to_the_higher_prob(ens_dir: Path, synth_v1: SynthData) -> None:
    gold = {qa["id"]: qa["answers"][0]["text"] for qa in questions_of(synth_v1.dev_doc)}
    wrong = {q: "nothing like it" for q in gold}
    a = _write(ens_dir / "in/a.json", _nbest(wrong, 0.6))
    b = _write(ens_dir / "in/b.json", _nbest(gold, 0.7))
    out = Path("out/custom.json")
    result = stages.ensemble(load_config("params.yaml"), [a, b], out)
    assert result["exact_match"] == 100.0
    assert json.loads(out.read_text()) == gold
    assert Path("out/custom.nbest.json").is_file()
    how = json.loads(Path("metrics/custom.methods.json").read_text())
    assert json.loads(Path("metrics/custom.json").read_text()) | how == result
    # and the other way round: the wrong text wins the tie
    _write(a, _nbest(wrong, 0.8))
    assert stages.ensemble(load_config("params.yaml"), [a, b], out)["exact_match"] == 0.0


def test_ensemble_v2_empty_text_is_an_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             synth_v2: SynthData) -> None:
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path / "params.yaml", data={"dev_file": str(synth_v2.dev)})
    gold = {qa["id"]: (qa["answers"][0]["text"] if qa["answers"] else "")
            for qa in questions_of(synth_v2.dev_doc)}
    blank = {q: "" for q in gold}
    _write(Path("predictions/bidaf.nbest.json"), _nbest(gold))
    _write(Path("predictions/rnet_mult.nbest.json"), _nbest(gold))
    _write(Path("predictions/qanet.nbest.json"), _nbest(blank, 0.99))
    result = stages.ensemble(load_config("params.yaml"))
    assert result["exact"] == 100.0 and result["total"] == len(gold)
    assert {"HasAns_exact", "NoAns_exact"} <= set(result) and "best_exact" in result["oracle"]
    assert json.loads(Path("predictions/ensemble.json").read_text()) == gold


def test_the_ensemble_votes_answers_already_given_at_each_held_out_threshold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synth_v2: SynthData) -> None:
    """Each voter abstained ("") at its own held-out threshold; the voted texts are scored
    as they are, and the walk on dev (which would answer differently) is the oracle."""
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path / "params.yaml", data={"dev_file": str(synth_v2.dev)})
    qas = questions_of(synth_v2.dev_doc)
    # every voter gives the gold span, and at its held-out threshold (0.95) answers three
    # unanswerable questions too, whose na_prob (0.9) dev's own walk would abstain on
    bold = set(sorted(qa["id"] for qa in qas if not qa["answers"])[:3])
    nbest = {qa["id"]: {"text": qa["answers"][0]["text"] if qa["answers"] else
                        "wrong" if qa["id"] in bold else "", "prob": 0.9,
                        "na_prob": 0.0 if qa["answers"] else 0.9} for qa in qas}
    for v in ("bidaf", "qanet"):
        _write(Path(f"predictions/{v}.nbest.json"), nbest)
        _write(Path(f"models/{v}/na_threshold.json"), {"na_threshold": 0.95,
                                                       "source": "heldout"})
    result = stages.ensemble(load_config("params.yaml"))
    voted = json.loads(Path("predictions/ensemble.json").read_text())
    assert voted == {q: v["text"] for q, v in nbest.items()}
    assert result["f1"] == score(synth_v2.dev_doc, voted)["f1"] < 100.0
    assert result["na_threshold"] is None and result["na_threshold_source"] == "voters"
    assert result["voters"] == {"bidaf": "heldout", "qanet": "heldout"}
    assert result["oracle"]["best_f1"] == 100.0  # dev's own walk: not the result
    # the metrics file its scores; how it combined (the vote of the voters' answers) beside
    how = json.loads(Path("metrics/ensemble.methods.json").read_text())
    assert json.loads(Path("metrics/ensemble.json").read_text()) | how == result
    assert how["method"] == "vote" and set(how["methods"]) == {"vote"}


def test_ensemble_without_inputs(ens_dir: Path) -> None:
    with pytest.raises(InputError) as info:
        stages.ensemble(load_config("params.yaml"))
    assert info.value.file == "predictions/"


@pytest.mark.parametrize(
    ("entry", "location"),
    [
        ({"text": "x", "na_prob": 0.1}, '["q"].prob'),
        ({"text": "x", "prob": 0.5}, '["q"].na_prob'),
        ({"text": "x", "prob": "high", "na_prob": 0.1}, '["q"].prob'),
        ({"text": "x", "prob": True, "na_prob": 0.1}, '["q"].prob'),
        ({"prob": 0.5, "na_prob": 0.1}, '["q"]'),
        ("x", '["q"]'),
    ],
)
def test_ensemble_malformed_nbest(ens_dir: Path, entry: Any, location: str) -> None:
    path = _write(ens_dir / "bad.nbest.json", {"q": entry})
    with pytest.raises(InputError) as info:
        stages.ensemble(load_config("params.yaml"), [path])
    assert (info.value.file, info.value.location) == (str(path), location)
    assert not Path("predictions").exists()  # nothing written for a bad input


def test_ensemble_ids_from_another_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           synth_v2: SynthData) -> None:
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path / "params.yaml", data={"dev_file": str(synth_v2.dev)})
    path = _write(tmp_path / "other.nbest.json", _nbest({"not-a-dev-id": "x"}))
    with pytest.raises(InputError) as info:
        stages.ensemble(load_config("params.yaml"), [path])
    assert info.value.file == str(synth_v2.dev)


# ------------------------------------------- mean and selected: distributions beside nbest

def test_every_method_is_scored_and_selected_weighs_on_the_held_out_questions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prepared: Any) -> None:
    """Beside each nbest file its distributions (what `rcpipe evaluate` writes): the stage
    scores the vote, the mean and the selected mean side by side, and gives the method
    params name; selection weighs only the member right on the held-out questions."""
    from rcpipe.data.dataset import SquadDataset
    from rcpipe.data.prepared import Prepared as Out
    from rcpipe.inference import distributions
    from rcpipe.inference.reading import Split, heldout_split
    from tests.inference.test_ensemble import one_hot

    monkeypatch.chdir(tmp_path)
    out = Out(prepared.out_dir)
    dev = Split(SquadDataset.from_parquet(out.dev), prepared.data.dev_doc)
    held = heldout_split(out.heldout(), None)
    for name, right in (("bidaf", True), ("rnet", False), ("qanet", False)):
        parts = {"dev": one_hot(dev, right, 1), "heldout": one_hot(held, right, 2)}
        Path("predictions").mkdir(exist_ok=True)
        Path(f"predictions/{name}.dists.parquet").write_bytes(distributions.to_parquet(parts))
        _write(Path(f"predictions/{name}.nbest.json"),
               _nbest({q: "nothing like it" for q in dev.dataset.ids}))
    write_params(tmp_path / "params.yaml", data={
        "dev_file": str(prepared.data.dev), "out_dir": str(prepared.out_dir)},
        ensemble={"method": "selected", "rounds": 3})
    result = stages.ensemble(load_config("params.yaml"))
    methods = result["methods"]
    assert result["method"] == "selected" and result["f1"] == pytest.approx(100.0)
    assert methods["vote"]["f1"] == 0.0 and methods["mean"]["f1"] < 100.0
    # round 1 already reaches 100 on the held-out questions: the earliest best is kept
    assert methods["selected"]["weights"] == {"bidaf": 1, "rnet": 0, "qanet": 0}
    assert methods["selected"]["heldout_f1_by_round"][0] == pytest.approx(100.0)
    gold = {qa["id"]: qa["answers"][0]["text"] for qa in questions_of(prepared.data.dev_doc)}
    assert json.loads(Path("predictions/ensemble.json").read_text()) == gold
    # the next night: nothing changed, nothing redone; ensemble.method changed, the stage
    # runs again and gives that method's answers, the others still scored beside it
    stamp = Path(".rcpipe/stamps/ensemble-ensemble.json")
    kept = stamp.stat().st_mtime_ns
    assert stages.ensemble(load_config("params.yaml")) == result
    assert stamp.stat().st_mtime_ns == kept
    write_params(tmp_path / "params.yaml", data={
        "dev_file": str(prepared.data.dev), "out_dir": str(prepared.out_dir)},
        ensemble={"method": "vote", "rounds": 3})
    again = stages.ensemble(load_config("params.yaml"))
    assert again["method"] == "vote" and again["f1"] == methods["vote"]["f1"] == 0.0
    assert again["methods"] == methods
    # a distributions file missing where the method needs one: one line naming it
    write_params(tmp_path / "params.yaml", data={
        "dev_file": str(prepared.data.dev), "out_dir": str(prepared.out_dir)},
        ensemble={"method": "selected", "rounds": 3})
    Path("predictions/qanet.dists.parquet").unlink()
    with pytest.raises(InputError, match="qanet.dists.parquet.*no distributions"):
        stages.ensemble(load_config("params.yaml"), force=True)
