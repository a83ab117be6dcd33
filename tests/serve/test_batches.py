"""A Reader's batch loop (rcpipe/serve/deployments.py), on its own, without Ray: the next
batch is taken when the model is free, of every request that queued meanwhile.

Ray Serve's ``@serve.batch``, which the Readers used before, forms a batch every
``batch_wait_ms`` whether the model is free or not, so requests trickling in while a batch
computes went out in batches of one or two (6 to 7 a batch under bench/serve.py's 200
clients, against 15.8 with this loop)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from rcpipe.serve.deployments import _Reader

COMPUTE_S = 0.3  # one forward pass of the stand-in model


def _reader(max_batch: int = 16, wait_ms: float = 5.0,
            fail_on: str | None = None) -> tuple[_Reader, list[int]]:
    """A Reader whose model takes COMPUTE_S a batch; the sizes of the batches it ran."""
    sizes: list[int] = []

    def load() -> Any:
        def answer(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
            assert threading.current_thread().name.startswith("rcpipe-model")
            sizes.append(len(pairs))
            if fail_on is not None and any(q == fail_on for _, q in pairs):
                raise RuntimeError("this question breaks the model")
            time.sleep(COMPUTE_S)
            return [{"answer": q} for _, q in pairs]
        return answer

    return _Reader(load, max_batch, wait_ms), sizes


def test_requests_arriving_while_the_model_computes_are_its_next_batch() -> None:
    reader, sizes = _reader()

    async def clients() -> list[dict[str, Any]]:
        first = asyncio.create_task(reader.answer(("c", "q0")))
        await asyncio.sleep(0.02)  # the first batch (one request) is computing
        later = []
        for i in range(1, 21):  # 20 more trickle in, one every 10 ms, all within its 0.3 s
            later.append(asyncio.create_task(reader.answer(("c", f"q{i}"))))
            await asyncio.sleep(0.01)
        return await asyncio.gather(first, *later)

    answers = asyncio.run(clients())
    assert [a["answer"] for a in answers] == [f"q{i}" for i in range(21)]
    assert sizes == [1, 16, 4]  # @serve.batch: ~20 batches of one, one every 5 ms
    assert [a["batch"] for a in answers] == [1] + [16] * 16 + [4] * 4


def test_a_lone_request_waits_at_most_the_batch_wait() -> None:
    reader, sizes = _reader(wait_ms=50)

    async def one() -> float:
        t0 = time.monotonic()
        await reader.answer(("c", "q"))
        return time.monotonic() - t0

    took = asyncio.run(one())
    assert sizes == [1] and COMPUTE_S + 0.04 <= took < COMPUTE_S + 0.5


def test_a_request_that_breaks_the_batch_fails_alone_and_a_gone_one_is_skipped() -> None:
    reader, sizes = _reader(fail_on="bad")

    async def clients() -> list[Any]:
        first = asyncio.create_task(reader.answer(("c", "first")))
        await asyncio.sleep(0.02)
        gone = asyncio.create_task(reader.answer(("c", "gone")))
        rest = [asyncio.create_task(reader.answer(("c", q))) for q in ("ok", "bad", "ok2")]
        await asyncio.sleep(0.01)
        gone.cancel()  # its client went away while it queued
        return await asyncio.gather(first, *rest)

    answers = asyncio.run(clients())
    assert [a.get("answer", a.get("failed")) for a in answers] == ["first", "ok", True, "ok2"]
    assert sizes == [1, 3, 1, 1, 1]  # the batch without "gone", then each alone


def test_a_model_that_answers_the_wrong_number_fails_that_batch_and_the_next_is_answered(
        ) -> None:
    calls: list[int] = []

    def load() -> Any:
        def answer(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
            calls.append(len(pairs))
            return [] if len(calls) == 1 else [{"answer": q} for _, q in pairs]
        return answer

    reader = _Reader(load, 16, 5.0)

    async def two() -> tuple[dict[str, Any], dict[str, Any]]:
        # bounded: a batch loop that died with the first batch would never answer
        first = await asyncio.wait_for(reader.answer(("c", "q1")), 5)
        return first, await asyncio.wait_for(reader.answer(("c", "q2")), 5)

    first, second = asyncio.run(two())
    assert first == {"failed": True, "batch": 1} and second == {"answer": "q2", "batch": 1}
