"""The ``ensemble`` section: how `rcpipe ensemble` combines the variants' answers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rcpipe.config.section import Section

Method = Literal["vote", "mean", "selected"]


class EnsembleConfig(Section):
    method: Method = Field(
        "vote", description="the answers given: vote (majority vote on the answer text, a "
        "tie to the likeliest), mean (the variants' start/end distributions over prepare's "
        "tokens averaged, then the best span; v2.0: no-answer scores averaged too, the "
        "threshold chosen on the held-out questions) or selected (mean with each variant's "
        "weight chosen on the held-out questions by greedy ensemble selection); all three "
        "are scored side by side, and the gate's ensemble candidate and an ensemble "
        "champion answer by this one")
    rounds: int = Field(10, ge=1, le=100, description="selected: greedy rounds, each adding "
                        "one variant's weight (with replacement) where held-out F1 gains most")
