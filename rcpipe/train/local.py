"""Training in one plain process, without Ray: the same Worker, world size 1.

For a box that has PyTorch, numpy, pyarrow, PyYAML and pydantic but no Ray, spaCy or Prefect
(a lone GPU machine given prepared Parquet files): it trains and checkpoints exactly as a
Ray Train worker does, keeping checkpoints under ``<run_dir>/step-<n>/`` (the best
``train.keep_checkpoints`` by held-out F1 and the latest; running again resumes from the latest)
and at the end, as `rcpipe train` does (checkpoint.finish_run), the best model in
``<run_dir>/model.pt``, ``summary.json`` and the dev curve in ``metrics.json``; progress goes
to the ``rcpipe.train`` loggers and the dev curve to dvclive's files in ``<run_dir>/live/``
as it happens (train/progress.py). ``rcpipe train`` stays a Ray Train job.

    python -m rcpipe.train.local VARIANT [--params F ...] [--set k=v ...] [--run-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rcpipe import reads
from rcpipe.config import Config, load_config
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError
from rcpipe.layout import CHECKPOINT_METRICS, LIVE, model_dir
from rcpipe.locks import hold
from rcpipe.logs import setup as setup_logging
from rcpipe.models import ModelInputs
from rcpipe.train.checkpoint import RANK_METRIC, finish_run, first_whole, read_meta
from rcpipe.train.job import make_job
from rcpipe.train.progress import ProgressLog
from rcpipe.train.worker import Worker
from rcpipe.trained.model_file import device_of, prepared_inputs


class LocalSession:
    """A Worker's session in this process: rank 0 of 1, checkpoints in a directory."""

    rank, world = 0, 1

    def __init__(self, run_dir: Path, device: torch.device, inputs: ModelInputs,
                 dev_doc: dict[str, Any], keep: int,
                 on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.run_dir, self.device, self.keep = run_dir, device, keep
        self._inputs, self._dev_doc, self._on_progress = inputs, dev_doc, on_progress

    def inputs(self) -> ModelInputs:
        return self._inputs

    def dev_doc(self) -> dict[str, Any]:
        return self._dev_doc

    def checkpoints(self) -> list[Path]:
        return sorted(self.run_dir.glob("step-*"))  # step-<8 digits>: name order is step order

    def clean(self) -> None:
        """What a killed run left half done: a checkpoint being copied in or pruned."""
        for left in (*self.run_dir.glob(".step-*.tmp"), *self.run_dir.glob(".pruned-*")):
            shutil.rmtree(left, ignore_errors=True)

    @contextmanager
    def stored(self) -> Iterator[list[Path]]:
        yield self.checkpoints()[::-1]  # newest first

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model

    def report(self, metrics: dict[str, Any], directory: Path | None, name: str) -> str:
        if directory is None:
            return name
        tmp = self.run_dir / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(directory, tmp)
        (tmp / CHECKPOINT_METRICS).write_text(json.dumps(metrics))
        if (self.run_dir / name).exists():  # a broken one of this step, passed by on resume
            shutil.rmtree((self.run_dir / name).rename(self.run_dir / f".pruned-{name}"))
        tmp.replace(self.run_dir / name)  # a checkpoint appears whole or not at all
        self._prune()
        return name

    @staticmethod
    def _rank(checkpoint: Path) -> float:
        """What checkpoints are kept by: held-out F1, ties broken as evaluation.scores says."""
        try:
            return float(reads.read_json(checkpoint / CHECKPOINT_METRICS)[RANK_METRIC])
        except (InputError, ValueError, KeyError, TypeError):
            return float("-inf")  # a broken checkpoint's: ranked last, never used

    def best(self) -> Path | None:
        """The best whole checkpoint by rank (a broken one passed by, with a line)."""
        return first_whole(sorted(self.checkpoints(), key=self._rank, reverse=True),
                           self.note)

    def note(self, line: str) -> None:
        self.progress({"note": line})

    def _prune(self) -> None:
        """Keep the best ``keep`` by rank and the latest (Ray's CheckpointConfig rule)."""
        found = self.checkpoints()
        kept = set(sorted(found, key=self._rank, reverse=True)[: self.keep]) | set(found[-1:])
        for d in found:
            if d not in kept:  # renamed first: a kill never leaves half a checkpoint listed
                gone = d.rename(self.run_dir / f".pruned-{d.name}")
                shutil.rmtree(gone)

    def progress(self, message: dict[str, Any]) -> None:
        if self._on_progress is not None:
            self._on_progress(message)


def train_local(cfg: Config, variant: str, run_dir: Path,
                on_progress: Callable[[dict[str, Any]], None] | None = None,
                wait: bool = False) -> dict[str, Any]:
    """Train ``variant`` in this process; returns the summary also written to
    ``<run_dir>/summary.json`` (steps, examples/s, device, best dev EM/F1). One run at a
    time per ``run_dir`` (rcpipe/locks.py; ``wait``: for the one running)."""
    cfg.models.of(variant)
    with hold(run_dir, f"{variant} is being trained", wait):
        return _train_local(cfg, variant, run_dir, on_progress)


def _train_local(cfg: Config, variant: str, run_dir: Path,
                 on_progress: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    from rcpipe.data.squad import load_document

    if cfg.train.num_workers != 1:
        raise InputError(cfg.source, "train.num_workers", "one process trains alone: set "
                         "train.num_workers=1 (rcpipe train runs several through Ray)")
    prepared = Prepared(cfg.data.out_dir)
    if not prepared.train.is_dir():
        raise InputError(prepared.out_dir, "", "no prepared data; run `rcpipe prepare` first")
    run_dir.mkdir(parents=True, exist_ok=True)
    inputs = prepared_inputs(prepared.out_dir, cfg.data.word_dim)
    dev_doc = load_document(cfg.data.dev_file, cfg.data.cache_dir)
    shown = ProgressLog(variant, run_dir / LIVE)  # log lines and the live dev curve

    def progress(message: dict[str, Any]) -> None:
        shown(message)
        if on_progress is not None:
            on_progress(message)

    session = LocalSession(run_dir, device_of(cfg), inputs, dev_doc,
                           cfg.train.keep_checkpoints, progress)
    session.clean()
    job = make_job(cfg, variant, prepared.job_fields())
    t0 = time.perf_counter()
    Worker(job, session).train()
    with session.stored() as found:
        last = first_whole(found, session.note)
    if last is None:
        raise InputError(prepared.train, "", "training produced no whole checkpoint")
    meta = read_meta(last)
    return finish_run(variant, run_dir, meta, session.best() or last, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rcpipe.train.local",
                                 description="Train one variant in this process, no Ray.")
    ap.add_argument("variant")
    ap.add_argument("--params", type=Path, action="append", default=[],
                    help="a params file; repeatable, later layers over earlier ones as the "
                    "CLI's (default params.yaml)")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="override a param: dotted.key=value (repeatable)")
    ap.add_argument("--run-dir", type=Path, help="default: models/<variant>/local")
    ap.add_argument("--wait", action="store_true",
                    help="wait for a run training into the same --run-dir (default: refuse)")
    args = ap.parse_args(argv)
    setup_logging()
    try:
        cfg = load_config(args.params or [Path("params.yaml")], args.sets)
        summary = train_local(cfg, args.variant,
                              args.run_dir or model_dir(args.variant) / "local",
                              wait=args.wait)
    except InputError as e:
        print(e.line(), file=sys.stderr)
        sys.exit(e.exit_code)
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}))


if __name__ == "__main__":
    main()
