"""What a checkpoint directory holds, in one place (written by rank 0, read by the driver),
and what a finished run keeps of its checkpoints.

    state.pt    everything a resumed run needs: model, optimizer, scheduler, EMA, the
                sampler position (epoch, batch within it), every rank's RNG states (CPU, GPU), the
                best dev score so far, the evaluation history, elapsed seconds
    model.pt    the servable model (trained/model_file.py's payload: variant, model config,
                data-side inputs, vocab digest and the weights, EMA weights where the
                variant keeps an EMA)
    meta.json   step, epoch, dev scores and history, for people and the driver
    sums.json   each of the three's size and sha256, written last: a checkpoint is used
                (resumed from, or its model kept) only once its files match (``broken``);
                a truncated or half-copied one is passed by for the one before

Both .pt files hold only tensors and plain containers, so they load with
``torch.load(weights_only=True)``: loading never unpickles arbitrary objects.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from rcpipe import reads
from rcpipe.errors import InputError
from rcpipe.layout import CHECKPOINT_META, CHECKPOINT_SUMS, CURVE, MODEL, STATE, SUMMARY
from rcpipe.outputs import output_set
from rcpipe.train.progress import finished

# a checkpoint's folder: step-<8 digits> (name order is step order), or step-<8 digits>-r<k>
# where the run saved that step again after passing by a broken one there on resume: Ray
# Train keeps its record of the broken one, and evicting that record deletes its folder,
# which must not be the new checkpoint's
STEP_DIR = re.compile(r"step-(\d{8})(?:-r(\d+))?")


def step_dir(step: int, taken: Collection[str] = ()) -> str:
    """The folder name of a checkpoint at ``step``: the first of step-<8 digits>, then
    step-<8 digits>-r1, -r2, ... that is none of ``taken``."""
    name, again = f"step-{step:08d}", 0
    while name in taken:
        again += 1
        name = f"step-{step:08d}-r{again}"
    return name


def step_of(name: str) -> int | None:
    """The step of a checkpoint folder's name; None for any other name."""
    found = STEP_DIR.fullmatch(name)
    return int(found.group(1)) if found else None


# The score a run's checkpoints are ranked by, as each evaluation reports it (evaluation.py),
# and what it is measured on: Ray Train keeps the best checkpoints by it
# (cluster/train_job.py), the best one becomes model.pt (cluster/train_run.py) and `rcpipe tune`
# optimises it (cluster/search.py)
RANK_METRIC = "rank"


def rank_data(heldout_source: str | None) -> str:
    """The data RANK_METRIC was measured on, as tune/<variant>.yaml's header names it:
    prepare's held-out questions (their source), else dev (evaluation.scores)."""
    if heldout_source is None:
        return "the dev set (data.dev_file): prepare held nothing out"
    return f"the held-out questions ({heldout_source}, data.heldout), never trained on"


SEALED = (STATE, MODEL, CHECKPOINT_META)  # the files sums.json vouches for


def _sum(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}


def seal(checkpoint: Path) -> None:
    """Record each file's size and sha256 (after the files: written last)."""
    sums = {name: _sum(checkpoint / name) for name in SEALED}
    (checkpoint / CHECKPOINT_SUMS).write_text(json.dumps(sums, indent=1))


def broken(checkpoint: Path) -> str | None:
    """Why the checkpoint in ``checkpoint`` cannot be used (a file missing, truncated or
    changed since its save), or None when every file matches its recorded sum."""
    if not (checkpoint / CHECKPOINT_SUMS).is_file():
        return f"no {CHECKPOINT_SUMS} (its files were not all written)"
    try:
        sums = reads.read_json(checkpoint / CHECKPOINT_SUMS)
    except InputError as e:
        return f"{CHECKPOINT_SUMS} is not JSON ({e.what})"
    for name in SEALED:
        path, want = checkpoint / name, sums.get(name) or {}
        if not path.is_file():
            return f"{name} is missing"
        size, recorded = path.stat().st_size, want.get("bytes")
        if size != recorded:
            said = f"{recorded:,}" if isinstance(recorded, int) else "none"
            return f"{name} holds {size:,} bytes, {said} recorded"
        if _sum(path)["sha256"] != want.get("sha256"):
            return f"{name}'s sha256 is not the one recorded"
    return None


def first_whole(checkpoints: Iterable[Path], say: Callable[[str], None]) -> Path | None:
    """The first checkpoint of ``checkpoints`` whose files match their sums; ``say`` gets
    one line for each broken one passed by."""
    for checkpoint in checkpoints:
        why = broken(checkpoint)
        if why is None:
            return checkpoint
        say(f"checkpoint {checkpoint.name} is broken ({why}); passed by for the one before")
    return None


def read_meta(checkpoint: Path) -> dict[str, Any]:
    meta: dict[str, Any] = reads.read_json(checkpoint / CHECKPOINT_META)
    return meta


def finish_run(variant: str, run_dir: Path, meta: dict[str, Any], best: Path,
               wall_seconds: float, **extra: Any) -> dict[str, Any]:
    """The ending of every run, Ray Train's (cluster/train_run.py) and one process's
    (train/local.py): the ``best`` checkpoint's model.pt, the dev curve (metrics.json) and the
    summary from the latest checkpoint's ``meta`` (with ``extra``) in ``run_dir``, and the
    closing log line. The three are one set (rcpipe/outputs.py): a kill leaves the last
    run's three or these, never this model beside that summary."""
    summary = run_summary(variant, meta, wall_seconds) | extra
    with output_set("train", [run_dir]) as files:
        files.copy(run_dir / MODEL, best / MODEL)
        files.write_json(run_dir / CURVE, {"history": meta["history"]})
        files.write_json(run_dir / SUMMARY, summary)
    finished(summary)
    return summary


def run_summary(variant: str, meta: dict[str, Any], wall_seconds: float) -> dict[str, Any]:
    """summary.json's facts of a run, from its latest checkpoint's meta.json."""
    return {"variant": variant, "world_size": meta["world_size"], "steps": meta["step"],
            "epochs": meta["epoch"], "examples_per_s": meta["examples_per_s"],
            "resumed_from_step": meta["resumed_from_step"], "device": meta["device"],
            "wall_seconds": round(wall_seconds, 2), "train_seconds": round(meta["elapsed"], 2),
            # dev's scores of the checkpoint ranked best on ranked_on (the held-out
            # questions' source, or "dev" when prepare held none out)
            "best_dev_em": meta["best"]["em"], "best_dev_f1": meta["best"]["f1"],
            "best_heldout_f1": meta["best"].get("heldout_f1"),
            "ranked_on": meta.get("ranked_on", "dev"),
            "best_step": meta["best"]["step"], "history": meta["history"],
            # DDP keeps every rank's weights identical: one digest (one process: trivially)
            "replicas_in_sync": len(set(meta["replica_digests"])) == 1,
            # what each rank trained on, epoch by epoch: [rows, their ids' digest]
            "reads": meta.get("reads")}
