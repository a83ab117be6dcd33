"""rcpipe.data.prepared: the prepared directory's files, what they say, and what a training
run takes of them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from rcpipe.config import ReadLimits
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError


def test_every_file_prepare_wrote_is_one_of_its_files(prepared) -> None:
    d = Prepared.of(prepared.cfg)
    assert d.out_dir == prepared.out_dir and d.limits == prepared.cfg.limits
    written = {p for p in prepared.out_dir.iterdir() if not p.name.startswith(".")}
    folders = {d.split(s) for s in Prepared.SPLITS}
    assert written <= set(d.files()) | folders
    parts = {p for f in folders & written for p in f.iterdir()}
    assert parts and parts <= set(d.files())  # the parts too: a later run removes extra ones
    assert {d.train, d.dev, d.vocab_file, d.meta_file, d.report} <= written
    assert [d.split(s) for s in ("train", "dev", "heldout")] == \
        [d.train, d.dev, d.heldout_parquet]


def test_what_the_files_say(prepared) -> None:
    d = Prepared(prepared.out_dir)
    meta = json.loads(d.meta_file.read_text())
    assert d.meta() == meta and d.vocab() == json.loads(d.vocab_file.read_text())
    assert d.vocab_digest() == hashlib.sha256(d.vocab_file.read_bytes()).hexdigest()
    assert (d.word_vectors() is None) == (not d.word_emb.is_file())
    held = d.heldout()
    assert held is not None and meta["heldout"]["source"] == held.source == "heldout"
    assert (held.parquet, held.doc) == (d.heldout_parquet, d.heldout_doc)


def test_its_json_is_read_within_the_limits(prepared) -> None:
    d = Prepared(prepared.out_dir, ReadLimits(json_mb=1e-6))  # one byte
    for read in (d.vocab, d.meta, d.vocab_digest):
        with pytest.raises(InputError, match="limits.json_mb"):
            read()


def test_a_set_with_nothing_held_out_has_no_heldout(prepared, tmp_path: Path) -> None:
    d = Prepared(prepared.out_dir)
    assert d.heldout() is not None
    bare = Prepared(tmp_path)
    for split in ("train", "dev"):
        shutil.copytree(d.split(split), bare.split(split))
    shutil.copy(d.vocab_file, bare.vocab_file)
    meta = d.meta()
    del meta["splits"]["heldout"]
    bare.meta_file.write_text(json.dumps(meta | {"heldout": None}))
    assert bare.heldout() is None  # no held-out rows: nothing to rank on but dev


def test_what_a_job_takes(prepared) -> None:
    d = Prepared(prepared.out_dir)
    assert d.job_fields() == {"train_path": str(d.train), "dev_path": str(d.dev),
                              "vocab_sha256": d.vocab_digest()}


def test_no_heldout_record_or_no_meta_is_no_heldout(tmp_path: Path) -> None:
    d = Prepared(tmp_path)
    assert d.heldout() is None  # no meta.json: data older than the held-out slice
    d.meta_file.write_text(json.dumps({"heldout": None}))
    d.heldout_parquet.mkdir()
    assert d.heldout() is None
