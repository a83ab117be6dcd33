"""Benchmark: the host's part of a training step, the Worker's collate of a batch, at
params.yaml's buckets and batch size, on a prepared split.

On a GPU the Worker collates and pins the next batches on another thread while the device
runs (train/worker.py), so the GPU waits for the host only when a collate takes longer than a
step. This times the epoch's first ``--batches`` batches on one thread: the median ms of the
collate and of its distinct-word lists, the tokens and distinct words a batch holds, and the
examples/s one collating thread can feed, to hold against a GPU step (QANet's target, 2,000
examples/s, is 16 ms a batch of 32). Name the machine with the numbers.

    OMP_NUM_THREADS=1 .venv/bin/python bench/collate.py --prepared data/prepared \\
        --set data.word_vectors=null
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from common import OUT, ROOT, parser, write

from rcpipe.config import load_config
from rcpipe.data.dataset import SquadDataset, distinct_words
from rcpipe.train.worker import train_batches


def measure(data: SquadDataset, epoch: list[list[int]]) -> dict[str, float]:
    """Median ms per batch of the collate and of its distinct-word lists, and the mean
    tokens and distinct words a batch holds."""
    whole, words, tokens, distinct = [], [], [], []
    for rows in epoch:
        t0 = time.perf_counter()
        b = data.collate(rows)
        t1 = time.perf_counter()
        distinct_words(b.cw.numpy(), b.cc.numpy(), b.qw.numpy(), b.qc.numpy())
        t2 = time.perf_counter()
        whole.append((t1 - t0) * 1e3)
        words.append((t2 - t1) * 1e3)
        tokens.append(b.cw.numel() + b.qw.numel())
        distinct.append(b.words.shape[0])
    collate = statistics.median(whole)
    return {"collate_ms": collate, "distinct_words_ms": statistics.median(words),
            "tokens": statistics.fmean(tokens), "distinct_words": statistics.fmean(distinct),
            "examples_per_s_one_thread": len(epoch[0]) * 1e3 / collate}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, OUT / "collate.json")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--prepared", type=Path, required=True, help="rcpipe prepare's out_dir")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=100, help="batches timed")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config(args.params, args.sets)
    edges = cfg.train.buckets
    buckets = (edges.context, edges.question) if edges else None
    data = SquadDataset.from_parquet(args.prepared / "train.parquet", buckets=buckets)
    epoch = train_batches(data, args.batch, seed=0, world=1)[: args.batches]
    measure(data, epoch[:5])  # warm-up: the first calls allocate
    out = measure(data, epoch) | {"batch": args.batch, "batches": len(epoch),
                                  "buckets": buckets, "prepared": str(args.prepared)}
    print(f"collate, batch {args.batch}, {len(epoch)} batches, one thread: "
          f"{out['collate_ms']:.2f} ms a batch (median), of it the distinct-word lists "
          f"{out['distinct_words_ms']:.2f} ms; {out['tokens']:.0f} tokens, "
          f"{out['distinct_words']:.0f} distinct words a batch "
          f"({out['tokens'] / out['distinct_words']:.1f}x); one collating thread feeds "
          f"{out['examples_per_s_one_thread']:,.0f} examples/s")
    write(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
