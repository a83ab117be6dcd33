"""Every matplotlib figure rcpipe draws: the attention view of `rcpipe explain` and the
charts of `rcpipe report`. Each function returns PNG bytes (the caller writes or embeds them).

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas, never pyplot: no
global state, no display needed, safe in a worker thread.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Collection
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from rcpipe.render.attention import (
    Explanation,
    display_window,
    passage_focus,
    question_focus,
    strongest,
)
from rcpipe.render.tables import GroupScores

ANSWER_COLOUR = "#b2182b"  # the predicted answer's words
FOCUS_COLOUR = "#e66101"  # the strongest words of an attention view
GOLD_COLOUR = "#c7e9c0"  # behind the gold answer's words
START_COLOUR, END_COLOUR = "#1b7837", "#762a83"
WINDOW = 60  # passage tokens shown at most: a 400-token map is unreadable at any size
DPI = 110


def _plain_text(draw: Callable[..., bytes]) -> Callable[..., bytes]:
    """Text drawn as it is: "$27 million ... $3" would otherwise be typeset as mathtext."""

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> bytes:
        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return wrapper


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # constrained layout already fits every label: bbox_inches="tight" would draw it twice
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _label(token: str, width: int = 14) -> str:
    return token if len(token) <= width else token[: width - 1] + "…"


def _style_labels(labels: list, strong: Collection[int], answer: Collection[int] = (),
                  gold: Collection[int] = ()) -> None:
    """Predicted answer words bold in red, the strongest attended words bold in orange,
    gold answer words on a green box."""
    for i, text in enumerate(labels):
        if i in answer or i in strong:
            text.set_color(ANSWER_COLOUR if i in answer else FOCUS_COLOUR)
            text.set_fontweight("bold")
        if i in gold:
            text.set_bbox({"facecolor": GOLD_COLOUR, "edgecolor": "none", "pad": 0.8})


# ------------------------------------------------------------------------------ explain


@_plain_text
def explain_png(ex: Explanation, top_k: int = 5) -> bytes:
    """Passage-question attention, the pointer distributions and the passage self-attention
    (or BiDAF's Q2C weights), all over the same passage window, aligned column by column."""
    lo, hi = display_window(ex, WINDOW)
    words = [_label(w) for w in ex.passage[lo:hi]]
    n, lq = hi - lo, len(ex.question_tokens)
    answer = {i - lo for i in range(ex.start, ex.end + 1) if lo <= i < hi} if ex.start >= 0 \
        else set()
    gold = {i - lo for i in ex.gold_tokens() if lo <= i < hi}
    q_focus, p_focus = question_focus(ex), passage_focus(ex)
    strong_q = set(strongest(q_focus, min(3, lq))) if q_focus is not None else set()
    strong_p = {i - lo for i in strongest(p_focus, top_k) if lo <= i < hi} \
        if p_focus is not None else set()

    qmap, smap, qvec = ex.of("question"), ex.of("passage"), ex.of("passage_weights")
    col_w = 0.19
    heights = [max(1.2, 0.24 * lq), 1.5]  # the question map, the pointer
    if smap is not None:
        heights.append(col_w * n)
    if qvec is not None:
        heights.append(0.9)
    width = max(7.0, 2.2 + col_w * n)
    fig = Figure(figsize=(width, sum(heights) + 0.9 * len(heights) + 1.8), layout="constrained")
    axes = fig.subplots(len(heights), 1, gridspec_kw={"height_ratios": heights})
    x = np.arange(n)
    shown = f"passage tokens {lo + 1}-{hi} of {len(ex.passage)}" if n < len(ex.passage) \
        else f"{len(ex.passage)} passage tokens"
    gold_text = " | ".join(ex.gold) or "(no answer)"
    fig.suptitle(f"{ex.variant}  ·  {ex.qid}  ·  {shown}\nQ: {ex.question}\n"
                 f"predicted: {ex.answer or '(no answer)'}  ·  gold: {gold_text}\n"
                 "labels: red = predicted answer, green box = gold answer, "
                 "orange = strongest attended words", fontsize=10, x=0.01, ha="left")

    ax = axes[0]
    if qmap is not None:
        im = ax.imshow(qmap.weights[lo:hi].T, aspect="auto", cmap="Blues", vmin=0,
                       interpolation="nearest")
        ax.set_yticks(range(lq), [_label(t) for t in ex.question_tokens], fontsize=8)
        _style_labels(ax.get_yticklabels(), strong_q)
        fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)
        ax.set_title(f"{qmap.spec.title}: {qmap.spec.note}", fontsize=8, loc="left")
    ax.xaxis.tick_top()
    ax.set_xticks(x, words, rotation=90, fontsize=8)
    _style_labels(ax.get_xticklabels(), strong_p, answer, gold)

    ax = axes[1]
    ax.bar(x - 0.2, ex.p_start[lo:hi], width=0.4, color=START_COLOUR, label="p(start)")
    ax.bar(x + 0.2, ex.p_end[lo:hi], width=0.4, color=END_COLOUR, label="p(end)")
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_xticks(x, [""] * n)
    ax.set_ylim(0, max(0.05, float(max(ex.p_start[lo:hi].max(), ex.p_end[lo:hi].max()))) * 1.1)
    na = f"; no answer: start {ex.p_start_na:.2f}, end {ex.p_end_na:.2f}" \
        if ex.p_start_na or ex.p_end_na else ""
    ax.set_title(f"pointer distributions over the passage{na}", fontsize=8, loc="left")
    ax.legend(fontsize=7, loc="upper right", frameon=False)
    _shade_answer(ax, answer)

    row = 2
    if smap is not None:
        ax = axes[row]
        im = ax.imshow(smap.weights[lo:hi, lo:hi], aspect="auto", cmap="Blues", vmin=0,
                       interpolation="nearest")
        ax.set_xticks(x, words, rotation=90, fontsize=8)
        ax.set_yticks(x, words, fontsize=8)
        _style_labels(ax.get_xticklabels(), strong_p, answer, gold)
        _style_labels(ax.get_yticklabels(), set(), answer, gold)
        ax.set_ylabel("attending word (row)", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)
        ax.set_title(f"{smap.spec.title}: {smap.spec.note}", fontsize=8, loc="left")
        row += 1
    if qvec is not None:
        ax = axes[row]
        ax.bar(x, qvec.weights[lo:hi], color=FOCUS_COLOUR)
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_xticks(x, words, rotation=90, fontsize=8)
        _style_labels(ax.get_xticklabels(), strong_p, answer, gold)
        ax.set_title(f"{qvec.spec.title}: {qvec.spec.note}", fontsize=8, loc="left")
        _shade_answer(ax, answer)
    return _png(fig)


def _shade_answer(ax: Axes, answer: set[int]) -> None:
    if answer:
        ax.axvspan(min(answer) - 0.5, max(answer) + 0.5, color=ANSWER_COLOUR, alpha=0.08)


# ------------------------------------------------------------------------------- report


@_plain_text
def grouped_bars_png(table: GroupScores, title: str) -> bytes:
    """F1 per group, one bar per model; each group labelled with its number of questions."""
    models = list(table.f1)
    k, g = len(models), len(table.groups)
    fig = Figure(figsize=(max(6.0, 1.0 + g * (0.25 * k + 0.4)), 3.8), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(1, k)
    x = np.arange(g)
    for i, m in enumerate(models):
        ax.bar(x - 0.4 + width * (i + 0.5), table.f1[m], width=width, label=m,
               color=_model_colour(i, m))
    ax.set_xticks(x, [f"{grp}\n(n={n})" for grp, n in zip(table.groups, table.counts,
                                                           strict=True)], fontsize=8)
    ax.set_ylabel("F1")
    ax.set_ylim(0, 100)
    ax.set_xlabel(table.by)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncols=min(k, 6), loc="upper center", bbox_to_anchor=(0.5, -0.22),
              frameon=False)
    return _png(fig)


@_plain_text
def scores_png(rows: list[dict]) -> bytes:
    """EM and F1 of every model, side by side."""
    fig = Figure(figsize=(max(6.0, 1.2 * len(rows) + 1.5), 3.6), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(rows))
    em = [r["EM"] for r in rows]
    f1 = [r["F1"] for r in rows]
    ax.bar(x - 0.2, em, width=0.4, label="EM", color="#92c5de")
    ax.bar(x + 0.2, f1, width=0.4, label="F1", color="#2166ac")
    for xi, (a, b) in enumerate(zip(em, f1, strict=True)):
        ax.text(xi - 0.2, a + 1, f"{a:.1f}", ha="center", fontsize=7)
        ax.text(xi + 0.2, b + 1, f"{b:.1f}", ha="center", fontsize=7)
    ax.set_xticks(x, [r["model"] for r in rows], fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("dev score")
    ax.set_title("EM / F1 per model", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


@_plain_text
def agreement_png(models: list[str], matrix: list[list[float]]) -> bytes:
    """The agreement matrix as an annotated heatmap (fractions of dev questions)."""
    k = len(models)
    fig = Figure(figsize=(1.6 + 0.9 * k, 1.2 + 0.8 * k), layout="constrained")
    ax = fig.subplots()
    m = np.asarray(matrix)
    im = ax.imshow(m, cmap="Greens", vmin=0, vmax=1)
    ax.set_xticks(range(k), models, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(k), models, fontsize=8)
    for i in range(k):
        for j in range(k):
            ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if m[i, j] > 0.6 else "black")
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    ax.set_title("same answer text (fraction of dev questions)", fontsize=9)
    return _png(fig)


@_plain_text
def search_png(variant: str, metric: str, points: list[dict[str, float]]) -> bytes:
    """A settings search: every score a trial reported (dots) and the best so far (steps)
    against the search's minutes (tables.best_so_far)."""
    fig = Figure(figsize=(6.0, 3.2), layout="constrained")
    ax = fig.subplots()
    minutes = [p["minutes"] for p in points]
    ax.scatter(minutes, [p["score"] for p in points], s=10, color="#9e9e9e",
               label="a trial's score")
    ax.step(minutes, [p["best"] for p in points], where="post", color="#2166ac",
            label="best so far")
    ax.set_xlabel("minutes of the search")
    ax.set_ylabel(metric)
    ax.set_title(f"rcpipe tune {variant}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return _png(fig)


@_plain_text
def nights_png(rows: list[dict[str, Any]], models: list[str]) -> bytes:
    """Each model's dev F1 night after night (tables.night_rows); a star on the champion's
    point of each night, a ring where the gate promoted."""
    fig = Figure(figsize=(max(6.0, 0.6 * len(rows) + 3.0), 3.4), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(rows))
    for i, model in enumerate(models):
        f1 = [r.get(model, np.nan) for r in rows]
        ax.plot(x, f1, marker="o", ms=3, color=_model_colour(i, model), label=model)
    for xi, r in enumerate(rows):
        if r["champion"] in r:
            ax.scatter([xi], [r[r["champion"]]], marker="*", s=140, color="#f2b701",
                       edgecolors="black", linewidths=0.5, zorder=3,
                       label="champion" if xi == 0 else None)
            if r["promoted"]:
                ax.scatter([xi], [r[r["champion"]]], s=260, facecolors="none",
                           edgecolors="#b2182b", zorder=3)
    ax.set_xticks(x, [r["night"][:15] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("dev F1")
    ax.set_title("dev F1 night after night (star: the champion; ring: promoted)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf")


def _model_colour(i: int, model: str) -> str:
    return "#333333" if model == "ensemble" else _PALETTE[i % len(_PALETTE)]
