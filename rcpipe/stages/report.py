"""`rcpipe report [--out reports/]`: the run's evaluation report, HTML + PNG + plot data.

Reads predictions/<model>.json and metrics/<model>.json of every evaluated variant, of
the ensemble and of the student (`rcpipe distill`) where there are these, and the dev set
(data.dev_file). Writes under ``out``: report.html (self-contained), scores.png,
f1_by_type.png, f1_by_answer_length.png, f1_by_context_length.png, f1_by_answerability.png
(v2.0), agreement.png, and the data of each chart as CSV (scores.csv, f1_by_*.csv,
agreement.csv: what `dvc plots` reads; the f1_by_* files have a column for every variant,
the ensemble and the student, "" where one was not evaluated, and the length buckets a
numeric min_words for the x axis), by_type/<model>.json (F1 by question type as one model's
rows: the categorical chart `dvc plots` draws from one file per model) and everything in
report.json. Where a settings search ran here (tune/<variant>.trials.json, `rcpipe tune`),
its trials' table and best-score-by-minutes curve too: tune_<variant>.csv and .png.
dvc.yaml's `report` stage owns the whole
directory, so nothing else writes there. When every file it reads and the dev set are
those the report was made from (rcpipe/fingerprints.py: Stamp), nothing is done.
"""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any

from rcpipe import layout, reads
from rcpipe.config import VARIANTS, Config
from rcpipe.data.squad import load_document, read_mapping
from rcpipe.errors import InputError
from rcpipe.fingerprints import Stamp, of_stage
from rcpipe.locks import hold
from rcpipe.outputs import output_set, settle

log = logging.getLogger(__name__)


def _csv(rows: list[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


# the report's models in its columns' order: every variant, the ensemble, then the student
# distilled from it (`rcpipe distill`), shown beside the ensemble it is measured against
MODELS = (*VARIANTS, layout.ENSEMBLE, layout.STUDENT)


def evaluated_models() -> list[str]:
    """Every model of MODELS with a predictions file, in that order."""
    return [m for m in MODELS if layout.predictions(m).is_file()]


def report(cfg: Config, out: Path = layout.REPORTS, force: bool = False, wait: bool = False
           ) -> dict[str, Any]:
    """Write the report; returns {"html": path, "files": [every file written]} (unchanged
    inputs: the report in place, "files" empty; ``force``: write it anyway). ``out``'s files
    are one set (rcpipe/outputs.py), one writer at a time (``wait``: for the one writing)."""
    with hold(out, f"{out} is being written", wait):
        # and the sets it reads: evaluate's and ensemble's (their journals beside predictions/)
        settle(out, layout.PREDICTIONS, layout.METRICS)
        return _report(cfg, out, force)


def _report(cfg: Config, out: Path, force: bool) -> dict[str, Any]:
    from rcpipe.render import pages, plots, tables
    from rcpipe.scoring import metrics

    models = evaluated_models()
    page, record = out / layout.REPORT_PAGE, out / layout.REPORT_DATA
    # the stage row adds the ensemble's files itself (each_ensemble)
    scored = [m for m in models if m != layout.ENSEMBLE]
    stamp = Stamp("report", of_stage(cfg, "report", models=scored, args={"out": str(out)}))
    if not force and models and stamp.is_current([page, record]):
        log.info(f"report: the scores and predictions are those of {page}; nothing to do")
        return {"html": str(page), "files": []}
    models, preds, scores = _read_run()
    doc = load_document(cfg.data.dev_file, cfg.data.cache_dir, cfg.limits)
    version = metrics.dataset_version(doc)
    qids = [q.qid for q in tables.questions(doc)]

    rows = tables.score_rows(scores)
    by_type = tables.by_question_type(doc, preds)
    groups = [("F1 by question type", "f1_by_type", by_type),
              ("F1 by answer length (words of the first gold answer)", "f1_by_answer_length",
               tables.by_answer_length(doc, preds)),
              ("F1 by context length (words)", "f1_by_context_length",
               tables.by_context_length(doc, preds))]
    if version == "2.0":
        groups.append(("F1 on answerable (HasAns) vs unanswerable (NoAns) questions",
                        "f1_by_answerability", tables.by_answerability(doc, preds)))
    with output_set("report", [out, layout.STAMPS]) as files:
        files.remove(layout.stamp(stamp.name))  # the old report's stamp goes with it
        written: list[Path] = []

        def put(name: str, data: bytes) -> None:
            files.write(out / name, data)
            written.append(out / name)

        scores_png = plots.scores_png(rows)
        put("scores.png", scores_png)
        put("scores.csv", _csv(rows))
        sections = []
        for title, name, table in groups:
            png = plots.grouped_bars_png(table, title)
            put(f"{name}.png", png)
            put(f"{name}.csv", _csv(table.rows(list(MODELS))))
            sections.append((title, table, png, f"{name}.csv"))
        for m in models:
            rows_json = out / "by_type" / f"{m}.json"
            files.write_json(rows_json, by_type.model_rows(m))
            written.append(rows_json)
        agreement = None
        if len(models) > 1:
            matrix = tables.agreement_matrix(preds, qids)
            png = plots.agreement_png(models, matrix)
            put("agreement.png", png)
            put("agreement.csv", _csv([{"model": m, **{o: round(v, 4) for o, v in zip(
                models, row, strict=True)}} for m, row in zip(models, matrix, strict=True)]))
            agreement = (models, matrix, png)
        searches, trials = [], {}
        for variant, search in _searches():
            trials[variant] = tables.trial_rows(search)
            curve = tables.best_so_far(search)
            png = plots.search_png(variant, search["metric"], curve)
            put(f"tune_{variant}.png", png)
            put(f"tune_{variant}.csv", _csv(trials[variant]))
            searches.append(pages.search_section(search, trials[variant], png,
                                                 f"tune_{variant}.csv"))
        info = {"dev_file": cfg.data.dev_file, "version": version, "questions": len(qids)}
        put(layout.REPORT_PAGE, pages.report_html(info, rows, scores_png, sections, agreement,
                                             searches).encode())
        files.write_json(record, {
            **info, "models": models, "scores": rows,
            **{name: table.rows() for _, name, table in groups},
            "agreement": None if agreement is None else {"models": models,
                                                         "matrix": agreement[1]},
            "tune": trials})
        written.append(record)
    stamp.keep()
    log.info(f"report: {len(models)} model(s) on {len(qids)} dev questions -> {page}")
    return {"html": str(page), "files": [str(p) for p in written]}


def _searches() -> list[tuple[str, dict[str, Any]]]:
    """(variant, tune/<variant>.trials.json) of every variant whose search finished here."""

    found = []
    for v in VARIANTS:
        path = layout.tune_trials(v)
        if path.is_file():
            search = reads.read_json(path)
            if search.get("rows"):
                found.append((v, search))
    return found


def _read_run() -> tuple[list[str], dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    """(the evaluated models, their predictions, their official metrics), each checked."""
    models = evaluated_models()
    if not models:
        raise InputError(f"{layout.PREDICTIONS}/", "", "no <variant>.json predictions; run "
                         "`rcpipe evaluate VARIANT` first")
    preds = {m: read_mapping(layout.predictions(m), str, "an answer string") for m in models}
    scores = {}
    for m in models:
        path = layout.metrics(m)
        if not path.is_file():
            step = "rcpipe ensemble" if m == layout.ENSEMBLE else f"rcpipe evaluate {m}"
            raise InputError(path, "", f"no metrics beside {layout.predictions(m)}; run "
                             f"`{step}` again")
        scores[m] = _scores(path)
        if (methods := layout.methods(m)).is_file():  # the ensemble's every method
            scores[m] |= read_mapping(methods, (str, dict), "a method or the methods")
    return models, preds, scores


def _scores(path: Path) -> dict[str, Any]:
    """A metrics file: numbers, and (v2.0) where its no-answer threshold came from."""
    import json

    from rcpipe.scoring.metrics import NOT_SCORES

    found = read_mapping(path, (int, float, str, dict, type(None)), "a number")
    for key, value in found.items():
        if key not in NOT_SCORES and not isinstance(value, int | float):
            raise InputError(path, json.dumps([key]), "expected a number, got "
                             f"{type(value).__name__}")
    return found

