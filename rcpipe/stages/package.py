"""`rcpipe package VARIANT [--out DIR]`: a trained, evaluated variant (or the student of
`rcpipe distill`) as a directory people can take away (trained/package_dir.py:
model.safetensors, config.json, vocab.json, na_threshold.json for SQuAD v2.0, README.md, the
model card; a student's says what it was distilled from).

Reads models/<V>/model.pt (trained/model_file.py), metrics/<V>.json and .by_type.json,
models/<V>/summary.json and na_threshold.json, <data.out_dir>/vocab.json, meta.json and
report.json, and the SQuAD files (for their sha256); writes DIR (default packages/<V>/).
No training code is imported.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from rcpipe import layout, reads
from rcpipe.config import Config, effective_yaml
from rcpipe.errors import InputError
from rcpipe.layout import NA_THRESHOLD
from rcpipe.locks import hold
from rcpipe.outputs import output_set, settle
from rcpipe.variants import REGISTRY

log = logging.getLogger(__name__)


def _json(path: Path, hint: str | None = None) -> Any:
    if not path.is_file():
        if hint is None:
            return None
        raise InputError(path, "", f"no such file; {hint}")
    return reads.read_json(path)


def _teacher() -> dict[str, Any]:
    """Who the student learnt from: its teacher's members, method and their shares."""
    from rcpipe.data.teacher import read_record

    return dict(read_record(layout.teacher_dir()).get("teacher") or {})


def package(cfg: Config, variant: str, out: Path | None = None, wait: bool = False) -> Path:
    """Write the package of ``variant`` to ``out`` (default packages/<variant>); returns it.
    Under models/<variant>/'s lock (what it reads is one model's, not half a new one's) and
    out's (one writer); ``wait``: for their holders. The package's files are one set
    (rcpipe/outputs.py): a kill leaves the old package whole or the new one."""
    out = out or layout.package_dir(variant)
    cfg.model_of(variant)  # an unknown variant is an InputError naming the choices
    with hold(layout.model_dir(variant), f"{variant} is being packaged", wait), \
            hold(out, f"{out} is being packaged", wait):
        settle(layout.model_dir(variant), layout.PREDICTIONS, layout.METRICS, out)
        return _package(cfg, variant, out)


def _package(cfg: Config, variant: str, out: Path) -> Path:
    from rcpipe.data.prepared import Prepared
    from rcpipe.data.squad import fetch
    from rcpipe.trained.model_file import length_prior, load_payload, threshold_for
    from rcpipe.trained.package_dir import model_card, package_files

    d = Prepared(cfg.data.out_dir)
    metrics = _json(layout.metrics(variant), f"run `rcpipe evaluate {variant}` first")
    by_type = _json(layout.by_type(variant))
    summary = _json(layout.summary_file(variant))
    meta = _json(d.meta_file, "run `rcpipe prepare` first")
    report = _json(d.report) or {}
    model, inputs, saved = load_payload(cfg, variant)
    threshold = _json(layout.na_threshold_file(variant)) if inputs.no_answer else None
    if inputs.no_answer and threshold is None:
        raise InputError(layout.na_threshold_file(variant), "", f"no such file; run `rcpipe "
                         f"evaluate {variant}` first")
    fixed = threshold_for(cfg, None)  # eval.na_threshold's, which wins over evaluate's
    if threshold is not None and fixed is not None:  # the package says so
        threshold = {**threshold, "na_threshold": fixed, "fixed": True, "source": "params",
                     "chosen_on": None}
    sources = [{"split": split, "uri": uri,
                "sha256": reads.sha256_of(fetch(uri, cfg.data.cache_dir, limits=cfg.limits))}
               for split, uri in (("train", cfg.data.train_file), ("dev", cfg.data.dev_file))]
    prior = length_prior(cfg)
    network = cfg.network_of(variant)  # the student's: distill.student's
    config = {
        "variant": network, "paper": REGISTRY[network].cite,
        # a student: what it learnt from (its teacher's record, data/teacher.py)
        **({"distilled_from": _teacher()} if variant == layout.STUDENT else {}),
        "model_config": saved["model_config"], "inputs": saved["inputs"],
        "data": {"version": meta["version"]["train"],
                 "limits": cfg.data.limits.model_dump(),
                 "char_limit": meta.get("char_limit", cfg.data.limits.char),
                 "window": cfg.data.window.model_dump(), "sources": sources,
                 "questions": report},
        "decoding": {"max_answer_len": cfg.eval.max_answer_len,
                     "length_prior": None if prior is None else prior.tolist()},
        "metrics": metrics,
        "params_sha256": hashlib.sha256(effective_yaml(cfg).encode()).hexdigest(),
    }
    card = model_card(config, metrics, by_type, summary, sources, report, threshold)
    files = package_files(config, model.state_dict(), d.vocab_file.read_bytes(),
                          threshold, card)
    with output_set("package", [out]) as written:
        for name, data in files.items():
            written.write(out / name, data)
        if NA_THRESHOLD not in files:  # a v1.1 model's package has none: an old one goes
            written.remove(out / NA_THRESHOLD)
    log.info(f"package {variant}: {', '.join(sorted(files))} -> {out}")
    return out
