"""The ``distill`` section: `rcpipe distill`, one student trained on the ensemble's answers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rcpipe.config.section import VARIANTS, Section

Student = Literal[VARIANTS]  # type: ignore[valid-type]  # any variant of the registry


class DistillConfig(Section):
    student: Student | None = Field(
        None, description="the variant the student is (one network, models.<student>'s "
        "settings and paper); trained on the training questions against the gold span and "
        "the teacher's distributions, the teacher being the run's ensemble as ensemble.method "
        "combines its members (the vote: its voters' mean). null (the default where params "
        "name none): no student; the train-all flow distills none, the gate weighs none, "
        "and dvc.yaml goes without the stage (`python -m rcpipe.pipeline.dvc_yaml "
        "--no-student`)")
    temperature: float = Field(
        1.0, gt=0, le=20, description="T: both the teacher's and the student's start/end "
        "distributions are softened as softmax(log p / T) before their divergence, which is "
        "weighed by T^2 (Hinton et al. 2015), so its gradients keep their scale across T. "
        "The default, 1 with alpha 0.5, was chosen on the held-out questions of the article "
        "split (docs/results/distill.md: of T:alpha 1:0.5, 2:0.5, 2:0.9)")
    alpha: float = Field(
        0.5, ge=0, le=1, description="the loss: (1 - alpha) x the gold span's cross-entropy "
        "+ alpha x T^2 x KL(teacher || student) over start and end (v2.0: the no-answer "
        "position is one of each distribution's entries)")
