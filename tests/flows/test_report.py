"""The flow's report: the scores table rows and the markdown by question type."""

from __future__ import annotations

import json
from pathlib import Path

from flows.report import by_type_markdown, score_rows


def test_score_rows_take_v1_and_v2_keys() -> None:
    rows = score_rows({
        "bidaf": {"exact_match": 61.234, "f1": 70.0, "total": 10},
        "ensemble": {"exact": 50.0, "f1": 55.556, "total": 10, "HasAns_exact": 40.0,
                     "HasAns_f1": 45.0, "NoAns_exact": 60.0, "NoAns_f1": 60.0},
    })
    assert rows[0] == {"model": "bidaf", "EM": 61.23, "F1": 70.0, "questions": 10}
    assert rows[1]["EM"] == 50.0 and rows[1]["F1"] == 55.56 and rows[1]["NoAns_f1"] == 60.0


def test_markdown_has_scores_types_and_time_shares(tmp_path: Path) -> None:
    (tmp_path / "bidaf.by_type.json").write_text(json.dumps(
        {"what": {"exact": 50.0, "f1": 62.5, "total": 4}, "who": {"exact": 0, "f1": 10.0,
                                                                   "total": 2}}))
    md = by_type_markdown({"bidaf": {"exact_match": 1.0, "f1": 2.0, "total": 6}}, tmp_path,
                          {"prepare": 10.0, "train+evaluate bidaf": 30.0})
    assert "| bidaf | 1.0 | 2.0 | 6 |" in md
    assert "| what | 4 | 62.5 |" in md and "| who | 2 | 10.0 |" in md
    assert "| prepare | 10.0 | 25% |" in md and "| train+evaluate bidaf | 30.0 | 75% |" in md


def test_score_rows_leave_out_a_count_no_metrics_file_has() -> None:
    rows = score_rows({"bidaf": {"exact_match": 1.0, "f1": 2.0},
                       "ensemble": {"exact_match": 3.0, "f1": 4.0}})
    assert rows == [{"model": "bidaf", "EM": 1.0, "F1": 2.0},
                    {"model": "ensemble", "EM": 3.0, "F1": 4.0}]
