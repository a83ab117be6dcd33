"""rcpipe/stages/fetch.py: the sources checked against data.sha256 and their manifest."""

from __future__ import annotations

import hashlib
import json

import pytest

from rcpipe.errors import InputError
from rcpipe.stages.fetch import check_pin, fetch, sources
from tests.conftest import SynthData


def test_fetch_verifies_pins_and_writes_the_manifest(make_config, synth_v1: SynthData
                                                     ) -> None:  # noqa: ANN001
    digest = hashlib.sha256(synth_v1.dev.read_bytes()).hexdigest()
    cfg = make_config(synth_v1, data={"sha256": {str(synth_v1.dev): digest.upper()}})
    assert sources(cfg) == {"train": str(synth_v1.train), "dev": str(synth_v1.dev)}
    manifest = fetch(cfg)
    assert manifest["dev"] == {"uri": str(synth_v1.dev), "sha256": digest,
                               "bytes": synth_v1.dev.stat().st_size, "pinned": True}
    assert not manifest["train"]["pinned"]
    assert json.loads((cfg.data.cache_dir / "sources.json").read_text()) == manifest

    bad = make_config(synth_v1, data={"sha256": {str(synth_v1.train): "0" * 64}})
    with pytest.raises(InputError) as e:
        fetch(bad)
    assert e.value.file == str(synth_v1.train) and "does not match data.sha256" in e.value.what
    check_pin("https://x/y.json", "f" * 64, {})  # unpinned: accepted
