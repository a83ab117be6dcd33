"""Fixtures of the training tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcpipe import stages
from rcpipe.config import Config
from tests.conftest import SynthData


@pytest.fixture
def prepared_here(make_config: Callable[..., Config], synth_v1: SynthData, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Callable[..., Config]:
    """The test works in tmp_path (models/ lands there); ``prepared_here(train=..., models=...)``
    is make_config's Config on synth_v1 with its data prepared."""
    monkeypatch.chdir(tmp_path)

    def make(**sections: dict[str, Any]) -> Config:
        cfg = make_config(synth_v1, **sections)
        stages.prepare(cfg)
        return cfg

    return make
