"""`rcpipe distill`: one network (distill.student) trained on the ensemble's answers, so that
one model's forward pass answers near the ensemble's F1 (Hu et al. 2018).

The teacher is the run's ensemble as ensemble.method combines its members
(metrics/ensemble.methods.json: the members weighed in its mean, or every voter equally
for the vote; inference/teacher.py). Its start/end distributions over every training row
are written beside the training split (models/student/teacher/, data/teacher.py); then the
student trains as a variant does, one Ray Train job (cluster/train_run.py), its loss the
gold span's plus the divergence from those distributions (config/distill.py: alpha,
temperature), its checkpoints ranked on the held-out questions, resumed after a kill: the
run is keyed on what it learns from (the members' model files, the combination, the
prepared data, the student's settings, this stage's code: the table's row), so a new
teacher is a new run. The student is then a model like the others, models/student/, and
`rcpipe evaluate student` scores it.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from rcpipe import fingerprints, layout, reads
from rcpipe.config import VARIANTS, Config
from rcpipe.errors import InputError
from rcpipe.fingerprints import Fingerprint
from rcpipe.locks import hold
from rcpipe.outputs import settle

log = logging.getLogger(__name__)


def distill(cfg: Config, force: bool = False, wait: bool = False) -> dict[str, Any]:
    """Train the student on its teacher (see above), then evaluate it; its summary (the
    training run's) and metrics (dev's, as `rcpipe evaluate student` writes them). A
    finished student of this key trains nothing (``force``: anew). One at a time
    (models/student/'s lock; ``wait``: for its holder)."""
    from rcpipe.cluster import opening
    from rcpipe.stages.evaluate import evaluate

    student = cfg.network_of(layout.STUDENT)  # distill.student null: one line, here
    opening.check_trainable(cfg, student)  # before anything loads or starts
    members, how = teacher_of(cfg)
    with hold(layout.model_dir(layout.STUDENT), "the student is being distilled", wait):
        settle(layout.model_dir(layout.STUDENT))
        key = student_key(cfg)
        from rcpipe.train.runs import finished_in

        summary = None if force else finished_in(layout.model_dir(layout.STUDENT), key)
        if summary is not None:
            log.info("distill: the student of these members and settings is finished (%s); "
                     "nothing to train", layout.summary_file(layout.STUDENT))
        else:
            teacher = _targets(cfg, members, how, key)
            from rcpipe.cluster.train_run import train_run
            from rcpipe.train.seeds import run_config

            summary = train_run(run_config(cfg, student), key,
                                layout.model_dir(layout.STUDENT), variant=student,
                                force=force, model=layout.STUDENT, teacher=teacher)
    return {"summary": summary, "metrics": evaluate(cfg, layout.STUDENT, wait=wait)}


def teacher_of(cfg: Config) -> tuple[list[str], dict[str, Any]]:
    """The ensemble's members (the variants evaluated, as `rcpipe ensemble` found them, that
    answer for it) and how they combine (metrics/ensemble.methods.json's method and its
    weights); one line when there is no ensemble yet or a member has no model file."""
    from rcpipe.inference.combination import Combination

    methods = layout.methods(layout.ENSEMBLE)
    if not methods.is_file():
        raise InputError(methods, "", "no ensemble to distill; run `rcpipe ensemble` first")
    combination = Combination.of(reads.read_json(methods))
    evaluated = [v for v in VARIANTS if layout.nbest(v).is_file()]
    members = combination.voters(evaluated)
    if not members:
        raise InputError(methods, combination.method, "no member answers for the ensemble")
    for m in members:
        if not layout.model_file(m).is_file():
            raise InputError(layout.model_file(m), "", f"the ensemble's member {m} has no "
                             f"model; run `rcpipe train {m}` first")
    return members, {"method": combination.method, "members": members,
                     "weights": combination.weights}


def student_key(cfg: Config) -> Fingerprint:
    """What the student learns from: the distill stage's row of the table, over the model
    files of the variants trained here (dvc.yaml's row lists its pipeline's)."""
    return fingerprints.of_stage(cfg, "distill", models=layout.trained_variants())


def _targets(cfg: Config, members: list[str], how: dict[str, Any], key: Fingerprint) -> Path:
    """The teacher's targets of this key (models/student/teacher/), written unless the
    folder holds them already."""
    from rcpipe.data.prepared import Prepared
    from rcpipe.data.teacher import TeacherTargets, write

    folder = layout.teacher_dir()
    train = Prepared(cfg.data.out_dir).shards("train")
    about = how | {"key": key.digest}
    try:
        if TeacherTargets.open(folder, train).about == about:
            log.info("distill: the teacher's targets of these members are in %s", folder)
            return folder
    except InputError:
        pass  # none, or of another teacher: written anew
    import torch

    from rcpipe.data.dataset import char_limit_of
    from rcpipe.inference.combination import Combination
    from rcpipe.inference.teacher import targets, teacher_weights
    from rcpipe.trained.model_file import device_of, load_model

    device = device_of(cfg)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    models = [load_model(cfg, m)[0].to(device) for m in members]
    shares = teacher_weights(members, how["weights"], Combination(how["method"]).votes)
    fresh = folder.with_name(f".{folder.name}.new")
    shutil.rmtree(fresh, ignore_errors=True)
    log.info("distill: the teacher (%s of %s) reads %d training rows", how["method"],
             ", ".join(f"{m} {s:.2f}" for m, s in zip(members, shares, strict=True)),
             train.rows)
    write(fresh, train, targets(models, shares, device, char_limit_of(cfg.data.out_dir)),
          about)
    shutil.rmtree(folder, ignore_errors=True)
    fresh.rename(folder)
    return folder
