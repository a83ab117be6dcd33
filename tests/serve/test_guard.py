"""The guard in front of Serve's proxy (rcpipe/serve/guard.py), over real loopback sockets:
against a tiny uvicorn echo server (seconds, no Ray), then once through `rcpipe serve`'s
own front on the session's Serve (tests/serve/conftest.py)."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from rcpipe.serve.guard import HEAD_CAP, Running, main
from tests.conftest import write_params
from tests.ray_nodes import free_port
from tests.serve.conftest import HEADER_TIMEOUT_S, Front, Service

T = 1.0  # the unit tests' head deadline
MARGIN = 1.5  # a busy 2-core machine's scheduling slack
# the echo server closes a connection idle this long after a response: past T + MARGIN, so
# that a stalled later head meets the guard's deadline before the server's keep-alive
UP_KEEP_ALIVE_S = 3


async def echo(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
    """POST: the body back; GET: what the server saw (path, headers, the client)."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    out = body if scope["method"] == "POST" else json.dumps({
        "path": scope["path"], "client": scope["client"][0],
        "headers": {k.decode(): v.decode() for k, v in scope["headers"]}}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(echo, host="127.0.0.1", port=port, lifespan="off",
                                           timeout_keep_alive=UP_KEEP_ALIVE_S,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def guard(upstream: int) -> Iterator[Callable[..., int]]:
    """guard(max_connections=..., upstream=...) -> the port of a guard started for the test."""
    running: list[Running] = []

    def start(max_connections: int = 100, to: int = upstream) -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", free_port()))
        running.append(Running(sock, ("127.0.0.1", to), T, max_connections))
        return sock.getsockname()[1]

    yield start
    for r in running:
        r.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=T + 10)


def until_closed(sock: socket.socket) -> bytes:
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    return reply


def refusal(reply: bytes, status: int) -> str:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), reply[:300]
    assert b"content-type: application/json" in head
    return json.loads(body)["detail"]


def response(f: Any) -> tuple[int, bytes]:
    """One response read off ``f`` (the socket's makefile), by its Content-Length."""
    status = int(f.readline().split()[1])
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, f.read(length)


def test_a_silent_connection_gets_408_and_is_closed(guard: Callable[..., int]) -> None:
    with connect(guard()) as sock:
        t0 = time.monotonic()
        reply = until_closed(sock)
        waited = time.monotonic() - t0
    assert "did not arrive within 1 s" in refusal(reply, 408)
    assert T - 0.1 <= waited < T + MARGIN


def test_a_head_trickled_past_the_deadline_gets_408(guard: Callable[..., int]) -> None:
    head = b"GET /slow HTTP/1.1\r\nHost: test\r\nX-Padding: " + b"p" * 40 + b"\r\n\r\n"
    with connect(guard()) as sock:
        t0 = time.monotonic()
        for byte in head:  # one byte every 0.3 s: the whole head would take 18 s
            try:
                sock.send(bytes([byte]))
            except OSError:  # the guard has closed its side
                break
            if select.select([sock], [], [], 0.3)[0]:
                break
        reply = until_closed(sock)
        waited = time.monotonic() - t0
    assert refusal(reply, 408)
    assert waited < T + MARGIN


def test_a_post_is_relayed_byte_exact_both_ways(guard: Callable[..., int]) -> None:
    body = os.urandom(300_000) + b"\r\n\r\nPOST / HTTP/1.1\r\n\r\n"  # a head's bytes inside
    port = guard()
    r = httpx.post(f"http://127.0.0.1:{port}/echo", content=body, timeout=30)
    assert r.status_code == 200 and r.content == body
    seen = httpx.get(f"http://127.0.0.1:{port}/seen", headers={
        "X-Forwarded-For": "203.0.113.9", "X-Custom": "kept"}).json()
    assert seen["path"] == "/seen" and seen["headers"]["x-custom"] == "kept"
    # the client's own X-Forwarded-For is replaced by its address: the proxy trusts it
    assert seen["headers"]["x-forwarded-for"] == "127.0.0.1" == seen["client"]


def test_keep_alive_requests_are_answered_and_a_slow_second_head_gets_408(
        guard: Callable[..., int]) -> None:
    with connect(guard()) as sock, sock.makefile("rb") as f:
        sock.sendall(b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        assert response(f) == (200, b"hello")
        time.sleep(T * 0.8)  # idle between requests is the upstream's keep-alive, not ours
        sock.sendall(b"GET /b HTTP/1.1\r\nHost: t\r\n\r\n")
        status, body = response(f)
        assert status == 200 and json.loads(body)["path"] == "/b"
        sock.sendall(b"GET /c HTTP/1.1\r\n")  # a third head, never finished
        t0 = time.monotonic()
        assert refusal(f.read(), 408)
        assert T - 0.1 <= time.monotonic() - t0 < T + MARGIN


@pytest.mark.parametrize(("head", "status", "words"), [
    (b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n", 411,
     "needs a Content-Length"),
    (b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"x" * (HEAD_CAP + 10) + b"\r\n\r\n", 431,
     f"over {HEAD_CAP} bytes"),
    (b"GET / HTTP/1.1 extra\r\n\r\n", 400, "malformed request line"),
    (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400, "malformed header line"),
    (b"GET / HTTP/1.1\r\nX: a\nContent-Length: 5\r\n\r\n", 400, "malformed header line"),
    # a NUL: the proxy's own refusal was text/plain, every other one JSON (issue 43)
    (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, "malformed header line"),
    (b"GET /\x00 HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400, "malformed Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400,
     "malformed Content-Length"),
], ids=["chunked", "oversized", "request-line", "no-colon", "bare-lf", "nul-in-a-header",
        "nul-in-the-request-line", "negative-length", "two-lengths"])
def test_a_head_the_guard_cannot_frame_is_refused(guard: Callable[..., int], head: bytes,
                                                  status: int, words: str) -> None:
    with connect(guard()) as sock:
        sock.sendall(head)
        assert words in refusal(until_closed(sock), status)


def test_one_connection_over_the_cap_gets_503(guard: Callable[..., int]) -> None:
    port = guard(max_connections=2)
    held = [connect(port), connect(port)]
    time.sleep(0.2)  # both accepted
    with connect(port) as extra:
        t0 = time.monotonic()
        assert "over 2 open connections" in refusal(until_closed(extra), 503)
        assert time.monotonic() - t0 < 0.5
    for sock in held:
        sock.close()


def test_the_upstream_closing_closes_the_client(guard: Callable[..., int]) -> None:
    with connect(guard()) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert response(f)[0] == 200
        t0 = time.monotonic()
        assert f.read() == b""  # the echo server's keep-alive ran out: closed, not refused
        assert time.monotonic() - t0 < UP_KEEP_ALIVE_S + MARGIN


def test_an_upstream_that_is_not_up_is_502(guard: Callable[..., int]) -> None:
    with connect(guard(to=free_port())) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert "not up" in refusal(until_closed(sock), 502)


def test_a_guard_stopped_while_it_refuses_logs_no_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """`rcpipe serve` stopped (SIGTERM) while its guard lingers over a 503 of the start-up:
    the cancelled refusal's traceback was logged (issue 72)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    front = Running(sock, ("127.0.0.1", free_port()), T, 10, ready=False)
    with connect(sock.getsockname()[1]) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert "starting" in refusal(until_closed(client), 503)  # still open: it lingers
        front.stop()
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def test_the_guard_runs_alone_from_its_params(upstream: int, tmp_path: Path) -> None:
    """`python -m rcpipe.serve.guard`, as the cluster's pods run it beside Serve's proxy."""
    params = write_params(tmp_path / "params.yaml", serve={"header_timeout_s": T})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rcpipe.serve.guard", "--listen",
                             f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{upstream}",
                             "--params", str(params)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/alone")
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.1)
        assert r.status_code == 200 and r.json()["path"] == "/alone"
        with connect(port) as sock:
            assert f"within {T:g} s" in refusal(until_closed(sock), 408)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(("option", "value"), [("--listen", "8000"),
                                               ("--upstream", "127.0.0.1:port")])
def test_a_bad_address_is_one_line(option: str, value: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([option, value])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: {option}: {value}: expected HOST:PORT\n"


@pytest.mark.integration
@pytest.mark.trains
def test_rcpipe_serve_cuts_a_silent_connection_while_it_answers(service: Service,
                                                                 front: Front) -> None:
    """The session's Serve behind `rcpipe serve`'s own front (deployments.guarded). The
    answer is asked in a thread while the silent connection is timed here, so that the cut
    is measured apart from how long the answer takes on a loaded machine."""
    port = int(front.url.rsplit(":", 1)[1])
    qid = next(iter(service.questions))
    answered: list[httpx.Response] = []
    with connect(port) as silent:
        t0 = time.monotonic()
        asking = threading.Thread(target=lambda: answered.append(httpx.post(
            f"{front.url}/answer", timeout=30, json={
                "context": service.contexts[qid], "question": service.questions[qid],
                "model": "bidaf"})))
        asking.start()
        assert refusal(until_closed(silent), 408)
        cut_after = time.monotonic() - t0
        asking.join(60)
    assert HEADER_TIMEOUT_S - 0.1 <= cut_after < HEADER_TIMEOUT_S + MARGIN
    assert answered and answered[0].status_code == 200
    assert answered[0].json()["answer"] == service.nbest["bidaf"][qid]["text"]
