"""The guard: a small TCP front for Ray Serve's HTTP proxy (uvicorn), which has no deadline
for a request's head (its keep-alive timer starts after a response): a client sending
nothing, or a head a byte at a time, would hold a descriptor for ever.

Per connection, each request's head must arrive whole within ``header_timeout_s`` of its
first byte (the first request's: of the connection's opening), else 408; a head over
HEAD_CAP is 431, Transfer-Encoding 411, a malformed head 400, a connection over
``max_connections`` 503: each a JSON ``{"detail"}`` as the app's, then the close. Bodies and
responses are relayed as they come (the app keeps its body deadline), Content-Length
telling where the next head starts; the wait before a keep-alive request is the proxy's
timer: the proxy closing closes the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import resource
import socket
import sys
import threading
from http import HTTPStatus

log = logging.getLogger("rcpipe.serve")

HEAD_CAP = 16 * 1024  # h11's cap on an incomplete head, which uvicorn keeps
END = b"\r\n\r\n"
LINGER_S = 1.0
STARTING_RETRY_S = 2  # Retry-After while the service starts: a deploy takes seconds
# uvicorn trusts these from 127.0.0.1, the guard: a client's own would be believed
FORWARDING = {b"x-forwarded-for", b"x-forwarded-proto", b"forwarded"}


class Refused(Exception):
    """A request the guard answers itself: ``status`` with a JSON detail, then the close;
    ``retry_after``: seconds a client waits before asking again (a Retry-After header)."""

    def __init__(self, status: int, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.retry_after = status, detail, retry_after


def relayed(head: bytes, peer: str) -> tuple[bytes, int]:
    """The head as the proxy gets it (the client's address as X-Forwarded-For) and the
    length of the body after it; Refused where the guard could not find the next head."""
    request, *fields = head[: -len(END)].split(b"\r\n")
    if len(request.split(b" ")) != 3 or not request.endswith((b" HTTP/1.0", b" HTTP/1.1")) \
            or any(c < 0x20 or c == 0x7F for c in request):
        raise Refused(400, "malformed request line")
    kept, length = [request], None
    for field in fields:
        name, colon, value = field.partition(b":")
        # a bare CR or LF inside: the proxy may split the line where the guard does not,
        # and read a body the guard took for the next head
        # a control byte (NUL ...): the proxy refuses the head itself, as text/plain
        if not colon or not name.isascii() or any(c in name for c in b" \t") \
                or any(c < 0x20 and c != 0x09 or c == 0x7F for c in field):
            raise Refused(400, "malformed header line")
        name, value = name.lower(), value.strip()
        if name == b"transfer-encoding":  # chunked: its end is in the body's own framing
            raise Refused(411, "a request body needs a Content-Length")
        if name == b"content-length":
            if not value.isdigit() or len(value) > 18 or length not in (None, int(value)):
                raise Refused(400, "malformed Content-Length")
            length = int(value)
        if name not in FORWARDING:
            kept.append(field)
    kept.append(b"x-forwarded-for: " + peer.encode())
    return b"\r\n".join(kept) + END, length or 0


class Guard:
    def __init__(self, upstream: tuple[str, int], header_timeout_s: float,
                 max_connections: int, ready: bool = True) -> None:
        self.upstream, self.header_timeout_s = upstream, header_timeout_s
        self.max_connections = max_connections
        self.clients: set[asyncio.StreamWriter] = set()
        # False while `rcpipe serve` starts Ray and deploys the app: every request is 503
        # with Retry-After (Serve's proxy would answer 404, "no such route", meanwhile)
        self.ready = ready

    async def listen(self, sock: socket.socket) -> asyncio.Server:
        # the reader's limit is the head's cap (readuntil past it: LimitOverrunError);
        # backlog as uvicorn's, so a burst of connections waits rather than being refused
        return await asyncio.start_server(self.client, sock=sock, limit=HEAD_CAP, backlog=2048)

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.clients) >= self.max_connections:
            await refuse(reader, writer, Refused(503, f"over {self.max_connections} open "
                                                      "connections; try again later"))
            return
        self.clients.add(writer)
        try:
            await self.relay(reader, writer)
        except Refused as e:
            await refuse(reader, writer, e)
        # a side went away, or the guard is stopping (a cancel ends this task as done: the
        # server's callback would log a cancelled one)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self.clients.discard(writer)
            writer.close()

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str((writer.get_extra_info("peername") or ("",))[0])
        opened = asyncio.get_running_loop().time()
        upstream, pump = None, None
        try:
            while raw := await self.head(reader, opened if pump is None else None):
                head, length = relayed(raw, peer)
                if not self.ready:
                    raise Refused(503, "the service is starting; try again shortly",
                                  retry_after=STARTING_RETRY_S)
                if upstream is None:  # connected once a head is whole: a silent client costs one fd
                    try:
                        back, upstream = await asyncio.open_connection(*self.upstream)
                    except OSError:
                        raise Refused(502, "the service behind the guard is not up") from None
                    pump = asyncio.create_task(responses(back, writer))
                upstream.write(head)
                while length > 0:  # the body as it comes; the app holds its deadline
                    chunk = await reader.read(min(length, 65536))
                    if not chunk:
                        return  # the client left inside a body: the request cannot complete
                    upstream.write(chunk)
                    await upstream.drain()
                    length -= len(chunk)
            if pump is not None:  # the client is done sending: the last response still goes
                await pump
        finally:
            if pump is not None:
                pump.cancel()
            if upstream is not None:
                upstream.close()

    async def head(self, reader: asyncio.StreamReader, since: float | None) -> bytes:
        """The next request's head, b"" if the client closed first. ``since``: when its
        clock started (the connection's opening); None: at its first byte, the wait before
        it being the proxy's keep-alive (the proxy closes, ``responses`` closes the client,
        this read ends)."""
        deadline = None if since is None else since + self.header_timeout_s
        try:
            async with asyncio.timeout_at(deadline) as clock:
                first = b"\r"
                while first in (b"\r", b"\n"):  # empty lines before a request are allowed
                    first = await reader.read(1)
                if not first:
                    return b""
                if since is None:
                    clock.reschedule(asyncio.get_running_loop().time() + self.header_timeout_s)
                return first + await reader.readuntil(END)
        except TimeoutError:
            raise Refused(408, "the request head did not arrive within "
                               f"{self.header_timeout_s:g} s") from None
        except asyncio.LimitOverrunError:
            raise Refused(431, f"request head over {HEAD_CAP} bytes") from None
        except asyncio.IncompleteReadError:
            return b""  # closed inside a head: nobody to answer


async def responses(back: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The proxy's bytes to the client as they come; the proxy closing closes the client
    (not a cancel: the guard is then writing a refusal of its own)."""
    try:
        while chunk := await back.read(65536):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    writer.close()


async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 why: Refused) -> None:
    """``why`` as a JSON response, then the connection closed. A refusal that cuts a response
    still streaming (a later head stalled while the last answer is sent) cuts it: such a
    client is stalling, and gets no more."""
    body = json.dumps({"detail": why.detail}).encode()
    retry = "" if why.retry_after is None else f"retry-after: {why.retry_after}\r\n"
    writer.write(f"HTTP/1.1 {why.status} {HTTPStatus(why.status).phrase}\r\ncontent-type: "
                 f"application/json\r\ncontent-length: {len(body)}\r\n{retry}connection: "
                 "close\r\n\r\n".encode() + body)
    try:
        writer.write_eof()
        # what the client still sends is read for a moment: closing over unread bytes
        # sends a reset, which can destroy the response before the client reads it
        async with asyncio.timeout(LINGER_S):
            while await reader.read(65536):
                pass
    # cancelled: the guard stops (SIGTERM) while it lingers; the task ends done, as
    # Guard.client's do, since the server's callback would log a cancelled one's traceback
    except (OSError, TimeoutError, asyncio.CancelledError):
        pass
    writer.close()


def fit_descriptors(max_connections: int) -> None:
    """The soft open-file limit raised to hold ``max_connections`` relayed connections (two
    descriptors each) and 1,024 more for Ray and the models; a warning where the hard one
    cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * max_connections + 1024
    top = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < top:
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
    if top < want:
        log.warning(f"serve.max_connections {max_connections} needs {want} open files; "
                    f"the limit is {top}")


class Running:
    """The guard on its own event loop in a thread, so `rcpipe serve`'s main thread stays
    free to wait for Ctrl-C."""

    def __init__(self, sock: socket.socket, upstream: tuple[str, int],
                 header_timeout_s: float, max_connections: int, ready: bool = True) -> None:
        fit_descriptors(max_connections)
        self.loop = asyncio.new_event_loop()
        self.guard = Guard(upstream, header_timeout_s, max_connections, ready)
        self.server = self.loop.run_until_complete(self.guard.listen(sock))
        self.thread = threading.Thread(target=self.loop.run_forever, name="rcpipe-guard",
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop listening, drop every connection, and end the loop once their tasks end."""
        async def shutdown() -> None:
            self.server.close()
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def main(argv: list[str] | None = None) -> None:
    """`python -m rcpipe.serve.guard`: the guard alone, in front of a proxy started elsewhere
    (infra/kuberay/rayservice.yaml: a container beside Ray in each pod)."""
    from rcpipe.config import load_config
    from rcpipe.errors import InputError
    from rcpipe.serve.server import listen

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default="0.0.0.0:8000", help="the public HOST:PORT")
    ap.add_argument("--upstream", default="127.0.0.1:8001", help="Serve's proxy, HOST:PORT")
    ap.add_argument("--params", default="params.yaml", help="its serve: section's limits")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        host, port = _address("--listen", args.listen)
        upstream = _address("--upstream", args.upstream)
        s = load_config(args.params).serve
        sock = listen(host, port)
    except InputError as e:
        print(e.line(), file=sys.stderr)
        sys.exit(e.exit_code)
    fit_descriptors(s.max_connections)
    guard = Guard(upstream, s.header_timeout_s, s.max_connections)
    log.info(f"guard on {args.listen} -> {args.upstream}: heads within "
             f"{s.header_timeout_s:g} s, at most {s.max_connections} connections")

    async def forever() -> None:
        await (await guard.listen(sock)).serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(forever())


def _address(option: str, value: str) -> tuple[str, int]:
    from rcpipe.errors import InputError

    host, colon, port = value.rpartition(":")
    if not colon or not port.isdigit():
        raise InputError(option, value, "expected HOST:PORT")
    return host.strip("[]"), int(port)


if __name__ == "__main__":
    main()
