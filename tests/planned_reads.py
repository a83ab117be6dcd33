"""What each rank of a run should have read, from the prepared split's manifest alone
(data/stream.py's plan): the reference a run's recorded reads (summary.json's "reads",
each rank's [rows, ids digest] per epoch) are held to."""

from __future__ import annotations

from pathlib import Path

from rcpipe.data.dataset import char_limit_of
from rcpipe.data.prepared import Prepared
from rcpipe.data.stream import TrainStream, ids_digest


def planned_reads(out_dir: Path, batch_size: int, seed: int, world: int, steps: int,
                  buffer_rows: int = 32_768) -> list[list[list[int]]]:
    """Each rank's [rows, ids digest] per epoch over a run of ``steps`` steps."""
    shards = Prepared(out_dir).shards("train")
    streams = [TrainStream(shards, batch_size // world, seed, r, world, buffer_rows,
                           char_limit=char_limit_of(out_dir)) for r in range(world)]
    reads: list[list[list[int]]] = [[] for _ in range(world)]
    epoch, done = 0, 0
    while done < steps:
        plans = [s.epoch(epoch) for s in streams]
        take = min(len(plans[0]), steps - done)
        for r, plan in enumerate(plans):
            ids = [i for b, _ in zip(plan.batches(), range(take), strict=False)
                   for i in b.ids]
            reads[r].append([len(ids), ids_digest(ids)])
        done, epoch = done + take, epoch + 1
    return reads
