"""Benchmark: which feeds a Ray Train worker faster, Ray Data or rcpipe's sharded batches?

Both produce what one worker of ``--world`` trains on: its share of every global batch of
one epoch, padded into the torch tensors a model takes. Measured side by side in one run,
alternating, each ``--repeats`` times, on a real local Ray cluster:

- sharded (what rcpipe uses): SquadDataset.from_parquet once, then bucket_batches (length
  bucketing, seeded shuffle) and ``collate`` of ``indices[rank::world]`` per step;
- ray_data: ``ray.data.read_parquet`` -> ``split(world)`` -> ``iter_batches``
  of batch/world rows, padded with numpy into the same tensors.

    .venv/bin/python bench/feed.py --prepared demo/data/prepared [--batch 32 --world 2]

Writes bench/out/feed.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from rcpipe.data.dataset import SquadDataset, bucket_batches

ROOT = Path(__file__).resolve().parents[1]


def sharded(path: Path, batch: int, world: int) -> int:
    data = SquadDataset.from_parquet(path)
    rows = 0
    for indices in bucket_batches(data.context_lengths(), batch, shuffle=True, seed=0):
        b = data.collate(indices[0::world])
        rows += b.cw.size(0)
    return rows


def _pad(lists: list, width: int | None = None) -> torch.Tensor:
    width = width or max(len(x) for x in lists)
    out = np.zeros((len(lists), width), dtype=np.int64)
    for i, x in enumerate(lists):
        out[i, : len(x)] = x[:width]
    return torch.from_numpy(out)


def _pad_chars(nested: list, char_limit: int = 16) -> torch.Tensor:
    length = max(len(x) for x in nested)
    out = np.zeros((len(nested), length, char_limit), dtype=np.int64)
    for i, words in enumerate(nested):
        for j, chars in enumerate(words):
            out[i, j, : min(len(chars), char_limit)] = chars[:char_limit]
    return torch.from_numpy(out)


def ray_data(path: Path, batch: int, world: int) -> int:
    import ray

    columns = ["context_word_ids", "context_char_ids", "question_word_ids",
               "question_char_ids", "y1", "y2"]
    ds = ray.data.read_parquet(str(path), columns=columns).randomize_block_order(seed=0)
    shard = ds.split(world, equal=True)[0]  # streaming_split needs every shard consumed
    rows = 0
    for b in shard.iter_batches(batch_size=batch // world, batch_format="numpy"):
        tensors = (_pad(b["context_word_ids"]), _pad_chars(b["context_char_ids"]),
                   _pad(b["question_word_ids"]), _pad_chars(b["question_char_ids"]),
                   torch.from_numpy(b["y1"]), torch.from_numpy(b["y2"]))
        rows += tensors[0].size(0)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepared", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    path = (args.prepared / "train.parquet").resolve()
    ways = {"sharded": sharded, "ray_data": ray_data}
    times: dict[str, list[float]] = {k: [] for k in ways}
    rows: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, feed in ways.items():
            t0 = time.perf_counter()
            rows[name] = feed(path, args.batch, args.world)
            times[name].append(time.perf_counter() - t0)
    ray.shutdown()
    result = {k: {"median_s": statistics.median(v), "rows": rows[k],
                  "rows_per_s": rows[k] / statistics.median(v)} for k, v in times.items()}
    ratio = result["ray_data"]["median_s"] / result["sharded"]["median_s"]
    print(f"one worker's epoch of {args.world}: sharded {result['sharded']['median_s']:.2f}s "
          f"({result['sharded']['rows_per_s']:.0f} rows/s), ray_data "
          f"{result['ray_data']['median_s']:.2f}s ({result['ray_data']['rows_per_s']:.0f} "
          f"rows/s): sharded is {ratio:.1f}x faster")
    out = ROOT / "bench" / "out" / "feed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"batch": args.batch, "world": args.world, **result,
                               "ray_data_over_sharded": ratio}, indent=1) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
