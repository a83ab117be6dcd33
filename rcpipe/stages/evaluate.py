"""`rcpipe evaluate VARIANT`: the trained model's official scores on the dev set.

Reads models/<variant>/model.pt (eval/trained.py: weights only, refused when trained on
another vocabulary or architecture) and <data.out_dir>/dev.parquet; writes
predictions/<variant>.json, predictions/<variant>.nbest.json, metrics/<variant>.json,
metrics/<variant>.by_type.json and models/<variant>/na_threshold.json. No training code is
imported: dvc.yaml's evaluate stages do not run again when only training changed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rcpipe import layout
from rcpipe.config import Config
from rcpipe.stages.io import load_dataset, write_json

log = logging.getLogger(__name__)


def evaluate(cfg: Config, variant: str) -> dict[str, Any]:
    """Predict the dev set with the saved model; write predictions, nbest and metrics, and
    (SQuAD v2.0) the no-answer threshold chosen on dev, which predict and serve then use."""
    import torch

    from rcpipe.data.dataset import SquadDataset
    from rcpipe.eval import metrics
    from rcpipe.eval.predict import evaluate_model
    from rcpipe.eval.trained import device_of, length_prior, load_model

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
    write_json(layout.by_type(variant), metrics.breakdown(doc, preds, na))
    write_json(layout.na_threshold_file(variant), {
        "na_threshold": ev.na_threshold, "fixed": cfg.eval.na_threshold is not None,
        "chosen_on": cfg.data.dev_file if ev.na_threshold is not None else None})
    em, f1 = metrics.headline(ev.result)
    at = f" at no-answer threshold {ev.na_threshold:.3g}" if ev.na_threshold is not None else ""
    log.info("evaluate %s: EM %.2f F1 %.2f on %d dev questions%s (%.1fs)", variant, em, f1,
             len(preds), at, time.perf_counter() - t0)
    return ev.result
