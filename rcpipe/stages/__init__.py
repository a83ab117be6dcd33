"""The stages of the pipeline: a module per command, each stage's function reading its
inputs and writing its outputs (as one set: rcpipe/outputs.py). A training run's own files
(its checkpoints, its record of runs, model.pt and summary.json at its end) are written for
the train and tune stages by rcpipe/train/ (checkpoint.py, runs.py, state.py, local.py);
releasing a run by rcpipe/release/.

The CLI, dvc.yaml and the Prefect flows all call these functions, so each stage has one
implementation. Heavy libraries are imported inside the stage that needs them, which keeps
``rcpipe --help`` instant.
"""

from rcpipe.stages.data import prepare, prepared_changes, synth
from rcpipe.stages.distill import distill
from rcpipe.stages.ensemble import ensemble
from rcpipe.stages.evaluate import evaluate
from rcpipe.stages.explain import explain
from rcpipe.stages.export import export
from rcpipe.stages.package import package
from rcpipe.stages.predict import predict
from rcpipe.stages.report import report
from rcpipe.stages.score import score
from rcpipe.stages.serving import serve
from rcpipe.stages.train import (
    check_run_name,
    stop_jobs,
    train,
    train_slots,
    trained_is_current,
)
from rcpipe.stages.tune import tune

__all__ = [
    "distill", "ensemble", "evaluate", "prepare", "prepared_changes",
    "score", "synth", "train", "trained_is_current", "tune",
    "explain", "report",
    "export", "package", "predict", "serve",
    "check_run_name", "stop_jobs", "train_slots",  # a flow's many variants (train-all)
]
