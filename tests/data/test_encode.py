"""Raw text encodes to exactly the rows `rcpipe prepare` wrote for the dev split."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from rcpipe.data.dataset import SquadDataset
from rcpipe.data.encode import TextEncoder, token_spans
from rcpipe.data.squad import load_squad
from tests.conftest import Prepared


def _encoder(prepared: Prepared) -> TextEncoder:
    vocab = json.loads((prepared.out_dir / "vocab.json").read_text())
    return TextEncoder.from_vocab(vocab, prepared.cfg.data.limits.char)


def test_a_squad_file_encodes_as_the_prepared_dev_split(prepared: Prepared) -> None:
    dev = load_squad(str(prepared.data.dev), prepared.cfg.data.cache_dir)
    ds = _encoder(prepared).squad(dev)
    on_disk = SquadDataset(pq.read_table(prepared.out_dir / "dev"))
    assert ds.ids == on_disk.ids
    for i in range(len(ds)):  # one row at a time: no padding to another row's length
        a, b = ds.collate([i]), on_disk.collate([i])
        for name in ("cw", "cc", "qw", "qc", "y1", "y2"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (i, name)
        assert token_spans(ds, i) == token_spans(on_disk, i)


def test_pairs_keep_the_character_offsets(prepared: Prepared) -> None:
    context = "  The Eiffel Tower  is in Paris, France. "
    ds = _encoder(prepared).pairs([(context, "Where is it?"), ("x", "y")], para_limit=4)
    assert ds.ids == ["0", "1"]
    spans = token_spans(ds, 0)
    assert [context[a:b] for a, b in spans] == ["The", "Eiffel", "Tower", "is"]
    assert ds.char_span(0, 1, 2) == (6, 18)
    batch = ds.collate([0, 1])
    assert tuple(batch.cw.shape) == (2, 4) and batch.c_mask.sum().item() == 5
    assert (batch.y1 == -1).all()
