"""release/gate.py's answers: the gate's ensemble candidate answers as `rcpipe ensemble` made
it (ensemble.method): the vote, or the mean of the packages' distributions with its weights
(a member weighed alone answers as its own package does: the tokens line up)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rcpipe import stages
from rcpipe.inference.combination import Combination
from rcpipe.inference.ensemble import majority_vote
from rcpipe.release.gate import answers, gate_set, package_nbest
from tests.conftest import Trained

pytestmark = [pytest.mark.integration, pytest.mark.trains]


def test_the_gates_ensemble_answers_by_the_ensemble_method(trained: Trained,
                                                           tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)
        made = {v: stages.package(trained.cfg, v, tmp_path / v) for v in ("bidaf", "qanet")}
        gate = gate_set(trained.cfg, "0" * 64)  # the held-out questions prepare set aside
    voted = answers(made, gate, cpu, Combination())
    nbests = [package_nbest(made[v], gate, cpu)[0] for v in ("bidaf", "qanet")]
    assert voted["ensemble"] == {q: a["text"] for q, a in majority_vote(nbests).items()}
    assert answers(made, gate, cpu, None).keys() == {"bidaf", "qanet"}  # no ensemble asked
    for alone, other in (("bidaf", "qanet"), ("qanet", "bidaf")):
        found = answers(made, gate, cpu, Combination("selected", {alone: 2.0, other: 0.0}))
        assert found["ensemble"] == found[alone], alone
    mean = answers(made, gate, cpu, Combination("mean", {"bidaf": 1.0, "qanet": 1.0}))
    assert mean["ensemble"].keys() == voted["ensemble"].keys() == {
        q.qid for q in gate.squad.questions}


def test_the_nights_gate_takes_the_method_from_the_ensembles_metrics(trained: Trained,
                                                                    tmp_path: Path) -> None:
    """promotion's champion_gate: the ensemble candidate is answered as metrics/ensemble.json
    says (here selected, bidaf weighed alone: its answers, not the vote's), stored beside
    the night's record; a crowned ensemble's champion.json carries the Combination."""
    import json

    from rcpipe.release.promotion import champion_gate
    from tests.serve.conftest import champion_workspace

    where = champion_workspace(tmp_path / "work")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)
        made = {v: stages.package(trained.cfg, v, tmp_path / v) for v in ("bidaf", "qanet")}
        gate = gate_set(trained.cfg, "0" * 64)
    metrics = {"f1": 1.0, "method": "selected", "methods": {
        "vote": {"f1": 1.0}, "selected": {"f1": 1.0, "weights": {"bidaf": 2, "qanet": 0}}}}
    scores = {"bidaf": {"f1": 1.0}, "qanet": {"f1": 1.0}, "ensemble": metrics}
    record = {"run": "n1", "dvc_lock": "n1/dvc.lock", "git_commit": None,
              "packages": {v: f"remote/{v}" for v in made}}
    decided = champion_gate(tmp_path / "work", trained.cfg, where, gate, record, scores, made,
                            "0" * 64, 0.0, tmp_path / "tmp")
    stored = where.read_json("versions", "n1", "gate.json")["answers"]
    assert stored["ensemble"] == stored["bidaf"] != stored["qanet"]
    voted = majority_vote([package_nbest(made[v], gate, torch.device("cpu"))[0]
                           for v in ("bidaf", "qanet")])
    assert stored["ensemble"] != {q: a["text"] for q, a in voted.items()}
    crowned = where.read_json("champion.json")
    assert decided["promoted"] and crowned["score"]["model"] == decided["gate"]["candidate"][
        "model"]
    if crowned["score"]["model"] == "ensemble":
        assert crowned["ensemble"] == Combination.of(metrics).as_dict()
    else:
        assert "ensemble" not in crowned
    json.dumps(crowned)  # a record, as written
    # a second night judged against that champion, let through whatever the interval says
    # (the decision is not what is tested here: these models learn nothing to tell apart):
    # the entry it writes carries its own Combination (the champion's answers once took
    # its name, and the promotion failed)
    import dataclasses

    from rcpipe.release import promotion

    real = promotion.decide
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(promotion, "decide", lambda *a: dataclasses.replace(real(*a), promote=True))
        again = champion_gate(tmp_path / "work", trained.cfg, where, gate,
                              record | {"run": "n2"}, scores, made, "0" * 64, 0.0,
                              tmp_path / "tmp2")
    now = where.read_json("champion.json")
    assert again["promoted"] and again["champion_before"]["run"] == "n1"
    assert now["seq"] == 2 and now["change"]["before"]["run"] == "n1"
    if now["score"]["model"] == "ensemble":
        assert now["ensemble"] == Combination.of(metrics).as_dict()
