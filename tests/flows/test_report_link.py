"""The flow's markdown artifact points at the evaluation report `rcpipe report` wrote."""

from __future__ import annotations

from pathlib import Path

from flows.report import report_link_markdown


def test_report_link_names_the_html_and_its_folder(tmp_path: Path) -> None:
    html = tmp_path / "reports" / "report.html"
    md = report_link_markdown(str(html))
    assert md.startswith("\n## Evaluation report\n")
    assert f"[report.html]({html.as_uri()})" in md
    assert f"`{html}`" in md and f"`{html.parent}`" in md
