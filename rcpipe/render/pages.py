"""The self-contained HTML pages of `rcpipe explain` and `rcpipe report`.

Pure functions from the computed views and tables (and the PNG bytes from render/plots.py) to
one HTML string: styles inline, images as data: URIs, no script and nothing fetched, so a
page opens offline and can be attached to a Prefect artifact or mailed as it is.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape
from typing import Any

import numpy as np

from rcpipe.render.attention import Explanation, passage_focus, question_focus, top_pairs
from rcpipe.render.tables import GroupScores

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}
td.best{font-weight:bold}
.tokens span{padding:1px 2px;border-radius:3px;line-height:2}
.answer{outline:2px solid #b2182b;font-weight:bold}
.gold{text-decoration:underline 3px #4dac26}
.note{color:#555;font-size:.9em}
img{max-width:100%;border:1px solid #eee}
code{background:#f3f3f3;padding:0 .3em}
"""


def _page(title: str, body: str) -> str:
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")


def _img(png: bytes, alt: str) -> str:
    return (f'<img alt="{escape(alt)}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">')


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], best_cols: int = 0) -> str:
    """An HTML table; with ``best_cols`` the largest number in each row's last that many
    cells is bold (the best model of a group)."""
    out = ["<table><tr>" + "".join(f"<th>{escape(str(h))}</th>" for h in header) + "</tr>"]
    for row in rows:
        nums = [v for v in row[len(row) - best_cols:] if isinstance(v, int | float)] \
            if best_cols else []
        top = max(nums) if nums else None
        cells = []
        for i, v in enumerate(row):
            text = f"{v:.2f}" if isinstance(v, float) else escape(str(v))
            best = top is not None and i >= len(row) - best_cols and v == top
            cells.append(f'<td class="best">{text}</td>' if best else f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


# ------------------------------------------------------------------------------ explain


def _shade(weights: np.ndarray | None, i: int, rgb: str) -> str:
    if weights is None or weights.max() <= 0:
        return ""
    return f"background:rgba({rgb},{0.85 * weights[i] / weights.max():.3f})"


def explain_html(ex: Explanation, png: bytes) -> str:
    """The question, the passage with its strongest words highlighted, the views' notes,
    the strongest passage-question pairs and the figure."""
    p_focus, q_focus = passage_focus(ex), question_focus(ex)
    answer = set(range(ex.start, ex.end + 1)) if ex.start >= 0 else set()
    gold = ex.gold_tokens()

    def cls(i: int) -> str:
        names = [n for n, on in (("answer", i in answer), ("gold", i in gold)) if on]
        return f' class="{" ".join(names)}"' if names else ""

    question = " ".join(
        f'<span style="{_shade(q_focus, i, "230,97,1")}" '
        f'title="attention from the answer {0 if q_focus is None else q_focus[i]:.3f}">'
        f"{escape(t)}</span>" for i, t in enumerate(ex.question_tokens))
    passage = " ".join(
        f"<span{cls(i)} "
        f'style="{_shade(p_focus, i, "230,97,1")}" '
        f'title="p(start) {ex.p_start[i]:.3f}, p(end) {ex.p_end[i]:.3f}">{escape(t)}</span>'
        for i, t in enumerate(ex.passage))
    pointer = " ".join(
        f'<span style="background:linear-gradient(rgba(27,120,55,'
        f'{ex.p_start[i] / max(ex.p_start.max(), 1e-12):.3f}) 50%,rgba(118,42,131,'
        f'{ex.p_end[i] / max(ex.p_end.max(), 1e-12):.3f}) 50%)" '
        f'title="p(start) {ex.p_start[i]:.3f}, p(end) {ex.p_end[i]:.3f}">{escape(t)}</span>'
        for i, t in enumerate(ex.passage))
    views = "".join(f"<li><b>{escape(m.spec.title)}</b>: {escape(m.spec.note)} "
                    f"(<code>{escape(m.spec.module)}</code>)</li>" for m in ex.maps)
    pairs = _table(["passage word", "question word", "weight"],
                   [[f"{ex.passage[i]} (#{i + 1})", ex.question_tokens[j], w]
                    for i, j, w in top_pairs(ex)])
    gold = ", ".join(f"“{escape(g)}”" for g in ex.gold) or "(no answer)"
    na = f"; no-answer share: start {ex.p_start_na:.3f}, end {ex.p_end_na:.3f}" \
        if ex.p_start_na or ex.p_end_na else ""
    if ex.windows > 1:  # a long context: which window answered
        na += (f"<br>The passage is {ex.windows} overlapping windows (data.window); the "
               f"answer and everything below come from window {ex.window + 1}, its tokens "
               f"{ex.window_start + 1}-{ex.window_start + len(ex.passage)}")
    body = f"""<h1>{escape(ex.variant)}: what the model looked at</h1>
<p><b>Question</b> <code>{escape(ex.qid)}</code></p>
<p class="tokens">{question}</p>
<p><b>Predicted</b>: “{escape(ex.answer) or "(no answer)"}” · <b>gold</b>: {gold}{na}</p>
<h2>Views shown for {escape(ex.variant)}</h2><ul>{views}</ul>
<p class="note">Question words are shaded by the passage-question attention of the
predicted answer's words (mean of their rows); passage words by what the answer attends to
in the passage (its self-attention rows, or BiDAF's Q2C weights). The predicted answer is
outlined in red, the gold answer underlined in green; hover a word for its pointer
probabilities.</p>
<h2>Passage, strongest words highlighted</h2><p class="tokens">{passage}</p>
<h2>Pointer: p(start) top half (green), p(end) bottom half (purple)</h2>
<p class="tokens">{pointer}</p>
<h2>Strongest passage-question pairs</h2>{pairs}
<h2>Attention maps</h2>{_img(png, f"attention maps of {ex.variant} for {ex.qid}")}"""
    return _page(f"explain {ex.variant} {ex.qid}", body)


# ------------------------------------------------------------------------------- report


def _group_section(title: str, table: GroupScores, png: bytes, csv_name: str) -> str:
    models = list(table.f1)
    rows = [[g, n, *(table.f1[m][i] for m in models)]
            for i, (g, n) in enumerate(zip(table.groups, table.counts, strict=True))]
    return (f"<h2>{escape(title)}</h2>"
            + _table([table.by, "questions", *(f"{m} F1" for m in models)], rows,
                     best_cols=len(models))
            + f'<p class="note">data: <code>{escape(csv_name)}</code></p>' + _img(png, title))


def search_section(search: dict[str, Any], rows: list[dict[str, Any]], png: bytes,
                   csv_name: str) -> str:
    """A settings search (tune/<variant>.trials.json): its trials, best first, and its
    best score against its minutes."""
    header = list(dict.fromkeys(k for r in rows for k in r))
    return (f"<h2>Settings search: {escape(search['variant'])}</h2>"
            f'<p class="note">{len(rows)} trials, {search["minutes"]} minutes, up to '
            f"{escape(search.get('budget') or str(search['max_steps']) + ' steps')} each "
            "(ASHA stops the trailing ones); "
            f"{escape(search['metric'])} on {escape(search['data'])}. The best trial's "
            f"settings: <code>{escape(search['layer'])}</code>; data: "
            f"<code>{escape(csv_name)}</code></p>"
            + _table(header, [["" if r[k] is None else r[k] for k in header] for r in rows])
            + _img(png, f"{search['variant']}: best score against minutes"))


def report_html(info: dict[str, Any], scores: list[dict[str, Any]], scores_png: bytes,
                sections: list[tuple[str, GroupScores, bytes, str]],
                agreement: tuple[list[str], list[list[float]], bytes] | None,
                searches: Sequence[str] = ()) -> str:
    """The run's report: ``sections`` are (title, table, its chart, its CSV file name);
    ``searches`` the settings searches' sections (search_section), at the end."""
    header = list(dict.fromkeys(k for r in scores for k in r))
    body = [f"<h1>rcpipe evaluation report</h1>"
            f"<p>dev set <code>{escape(str(info['dev_file']))}</code>, SQuAD "
            f"{escape(str(info['version']))}, {info['questions']} questions; models: "
            f"{escape(', '.join(r['model'] for r in scores))}</p>",
            "<h2>EM / F1 per model</h2>",
            _table(header, [[r.get(k, "") for k in header] for r in scores]),
            _img(scores_png, "EM and F1 per model")]
    body += [_group_section(*s) for s in sections]
    if agreement is not None:
        models, matrix, png = agreement
        body += ["<h2>Agreement between models</h2>",
                 '<p class="note">Fraction of dev questions on which two models give the same '
                 "answer text (what the majority vote compares; a question missing from a "
                 "predictions file counts as a disagreement, so the diagonal is the fraction "
                 "of the dev set each file covers).</p>",
                 _table(["", *models], [[m, *row] for m, row in zip(models, matrix,
                                                                     strict=True)]),
                 _img(png, "agreement matrix")]
    body += list(searches)
    return _page("rcpipe evaluation report", "\n".join(body))


def nights_html(rows: list[dict[str, Any]], models: list[str], png: bytes,
                report_url: str | None, costs: list[dict[str, Any]] | None = None) -> str:
    """The nights page: each versioned night's dev F1 per model, the gate's decision and
    the champion after it (tables.night_rows), the chart, and what each night's training
    cost (tables.night_costs)."""
    header = ["night", "promoted", "gate gain", "champion", *models]
    link = f' This night\'s report: <a href="{escape(report_url)}">report.html</a>.' \
        if report_url else ""
    body = ["<h1>rcpipe: night after night</h1>",
            f'<p class="note">{len(rows)} versioned night(s), from the records on the DVC '
            "remote (<code>rcpipe/versions/&lt;run&gt;/version.json</code>); dev F1 reports, "
            f"the gate decides on its own gate set (docs/guide/versioning.md).{link}</p>",
            _img(png, "dev F1 night after night"),
            _table(header, [[r.get(k, "") for k in header] for r in reversed(rows)])]
    if costs:
        spent = ["night", *models, "total"]
        body += ["<h2>What each night cost</h2>",
                 '<p class="note">Training only, per variant: wall time and device-hours '
                 "(wall time x workers; GPU-h on CUDA, CPU-worker-h on the CPU); empty where "
                 "the night did not retrain the variant.</p>",
                 _table(spent, [[r.get(k, "") for k in spent] for r in reversed(costs)])]
    return _page("rcpipe nights", "\n".join(body))
