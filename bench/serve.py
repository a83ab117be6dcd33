"""Benchmark: the answer service with dynamic batching against one request at a time, or
(``--compare runtime``) its eager forward against the exported graph (`rcpipe export`,
`rcpipe serve --runtime onnx`), both batched.

Starts `rcpipe serve` as its own process on a free loopback port once per arm (batching:
``--max-batch``, default 16, and ``--max-batch 1``; runtime: ``--runtime torch`` and
``--runtime onnx`` at ``--max-batch``), and sends each the same ``--requests`` dev
questions, ``--concurrency`` at a time (default: all at once), from this process
(bench/loadgen.py; loopback only). Reports p50/p95 latency, requests/s and the batches the
service formed, side by side in one run; ``--repeats`` alternates the arms. ``--threads`` is
the service's CPU threads, torch's or onnxruntime's intra-op alike.

    .venv/bin/python bench/serve.py                        # a demo-sized model, see below
    .venv/bin/python bench/serve.py --workdir demo --params params.demo.yaml --model qanet
    .venv/bin/python bench/serve.py --workdir /tmp/split --model qanet --untrained \
        --compare runtime --concurrency 32                   # params.yaml's sizes

With ``--workdir`` a directory holding a trained run (models/<model>/model.pt and the
prepared data its params name) serves that model; ``--untrained`` first saves one there
with initial weights at the params' sizes if it has none. Without, it makes one under
bench/out/serve-run/: synthetic data, prepared, and a model of params.demo.yaml's size with
untrained weights (how long an answer takes does not depend on what the weights learned).
``--compare runtime`` runs `rcpipe export` first when the model has no model.onnx.

Writes bench/out/serve.json (bench/out/serve-runtime.json with ``--compare runtime``).
"""

from __future__ import annotations

import argparse
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

    from rcpipe.eval.trained import model_payload, prepared_inputs, vocab_digest
    from rcpipe.models import build_model

    inputs = prepared_inputs(cfg.data.out_dir, cfg.data.word_dim)
    net = build_model(model, cfg.models.of(model), inputs)
    Path(f"models/{model}").mkdir(parents=True, exist_ok=True)
    torch.save(model_payload(model, cfg.models.of(model), inputs, net.state_dict(),
                             vocab_digest(cfg.data.out_dir)), f"models/{model}/model.pt")


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
        subprocess.run([sys.executable, "-m", "rcpipe", "export", model, "--params",
                        str(params)], cwd=workdir, check=True)
    return json.loads(record.read_text())


def measure(workdir: Path, params: Path, model: str, max_batch: int, wait_ms: float,
            threads: int, payloads: list[dict[str, Any]], concurrency: int,
            runtime: str = "torch") -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "rcpipe", "serve", "--params", str(params), "--model", model,
           "--port", str(port), "--max-batch", str(max_batch), "--batch-wait-ms", str(wait_ms),
           "--threads", str(threads), "--timeout", "300", "--runtime", runtime]
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"rcpipe serve exited: {proc.stderr.read()[-2000:]}")
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("rcpipe serve did not start in 120 s") from None
                time.sleep(0.2)
        load(url, payloads[:8], concurrency=1)  # warm-up: first-call allocations
        before = httpx.get(f"{url}/health").json()
        result = load(url, payloads, concurrency=concurrency)
        after = httpx.get(f"{url}/health").json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    batches = after["batches"] - before["batches"]
    return result.summary() | {"runtime": runtime, "max_batch": max_batch, "batches": batches,
                               "mean_batch": round(result.requests / max(batches, 1), 2),
                               "largest_batch": after["largest_batch"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, help="a trained run; default: make an untrained one")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--model", default="bidaf")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=0, help="0: all requests at once")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1,
                    help="the service's CPU threads (torch's, or onnxruntime's intra-op)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--compare", choices=("batching", "runtime"), default="batching",
                    help="batching: batched vs one at a time; runtime: eager vs exported")
    ap.add_argument("--untrained", action="store_true",
                    help="with --workdir: an untrained model at the params' sizes if none")
    args = ap.parse_args()
    if not 1 <= args.requests <= 5000:
        ap.error("--requests must be 1..5000")

    weights = "trained"
    workdir, params = args.workdir, args.params
    if workdir is None:
        workdir, params = untrained_run(args.model)
        weights = "untrained (params.demo.yaml sizes)"
    else:
        in_workdir(workdir, params, args.model, args.untrained)
        if args.untrained:
            weights = "untrained (the params' sizes)"
    workdir = workdir.resolve()
    payloads = dev_payloads(workdir, params, args.requests, args.model)
    concurrency = args.concurrency or args.requests
    # (name, runtime, max_batch): the second arm is the one the ratio divides by
    arms = (("batched", "torch", args.max_batch), ("one_at_a_time", "torch", 1)) \
        if args.compare == "batching" else \
        (("exported", "onnx", args.max_batch), ("eager", "torch", args.max_batch))
    export = exported(workdir, params, args.model) if args.compare == "runtime" else None
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in arms}
    for _ in range(args.repeats):
        for name, runtime, max_batch in arms:
            r = measure(workdir, params, args.model, max_batch, args.wait_ms, args.threads,
                        payloads, concurrency, runtime)
            runs[name].append(r)
            print(f"{name:>14}: {r['requests_per_s']:7.1f} req/s  p50 {r['p50_ms']:7.0f} ms  "
                  f"p95 {r['p95_ms']:7.0f} ms  mean batch {r['mean_batch']:5.1f}  "
                  f"errors {r['errors']}", flush=True)

    def best(name: str) -> dict[str, Any]:
        return max(runs[name], key=lambda r: r["requests_per_s"])

    first, second = (name for name, _, _ in arms)
    report = {
        "model": args.model, "weights": weights, "requests": args.requests,
        "concurrency": concurrency, "threads": args.threads, "wait_ms": args.wait_ms,
        "cpus": os.cpu_count(), "machine": platform.machine(), "compare": args.compare,
        first: best(first), second: best(second),
        "throughput_ratio": round(best(first)["requests_per_s"]
                                  / best(second)["requests_per_s"], 2),
        "runs": runs,
    }
    if export is not None:
        report["export_check"] = export["check"]
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / ("serve.json" if args.compare == "batching" else "serve-runtime.json")
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{first} / {second}: {report['throughput_ratio']}x requests/s -> {out}")


if __name__ == "__main__":
    main()
