"""A trained model people can take away: `rcpipe package`'s directory, and loading it with
nothing but the model code (no training code, no params' models section, no prepared data).

    model.safetensors   the weights, nothing else (safetensors: no pickle to run)
    config.json         what to build and how to answer: the variant, its effective
                        ModelConfig, the data-side ModelInputs, the data limits, the decoding
                        settings (max answer length, length prior, the no-answer threshold)
                        and the sha256 of every other file, which loading checks
    vocab.json          prepare's word and char vocabularies (the text encoder's)
    na_threshold.json   SQuAD v2.0: the threshold `rcpipe evaluate` chose, and where
    README.md           the model card (``model_card``)

``package_files`` builds the files' bytes (rcpipe/stages/package.py writes them);
``load_package`` reads a directory back, one located InputError for anything tampered with or
mismatched.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rcpipe import reads
from rcpipe.config import VARIANTS, ReadLimits, located
from rcpipe.errors import InputError
from rcpipe.outputs import settle
from rcpipe.trained.model_file import (
    PayloadMismatch,
    Unbuildable,
    described,
    model_from_payload,
    threshold_of,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

    from rcpipe.models import ModelInputs

FORMAT = "rcpipe-package/1"
WEIGHTS, CONFIG, VOCAB, THRESHOLD, CARD = (
    "model.safetensors", "config.json", "vocab.json", "na_threshold.json", "README.md")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_package(path: Path) -> bool:
    """A directory holding config.json and model.safetensors."""
    return path.is_dir() and (path / CONFIG).is_file() and (path / WEIGHTS).is_file()


def package_files(config: dict[str, Any], weights: dict[str, torch.Tensor], vocab: bytes,
                  threshold: dict[str, Any] | None, card: str) -> dict[str, bytes]:
    """File name -> content of a package; ``config`` gains the format and every other
    file's sha256 (a tensor shared by two names is stored under each)."""
    from safetensors.torch import save

    files = {WEIGHTS: save({k: v.detach().cpu().contiguous().clone()
                            for k, v in weights.items()},
                           metadata={"format": "pt", "variant": config["variant"]}),
             VOCAB: vocab}
    if threshold is not None:
        files[THRESHOLD] = (json.dumps(threshold, indent=1) + "\n").encode()
    files[CARD] = card.encode()
    config = {"format": FORMAT, **config, "sha256": {n: sha256(b) for n, b in files.items()}}
    files[CONFIG] = (json.dumps(config, indent=1, ensure_ascii=False) + "\n").encode()
    return files


@dataclass(frozen=True)
class Package:
    """A loaded package: the model (eval mode, CPU) and how it answers."""

    path: Path
    variant: str
    model: nn.Module
    inputs: ModelInputs
    vocab: dict[str, list[str]]
    vocab_sha256: str
    char_limit: int
    max_answer_len: int
    na_threshold: float | None
    length_prior: torch.Tensor | None
    config: dict[str, Any]


class _Decoding(BaseModel):
    """config.json's decoding settings, bounded (a package is anyone's file)."""

    model_config = ConfigDict(extra="allow", strict=True)
    max_answer_len: int = Field(15, gt=0, le=10_000)
    length_prior: list[float] | None = Field(None, max_length=10_000)

    @model_validator(mode="after")
    def _prior_covers_every_length(self) -> _Decoding:
        # decode weighs a span of length k by prior[k - 1], for k up to max_answer_len
        if self.length_prior is not None and len(self.length_prior) < self.max_answer_len:
            raise ValueError(f"length_prior has {len(self.length_prior)} entries, fewer "
                             f"than max_answer_len ({self.max_answer_len})")
        return self


class _Data(BaseModel):
    """config.json's data settings: what loading reads of them, bounded."""

    model_config = ConfigDict(extra="allow", strict=True)
    char_limit: int = Field(16, gt=0, le=1_000)
    dev_para_limit: int | None = Field(None, gt=0)  # a package from before windows


def _json(path: Path, name: str, data: bytes, limits: ReadLimits) -> Any:
    return reads.parse_json(reads.decode(data, path / name), path / name, limits.depth,
                            "limits.depth")


def _checked(path: Path, name: str, config: dict[str, Any], limits: ReadLimits) -> bytes:
    """A listed file's bytes, refused unless their sha256 is config.json's record (checked
    as the file streams in, before it is held: reads.read_checked) and unless it is a
    regular file inside the package."""
    cap, key = (limits.weights_bytes(), "limits.weights_mb") if name == WEIGHTS \
        else (limits.json_bytes(), "limits.json_mb")
    return reads.read_checked(path / name, config["sha256"].get(name), cap, key, inside=path,
                              hint=f" in {CONFIG} (changed after packaging); package again")


def _fits_embeddings(file: Path, vocab: dict[str, list[str]], inputs: ModelInputs) -> None:
    """Refused when the vocabulary has more entries than the embedding it indexes has rows:
    a word (or char) past the table would load and answer with an IndexError at the first
    question holding it. config.json's inputs are the tables' sizes (the weights are held
    to them before the model is built); a shorter vocabulary only leaves rows unused."""
    for key, rows in (("words", inputs.word_vocab), ("chars", inputs.char_vocab)):
        if len(vocab[key]) > rows:
            raise InputError(file, key, f"{len(vocab[key]):,} entries, over the {rows:,} rows "
                             f"of the model's {key[:-1]} embedding ({CONFIG}'s "
                             f"inputs.{key[:-1]}_vocab): not the model's vocabulary")


def load_package(path: Path, limits: ReadLimits = ReadLimits()) -> Package:
    """The package at ``path``: config.json's settings and the model it describes checked
    against their bounds, every file against config.json's sha256, the model built from
    config.json and refused if the weights do not fit it."""
    import torch

    cfg_file = path / CONFIG
    settle(path)  # a package half moved by a killed `rcpipe package`: whole first
    if not is_package(path):
        raise InputError(path, "", f"not an rcpipe package: no {CONFIG} and {WEIGHTS}")
    config = _json(path, CONFIG, reads.read_bytes(cfg_file, limits.json_bytes(),
                                                  "limits.json_mb", inside=path), limits)
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise InputError(cfg_file, "format", f"{found!r}, not {FORMAT!r}: not a package this "
                         "rcpipe reads")
    if config.get("variant") not in VARIANTS:
        raise InputError(cfg_file, "variant", f"{config.get('variant')!r} is no variant of "
                         f"this rcpipe ({', '.join(VARIANTS)})")
    if not isinstance(config.get("sha256"), dict):
        raise InputError(cfg_file, "sha256", "missing: cannot check the package's files")
    try:  # every setting within bounds before a file is read or a weight allocated
        decoding = _Decoding.model_validate(config.get("decoding", {}))
        data = _Data.model_validate(config.get("data", {}))
        _, inputs = described(config, limits.parameters)
    except ValidationError as e:
        where, what = located(e)
        section = "decoding" if e.title == "_Decoding" else "data"
        raise InputError(cfg_file, f"{section}.{where}".rstrip("."), what) from None
    except Unbuildable as e:
        raise InputError(cfg_file, e.field, str(e)) from None
    weights_bytes = _checked(path, WEIGHTS, config, limits)
    vocab_bytes = _checked(path, VOCAB, config, limits)
    vocab = _json(path, VOCAB, vocab_bytes, limits)
    if not isinstance(vocab, dict) or not all(
            isinstance(vocab.get(k), list) and all(isinstance(w, str) for w in vocab[k])
            for k in ("words", "chars")):
        raise InputError(path / VOCAB, "", "expected {\"words\": [...], \"chars\": [...]}, "
                         "lists of strings")
    _fits_embeddings(path / VOCAB, vocab, inputs)
    threshold = None
    if THRESHOLD in config["sha256"]:
        threshold = threshold_of(_json(path, THRESHOLD, _checked(
            path, THRESHOLD, config, limits), limits), path / THRESHOLD)
    try:
        from safetensors.torch import load

        state = load(weights_bytes)
    except Exception as e:  # noqa: BLE001 - any parse error of the file is the same refusal
        raise InputError(path / WEIGHTS, "", f"refused: not a safetensors file ({e})"[:200]
                         ) from None
    payload = {"variant": config["variant"], "model_config": config.get("model_config"),
               "inputs": config.get("inputs"), "vocab_sha256": sha256(vocab_bytes),
               "state_dict": state}
    try:
        model, inputs = model_from_payload(payload, config["variant"], sha256(vocab_bytes),
                                           max_parameters=limits.parameters)
    except PayloadMismatch as e:
        raise InputError(path / WEIGHTS, e.field, f"{e}: not the model {CONFIG} describes"
                         ) from None
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise InputError(cfg_file, "", f"refused: not an rcpipe package config ({e!r:.120})"
                         ) from None
    prior = decoding.length_prior
    return Package(
        path=path, variant=config["variant"], model=model.eval(), inputs=inputs,
        vocab=vocab, vocab_sha256=sha256(vocab_bytes), char_limit=data.char_limit,
        max_answer_len=decoding.max_answer_len, na_threshold=threshold,
        length_prior=None if prior is None else torch.tensor(prior, dtype=torch.float32),
        config=config)


# ------------------------------------------------------------------------- the model card


def _reading(data: dict[str, Any]) -> str:
    """How the model read its dev contexts: data.window's windows (a package from before
    windows records the token limit it cut them at)."""
    if "window" in data:
        w = data["window"]
        return (f"a context over {w['length']} tokens read as windows of {w['length']}, "
                f"{w['stride']} apart")
    return f"context tokens seen: {data.get('dev_para_limit') or 'all'}"


def _num(x: Any) -> str:
    return f"{x:.2f}" if isinstance(x, float) else str(x)


LICENSE = "mit"  # the project's (LICENSE, pyproject.toml): a package is licensed as it is


def card_metadata(config: dict[str, Any], metrics: dict[str, Any],
                  sources: list[dict[str, Any]]) -> str:
    """The model card's YAML front matter, as a model hub reads it (huggingface_hub's
    ModelCardData): license, language, task, the SQuAD dataset of the package's version and
    its own dev results as model-index entries (the dev file named, since it may be a split
    of SQuAD rather than SQuAD's dev set)."""
    from huggingface_hub import EvalResult, ModelCardData

    v2 = config["data"]["version"] == "2.0"
    dataset = "rajpurkar/squad_v2" if v2 else "rajpurkar/squad"
    dev = next((s["uri"] for s in sources if s["split"] == "dev"), "dev")
    name = f"dev set {dev.rsplit('/', 1)[-1]}"
    em = "exact_match" if "exact_match" in metrics else "exact"
    results = [EvalResult(task_type="question-answering", dataset_type=dataset,
                          dataset_name=name, metric_type=kind, metric_name=title,
                          metric_value=round(float(metrics[key]), 2))
               for key, kind, title in ((em, "exact_match", "Exact match"), ("f1", "f1", "F1"))
               if isinstance(metrics.get(key), int | float)]
    data = ModelCardData(model_name=f"rcpipe-{config['variant']}", license=LICENSE,
                         language="en", library_name="rcpipe",
                         pipeline_tag="question-answering", datasets=[dataset],
                         metrics=["exact_match", "f1"],
                         tags=["extractive-qa", "squad", config["variant"]],
                         eval_results=results or None)
    return f"---\n{data.to_yaml()}\n---\n\n"


def _distilled(teacher: dict[str, Any] | None) -> list[str]:
    """The card's line for a student (`rcpipe distill`): the ensemble it learnt from."""
    if not teacher:
        return []
    shares = teacher.get("weights") or {}
    members = ", ".join(f"`{m}`" + (f" ({shares[m]:.2f})" if m in shares else "")
                        for m in teacher.get("members", []))
    return [f"- distilled from: the ensemble of {members} ({teacher.get('method')}): "
            "trained on the gold spans and on its start/end distributions (Hu et al. 2018, "
            "Attention-Guided Answer Distillation for Machine Reading Comprehension)"]


def model_card(config: dict[str, Any], metrics: dict[str, Any],
               by_type: dict[str, dict[str, Any]] | None, summary: dict[str, Any] | None,
               sources: list[dict[str, Any]], report: dict[str, Any],
               threshold: dict[str, Any] | None) -> str:
    """README.md of a package: a model hub's metadata (``card_metadata``), then what the
    model is, what it was trained on, how well it does (metrics/<v>.json's numbers, to 2
    decimals), and what it is not for."""
    v = config["variant"]
    abstains = " or no answer" if config["inputs"]["no_answer"] else ""
    lines = [f"# rcpipe {v}", "",
             f"An extractive reading-comprehension model: given a passage and a question it "
             f"returns a span of the passage{abstains}.",
             "", f"- variant: `{v}`", f"- paper: {config.get('paper') or 'see rcpipe/variants.py'}",
             *_distilled(config.get("distilled_from")),
             f"- SQuAD version: {config['data']['version']}",
             f"- params digest (sha256 of the effective params): `{config['params_sha256']}`",
             "", "## Training data", "", "| file | sha256 | questions | kept for training |",
             "|---|---|---|---|"]
    for s in sources:
        counts = report.get(s["split"], {})
        lines.append(f"| {s['split']}: `{s['uri']}` | `{s['sha256']}` | "
                     f"{counts.get('questions', '?')} | {counts.get('kept', '?')} |")
    lines += ["", f"## Metrics (dev set, official SQuAD script: metrics/{v}.json)", "",
              "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_num(x)} |" for k, x in metrics.items() if k != "oracle"]
    lines += [f"| oracle {k} (dev's own best threshold: a ceiling, not a result) | {_num(x)} |"
              for k, x in metrics.get("oracle", {}).items()]
    if by_type:
        lines += ["", f"### By question type (metrics/{v}.by_type.json)", "",
                  "| type | exact | f1 | total |", "|---|---|---|---|"]
        lines += [f"| {t} | {_num(m.get('exact'))} | {_num(m.get('f1'))} | {m.get('total')} |"
                  for t, m in by_type.items()]
    lines += ["", "## No-answer threshold", ""]
    if threshold is None:
        lines.append("None: SQuAD v1.1, every question is answered.")
    elif threshold.get("na_threshold") is None:
        lines.append("None: the model abstains when its no-answer probability beats its "
                     "best span's.")
    else:
        how = "fixed by eval.na_threshold" if threshold.get("fixed") else \
            f"chosen on {threshold.get('chosen_on')} by the official best-threshold walk, " \
            f"never on dev (source {threshold.get('source')})"
        lines.append(f"{threshold['na_threshold']} ({how}; na_threshold.json)")
    lines += ["", "## Training run", ""]
    if summary:
        lines += [f"- steps: {summary.get('steps')}, epochs: {summary.get('epochs')}",
                  f"- training time: {summary.get('train_seconds')} s "
                  f"(wall {summary.get('wall_seconds')} s)",
                  f"- hardware: {summary.get('world_size')} worker(s) on "
                  f"{summary.get('device')}, {summary.get('examples_per_s')} examples/s"]
        if seeds := summary.get("seeds"):  # models.<variant>.seeds: the runs it holds
            lines.append(f"- {len(seeds)} runs (train.seed "
                         f"{', '.join(str(s.get('seed')) for s in seeds)}) answering with the "
                         "mean of their distributions; the steps and times above are summed")
    else:
        lines.append(f"Not recorded (no models/{v}/summary.json).")
    lines += ["", "## Use", "",
              "```", "rcpipe predict --model DIR --question Q --context PASSAGE",
              "rcpipe serve --model DIR", "```", "",
              "Loading checks every file against config.json's sha256 and needs no training "
              "code.", "", "## Intended use and limits", "",
              "For research and demonstrations of extractive QA on English Wikipedia-like "
              "passages. It only copies spans of the passage it is given: it does not know "
              "facts, and a wrong span can read as confident. Scores hold for SQuAD's dev "
              "distribution; other domains, long passages (beyond the context limit below) "
              "and non-English text score lower. Not for decisions about people.",
              f"- {_reading(config['data'])}; "
              f"longest answer: {config['decoding']['max_answer_len']} tokens", "",
              f"License: {LICENSE.upper()} (rcpipe's LICENSE).", ""]
    return card_metadata(config, metrics, sources) + "\n".join(lines)
