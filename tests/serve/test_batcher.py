"""Dynamic batching without a model: batches form under load, failures and time-outs stay
with their own request."""

from __future__ import annotations

import asyncio
import time

import pytest

from rcpipe.serve.batcher import Batcher, Overloaded, Pair


class Fake:
    """answer(pairs, model): echoes each question after ``delay`` s, recording batch sizes."""

    def __init__(self, delay: float = 0.02) -> None:
        self.delay, self.sizes = delay, []

    def __call__(self, pairs: list[Pair], model: str) -> list[dict]:
        self.sizes.append(len(pairs))
        time.sleep(self.delay)
        if any(q == "boom" for _, q in pairs):
            raise RuntimeError("the model broke")
        return [{"text": f"{model}:{q}"} for _, q in pairs]


async def _ask(batcher: Batcher, questions: list[str], model: str = "m",
               timeout: float = 10.0) -> list:
    await batcher.start()
    try:
        return await asyncio.gather(
            *(batcher.submit(("c", q), model, timeout) for q in questions),
            return_exceptions=True)
    finally:
        await batcher.stop()


def test_concurrent_requests_share_batches_and_get_their_own_answers() -> None:
    fake = Fake()
    questions = [f"q{i}" for i in range(40)]
    answers = asyncio.run(_ask(Batcher(fake, max_batch=8), questions))
    assert [a["text"] for a in answers] == [f"m:{q}" for q in questions]
    assert sum(fake.sizes) == 40 and max(fake.sizes) == 8 and len(fake.sizes) <= 6


def test_max_batch_one_answers_one_at_a_time() -> None:
    fake = Fake(0.001)
    answers = asyncio.run(_ask(Batcher(fake, max_batch=1), ["a", "b", "c"]))
    assert [a["text"] for a in answers] == ["m:a", "m:b", "m:c"] and fake.sizes == [1, 1, 1]


def test_a_request_that_breaks_the_model_fails_alone() -> None:
    fake = Fake(0.0)
    answers = asyncio.run(_ask(Batcher(fake, max_batch=8), ["a", "boom", "c"]))
    assert answers[0]["text"] == "m:a" and answers[2]["text"] == "m:c"
    assert isinstance(answers[1], RuntimeError)


def test_timed_out_requests_are_dropped_from_the_queue() -> None:
    fake = Fake(0.3)
    answers = asyncio.run(_ask(Batcher(fake, max_batch=1), ["a", "b", "c"], timeout=0.1))
    assert all(isinstance(a, TimeoutError) for a in answers)
    assert fake.sizes == [1]  # b and c timed out while queued: never computed


def test_a_full_queue_refuses_at_once() -> None:
    async def run() -> list:
        batcher = Batcher(Fake(0.2), max_batch=1, max_pending=1)
        await batcher.start()
        try:
            first = asyncio.create_task(batcher.submit(("c", "a"), "m", 5))
            await asyncio.sleep(0.05)  # the batch loop took "a": the queue is empty again
            second = asyncio.create_task(batcher.submit(("c", "b"), "m", 5))
            await asyncio.sleep(0)
            with pytest.raises(Overloaded):
                await batcher.submit(("c", "c"), "m", 5)
            return [await first, await second]
        finally:
            await batcher.stop()

    assert [a["text"] for a in asyncio.run(run())] == ["m:a", "m:b"]


def test_requests_for_different_models_are_batched_apart() -> None:
    fake = Fake()

    async def run() -> list:
        b = Batcher(fake, max_batch=8)
        await b.start()
        try:
            return await asyncio.gather(*(b.submit(("c", str(i)), "xy"[i % 2], 5)
                                          for i in range(8)))
        finally:
            await b.stop()

    answers = asyncio.run(run())
    assert [a["text"] for a in answers] == [f"{'xy'[i % 2]}:{i}" for i in range(8)]
