"""rcpipe.data.teacher: a teacher's targets beside the training split, row group for row
group, and what a stream with them hands the student."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rcpipe.data.shards import Shards
from rcpipe.data.stream import TrainStream
from rcpipe.data.teacher import RECORD, TeacherTargets, write
from rcpipe.errors import InputError
from tests.data.shard_rows import rows, split


def _made_up(rows: pa.Table) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A distribution a row that names the row: p_start peaks on the token its id's number
    mod its length picks, p_end one token later (or the no-answer position)."""
    for qid, words in zip(rows.column("id").to_pylist(),
                          rows.column("context_word_ids").to_pylist(), strict=True):
        n = 1 + len(words)
        p1, p2 = np.full(n, 0.1 / n, np.float32), np.full(n, 0.1 / n, np.float32)
        at = 1 + int(qid[1:]) % len(words)
        p1[at] += 0.9
        p2[(at + 1) % n] += 0.9
        yield p1, p2


@pytest.fixture(scope="module")
def train(tmp_path_factory: pytest.TempPathFactory) -> Shards:
    return split(tmp_path_factory.mktemp("teacher") / "train", rows(300), file_rows=128,
                 group_rows=40)


@pytest.fixture(scope="module")
def targets(train: Shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("targets") / "teacher"
    seen: list[int] = []
    write(folder, train, _made_up, {"method": "vote", "members": ["a", "b"]}, seen.append)
    assert sum(seen) == train.rows and len(seen) == len(train.units())
    return folder


def test_the_targets_are_cut_as_the_training_split_and_name_their_teacher(
        train: Shards, targets: Path) -> None:
    import pyarrow.parquet as pq

    for part in train.parts:
        meta = pq.ParquetFile(targets / part.name).metadata
        assert tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups)) == \
            part.groups
    opened = TeacherTargets.open(targets, train)
    assert opened.about == {"method": "vote", "members": ["a", "b"]}


def test_a_stream_hands_each_row_its_own_targets_over_no_answer_and_its_tokens(
        train: Shards, targets: Path) -> None:
    stream = TrainStream(train, 16, seed=3, teacher=TeacherTargets.open(targets, train),
                         buffer_rows=100)
    plain = TrainStream(train, 16, seed=3, buffer_rows=100)
    seen = 0
    for batch, same in zip(stream.epoch(0).batches(), plain.epoch(0).batches(), strict=True):
        assert batch.ids == same.ids and batch.teacher_start is not None  # the same order
        assert same.teacher_start is None and batch.teacher_end is not None
        lc = batch.cw.shape[1]
        assert batch.teacher_start.shape == batch.teacher_end.shape == (len(batch), 1 + lc)
        for b, qid in enumerate(batch.ids):
            n = int(batch.c_mask[b].sum())
            p1 = batch.teacher_start[b].numpy()
            assert p1[1 + n:].sum() == 0 and abs(p1.sum() - 1) < 1e-5  # padding: 0
            assert p1.argmax() == 1 + int(qid[1:]) % n  # this row's, not another's
        seen += len(batch)
    assert seen == train.rows


def test_targets_of_another_preparation_or_rows_are_one_line(
        train: Shards, targets: Path, tmp_path: Path) -> None:
    other = split(tmp_path / "other", rows(300, seed=1), file_rows=128, group_rows=50)
    with pytest.raises(InputError) as e:
        TeacherTargets.open(targets, other)
    assert str(e.value).startswith(f"error: {targets / RECORD}: train: the targets of "
                                   "another preparation")
    # the same cut of other rows: the manifests agree, the ids do not
    moved = split(tmp_path / "moved", rows(300, first=1000), file_rows=128, group_rows=40)
    stream = TrainStream(moved, 16, seed=3, teacher=TeacherTargets.open(targets, moved))
    with pytest.raises(InputError, match="not the targets of the training rows"):
        next(stream.epoch(0).batches())
    with pytest.raises(InputError, match="no teacher's targets here"):
        TeacherTargets.open(tmp_path / "none", train)
