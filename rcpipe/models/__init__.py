"""The model registry: variant name -> builder. ``rcpipe train VARIANT`` looks names up here.

A builder takes the variant's ModelConfig and the data-side facts (``ModelInputs``) and
returns an nn.Module whose ``forward(batch: Batch) -> SpanLogits`` (see layers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import nn

from rcpipe.config import ModelConfig


@dataclass(frozen=True)
class ModelInputs:
    word_vocab: int  # rows of the word embedding (vocab.json "words")
    char_vocab: int
    word_dim: int
    vectors: np.ndarray | None  # (word_vocab, word_dim) pretrained, or None: trainable
    no_answer: bool  # SQuAD v2.0: learn a no-answer logit
    # trained on pretrained vectors (kept in a model file, whose vectors are in its weights)
    pretrained: bool = False

    def __post_init__(self) -> None:
        if self.vectors is not None and not self.pretrained:
            object.__setattr__(self, "pretrained", True)


Builder = Callable[[ModelConfig, ModelInputs], nn.Module]


def _registry() -> dict[str, Builder]:
    from rcpipe.models import bidaf, qanet, rnet

    return {
        "bidaf": bidaf.build_bidaf,
        "bidaf_selfattn": bidaf.build_bidaf_selfattn,
        "rnet": rnet.build_rnet,
        "rnet_mult": rnet.build_rnet_mult,
        "qanet": qanet.build_qanet,
    }


def build_model(variant: str, cfg: ModelConfig, inputs: ModelInputs) -> nn.Module:
    registry = _registry()
    if variant not in registry:
        raise KeyError(f"unknown variant {variant!r}; choose from {sorted(registry)}")
    return registry[variant](cfg, inputs)
