"""Benchmark: training examples per second of every variant, side by side.

Same prepared data, same hidden size, same batch size, same threads: only the model
differs. Each variant gets warm-up steps (not timed), then ``--steps`` timed steps.
The literature reports QANet training 3x-13x faster than its RNN counterparts (on GPUs);
this measures whether ours does on this machine.

    .venv/bin/python bench/train_speed.py [--prepared DIR] [--hidden 64] [--batch 32]
    .venv/bin/python bench/train_speed.py --workers 1 2 [--variants qanet]

--prepared defaults to a synthetic set made on the fly (params.demo.yaml). Writes
bench/out/train_speed.json and prints a table with each variant's ratio to qanet.
--workers runs `rcpipe train` itself (Ray Train, DDP) with each number of workers at the
same global batch, one after another in one run, and reports the workers' examples/s
(timed inside the job, Ray's start-up excluded) and the wall seconds of the whole job.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rcpipe import stages
from rcpipe.config import VARIANTS, ModelConfig, load_config
from rcpipe.data.dataset import SquadDataset, bucket_batches
from rcpipe.models import ModelInputs, build_model
from rcpipe.models.layers import count_parameters
from rcpipe.train.loop import make_optimizer, train_step

ROOT = Path(__file__).resolve().parents[1]


def synthetic_prepared() -> Path:
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    os.chdir(work)
    cfg = load_config(ROOT / "params.demo.yaml", ["synth.train_articles=20"])
    stages.synth(cfg)
    stages.prepare(cfg)
    return work / cfg.data.out_dir


def measure(variant: str, data: SquadDataset, inputs: ModelInputs, hidden: int, batch: int,
            steps: int, warmup: int) -> dict[str, float]:
    torch.manual_seed(0)
    cfg = ModelConfig(hidden=hidden, char_hidden=hidden, char_dim=16, layers=2, heads=4,
                      model_blocks=3, dropout=0.1)
    model = build_model(variant, cfg, inputs)
    opt, sched = make_optimizer(model, cfg.optim)
    batches = bucket_batches(data.context_lengths(), batch, shuffle=True, seed=0)
    batches = (batches * (1 + (steps + warmup) // len(batches)))[: steps + warmup]
    seen, t0 = 0, 0.0
    for k, idx in enumerate(batches):
        if k == warmup:
            t0, seen = time.perf_counter(), 0
        train_step(model, data.collate(idx), opt, sched, 5.0)
        seen += len(idx)
    wall = time.perf_counter() - t0
    return {"examples_per_s": seen / wall, "seconds": wall, "steps": steps,
            "params": count_parameters(model, exclude_embeddings=True)}


def measure_workers(variant: str, prepared: Path, workers: int, batch: int, steps: int
                    ) -> dict[str, float]:
    """One `rcpipe train` job through Ray Train on this machine's local cluster."""
    os.chdir(tempfile.mkdtemp(prefix=f"bench-workers-{workers}-"))
    synth = prepared.parent / "synth"  # the params.demo.yaml layout: data/{synth,prepared}
    cfg = load_config(ROOT / "params.demo.yaml", [
        f"data.out_dir={prepared}", f"data.train_file={synth / 'train.json'}",
        f"data.dev_file={synth / 'dev.json'}", f"train.num_workers={workers}",
        f"train.batch_size={batch}", f"train.max_steps={steps}", "train.epochs=1000",
        "train.eval_every=0", "train.max_minutes=0"])
    t0 = time.perf_counter()
    summary = stages.train(cfg, variant)
    return {"examples_per_s": summary["examples_per_s"], "wall_s": time.perf_counter() - t0,
            "steps": summary["steps"], "world_size": summary["world_size"]}


def compare_workers(args: argparse.Namespace, prepared: Path) -> dict:
    results: dict[str, dict[int, dict]] = {}
    for v in args.variants:
        results[v] = {n: measure_workers(v, prepared, n, args.batch, args.steps)
                      for n in args.workers}
    print(f"\n{'variant':<15} " + " ".join(f"{f'{n} worker(s) ex/s':>18}" for n in args.workers)
          + f" {'speed-up':>9}   (global batch {args.batch}, {os.cpu_count()} CPUs)")
    for v, by_n in results.items():
        rates = [by_n[n]["examples_per_s"] for n in args.workers]
        print(f"{v:<15} " + " ".join(f"{r:>18.1f}" for r in rates)
              + f" {rates[-1] / rates[0]:>8.2f}x")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepared", type=Path)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--workers", nargs="*", type=int,
                    help="compare Ray Train jobs with these numbers of workers instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prepared = (args.prepared or synthetic_prepared()).resolve()
    if args.workers:
        results = compare_workers(args, prepared)
        out = ROOT / "bench" / "out" / "train_workers.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"prepared": str(prepared), "batch": args.batch,
                                   "results": results}, indent=1) + "\n")
        print(f"-> {out}")
        return
    data = SquadDataset.from_parquet(prepared / "train.parquet", para_limit=400)
    vocab = json.loads((prepared / "vocab.json").read_text())
    inputs = ModelInputs(word_vocab=len(vocab["words"]), char_vocab=len(vocab["chars"]),
                         word_dim=64, vectors=None, no_answer=False)
    results = {}
    for v in args.variants:
        results[v] = measure(v, data, inputs, args.hidden, args.batch, args.steps, args.warmup)
        print(f"{v:<15} {results[v]['examples_per_s']:8.1f} ex/s", flush=True)
    ref = results.get("qanet", {}).get("examples_per_s")
    print(f"\n{'variant':<15} {'ex/s':>8} {'qanet / it':>11} {'params':>9}   "
          f"(hidden {args.hidden}, batch {args.batch}, {args.threads} threads, "
          f"mean context {np.mean(data.context_lengths()):.0f} tokens)")
    for v, r in results.items():
        ratio = f"{ref / r['examples_per_s']:.2f}x" if ref else "-"
        print(f"{v:<15} {r['examples_per_s']:>8.1f} {ratio:>11} {r['params']:>9}")
    out = ROOT / "bench" / "out" / "train_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"prepared": str(prepared), "hidden": args.hidden,
                               "batch": args.batch, "threads": args.threads,
                               "device": "cpu", "results": results}, indent=1) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
