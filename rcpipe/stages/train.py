"""Training stages: `rcpipe train VARIANT` (a Ray Train job) and `rcpipe evaluate VARIANT`.

Layout (the command contract): models/<variant>/checkpoints/step-<n>/ (Ray Train's run
storage: the best K by dev F1 and the latest; or under train.storage_path, e.g. S3),
models/<variant>/model.pt (the best weights by dev F1, EMA weights where the variant keeps
an EMA), models/<variant>/summary.json and metrics.json (the dev curve, at the end),
models/<variant>/live/ (the same curve as it happens: dvclive's files); evaluate writes
predictions/<variant>.json, predictions/<variant>.nbest.json and metrics/<variant>.json.
Messages go to the ``rcpipe.stages.train`` and ``rcpipe.train.progress`` loggers.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcpipe import layout
from rcpipe.config import Config
from rcpipe.console import shared_progress
from rcpipe.errors import InputError, RunError
from rcpipe.stages.io import load_dataset, write_json
from rcpipe.train.jobs import jobs_api_address, submit_train

if TYPE_CHECKING:  # heavy (torch): imported where they are used
    import torch
    from rich.progress import Progress, TaskID
    from torch import nn

    from rcpipe.models import ModelInputs
    from rcpipe.train.progress import ProgressLog

log = logging.getLogger(__name__)

NA_THRESHOLD = "na_threshold.json"  # beside model.pt: written by evaluate (SQuAD v2.0)


def model_dir(variant: str) -> Path:
    return layout.model_dir(variant)


def _vocab_hash(prepared: Path) -> str:
    from rcpipe.train.worker import vocab_digest

    return vocab_digest(prepared)


def _model_inputs(cfg: Config) -> ModelInputs:
    from rcpipe.train.worker import prepared_inputs

    d = cfg.data.out_dir
    if not (d / "train.parquet").is_file():
        raise InputError(d, "", "no prepared data; run `rcpipe prepare` first")
    return prepared_inputs(d, cfg.data.word_dim)


def train(cfg: Config, variant: str, force: bool = False, run: str | None = None,
          detach: bool = False) -> dict[str, Any]:
    """Train one variant as a Ray Train job; resume from its latest checkpoint if any.

    ``force`` starts over: the local checkpoints and summary are removed first. Through a
    cluster's Jobs API, ``run`` names the run whose Ray job this is (one job per run and
    variant) and ``detach`` leaves the job running if the submitter is interrupted
    (rcpipe.train.job_runs).
    """
    from rcpipe.train import cluster
    from rcpipe.train.checkpoint import META, MODEL
    from rcpipe.train.progress import finished
    from rcpipe.train.worker import run_summary

    cfg.models.of(variant)  # an unknown variant is the user's mistake, found before Ray starts
    cluster.check_train_v2()  # before anything is deleted, loaded or started
    if jobs_api_address(cfg):  # the run is a Ray job on the cluster's head
        return _train_as_job(cfg, variant, force, run, detach)
    out = model_dir(variant)
    summary_path = out / "summary.json"
    if force:
        cluster.forget_run(*cluster.storage(cfg, variant, out))
        shutil.rmtree(out, ignore_errors=True)
    if (done := _finished(summary_path)) is not None:
        log.info("train %s: already finished (%s); nothing to do", variant, summary_path)
        return done
    inputs = _model_inputs(cfg)
    _check_model_config(cfg, variant, inputs)
    dev_doc = load_dataset(cfg.data.dev_file, cfg.data.cache_dir)
    t0 = time.perf_counter()
    result = _fit(cfg, variant, inputs, dev_doc, out)
    if result.checkpoint is None:
        raise InputError(cfg.data.out_dir / "train.parquet", "",
                         "training produced no checkpoint (no batch to train on?)")
    with result.checkpoint.as_directory() as d:
        meta = json.loads((Path(d) / META).read_text())
    best = result.get_best_checkpoint("dev_rank", "max") or result.checkpoint
    with best.as_directory() as d:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "model.pt.tmp"
        shutil.copyfile(Path(d) / MODEL, tmp)
        tmp.replace(out / "model.pt")
    summary = run_summary(variant, meta, time.perf_counter() - t0) | {
        "checkpoints": result.path, "finished": True,
        "replicas_in_sync": len(set(meta["replica_digests"])) == 1}
    write_json(out / "metrics.json", {"history": meta["history"]})
    write_json(summary_path, summary)
    finished(summary)
    return summary


def _fit(cfg: Config, variant: str, inputs: ModelInputs, dev_doc: dict[str, Any],
         out: Path) -> Any:
    """The Ray Train job, to its end; Ray Train's Result. A checkpoint store that fails
    mid-run is one RunError line, not Ray's traceback."""
    from rcpipe.train import cluster
    from rcpipe.train.progress import ProgressLog
    from rcpipe.train.worker import Job

    prepared = cfg.data.out_dir.resolve()
    with cluster.ray_cluster(cfg.train.ray_address):
        cluster.check_fits(cfg)  # before any job starts: Ray would wait forever
        job = Job(config=cfg.model_dump(mode="json"), variant=variant,
                  train_path=str(prepared / "train.parquet"),
                  dev_path=str(prepared / "dev.parquet"),
                  vocab_sha256=_vocab_hash(cfg.data.out_dir))
        path, filesystem = cluster.storage(cfg, variant, out)
        log.info("train %s: Ray Train job of %d worker(s), run storage %s%s", variant,
                 cfg.train.num_workers, "s3://" if filesystem is not None else "", path)
        shown = ProgressLog(variant, layout.live_dir(variant))  # lines, the live dev curve
        with shared_progress() as bar:
            task = bar.add_task(f"train {variant}", total=cfg.train.epochs)
            try:
                result = cluster.fit(job, inputs, dev_doc, cfg, path, filesystem,
                                     lambda message: _show(bar, task, shown, message))
            except Exception as e:
                if (why := cluster.storage_failure(e)) is None:
                    raise
                raise RunError(cfg.train.storage_path or path, "", f"the checkpoint store "
                               f"failed ({why}): run the same command again once it is back, "
                               "to go on from the last checkpoint it recorded") from None
    return result


def _finished(summary_path: Path) -> dict[str, Any] | None:
    """The summary of a run that finished, or None."""
    if not summary_path.is_file():
        return None
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    return summary if summary.get("finished") else None


def _train_as_job(cfg: Config, variant: str, force: bool, run: str | None,
                  detach: bool) -> dict[str, Any]:
    """`rcpipe train` in a Ray job (rcpipe.train.jobs); its summary, from the shared disk."""
    # the job's log lines go to rcpipe.train.jobs' log
    submit_train(cfg, variant, force, run=run, detach=detach)
    summary_path = model_dir(variant) / "summary.json"
    if (summary := _finished(summary_path)) is None:
        raise InputError(summary_path, "", "the Ray job finished but this directory has no "
                         "summary: it must be on the file system the cluster's nodes share")
    return summary


def _check_model_config(cfg: Config, variant: str, inputs: ModelInputs) -> None:
    """Build the model once here, so a bad size fails now, not on every Ray worker."""
    from rcpipe.models import build_model

    try:
        build_model(variant, cfg.models.of(variant), replace(inputs, vectors=None))
    except ValueError as e:
        raise InputError(cfg.source, f"models.{variant}", str(e)) from None


def _show(bar: Progress, task: TaskID, shown: ProgressLog, message: dict[str, Any]) -> None:
    """One progress message from rank 0 (a step, or a dev evaluation): logged and drawn
    by ``shown``, and the terminal's bar moves with every step message."""
    shown(message)
    if "eval" not in message:
        bar.update(task, completed=message["epoch"],
                   description=f"train {shown.variant} step {message['step']} loss "
                               f"{message['loss']:.3f} {message['examples_per_s']:.0f} ex/s")


def load_model(cfg: Config, variant: str) -> tuple[nn.Module, ModelInputs]:
    """The saved model, refusing one trained on a different vocabulary (weights only)."""
    import torch

    from rcpipe.train.checkpoint import PayloadMismatch, model_from_payload

    path = model_dir(variant) / "model.pt"
    if not path.is_file():
        raise InputError(path, "", f"no trained model; run `rcpipe train {variant}` first")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        # weights_only refuses any pickled object that is not a tensor or plain container
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise InputError(path, "", f"refused: not a weights-only model file ({reason})"
                         ) from None
    if not isinstance(saved, dict):
        raise InputError(path, "", "refused: not an rcpipe model file")
    try:
        return model_from_payload(saved, variant, _vocab_hash(cfg.data.out_dir),
                                  cfg.models.of(variant))
    except PayloadMismatch as e:
        hint = f" than {cfg.data.out_dir / 'vocab.json'}; prepare or train again" \
            if e.field == "vocab_sha256" else ""
        hint = hint or ("; train again" if e.field.startswith("model_config") else "")
        raise InputError(path, e.field, f"{e}{hint}") from None
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a payload missing parts
        raise InputError(path, "", f"refused: not an rcpipe model file ({e!r:.120})") from None


def evaluate(cfg: Config, variant: str) -> dict[str, Any]:
    """Predict the dev set with the saved model; write predictions, nbest and metrics, and
    (SQuAD v2.0) the no-answer threshold chosen on dev, which predict and serve then use."""
    import torch

    from rcpipe.data.dataset import SquadDataset
    from rcpipe.eval import metrics
    from rcpipe.eval.metrics import headline
    from rcpipe.eval.predict import evaluate as evaluate_model
    from rcpipe.train.worker import device_of

    device = device_of(cfg)
    model, _ = load_model(cfg, variant)
    model.to(device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    dev_set = SquadDataset.from_parquet(cfg.data.out_dir / "dev.parquet",
                                        para_limit=cfg.train.dev_para_limit)
    doc = load_dataset(cfg.data.dev_file, cfg.data.cache_dir)
    t0 = time.perf_counter()
    ev = evaluate_model(model, dev_set, doc, device, cfg.eval.max_answer_len,
                        cfg.eval.na_threshold, length_prior(cfg))
    preds = ev.predictions
    na = ev.na_probs if metrics.dataset_version(doc) == "2.0" else None
    write_json(layout.predictions(variant), preds)
    write_json(layout.nbest(variant), ev.nbest)
    write_json(layout.metrics(variant), ev.result)
    write_json(layout.by_type(variant),
               metrics.breakdown(doc, preds, na))
    write_json(model_dir(variant) / NA_THRESHOLD, {
        "na_threshold": ev.na_threshold, "fixed": cfg.eval.na_threshold is not None,
        "chosen_on": cfg.data.dev_file if ev.na_threshold is not None else None})
    em, f1 = headline(ev.result)
    at = f" at no-answer threshold {ev.na_threshold:.3g}" if ev.na_threshold is not None else ""
    log.info("evaluate %s: EM %.2f F1 %.2f on %d dev questions%s (%.1fs)", variant, em, f1,
             len(preds), at, time.perf_counter() - t0)
    return ev.result


def na_threshold(cfg: Config, variant: str) -> float | None:
    """The threshold a variant answers at: eval.na_threshold if set, else the one `rcpipe
    evaluate` chose on dev, else None (the model's own rule: na_prob > the span's prob)."""
    if cfg.eval.na_threshold is not None:
        return cfg.eval.na_threshold
    path = model_dir(variant) / NA_THRESHOLD
    return json.loads(path.read_text())["na_threshold"] if path.is_file() else None


def length_prior(cfg: Config) -> torch.Tensor | None:
    """eval.length_prior's weights, from the prepared training split (None when off)."""
    if not cfg.eval.length_prior:
        return None
    import torch

    from rcpipe.data.dataset import SquadDataset

    train = SquadDataset.from_parquet(cfg.data.out_dir / "train.parquet")
    return torch.from_numpy(train.answer_length_prior(cfg.eval.max_answer_len))

