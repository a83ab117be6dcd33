"""Prepared Parquet -> padded, masked batches; length bucketing; unreadable files."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from rcpipe import stages
from rcpipe.config import Config
from rcpipe.data.dataset import (
    SquadDataset,
    ahead,
    answer_length_prior,
    bucket_batches,
    iterate,
    read_table,
)
from rcpipe.data.prepared import Prepared as PreparedDir
from tests.conftest import Prepared, SynthData


@pytest.fixture(scope="module")
def train(prepared: Prepared) -> SquadDataset:
    return SquadDataset.from_parquet(prepared.out_dir / "train")


def test_reads_back(prepared: Prepared, train: SquadDataset) -> None:
    table = read_table(prepared.out_dir / "train")
    assert len(train) == table.num_rows == prepared.report["train"]["kept"]
    assert train.ids == table.column("id").to_pylist()
    lengths = [len(x) for x in table.column("context_word_ids").to_pylist()]
    np.testing.assert_array_equal(train.context_lengths(), lengths)
    row = table.slice(3, 1).to_pylist()[0]
    np.testing.assert_array_equal(train.cw.row(3), row["context_word_ids"])
    np.testing.assert_array_equal(train.qw.row(3), row["question_word_ids"])
    assert [list(x) for x in train.cc.row(3)] == row["context_char_ids"]
    assert train.answer_text(3, row["y1"], row["y2"]) == row["answers"][0]


def test_collate_shapes_masks_and_padding(prepared: Prepared, train: SquadDataset) -> None:
    table = read_table(prepared.out_dir / "train").to_pylist()
    indices = [0, 5, 2, len(train) - 1]
    b = train.collate(indices)
    n = len(indices)
    c_len = [len(table[i]["context_word_ids"]) for i in indices]
    q_len = [len(table[i]["question_word_ids"]) for i in indices]
    lc, lq = max(c_len), max(q_len)
    assert len(b) == n and b.ids == [table[i]["id"] for i in indices]
    # words padded to the batch's longest (at most the char limit, 16)
    width = min(16, max(len(w) for i in indices for w in
                        table[i]["context_char_ids"] + table[i]["question_char_ids"]))
    assert b.cw.shape == (n, lc) and b.cc.shape == (n, lc, width)
    assert b.qw.shape == (n, lq) and b.qc.shape == (n, lq, width)
    train.buckets = ((lc + 3,), (lq + 2,))  # fixed shapes: every word the char limit wide
    fixed = train.collate(indices)
    train.buckets = None
    assert fixed.cc.shape == (n, lc + 3, 16) and fixed.qc.shape == (n, lq + 2, 16)
    assert torch.equal(fixed.cc[:, :lc, :width], b.cc) and fixed.cc[..., width:].eq(0).all()
    assert b.cw.dtype == b.cc.dtype == torch.int64
    assert b.c_mask.dtype == torch.bool and b.c_mask.shape == (n, lc)
    assert b.c_mask.sum(1).tolist() == c_len and b.q_mask.sum(1).tolist() == q_len
    for k, i in enumerate(indices):
        row = table[i]
        assert b.cw[k, : c_len[k]].tolist() == row["context_word_ids"]
        assert b.cw[k, c_len[k]:].eq(0).all() and b.cc[k, c_len[k]:].eq(0).all()
        assert b.qw[k, q_len[k]:].eq(0).all() and b.qc[k, q_len[k]:].eq(0).all()
        for t, chars in enumerate(row["context_char_ids"]):
            assert b.cc[k, t, : len(chars)].tolist() == chars
            assert b.cc[k, t, len(chars):].eq(0).all()
        assert b.qw[k, : q_len[k]].tolist() == row["question_word_ids"]
        for t, chars in enumerate(row["question_char_ids"]):
            assert b.qc[k, t, : len(chars)].tolist() == chars
            assert b.qc[k, t, len(chars):].eq(0).all()
        assert (b.y1[k].item(), b.y2[k].item()) == (row["y1"], row["y2"])
        assert 0 <= b.y1[k] <= b.y2[k] < c_len[k]
    assert not b.is_impossible.any()


def test_collate_char_limit(train: SquadDataset) -> None:
    b = train.collate([0, 1], char_limit=2)
    assert b.cc.shape[2] == 2 and b.qc.shape[2] == 2
    full = train.collate([0, 1])
    assert torch.equal(b.cc, full.cc[..., :2])


def test_para_limit_truncates_and_drops_labels(prepared: Prepared, train: SquadDataset) -> None:
    y2 = train.y2
    limit = int(np.median(y2)) + 1  # some answers end inside it, some past it
    short = SquadDataset.from_parquet(prepared.out_dir / "train", para_limit=limit)
    indices = list(range(len(short)))
    b = short.collate(indices)
    assert b.cw.shape[1] == limit
    assert short.context_lengths().max() == limit
    full = train.collate(indices)
    assert torch.equal(b.cw, full.cw[:, :limit])
    assert torch.equal(b.cc, full.cc[:, :limit])
    inside = torch.from_numpy(y2 < limit)
    assert inside.any() and (~inside).any()
    assert torch.equal(b.y1[inside], full.y1[inside]) and torch.equal(b.y2[inside], full.y2[inside])
    assert b.y1[~inside].eq(-1).all() and b.y2[~inside].eq(-1).all()
    assert (b.y2 < limit).all()


def test_impossible_rows(make_config: Callable[..., Config], synth_v2: SynthData) -> None:
    cfg = make_config(synth_v2)
    stages.prepare(cfg)
    ds = SquadDataset.from_parquet(cfg.data.out_dir / "train")
    b = next(iterate(ds, [list(range(len(ds)))]))
    assert b.is_impossible.any() and (~b.is_impossible).any()
    assert b.y1[b.is_impossible].eq(-1).all() and b.y2[b.is_impossible].eq(-1).all()
    assert (b.y1[~b.is_impossible] >= 0).all()


def test_batch_to(train: SquadDataset) -> None:
    b = train.collate([0, 1]).to("cpu")
    assert b.cw.device.type == "cpu" and b.ids == train.ids[:2]


# ----------------------------------------------------------------------------------- buckets


def _lengths(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(5, 400, size=n)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("n", "batch_size"), [(1000, 32), (7, 3), (5, 10), (0, 4)])
def test_bucket_batches_cover_every_index_once(n: int, batch_size: int, shuffle: bool) -> None:
    batches = bucket_batches(_lengths(n), batch_size, shuffle, seed=1, bucket_factor=4)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(n))
    assert all(1 <= len(b) <= batch_size for b in batches)
    assert len(batches) == -(-n // batch_size)  # pools are whole batches: one short at most


def test_bucket_batches_tighter_than_random() -> None:
    lengths = _lengths()
    batches = bucket_batches(lengths, 32, shuffle=True, seed=0, bucket_factor=10)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(lengths))
    random_batches = [order[i : i + 32] for i in range(0, len(order), 32)]

    def spread(bs: list) -> float:
        return float(np.mean([np.ptp(lengths[np.asarray(b)]) for b in bs]))

    assert spread(batches) < spread(random_batches) / 4


def test_bucket_batches_deterministic_per_seed() -> None:
    lengths = _lengths()
    a = bucket_batches(lengths, 32, shuffle=True, seed=5)
    assert a == bucket_batches(lengths, 32, shuffle=True, seed=5)
    assert a != bucket_batches(lengths, 32, shuffle=True, seed=6)


def test_bucket_batches_without_shuffle_sorted() -> None:
    lengths = _lengths(100)
    flat = [i for b in bucket_batches(lengths, 8, shuffle=False) for i in b]
    assert list(lengths[flat]) == sorted(lengths)
    assert flat == list(np.argsort(lengths, kind="stable"))


def test_ahead_yields_everything_in_order_and_raises_what_the_producer_raised() -> None:
    assert list(ahead(iter(range(50)), depth=2)) == list(range(50))

    def broken():  # noqa: ANN202
        yield 1
        raise ValueError("bad row")

    got = []
    with pytest.raises(ValueError, match="bad row"):
        for item in ahead(broken()):
            got.append(item)
    assert got == [1]


def test_ahead_stops_its_thread_when_the_loop_stops_early() -> None:
    import threading

    produced = []

    def items():  # noqa: ANN202
        for i in range(1000):
            produced.append(i)
            yield i

    for i in ahead(items(), depth=2):
        if i == 3:
            break
    assert not any(t.name == "rcpipe-batches-ahead" for t in threading.enumerate())
    assert len(produced) < 10  # it ran at most a few items ahead, never the whole source



def test_answer_length_prior(prepared: Prepared, train: SquadDataset) -> None:
    shards = PreparedDir(prepared.out_dir).shards("train")
    prior = answer_length_prior(shards, 15)
    assert prior.shape == (15,) and prior.min() > 0
    assert float(prior.sum()) == pytest.approx(1.0, abs=1e-5)
    lengths = train.y2[train.y1 >= 0] - train.y1[train.y1 >= 0]
    assert int(prior.argmax()) == int(np.bincount(lengths[lengths < 15]).argmax())


def test_the_char_limit_prepare_used_travels_with_the_dataset(
        make_config: Callable[..., Config], synth_v1: SynthData) -> None:
    cfg = make_config(synth_v1, data={"limits": {"char": 5}})
    stages.prepare(cfg)
    ds = SquadDataset.from_parquet(cfg.data.out_dir / "train")
    assert ds.char_limit == 5 and ds.collate([0, 1]).cc.shape[2] <= 5


def test_batches_list_their_distinct_words(train: SquadDataset) -> None:
    """Bucketed too: the models run their embedding once per distinct (word id, chars) pair
    in eager mode (a compiled step runs it per token and never reads them)."""
    for buckets in (None, ((400,), (50,))):
        train.buckets = buckets
        try:
            batch = train.collate(list(range(8)))
        finally:
            train.buckets = None
        assert batch.words is not None and batch.cu is not None and batch.qu is not None
        assert torch.equal(batch.words[batch.cu], batch.cc)  # (B, Lc, W) every token's chars
        assert torch.equal(batch.words[batch.qu], batch.qc)
        assert batch.word_ids is not None
        assert torch.equal(batch.word_ids[batch.cu], batch.cw)  # (B, Lc) and its word ids
        assert torch.equal(batch.word_ids[batch.qu], batch.qw)
        pairs = torch.cat([batch.word_ids[:, None], batch.words], dim=1)  # (U, 1 + W)
        assert len(torch.unique(pairs, dim=0)) == len(pairs)  # each (word, chars) once
        tokens = batch.cc.shape[0] * batch.cc.shape[1] + batch.qc.shape[0] * batch.qc.shape[1]
        assert len(batch.words) < tokens / 2  # words repeat: far fewer rows to embed
