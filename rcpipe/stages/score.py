"""`rcpipe score`: the official SQuAD script's numbers for a predictions file."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rcpipe.data.squad import load_document, read_mapping
from rcpipe.errors import InputError

log = logging.getLogger(__name__)


def score(dataset: str, predictions: Path, na_prob_file: Path | None = None,
          na_prob_thresh: float = 1.0, cache_dir: Path = Path("data/cache")) -> dict[str, Any]:
    """The official SQuAD script's numbers for a predictions file (v1.1/v2.0 by version)."""
    from rcpipe.scoring import metrics

    doc = load_document(dataset, cache_dir)
    try:
        metrics.dataset_version(doc)
    except ValueError as e:
        raise InputError(dataset, "version", str(e)) from None
    preds = read_mapping(predictions, str, "an answer string")
    na_probs = None
    if na_prob_file is not None:
        na_probs = read_mapping(na_prob_file, (int, float), "a probability")
        missing = next((q for q in preds if q not in na_probs), None)
        if missing is not None:
            raise InputError(na_prob_file, json.dumps([missing]), "no probability for this id")
    try:
        result = metrics.score(doc, preds, na_probs, na_prob_thresh)
    except ValueError as e:  # v2.0 predictions answering no question; a v1.1 question
        # without answers or a dataset without questions (the official scripts crash on those)
        culprit = predictions if "predictions" in str(e) else dataset
        raise InputError(culprit, "", str(e)) from None
    qids = [qa["id"] for article in doc["data"] for p in article["paragraphs"]
            for qa in p["qas"]]
    matched = sum(q in preds for q in qids)
    if not matched:  # the wrong dataset or predictions file: not a score of 0
        raise InputError(predictions, "", f"no id matches a question of {dataset} "
                         f"({len(preds)} predictions, {len(qids)} questions)")
    if matched < len(qids):
        log.warning(f"score: {matched} of {len(qids)} questions have a prediction; the "
                    f"other {len(qids) - matched} score 0, as the official script scores them")
    return result
