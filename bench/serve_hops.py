"""Benchmark: where a request's time goes in the answer service, hop by hop, in one process
on this machine. The same questions, one at a time (no queueing: each hop's own cost), are
answered at four depths of the path `rcpipe serve` builds:

    model    the Reader's answering function in this process (tokenize, forward, decode)
    reader   + a Serve handle call into the Reader replica (@serve.batch's wait included)
    proxy    + HTTP to Serve's proxy, the Ingress (FastAPI: parse, limits) and its handle
             call to the Reader
    guard    + rcpipe/serve/guard.py in front (a TCP relay: the public port)

Each row: median and p90 milliseconds, and what the hop adds to the one above (median); the
depths take turns on each question, so other load on the machine weighs on all alike. The
service is the one bench/serve.py measures (an untrained demo-sized model by default, as
there: how long an answer takes does not depend on what the weights learned).

    .venv/bin/python bench/serve_hops.py [--requests 200] [--model bidaf]

Writes bench/out/serve-hops.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from serve import OUT, dev_payloads, free_port, untrained_run  # bench/serve.py, beside this


def timed(asks: dict[str, Callable[[dict[str, Any]], Any]], payloads: list[dict[str, Any]]
          ) -> dict[str, list[float]]:
    """Milliseconds of each answer at each depth, one question after another and the depths
    in turn for each question (after 5 warm-up questions), so that whatever else loads the
    machine meanwhile weighs on every depth alike."""
    for p in payloads[:5]:
        for ask in asks.values():
            ask(p)
    found: dict[str, list[float]] = {name: [] for name in asks}
    for p in payloads:
        for name, ask in asks.items():
            t0 = time.perf_counter()
            ask(p)
            found[name].append(1000 * (time.perf_counter() - t0))
    return found


def hops(workdir: Path, params: Path, model: str, payloads: list[dict[str, Any]]
         ) -> dict[str, list[float]]:
    from ray import serve

    from rcpipe.config import load_config
    from rcpipe.serve import deployments, server
    from rcpipe.serve.app import Limits
    from rcpipe.stages.predict import load_reader
    from rcpipe.stages.serving import application, join_ray

    os.chdir(workdir)
    cfg = load_config(params, ["serve.replica_cpus=0"])
    reader = load_reader(cfg, [model], "torch", 1)
    limits, s = Limits(), cfg.serve
    app, _ = application(cfg, [model], limits, threads=1)
    join_ray(1)
    port = free_port()
    front = deployments.guarded(server.listen("127.0.0.1", port), limits, s.keep_alive_s,
                                s.header_timeout_s, s.max_connections)
    host, inner = front.guard.upstream
    try:
        deployments.run(app)
        handle = serve.get_deployment_handle("Reader-0", app_name="rcpipe")
        with httpx.Client(base_url=f"http://{host}:{inner}", timeout=60) as proxy, \
                httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as guard:
            return timed({
                "model": lambda p: reader.answer_pairs([(p["context"], p["question"])],
                                                       model, token_probs=True),
                "reader": lambda p: handle.answer.remote((p["context"], p["question"])
                                                         ).result(),
                "proxy": lambda p: proxy.post("/answer", json=p).raise_for_status(),
                "guard": lambda p: guard.post("/answer", json=p).raise_for_status()},
                payloads)
    finally:
        front.stop()
        deployments.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bidaf")
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    if not 10 <= args.requests <= 5000:
        ap.error("--requests must be 10..5000")
    workdir, params = untrained_run(args.model)
    payloads = dev_payloads(workdir, params, args.requests, args.model)
    found = hops(workdir.resolve(), params.resolve(), args.model, payloads)
    rows, above = {}, 0.0
    for name, ms in found.items():
        median = statistics.median(ms)
        rows[name] = {"p50_ms": round(median, 2),
                      "p90_ms": round(statistics.quantiles(ms, n=10)[-1], 2),
                      "adds_ms": round(median - above, 2)}
        above = median
        print(f"{name:>6}: p50 {median:7.2f} ms  p90 {rows[name]['p90_ms']:7.2f} ms  "
              f"adds {rows[name]['adds_ms']:7.2f} ms", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / "serve-hops.json"
    out.write_text(json.dumps({"model": args.model, "requests": args.requests,
                               "cpus": os.cpu_count(), "machine": platform.machine(),
                               "hops": rows}, indent=1) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
