"""Rows in the prepared schema, written as a split of parts (no tokenizer): for the shard
and stream tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from rcpipe.data.schema import SCHEMA
from rcpipe.data.shards import Shards, SplitWriter

VOCAB = "ab" * 32


def rows(n: int, seed: int = 0, first: int = 0) -> pa.Table:
    """``n`` rows with ids q<first>.., contexts of 3-40 tokens, answers inside them."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {f.name: [] for f in SCHEMA}
    for i in range(first, first + n):
        lc, lq = int(rng.integers(3, 40)), int(rng.integers(2, 8))
        y1 = int(rng.integers(0, lc))
        cols["id"].append(f"q{i}")
        cols["title"].append("t")
        cols["context"].append("w " * lc)
        cols["question"].append("q " * lq)
        cols["context_word_ids"].append(rng.integers(2, 50, lc).tolist())
        cols["context_char_ids"].append([[3, 4]] * lc)
        cols["context_starts"].append([2 * t for t in range(lc)])
        cols["context_ends"].append([2 * t + 1 for t in range(lc)])
        cols["question_word_ids"].append(rng.integers(2, 50, lq).tolist())
        cols["question_char_ids"].append([[5]] * lq)
        cols["y1"].append(y1)
        cols["y2"].append(min(lc - 1, y1 + 2))
        cols["is_impossible"].append(False)
        cols["answers"].append(["w"])
    return pa.table(cols, schema=SCHEMA)


def split(folder: Path, table: pa.Table, file_rows: int, group_rows: int,
          vocab: str = VOCAB) -> Shards:
    """``table`` written as parts in ``folder``; the Shards its manifest names."""
    folder.mkdir(parents=True, exist_ok=True)
    with SplitWriter(lambda name: folder / name, file_rows, group_rows, vocab) as writer:
        writer.write(table)
        return Shards.from_manifest(folder, writer.close(), folder / "meta.json")
