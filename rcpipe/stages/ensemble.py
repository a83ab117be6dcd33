"""`rcpipe ensemble`: the evaluated variants' answers combined (ensemble.method: the majority
vote, the mean of their distributions, or the mean with weights chosen on the held-out
questions), every method scored side by side."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rcpipe import layout, reads
from rcpipe.config import VARIANTS, Config
from rcpipe.data.prepared import Prepared
from rcpipe.data.squad import load_document, read_mapping
from rcpipe.errors import InputError
from rcpipe.fingerprints import Stamp, of_stage
from rcpipe.locks import hold
from rcpipe.outputs import output_set, settle

log = logging.getLogger(__name__)


def ensemble(cfg: Config, inputs: list[Path] | None = None,
             out: Path = layout.predictions(layout.ENSEMBLE), force: bool = False,
             wait: bool = False) -> dict[str, Any]:
    """The variants' answers combined by ensemble.method; scored against data.dev_file,
    with every method's scores under "methods" (the mean and selected ones where each input
    has its distributions beside it: predictions/<name>.dists.parquet, which `rcpipe
    evaluate` writes). The metrics file holds the chosen method's scores; the methods, with
    the weights chosen on the held-out questions, are metrics/<name>.methods.json.

    vote: majority vote over the nbest files.

    SQuAD v2.0: each voter's answer is already given at its own no-answer threshold, chosen
    on the held-out questions (`rcpipe evaluate`), "" when it abstained, and the vote takes
    "" like any text: the voted answers are scored as they are (na_threshold_source
    "voters"), with no threshold of the ensemble's own; the walk over the voters' mean
    na_prob on dev is reported only as the "oracle". When the voters' files and the dev set
    are those the outputs were made from, nothing is done (``force``: vote anyway). The
    five files are one set (rcpipe/outputs.py), one writer at a time (``wait``: for it)."""
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
    dists = [dists_of(p) for p in inputs]
    prepared = Prepared(cfg.data.out_dir)
    stamp = Stamp(f"ensemble-{name}", of_stage(cfg, "ensemble", each=[*inputs, *dists],
                                                args={"out": str(out)}))
    outputs = [out, out.with_suffix(".nbest.json"), layout.metrics(name), layout.by_type(name),
               layout.methods(name)]
    if not force and stamp.is_current(outputs):
        log.info(f"ensemble: the voters and the dev set are those of {out}; nothing to do")
        kept: dict[str, Any] = reads.read_json(layout.metrics(name))
        return kept | reads.read_json(layout.methods(name))
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
    methods = {"vote": _summary(result)}
    if all(d.is_file() for d in dists):
        averaged = _averaged(cfg, inputs, dists, prepared, doc)
        methods |= {m: _summary(r) | extra for m, (_, r, extra) in averaged.items()}
        if cfg.ensemble.method != "vote":
            if cfg.ensemble.method not in averaged:
                raise InputError(prepared.meta_file, "heldout", "ensemble.method selected "
                                 "chooses weights on the held-out questions: prepare held "
                                 "none out (data.heldout)")
            voted, result, _ = averaged[cfg.ensemble.method]
            preds = vote.predictions_from(voted)
            na = {q: v["na_prob"] for q, v in voted.items()} if na is not None else None
    elif cfg.ensemble.method != "vote":
        missing = next(d for d in dists if not d.is_file())
        raise InputError(missing, "", f"no distributions for ensemble.method "
                         f"{cfg.ensemble.method}: run `rcpipe evaluate` for its variant again")
    how = {"method": cfg.ensemble.method, "methods": methods}
    with output_set(f"ensemble-{name}", [out.parent, layout.METRICS, layout.STAMPS]) as files:
        files.remove(layout.stamp(stamp.name))  # the old vote's stamp goes with it
        files.write_json(out, preds)
        files.write_json(out.with_suffix(".nbest.json"), voted)
        files.write_json(layout.metrics(name), result)
        files.write_json(layout.by_type(name), metrics.breakdown(doc, preds, na))
        files.write_json(layout.methods(name), how)
    stamp.keep()
    result |= how
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


def dists_of(nbest: Path) -> Path:
    """The distributions file beside an nbest file (layout.dists beside layout.nbest)."""
    return nbest.with_name(nbest.name.removesuffix(".nbest.json") + ".dists.parquet")


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    from rcpipe.scoring import metrics

    em, f1 = metrics.headline(result)
    # v2.0's threshold where the method has its own (the gate and the champion answer at it)
    return {"em": em, "f1": f1} | ({"na_threshold": result["na_threshold"]}
                                   if result.get("na_threshold") is not None else {})


def _averaged(cfg: Config, inputs: list[Path], dists: list[Path], prepared: Prepared,
              doc: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any],
                                                       dict[str, Any]]]:
    """inference/ensemble.py's ``averaged`` over the inputs' distributions files, dev the
    prepared dev split and the held-out questions prepare set aside."""
    from rcpipe.data.dataset import SquadDataset
    from rcpipe.inference import distributions
    from rcpipe.inference.ensemble import averaged
    from rcpipe.inference.reading import Split, heldout_split

    cap = int(cfg.limits.json_mb * reads.MB)
    read = [distributions.parse(reads.read_bytes(p, cap, "limits.json_mb"), p) for p in dists]
    dev = Split(SquadDataset.from_parquet(prepared.dev), doc)
    found = prepared.heldout()
    held = heldout_split(found, None) if found is not None else None
    for part, split in (("dev", dev), ("heldout", held)):
        for path, d in zip(dists, read, strict=True):
            if split is not None and (lost := next(
                    (q for q in split.dataset.ids if q not in d[part]), None)):
                raise InputError(path, f"{part} {lost}", "no distributions for this question "
                                 "of the prepared data: evaluate again")
    names = [p.name.removesuffix(".nbest.json") for p in inputs]
    return averaged(dict(zip(names, read, strict=True)), dev, held, cfg.eval.max_answer_len,
                    cfg.ensemble.rounds)


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
