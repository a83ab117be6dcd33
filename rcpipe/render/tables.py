"""The evaluation report's tables: scores per model, F1 by question type, answer length,
context length and answerability, and how often the models give the same answer.

Pure functions over the parsed dev set, each model's official-format predictions
(qid -> text) and its metrics; rcpipe.stages.report reads those files and writes the report.
Per-question scores come from metrics.question_scores, so a group's F1 is the official F1
restricted to the group (a question a model did not answer scores 0, as in breakdown()).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rcpipe.scoring.metrics import QUESTION_TYPES, headline, question_scores, question_type

# (lowest, highest or None, label): whitespace words of the first gold answer / the passage
ANSWER_LENGTH_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (1, 1, "1"), (2, 2, "2"), (3, 3, "3"), (4, 5, "4-5"), (6, 10, "6-10"), (11, None, ">10"))
CONTEXT_LENGTH_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (0, 49, "<50"), (50, 99, "50-99"), (100, 149, "100-149"), (150, 199, "150-199"),
    (200, 299, "200-299"), (300, None, "300+"))
NO_ANSWER = "no answer"


@dataclass(frozen=True)
class DevQuestion:
    """A dev question as the report groups it: its context's text and its gold texts."""

    qid: str
    question: str
    context: str
    answers: list[str]  # gold texts; empty for an unanswerable v2.0 question


@dataclass(frozen=True)
class GroupScores:
    """EM/F1 (percent) of each model on each group of dev questions."""

    by: str  # what the groups are: "question type", "answer length", ...
    groups: list[str]  # in display order; only groups with questions
    counts: list[int]  # dev questions per group
    f1: dict[str, list[float]]  # model -> one F1 per group
    exact: dict[str, list[float]]
    min_words: list[int] | None = None  # ordered buckets: each one's first word count

    def rows(self, models: list[str] | None = None) -> list[dict[str, Any]]:
        """One row per group: the group, (min_words,) its size, then each model's F1.

        ``models`` fixes the F1 columns (for CSV that `dvc plots` reads: a declared column
        must exist); a model without scores gets "" there.
        """
        out = []
        for i, (g, n) in enumerate(zip(self.groups, self.counts, strict=True)):
            row: dict[str, Any] = {self.by.replace(" ", "_"): g}
            if self.min_words is not None:
                row["min_words"] = self.min_words[i]
            row["questions"] = n
            for m in models or list(self.f1):
                row[m] = round(self.f1[m][i], 2) if m in self.f1 else ""
            out.append(row)
        return out

    def model_rows(self, model: str) -> list[dict[str, Any]]:
        """One model's row per group, {group, questions, exact, f1}: the record list `dvc
        plots` draws per file (it colours by file, so a categorical chart needs one file
        per model)."""
        return [{self.by.replace(" ", "_"): g, "questions": n,
                 "exact": round(self.exact[model][i], 2), "f1": round(self.f1[model][i], 2)}
                for i, (g, n) in enumerate(zip(self.groups, self.counts, strict=True))]


def questions(dataset: dict[str, Any]) -> Iterator[DevQuestion]:
    """Every dev question with its passage, in dataset order."""
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield DevQuestion(qa["id"], qa["question"], paragraph["context"],
                               [a["text"] for a in qa["answers"]])


def _bucket(n: int, buckets: tuple[tuple[int, int | None, str], ...]) -> str:
    return next(label for lo, hi, label in buckets if n >= lo and (hi is None or n <= hi))


def answer_length_group(q: DevQuestion) -> str:
    """Words in the first gold answer (the one SQuAD's crowdworker marked), or no answer."""
    if not q.answers:
        return NO_ANSWER
    return _bucket(max(1, len(q.answers[0].split())), ANSWER_LENGTH_BUCKETS)


def context_length_group(q: DevQuestion) -> str:
    return _bucket(len(q.context.split()), CONTEXT_LENGTH_BUCKETS)


def answerability_group(q: DevQuestion) -> str:
    return "HasAns" if q.answers else "NoAns"


def group_scores(dataset: dict[str, Any], predictions: dict[str, dict[str, str]], by: str,
                 group_of: Callable[[DevQuestion], str], order: list[str],
                 min_words: dict[str, int] | None = None) -> GroupScores:
    """Each model's EM/F1 over the dev questions of each group (``order``: display order;
    groups outside it follow in order of appearance; ``min_words``: ordered buckets' starts)."""
    qs = list(questions(dataset))
    members: dict[str, list[int]] = {}
    for i, q in enumerate(qs):
        members.setdefault(group_of(q), []).append(i)
    groups = [g for g in order if g in members] + [g for g in members if g not in order]
    f1: dict[str, list[float]] = {}
    exact: dict[str, list[float]] = {}
    for model, preds in predictions.items():
        scores = question_scores(dataset, preds)  # dataset order, the same as qs
        f1[model] = [_percent([scores[i].f1 for i in members[g]]) for g in groups]
        exact[model] = [_percent([scores[i].exact for i in members[g]]) for g in groups]
    starts = None if min_words is None else [min_words[g] for g in groups]
    return GroupScores(by, groups, [len(members[g]) for g in groups], f1, exact, starts)


def _percent(values: list[float | None]) -> float:
    return 100.0 * sum(v or 0.0 for v in values) / len(values)


def by_question_type(dataset: dict[str, Any], predictions: dict[str, dict[str, str]]
                     ) -> GroupScores:
    return group_scores(dataset, predictions, "question type",
                        lambda q: question_type(q.question), list(QUESTION_TYPES))


def by_answer_length(dataset: dict[str, Any], predictions: dict[str, dict[str, str]]
                     ) -> GroupScores:
    starts = {label: lo for lo, _, label in ANSWER_LENGTH_BUCKETS} | {NO_ANSWER: 0}
    return group_scores(dataset, predictions, "answer length", answer_length_group,
                        list(starts), starts)


def by_context_length(dataset: dict[str, Any], predictions: dict[str, dict[str, str]]
                      ) -> GroupScores:
    starts = {label: lo for lo, _, label in CONTEXT_LENGTH_BUCKETS}
    return group_scores(dataset, predictions, "context length", context_length_group,
                        list(starts), starts)


def by_answerability(dataset: dict[str, Any], predictions: dict[str, dict[str, str]]
                     ) -> GroupScores:
    """HasAns vs NoAns (SQuAD v2.0), from the raw predictions: "" is the no-answer call."""
    return group_scores(dataset, predictions, "answerability", answerability_group,
                        ["HasAns", "NoAns"])


def agreement_matrix(predictions: dict[str, dict[str, str]], qids: list[str]
                     ) -> list[list[float]]:
    """[i][j]: the fraction of ``qids`` where models i and j give the same answer text.

    The exact text, as the majority vote compares it ("" included). A question one of the
    two did not answer counts as a disagreement, so the diagonal is the answered fraction.
    """
    if not qids:
        raise ValueError("no questions to compare answers on")
    models = list(predictions)
    out = []
    for a in models:
        row = []
        for b in models:
            pa, pb = predictions[a], predictions[b]
            same = sum(1 for q in qids if q in pa and q in pb and pa[q] == pb[q])
            row.append(same / len(qids))
        out.append(row)
    return out


def score_rows(metrics: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model from its official metrics: EM, F1 and, for v2.0, HasAns/NoAns F1
    (at the threshold chosen off dev) and, apart, dev's own best F1, the oracle."""
    rows = []
    for model, m in metrics.items():
        row: dict[str, Any] = {"model": model,
                               "EM": round(headline(m)[0], 2),
                               "F1": round(m["f1"], 2)}
        for key in ("HasAns_f1", "NoAns_f1"):
            if key in m:
                row[key] = round(m[key], 2)
        if "best_f1" in m.get("oracle", {}):
            row["oracle_best_f1"] = round(m["oracle"]["best_f1"], 2)
        rows.append(row)
        # the ensemble's other methods, scored on the same dev questions (rcpipe ensemble),
        # beside the one ensemble.method gave
        for method, other in m.get("methods", {}).items():
            if method != m.get("method"):
                rows.append({"model": f"{model} ({method})", "EM": round(other["em"], 2),
                             "F1": round(other["f1"], 2)})
    return rows


# ------------------------------------------------------------------------ a settings search


def _setting(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={_setting(v)}" for k, v in value.items())
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trial_rows(search: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per trial of tune/<variant>.trials.json, best first: its id, status, steps
    and training minutes, best score (and its step), then one column per searched setting."""
    keys = list(dict.fromkeys(k for t in search["rows"] for k in t["settings"]))
    ordered = sorted(search["rows"], key=lambda t: (t["best"] is None, -(t["best"] or 0)))
    return [{"trial": t["id"], "status": t["status"], "steps": t["steps"],
             "minutes": round(t.get("minutes", 0.0), 2),  # (none in a search from before)
             "best": None if t["best"] is None else round(t["best"], 2),
             "best_step": t["best_step"],
             **{k: _setting(t["settings"][k]) if k in t["settings"] else "" for k in keys}}
            for t in ordered]


def best_so_far(search: dict[str, Any]) -> list[dict[str, float]]:
    """The search's best score against its minutes: one point per score any trial
    reported, {minutes, score, best} (best: the highest score reported by then)."""
    points = sorted((c[0], c[2]) for t in search["rows"] for c in t["curve"])
    out, best = [], float("-inf")
    for seconds, score in points:
        best = max(best, score)
        out.append({"minutes": round(seconds / 60, 3), "score": round(score, 4),
                    "best": round(best, 4)})
    return out


def night_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per versioned night (its record on the remote, oldest first): each model's
    dev F1 that night, whether the gate promoted, the candidate's gain over the champion on
    the gate set with its 95% interval, and the champion after the night (the promoted
    candidate, else the one before)."""
    rows, champion = [], None
    for record in records:
        if record.get("promoted"):
            champion = (record.get("candidate") or {}).get("model", champion)
        gate = record.get("gate") or {}
        gain = "" if gate.get("diff") is None else \
            f"{gate['diff']:+.2f} [{gate['low']:+.2f}, {gate['high']:+.2f}]"
        rows.append({"night": record["run"], "promoted": bool(record.get("promoted")),
                     "champion": champion or "", "gate gain": gain,
                     **{m: round(float(s["f1"]), 2)
                        for m, s in sorted(record.get("scores", {}).items())}})
    return rows


def night_costs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per versioned night (oldest first): what training each variant cost that
    night (wall time, device-hours: release.rules.cost_of), "" where the night did not
    retrain it (the same run as the night before) or its record has no cost, and the
    night's total device-hours."""
    rows, before = [], {}
    for record in records:
        row: dict[str, Any] = {"night": record["run"]}
        total: dict[str, float] = {}
        for model, cost in sorted((record.get("cost") or {}).items()):
            key = (cost.get("run"), cost.get("wall_s"))
            if before.get(model) != key:
                row[model] = f"{cost['wall_s'] / 60:.1f} min, {cost['hours']:.2f} {cost['unit']}"
                total[cost["unit"]] = total.get(cost["unit"], 0.0) + cost["hours"]
            before[model] = key
        row["total"] = ", ".join(f"{h:.2f} {u}" for u, h in sorted(total.items())) or "0"
        rows.append(row)
    return rows
