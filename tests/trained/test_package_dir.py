"""A package (trained/package_dir.py) loads back to the model it was made from; a file changed after
packaging, or a config that does not describe the weights, is one located refusal."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from rcpipe.errors import InputError
from rcpipe.trained.package_dir import (
    CONFIG,
    THRESHOLD,
    VOCAB,
    WEIGHTS,
    is_package,
    load_package,
)
from tests.conftest import Prepared, write_package


def _refusal(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_package(path)
    assert "\n" not in info.value.line()
    return info.value


def test_a_package_loads_back_to_its_model(prepared: Prepared, tmp_path: Path) -> None:
    from rcpipe.data.dataset import SquadDataset

    model = write_package(prepared, tmp_path / "pkg")
    assert is_package(tmp_path / "pkg") and not is_package(tmp_path)
    assert (tmp_path / "pkg" / WEIGHTS).read_bytes()[8:9] == b"{"  # safetensors, no pickle
    pkg = load_package(tmp_path / "pkg")
    assert pkg.variant == "qanet" and pkg.na_threshold is None and pkg.max_answer_len == 3
    assert pkg.length_prior is not None and pkg.length_prior.tolist() == [0.5, 0.25, 0.25]
    assert pkg.vocab == json.loads((prepared.out_dir / "vocab.json").read_text())
    mine, theirs = pkg.model.state_dict(), model.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    batch = SquadDataset.from_parquet(prepared.out_dir / "dev").collate([0, 1])
    with torch.no_grad():
        a, b = pkg.model(batch), model(batch)
    assert torch.equal(a.start, b.start) and torch.equal(a.end, b.end)


def test_a_v2_package_carries_its_threshold(prepared: Prepared, tmp_path: Path) -> None:
    write_package(prepared, tmp_path / "pkg", threshold={"na_threshold": 0.3, "fixed": False})
    assert load_package(tmp_path / "pkg").na_threshold == 0.3
    (tmp_path / "pkg" / THRESHOLD).write_text('{"na_threshold": 0.9}\n')
    err = _refusal(tmp_path / "pkg")
    assert err.file.endswith(THRESHOLD) and "sha256" in err.what


@pytest.mark.parametrize("name", [WEIGHTS, VOCAB])
def test_a_file_changed_after_packaging_is_refused(prepared: Prepared, tmp_path: Path,
                                                   name: str) -> None:
    write_package(prepared, tmp_path / "pkg")
    data = bytearray((tmp_path / "pkg" / name).read_bytes())
    data[-2] ^= 1  # one bit of the last weight (or the vocabulary)
    (tmp_path / "pkg" / name).write_bytes(bytes(data))
    err = _refusal(tmp_path / "pkg")
    assert err.file == str(tmp_path / "pkg" / name)
    assert "sha256" in err.what and "changed after packaging" in err.what


def test_a_config_that_does_not_describe_the_weights_is_refused(prepared: Prepared,
                                                                tmp_path: Path) -> None:
    write_package(prepared, tmp_path / "pkg")
    path = tmp_path / "pkg" / CONFIG
    original = json.loads(path.read_text())
    for change, where in ((lambda c: c["model_config"].update(hidden=12), "state_dict"),
                          (lambda c: c.update(variant="bidaf"), "state_dict"),
                          (lambda c: c.update(variant="bert"), "variant"),
                          (lambda c: c.update(format="rcpipe-package/9"), "format"),
                          (lambda c: c.pop("sha256"), "sha256")):
        config = json.loads(json.dumps(original))
        change(config)
        path.write_text(json.dumps(config))
        assert _refusal(tmp_path / "pkg").location == where
    (tmp_path / "pkg" / WEIGHTS).unlink()
    assert "not an rcpipe package" in _refusal(tmp_path / "pkg").what


@pytest.mark.parametrize("key", ["words", "chars"])
def test_a_vocabulary_longer_than_its_embedding_is_refused(prepared: Prepared, tmp_path: Path,
                                                           key: str) -> None:
    """vocab.json grown past the embedding's rows and re-pinned in config.json (the sha256
    passes): refused at load, where it loaded and a question holding the new entry died
    with an IndexError."""
    write_package(prepared, tmp_path / "pkg")
    vocab = json.loads((tmp_path / "pkg" / VOCAB).read_text())
    rows = len(vocab[key])
    vocab[key].append("\u2603" if key == "chars" else "snowman")
    (tmp_path / "pkg" / VOCAB).write_text(json.dumps(vocab))
    config = json.loads((tmp_path / "pkg" / CONFIG).read_text())
    config["sha256"][VOCAB] = hashlib.sha256((tmp_path / "pkg" / VOCAB).read_bytes()).hexdigest()
    (tmp_path / "pkg" / CONFIG).write_text(json.dumps(config))
    err = _refusal(tmp_path / "pkg")
    assert (err.file, err.location) == (str(tmp_path / "pkg" / VOCAB), key)
    assert err.what.startswith(f"{rows + 1:,} entries, over the {rows:,} rows of the model's "
                               f"{key[:-1]} embedding"), err.what


def test_a_length_prior_shorter_than_the_longest_answer_is_refused(prepared: Prepared,
                                                                   tmp_path: Path) -> None:
    """A prior of 3 lengths beside max_answer_len 12 loaded, and its first answer died with
    a RuntimeError in decode (a tensor of 12 against one of 3)."""
    write_package(prepared, tmp_path / "pkg")
    path = tmp_path / "pkg" / CONFIG
    config = json.loads(path.read_text())
    config["decoding"] |= {"max_answer_len": 12, "length_prior": [0.5, 0.3, 0.2]}
    path.write_text(json.dumps(config))
    err = _refusal(tmp_path / "pkg")
    assert (err.file, err.location) == (str(path), "decoding")
    assert err.what == "length_prior has 3 entries, fewer than max_answer_len (12)"
