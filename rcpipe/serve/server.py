"""Running the service: uvicorn in the foreground (`rcpipe serve`), or in a background
thread on a free loopback port for tests and bench/serve.py."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from rcpipe.errors import InputError


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or a one-line error naming the option at fault.

    Bound before the models load, so a port out of range, taken or not allowed, or a host
    that does not resolve, is said at once; uvicorn then serves on this very socket.
    """
    if not 0 < port < 65536:
        raise InputError("--port", str(port), "must be between 1 and 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError):
        raise InputError("--host", host, "not an address or a name that resolves") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise InputError("--port", str(port), f"cannot listen on {host}:{port} "
                         f"({e.strerror or e})") from None
    return sock


def run(app: FastAPI, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` (from ``listen``) until interrupted."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


@contextmanager
def background(app: FastAPI, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` on a free port of ``host`` in a thread; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    # backlog for a burst of concurrent connections (the load test opens hundreds at once)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           backlog=2048, timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="rcpipe-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the service did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
