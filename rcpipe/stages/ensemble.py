"""`rcpipe ensemble`: the majority vote of the evaluated variants' answers, and its scores."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rcpipe import layout, reads
from rcpipe.config import VARIANTS, Config
from rcpipe.data.squad import load_document
from rcpipe.errors import InputError
from rcpipe.fingerprints import Stamp, source_identity
from rcpipe.locks import hold
from rcpipe.outputs import output_set, settle
from rcpipe.stages.io import read_mapping

log = logging.getLogger(__name__)


def ensemble(cfg: Config, inputs: list[Path] | None = None,
             out: Path = layout.predictions(layout.ENSEMBLE), force: bool = False,
             wait: bool = False) -> dict[str, Any]:
    """Majority vote over the variants' nbest files; score it against data.dev_file.

    SQuAD v2.0: each voter's answer is already given at its own no-answer threshold, chosen
    on the held-out questions (`rcpipe evaluate`), "" when it abstained, and the vote takes
    "" like any text: the voted answers are scored as they are (na_threshold_source
    "voters"), with no threshold of the ensemble's own; the walk over the voters' mean
    na_prob on dev is reported only as the "oracle". When the voters' files and the dev set
    are those the outputs were made from, nothing is done (``force``: vote anyway). The
    four files are one set (rcpipe/outputs.py), one writer at a time (``wait``: for it)."""
    # the lock beside out's folder: a refused vote leaves no file in it
    with hold(out.parent, f"{out} is being voted", wait):
        settle(out.parent, layout.METRICS)
        return _ensemble(cfg, inputs, out, force)


def _ensemble(cfg: Config, inputs: list[Path] | None, out: Path, force: bool
              ) -> dict[str, Any]:
    from rcpipe.inference import ensemble as vote
    from rcpipe.scoring import metrics

    if not inputs:
        inputs = [p for v in VARIANTS if (p := layout.nbest(v)).is_file()]
        if not inputs:
            raise InputError("predictions/", "", "no <variant>.nbest.json to ensemble; run "
                             "`rcpipe evaluate VARIANT` first or pass --inputs")
    name = out.name.removesuffix(".json")
    stamp = Stamp.of(f"ensemble-{name}", "ensemble", inputs,
                     {"dev_file": source_identity(cfg.data.dev_file), "out": str(out)})
    outputs = [out, out.with_suffix(".nbest.json"), layout.metrics(name), layout.by_type(name)]
    if not force and stamp.is_current(outputs):
        log.info(f"ensemble: the voters and the dev set are those of {out}; nothing to do")
        kept: dict[str, Any] = reads.read_json(layout.metrics(name))
        return kept
    nbests = [_read_nbest(p) for p in inputs]
    voted = vote.majority_vote(nbests)
    doc = load_document(cfg.data.dev_file, cfg.data.cache_dir, cfg.limits)
    preds = vote.predictions_from(voted)
    na = {q: v["na_prob"] for q, v in voted.items()} if metrics.dataset_version(doc) == "2.0" \
        else None
    try:
        result = metrics.score(doc, preds, na)
    except ValueError as e:  # e.g. v2.0 nbest files whose ids are not the dev file's
        raise InputError(cfg.data.dev_file, "", str(e)) from None
    if na is not None:
        result = metrics.at_threshold(result, None, "voters") | {"voters": _sources(inputs)}
    with output_set(f"ensemble-{name}", [out.parent, layout.METRICS, layout.STAMPS]) as files:
        files.remove(layout.stamp(stamp.name))  # the old vote's stamp goes with it
        files.write_json(out, preds)
        files.write_json(out.with_suffix(".nbest.json"), voted)
        files.write_json(layout.metrics(name), result)
        files.write_json(layout.by_type(name), metrics.breakdown(doc, preds, na))
    stamp.keep()
    log.info(f"ensemble of {len(inputs)} models -> {out}: "
             + ", ".join(f"{k} {v:.2f}" for k, v in result.items() if k in _HEADLINE))
    return result


_HEADLINE = ("exact_match", "exact", "f1")


def _sources(inputs: list[Path]) -> dict[str, str | None]:
    """Each voter's no-answer threshold source, where its nbest file is a variant's
    (predictions/<variant>.nbest.json beside models/<variant>/na_threshold.json)."""
    found: dict[str, str | None] = {}
    for path in inputs:
        name = path.name.removesuffix(".nbest.json")
        chosen = layout.na_threshold_file(name)
        if name in VARIANTS and chosen.is_file():
            found[name] = reads.read_json(chosen).get("source")
    return found


def _read_nbest(path: Path) -> dict[str, dict[str, Any]]:
    obj = read_mapping(path, dict, "an object {text, prob, na_prob}")
    for qid, v in obj.items():
        where = json.dumps([qid])
        if not isinstance(v.get("text"), str):
            raise InputError(path, where, "missing string 'text'")
        for key in ("prob", "na_prob"):  # majority_vote reads both: a missing one is an error
            if not isinstance(v.get(key), int | float) or isinstance(v.get(key), bool):
                raise InputError(path, f"{where}.{key}", "expected a number")
    return obj
