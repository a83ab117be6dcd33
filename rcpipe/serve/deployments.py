"""The answer service as a Ray Serve application: a Reader deployment per loaded model,
batching its requests (its own batch loop), behind one Ingress deployment that holds
the FastAPI app (app.py: the routes, the limits and the page).

Ray Serve is imported at this module's top (its decorators shape the classes); only
`rcpipe serve` (stages/serving.py) imports this module, inside its function.

A Reader is handed a ``load`` function, not a model: it runs in the replica's process and
returns ``answer(pairs) -> [answer dict, or {"refused": why}]`` (stages/serving.py loads
the model through trained/model_file.py or trained/package_dir.py), so this package imports
nothing of rcpipe's models. An ensemble is the Ingress asking each voter's Reader and handing their
answers to ``vote`` (inference/answer.py's majority vote), so a voter's requests and the
ensemble's share the voter's batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve.exceptions import BackPressureError

from rcpipe.serve import guard
from rcpipe.serve.app import (
    Limits,
    ModelFailed,
    Overloaded,
    Pair,
    TooLarge,
    create_app,
)

log = logging.getLogger("rcpipe.serve")

AnswerFn = Callable[[list[Pair]], list[dict[str, Any]]]
Load = Callable[[], AnswerFn]  # run in the replica: the model loaded, its answering function
Vote = Callable[[list[dict[str, Any]]], dict[str, Any]]  # the voters' answers -> one


@dataclass(frozen=True)
class Scaling:
    """How many Reader replicas: ``replicas``, or Serve's autoscaling between the bounds
    (config.ServeConfig)."""

    replicas: int = 1
    autoscaling: dict[str, Any] | None = None  # min_replicas, max_replicas, target_ongoing
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0  # > 0: Ray places the replica on a GPU (its model on CUDA)


class _Reader:
    """One model answering batches of (context, question) pairs in one model thread, so the
    replica's event loop keeps taking requests (the next batch fills) while it computes.

    The batch loop takes the next batch only once the model is free: every request queued
    meanwhile, up to ``max_batch``, waiting up to ``wait_ms`` for more only when fewer are
    queued. ``@serve.batch`` forms a batch every ``wait_ms`` whether the model is free or not
    (its next batches wait behind the running one): on 2 cores under 200 clients its batches
    held 6 to 7 requests against this loop's 15.4 to 15.8 (bench/serve.py;
    docs/results/serving.md).
    """

    def __init__(self, load: Load, max_batch: int, wait_ms: float, follow_s: float = 0.0
                 ) -> None:
        self._answer = load()
        self._max_batch, self._wait_s = max_batch, wait_ms / 1000
        self._queue: list[tuple[Pair, asyncio.Future[dict[str, Any]]]] = []
        self._arrived: asyncio.Event | None = None  # made on the loop that asks (answer)
        self._loop_task: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="rcpipe-model")
        if follow_s > 0:  # the answerer follows a registry (stages/serving.py's Champion)
            threading.Thread(target=self._follow, args=(follow_s,), daemon=True,
                             name="rcpipe-follow").start()

    def _follow(self, every_s: float) -> None:
        """Every ``every_s``: the answerer's ``update`` loads a new model beside the one
        answering and swaps it in (in this thread, so batches go on meanwhile); a failure is
        logged and tried again at the next tick, never the end of the replica."""
        update = self._answer.update  # type: ignore[attr-defined]
        while True:
            time.sleep(every_s)
            try:
                update()
            except Exception:
                log.exception("following the champion failed; the current one answers")

    async def answer(self, pair: Pair) -> dict[str, Any]:
        """``pair``'s answer, computed in a batch with the requests queued beside it."""
        if self._loop_task is None:  # the first request: Serve's loop for user code is up
            self._arrived = asyncio.Event()
            self._loop_task = asyncio.create_task(self._batches(), name="rcpipe-batches")
        assert self._arrived is not None
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._queue.append((pair, future))
        self._arrived.set()
        return await future  # a cancelled request's future: the loop skips it

    async def _batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:  # for the replica's life: a batch that goes wrong fails only itself
            batch = await self._take()
            try:
                found = await loop.run_in_executor(self._thread, self._answer_group,
                                                   [pair for pair, _ in batch])
                if len(found) != len(batch):
                    raise RuntimeError(f"{len(found)} answers to {len(batch)} questions")
            except Exception:
                log.exception("a batch failed: its requests fail, the next batch goes on")
                found = [{"failed": True}] * len(batch)
            for (_, future), answer in zip(batch, found, strict=True):
                if not future.done():
                    future.set_result(answer | {"batch": len(batch)})

    async def _take(self) -> list[tuple[Pair, asyncio.Future[dict[str, Any]]]]:
        """The next batch: what is queued (at least one request), up to max_batch, after
        waiting up to wait_ms for more when fewer are queued."""
        assert self._arrived is not None
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            deadline = time.monotonic() + self._wait_s
            while len(self._queue) < self._max_batch and \
                    (left := deadline - time.monotonic()) > 0:
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            batch = [(pair, future) for pair, future in batch if not future.done()]
            if batch:
                return batch

    def _answer_group(self, pairs: list[Pair]) -> list[dict[str, Any]]:
        """The batch's answers; if the batch fails, each request alone, so one request that
        breaks the model fails only itself."""
        try:
            return list(self._answer(pairs))
        except Exception:
            if len(pairs) == 1:
                log.exception("answering failed")
                return [{"failed": True}]
        return [a for pair in pairs for a in self._answer_group([pair])]


Reader = serve.deployment(name="Reader")(_Reader)


def checked(found: dict[str, Any]) -> dict[str, Any]:
    """A Reader's answer, or the exception the routes turn into its status."""
    if "refused" in found:  # a context over data.window.max_tokens
        raise TooLarge(found["refused"])
    if found.get("failed"):
        raise ModelFailed
    return found


class _Solo(_Reader):
    """A single model's whole app in one deployment: the routes (app.py) in the Reader's own
    replicas, so a request goes proxy -> model replica, one hop fewer than through an
    Ingress (docs/results/serving.md measures the hops). A full queue
    is Serve's own 503 at the proxy (max_queued_requests)."""

    def __init__(self, load: Load, max_batch: int, wait_ms: float, follow_s: float,
                 models: list[str], limits: Limits, no_answer: bool) -> None:
        super().__init__(load, max_batch, wait_ms, follow_s)
        self.models, self.limits, self.no_answer = models, limits, no_answer

    def __serve_build_asgi_app__(self) -> Any:
        # a followed answerer (the champion app's) says which entry answers now
        return create_app(self.ask, self.models, self.limits, self.no_answer,
                          getattr(self._answer, "about", None))

    async def ask(self, pair: Pair, model: str) -> dict[str, Any]:
        return checked(await self.answer(pair))


Solo = serve.deployment(name="Reader")(serve.ingress()(_Solo))


@serve.deployment(name="Ingress")
@serve.ingress()
class Ingress:
    """The routes (app.py) over the Readers' handles; ``ensembles`` names the voters of each
    ensemble it serves."""

    def __init__(self, readers: dict[str, Any], ensembles: dict[str, list[str]],
                 vote: Vote | None, models: list[str], limits: Limits,
                 no_answer: bool) -> None:
        self.readers, self.ensembles, self.vote = readers, ensembles, vote
        self.models, self.limits, self.no_answer = models, limits, no_answer

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self.ask, self.models, self.limits, self.no_answer)

    async def ask(self, pair: Pair, model: str) -> dict[str, Any]:
        if model not in self.ensembles:
            return await self._one(pair, model)
        assert self.vote is not None, "an ensemble is served with its vote"
        answers = await asyncio.gather(*(self._one(pair, v) for v in self.ensembles[model]))
        return self.vote(list(answers)) | {"batch": min(a["batch"] for a in answers)}

    async def _one(self, pair: Pair, model: str) -> dict[str, Any]:
        try:
            found = await self.readers[model].answer.remote(pair)
        except BackPressureError:
            raise Overloaded from None
        return checked(found)


def application(loads: dict[str, Load], ensembles: dict[str, list[str]], vote: Vote | None,
                models: list[str], limits: Limits, no_answer: bool,
                scaling: Scaling = Scaling(), follow_s: float = 0.0) -> Any:
    """The bound application: a Reader per entry of ``loads`` (named Reader-<i>: a served
    name may be a package's path), the Ingress over them; one model and no ensemble: the
    Reader holds the routes itself (``Solo``, no Ingress). ``follow_s`` > 0: each load
    returns an answerer with ``update()``, which every Reader replica calls that often."""
    replicas: dict[str, Any] = {"autoscaling_config": scaling.autoscaling} \
        if scaling.autoscaling else {"num_replicas": scaling.replicas}
    options = dict(
        **replicas,
        # every pending request in flight at the replica, waiting in the Reader's batch
        # queue: a batch fills from them. At 2 x max_batch the rest waited in the
        # Ingress's router, which retries a full replica with back-off: batches of 2,
        # 9.6 requests/s against 120.9 here (bench/serve.py, 200 clients, 2-core CPU)
        max_ongoing_requests=limits.max_pending,
        max_queued_requests=limits.max_pending,  # more: 503 (BackPressureError)
        ray_actor_options={"num_cpus": scaling.replica_cpus,
                           **({"num_gpus": scaling.replica_gpus}
                              if scaling.replica_gpus else {})})
    args = (limits.max_batch, limits.max_wait_ms, follow_s)
    if len(loads) == 1 and not ensembles:
        (load,) = loads.values()
        return Solo.options(name="Reader-0", **options).bind(load, *args, models, limits,
                                                             no_answer)
    readers = {name: Reader.options(name=f"Reader-{i}", **options).bind(load, *args)
               for i, (name, load) in enumerate(loads.items())}
    # the ingress only parses and waits: no CPU reserved, every pending request in flight
    ingress = Ingress.options(max_ongoing_requests=limits.max_pending + 64,
                              ray_actor_options={"num_cpus": 0})
    return ingress.bind(readers, ensembles, vote, models, limits, no_answer)


def start(host: str, port: int, limits: Limits, keep_alive_s: int) -> None:
    """Serve on the Ray this process joined, its HTTP proxy on host:port.

    The proxy is uvicorn: it closes a connection idle for ``keep_alive_s`` after a response,
    and answers 408 to a request not done in its ``request_timeout_s``, set past the app's
    own deadlines (body, answer) so that theirs, with JSON, come first. It has no deadline
    for a request's headers: ``guarded`` puts guard.py in front of it.
    """
    serve.start(http_options={
        "host": host, "port": port, "keep_alive_timeout_s": keep_alive_s,
        "request_timeout_s": limits.body_timeout_s + limits.timeout_s + 5})


def guarded(sock: socket.socket, limits: Limits, keep_alive_s: int, header_timeout_s: float,
            max_connections: int) -> guard.Running:
    """Serve's proxy on a free loopback port, behind the guard on ``sock`` (the public
    address): the guard holds each request's head to ``header_timeout_s`` and the
    connections to ``max_connections``."""
    front = waiting(sock, header_timeout_s, max_connections)
    behind(front, limits, keep_alive_s)
    front.guard.ready = True
    return front


def waiting(sock: socket.socket, header_timeout_s: float, max_connections: int
            ) -> guard.Running:
    """The guard on ``sock`` at once, its upstream a free loopback port where ``behind``
    starts Serve's proxy; until its ``guard.ready`` is set it answers every request 503
    with Retry-After (`rcpipe serve` sets it once the app is deployed)."""
    with socket.socket() as s:  # a free port: the proxy binds it a moment later
        s.bind(("127.0.0.1", 0))
        inner = s.getsockname()[1]
    return guard.Running(sock, ("127.0.0.1", inner), header_timeout_s, max_connections,
                         ready=False)


def behind(front: guard.Running, limits: Limits, keep_alive_s: int) -> None:
    """Serve's proxy (on the Ray this process joined) where ``front`` relays to."""
    start(*front.guard.upstream, limits, keep_alive_s)


def run(app: Any, name: str = "rcpipe", route_prefix: str = "/") -> None:
    """Deploy (or redeploy: Serve rolls changed deployments' replicas, new ones up before
    old ones drain) ``app`` under ``name`` at ``route_prefix``; returns once it is healthy."""
    serve.run(app, name=name, route_prefix=route_prefix)


def shutdown() -> None:
    serve.shutdown()
