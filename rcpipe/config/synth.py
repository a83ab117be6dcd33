"""The ``synth`` section: the synthetic SQuAD-format data of `rcpipe synth`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rcpipe.config.section import Section


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
        (5, 7), description="[min, max] fact sentences per paragraph: the passages' length")

    @field_validator("facts_per_paragraph")
    @classmethod
    def _facts_range(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1]:
            raise ValueError("must be [min, max] with 1 <= min <= max")
        return v

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, v: object) -> object:
        # `--set synth.version=2.0` arrives as the YAML float 2.0
        return f"{v:.1f}" if isinstance(v, float) else v
