"""A loopback load generator: many concurrent POST /answer requests, latency percentiles.

Used by the service's load test and by bench/serve.py; it only ever talks to the URL it is
given (a service on this machine), with a bounded number of requests and a time limit.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np


@dataclass(frozen=True)
class LoadResult:
    requests: int
    concurrency: int
    seconds: float
    statuses: dict[int, int]  # HTTP status -> count (0: no response)
    latencies_ms: list[float]  # one per request, in order sent
    bodies: list[dict[str, Any] | None]

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms)
        return {"requests": self.requests, "concurrency": self.concurrency,
                "ok": self.ok, "errors": self.requests - self.ok,
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "seconds": round(self.seconds, 3),
                "requests_per_s": round(self.requests / self.seconds, 2),
                "p50_ms": round(float(np.percentile(lat, 50)), 1),
                "p95_ms": round(float(np.percentile(lat, 95)), 1),
                "max_ms": round(float(lat.max()), 1)}


async def _load(url: str, payloads: list[dict[str, Any]], concurrency: int,
                timeout_s: float) -> LoadResult:
    # aiohttp's client parses HTTP in C: a pure-Python client (httpx) spends ~15 ms of CPU
    # per request here, which would measure the client instead of the service
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    gate = asyncio.Semaphore(concurrency)
    latencies = [0.0] * len(payloads)
    statuses = [0] * len(payloads)
    bodies: list[dict[str, Any] | None] = [None] * len(payloads)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as session:

        async def one(i: int) -> None:
            async with gate:
                t0 = time.perf_counter()
                try:
                    async with session.post("/answer", json=payloads[i]) as r:
                        statuses[i] = r.status
                        bodies[i] = await r.json(content_type=None)
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    statuses[i] = 0
                latencies[i] = 1000 * (time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(payloads))))
        seconds = time.perf_counter() - t0
    return LoadResult(len(payloads), concurrency, seconds, dict(Counter(statuses)),
                      latencies, bodies)


def load(url: str, payloads: list[dict[str, Any]], concurrency: int | None = None,
         timeout_s: float = 120.0) -> LoadResult:
    """POST every payload to ``url``/answer, ``concurrency`` at a time (default: all at once)."""
    if not url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        raise ValueError(f"load tests talk to this machine only, not {url}")
    return asyncio.run(_load(url, payloads, concurrency or len(payloads), timeout_s))
