"""rcpipe.data.stream: each rank's share of an epoch, read a buffer at a time, every row
once an epoch across the ranks, resumable at any step without reading what came before."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcpipe.data.dataset import SquadDataset, bucket_batches
from rcpipe.data.shards import Shards
from rcpipe.data.stream import TrainStream, batch_count
from tests.data.shard_rows import rows, split


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Shards:
    return split(tmp_path_factory.mktemp("stream") / "train", rows(1000), file_rows=300,
                 group_rows=64)


def _ids(stream: TrainStream, epoch: int, start: int = 0) -> list[list[str]]:
    return [b.ids for b in stream.epoch(epoch).batches(start)]


def test_a_split_that_fits_one_buffer_is_read_in_the_order_of_the_whole_split(
        shards: Shards) -> None:
    """What the in-memory loader did (every measured table was trained in this order)."""
    whole = SquadDataset(shards.read_all())
    for epoch in (0, 3):
        before = bucket_batches(whole.context_lengths(), 16, shuffle=True, seed=42 + epoch)
        want = [[whole.ids[i] for i in b] for b in before]
        assert _ids(TrainStream(shards, 16, seed=42), epoch) == want


@pytest.mark.parametrize("buckets", [None, ((8, 16, 40), (4, 8))])
@pytest.mark.parametrize("buffer_rows", [100, 4096])
def test_two_ranks_read_every_row_once_an_epoch_and_take_the_same_steps(
        shards: Shards, buckets, buffer_rows: int) -> None:
    ranks = [TrainStream(shards, 8, seed=7, rank=r, world=2, buffer_rows=buffer_rows,
                         buckets=buckets) for r in range(2)]
    plans = [s.epoch(1) for s in ranks]
    assert plans[0].steps == plans[1].steps > 0
    assert sum(p.rows for p in plans) == shards.rows  # each row is one rank's ...
    assert abs(plans[0].rows - plans[1].rows) <= 1
    seen = [[i for b in _ids(s, 1) for i in b] for s in ranks]
    assert all(len(ids) == len(set(ids)) for ids in seen)
    assert not set(seen[0]) & set(seen[1])  # ... and read by that rank alone
    batches = [_ids(s, 1) for s in ranks]
    assert len(batches[0]) == len(batches[1]) == plans[0].steps
    # what no step took: only the ranks' uneven tails (and with buckets the partial batch
    # each pool leaves), never more than that
    left = shards.rows - len(seen[0]) - len(seen[1])
    pools = sum(-(-p.rows // (8 * 50)) for p in plans) + 2 * len(plans[0].buffers)
    assert 0 <= left <= (pools * 8 if buckets else 8)
    if buckets:
        assert all(len(b) == 8 for bs in batches for b in bs)


def test_a_rank_holds_one_buffer_and_each_epoch_orders_the_row_groups_anew(
        shards: Shards) -> None:
    stream = TrainStream(shards, 8, seed=3, buffer_rows=100)
    plan = stream.epoch(0)
    assert all(sum(p.hi - p.lo for p in b) <= 100 for b in plan.buffers)
    assert len(plan.buffers) == 10
    first = [p.unit.first for p in plan.buffers[0]]
    assert first != sorted(first) or first != [p.unit.first for p in
                                                stream.epoch(1).buffers[0]]
    ids = [i for b in _ids(stream, 0) for i in b]
    assert len(ids) == len(set(ids)) == shards.rows  # no buckets: nothing left out
    assert _ids(stream, 0) != _ids(stream, 1)
    assert _ids(stream, 2) == _ids(TrainStream(shards, 8, seed=3, buffer_rows=100), 2)


@pytest.mark.parametrize("start", [0, 1, 13, 37, 60])
def test_a_resumed_stream_goes_on_at_its_step_and_reads_no_buffer_before_it(
        shards: Shards, start: int, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = TrainStream(shards, 8, seed=11, rank=1, world=2, buffer_rows=100)
    everything = _ids(stream, 4)
    assert start < len(everything)
    read: list[int] = []
    real = Shards.read

    def counted(self, unit, columns=None):  # noqa: ANN001, ANN202
        read.append(unit.first)
        return real(self, unit, columns)

    monkeypatch.setattr(Shards, "read", counted)
    assert _ids(stream, 4, start) == everything[start:]
    plan = stream.epoch(4)
    done, first_read = 0, None
    for buffer in plan.buffers:  # the buffer step `start` falls in
        n = batch_count(sum(p.hi - p.lo for p in buffer), 8, False)
        if done + n > start:
            first_read = buffer
            break
        done += n
    assert first_read is not None
    needed = {p.unit.first for b in plan.buffers[plan.buffers.index(first_read):] for p in b}
    assert set(read) <= needed


def test_batch_count_is_what_bucket_batches_cuts() -> None:
    import numpy as np

    for n in (0, 1, 7, 8, 399, 400, 401, 1234):
        lengths = np.arange(n) % 17
        cut = bucket_batches(lengths, 8, shuffle=True, seed=1)
        assert batch_count(n, 8, False) == len(cut)
        assert batch_count(n, 8, True) == sum(len(b) == 8 for b in cut)


def test_a_batch_smaller_than_the_workers_is_refused_when_the_params_load(tmp_path: Path
                                                                          ) -> None:
    from rcpipe.config import load_config
    from rcpipe.errors import InputError
    from tests.conftest import write_params

    for sets, key in ((["train.batch_size=2"], "train.batch_size"),
                      (["models.qanet.batch_size=3"], "models.qanet.batch_size")):
        params = write_params(tmp_path / "params.yaml", data={"train_file": "t", "dev_file":
                                                              "d"}, train={"num_workers": 4})
        with pytest.raises(InputError, match=f"{key}: .* cannot be shared by 4 workers"):
            load_config([params], sets)
