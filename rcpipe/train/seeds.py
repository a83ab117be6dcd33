"""A variant trained as ``models.<variant>.seeds`` runs: the one place that reads the setting.

Run k is one network at train.seed + k (``run_config``: the variant's settings with seeds 1),
keyed and trained as a variant of one run is. With one seed it trains into the model in
place, models/<variant>/; with several, each into models/<variant>/seeds/<seed>/, where it
stays: a finished one is not trained again (from 3 seeds to 4 trains one; an interrupted
run resumes), and the first is the run a single seed trains (the model in place is copied
there, and back when the variant returns to one seed: neither trains anything). Then the
model in place holds every run's weights side by side and answers with their mean
distributions (models/seed_mean.py; the model file records their count).

Every Job trains one network (train/job.py's ``make_job`` takes ``run_config``); how a run
trains is the caller's (``TrainOne``: on Ray Train, cluster/train_run.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rcpipe import layout
from rcpipe.config import Config
from rcpipe.fingerprints import Fingerprint
from rcpipe.outputs import OutputSet, output_set, settle
from rcpipe.train.runs import finished_in

log = logging.getLogger(__name__)

# one network's run of a config, keyed, into a folder: its summary
TrainOne = Callable[[Config, Fingerprint, Path], dict[str, Any]]


def run_config(cfg: Config, variant: str, k: int = 0) -> Config:
    """The config of the ``k``-th run of ``variant``: train.seed + k, one network (``cfg``
    itself where it is the first run's already: one seed)."""
    one = cfg.models.of(variant)
    if k == 0 and one.seeds == 1:
        return cfg
    one = one.model_copy(update={"seeds": 1})
    return cfg.model_copy(update={
        "train": cfg.train.model_copy(update={"seed": cfg.train.seed + k}),
        "models": cfg.models.model_copy(update={variant: one})})


def finished(cfg: Config, variant: str, key: Fingerprint) -> dict[str, Any] | None:
    """The summary of the model in place when it finished training with ``key``'s inputs;
    with one seed, also the first run of a variant of several, brought back in place."""
    if (done := finished_in(layout.model_dir(variant), key)) is not None:
        return done
    if cfg.models.of(variant).seeds > 1:
        return None
    kept = layout.seed_dir(variant, cfg.train.seed)  # a run of several seeds' first
    if (done := finished_in(kept, key)) is not None:
        copy_run(kept, layout.model_dir(variant))  # back to one seed trains nothing
    return done


def train(cfg: Config, variant: str, key: Fingerprint, force: bool,
          key_of: Callable[[Config], Fingerprint], train_one: TrainOne) -> dict[str, Any]:
    """The model in place of ``variant`` from its runs, each ``train_one`` (keyed by
    ``key_of``) unless it finished; ``force``: each trained anew; ``key``: the variant's."""
    seeds = cfg.models.of(variant).seeds
    if seeds == 1:
        return train_one(cfg, key, layout.model_dir(variant))
    done = []
    for k in range(seeds):
        one = run_config(cfg, variant, k)
        out, one_key = layout.seed_dir(variant, one.train.seed), key_of(one)
        settle(out)  # a seed's set a killed stage committed: whole first
        if k == 0 and not force and finished_in(layout.model_dir(variant), one_key) is not None:
            copy_run(layout.model_dir(variant), out)  # the model in place is this run
        found = None if force else finished_in(out, one_key)
        if found is not None:
            log.info("train %s: seed %d already finished with these inputs (%s)", variant,
                     one.train.seed, out)
        done.append((out, found or train_one(one, one_key, out)))
    return _together(cfg, variant, key, done)


def copy_run(source: Path, out: Path) -> None:
    """A finished run's files (model, summary, curve, live/) from ``source`` to ``out``, as
    one set: the model in place to a seed's folder (from one seed to several trains only
    the others) or back (from several to the first alone trains nothing)."""
    with output_set("train", [out]) as files:
        _copy_files(files, source, out, (layout.MODEL, layout.SUMMARY, layout.CURVE))


def _copy_files(files: OutputSet, source: Path, out: Path, names: tuple[str, ...]) -> None:
    """``names`` of a run's folder and every file of its live/, from ``source`` to ``out``
    in the set ``files`` (those that are there)."""
    for f in [*(source / n for n in names), *sorted((source / layout.LIVE).rglob("*"))]:
        if f.is_file():
            files.copy(out / f.relative_to(source), f)


def _together(cfg: Config, variant: str, key: Fingerprint,
              done: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """The model in place from the seeds' runs: their weights side by side (``replicas.<k>.``,
    models/seed_mean.py), the summary their facts (the cost summed: every run was paid
    for), the curve and live/ the first run's with every run's curve beside."""
    import torch

    from rcpipe.trained.model_file import read_payload, side_by_side

    payload = side_by_side([read_payload(out / layout.MODEL, cfg.limits) for out, _ in done])
    runs = [s for _, s in done]
    summary = {
        "variant": variant, "seeds": [
            {"seed": cfg.train.seed + k} | {f: s.get(f) for f in (
                "run", "steps", "best_step", "best_dev_em", "best_dev_f1", "best_heldout_f1",
                "wall_seconds")} for k, s in enumerate(runs)],
        "world_size": runs[0]["world_size"], "device": runs[0]["device"],
        "steps": sum(s["steps"] for s in runs), "epochs": sum(s["epochs"] for s in runs),
        "wall_seconds": round(sum(s["wall_seconds"] for s in runs), 2),
        "train_seconds": round(sum(s["train_seconds"] for s in runs), 2),
        "examples_per_s": sum(s["examples_per_s"] for s in runs) / len(runs),
        "ranked_on": runs[0].get("ranked_on"), "run": ",".join(s.get("run", "") for s in runs),
        "finished": True, "fingerprint": key.as_dict()}
    model_dir, first = layout.model_dir(variant), done[0][0]
    with output_set("train", [model_dir]) as files:
        torch.save(payload, files.path(model_dir / layout.MODEL))  # staged with the rest
        files.write_json(model_dir / layout.CURVE, {
            "history": runs[0]["history"],
            "seeds": {str(cfg.train.seed + k): s["history"] for k, s in enumerate(runs)}})
        files.write_json(model_dir / layout.SUMMARY, summary)
        _copy_files(files, first, model_dir, ())  # the first run's live/
    log.info("train %s: %d runs (seeds %s) -> %s, answering with their mean distributions; "
             "best dev F1 of each %s", variant, len(runs),
             ", ".join(str(s["seed"]) for s in summary["seeds"]), layout.model_file(variant),
             ", ".join(f"{s['best_dev_f1']:.2f}" for s in runs))
    return summary
