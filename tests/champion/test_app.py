"""rcpipe/champion/app.py's ``Champion`` (in-process, no Ray) for an ensemble champion: its
voters' answers combined as champion.json's "ensemble" says (ensemble.method: the vote, or
the mean of their distributions with the weights `rcpipe ensemble` chose), and a forged
"ensemble", a record that is not an object or one without its pins refused in one line
with nothing served; a champion's package without its config.json refused in one line and
loaded once the file is back."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.champion.app import Champion
from rcpipe.errors import InputError
from rcpipe.inference.answer import averaged, voted
from rcpipe.inference.combination import Combination
from rcpipe.trained.package_dir import CONFIG
from rcpipe.trained.reader import load_reader
from tests.conftest import Prepared, Trained, write_package
from tests.serve.conftest import champion_workspace, crown_night

ASKED = [("Ada wrote it in 1843. Grace wrote hers in 1952.", "When did Ada write it?"),
         ("The bridge opened in 1890 in Port Salfield.", "Where did the bridge open?")]


@pytest.mark.integration
@pytest.mark.trains
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


def test_a_package_without_its_config_is_one_line_and_loads_once_it_is_back(
        prepared: Prepared, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The champion's package on the remote without config.json (an upload cut short, a
    file deleted): the deploy refused in one line naming the file, no traceback (it was a
    FileNotFoundError); a champion answering logs one line however many polls, answers
    on, and loads the package once the file is back."""
    where = champion_workspace(tmp_path / "work")
    write_package(prepared, tmp_path / "made" / "qanet")
    work = str(tmp_path / "work")

    def crowned_without_config(night: str) -> tuple[str, Callable[[], None]]:
        crown_night(where, night, tmp_path / "made" / "qanet", crowned=True)
        path, url = where._where("versions", night, "packages", "qanet", CONFIG)
        data = Path(path).read_bytes()
        Path(path).unlink()
        return url, lambda: where.write(data, "versions", night, "packages", "qanet", CONFIG)

    url, put_back = crowned_without_config("n1")
    caplog.clear()
    with caplog.at_level(logging.ERROR, "rcpipe.champion.app"), \
            pytest.raises(InputError) as e:
        Champion(prepared.cfg, work, None, 1, replica=False)
    assert f"{url}: missing: the package cannot be checked" in e.value.line(), e.value.line()
    assert len(caplog.records) == 1 and "Traceback" not in caplog.text, caplog.text
    put_back()
    here = Champion(prepared.cfg, work, None, 1, replica=False)
    url, put_back = crowned_without_config("n2")
    caplog.clear()
    with caplog.at_level(logging.ERROR, "rcpipe.champion.app"):
        assert not any(here.update() for _ in range(3))
    assert len(caplog.records) == 1 and url in caplog.text, caplog.text
    assert {a["night"] for a in here(ASKED)} == {"n1"}
    put_back()
    assert here.update() and {a["night"] for a in here(ASKED)} == {"n2"}
