"""Dynamic batching: concurrent requests share one forward pass.

Requests wait in an asyncio queue. The batch loop takes the first, then everything that
queued up meanwhile, then waits up to ``max_wait_ms`` for more, up to ``max_batch``; it runs
the batch in the single model thread (so the event loop keeps accepting requests while the
model computes) and resolves each request's future. Under load a batch fills while the
previous one computes, so the wait is rarely paid; ``max_batch=1`` is one request at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("rcpipe.serve")

Pair = tuple[str, str]  # (context, question)
AnswerFn = Callable[[list[Pair], str], list[dict[str, Any]]]


class Overloaded(Exception):
    """The queue is full: the service is answering as fast as it can (HTTP 503)."""


@dataclass
class _Job:
    pair: Pair
    model: str
    future: asyncio.Future[dict[str, Any]]


@dataclass
class Stats:
    batches: int = 0
    answered: int = 0
    largest: int = 0
    sizes: dict[int, int] = field(default_factory=dict)  # batch size -> count

    def add(self, n: int) -> None:
        self.batches += 1
        self.answered += n
        self.largest = max(self.largest, n)
        self.sizes[n] = self.sizes.get(n, 0) + 1


class Batcher:
    """``answer(pairs, model)`` run on batches of up to ``max_batch`` queued requests."""

    def __init__(self, answer: AnswerFn, max_batch: int = 16, max_wait_ms: float = 5.0,
                 max_pending: int = 1024) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.answer, self.max_batch, self.max_wait = answer, max_batch, max_wait_ms / 1000
        self.max_pending = max_pending
        self.stats = Stats()
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="rcpipe-model")

    async def start(self) -> None:
        self._queue = asyncio.Queue(self.max_pending)
        self._task = asyncio.create_task(self._run(), name="rcpipe-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._model_thread.shutdown(wait=True, cancel_futures=True)

    async def submit(self, pair: Pair, model: str, timeout: float) -> dict[str, Any]:
        """The answer, or Overloaded when the queue is full, TimeoutError after ``timeout``."""
        assert self._queue is not None, "start() the batcher first"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Job(pair, model, future))
        except asyncio.QueueFull:
            raise Overloaded from None
        # a request that times out cancels its future: the batch loop then skips it
        return await asyncio.wait_for(future, timeout)

    async def _take(self) -> list[_Job]:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        jobs = [await self._queue.get()]
        deadline = loop.time() + self.max_wait
        while len(jobs) < self.max_batch:
            if not self._queue.empty():
                jobs.append(self._queue.get_nowait())
                continue
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                jobs.append(await asyncio.wait_for(self._queue.get(), left))
            except TimeoutError:
                break
        return [j for j in jobs if not j.future.done()]  # timed out while queued

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._take()
            by_model: dict[str, list[_Job]] = {}
            for job in jobs:
                by_model.setdefault(job.model, []).append(job)
            for model, group in by_model.items():
                results = await loop.run_in_executor(self._model_thread, self._answer_group,
                                                     [j.pair for j in group], model)
                self.stats.add(len(group))
                for job, result in zip(group, results, strict=True):
                    if job.future.done():
                        continue
                    if isinstance(result, Exception):
                        job.future.set_exception(result)
                    else:
                        job.future.set_result(result)

    def _answer_group(self, pairs: list[Pair], model: str) -> list[dict[str, Any] | Exception]:
        """The batch's answers; if the batch fails, each request alone, so one request that
        breaks the model fails only itself."""
        try:
            return list(self.answer(pairs, model))
        except Exception as e:
            if len(pairs) == 1:
                log.exception("answering failed")
                return [e]
        out: list[dict[str, Any] | Exception] = []
        for pair in pairs:
            out.extend(self._answer_group([pair], model))
        return out
