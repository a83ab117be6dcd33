"""`rcpipe tune VARIANT`: search a variant's settings (cluster/search.py), write the best.

Layout: tune/<variant>.yaml (the best trial's settings as a params layer: only the searched
keys, under models.<variant> / train.*, with a header saying when, from how many trials,
its score and on which data), tune/<variant>.trials.json (every trial: settings, status,
best score, curve; the report's table and plot), and the search's Ray Tune run with its
trials' Ray Train runs under tune/<variant>/ (or train.storage_path/tune/<variant>).
Running it again resumes an interrupted search (finished trials are not run again) or, when
the search finished with the same inputs, does nothing; a search is keyed as every stage is
(rcpipe/fingerprints.py: the prepared data its trials train on, the params, its own
settings, its code), and one of other inputs searches anew, saying what changed; ``force``
starts over.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import yaml

from rcpipe import layout, reads
from rcpipe.cluster import opening
from rcpipe.config import Config, ModelConfig, lay, space_values
from rcpipe.config.section import flatten
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError
from rcpipe.fingerprints import Fingerprint, code_from, of_stage

if TYPE_CHECKING:  # the stages load no training code until a search runs
    from rcpipe.cluster.search import Plan

log = logging.getLogger(__name__)


def tune(cfg: Config, variant: str, force: bool = False, run: str | None = None,
         detach: bool = False) -> dict[str, Any]:
    """Search ``variant``'s settings on Ray Tune; the summary of tune/<variant>.trials.json.

    Through a cluster's Jobs API the search is a Ray job on the head (``run``, ``detach``:
    as `rcpipe train`)."""
    from rcpipe.cluster import search

    opening.check_trainable(cfg, variant)
    trials_path = layout.tune_trials(variant)
    if opening.through_jobs_api(cfg):
        return opening.as_ray_job(cfg, variant, force, run, detach, "tune",
                                  lambda: _finished(trials_path, None), trials_path,
                                  "trials file")
    storage = opening.run_storage(cfg, f"tune/{variant}", layout.tune_run(variant))
    key = _key(cfg, variant)
    digest = key.digest
    if force:
        opening.forget(storage)
        for path in (trials_path, layout.tune_params(variant)):
            path.unlink(missing_ok=True)
    elif (done := _finished(trials_path, digest)) is not None:
        log.info("tune %s: already finished (%s); nothing to do", variant, trials_path)
        return done
    inputs = opening.model_inputs(cfg)
    _check_trials_build(cfg, variant, inputs)
    dev_doc = opening.dev_document(cfg)
    data = opening.job_data(cfg)
    with opening.on_ray(cfg):
        plan = search.plan(cfg, variant)
        _same_search_or_anew(variant, storage, key)
        trials, ended = search.run(cfg, variant, inputs, dev_doc, data, storage, plan)
    return _write(cfg, variant, trials, plan, digest, ended)


def _write(cfg: Config, variant: str, trials: list[dict[str, Any]], plan: Plan,
           digest: str, ended: bool) -> dict[str, Any]:
    """The layer and the trials' file; an interrupted search (``ended`` False) writes them
    too, from the trials so far, marked unfinished: the next run resumes it."""
    from rcpipe.cluster.search import chosen_layer, rounded
    from rcpipe.train.checkpoint import RANK_METRIC, rank_data

    scored = [t for t in trials if t["best"] is not None]
    if not scored:
        raise InputError(layout.tune_run(variant), "", f"no trial of {len(trials)} reported "
                         f"a score (see the trials' errors under {layout.tune_run(variant)})")
    best = max(scored, key=lambda t: t["best"])
    # the search's own cost: its first report to its last, resumes included
    seconds = max((t["curve"][-1][0] for t in scored), default=0.0)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    finished = sum(t["status"] == "finished" for t in trials)
    held = Prepared(cfg.data.out_dir).heldout()
    data = rank_data(held.source if held else None)
    header = (f"# rcpipe tune {variant}, {when}: the best of {len(trials)} trials (ASHA on "
              f"Ray Tune, up to {plan.budget} each, {finished} ran them all)\n"
              f"# is trial {best['id']}: {RANK_METRIC} {best['best']:.2f} at step "
              f"{best['best_step']}, measured on {data}.\n"
              f"# Train with it: rcpipe train {variant} --params {cfg.source} --params "
              f"{layout.tune_params(variant)}\n")
    best["settings"] = rounded(best["settings"])
    layer = chosen_layer(variant, best["settings"])
    layout.write(layout.tune_params(variant),
                 header + yaml.safe_dump(layer, sort_keys=False, default_flow_style=False))
    summary = {"variant": variant, "when": when, "metric": RANK_METRIC, "data": data,
               "minutes": round(seconds / 60, 2), "budget": plan.budget,
               "max_steps": int(plan.max_t) if plan.attr == "step" else 0,
               "trials": len(trials), "finished": ended, "digest": digest,
               "best": {k: best[k] for k in ("id", "best", "best_step", "settings")},
               "layer": str(layout.tune_params(variant))}
    layout.write_json(layout.tune_trials(variant), summary | {"rows": trials})
    log.info("tune %s: best trial %s, %s %.2f; settings in %s", variant, best["id"],
             RANK_METRIC, best["best"], layout.tune_params(variant))
    return summary


def _finished(path: Any, digest: str | None) -> dict[str, Any] | None:
    """The summary of a search that finished (with these settings, unless None), or None."""
    if not path.is_file():
        return None
    done: dict[str, Any] = reads.read_json(path)
    if not done.get("finished") or (digest is not None and done.get("digest") != digest):
        return None
    return {k: v for k, v in done.items() if k != "rows"}


def _key(cfg: Config, variant: str) -> Fingerprint:
    """What a search is: its trials' training, keyed by the table's rule for the variant's
    training run (fingerprints.of_stage of ``train``: models.<variant>, the training params,
    the prepared data, its code), and its own settings (the budget, this variant's space)
    and code. A setting no trial reads (serve.*, another variant's model, limits, where
    the cluster is: UNKEYED) is no part of it, so changing one never forgets the trials."""
    trials = of_stage(cfg, "train", variant)
    tune = cfg.tune.model_dump(mode="json")
    own = {k: v for k, v in tune.items() if k not in type(cfg.models).model_fields}
    return Fingerprint(trials.files, {**trials.settings,
                                      **flatten({"tune": own | tune[variant]})},
                       {**trials.code, **code_from("rcpipe/stages/tune.py")})


def _same_search_or_anew(variant: str, storage: tuple[str, Any], key: Fingerprint) -> None:
    """Record the search's key beside its run; a search stored there of other inputs is
    forgotten, with a line saying what changed (as a training run of other inputs trains
    anew), and this one starts in its place."""
    from pyarrow import fs

    path, filesystem = storage
    filesystem = filesystem or fs.LocalFileSystem()
    marker = f"{path}/search.json"
    if filesystem.get_file_info(marker).type != fs.FileType.NotFound:
        with filesystem.open_input_stream(marker) as f:
            seen = reads.parse_json(reads.read_up_to(f, reads.MB + 1), marker)
        if isinstance(seen, dict) and seen.get("digest") == key.digest:
            return
        said = key.changes(Fingerprint.from_dict(seen if isinstance(seen, dict) else {}))
        log.info("tune %s: %s; searching anew", variant, said or "another search")
        opening.forget(storage)
    filesystem.create_dir(path, recursive=True)
    with filesystem.open_output_stream(marker) as f:
        f.write(json.dumps({"digest": key.digest} | key.as_dict()).encode())


def _check_trials_build(cfg: Config, variant: str, inputs: Any) -> None:
    """Build the model at every value of each architecture key the search tries, here,
    so a size that cannot build fails now, not in a trial."""
    arch = set(ModelConfig.architecture_fields())
    own = cfg.models.of(variant).model_dump()
    for key, spec in cfg.tune.of(variant).space.items():
        if key.split(".")[0] not in arch:
            continue
        for value in space_values(spec):
            opening.check_build(cfg, variant, inputs, f"tune.{variant}.space.{key}",
                                partial(_trial_model, own, key, value), f"{value!r}: ")


def _trial_model(own: dict[str, Any], key: str, value: Any) -> ModelConfig:
    """The variant's settings with one searched key at ``value``."""
    return ModelConfig.model_validate(lay(own, key, value))
