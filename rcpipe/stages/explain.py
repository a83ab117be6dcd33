"""`rcpipe explain --model V --qid ID`: one dev question's attention views as HTML + PNG.

Reads models/<V>/model.pt (trained/model_file.py: weights only, refused on another vocabulary), or
a package directory given as --model (trained/package_dir.py: refused unless its vocabulary is the
one dev/ was prepared with)
and the question's row of <data.out_dir>/dev/; writes explanations/<V>-<qid>.html
(self-contained) and the PNG beside it (not under reports/: that is the report stage's DVC
output). A context longer than data.window's length is answered as evaluate answers it,
across its windows, and the views are those of the window the answer came from (the page
says which). No training code is imported.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcpipe import layout
from rcpipe.config import VARIANTS, Config
from rcpipe.errors import InputError

if TYPE_CHECKING:  # numpy and matplotlib: imported where they are used
    from rcpipe.data.prepared import Prepared
    from rcpipe.render.attention import Explanation

log = logging.getLogger(__name__)


def default_out(variant: str, qid: str) -> Path:
    return layout.EXPLANATIONS / f"{variant}-{re.sub(r'[^A-Za-z0-9_.-]', '_', qid)}.html"


def explain(cfg: Config, variant: str, qid: str, out: Path | None = None
            ) -> tuple[Explanation, Path]:
    """Run the model on the dev question ``qid`` and write its attention page and figure.

    Returns (Explanation, html path); the PNG is the html path with suffix .png.
    """
    import numpy as np
    import torch

    from rcpipe.data.dataset import SquadDataset, read_table
    from rcpipe.data.prepared import Prepared
    from rcpipe.inference.reading import predict, windows_of
    from rcpipe.render import attention, pages, plots
    from rcpipe.render.attention_pass import attention_maps, decode
    from rcpipe.trained.model_file import length_prior, load_model, na_threshold, threshold_for

    prepared = Prepared(cfg.data.out_dir)
    pkg, variant = _package_or_variant(cfg, variant, prepared)
    dev_path = prepared.dev
    if not dev_path.is_dir():
        raise InputError(dev_path, "", "no prepared dev set; run `rcpipe prepare` first")
    table = read_table(dev_path)
    ids = table.column("id").to_pylist()
    try:
        i = ids.index(qid)
    except ValueError:
        raise InputError(dev_path, "id", f"no dev question with id {qid!r}") from None
    model = pkg.model if pkg else load_model(cfg, variant)[0]
    dev = SquadDataset(table)  # the whole context, read as data.window's windows
    threshold = na_threshold(cfg, variant) if pkg is None else \
        threshold_for(cfg, pkg.na_threshold)
    windows = windows_of(dev, cfg.data.window)
    own = np.flatnonzero(windows.row == i)  # (K,) the question's windows
    w, span = int(own[0]), None
    if len(own) > 1:  # the answer's window, chosen as evaluate chooses it
        prior = pkg.length_prior if pkg else length_prior(cfg)
        found = predict(model, dev, [own.tolist()], torch.device("cpu"),
                        cfg.eval.max_answer_len, threshold, length_prior=prior,
                        windows=windows)[qid]
        w = int(own[found["window"]])
        starts = dev.starts.row(i).tolist()
        span = (starts.index(found["start"]), dev.ends.row(i).tolist().index(found["end"])) \
            if found["text"] else (-1, -1)
    first = int(windows.start[w])
    batch = dev.collate([w], windows=windows)
    maps, log_p1, log_p2 = attention_maps(model, variant, batch)
    if span is None:
        start, end = decode(log_p1, log_p2, cfg.eval.max_answer_len, threshold)
    else:  # the document's answer, counted in its window
        start, end = (span[0] - first, span[1] - first) if span[0] >= 0 else (-1, -1)
    n = int(batch.c_mask.sum())
    p1, p2 = log_p1.exp().double().numpy(), log_p2.exp().double().numpy()  # (1 + Lc,)
    question = table.column("question")[i].as_py()
    ex = attention.Explanation(
        variant=variant, qid=qid, question=question, context=table.column("context")[i].as_py(),
        passage=[dev.answer_text(i, first + t, first + t) for t in range(n)],
        question_tokens=_question_tokens(question, int(batch.q_mask.sum())),
        maps=maps, p_start=np.asarray(p1[1:]), p_end=np.asarray(p2[1:]),
        p_start_na=float(p1[0]), p_end_na=float(p2[0]), start=start, end=end,
        answer=dev.answer_text(i, first + start, first + end) if start >= 0 else "",
        gold=table.column("answers")[i].as_py() or [],
        gold_start=int(batch.y1[0]), gold_end=int(batch.y2[0]),
        window=int(windows.index[w]), windows=len(own), window_start=first)
    html_path = out or default_out(variant, qid)
    png = plots.explain_png(ex)
    layout.write(html_path.with_suffix(".png"), png)
    layout.write(html_path, pages.explain_html(ex, png).encode())
    where = f" from window {ex.window + 1} of {ex.windows} (tokens {first + 1}-{first + n})" \
        if ex.windows > 1 else ""
    log.info(f"explain {variant} {qid}: “{ex.answer}”{where} -> {html_path} "
             f"(+ {html_path.with_suffix('.png').name})")
    return ex, html_path


def _package_or_variant(cfg: Config, model: str, prepared: Prepared) -> tuple[Any, str]:
    """(the package, its variant) for a package directory, else (None, the variant), each
    checked: a package's vocabulary must be the prepared dev set's, a variant one of the
    params'."""
    if model in VARIANTS or not Path(model).is_dir():
        cfg.models.of(model)  # an unknown variant is an InputError naming the choices
        return None, model
    from rcpipe.trained.package_dir import VOCAB, load_package

    pkg = load_package(Path(model), cfg.limits)  # a package: the dev set must be indexed alike
    if prepared.vocab_file.is_file() and prepared.vocab_digest() != pkg.vocab_sha256:
        raise InputError(pkg.path / VOCAB, "", f"not the vocabulary "
                         f"{prepared.vocab_file} was prepared with: explain "
                         "reads that dev set; prepare with the package's data")
    return pkg, pkg.variant


def _question_tokens(question: str, n: int) -> list[str]:
    """The question's words as prepare tokenized them (the Parquet row holds only ids)."""
    from rcpipe.data.tokenize import tokenize

    words = tokenize([question], quiet=True)[0].words[:n]
    if len(words) < n:  # cannot happen with the same tokenizer; keep the map labelled anyway
        words += [f"#{k + 1}" for k in range(len(words), n)]
    return words
