"""The variants rcpipe trains: one registry entry each, the list every other list comes from.

An entry names the module that builds the model (its *family*: it holds the builder and the
variant's attention views, ``VIEWS``) and the paper's settings. From ``REGISTRY`` come
``config.VARIANTS``, the params file's ``models.<variant>`` sections (``config.ModelsConfig``,
each laid over its paper here), ``models.build_model``, ``models.views_of``, the flow's
``Variant`` parameter type and the report's columns. dvc.yaml's ``foreach`` lists name the
variants the DVC pipeline trains (tests/test_variants.py keeps them equal).

Adding a variant: a family module (or a builder in one), an entry below, a test
(docs/architecture.md, "Adding a variant", works one through). No torch here: the config,
and so ``rcpipe --help``, import this file.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# the model `rcpipe distill` trains: one network (distill.student's variant) whose files sit
# beside the variants' under this name, models/student/ (a name no variant may take)
STUDENT = "student"


@dataclass(frozen=True)
class Variant:
    name: str  # the params section (models.<name>), CLI argument and file names
    family: str  # the module that builds it, and declares its VIEWS: "rcpipe.models.bidaf"
    builder: str  # the function in ``family``: (ModelConfig, ModelInputs) -> nn.Module
    # the paper's settings: a params file's models.<name> is laid over them key by key, at
    # any depth; what neither names takes ModelConfig's defaults
    paper: Mapping[str, Any]
    cite: str = ""  # the paper, as a package's model card names it (rcpipe package)
    # `rcpipe tune`'s default search space (config.VariantSearch): dotted keys under
    # models.<name>; a params file's tune.<name>.space is laid over it key by key
    space: Mapping[str, Any] = field(default_factory=dict)
    # what the model is, in a line: the variant tables of README and docs/guide/training.md
    # (rcpipe.docs_reference makes them from here)
    summary: str = ""


_BIDAF: dict[str, Any] = {
    # Seo et al. 2017, section 4 and appendix: d = 100, 8-d char embedding and 100 filters of
    # width 5, 2-layer highway, 2-layer modeling LSTM, dropout 0.2 (CNN, every LSTM, the
    # output's linear layer), AdaDelta lr 0.5, and an EMA (0.999) of all weights used at
    # test time. (They also used batch 60 for 12 epochs: train.batch_size/epochs here.)
    "hidden": 100, "char_dim": 8, "char_hidden": 100, "char_kernel": 5, "highway_layers": 2,
    "layers": 2, "dropout": 0.2,
    "optim": {"name": "adadelta", "lr": 0.5, "rho": 0.95, "eps": 1e-6, "ema_decay": 0.999},
}
_RNET: dict[str, Any] = {
    # Wang et al. 2017 (the R-Net technical report), section 4.1: d = 75 for every RNN and
    # attention, 3-layer BiGRU encoders, char BiGRU state 75, bidirectional question-passage
    # matching, dropout 0.2 between layers, AdaDelta lr 1, rho 0.95, eps 1e-6; no EMA.
    "hidden": 75, "char_dim": 8, "char_hidden": 75, "layers": 3, "dropout": 0.2,
    "bidirectional_matching": True,
    "optim": {"name": "adadelta", "lr": 1.0, "rho": 0.95, "eps": 1e-6, "ema_decay": None},
}
_QANET: dict[str, Any] = {
    # Yu et al. 2018, sections 2.2 and 3.1.2: d = 128, 8 heads, embedding encoder 1 block
    # of 4 convs k = 7, model encoder 7 blocks of 2 convs k = 5 (run three times), char
    # embedding 200-d (200 filters), 2-layer highway, dropout 0.1 (char 0.05), stochastic
    # depth p_L = 0.1 (survival 0.9 for the last sublayer), Adam beta1 0.8, beta2 0.999,
    # eps 1e-7, lr 1e-3 after a log warm-up of 1000 steps, L2 3e-7, EMA 0.9999.
    "hidden": 128, "heads": 8, "emb_convs": 4, "conv_kernel": 7, "model_blocks": 7,
    "model_convs": 2, "model_kernel": 5, "char_dim": 200, "char_hidden": 200,
    "highway_layers": 2, "dropout": 0.1, "char_dropout": 0.05, "stochastic_depth": 0.1,
    "position_encoding": True,
    # not the paper's (it names no start): BiDAF's attracting similarity start
    # (ModelConfig.similarity_init) gave QANet nothing on real text (docs/results/accuracy.md)
    "similarity_init": "symmetric",
    "optim": {"name": "adam", "lr": 1e-3, "beta1": 0.8, "beta2": 0.999, "eps": 1e-7,
              "weight_decay": 3e-7, "warmup_steps": 1000, "ema_decay": 0.9999},
}

# Default search spaces around the papers' sizes. The optimiser is chosen with its lr (the
# papers' Adadelta and Adam live at lrs two orders apart); on small data Adam at a few 1e-3
# led (issue 22: BiDAF 37.4 F1 in 4.5 min with Adam, 30.1 in 13.5 with Adadelta).
_ADAM_OR_ADADELTA = {"choice": [
    {"name": "adadelta", "lr": 0.5}, {"name": "adam", "lr": 5e-4},
    {"name": "adam", "lr": 1e-3}, {"name": "adam", "lr": 2e-3}]}
_RNN_SPACE: dict[str, Any] = {
    "optim": _ADAM_OR_ADADELTA, "optim.ema_decay": {"choice": [None, 0.999]},
    "dropout": {"uniform": [0.1, 0.3]}, "word_dropout": {"uniform": [0.0, 0.1]},
}
_QANET_SPACE: dict[str, Any] = {  # Adam with warm-up, as the paper: its lr is searched
    "optim.lr": {"loguniform": [3e-4, 3e-3]}, "optim.ema_decay": {"choice": [0.999, 0.9999]},
    "dropout": {"uniform": [0.0, 0.2]}, "hidden": {"choice": [96, 128]},
    "word_dropout": {"uniform": [0.0, 0.1]},
}

REGISTRY: dict[str, Variant] = {v.name: v for v in (
    Variant("bidaf", "rcpipe.models.bidaf", "build_bidaf", _BIDAF,
            "Seo et al. 2017, Bidirectional Attention Flow for Machine Comprehension",
            _RNN_SPACE | {"hidden": {"choice": [75, 100, 150]}},
            "char-CNN + word embedding, highway, BiLSTM, attention flow (C2Q, Q2C), "
            "modeling layer"),
    # the CS224N SQuAD 2.0 study's BiDAF + self-matching keeps BiDAF's training recipe
    Variant("bidaf_selfattn", "rcpipe.models.bidaf", "build_bidaf_selfattn", _BIDAF,
            "BiDAF (Seo et al. 2017) with R-Net's self-matching attention (Wang et al. 2017)",
            _RNN_SPACE | {"hidden": {"choice": [75, 100, 150]}},
            "BiDAF with R-Net's self-matching over the attention flow: the CS224N SQuAD 2.0 "
            "study's best model"),
    Variant("rnet", "rcpipe.models.rnet", "build_rnet", _RNET,
            "Wang et al. 2017, R-Net: Machine Reading Comprehension with Self-Matching Networks",
            _RNN_SPACE | {"hidden": {"choice": [48, 75, 100]}},
            "char BiGRU, gated attention-based recurrence (attention recomputed from the "
            "previous state at each step), self-matching, pointer network"),
    # the same recipe; only the attention differs
    Variant("rnet_mult", "rcpipe.models.rnet", "build_rnet_mult", _RNET,
            "R-Net (Wang et al. 2017) with multiplicative attention",
            _RNN_SPACE | {"hidden": {"choice": [48, 75, 100]}},
            "R-Net's recipe, the attention computed outside the recurrence: fused BiGRUs"),
    Variant("qanet", "rcpipe.models.qanet", "build_qanet", _QANET,
            "Yu et al. 2018, QANet: Combining Local Convolution with Global Self-Attention",
            _QANET_SPACE,
            "depthwise-separable convs, multi-head self-attention, stochastic depth, EMA, "
            "log warm-up"),
)}

# what a params file's `models` section already means besides the variants' names
_TAKEN = {"of", "minutes", "model_config", "model_fields"}


def register(variant: Variant) -> None:
    """Add a variant that is not shipped (the worked example in docs/architecture.md).

    The config's ``models`` sections are built from the registry when rcpipe.config is first
    imported, so a variant must be registered before that.
    """
    if "rcpipe.config" in sys.modules:
        raise RuntimeError(f"register {variant.name!r} before rcpipe.config is imported: "
                           "its models sections are built from the registry once")
    if not variant.name.isidentifier() or variant.name in _TAKEN or variant.name in REGISTRY:
        raise ValueError(f"variant name {variant.name!r} is not a new Python identifier")
    REGISTRY[variant.name] = variant
