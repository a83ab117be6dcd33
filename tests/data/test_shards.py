"""rcpipe.data.shards: a split as part files in row groups, and every way a part can be
wrong found in one located line (a cut file, another vocabulary, a lost row group)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rcpipe.data.prepared import Prepared
from rcpipe.data.shards import Shards
from rcpipe.errors import InputError
from tests.data.shard_rows import VOCAB, rows, split


def test_parts_and_row_groups_hold_at_most_their_rows_and_read_back_in_order(
        tmp_path: Path) -> None:
    table = rows(250)
    shards = split(tmp_path / "train", table, file_rows=100, group_rows=32)
    assert [p.name for p in shards.parts] == ["part-00000.parquet", "part-00001.parquet",
                                              "part-00002.parquet"]
    assert [p.groups for p in shards.parts] == [(32, 32, 32, 4), (32, 32, 32, 4),
                                                (32, 18)]
    assert shards.rows == 250 and sum(u.rows for u in shards.units()) == 250
    assert shards.read_all().equals(table)
    assert [u.first for u in shards.units()][:5] == [0, 32, 64, 96, 100]
    shards.check()


def test_rows_written_in_pieces_fill_the_same_groups(tmp_path: Path) -> None:
    table = rows(70)
    whole = split(tmp_path / "a", table, 1000, 16)
    folder = tmp_path / "b"
    folder.mkdir()
    from rcpipe.data.shards import SplitWriter

    w = SplitWriter(lambda n: folder / n, 1000, 16, VOCAB)
    for lo in range(0, 70, 9):  # an article's rows at a time
        w.write(table.slice(lo, 9))
    pieces = Shards.from_manifest(folder, w.close(), folder / "meta.json")
    assert pieces.parts == whole.parts and pieces.read_all().equals(table)


def test_an_empty_split_is_one_empty_part(tmp_path: Path) -> None:
    shards = split(tmp_path / "dev", rows(0), 100, 10)
    assert shards.rows == 0 and shards.read_all().num_rows == 0


@pytest.fixture
def three_parts(tmp_path: Path) -> Shards:
    return split(tmp_path / "train", rows(90), file_rows=30, group_rows=10)


def test_a_cut_part_is_one_line(three_parts: Shards) -> None:
    path = three_parts.path(1)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(InputError) as e:
        three_parts.check()
    assert e.value.file == str(path) and "not a readable Parquet file" in e.value.what
    assert "rcpipe prepare" in e.value.what


def test_a_part_from_another_vocabulary_is_one_line(three_parts: Shards, tmp_path: Path
                                                    ) -> None:
    other = split(tmp_path / "other", rows(30), 30, 10, vocab="cd" * 32)
    shutil.copy(other.path(0), three_parts.path(2))
    with pytest.raises(InputError) as e:
        three_parts.check()
    assert e.value.file == str(three_parts.path(2))
    assert e.value.location == "footer rcpipe.vocab" and "another vocabulary" in e.value.what


def test_a_missing_row_group_is_one_line(three_parts: Shards) -> None:
    path = three_parts.path(0)
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 20), path, row_group_size=10)  # its last group lost
    with pytest.raises(InputError) as e:
        three_parts.read(three_parts.units()[0])
    assert e.value.file == str(path) and e.value.location == "row group 2"
    assert "missing" in e.value.what and "3 row groups" in e.value.what


def test_a_missing_part_is_one_line(three_parts: Shards) -> None:
    three_parts.path(1).unlink()
    with pytest.raises(InputError, match="a part of the split is missing"):
        three_parts.check()


@pytest.mark.parametrize("name", ["../outside.parquet", ".hidden.parquet", "x.json", 7])
def test_a_manifest_naming_a_file_outside_its_folder_is_refused(tmp_path: Path, name) -> None:
    record = {"vocab": VOCAB, "parts": [{"file": name, "groups": [1]}]}
    with pytest.raises(InputError) as e:
        Shards.from_manifest(tmp_path / "train", record, tmp_path / "meta.json")
    assert e.value.location == "splits.train" and "not a manifest" in e.value.what


def test_a_folder_prepared_by_an_older_rcpipe_is_refused_with_what_to_do(tmp_path: Path
                                                                        ) -> None:
    old = Prepared(tmp_path)
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    old.meta_file.write_text(json.dumps({"words": 3, "heldout": None}))
    with pytest.raises(InputError) as e:
        old.shards("train")
    assert e.value.file == str(old.meta_file) and e.value.location == "layout"
    assert "run `rcpipe prepare` again" in e.value.what
