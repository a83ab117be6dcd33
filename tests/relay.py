"""A TCP relay on 127.0.0.1 in front of a loopback server (the moto S3 endpoint), for tests
of what a real network does to rcpipe's requests: each connection's bytes pumped both ways
through ``up`` (requests) and ``down`` (answers), which a subclass overrides to cut, lose or
slow them (tests/dvc_project.py's Outage, tests/faults/test_champion_record.py's Lossy)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

Hook = Callable[[bytes, socket.socket, dict[str, Any]], bool]


class Relay:
    def __init__(self, target: int) -> None:
        self.target = target
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def refuses(self) -> bool:
        """Whether a new connection is closed at once (the endpoint down)."""
        return False

    def up(self, data: bytes, server: socket.socket, conn: dict[str, Any]) -> bool:
        """A request's bytes on their way to the server; False ends the connection."""
        server.sendall(data)
        return True

    def down(self, data: bytes, client: socket.socket, conn: dict[str, Any]) -> bool:
        """An answer's bytes on their way to the client; False ends the connection."""
        client.sendall(data)
        return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refuses():
                client.close()
                continue
            server = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.sockets += [client, server]
            conn: dict[str, Any] = {}  # what one connection's two pumps share
            for src, dst, hook in ((client, server, self.up), (server, client, self.down)):
                threading.Thread(target=self._pump, args=(src, dst, hook, conn),
                                 daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, hook: Hook,
              conn: dict[str, Any]) -> None:
        try:
            while (data := src.recv(1 << 16)) and hook(data, dst, conn):
                pass
        except OSError:
            pass
        finally:
            for s in (src, dst):
                _shut(s)

    def cut(self) -> None:
        """Every connection ended now."""
        with self.lock:
            for s in self.sockets:
                _shut(s)

    def close(self) -> None:
        self.cut()
        self.listener.close()


def _shut(s: socket.socket) -> None:
    """shutdown, then close: shutdown wakes the other pump's recv and tells the peer at
    once; close alone waits for that recv to return, and the peer never sees the end."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
