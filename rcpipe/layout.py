"""Where a run's outputs live: the paths the command contract names, in one place.

Relative to the current directory (as every rcpipe path is), so a run directory is wherever
the commands run: the demo's, a test's temporary one, a DVC workspace.
"""

from __future__ import annotations

from pathlib import Path

MODELS = Path("models")  # models/<variant>/: checkpoints/, model.pt, summary.json, ...
PREDICTIONS = Path("predictions")  # <model>.json (official format), <model>.nbest.json
METRICS = Path("metrics")  # <model>.json (official keys), <model>.by_type.json
REPORTS = Path("reports")  # rcpipe report
EXPLANATIONS = Path("explanations")  # rcpipe explain
ENSEMBLE = "ensemble"  # the majority vote's name among the models


def model_dir(variant: str) -> Path:
    return MODELS / variant


def predictions(model: str) -> Path:
    return PREDICTIONS / f"{model}.json"


def nbest(model: str) -> Path:
    return PREDICTIONS / f"{model}.nbest.json"


def metrics(model: str) -> Path:
    return METRICS / f"{model}.json"


def by_type(model: str) -> Path:
    return METRICS / f"{model}.by_type.json"
