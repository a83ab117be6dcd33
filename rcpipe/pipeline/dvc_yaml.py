"""dvc.yaml, made from the stage table (stages.py) and each stage's code (code.py).

    .venv/bin/python -m rcpipe.pipeline.dvc_yaml          writes dvc.yaml
    .venv/bin/python -m rcpipe.pipeline.dvc_yaml --check  exit 1 when dvc.yaml is stale
    .venv/bin/python -m rcpipe.pipeline.dvc_yaml --variants bidaf,qanet
                                                          a pipeline of those alone
    .venv/bin/python -m rcpipe.pipeline.dvc_yaml --no-student
                                                          without the distill stage

The file is checked in, as DVC users expect one they can read; tests/test_dvc_pipeline.py
fails when it differs from what this module makes. DVC cannot make a list of files from
params.yaml (the ensemble's and report's inputs), so a workspace that trains some variants
only writes its own dvc.yaml with --variants: every variant's stages and plots are the same
rows with fewer names, and `rcpipe version` commits the variants that file trains.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rcpipe import layout
from rcpipe.pipeline.code import ROOT, code_deps
from rcpipe.pipeline.stages import STAGES, VARIANT, VARIANTS, Stage

DVC_YAML = ROOT / "dvc.yaml"
DISTILL = "distill"  # the stage a pipeline without a student leaves out (--no-student)
HEADER = """\
# GENERATED from rcpipe/pipeline/stages.py by `python -m rcpipe.pipeline.dvc_yaml`: edit the
# table there, not this file (tests/test_dvc_pipeline.py fails when the two differ).
#
# The pipeline as DVC stages: `dvc repro` runs what changed, `dvc push` / `dvc pull` move
# the results through the S3 remote (docs/guide: versioning).
#
#   {order}
#
# Every stage is one `rcpipe` command, the same code the CLI and the Prefect flow run.
# `params` lists the params.yaml keys a stage's outputs depend on: keys that only say where
# or how fast to run are left out (data.workers, on_ray; train.device, threads, cpus_per_worker,
# ray_address, storage_path, max_failures, keep_checkpoints, keep_runs), so a cluster run may
# set them with --set and dvc.lock still describes its outputs. `deps` are the files a stage
# reads, then the code it runs (its entry module's rcpipe imports, transitively: a folder
# where it runs every module in it).
"""


def _outs(paths: list[str], s: Stage) -> list[Any]:
    return [{p: {"persist": True, **({"desc": s.notes[p]} if p in s.notes else {})}}
            if p in s.persist else ({p: {"desc": s.notes[p]}} if p in s.notes else p)
            for p in paths]


def stage_entry(s: Stage, variants: Sequence[str] = VARIANTS, student: bool = True
                ) -> dict[str, Any]:
    v = VARIANT if s.per_variant else ""
    entry: dict[str, Any] = {
        "desc": s.desc, "cmd": s.cmd(v),
        "params": s.keys(),
        "deps": [*s.reads(variants, v, student), *code_deps(s.entry)],
        "outs": _outs(s.outs(v), s)}
    if metrics := s.metrics(v):
        entry["metrics"] = metrics
    return {"foreach": list(variants), "do": entry} if s.per_variant else entry


def plots(variants: Sequence[str] = VARIANTS, student: bool = True) -> list[Any]:
    """What `dvc plots show` draws: each variant's curves as training writes them
    (rcpipe/train/progress.py: dvclive's files), and the report's charts and images (the
    student's beside the ensemble's where the pipeline distills one)."""
    def curve(title: str, metric: str, column: str) -> dict[str, Any]:
        return {title: {"template": "linear", "x": "step", "y": {
            f"{layout.live_dir(v)}/plots/metrics/{metric}.tsv": column for v in variants}}}

    report = layout.REPORTS
    # every model the report compares
    models = (*variants, layout.ENSEMBLE, *([layout.STUDENT] if student else []))
    return [
        curve("dev F1 during training", "dev/f1", "f1"),
        curve("dev EM during training", "dev/em", "em"),
        curve("held-out F1 during training (what checkpoints are ranked by)",
              "heldout/f1", "f1"),
        curve("training loss", "train/loss", "loss"),
        {"dev F1 by question type": {"template": "bar_horizontal", "x": "f1", "y": {
            f"{report}/by_type/{m}.json": "question_type" for m in models}}},
        *({f"dev F1 by {what} length": {"template": "linear", "x": "min_words", "y": {
            f"{report}/f1_by_{what}_length.csv": list(models)}}}
          for what in ("answer", "context")),
        *(f"{report}/{name}.png" for name in
          ("scores", "f1_by_type", "f1_by_answer_length", "f1_by_context_length",
           "agreement")),
    ]


def pipeline_variants(names: str) -> tuple[str, ...]:
    """``--variants``' comma-separated names, in the registry's order: two or more (an
    ensemble of one is its member), each registered; ValueError says which are not."""
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    if unknown := [n for n in chosen if n not in VARIANTS]:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(VARIANTS)}")
    if len(set(chosen)) < 2:
        raise ValueError("two or more variants: the ensemble stage combines them")
    return tuple(v for v in VARIANTS if v in chosen)


def render(variants: Sequence[str] = VARIANTS, student: bool = True) -> str:
    """dvc.yaml of ``variants``; without the distill stage unless ``student`` (a workspace
    whose distill.student is null: no student to train)."""
    rows = [s for s in STAGES if student or s.name != DISTILL]
    doc = {"stages": {s.name: stage_entry(s, variants, student) for s in rows},
           "plots": plots(variants, student)}
    order = " -> ".join(f"{s.name}@<variant>" if s.per_variant else s.name for s in rows)
    return HEADER.format(order=order) + "\n" + yaml.safe_dump(
        doc, sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml is stale")
    ap.add_argument("--out", type=Path, default=DVC_YAML)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated: the variants the pipeline trains (default: all)")
    ap.add_argument("--no-student", action="store_true",
                    help="without the distill stage (params' distill.student: null)")
    args = ap.parse_args(argv)
    try:
        variants = pipeline_variants(args.variants)
    except ValueError as e:  # one line, exit 2, as every rcpipe command's bad input
        print(f"error: --variants: {args.variants}: {e}", file=sys.stderr)
        sys.exit(2)
    text = render(variants, student=not args.no_student)
    if args.check:
        stale = not args.out.is_file() or args.out.read_text() != text
        print(f"{args.out}: " + ("stale: run python -m rcpipe.pipeline.dvc_yaml" if stale
                                 else "current"))
        sys.exit(1 if stale else 0)
    args.out.write_text(text)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
