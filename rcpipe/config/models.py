"""The ``models`` section: one ModelConfig per registered variant, each its paper's settings
(variants.REGISTRY) with the params file's keys laid on top, and the optimiser it trains with."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, create_model, model_validator

from rcpipe.config.section import VARIANTS, Section, merge_over
from rcpipe.errors import InputError
from rcpipe.variants import REGISTRY


class OptimConfig(Section):
    """The optimiser each paper used (Adadelta for BiDAF/R-Net, Adam + warm-up for QANet)."""

    name: Literal["adam", "adadelta"] = "adam"
    lr: float = Field(1e-3, gt=0)
    beta1: float = 0.8  # Adam; QANet: 0.8
    beta2: float = 0.999
    eps: float = 1e-7
    rho: float = 0.95  # Adadelta
    weight_decay: float = Field(0.0, ge=0, description="L2 on all weights (QANet: 3e-7)")
    warmup_steps: int = Field(0, ge=0, description="log warm-up of the lr (QANet: 1000)")
    grad_clip: float = Field(5.0, gt=0)
    plateau_factor: float = Field(1.0, gt=0, le=1, description="multiply the lr by this "
                                  "after plateau_patience dev evaluations without a better "
                                  "F1 (and again after as many more); 1: never")
    plateau_patience: int = Field(2, ge=1)
    ema_decay: float | None = Field(None, description="EMA of weights used for eval (0.9999)")


def Arch(default: Any, **kwargs: Any) -> Any:  # named like pydantic's Field, which it wraps
    """A field that shapes the weights: a saved model must match it (model_from_payload)."""
    return Field(default, json_schema_extra={"architecture": True}, **kwargs)


class ModelConfig(Section):
    """One variant: its architecture (``Arch`` fields: they shape the weights) and how it
    trains (the rest). Fields a family does not use are ignored by its builder."""

    # -- architecture; each bounded, so a model file or package naming a million layers is
    # refused before anything is built (limits.parameters bounds the whole)
    hidden: int = Arch(75, gt=0, le=8192, description="d: RNN state / model width")
    char_dim: int = Arch(8, gt=0, le=1024, description="char embedding size")
    char_hidden: int = Arch(100, gt=0, le=8192, description="char CNN filters / char GRU state")
    char_kernel: int = Arch(5, gt=0, le=64, description="char CNN width")
    layers: int = Arch(3, gt=0, le=64, description="R-Net encoder BiGRU layers; BiDAF modeling")
    highway_layers: int = Arch(2, ge=0, le=64)
    heads: int = Arch(8, gt=0, le=256, description="QANet self-attention heads")
    conv_kernel: int = Arch(7, gt=0, le=64, description="QANet embedding-encoder conv width")
    emb_convs: int = Arch(4, gt=0, le=64, description="QANet convs per embedding-encoder block")
    model_blocks: int = Arch(7, gt=0, le=64, description="QANet model-encoder blocks")
    model_convs: int = Arch(2, gt=0, le=64, description="QANet convs per model-encoder block")
    model_kernel: int = Arch(5, gt=0, le=64, description="QANet model-encoder conv width")
    position_encoding: bool = Arch(True, description="QANet: add the sinusoid at every "
                                   "encoder block (the paper); False: the convolutions "
                                   "alone carry word order")
    bidirectional_matching: bool = Arch(True, description="R-Net: question-passage "
                                        "matching reads the passage both ways (the "
                                        "report's section 4.1); False: forward only")
    seeds: int = Arch(1, ge=1, le=16, description="training runs of this variant, seeds "
                      "train.seed, + 1, ...; the model holds every run's weights and answers "
                      "with the mean of their start/end distributions (the BiDAF and R-Net "
                      "papers' ensembles of one architecture)")
    # -- training
    dropout: float = Field(0.2, ge=0, lt=1)
    char_dropout: float = Field(0.05, ge=0, lt=1)
    stochastic_depth: float = Field(0.1, ge=0, lt=1, description="QANet p_L (1 - survival)")
    word_dropout: float = Field(0.0, ge=0, lt=1, description="training: a word becomes "
                                "out-of-vocabulary with this probability (a regulariser)")
    train_word_vectors: bool = Field(False, description="fine-tune pretrained vectors")
    similarity_init: Literal["attract", "symmetric"] = Field(
        "attract", description="BiDAF and QANet: the trilinear similarity's c*q weights at "
        "the start; attract: drawn positive, so a passage word scores higher against a "
        "question word like it from the first step; symmetric: signs at random (the peers')")
    batch_size: int | None = Field(None, gt=0, description="overrides train.batch_size")
    max_steps: int | None = Field(None, ge=0, description="overrides train.max_steps")
    max_minutes: float | None = Field(None, ge=0, description="overrides train.max_minutes")
    bf16: bool = Field(False, description="bf16 autocast on CUDA (recurrent layers stay "
                       "fp32; the CPU always trains in fp32). Off for every variant: on one "
                       "H100 each trained slower under bf16 than in fp32 (docs/results/speed.md)")
    optim: OptimConfig = OptimConfig()

    @classmethod
    def architecture_fields(cls) -> tuple[str, ...]:
        return tuple(name for name, f in cls.model_fields.items()
                     if isinstance(f.json_schema_extra, dict)
                     and f.json_schema_extra.get("architecture"))

    def architecture(self) -> dict[str, Any]:
        """The fields that shape the weights, and their values."""
        return {name: getattr(self, name) for name in self.architecture_fields()}


class _Models(Section):
    """Per-variant settings: each is its paper's (variants.REGISTRY) with the params file's
    keys on top. ModelsConfig below has one ModelConfig field per registered variant."""

    @model_validator(mode="before")
    @classmethod
    def _over_the_papers(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data  # pydantic names the type error
        merged: dict[str, Any] = dict(data)
        for variant in VARIANTS:
            own = data.get(variant)
            if own is None:  # absent, or an empty YAML section (`qanet:`): the paper
                own = {}
            paper = dict(REGISTRY[variant].paper)
            merged[variant] = merge_over(paper, own) if isinstance(own, dict) else own
        return merged

    def steps(self, variant: str, default: int) -> int:
        """The variant's step limit: its own max_steps, else ``default``."""
        own = self.of(variant).max_steps
        return default if own is None else own

    def minutes(self, variant: str, default: float) -> float:
        """The variant's training time limit: its own max_minutes, else ``default``."""
        own = self.of(variant).max_minutes
        return default if own is None else own

    def of(self, variant: str) -> ModelConfig:
        if variant not in VARIANTS:
            raise InputError("VARIANT", variant, f"unknown variant; choose from {VARIANTS}")
        result: ModelConfig = getattr(self, variant)
        return result


# `models.bidaf`, `models.qanet`, ...: a field per registered variant, in registry order
ModelsConfig = create_model(
    "ModelsConfig", __base__=_Models, __doc__=_Models.__doc__,
    **{v: (ModelConfig, ...) for v in VARIANTS})
