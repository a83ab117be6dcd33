"""The ``version`` section: the champion gate and where a versioned night is pushed."""

from __future__ import annotations

from pydantic import Field

from rcpipe.config.section import Section


class VersionConfig(Section):
    """The champion gate of `rcpipe version --promote` (and the nightly flow): the run's best
    model on the gate set replaces the champion only when the paired interval of its F1
    minus the champion's, both answering the same questions, lies above ``min_gain``."""

    min_gain: float = Field(0.0, ge=0, description="F1 points the 95% interval's lower end "
                            "must clear (0: any gain beyond chance)")
    gate_file: str | None = Field(None, description="a SQuAD JSON (path, URL, s3://) the "
                                  "gate answers; None: the prepared held-out questions. "
                                  "Never data.dev_file, which reports")
    git_remote: str | None = Field("origin", description="the git remote each versioned "
                                   "night's dvc.lock commit (and the champion tag) is pushed "
                                   "to, when the workspace has it; None: kept local")
