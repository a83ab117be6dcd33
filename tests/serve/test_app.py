"""POST /answer: evaluate's answers, 200 concurrent requests without an error, and a 4xx
for every kind of bad request while the service goes on answering."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from bench.loadgen import load
from rcpipe.serve.app import Limits, create_app
from rcpipe.serve.server import background
from tests.serve.conftest import Service


def test_answers_are_the_ones_evaluate_gives(service: Service) -> None:
    info = httpx.get(f"{service.url}/models").json()
    assert info["models"] == ["ensemble", "bidaf", "qanet"] and info["default"] == "ensemble"
    for qid in list(service.questions)[:3]:
        context = service.contexts[qid]
        for model, answers in service.nbest.items():
            r = httpx.post(f"{service.url}/answer", json={
                "context": context, "question": service.questions[qid], "model": model})
            assert r.status_code == 200, r.text
            got, want = r.json(), answers[qid]
            assert got["model"] == model and got["answer"] == want["text"]
            assert context[got["start"] : got["end"]] == got["answer"]
            assert got["prob"] == pytest.approx(want["prob"], rel=1e-5, abs=1e-9)
            assert len(got["tokens"]) == len(got["p_start"]) == len(got["p_end"]) > 0
            assert sum(got["p_start"]) == pytest.approx(1.0, abs=1e-3)  # v1.1: no na share
            starts = [s for s, _ in got["tokens"]]
            assert got["start"] in starts and starts == sorted(starts)


def test_200_concurrent_requests_all_answered(service: Service) -> None:
    qids = list(service.questions)
    models = ["ensemble", "bidaf", "qanet"]
    payloads = [{"context": service.contexts[qids[i % len(qids)]],
                 "question": service.questions[qids[i % len(qids)]],
                 "model": models[i % 3]} for i in range(200)]
    before = httpx.get(f"{service.url}/health").json()
    result = load(service.url, payloads)
    assert result.statuses == {200: 200}, result.summary()
    for i, body in enumerate(result.bodies):  # batching changes no answer
        assert body["answer"] == service.nbest[models[i % 3]][qids[i % len(qids)]]["text"]
    after = httpx.get(f"{service.url}/health").json()
    assert after["answered"] - before["answered"] == 200
    assert after["batches"] - before["batches"] < 200  # requests did share forward passes
    print(result.summary())


def _json(obj: object) -> bytes:
    return json.dumps(obj).encode()


BAD = [  # (body, status, words of the detail)
    (b'{"context": "a", "question": ', 422, "not JSON"),
    (b"\xff\xfe", 422, "not JSON"),
    (_json(["context", "question"]), 422, "must be a JSON object"),
    (_json({"question": "q"}), 422, "context: Field required"),
    (_json({"context": 12, "question": "q"}), 422, "context: Input should be a valid string"),
    (_json({"context": "c", "question": None}), 422, "question: Input should be a valid"),
    (_json({"context": "c", "question": "q", "model": "bert"}), 422, "unknown model 'bert'"),
    (_json({"context": "c", "question": "q", "temperature": 1}), 422, "unknown field"),
    (_json({"context": "c", "question": " \n"}), 422, "question is empty"),
    (_json({"context": "c" * 20_001, "question": "q"}), 413, "context is 20001 characters"),
    (_json({"context": "c", "question": "q" * 1_001}), 413, "question is 1001 characters"),
    (b"{" + b" " * 200_000 + b"}", 413, "request body of"),
]


def test_bad_requests_get_4xx_and_the_service_goes_on(service: Service) -> None:
    with httpx.Client(base_url=service.url) as client:
        for body, status, words in BAD:
            r = client.post("/answer", content=body,
                            headers={"content-type": "application/json"})
            assert r.status_code == status and words in r.json()["detail"], (body[:60], r.text)

        def chunks():  # no Content-Length: the limit holds while the body streams in
            yield b'{"context": "'
            for _ in range(40):
                yield b"x" * 10_000

        r = client.post("/answer", content=chunks())
        assert r.status_code == 413 and "over" in r.json()["detail"]
        assert client.get("/answer").status_code == 405
        assert client.post("/nowhere", json={}).status_code == 404
        ok = client.post("/answer", json={"context": "Ada wrote it in 1843.",
                                          "question": "When?", "model": "bidaf"})
        assert ok.status_code == 200 and ok.json()["answer"]


def test_slow_answers_time_out_and_a_full_queue_is_refused() -> None:
    def slow(pairs: list, model: str) -> list:
        time.sleep(0.5)
        return [{"text": "", "start": -1, "end": -1, "prob": 0.0, "na_prob": 1.0,
                 "tokens": [], "p_start": [], "p_end": []} for _ in pairs]

    app = create_app(slow, ["m"], Limits(timeout_s=0.2, max_batch=1, max_pending=2))
    with background(app) as url:
        result = load(url, [{"context": "c", "question": "q"}] * 6)
    assert result.statuses.get(504, 0) >= 1 and result.statuses.get(503, 0) >= 1
    assert set(result.statuses) <= {503, 504}
    assert "no answer within 0.2 s" in str(result.bodies)
