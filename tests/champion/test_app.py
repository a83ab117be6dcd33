"""rcpipe/champion/app.py's ``Champion`` (in-process, no Ray) for an ensemble champion: its
voters' answers combined as champion.json's "ensemble" says (ensemble.method: the vote, or
the mean of their distributions with the weights `rcpipe ensemble` chose), and a forged
"ensemble", a record that is not an object or one without its pins refused in one line
with nothing served."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.champion.app import Champion
from rcpipe.errors import InputError
from rcpipe.inference.answer import averaged, voted
from rcpipe.inference.combination import Combination
from rcpipe.trained.reader import load_reader
from tests.conftest import Trained
from tests.serve.conftest import champion_workspace, crown_night

pytestmark = [pytest.mark.integration, pytest.mark.trains]
ASKED = [("Ada wrote it in 1843. Grace wrote hers in 1952.", "When did Ada write it?"),
         ("The bridge opened in 1890 in Port Salfield.", "Where did the bridge open?")]


def test_an_ensemble_champion_answers_by_its_method(trained: Trained, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    where = champion_workspace(tmp_path / "work")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)
        made = {v: stages.package(trained.cfg, v, tmp_path / "made" / v)
                for v in ("bidaf", "qanet")}
    voters = {}  # each voter's own answers, with its distributions
    for v, package in made.items():
        reader = load_reader(trained.cfg, [str(package)], "torch", 1)
        voters[v] = reader.answer_pairs(ASKED, str(package), token_probs=True)
    work = str(tmp_path / "work")

    def served(night: str, how: Combination | None) -> list[dict]:
        crown_night(where, night, made["bidaf"], crowned=True, also=(made["qanet"],),
                    ensemble=how)
        return Champion(trained.cfg, work, None, 1, replica=False)(ASKED)

    # no "ensemble" in champion.json (a promotion from before it): the vote
    assert [a["text"] for a in served("nV", None)] == [
        voted([voters["bidaf"][i], voters["qanet"][i]])["text"] for i in range(len(ASKED))]
    mean = served("nM", Combination("mean", {"bidaf": 1.0, "qanet": 1.0}))
    assert [(a["text"], a["start"], a["end"], a["night"]) for a in mean] == [
        (w["text"], w["start"], w["end"], "nM") for w in (
            averaged([voters["bidaf"][i], voters["qanet"][i]], [1.0, 1.0], c, 15)
            for i, (c, _) in enumerate(ASKED))]
    # selected's weights count: qanet left out, the ensemble answers as bidaf's mean alone
    alone = served("nS", Combination("selected", {"bidaf": 2.0, "qanet": 0.0}))
    assert [a["text"] for a in alone] == [
        averaged([voters["bidaf"][i]], [1.0], c, 15)["text"] for i, (c, _) in enumerate(ASKED)]
    # a forged ensemble, a record that is not an object, one without its pins: refused
    # at the deploy in one line (fail closed), nothing served from it
    import json

    from rcpipe.release import record

    last = record.read(where, trained.cfg.limits).entry
    forged = {**last, "ensemble": {"method": "median", "weights": {"bidaf": 1.0}}}
    for bad, says in ((forged, "ensemble: method 'median' is none of vote, mean, selected"),
                      ([1, 2], "expected a JSON object, found list"),
                      ({**last, "packages_sha256": {}}, "packages_sha256.bidaf: missing")):
        where.write(json.dumps(bad).encode(), record.HEAD)
        caplog.clear()
        with caplog.at_level(logging.ERROR, "rcpipe.champion.app"), \
                pytest.raises(InputError, match="the champion record is refused") as e:
            Champion(trained.cfg, work, None, 1, replica=False)
        assert "rcpipe/champion.json: " + says in e.value.line(), e.value.line()
        said = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(said) == 1 and "Traceback" not in caplog.text
    # a champion answering: a bad record at each of three polls is one line, and it answers on
    where.write(json.dumps(last).encode(), record.HEAD)
    here = Champion(trained.cfg, work, None, 1, replica=False)
    where.write(json.dumps({**last, "seq": last["seq"] + 1, "package_sha256": None,
                            "packages_sha256": None}).encode(), record.HEAD)
    caplog.clear()
    with caplog.at_level(logging.ERROR, "rcpipe.champion.app"):
        assert not any(here.update() for _ in range(3))
    assert len(caplog.records) == 1, caplog.text
    assert [a["champion"]["seq"] for a in here(ASKED)] == [last["seq"]] * len(ASKED)
