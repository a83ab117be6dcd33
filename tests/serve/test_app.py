"""POST /answer on Ray Serve: evaluate's answers, 200 concurrent requests without an
error, and a 4xx with JSON for every kind of bad request while the service goes on."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from bench.loadgen import load
from tests.serve.conftest import KEEP_ALIVE_S, LIMITS, Service

pytestmark = [pytest.mark.integration, pytest.mark.trains]

# what a request may take on a loaded 2-core CI machine (httpx's default 5 s is not): these
# tests are about answers and errors, not latency (bench/serve.py measures that)
PATIENT_S = 60


def test_answers_are_the_ones_evaluate_gives(service: Service) -> None:
    info = httpx.get(f"{service.url}/models", timeout=PATIENT_S).json()
    assert info["models"] == ["ensemble", "bidaf", "qanet"] and info["default"] == "ensemble"
    for qid in list(service.questions)[:3]:
        context = service.contexts[qid]
        for model, answers in service.nbest.items():
            r = httpx.post(f"{service.url}/answer", timeout=PATIENT_S, json={
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
    before = httpx.get(f"{service.url}/health", timeout=PATIENT_S).json()
    result = load(service.url, payloads)
    assert result.statuses == {200: 200}, result.statuses
    for i, body in enumerate(result.bodies):  # batching changes no answer
        assert body["answer"] == service.nbest[models[i % 3]][qids[i % len(qids)]]["text"]
    after = httpx.get(f"{service.url}/health", timeout=PATIENT_S).json()
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
    # issue 36: these were 500s
    (b'{"context": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 422, "nested too deeply"),
    (b'{"context": ' + b"7" * 5_000 + b', "question": "q"}', 422, "integer string"),
    (b'{"context": "Ada \\ud800 wrote", "question": "q"}', 422,
     "context: a lone surrogate '\\ud800' at character 4"),
    (b'{"context": "c", "question": "q", "model": "\\udfff"}', 422, "model: a lone surrogate"),
    (b'{"context": "c", "question": "q", "\\ud800": 1}', 422, "body: Input should be a valid"),
    (b'{"context": "c", "question": "q", "model": ["bidaf"]}', 422, "model: Input should be"),
    (b'{"context": "c", "question": 1e999}', 422, "question: Input should be a valid string"),
    (b"\xef\xbb\xbf{}", 422, "context: Field required"),  # a UTF-8 BOM is read past
]


@pytest.mark.parametrize(("body", "status", "words"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_bad_request_gets_a_4xx_with_json(service: Service, body: bytes, status: int,
                                            words: str) -> None:
    r = httpx.post(f"{service.url}/answer", content=body, timeout=PATIENT_S,
                   headers={"content-type": "application/json"})
    assert r.status_code == status and words in r.json()["detail"], (body[:60], r.text)


def test_the_service_goes_on_after_bad_requests(service: Service) -> None:
    with httpx.Client(base_url=service.url) as client:

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


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=LIMITS.body_timeout_s + 15)
    return sock


@pytest.mark.parametrize("serve_timeout", [None, "0"], ids=["plain", "serve-timeout-off"])
def test_a_body_that_trickles_in_is_cut_with_408(service: Service,
                                                 serve_timeout: str | None) -> None:
    """Whole headers, then a body that never comes: the app's body deadline answers 408 with
    JSON, even for a client that turns Serve's own request timeout off with its header."""
    sock = _raw(service.url)
    extra = f"x-request-timeout-seconds: {serve_timeout}\r\n" if serve_timeout else ""
    t0 = time.monotonic()
    with sock:
        sock.sendall(("POST /answer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json"
                      f"\r\nContent-Length: 1000\r\n{extra}\r\n").encode() + b'{"context": ')
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    waited = time.monotonic() - t0
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply[:200]
    assert f"did not arrive within {LIMITS.body_timeout_s:g} s" in json.loads(body)["detail"]
    assert LIMITS.body_timeout_s <= waited < LIMITS.body_timeout_s + 10


def test_an_idle_connection_is_closed_after_keep_alive(service: Service) -> None:
    sock = _raw(service.url)
    with sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        t0 = time.monotonic()
        while sock.recv(65536):  # the rest of the response, then the proxy's close
            pass
        waited = time.monotonic() - t0
    assert waited < KEEP_ALIVE_S + 5


def test_a_context_over_the_token_cap_is_413_and_the_next_is_answered(service: Service
                                                                       ) -> None:
    """A context within the characters' limit but over data.window.max_tokens: the Reader
    refuses it whole (never cut) and the Ingress says so with 413 and JSON."""
    from dataclasses import replace

    from rcpipe.stages.serving import application
    from tests.serve.conftest import deployed, light

    cfg = service.trained.cfg
    capped = cfg.model_copy(update={"data": cfg.data.model_copy(update={
        "window": cfg.data.window.model_copy(update={"max_tokens": 50})})})
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(service.trained.root)
        app, _ = application(light(capped), ["bidaf"], replace(LIMITS, max_context_chars=10_000),
                             threads=1)
    with deployed(app, "capped"):
        long = " ".join(["word"] * 120)  # 120 tokens, 599 characters
        r = httpx.post(f"{service.url}/capped/answer", json={"context": long,
                                                              "question": "q?"},
                       timeout=PATIENT_S)
        assert r.status_code == 413 and "data.window.max_tokens" in r.json()["detail"], r.text
        ok = httpx.post(f"{service.url}/capped/answer", timeout=PATIENT_S, json={
            "context": "Ada wrote it in 1843.", "question": "When did Ada write it?"})
    assert ok.status_code == 200 and ok.json()["windows"] == 1
