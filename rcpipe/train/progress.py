"""What a training run shows while it runs: log lines and the dev curve, from rank 0's
progress messages, on the driver (cluster/train_job.py's ``fit``) or in the one process of
train/local.py.

A step message (every ``worker.PROGRESS_EVERY`` steps) becomes a log line at most every
``STEP_LINE_SECONDS``, so the Prefect UI and Ray's job logs follow a run without drowning in
it; an evaluation message becomes a log line and a point of the dev curve (dvclive's files
under the run's ``live/``, which `dvc plots show` draws while the run goes on).

dvclive runs here as a file writer only: it never opens (or, outside a DVC repository,
``dvc init``-s) a repository, saves an experiment, writes a dvc.yaml or talks to DVC Studio;
dvc.yaml declares the plots. Without dvclive (a bare GPU box) the curve is skipped and
``metrics.json`` still gets the whole curve at the end.
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STEP_LINE_SECONDS = 30.0  # at most one step line per run this often
# dvclive's metric names: plots/metrics/<name>.tsv under the curve's directory, one
# (step, value) row per evaluation; heldout/f1 (what checkpoints are ranked by) when
# prepare held questions out
CURVE = {"dev/em": "em", "dev/f1": "f1", "heldout/f1": "heldout_f1", "train/loss": "loss"}


def _offline_live(directory: Path) -> Any:
    """A dvclive ``Live`` appending to ``directory``'s files (resume: never wiping them)."""
    from dvclive import Live

    class FilesOnly(Live):
        # dvclive's own start-up opens the DVC repository around the working directory
        # (running `dvc init` in a bare git checkout) and may post to DVC Studio: a run's
        # curve needs neither, and a training job must not touch the repository
        def _init_dvc(self) -> None:
            self._save_dvc_exp = False

        def _init_studio(self) -> None:
            self._studio_events_to_skip |= {"start", "data", "done"}

    return FilesOnly(dir=str(directory), resume=True, save_dvc_exp=False, dvcyaml=None,
                     report=None, monitor_system=False)


class DevCurve:
    """step -> dev EM/F1 and the training loss, appended at each evaluation (dvclive).

    A run resumed from step r keeps the curve up to r and continues it; points after r
    (an attempt whose later checkpoints were lost, or a run started afresh at 0 over an
    old curve) are dropped at its first evaluation, so no point of a lost run remains.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._live: Any = None
        self._resumed: int | None = None  # the resumed_from_step the files agree with
        self._missing = False

    def add(self, point: dict[str, Any]) -> None:
        live = self._open()
        if live is None:
            return
        try:
            resumed = point.get("resumed_from_step", 0)
            if resumed != self._resumed:  # a new attempt: the curve up to where it resumed
                self._drop_after(resumed)
                self._resumed = resumed
            live.step = point["step"]
            for name, key in CURVE.items():
                if key in point:
                    live.log_metric(name, point[key])
            live.make_summary()  # live/metrics.json: the latest point
        except OSError as e:  # a full or read-only disk costs the picture, not the run
            log.warning("dev curve in %s: step %d not written (%s)", self.directory,
                        point["step"], e)

    def _open(self) -> Any:
        if self._live is None and not self._missing:
            try:
                self._live = _offline_live(self.directory)
            except ImportError as e:  # no dvclive (or dvc) here: the end-of-run curve only
                self._missing = True
                log.warning("no live dev curve in %s: dvclive cannot be imported (%s)",
                            self.directory, e)
        return self._live

    def _drop_after(self, step: int) -> None:
        for tsv in (self.directory / "plots" / "metrics").rglob("*.tsv"):
            with tsv.open(newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f, delimiter="\t")
                fields, rows = reader.fieldnames, list(reader)
            kept = [r for r in rows if int(r["step"]) <= step]
            if len(kept) == len(rows) or fields is None:
                continue
            with tsv.open("w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fields, delimiter="\t", lineterminator="\n")
                writer.writeheader()
                writer.writerows(kept)


class ProgressLog:
    """Rank 0's progress messages for one variant: log lines and the dev curve."""

    def __init__(self, variant: str, curve_dir: Path) -> None:
        self.variant = variant
        self.curve = DevCurve(curve_dir)
        self._last_line = float("-inf")

    def __call__(self, message: dict[str, Any]) -> None:
        if "eval" in message:
            e = message["eval"]
            held = f", held-out F1 {e['heldout_f1']:.2f} (ranks checkpoints)" \
                if "heldout_f1" in e else ""
            log.info("train %s: epoch %d step %d: dev EM %.2f F1 %.2f%s, loss %.3f; "
                     "checkpoint %s saved", self.variant, e["epoch"], e["step"], e["em"],
                     e["f1"], held, e["loss"], e["checkpoint"])
            self.curve.add(e)
            return
        if "note" in message:  # a line rank 0 has for people (a broken checkpoint passed by)
            log.warning("train %s: %s", self.variant, message["note"])
            return
        now = time.monotonic()
        if now - self._last_line >= STEP_LINE_SECONDS:
            self._last_line = now
            log.info("train %s: epoch %d step %d loss %.3f, %.0f examples/s", self.variant,
                     message["epoch"], message["step"], message["loss"],
                     message["examples_per_s"])


def finished(summary: dict[str, Any]) -> None:
    """The line that ends a run (train/checkpoint.py's run_summary)."""
    log.info("train %s: best (ranked on %s) at step %d: dev EM %.2f F1 %.2f; "
             "%.0f examples/s on %d worker(s) (%s)", summary.get("model", summary["variant"]),
             summary.get("ranked_on", "dev"), summary["best_step"], summary["best_dev_em"],
             summary["best_dev_f1"], summary["examples_per_s"], summary["world_size"],
             summary["device"])
