"""Using trained models: `rcpipe predict` (one question or a whole SQuAD file); `rcpipe
serve` (stages/serving.py: the answer service on Ray Serve) loads its models here too.

Both load the models here (models/<variant>/model.pt, weights only, refused when trained on
another vocabulary or architecture: trained/model_file.py; or a package directory, `--model
DIR`, with its own vocabulary and settings: trained/package_dir.py) and answer through
inference/answer.py's Reader, the path `rcpipe evaluate` takes through the model; `--runtime
onnx` swaps each model's forward for its exported graph (trained/onnx.py), nothing else. No
training code is imported.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcpipe import layout
from rcpipe.config import VARIANTS, Config
from rcpipe.errors import InputError
from rcpipe.reads import blank
from rcpipe.stages.io import write_json

if TYPE_CHECKING:  # heavy (torch): imported where it is used
    import torch

    from rcpipe.inference.answer import Reader

log = logging.getLogger(__name__)
ENSEMBLE = layout.ENSEMBLE


def trained_variants() -> list[str]:
    return [v for v in VARIANTS if layout.model_file(v).is_file()]


RUNTIMES = ("torch", "onnx")


def packages_only(names: list[str]) -> bool:
    """Whether ``names`` are all package directories (which carry their own settings)."""
    from rcpipe.trained.package_dir import is_package

    return bool(names) and all(n not in VARIANTS and is_package(Path(n)) for n in names)


def load_reader(cfg: Config, names: list[str], runtime: str = "torch", threads: int = 0
                ) -> Reader:
    """A Reader holding what ``names`` need: the variants named, every trained variant
    for "ensemble"; with ``runtime`` "onnx" each model's forward is its exported graph
    (trained/onnx.py: `rcpipe export`), run by onnxruntime on ``threads`` CPU threads (0:
    train.threads, else onnxruntime's default), the rest of the Reader unchanged."""
    if runtime not in RUNTIMES:
        raise InputError("--runtime", runtime, f"choose from {', '.join(RUNTIMES)}")
    reader = _torch_reader(cfg, names)
    if runtime == "onnx":
        import torch

        from rcpipe.trained.onnx import load_onnx

        reader.models = {n: load_onnx(n, threads or cfg.train.threads)
                         for n in reader.models}
        reader.device = torch.device("cpu")
    return reader


def _torch_reader(cfg: Config, names: list[str]) -> Reader:
    import torch

    from rcpipe.data.encode import TextEncoder
    from rcpipe.data.prepared import Prepared
    from rcpipe.inference.answer import Reader
    from rcpipe.trained.model_file import device_of, length_prior, load_model, na_threshold

    device = device_of(cfg)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    packages = [n for n in names if n not in (*VARIANTS, ENSEMBLE) and Path(n).is_dir()]
    if packages:
        if len(names) != 1:
            raise InputError("--model", packages[0], "a package is served on its own")
        return _package_reader(cfg, packages[0], device)
    variants: list[str] = []
    for name in names:
        if name == ENSEMBLE:
            found = trained_variants()
            if not found:
                raise InputError("models/", "", "no trained variant to ensemble; run "
                                 "`rcpipe train VARIANT` first")
            variants += found
        elif name in VARIANTS:
            variants.append(name)
        else:
            raise InputError("--model", name, f"unknown model; choose from "
                             f"{', '.join((*VARIANTS, ENSEMBLE))} or a package directory")
    d = Prepared.of(cfg)
    if not d.vocab_file.is_file() or not d.meta_file.is_file():
        raise InputError(d.out_dir, "", "no prepared data; run `rcpipe prepare` first")
    meta = d.meta()
    encoder = TextEncoder.from_vocab(d.vocab(), meta.get("char_limit", cfg.data.limits.char))
    models = {}
    for v in dict.fromkeys(variants):
        model, _ = load_model(cfg, v)
        models[v] = model.to(device).eval()
    thresholds = {v: na_threshold(cfg, v) for v in models}
    return Reader(encoder, models, device, cfg.eval.max_answer_len, thresholds, None,
                  no_answer="2.0" in meta["version"]["train"],
                  length_prior=length_prior(cfg), window=cfg.data.window,
                  max_tokens=cfg.data.window.max_tokens)


def _package_reader(cfg: Config, name: str, device: torch.device) -> Reader:
    """A Reader over the package at ``name`` (trained/package_dir.py), answering under that name as
    `rcpipe evaluate` answered for it; eval.na_threshold, if set, overrides its threshold.
    A long context is read as data.window's windows (how a context is read is the
    caller's, as --runtime is, not the package's: its recorded limit was the window)."""
    from rcpipe.data.encode import TextEncoder
    from rcpipe.inference.answer import Reader
    from rcpipe.trained.model_file import threshold_for
    from rcpipe.trained.package_dir import load_package

    pkg = load_package(Path(name), cfg.limits)
    threshold = threshold_for(cfg, pkg.na_threshold)
    return Reader(TextEncoder.from_vocab(pkg.vocab, pkg.char_limit),
                  {name: pkg.model.to(device)}, device, pkg.max_answer_len, {name: threshold},
                  None, no_answer=pkg.inputs.no_answer, length_prior=pkg.length_prior,
                  window=cfg.data.window, max_tokens=cfg.data.window.max_tokens)


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
