"""The ``eval`` section: how an answer is chosen from a model's span scores."""

from __future__ import annotations

from pydantic import Field

from rcpipe.config.section import Section


class EvalConfig(Section):
    max_answer_len: int = Field(15, gt=0, description="longest span best_span may return")
    length_prior: bool = Field(False, description="weigh each span by how often training "
                               "answers have its length (add-one smoothed) when choosing it")
    na_threshold: float | None = Field(
        None, description="v2.0: answer '' when na_prob exceeds it; None: the threshold "
        "`rcpipe evaluate` chooses on the held-out questions (data.heldout)"
    )
