"""Benchmark: one question's answer time, each variant's eager forward against its exported
graph (`rcpipe export`, onnxruntime), through the Reader `rcpipe predict` and the service use
(tokenizing, the forward, decoding), on the same CPU threads.

    .venv/bin/python bench/export_latency.py --workdir RUN [--variants bidaf qanet ...]

RUN holds params.yaml and its prepared data; a variant with no models/<v>/model.pt there gets
one with initial weights at the params' sizes (speed does not depend on what the weights
learned), and one with no model.onnx is exported first (R-Net's Python recurrence is not:
its row says so). Asks ``--questions`` dev questions one at a time after ``--warmup`` more,
eager and exported alternating ``--repeats`` times (the machine is shared: each keeps its
best run by p50, every run is in the file).

Writes bench/out/export_latency.json.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import OUT, parser, write
from serve import dev_payloads, save_untrained  # bench/serve.py, beside this script

from rcpipe.config import VARIANTS, load_config


def latencies(reader: Any, name: str, pairs: list[tuple[str, str]], warmup: int
              ) -> dict[str, float]:
    for pair in pairs[:warmup]:
        reader.answer_pairs([pair], name)
    ms = []
    for pair in pairs[warmup:]:
        t0 = time.perf_counter()
        reader.answer_pairs([pair], name)
        ms.append(1000 * (time.perf_counter() - t0))
    return {"p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p95_ms": round(float(np.percentile(ms, 95)), 1)}


def one_variant(cfg: Any, variant: str, pairs: list[tuple[str, str]], warmup: int,
                threads: int, repeats: int) -> dict[str, Any]:
    import torch

    from rcpipe import stages
    from rcpipe.errors import InputError
    from rcpipe.trained.reader import load_reader

    if not Path(f"models/{variant}/model.pt").is_file():
        save_untrained(cfg, variant)
    row: dict[str, Any] = {"variant": variant}
    torch.set_num_threads(threads)
    readers = {"eager": load_reader(cfg, [variant])}
    try:
        if not Path(f"models/{variant}/model.onnx").is_file():
            stages.export(cfg, variant)
        row["export_check"] = json.loads(Path(f"models/{variant}/export.json").read_text()
                                         )["check"]["max_abs_diff"]
        readers["exported"] = load_reader(cfg, [variant], "onnx", threads)
    except InputError as e:
        row["exported"] = None
        row["not_exported"] = e.what
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in readers}
    for _ in range(repeats):
        for name, reader in readers.items():
            runs[name].append(latencies(reader, variant, pairs, warmup))
    for name, measured in runs.items():
        row[name] = min(measured, key=lambda r: r["p50_ms"])
    if "exported" in runs:
        row["speedup_p50"] = round(row["eager"]["p50_ms"] / row["exported"]["p50_ms"], 2)
    row["runs"] = runs
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = parser(__doc__, sets=False)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch's and onnxruntime's")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    workdir = args.workdir.resolve()
    payloads = dev_payloads(workdir, args.params, args.questions + args.warmup, "")
    pairs = [(p["context"], p["question"]) for p in payloads]
    os.chdir(workdir)
    cfg = load_config(args.params)
    rows = [one_variant(cfg, v, pairs, args.warmup, args.threads, args.repeats)
            for v in args.variants]
    report = {"weights": "untrained unless models/<v>/model.pt was there (the params' sizes)",
              "questions": args.questions, "threads": args.threads, "repeats": args.repeats,
              "cpus": os.cpu_count(),
              "machine": platform.machine(), "processor": platform.processor(), "rows": rows}
    write(OUT / "export_latency.json", report)


if __name__ == "__main__":
    main()
