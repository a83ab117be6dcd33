"""The train-all flow's report: rows for the scores table and the markdown by question type.

Pure functions over the metrics the stages wrote; the flow turns them into Prefect artifacts
and `make demo` prints the same table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rcpipe import reads
from rcpipe.scoring.metrics import headline

V2_KEYS = ("HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")


def score_rows(scores: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model: EM and F1 (v1.1 or v2.0 keys), plus HasAns/NoAns for v2.0."""
    rows = []
    for name, s in scores.items():
        row: dict[str, Any] = {"model": name,
                               "EM": round(headline(s)[0], 2),
                               "F1": round(s["f1"], 2), "questions": s.get("total")}
        row |= {k: round(s[k], 2) for k in V2_KEYS if k in s}
        rows.append(row)
    if all(r["questions"] is None for r in rows):  # v1.1 metrics carry no count
        rows = [{k: v for k, v in r.items() if k != "questions"} for r in rows]
    return rows


def by_type_markdown(scores: dict[str, dict[str, Any]], metrics_dir: Path,
                     seconds: dict[str, float]) -> str:
    """Markdown: the scores table, F1 by question type per model, and where time went."""
    rows = score_rows(scores)
    keys = list(rows[0]) if rows else []
    lines = ["# train-all", "", "## Dev scores", "", _table(keys, [list(r.values()) for r in rows])]
    by_type = {m: reads.read_json(metrics_dir / f"{m}.by_type.json")
               for m in scores if (metrics_dir / f"{m}.by_type.json").is_file()}
    types = [t for t in dict.fromkeys(t for b in by_type.values() for t in b)]
    if types:
        lines += ["", "## F1 by question type", "",
                  _table(["type", "questions", *by_type],
                         [[t, next(b[t]["total"] for b in by_type.values() if t in b),
                           *(round(b[t]["f1"], 1) if t in b else "" for b in by_type.values())]
                          for t in types])]
    total = sum(seconds.values())
    if total:
        lines += ["", "## Where the time went", "",
                  _table(["stage", "seconds", "share"],
                         [[k, round(v, 1), f"{100 * v / total:.0f}%"]
                          for k, v in seconds.items()])]
    return "\n".join(lines) + "\n"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(map(str, header)) + " |",
           "|" + "---|" * len(header)]
    out += ["| " + " | ".join("" if v is None else str(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def report_link_markdown(html: str) -> str:
    """Where `rcpipe report` put the run's evaluation report (HTML, PNG plots, CSV data)."""
    path = Path(html).resolve()
    return (f"\n## Evaluation report\n\n[{path.name}]({path.as_uri()}): `{path}` (plots by "
            f"question type, answer and context length, model agreement; PNG and CSV files in "
            f"`{path.parent}`), on the machine that ran the flow; with `version=true` the "
            f"night's report is on the DVC remote, linked from the `train-all-version` "
            f"artifact\n")
