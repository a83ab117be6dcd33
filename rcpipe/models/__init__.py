"""Building a variant's model: rcpipe.variants.REGISTRY names the family module and builder.

A builder takes the variant's ModelConfig and the data-side facts (``ModelInputs``) and
returns an nn.Module whose ``forward(batch: Batch) -> SpanLogits`` (see layers.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from rcpipe.config import ModelConfig
from rcpipe.variants import REGISTRY, Variant

if TYPE_CHECKING:  # no torch for the report's view names (rcpipe.models.views)
    import numpy as np
    from torch import nn

    from rcpipe.models.views import ViewSpec


@dataclass(frozen=True)
class ModelInputs:
    word_vocab: int  # rows of the word embedding (vocab.json "words")
    char_vocab: int
    word_dim: int
    vectors: np.ndarray | None  # (word_vocab, word_dim) pretrained, or None: trainable
    no_answer: bool  # SQuAD v2.0: learn a no-answer logit
    # trained on pretrained vectors (kept in a model file, whose vectors are in its weights)
    pretrained: bool = False
    # ids 2 .. 1 + trained_words: training words the pretrained vectors lack, each given a
    # trainable row beside the frozen table (data.missing_vectors: train); 0 otherwise and
    # in a model file written before the setting existed
    trained_words: int = 0

    def __post_init__(self) -> None:
        if self.vectors is not None and not self.pretrained:
            object.__setattr__(self, "pretrained", True)


Builder = Callable[[ModelConfig, ModelInputs], "nn.Module"]


def _family(variant: str) -> tuple[ModuleType, Variant]:
    """The module that builds ``variant`` (rcpipe.variants.REGISTRY names it), imported."""
    if variant not in REGISTRY:
        raise KeyError(f"unknown variant {variant!r}; choose from {sorted(REGISTRY)}")
    entry = REGISTRY[variant]
    return importlib.import_module(entry.family), entry


def builder_of(variant: str) -> Builder:
    module, entry = _family(variant)
    builder: Builder = getattr(module, entry.builder)
    return builder


def views_of(variant: str) -> tuple[ViewSpec, ...]:
    """The attention views `rcpipe explain` shows for ``variant``: its family's VIEWS."""
    module, _ = _family(variant)
    views: tuple[ViewSpec, ...] = module.VIEWS[variant]
    return views


def build_model(variant: str, cfg: ModelConfig, inputs: ModelInputs) -> nn.Module:
    """The variant's model; with ``cfg.seeds`` > 1 that many networks answering as one
    (seed_mean.py): a trained model of several runs, each trained alone (train/seeds.py)."""
    if cfg.seeds > 1:
        from rcpipe.models.seed_mean import SeedMean

        one = cfg.model_copy(update={"seeds": 1})
        return SeedMean([builder_of(variant)(one, inputs) for _ in range(cfg.seeds)])
    return builder_of(variant)(cfg, inputs)
