"""The ``synth`` section: the synthetic SQuAD-format data of `rcpipe synth`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rcpipe.config.section import Section

# a split's bounds (SQuAD v2.0's train set: 130,319 questions, 19,035 paragraphs): what
# `rcpipe synth` writes stays a few hundred MB, under limits.json_mb, in under a minute
SYNTH_PARAGRAPHS = 100_000
SYNTH_QUESTIONS = 1_000_000
SYNTH_FACTS = 20


class SynthConfig(Section):
    """Synthetic SQuAD-format data written by `rcpipe synth` to data.train_file/dev_file."""

    seed: int = 13
    version: Literal["1.1", "2.0"] = "1.1"
    train_articles: int = Field(60, gt=0)
    dev_articles: int = Field(10, gt=0)
    paragraphs_per_article: int = Field(5, gt=0)
    questions_per_paragraph: int = Field(5, gt=0)
    unanswerable_fraction: float = Field(0.33, ge=0.0, lt=1.0)
    facts_per_paragraph: tuple[int, int] = Field(
        (5, 7), description="[min, max] fact sentences per paragraph: the passages' length "
        f"(max at most {SYNTH_FACTS})")

    @field_validator("facts_per_paragraph")
    @classmethod
    def _facts_range(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1] <= SYNTH_FACTS:
            raise ValueError(f"must be [min, max] with 1 <= min <= max <= {SYNTH_FACTS}")
        return v

    @model_validator(mode="after")
    def _split_bounded(self) -> SynthConfig:
        # each count alone is a small number; their product is what synth writes
        for key in ("train_articles", "dev_articles"):
            paragraphs = getattr(self, key) * self.paragraphs_per_article
            questions = paragraphs * self.questions_per_paragraph
            for n, what, bound in ((paragraphs, "paragraphs", SYNTH_PARAGRAPHS),
                                   (questions, "questions", SYNTH_QUESTIONS)):
                if n > bound:
                    raise ValueError(f"{key} {getattr(self, key):,} makes {n:,} {what} a "
                                     f"split, over the bound of {bound:,}")
        return self

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, v: object) -> object:
        # `--set synth.version=2.0` arrives as the YAML float 2.0
        return f"{v:.1f}" if isinstance(v, float) else v
