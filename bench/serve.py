"""Benchmark: the answer service on Ray Serve, with 1 and 2 Reader replicas, side by side.

Each arm starts `rcpipe serve` as its own process on a free loopback port and is timed from
the start to its first answer (start-up: Ray and Serve's controller, proxy and replicas);
then ``--requests`` dev questions are sent ``--concurrency`` at a time (bench/loadgen.py,
loopback only, bounded), and one question over a document of ``--long-tokens`` tokens (dev
contexts joined: windows). Reports requests/s, p50/p95, the statuses (lost: no response;
5xx), the Reader's mean batch, the long document's latency and the start-up seconds.
``--repeats`` alternates the arms. ``--model a,b`` measures each arm with each model in turn
(the student beside the ensemble it was distilled from, at the same replicas: issue 73).

    .venv/bin/python bench/serve.py                          # an untrained demo model
    .venv/bin/python bench/serve.py --workdir demo --params params.demo.yaml --model qanet

With ``--workdir`` a directory holding a trained run (models/<model>/model.pt and the
prepared data its params name) serves that model; ``--untrained`` first saves one there
with initial weights at the params' sizes if it has none. Without, it makes one under
bench/out/serve-run/: synthetic data, prepared, and a model of params.demo.yaml's size with
untrained weights (how long an answer takes does not depend on what the weights learned).
``--compare runtime``: the eager forward against the exported graph (`rcpipe export` runs
first when the model has no model.onnx), both on Ray Serve with one replica.

The arm of the service before Ray Serve (a worktree of ``--baseline-ref``) and the 2,000
silent connections of ``--slowloris`` measured once what docs/results/serving.md keeps:
`git show 86d15c6:bench/serve.py` has them.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from common import OUT, ROOT, parser, write
from loadgen import load


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
    with contextlib.chdir(workdir):
        cfg = load_config("params.yaml")
        if not (cfg.data.out_dir / "vocab.json").is_file():
            stages.synth(cfg)
            stages.prepare(cfg)
        save_untrained(cfg, model)
    return workdir, workdir / "params.yaml"


def dev_payloads(workdir: Path, params: Path, n: int, model: str) -> list[dict[str, Any]]:
    from rcpipe.config import load_config
    from rcpipe.data.squad import load_squad

    with contextlib.chdir(workdir):
        cfg = load_config(params)
        dev = load_squad(cfg.data.dev_file, cfg.data.cache_dir)
    qs = [dev.questions[i % len(dev.questions)] for i in range(n)]
    return [{"context": dev.contexts[q.context_index], "question": q.question, "model": model}
            for q in qs]


def exported(workdir: Path, params: Path, model: str) -> dict[str, Any]:
    """models/<model>/export.json, running `rcpipe export` first if there is none."""
    record = workdir / "models" / model / "export.json"
    if not record.is_file():
        subprocess.run([sys.executable, "-m", "rcpipe", "export", "--model", model, "--params",
                        str(params)], cwd=workdir, check=True)
    return json.loads(record.read_text())


def long_payload(payloads: list[dict[str, Any]], tokens: int, model: str) -> dict[str, Any]:
    """One question over dev contexts joined until the document has ``tokens`` words (the
    service's tokens are close to its words; the response says how many windows)."""
    words: list[str] = []
    while len(words) < tokens:
        for c in dict.fromkeys(p["context"] for p in payloads):
            words += c.split()
    return {"context": " ".join(words[:tokens]), "question": payloads[0]["question"],
            "model": model}


def started(cmd: list[str], cwd: Path, url: str, payload: dict[str, Any]
            ) -> subprocess.Popen[str]:
    """`rcpipe serve` started, once it has answered ``payload``."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"rcpipe serve exited: {proc.stderr.read()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(f"{url}/answer", json=payload, timeout=30).status_code == 200:
                return proc
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("rcpipe serve did not answer within 300 s")
        time.sleep(0.2)


def measure(arm: str, workdir: Path, params: Path, model: str, args: Any,
            payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm: "serve-N" (N Reader replicas), or "serve-N-onnx" (the exported graph)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    _, replicas, *runtime = arm.split("-")
    # each Reader holds no Ray CPU: the replicas share the machine's cores
    cmd = [sys.executable, "-m", "rcpipe", "serve", "--params", str(params), "--model", model,
           "--port", str(port), "--max-batch", str(args.max_batch), "--batch-wait-ms",
           str(args.wait_ms), "--threads", str(args.threads), "--timeout", "300",
           # the long document's characters: refused only past data.window.max_tokens
           "--max-context-chars", str(20 * args.long_tokens), "--replicas", replicas,
           "--set", "serve.replica_cpus=0", "--runtime", (runtime or ["torch"])[0]]
    t0 = time.perf_counter()
    proc = started(cmd, workdir, url, payloads[0])
    try:
        startup = time.perf_counter() - t0
        load(url, payloads[:8], concurrency=1)  # warm-up: first-call allocations
        before = httpx.get(f"{url}/health").json()
        result = load(url, payloads, concurrency=args.concurrency)
        after = httpx.get(f"{url}/health").json()
        long = long_payload(payloads, args.long_tokens, model)
        longs = [load(url, [long], concurrency=1) for _ in range(3)]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    batches = after["batches"] - before["batches"]
    long_ms = sorted(r.latencies_ms[0] for r in longs)
    return result.summary() | {
        "arm": arm, "startup_s": round(startup, 1), "lost": result.statuses.get(0, 0),
        "5xx": sum(n for s, n in result.statuses.items() if s >= 500), "batches": batches,
        "mean_batch": round(result.requests / max(batches, 1), 2),
        "long_tokens": args.long_tokens, "long_ms": round(long_ms[1], 1),
        "long_status": longs[0].statuses,
        "long_windows": (longs[0].bodies[0] or {}).get("windows")}


def main() -> None:
    ap = parser(__doc__, sets=False)
    ap.add_argument("--workdir", type=Path, help="a trained run; default: make an untrained one")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--model", default="bidaf", help="a model, or several: a,b (each arm "
                    "each, in turn; needs --workdir)")
    ap.add_argument("--requests", type=int, default=1000, help="1 to 5,000")
    ap.add_argument("--concurrency", type=int, default=200, help="1 to 500")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1, help="torch's or onnxruntime's")
    ap.add_argument("--long-tokens", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--arms", default="serve-1,serve-2", help="serve-N, serve-N-onnx")
    ap.add_argument("--plot", type=Path, help="requests/s by arm, a PNG")
    ap.add_argument("--replot", type=Path, help="no run: --plot from this run's JSON")
    ap.add_argument("--compare", choices=("service", "runtime"), default="service")
    ap.add_argument("--untrained", action="store_true", help="one in --workdir if it has none")
    args = ap.parse_args()
    if args.replot and args.plot:  # the chart again, from the JSON a run wrote
        return chart(json.loads(args.replot.read_text()), args.plot)
    if not (1 <= args.requests <= 5000 and 1 <= args.concurrency <= 500):
        ap.error("--requests must be 1..5000, --concurrency 1..500")
    weights = "trained"
    workdir, params, models = args.workdir, args.params, args.model.split(",")
    if len(models) > 1 and (workdir is None or args.untrained or args.compare != "service"):
        ap.error("several --model: a --workdir that trained them, --compare service")
    if workdir is None:
        workdir, params = untrained_run(args.model)
        weights = "untrained (params.demo.yaml sizes)"
    elif args.untrained:
        weights = "untrained (the params' sizes)"
        if not (workdir / "models" / args.model / "model.pt").is_file():
            from rcpipe.config import load_config

            with contextlib.chdir(workdir):
                save_untrained(load_config(params), args.model)
    workdir, params = workdir.resolve(), params.resolve()
    payloads = {m: dev_payloads(workdir, params, args.requests, m) for m in models}
    arms = args.arms.split(",") if args.compare == "service" else ["serve-1-onnx", "serve-1"]
    export = exported(workdir, params, args.model) if any("onnx" in a for a in arms) else None
    # an arm a model: "serve-1", or with several models "student serve-1"
    named = {(m, arm): f"{m} {arm}" if len(models) > 1 else arm for arm in arms for m in models}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in named.values()}
    for _ in range(args.repeats):
        for (m, arm), name in named.items():
            r = measure(arm, workdir, params, m, args, payloads[m])
            runs[name].append(r)
            print(f"{name:>8}: {r['requests_per_s']:7.1f} req/s  p50 {r['p50_ms']:7.0f} ms  "
                  f"p95 {r['p95_ms']:7.0f} ms  mean batch {r['mean_batch']:5.1f}  lost "
                  f"{r['lost']}  5xx {r['5xx']}  statuses {r['statuses']}  "
                  f"{args.long_tokens}-token document {r['long_ms']:6.0f} ms "
                  f"({r['long_windows']} windows)  start-up {r['startup_s']:5.1f} s",
                  flush=True)
    report = {
        "model": args.model, "weights": weights, "requests": args.requests,
        "concurrency": args.concurrency, "threads": args.threads, "wait_ms": args.wait_ms,
        "max_batch": args.max_batch, "cpus": os.cpu_count(),
        "best": {arm: max(rs, key=lambda r: r["requests_per_s"]) for arm, rs in runs.items()},
        "runs": runs} | ({"export_check": export["check"]} if export else {})
    write(OUT / ("serve.json" if args.compare == "service" else "serve-runtime.json"), report)
    if args.plot:
        chart(report, args.plot)


def chart(report: dict[str, Any], png: Path) -> None:
    """Requests per second by arm (docs/results/serving.md): a dot per repeat, a bar at the
    best, the arms in the order they ran (matplotlib's Agg canvas, no display)."""
    from matplotlib.figure import Figure

    runs: dict[str, list[dict[str, Any]]] = report["runs"]
    best = [max(r["requests_per_s"] for r in rs) for rs in runs.values()]
    fig = Figure(figsize=(6, 3.2))
    ax = fig.add_subplot()
    ax.barh(range(len(runs)), best, color="#d9d9d9", edgecolor="#636363", label="best")
    for y, rs in enumerate(runs.values()):
        ax.scatter([r["requests_per_s"] for r in rs], [y] * len(rs), color="#2166ac", zorder=3,
                   s=22, label="each repeat" if y == 0 else None)
        ax.annotate(f"{best[y]:.0f} req/s", (best[y], y), textcoords="offset points",
                    xytext=(4, -3), fontsize=8)
    ax.set_yticks(range(len(runs)), list(runs), fontsize=8)
    ax.invert_yaxis()  # the first arm on top
    ax.set(xlabel="requests per second", xlim=(0, max(best) * 1.25))
    ax.set_title(f"{report['requests']} questions, {report['concurrency']} clients, "
                 f"{report['cpus']} CPUs", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
    print(f"-> {png}")


if __name__ == "__main__":
    main()
