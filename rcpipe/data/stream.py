"""A rank's training stream: its share of each epoch, read a buffer of row groups at a time,
shuffled and bucketed by length within the buffer, resumable at any step.

Every rank plans the epoch from the manifest alone (the rows of each row group, meta.json;
data/shards.py), so the plan needs no communication and no read:

1. the epoch's order of the split's row groups: a permutation seeded by (seed, epoch);
2. rank r of W takes rows [r N / W, (r + 1) N / W) of that order: each row is one rank's,
   once an epoch (at most one row apart between ranks);
3. its rows, in that order, fill buffers of at most ``buffer_rows`` (train.shuffle_buffer);
   a buffer's rows are put back in split order, then shuffled and cut into batches of
   similar context length (dataset.bucket_batches, pools of 50 batches), the batches
   shuffled, as the whole split was before streams: a split that fits one buffer on one
   rank is read in exactly the order it was then;
4. an epoch is as many steps as the rank with the fewest batches has (every rank must take
   part in each step); the rows past that are counted (``EpochPlan.left``), the step's
   count known to all.

A resumed run at (epoch, step) reads only the buffer that step falls in: each buffer's
batch count follows from its rows. A rank holds one buffer (and collates one batch ahead),
whatever the split's size. Ray Data's streaming split hands blocks to ranks as they ask, so
its order cannot be replayed after a kill (ray-project/ray#37633: no fault-tolerant
DataIterator); this plan can, and is the same in a Ray Train worker and in one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

import numpy as np
import pyarrow as pa

from rcpipe.data.dataset import Edges, SquadDataset, bucket_batches
from rcpipe.data.shards import Shards, Unit
from rcpipe.data.teacher import TeacherTargets
from rcpipe.models.batch import Batch

POOL = 50  # batches a length-sorted pool holds (dataset.bucket_batches' bucket_factor)
_UNITS = 0x756E6974  # mixed into the seed of the row groups' order (not the rows')


@dataclass(frozen=True)
class Piece:
    """Rows [lo, hi) of a row group, as a rank reads them."""

    unit: Unit
    lo: int
    hi: int


def ids_digest(ids: list[str]) -> int:
    """What a set of rows is, as one number that does not depend on their order: the sum of
    each id's 64-bit hash (mod 2**64). Two ranks' reads add up to the epoch's."""
    return sum(int.from_bytes(blake2b(i.encode(), digest_size=8).digest(), "big")
               for i in ids) % 2**64


def batch_count(rows: int, batch_size: int, full_only: bool) -> int:
    """The batches bucket_batches cuts ``rows`` shuffled rows into (pools of POOL
    batches), counting only full ones when ``full_only``."""
    pool = batch_size * POOL
    whole, rest = divmod(rows, pool)
    per_rest = rest // batch_size if full_only else -(-rest // batch_size)
    return whole * POOL + per_rest


@dataclass(frozen=True)
class TrainStream:
    """A rank's stream over a prepared training split (see the module's steps)."""

    shards: Shards
    batch_size: int  # this rank's rows a step: train.batch_size // world
    seed: int
    rank: int = 0
    world: int = 1
    buffer_rows: int = 32_768
    buckets: Edges | None = None
    char_limit: int = 16
    # a student's stream (`rcpipe distill`): each row group read with its teacher's targets
    teacher: TeacherTargets | None = None

    @classmethod
    def of(cls, out_dir: Path, batch_size: int, seed: int = 0, buckets: Edges | None = None,
           buffer_rows: int = 32_768) -> TrainStream:
        """One process's stream over ``out_dir``'s prepared training split (the benches and
        the GPU kit time the batches training makes)."""
        from rcpipe.data.dataset import char_limit_of
        from rcpipe.data.prepared import Prepared

        return cls(Prepared(out_dir).shards("train"), batch_size, seed,
                   buffer_rows=buffer_rows, buckets=buckets, char_limit=char_limit_of(out_dir))

    @property
    def full_only(self) -> bool:
        """With train.buckets every batch is full (the last, partial one of a pool is left
        out): an epoch has at most one shape per pair of bucket edges."""
        return self.buckets is not None

    def epoch(self, epoch: int) -> EpochPlan:
        units = self.shards.units()
        order = np.random.default_rng((self.seed + epoch, _UNITS)).permutation(len(units)) \
            if len(units) > 1 else np.zeros(len(units), dtype=np.int64)
        ranks = [self._buffers([units[i] for i in order], r) for r in range(self.world)]
        counts = [sum(batch_count(_rows(b), self.batch_size, self.full_only) for b in bufs)
                  for bufs in ranks]
        return EpochPlan(self, epoch, ranks[self.rank], min(counts, default=0))

    def _buffers(self, ordered: list[Unit], rank: int) -> list[list[Piece]]:
        """Rank ``rank``'s rows of the epoch's order, cut into buffers."""
        total = sum(u.rows for u in ordered)
        lo, hi = rank * total // self.world, (rank + 1) * total // self.world
        buffers: list[list[Piece]] = [[]]
        held, at = 0, 0
        for u in ordered:
            a, b = max(lo, at), min(hi, at + u.rows)  # this unit's rows in the rank's range
            at += u.rows
            while a < b:
                if held == self.buffer_rows:
                    buffers.append([])
                    held = 0
                take = min(b - a, self.buffer_rows - held)
                start = a - (at - u.rows)
                buffers[-1].append(Piece(u, start, start + take))
                held, a = held + take, a + take
        return [b for b in buffers if b]

    def read(self, buffer: list[Piece]) -> SquadDataset:
        """A buffer's rows in split order (rows of one row group read together)."""
        pieces = sorted(buffer, key=lambda p: (p.unit.first + p.lo))
        tables, cache = [], {}
        for p in pieces:
            if p.unit not in cache:
                rows = self.shards.read(p.unit)
                if self.teacher is not None:
                    rows = self.teacher.beside(p.unit, rows)
                cache = {p.unit: rows}  # one row group held at a time
            tables.append(cache[p.unit].slice(p.lo, p.hi - p.lo))
        return SquadDataset(pa.concat_tables(tables), char_limit=self.char_limit,
                            buckets=self.buckets)

    def buffer_seed(self, epoch: int, index: int) -> int | tuple[int, ...]:
        """The rows' shuffle of buffer ``index``: the first draws as a whole split's epoch
        did (seed + epoch), so a split that fits one buffer keeps its order."""
        base = self.seed + epoch
        return base if index == 0 else (base, index, self.rank)


def _rows(buffer: list[Piece]) -> int:
    return sum(p.hi - p.lo for p in buffer)


@dataclass(frozen=True)
class EpochPlan:
    """One epoch of a rank's stream: ``steps`` batches, the same count on every rank."""

    stream: TrainStream
    epoch: int
    buffers: list[list[Piece]]
    steps: int

    def __len__(self) -> int:
        return self.steps

    @property
    def rows(self) -> int:
        return sum(_rows(b) for b in self.buffers)

    def cut(self, index: int) -> tuple[SquadDataset, list[list[int]]]:
        """Buffer ``index`` read, and the batches (its row indices) it is cut into."""
        s = self.stream
        data = s.read(self.buffers[index])
        cut = bucket_batches(data.context_lengths(), s.batch_size, shuffle=True,
                             seed=s.buffer_seed(self.epoch, index), bucket_factor=POOL)
        return data, [b for b in cut if len(b) >= (s.batch_size if s.full_only else 1)]

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """This rank's batches from step ``start`` on: buffers before it are not read."""
        s, done = self.stream, 0
        for index, buffer in enumerate(self.buffers):
            n = batch_count(_rows(buffer), s.batch_size, s.full_only)
            if done + n <= start:
                done += n
                continue
            data, cut = self.cut(index)
            for i, indices in enumerate(cut):
                if done + i >= self.steps:
                    return
                if done + i >= start:
                    yield data.collate(indices)
            done += len(cut)
