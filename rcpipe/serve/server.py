"""The address `rcpipe serve` listens on, checked before the models load."""

from __future__ import annotations

import socket

from rcpipe.errors import InputError


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or a one-line error naming the option at fault.

    `rcpipe serve` binds it before the models load and hands it to the guard in front of Ray
    Serve's proxy (serve/guard.py), so a port out of range, taken or not allowed, or a host
    that does not resolve, is said at once rather than after Ray's start-up.
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
