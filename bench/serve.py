"""Benchmark: the answer service on Ray Serve (1 and 2 Reader replicas) against the service
before it (one uvicorn process with a hand-written batcher, started from a git worktree of
``--baseline-ref``, the same venv), side by side in one run on this machine.

Each arm starts `rcpipe serve` as its own process on a free loopback port and is timed from
the start to its first answer (start-up: Ray and Serve's controller, proxy and replicas on
Ray Serve); then ``--requests`` dev questions are sent ``--concurrency`` at a time (200:
bench/loadgen.py, loopback only, bounded), and one question over a document of
``--long-tokens`` tokens (dev contexts joined: windows). Reports requests/s, p50/p95, the
statuses (lost: no response; 5xx), the long document's latency and the start-up seconds.
``--repeats`` alternates the arms.

    .venv/bin/python bench/serve.py --baseline-ref 572854b         # an untrained demo model
    .venv/bin/python bench/serve.py --workdir demo --params params.demo.yaml --model qanet

With ``--workdir`` a directory holding a trained run (models/<model>/model.pt and the
prepared data its params name) serves that model; ``--untrained`` first saves one there
with initial weights at the params' sizes if it has none. Without, it makes one under
bench/out/serve-run/: synthetic data, prepared, and a model of params.demo.yaml's size with
untrained weights (how long an answer takes does not depend on what the weights learned).

``--slowloris N`` (Serve arms): after the load, N connections opened to the service that
send nothing, and one real question beside them: how many the guard (rcpipe/serve/guard.py)
closed with 408, how long after its opening the last one was closed (within
serve.header_timeout_s, 10), and the question's status and latency.

``--compare runtime``: the eager forward against the exported graph (`rcpipe export` runs
first when the model has no model.onnx), both on Ray Serve with one replica.

Writes bench/out/serve.json (bench/out/serve-runtime.json with ``--compare runtime``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from loadgen import load  # bench/loadgen.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


def save_untrained(cfg: Any, model: str) -> None:
    """models/<model>/model.pt (under the current directory) with initial weights, at the
    sizes of ``cfg``'s models.<model> on its prepared vocabulary."""
    import torch

    from rcpipe.data.prepared import Prepared
    from rcpipe.models import build_model
    from rcpipe.trained.model_file import model_payload, prepared_inputs

    inputs = prepared_inputs(cfg.data.out_dir, cfg.data.word_dim)
    net = build_model(model, cfg.models.of(model), inputs)
    Path(f"models/{model}").mkdir(parents=True, exist_ok=True)
    torch.save(model_payload(model, cfg.models.of(model), inputs, net.state_dict(),
                             Prepared(cfg.data.out_dir).vocab_digest()), f"models/{model}/model.pt")


def untrained_run(model: str) -> tuple[Path, Path]:
    """bench/out/serve-run/: synth + prepare with params.demo.yaml (fewer articles) and an
    untrained demo-sized ``model`` saved as models/<model>/model.pt."""
    import yaml

    from rcpipe import stages
    from rcpipe.config import load_config

    workdir = OUT / "serve-run"
    workdir.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((ROOT / "params.demo.yaml").read_text())
    params["synth"] |= {"train_articles": 20, "dev_articles": 10}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cwd = Path.cwd()
    os.chdir(workdir)
    try:
        cfg = load_config("params.yaml")
        if not (cfg.data.out_dir / "vocab.json").is_file():
            stages.synth(cfg)
            stages.prepare(cfg)
        save_untrained(cfg, model)
    finally:
        os.chdir(cwd)
    return workdir, workdir / "params.yaml"


def dev_payloads(workdir: Path, params: Path, n: int, model: str) -> list[dict[str, Any]]:
    from rcpipe.config import load_config
    from rcpipe.data.squad import load_squad

    cwd = Path.cwd()
    os.chdir(workdir)
    try:
        cfg = load_config(params)
        dev = load_squad(cfg.data.dev_file, cfg.data.cache_dir)
    finally:
        os.chdir(cwd)
    qs = dev.questions
    return [{"context": dev.contexts[qs[i % len(qs)].context_index],
             "question": qs[i % len(qs)].question, "model": model} for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_workdir(workdir: Path, params: Path, model: str, untrained: bool) -> None:
    """With ``untrained``, an untrained model at the params' sizes where there is none."""
    from rcpipe.config import load_config

    if not untrained or (workdir / "models" / model / "model.pt").is_file():
        return
    cwd = Path.cwd()
    os.chdir(workdir)
    try:
        save_untrained(load_config(params), model)
    finally:
        os.chdir(cwd)


def exported(workdir: Path, params: Path, model: str) -> dict[str, Any]:
    """models/<model>/export.json, running `rcpipe export` first if there is none."""
    record = workdir / "models" / model / "export.json"
    if not record.is_file():
        subprocess.run([sys.executable, "-m", "rcpipe", "export", "--model", model, "--params",
                        str(params)], cwd=workdir, check=True)
    return json.loads(record.read_text())


def baseline_tree(ref: str) -> Path:
    """A git worktree of ``ref`` under bench/out/ (made once): the service as it was."""
    tree = OUT / f"serve-baseline-{ref}"
    if not (tree / "rcpipe").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref], cwd=ROOT,
                       check=True, capture_output=True)
    return tree


def baseline_params(params: Path, tree: Path) -> Path:
    """``params`` without the sections the baseline's rcpipe has not heard of (added since:
    it refuses an unknown key), beside it as params.before.yaml."""
    import yaml

    known = {k for name in ("params.yaml", "params.demo.yaml")
             for k in yaml.safe_load((tree / name).read_text())}
    doc = yaml.safe_load(params.read_text())
    out = params.with_name("params.before.yaml")
    out.write_text(yaml.safe_dump({k: v for k, v in doc.items() if k in known}, sort_keys=False))
    return out


def long_payload(payloads: list[dict[str, Any]], tokens: int, model: str) -> dict[str, Any]:
    """One question over dev contexts joined until the document has ``tokens`` words (the
    service's tokens are close to its words; the response says how many windows)."""
    seen: list[str] = []
    for p in payloads:
        if p["context"] not in seen:
            seen.append(p["context"])
    words: list[str] = []
    while len(words) < tokens:
        for c in seen:
            words += c.split()
    return {"context": " ".join(words[:tokens]), "question": payloads[0]["question"],
            "model": model}


async def _slowloris(url: str, n: int, payload: dict[str, Any], wait_s: float
                     ) -> dict[str, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    opened: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []
    t0 = time.monotonic()
    for _ in range(n):
        reader, writer = await asyncio.open_connection(host, int(port))
        opened.append((time.monotonic(), reader, writer))
    opening_s = time.monotonic() - t0

    async def until_closed(since: float, reader: asyncio.StreamReader) -> tuple[float, bytes]:
        reply = await reader.read()  # to the end: the guard's 408, then its close
        return time.monotonic() - since, reply

    waits = [asyncio.create_task(asyncio.wait_for(until_closed(t, r), wait_s))
             for t, r, _ in opened]
    t1 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        answer = await client.post("/answer", json=payload)
    answer_ms = 1000 * (time.perf_counter() - t1)
    closed = [w for w in await asyncio.gather(*waits, return_exceptions=True)
              if isinstance(w, tuple)]
    for _, _, writer in opened:
        writer.close()
    return {"silent": n, "opening_s": round(opening_s, 2), "closed": len(closed),
            "closed_408": sum(reply.startswith(b"HTTP/1.1 408") for _, reply in closed),
            "closed_after_s_min": round(min((s for s, _ in closed), default=0), 2),
            "closed_after_s_max": round(max((s for s, _ in closed), default=0), 2),
            "answer_status": answer.status_code, "answer_ms": round(answer_ms, 1)}


def slowloris(url: str, n: int, payload: dict[str, Any], wait_s: float = 60) -> dict[str, Any]:
    """``n`` silent connections to the service and one question beside them (loopback only):
    how many were closed (with 408), how soon after their opening, and the answer's status."""
    if not url.startswith("http://127."):
        raise ValueError(f"the slow clients talk to this machine only, not {url}")
    return asyncio.run(_slowloris(url, n, payload, wait_s))


def measure(arm: str, workdir: Path, params: Path, model: str, args: argparse.Namespace,
            payloads: list[dict[str, Any]], baseline: Path | None) -> dict[str, Any]:
    """One arm: "before" (the baseline tree's uvicorn service) or "serve-N" (N replicas)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if arm == "before":
        params = baseline_params(params, baseline)
    cmd = [sys.executable, "-m", "rcpipe", "serve", "--params", str(params), "--model", model,
           "--port", str(port), "--max-batch", str(args.max_batch), "--batch-wait-ms",
           str(args.wait_ms), "--threads", str(args.threads), "--timeout", "300",
           # the long document's characters: refused only past data.window.max_tokens
           "--max-context-chars", str(20 * args.long_tokens)]
    env = dict(os.environ)
    if arm == "before":
        env["PYTHONPATH"] = str(baseline)  # its rcpipe before this venv's editable one
    else:
        # each Reader holds no Ray CPU: the replicas share the machine's cores as the
        # baseline's one process does
        _, replicas, *runtime = arm.split("-")  # serve-2, or serve-1-onnx: the exported graph
        cmd += ["--replicas", replicas, "--set", "serve.replica_cpus=0",
                "--runtime", (runtime or ["torch"])[0]]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"rcpipe serve exited: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.post(f"{url}/answer", json=payloads[0], timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("rcpipe serve did not answer within 300 s")
            time.sleep(0.2)
        startup = time.perf_counter() - t0
        load(url, payloads[:8], concurrency=1)  # warm-up: first-call allocations
        before = httpx.get(f"{url}/health").json()
        result = load(url, payloads, concurrency=args.concurrency)
        after = httpx.get(f"{url}/health").json()
        long = long_payload(payloads, args.long_tokens, model)
        longs = [load(url, [long], concurrency=1) for _ in range(3)]
        slow = slowloris(url, args.slowloris, payloads[0]) \
            if args.slowloris and arm != "before" else None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    batches = after["batches"] - before["batches"]
    lost = result.statuses.get(0, 0)
    server_errors = sum(n for s, n in result.statuses.items() if s >= 500)
    long_ms = sorted(r.latencies_ms[0] for r in longs)
    return result.summary() | {
        "arm": arm, "startup_s": round(startup, 1), "lost": lost, "5xx": server_errors,
        "batches": batches, "mean_batch": round(result.requests / max(batches, 1), 2),
        "long_tokens": args.long_tokens, "long_ms": round(long_ms[1], 1),
        "long_status": longs[0].statuses, "long_windows": (longs[0].bodies[0] or {}).get(
            "windows"), "slowloris": slow}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, help="a trained run; default: make an untrained one")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--model", default="bidaf")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1,
                    help="the service's CPU threads (torch's, or onnxruntime's intra-op)")
    ap.add_argument("--long-tokens", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--baseline-ref", default="572854b",
                    help="the commit whose `rcpipe serve` is the baseline (before Ray Serve)")
    ap.add_argument("--arms", default="before,serve-1,serve-2",
                    help="before (the baseline ref's service), serve-N (N replicas), "
                         "serve-N-onnx (the exported graph)")
    ap.add_argument("--plot", type=Path, help="also draw requests/s by arm into this PNG "
                    "(bench/charts.py; docs/results/serving.md shows it)")
    ap.add_argument("--compare", choices=("service", "runtime"), default="service",
                    help="runtime: --arms serve-1-onnx,serve-1 (`rcpipe export` first)")
    ap.add_argument("--slowloris", type=int, default=0, metavar="N",
                    help="Serve arms: N silent connections and a question beside them")
    ap.add_argument("--untrained", action="store_true",
                    help="with --workdir: an untrained model at the params' sizes if none")
    args = ap.parse_args()
    if not 1 <= args.requests <= 5000 or not 1 <= args.concurrency <= 500 \
            or not 0 <= args.slowloris <= 10_000:
        ap.error("--requests must be 1..5000, --concurrency 1..500, --slowloris 0..10000")

    weights = "trained"
    workdir, params = args.workdir, args.params
    if workdir is None:
        workdir, params = untrained_run(args.model)
        weights = "untrained (params.demo.yaml sizes)"
    else:
        in_workdir(workdir, params, args.model, args.untrained)
        if args.untrained:
            weights = "untrained (the params' sizes)"
    workdir, params = workdir.resolve(), params.resolve()
    payloads = dev_payloads(workdir, params, args.requests, args.model)
    arms = args.arms.split(",") if args.compare == "service" else ["serve-1-onnx", "serve-1"]
    export = exported(workdir, params, args.model) if any("onnx" in a for a in arms) else None
    baseline = baseline_tree(args.baseline_ref) if "before" in arms else None
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for _ in range(args.repeats):
        for arm in arms:
            r = measure(arm, workdir, params, args.model, args, payloads, baseline)
            runs[arm].append(r)
            print(f"{arm:>8}: {r['requests_per_s']:7.1f} req/s  p50 {r['p50_ms']:7.0f} ms  "
                  f"p95 {r['p95_ms']:7.0f} ms  mean batch {r['mean_batch']:5.1f}  lost "
                  f"{r['lost']}  5xx {r['5xx']}  statuses {r['statuses']}  "
                  f"{args.long_tokens}-token document {r['long_ms']:6.0f} ms "
                  f"({r['long_windows']} windows)  start-up {r['startup_s']:5.1f} s",
                  flush=True)
            if r["slowloris"]:
                print(f"{'':>8}  slow clients: {r['slowloris']}", flush=True)
    report = {
        "model": args.model, "weights": weights, "requests": args.requests,
        "concurrency": args.concurrency, "threads": args.threads, "wait_ms": args.wait_ms,
        "max_batch": args.max_batch, "baseline_ref": args.baseline_ref,
        "cpus": os.cpu_count(), "machine": platform.machine(),
        "best": {arm: max(rs, key=lambda r: r["requests_per_s"]) for arm, rs in runs.items()},
        "runs": runs,
    }
    if export is not None:
        report["export_check"] = export["check"]
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / ("serve.json" if args.compare == "service" else "serve-runtime.json")
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"-> {out}")
    if args.plot:
        from charts import serve_throughput  # bench/charts.py, beside this script

        args.plot.write_bytes(serve_throughput(report))
        print(f"-> {args.plot}")


if __name__ == "__main__":
    main()
