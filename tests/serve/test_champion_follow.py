"""The champion app follows the registry by itself (rcpipe/champion/app.py's ``Champion``): on the
session's local Ray, the application infra/kuberay/rayservice.yaml deploys
(``champion_app``) over a DVC remote (a local directory) answers under steady load while
nights go by, each night's packages pushed beside its record and champion.json written as
`rcpipe version --promote` writes it (release/promotion.py's ``pointer``):

  A crowned before the deploy -> B crowned -> C rejected (champion.json untouched) ->
  D crowned with a broken package (its weights' sha256 is not config.json's) -> E crowned
  -> F crowned as an ensemble (its voters' packages, no package of its own).

Every request is answered 200; answers come from B within BOUND_S of its promotion, never
from C or D, from E after D was refused (the watcher went past it), and from F's voters'
majority vote, as the ensemble answers in-process (``Champion`` without Ray). Then people
change the record (stages/registry.py): a rollback to E, B set by hand; G is crowned while its
weights are still being rewritten (refused, tried again at each poll, loaded once whole);
last a record without its pin is written (refused: B answers on, fail closed). Every answer
and /health name the record's entry that answered, each switch comes within BOUND_S, and the
history holds every entry in order."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from rcpipe import stages
from rcpipe.champion.app import CHAMPION, Champion, champion_app
from rcpipe.config import ReadLimits, effective_yaml
from rcpipe.inference.answer import voted
from rcpipe.release import record
from rcpipe.stages import registry
from rcpipe.trained.reader import load_reader
from tests.conftest import Trained
from tests.serve.conftest import champion_workspace, crown_night, deployed, light

pytestmark = [pytest.mark.integration, pytest.mark.trains, pytest.mark.slow]
POLL_S = 1.0  # serve.champion_poll_s here (10 s in params.yaml)
# a promotion reaches the answers within a poll, the package's download and its load; on
# 2 shared cores (the suite's other worker busy) the load alone has taken seconds
BOUND_S = 20.0
LIMITS = ReadLimits()


class Load:
    """Clients asking without pause: (time answered, status, night) per request."""

    def __init__(self, url: str, clients: int = 3) -> None:
        self.url, self.seen, self.stop = url, [], threading.Event()
        self.entries: list[int | None] = []  # the record entry (seq) each 200 names
        self.threads = [threading.Thread(target=self._ask) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _ask(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                r = client.post(f"{self.url}/answer", json={
                    "context": "Ada wrote it in 1843.", "question": "When did Ada write it?"})
                night = r.json().get("night") if r.status_code == 200 else r.text[:200]
                if r.status_code == 200:
                    self.entries.append((r.json().get("champion") or {}).get("seq"))
                self.seen.append((time.monotonic(), r.status_code, night))

    def since(self, t: float) -> set[str]:
        return {n for at, _, n in list(self.seen) if at >= t}

    def until(self, night: str, timeout: float = 120) -> float:
        """When ``night``'s champion first answered (waiting for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [t for t, _, n in list(self.seen) if n == night]
            if found:
                return found[0]
            time.sleep(0.1)
        raise AssertionError(f"{night} never answered: {self.nights()}")

    def nights(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, status, night in list(self.seen):
            counts[f"{status} {night}"] = counts.get(f"{status} {night}", 0) + 1
        return counts

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def test_the_champion_app_follows_promotions_under_load(
        trained: Trained, serve_on_ray: str, tmp_path: Path) -> None:
    where = champion_workspace(tmp_path / "work")
    work = tmp_path / "work"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)
        made = {v: stages.package(trained.cfg, v, tmp_path / "made" / v)
                for v in ("bidaf", "qanet")}
    params = yaml.safe_load(effective_yaml(light(trained.cfg)))
    params["serve"]["champion_poll_s"] = POLL_S
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

    crown_night(where, "nA", made["bidaf"], crowned=True)
    app = champion_app({"workspace": str(tmp_path / "work"),
                        "params": str(tmp_path / "params.yaml"), "threads": 1})
    with deployed(app, "champion"):
        url = f"{serve_on_ray}/champion"
        assert httpx.get(f"{url}/models", timeout=30).json()["models"] == [CHAMPION]
        load = Load(url)
        try:
            load.until("nA")
            promoted = time.monotonic()
            crown_night(where, "nB", made["qanet"], crowned=True)
            reached_b = load.until("nB") - promoted
            crown_night(where, "nC", made["bidaf"], crowned=False)  # the gate kept B
            crown_night(where, "nD", made["bidaf"], crowned=True, broken=True)
            time.sleep(4 * POLL_S)  # D read (and refused) at least thrice
            before_e = len(load.seen)
            promoted = time.monotonic()
            crown_night(where, "nE", made["bidaf"], crowned=True)
            reached_e = load.until("nE") - promoted
            before_f = len(load.seen)
            crown_night(where, "nF", made["bidaf"], crowned=True, also=(made["qanet"],))
            load.until("nF")
            asked = ("Ada wrote it in 1843.", "When did Ada write it?")
            served = httpx.post(f"{url}/answer", timeout=60, json=dict(
                zip(("context", "question"), asked, strict=True))).json()
            here = Champion(trained.cfg, str(work), None, 1, replica=False)  # F, in-process
            in_process = here([asked])[0]["text"]
            # people change the record: back to E, then B by hand
            before_back = len(load.seen)
            changed = time.monotonic()
            back = registry.rollback(work, None, None, "F answers worse", "ann", LIMITS)
            reached_back = wait_for(load, back["seq"]) - changed
            changed = time.monotonic()
            again = registry.set_champion(work, None, "nB", None, "B by hand", "bo", LIMITS)
            reached_set = wait_for(load, again["seq"]) - changed
            health = httpx.get(f"{url}/health", timeout=30).json()["champion"]
            # G crowned while its weights are rewritten: refused, tried again, loaded whole
            crown_night(where, "nG", made["bidaf"], crowned=True, broken=True)
            time.sleep(3 * POLL_S)
            torn_until = time.monotonic()
            weights = (made["bidaf"] / "model.safetensors").read_bytes()
            where.write(weights, "versions", "nG", "packages", "bidaf", "model.safetensors")
            reached_g = load.until("nG") - torn_until
            g_seq = record.read(where, LIMITS).seq
            # a record without its pin: refused, G answers on
            pinless = {**record.read(where, LIMITS).entry, "seq": g_seq + 1,
                       "package_sha256": None}
            where.write(json.dumps(pinless).encode(), record.HEAD)
            pinless_at = time.monotonic()
            time.sleep(4 * POLL_S)
            after_pinless = load.since(pinless_at)
            health_after = httpx.get(f"{url}/health", timeout=30).json()["champion"]
        finally:
            load.close()
    counts = load.nights()
    assert {s for _, s, _ in load.seen} == {200}, counts
    assert {n for _, _, n in load.seen} == {"nA", "nB", "nE", "nF", "nG"}, counts
    entries = record.history(where, LIMITS)
    assert [(e["seq"], e["change"]["kind"], e["score"]["run"]) for e in entries] == [
        (1, "promotion", "nA"), (2, "promotion", "nB"), (3, "promotion", "nD"),
        (4, "promotion", "nE"), (5, "promotion", "nF"), (6, "rollback", "nE"),
        (7, "set", "nB"), (8, "promotion", "nG")]
    # every answer names an entry of the record, never D's (broken) or the pinless one
    assert set(load.entries) <= {1, 2, 4, 5, 6, 7, 8}, set(load.entries)
    assert health == {"seq": 7, "run": "nB", "model": "qanet"}
    assert after_pinless == {"nG"} and health_after["seq"] == 8
    assert reached_back < BOUND_S and reached_set < BOUND_S and reached_g < BOUND_S
    # between B's promotion and E's, B alone answered after its first answer
    assert {n for _, _, n in load.seen[:before_e] if n != "nA"} == {"nB"}
    assert {n for _, _, n in load.seen[before_f:before_back] if n != "nE"} == {"nF"}
    assert reached_b < BOUND_S and reached_e < BOUND_S
    # the ensemble champion answers as its voters' majority vote
    answers = []
    for package in made.values():
        reader = load_reader(here.cfg, [str(package)], "torch", 1)
        (one,) = reader.answer_pairs([asked], str(package), token_probs=True)
        answers.append(one)
    assert in_process == voted(answers)["text"] == served["answer"], (answers, served)
    print(f"\n{len(load.seen)} requests, all 200 {counts}; a promotion answered after "
          f"{reached_b:.1f} s (B) and {reached_e:.1f} s (E), a rollback {reached_back:.1f} s, "
          f"a set {reached_set:.1f} s, a torn package once whole {reached_g:.1f} s, "
          f"polling every {POLL_S:g} s")


def wait_for(load: Load, seq: int, timeout: float = 120) -> float:
    """When the record's entry ``seq`` first answered (waiting for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if seq in load.entries:
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"entry {seq} never answered: {set(load.entries)}")
