"""A new application rolled out without dropping requests: clients keep asking while the app
is redeployed over another package (as the RayService is when its manifest or image
changes; a new champion it follows by itself, tests/serve/test_champion_follow.py), and
every request is answered, by the old model and then the new one."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rcpipe import stages
from rcpipe.serve import deployments
from rcpipe.stages.serving import application
from tests.conftest import Trained
from tests.serve.conftest import LIMITS, deployed, light

pytestmark = [pytest.mark.integration, pytest.mark.trains]


def test_replacing_the_model_drops_no_request(trained: Trained, serve_on_ray: str,
                                               tmp_path: Path) -> None:
    url = f"{serve_on_ray}/rollout"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)
        old, new = (str(stages.package(trained.cfg, v, tmp_path / v)) for v in ("bidaf", "qanet"))
        apps = [application(light(trained.cfg), [p], LIMITS)[0] for p in (old, new)]
    with deployed(apps[0], "rollout"):
        answered, during = _roll_out(url, apps[1], new)
    assert {status for status, _ in answered} == {200}, answered
    assert {model for _, model in answered} == {old, new}, answered
    assert during > 0, "nothing was answered while the new replicas started"
    print(dict(answered), f"{during} answered during the rollout")


def _roll_out(url: str, app: Any, new: str) -> tuple[Counter[tuple[int, str]], int]:
    """Four clients asking ``url`` again and again while ``app`` (serving the package
    ``new``) replaces the deployed one: what they were answered (status, model), and how
    many answers came while the new replicas started."""
    answered: Counter[tuple[int, str]] = Counter()
    stop = threading.Event()

    def ask() -> None:  # a client asking again as soon as it has its answer
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                r = client.post(f"{url}/answer", json={"context": "Ada wrote it in 1843.",
                                                        "question": "When did Ada write it?"})
                answered[r.status_code, r.json().get("model", r.text)] += 1

    clients = [threading.Thread(target=ask) for _ in range(4)]
    for c in clients:
        c.start()
    try:
        _until(lambda: sum(answered.values()) >= 4)  # the old model answering
        before = sum(answered.values())
        deployments.run(app, name="rollout", route_prefix="/rollout")  # the new champion
        during = sum(answered.values()) - before
        _until(lambda: any(model == new for _, model in answered))
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=120)
    return answered, during


def test_the_onnx_runtime_answers_inside_the_reader_as_the_eager_one(
        trained: Trained, serve_on_ray: str, tmp_path: Path) -> None:
    """`rcpipe serve --runtime onnx`: each Reader swaps its model's forward for the
    exported graph (trained/onnx.py) and answers as the eager Reader does."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)
        pkg = str(stages.package(trained.cfg, "bidaf", tmp_path / "bidaf"))
        stages.export(trained.cfg, pkg, questions=8)
        apps = {rt: application(light(trained.cfg), [pkg], LIMITS, runtime=rt)[0]
                for rt in ("torch", "onnx")}
    ask = {"context": "Ada Lovelace wrote the first program in 1843 in London.",
           "question": "When did Ada write the first program?"}
    got = {}
    for runtime, app in apps.items():
        with deployed(app, f"rt-{runtime}"):
            r = httpx.post(f"{serve_on_ray}/rt-{runtime}/answer", json=ask, timeout=60)
        assert r.status_code == 200, r.text
        got[runtime] = r.json()
    assert (got["onnx"]["answer"], got["onnx"]["start"], got["onnx"]["end"]) == \
        (got["torch"]["answer"], got["torch"]["start"], got["torch"]["end"])
    assert got["onnx"]["prob"] == pytest.approx(got["torch"]["prob"], abs=1e-4)


def _until(done: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "not within 120 s"
        time.sleep(0.1)
