"""The five variants are named alike everywhere a list of them lives."""

from __future__ import annotations

import typing
from pathlib import Path

import yaml

from rcpipe.config import PAPERS, VARIANTS, ModelsConfig
from rcpipe.models import _registry
from rcpipe.report.attention import VIEWS

ROOT = Path(__file__).resolve().parents[1]


def test_every_list_of_variants_is_the_same() -> None:
    from flows.train_all import Variant

    names = set(VARIANTS)
    assert set(_registry()) == names  # the model registry
    assert set(ModelsConfig.model_fields) == names  # the params sections
    assert set(PAPERS) == names  # the papers' settings
    assert set(typing.get_args(Variant)) == names  # the flow's parameter type
    assert set(VIEWS) == names  # the attention views of `rcpipe explain`
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in ("train", "evaluate"):
        assert set(stages[stage]["foreach"]) == names
