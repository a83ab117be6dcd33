"""Where a run's outputs live and how they are written: the paths the command contract
names, in one place, and the one atomic write.

Relative to the current directory (as every rcpipe path is), so a run directory is wherever
the commands run: the demo's, a test's temporary one, a DVC workspace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rcpipe.safe_open import write_new
from rcpipe.variants import REGISTRY, STUDENT

MODELS = Path("models")  # models/<variant>/: runs/, runs.json, model.pt, summary.json, ...
PREDICTIONS = Path("predictions")  # <model>.json (official format), <model>.nbest.json
METRICS = Path("metrics")  # <model>.json (official keys), <model>.by_type.json
REPORTS = Path("reports")  # rcpipe report
EXPLANATIONS = Path("explanations")  # rcpipe explain
PACKAGES = Path("packages")  # rcpipe package: packages/<variant>/ (trained/package_dir.py)
TUNE = Path("tune")  # rcpipe tune: <variant>.yaml (a params layer), <variant>.trials.json
ENSEMBLE = "ensemble"  # the majority vote's name among the models
# STUDENT (rcpipe/variants.py): `rcpipe distill`'s model, models/student/
TEACHER = "teacher"  # models/student/teacher/: the ensemble's targets for each training row
LIVE = "live"  # models/<variant>/live/: the dev curve as training writes it (dvclive's files)
MODEL = "model.pt"  # a trained model (trained/model_file.py): in models/<variant>/ and checkpoints
NA_THRESHOLD = "na_threshold.json"  # beside model.pt: the no-answer threshold evaluate chose
SUMMARY = "summary.json"  # beside model.pt: the finished run's facts and fingerprint
CURVE = "metrics.json"  # beside model.pt: the finished run's dev curve
# a checkpoint's own files (models/<variant>/runs/<run>/checkpoint_*/, train/checkpoint.py):
# the tensors, the run's state as JSON, what the checkpoint was reported with (a run without
# Ray: train/local.py), each file's size and sha256 at save (a checkpoint is verified before use)
STATE, CHECKPOINT_META, CHECKPOINT_METRICS = "state.pt", "meta.json", "metrics.json"
CHECKPOINT_SUMS = "sums.json"
REPORT_PAGE, REPORT_DATA = "report.html", "report.json"  # rcpipe report, in its folder
SEEDS = "seeds"  # models/<variant>/seeds/<seed>/: each run of a variant of several
RUNS = "runs"  # models/<variant>/runs/<run>/: each keyed run's Ray Train storage (train/runs.py)
STAMPS = Path(".rcpipe/stamps")  # <stage>.json: the inputs its outputs were made from
# large files' sha256 by path, size and modification time: read once, not at every key
DIGESTS = Path(".rcpipe/digests.json")


def model_dir(variant: str) -> Path:
    return MODELS / variant


def model_file(variant: str) -> Path:
    return model_dir(variant) / MODEL


def trained_variants() -> list[str]:
    """The variants with a model file here, in the registry's order."""
    return [v for v in REGISTRY if model_file(v).is_file()]


def teacher_dir() -> Path:
    """The teacher's start/end distributions for each training row (data/teacher.py)."""
    return model_dir(STUDENT) / TEACHER


def na_threshold_file(variant: str) -> Path:
    return model_dir(variant) / NA_THRESHOLD


def summary_file(variant: str) -> Path:
    return model_dir(variant) / SUMMARY


def runs_dir(variant: str) -> Path:
    """Where a variant's runs keep their checkpoints, without train.storage_path."""
    return model_dir(variant) / RUNS


def seed_dir(variant: str, seed: int) -> Path:
    """One run of a variant of several (models.<variant>.seeds): its model.pt, summary.json,
    metrics.json and live/, kept to make the variant's model from (train/seeds.py)."""
    return model_dir(variant) / SEEDS / str(seed)


def runs_record(variant: str) -> Path:
    """The variant's runs, oldest first: name, fingerprint, started, finished."""
    return model_dir(variant) / f"{RUNS}.json"


def stamp(stage: str) -> Path:
    """What a stage's outputs were made from (rcpipe/fingerprints.py: Stamp)."""
    return STAMPS / f"{stage}.json"


def package_dir(variant: str) -> Path:
    return PACKAGES / variant


def live_dir(variant: str) -> Path:
    """dvclive's files of a variant's run: plots/metrics/{dev/em,dev/f1,train/loss}.tsv."""
    return model_dir(variant) / LIVE


def tune_params(variant: str) -> Path:
    """The best trial's settings as a params layer (`--params params.yaml --params` it)."""
    return TUNE / f"{variant}.yaml"


def tune_trials(variant: str) -> Path:
    """Every trial of the search: its settings, status, best score and curve (the report)."""
    return TUNE / f"{variant}.trials.json"


def tune_run(variant: str) -> Path:
    """The search's Ray Tune run and its trials' Ray Train runs (without train.storage_path)."""
    return TUNE / variant


def predictions(model: str) -> Path:
    return PREDICTIONS / f"{model}.json"


def nbest(model: str) -> Path:
    return PREDICTIONS / f"{model}.nbest.json"


def dists(model: str) -> Path:
    """A variant's start/end distributions over each question's context tokens, held-out
    and dev (`rcpipe evaluate`), what the mean and selected ensembles average."""
    return PREDICTIONS / f"{model}.dists.parquet"


def metrics(model: str) -> Path:
    return METRICS / f"{model}.json"


def by_type(model: str) -> Path:
    return METRICS / f"{model}.by_type.json"


def methods(model: str) -> Path:
    """An ensemble's every method scored side by side, and how ensemble.method combines
    (its weights and threshold: rcpipe.inference.combination); beside its metrics file,
    which holds the chosen method's EM/F1 alone (what `dvc metrics show` lists)."""
    return METRICS / f"{model}.methods.json"


def write(path: Path, data: bytes | str) -> None:
    """Write atomically: a reader never sees half a file, even if the run is killed. The
    temporary file is a new one (safe_open: a link planted at its name is not followed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write_new(tmp, data, name=path)
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    write(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")

