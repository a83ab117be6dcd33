"""Benchmark: where an exported graph's time goes, op type by op type (onnxruntime's own
profiler), beside the eager forward on the same batch, on the same CPU threads.

    .venv/bin/python bench/onnx_ops.py --workdir RUN --variant qanet [--batch 16]

RUN holds params.yaml, its prepared data and models/<variant>/model.onnx (`rcpipe export`;
bench/export_latency.py and bench/serve.py leave one there). The batch is the dev set's
first ``--batch`` questions, as a Reader of the service batches them (serve.max_batch).
Median of ``--repeats`` forwards after one warm-up, each runtime. Writes
bench/out/onnx_ops-<variant>.json: both forward times and each op type's share of the
graph's kernel time (what a faster graph would have to shrink).

``--int8 OPS`` adds a third arm: the same graph with onnxruntime's dynamic int8
quantization of the op types OPS (``MatMul``, or ``all`` for every type it quantizes),
timed the same way, and how often its argmax start/end agree with the fp32 graph's. It
is not a shipped runtime, only the measurement of whether one would be faster.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


def median_ms(forward: Any, repeats: int) -> float:
    forward()  # warm-up: first-call allocations and onnxruntime's kernel choices
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        forward()
        times.append(time.perf_counter() - t0)
    return round(1000 * float(np.median(times)), 1)


def op_shares(profile: Path, runs: int) -> list[dict[str, Any]]:
    """Each op type's kernel time per forward and share, largest first."""
    total, count = collections.Counter(), collections.Counter()
    for event in json.loads(profile.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            total[op] += event["dur"]  # microseconds
            count[op] += 1
    whole = sum(total.values()) or 1
    return [{"op": op, "ms": round(us / 1000 / runs, 1), "share": round(us / whole, 3),
             "nodes": count[op] // runs} for op, us in total.most_common()]


def int8_arm(graph: Any, batch: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The exported graph dynamically quantized to int8 (weights int8, activations
    quantized per batch), timed as the others, and its agreement with the fp32 graph."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from rcpipe.trained.onnx import ONNX, OnnxForward, locations

    ops = None if args.int8 == "all" else args.int8.split(",")
    target = Path(tempfile.mkdtemp()) / "model.int8.onnx"
    quantize_dynamic(locations(args.variant)[1] / ONNX, target, weight_type=QuantType.QInt8,
                     op_types_to_quantize=ops)
    quantized = OnnxForward(target.read_bytes(), args.threads)
    ms = median_ms(lambda: quantized(batch), args.repeats)
    fp32, int8 = graph(batch), quantized(batch)
    agree = ((fp32.start.argmax(-1) == int8.start.argmax(-1))
             & (fp32.end.argmax(-1) == int8.end.argmax(-1))).float().mean()
    return {"ops": args.int8, "ms": ms, "agree": round(float(agree), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--variant", default="qanet")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch's and onnxruntime's")
    ap.add_argument("--int8", help="also time dynamic int8 quantization of these op types "
                    "(comma-separated, or all)")
    args = ap.parse_args()
    os.chdir(args.workdir)

    import onnxruntime
    import torch

    from rcpipe.config import load_config
    from rcpipe.data.dataset import SquadDataset
    from rcpipe.trained.model_file import load_model
    from rcpipe.trained.onnx import load_onnx

    torch.set_num_threads(args.threads)
    cfg = load_config(args.params)
    dev = SquadDataset.from_parquet(cfg.data.out_dir / "dev.parquet")
    batch = dev.collate(list(range(args.batch)))
    model = load_model(cfg, args.variant)[0].eval()
    with torch.no_grad():
        eager = median_ms(lambda: model(batch), args.repeats)

    # the service's own forward (load_onnx: the graph checked against its record), profiled
    graph = load_onnx(args.variant, args.threads, str(Path(tempfile.mkdtemp()) / "ort"))
    exported = median_ms(lambda: graph(batch), args.repeats)
    ops = op_shares(Path(graph.session.end_profiling()), args.repeats + 1)

    report = {"variant": args.variant, "batch": list(batch.cc.shape), "threads": args.threads,
              "eager_ms": eager, "exported_ms": exported,
              "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
              "ops": ops}
    print(f"{args.variant}, batch {tuple(batch.cc.shape)} (B, Lc, chars): eager {eager} ms, "
          f"exported {exported} ms a forward")
    if args.int8:
        report["int8"] = int8_arm(graph, batch, args)
        print(f"  int8 ({args.int8}): {report['int8']['ms']} ms a forward, argmax start/end "
              f"agree with fp32 on {report['int8']['agree']:.0%} of the questions")
    for row in ops[:12]:
        print(f"  {row['op']:<22} {row['ms']:8.1f} ms {100 * row['share']:5.1f}%  "
              f"({row['nodes']} nodes)")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"onnx_ops-{args.variant}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
