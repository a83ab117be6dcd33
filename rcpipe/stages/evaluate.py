"""`rcpipe evaluate VARIANT`: the trained model's official scores on the dev set.

Reads models/<variant>/model.pt (trained/model_file.py: weights only, refused when trained on
another vocabulary or architecture) and <data.out_dir>/dev/; writes
predictions/<variant>.json, predictions/<variant>.nbest.json, predictions/<variant>.dists.parquet
(the start/end distributions of the held-out and dev questions, for `rcpipe ensemble`'s
mean and selected methods), metrics/<variant>.json, metrics/<variant>.by_type.json and
models/<variant>/na_threshold.json. SQuAD v2.0's
no-answer threshold is chosen on <data.out_dir>/heldout/ (data.heldout), or fixed by
eval.na_threshold, never on dev. No training code is imported: dvc.yaml's evaluate stages
do not run again when only training changed. Nor does this command: when the model, the
prepared dev and held-out files, the dev set and the settings it reads are those its
outputs were made from (rcpipe/fingerprints.py: Stamp), it says so and does nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rcpipe import layout, reads
from rcpipe.config import Config
from rcpipe.data.prepared import Prepared
from rcpipe.data.squad import load_document
from rcpipe.errors import InputError
from rcpipe.fingerprints import Stamp, of_stage
from rcpipe.locks import hold
from rcpipe.outputs import output_set, settle

log = logging.getLogger(__name__)


def evaluate(cfg: Config, variant: str, force: bool = False, wait: bool = False
             ) -> dict[str, Any]:
    """Predict the dev set with the saved model; write predictions, nbest and metrics, and
    (SQuAD v2.0) the no-answer threshold, which predict and serve then use: eval.na_threshold
    if set, else the one best on the held-out questions prepare set aside (data.heldout),
    never dev's own (reported beside the headline as the oracle). Unchanged inputs: the
    metrics already written (``force``: evaluate anyway). The five files are one set
    (rcpipe/outputs.py), written under models/<variant>/'s lock (rcpipe/locks.py: not while
    the model trains; ``wait``: for it)."""
    with hold(layout.model_dir(variant), f"{variant} is being evaluated", wait):
        settle(layout.model_dir(variant), layout.PREDICTIONS, layout.METRICS)
        return _evaluate(cfg, variant, force)


def _evaluate(cfg: Config, variant: str, force: bool) -> dict[str, Any]:
    import torch

    from rcpipe.inference import distributions
    from rcpipe.inference.reading import heldout_then_dev, split_of
    from rcpipe.scoring import metrics
    from rcpipe.trained.model_file import device_of, length_prior, load_model

    stamp = Stamp(f"evaluate-{variant}", of_stage(cfg, "evaluate", variant))
    outputs = [layout.predictions(variant), layout.nbest(variant), layout.dists(variant),
               layout.metrics(variant), layout.by_type(variant),
               layout.na_threshold_file(variant)]
    if not force and stamp.is_current(outputs):
        log.info("evaluate %s: the model, data and settings are those of %s; nothing to do",
                 variant, layout.metrics(variant))
        kept: dict[str, Any] = reads.read_json(layout.metrics(variant))
        return kept
    device = device_of(cfg)
    model, _ = load_model(cfg, variant)
    model.to(device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    doc = load_document(cfg.data.dev_file, cfg.data.cache_dir, cfg.limits)
    # whole contexts, each longer one read as data.window's windows
    # read a chunk at a time (a dev set of any size: inference/reading.py's EVAL_CHUNK)
    dev = split_of(Prepared(cfg.data.out_dir).dev, doc)
    heldout, source = _heldout(cfg, metrics.dataset_version(doc) == "2.0")
    t0 = time.perf_counter()
    ev, held = heldout_then_dev(model, dev, heldout, source, device, cfg.eval.max_answer_len,
                                cfg.eval.na_threshold, length_prior(cfg), cfg.data.window,
                                token_probs=True)
    dists = {"dev": distributions.split_off(ev.nbest)} | (
        {"heldout": distributions.split_off(held.nbest)} if held else {})
    preds = ev.predictions
    na = ev.na_probs if metrics.dataset_version(doc) == "2.0" else None
    chosen = ev.result.get("na_threshold_source")
    folders = [layout.PREDICTIONS, layout.METRICS, layout.model_dir(variant), layout.STAMPS]
    with output_set(f"evaluate-{variant}", folders) as files:
        files.remove(layout.stamp(stamp.name))  # the old set's stamp goes with it
        files.write_json(layout.predictions(variant), preds)
        files.write_json(layout.nbest(variant), ev.nbest)
        files.write(layout.dists(variant), distributions.to_parquet(dists))
        files.write_json(layout.metrics(variant), ev.result)
        files.write_json(layout.by_type(variant), metrics.breakdown(doc, preds, na))
        files.write_json(layout.na_threshold_file(variant), {
            "na_threshold": ev.na_threshold, "fixed": cfg.eval.na_threshold is not None,
            "source": chosen, "chosen_on": _chosen_on(cfg, chosen)})
    stamp.keep()  # after the set: killed between the two, the next run evaluates again
    em, f1 = metrics.headline(ev.result)
    at = f" at no-answer threshold {ev.na_threshold:.3g} (chosen on {chosen}; dev's own " \
         f"best, the oracle: F1 {ev.result['oracle']['best_f1']:.2f})" \
        if ev.na_threshold is not None else ""
    long = [v["windows"] for v in ev.nbest.values() if v["windows"] > 1]
    read = f"; {len(long)} read as {sum(long)} windows (data.window)" if long else ""
    log.info("evaluate %s: EM %.2f F1 %.2f on %d dev questions%s%s (%.1fs)", variant, em, f1,
             len(preds), at, read, time.perf_counter() - t0)
    return ev.result


def _heldout(cfg: Config, v2: bool) -> tuple[Any, str | None]:
    """(the held-out Split, its source), or (None, None) where prepare held none out: a
    v2.0 threshold is chosen on it, and its distributions are what `rcpipe ensemble`
    chooses weights on. None prepared where a v2.0 threshold needs it is the user's to fix,
    not a silent dev oracle."""
    from rcpipe.inference.reading import heldout_split

    prepared = Prepared(cfg.data.out_dir)
    found = prepared.heldout()
    if found is None and (not v2 or cfg.eval.na_threshold is not None):
        return None, None
    if found is None:
        raise InputError(prepared.meta_file, "heldout", "no held-out questions "
                         "to choose the no-answer threshold on: prepare with "
                         "data.heldout.fraction > 0 or data.heldout.file, or set "
                         "eval.na_threshold")
    return heldout_split(found, None, whole=False), found.source


def _chosen_on(cfg: Config, source: str | None) -> str | None:
    """The file the threshold was chosen on, for people (the model card says it)."""
    if source == "heldout":
        return f"{cfg.data.train_file} (held-out articles)"
    return source.removeprefix("file:") if source and source.startswith("file:") else None
