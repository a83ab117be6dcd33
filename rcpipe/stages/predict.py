"""`rcpipe predict`: one question or a whole SQuAD file answered by trained models (a variant,
the ensemble of the trained ones, or a package directory, `--model DIR`), loaded as every
answering command loads them (trained/reader.py's ``load_reader``; `--runtime onnx`: their
exported graphs). No training code is imported.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rcpipe import layout
from rcpipe.config import Config
from rcpipe.errors import InputError
from rcpipe.layout import write_json
from rcpipe.reads import blank
from rcpipe.trained.reader import ENSEMBLE, load_reader
from rcpipe.trained.reader import packages_only as packages_only  # the CLI's check

log = logging.getLogger(__name__)


def predict(cfg: Config, model: str = ENSEMBLE, question: str | None = None,
            context: str | None = None, context_file: Path | None = None,
            input_file: str | None = None, out: Path | None = None,
            runtime: str = "torch") -> dict[str, Any]:
    """Answer one question about a context (text or file), or every question of a SQuAD
    file (``input_file``: official-format predictions to ``out``, text/prob/na_prob/span
    per question to its .nbest.json), with the model's forward in ``runtime`` (torch, or
    onnx: its exported graph). Returns the answer, or a summary of the file's run."""
    given = [o for o, v in (("--context", context), ("--context-file", context_file),
                            ("--input", input_file)) if v is not None]
    if len(given) != 1:
        raise InputError("predict", "", "give one of --context, --context-file or --input"
                         + (f", not {' and '.join(given)}" if given else ""))
    if input_file is not None:
        if question is not None:
            raise InputError("predict", "--question", "--input holds its own questions")
        return _predict_file(cfg, model, input_file, out, runtime)
    if context_file is not None:
        context = _read_text(context_file, cfg.limits.context_chars)
    if not question or blank(question):  # zero-width characters only: as empty as spaces
        raise InputError("predict", "--question", "give a question")
    if not context or blank(context):
        raise InputError(str(context_file or "predict"), "--context", "the context is empty")
    for option, text in (("--context", context), ("--question", question)):
        _refuse_longer(text, cfg.limits.context_chars, str(context_file or "predict"), option)
    reader = load_reader(cfg, [model], runtime)
    found = reader.answer_pairs([(context, question)], model)[0]
    if isinstance(found, Exception):  # inference/window_choice.py's TooLong: refused, never cut
        raise InputError(str(context_file or "predict"), "--context", str(found))
    result = {"model": model, "answer": found["text"], "start": found["start"],
              "end": found["end"], "prob": found["prob"]}
    if reader.no_answer:
        result["na_prob"] = found["na_prob"]
    result["windows"] = found["windows"]  # how many windows of the context were read
    return result


def _read_text(path: Path, chars: int) -> str:
    """A context file of at most ``chars`` characters: a regular file of at most 4 bytes
    a character (UTF-8's most), so /dev/zero or a 50 MB file is refused unread."""
    from rcpipe import reads

    return reads.read_text(path, 4 * chars, f"limits.context_chars {chars:,}, at most 4 "
                           "bytes each")


def _refuse_longer(text: str, chars: int, name: str, where: str) -> None:
    """One located error for a text over limits.context_chars, before it is tokenized."""
    if len(text) > chars:
        raise InputError(name, where, f"{len(text):,} characters, over the cap of {chars:,} "
                         "(limits.context_chars)")


def _predict_file(cfg: Config, model: str, input_file: str, out: Path | None,
                  runtime: str) -> dict[str, Any]:
    from rcpipe.data.squad import load_squad

    sq = load_squad(input_file, cfg.data.cache_dir, require_answers=False, limits=cfg.limits)
    # before anything is tokenized or a model loaded: a paragraph's place is its questions'
    paragraphs = {q.context_index: q.location.rsplit(".qas[", 1)[0] for q in sq.questions}
    for i, text in enumerate(sq.contexts):
        _refuse_longer(text, cfg.limits.context_chars, input_file,
                       f"{paragraphs.get(i, f'paragraph {i}')}.context")
    for q in sq.questions:
        _refuse_longer(q.question, cfg.limits.context_chars, input_file,
                       f"{q.location}.question")
    reader = load_reader(cfg, [model], runtime)
    ds = reader.encoder.squad(sq, reader.para_limit)
    _refuse_long(ds, sq, input_file, cfg.data.window)
    nbest = reader.answer_dataset(ds, model)
    out = out or layout.PREDICTIONS / f"{model}.predict.json"
    nbest_path = out.with_suffix(".nbest.json")
    write_json(out, {q: v["text"] for q, v in nbest.items()})
    write_json(nbest_path, nbest)
    answered = sum(1 for v in nbest.values() if v["text"])
    log.info(f"predict {model}: {len(nbest)} questions of {input_file} "
             f"({answered} answered) -> {out}, {nbest_path}")
    return {"model": model, "questions": len(nbest), "answered": answered,
            "windows": sum(v["windows"] for v in nbest.values()),
            "predictions": str(out), "nbest": str(nbest_path)}


def _refuse_long(ds: Any, sq: Any, input_file: str, window: Any) -> None:
    """One located error for the first context over data.window.max_tokens: a file of
    questions is refused whole rather than answered from part of a context."""
    from rcpipe.inference.window_choice import over_cap

    refused = over_cap(ds.context_lengths(), window.max_tokens, window)
    if refused:
        i, too_long = next(iter(refused.items()))  # the first, in the file's order
        where = sq.questions[i].location.rsplit(".qas[", 1)[0] + ".context"
        raise InputError(input_file, where, str(too_long))
