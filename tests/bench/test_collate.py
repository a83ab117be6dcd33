"""bench/collate.py: the host's collate of a training batch timed on a prepared split, its
distinct-word lists within it."""

from __future__ import annotations

import json
from pathlib import Path

from bench.collate import main
from tests.conftest import Prepared


def test_a_collate_is_timed_with_its_distinct_words_inside_it(prepared: Prepared,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "collate.json"
    assert main(["--prepared", str(prepared.out_dir), "--batch", "4", "--batches", "6",
                 "--set", "train.buckets.context=[48, 96, 144, 400]",
                 "--set", "train.buckets.question=[12, 50]", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["batches"] == 6 and got["batch"] == 4
    # timed apart, each a median: both there, not ordered (a loaded CI machine's noise)
    assert got["distinct_words_ms"] > 0 and got["collate_ms"] > 0
    # padding is one of the distinct words; words repeat across a batch's tokens
    assert 1 < got["distinct_words"] < got["tokens"]
    assert got["examples_per_s_one_thread"] == 4e3 / got["collate_ms"]
