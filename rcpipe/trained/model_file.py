"""A trained model: the one place that knows its file, what it was built from and how it is
used, so that whatever uses a model (`rcpipe evaluate`, predict, serve, explain, the
benches) needs no training code, and training writes the file this module reads.

    model.pt      a payload of tensors and plain containers (``model_payload``): the
                  variant, its ModelConfig, the data-side inputs, the vocab digest and the
                  weights; read back by ``model_from_payload``, refused (``PayloadMismatch``)
                  on another variant, vocabulary or architecture
    prepared      the data side of a model: ``prepared_inputs``, from `rcpipe prepare`'s
                  vocabulary and meta (data/prepared.py's ``Prepared``, which also gives the
                  vocabulary's digest a model records)
    evaluate's    the no-answer threshold (``threshold_for``: eval.na_threshold when set, else
                  the one evaluate wrote to models/<variant>/na_threshold.json, chosen on the
                  held-out questions; ``na_threshold``) and eval.length_prior's weights
                  (``length_prior``)

Heavy libraries (torch, numpy) are imported where they are used: `rcpipe --help` imports the
stages, which import this.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rcpipe import layout, reads
from rcpipe.config import Config, ModelConfig, ReadLimits, located
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError
from rcpipe.models import ModelInputs, build_model
from rcpipe.outputs import settle

DEFAULT = ReadLimits()  # a caller without a config reads within the params' defaults

if TYPE_CHECKING:
    import torch
    from torch import nn


def model_payload(variant: str, model_config: ModelConfig, inputs: ModelInputs,
                  weights: dict[str, torch.Tensor], vocab_sha256: str) -> dict[str, Any]:
    """What model.pt holds (tensors and plain containers: it loads weights-only)."""
    return {"variant": variant, "model_config": model_config.model_dump(),
            "inputs": asdict(inputs) | {"vectors": None}, "vocab_sha256": vocab_sha256,
            "state_dict": {k: v.detach().cpu() for k, v in weights.items()}}


def side_by_side(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One payload of several runs of a variant (models.<variant>.seeds, each a payload of
    one network): their weights as ``replicas.<k>.*`` (models/seed_mean.py), the first
    run's description with ``seeds`` their count."""
    first = payloads[0]
    return first | {"model_config": first["model_config"] | {"seeds": len(payloads)},
                    "state_dict": {f"replicas.{k}.{name}": t for k, one in enumerate(payloads)
                                   for name, t in one["state_dict"].items()}}


class PayloadMismatch(ValueError):
    """A saved model that does not fit what the caller asked for; ``field`` says where."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__(what)
        self.field = field


class Unbuildable(PayloadMismatch):
    """A saved model's description out of bounds: a wrong type, a dimension over its
    bound, more weights than limits.parameters; found before anything is allocated."""


class _Inputs(BaseModel):
    """The data side a payload records (ModelInputs), bounded: a vocabulary of a billion
    rows is refused, not allocated."""

    model_config = ConfigDict(extra="ignore", strict=True)
    word_vocab: int = Field(gt=0, le=100_000_000)
    char_vocab: int = Field(gt=0, le=10_000_000)
    word_dim: int = Field(gt=0, le=8192)
    no_answer: bool
    pretrained: bool = False
    trained_words: int = Field(0, ge=0, le=100_000_000)


def described(saved: dict[str, Any], max_parameters: int = DEFAULT.parameters
              ) -> tuple[ModelConfig, ModelInputs]:
    """The model config and inputs a payload describes, each value within its bounds and
    the whole within ``max_parameters`` weights, counted on torch's meta device (shapes,
    no memory) before the model is built for real."""
    mc, inputs = _validated(saved)
    _on_meta(saved, mc, inputs, max_parameters)
    return mc, inputs


def _validated(saved: dict[str, Any]) -> tuple[ModelConfig, ModelInputs]:
    try:
        mc = ModelConfig.model_validate(saved.get("model_config"))
        inputs = ModelInputs(**_Inputs.model_validate(saved.get("inputs")).model_dump(),
                             vectors=None)
    except ValidationError as e:
        where, what = located(e)
        section = "model_config" if e.title == "ModelConfig" else "inputs"
        raise Unbuildable(f"{section}.{where}".rstrip("."), what) from None
    return mc, inputs


def _on_meta(saved: dict[str, Any], mc: ModelConfig, inputs: ModelInputs,
             max_parameters: int) -> nn.Module:
    """The model described, built on torch's meta device (shapes, no memory), refused over
    ``max_parameters`` weights."""
    import torch

    with torch.device("meta"):
        shapes = build_model(saved["variant"], mc, inputs)
    n = sum(t.numel() for t in (*shapes.parameters(), *shapes.buffers()))
    if n > max_parameters:
        raise Unbuildable("model_config", f"describes {n:,} weights, over the bound of "
                          f"{max_parameters:,} (limits.parameters)")
    return shapes


def _weights_fit(weights: Any, shapes: nn.Module) -> None:
    """The saved weights' names and shapes against the model described, before it is built
    for real: a config asking hidden 2048 and 6 layers beside 1.1 MB of weights allocated
    4.1 GB before load_state_dict refused it."""
    want = {k: tuple(t.shape) for k, t in shapes.state_dict().items()}
    have = {k: tuple(t.shape) for k, t in weights.items()}
    for name in [*want, *sorted(have.keys() - want.keys())]:
        if want.get(name) != have.get(name):
            said = "none" if name not in have else list(have[name])
            raise PayloadMismatch("state_dict", f"{name} is {said} in the weights, "
                                  f"{list(want[name]) if name in want else 'none'} in the "
                                  "model described")


def model_from_payload(saved: dict[str, Any], variant: str, vocab_sha256: str,
                       model_config: ModelConfig | None = None,
                       max_parameters: int = DEFAULT.parameters
                       ) -> tuple[nn.Module, ModelInputs]:
    """The model a payload holds, refusing another variant, vocabulary or (when
    ``model_config`` is given) another architecture than the params describe, and a
    description out of bounds (``described``) before anything is built."""
    if saved.get("variant") != variant:
        raise PayloadMismatch("variant", f"holds {saved.get('variant')!r}, not {variant!r}")
    if saved.get("vocab_sha256") != vocab_sha256:
        raise PayloadMismatch("vocab_sha256", "trained on another vocabulary")
    if model_config is not None:
        # a field the file lacks came after it was written: the file was built with the
        # field's default, which building from the file uses again
        have = saved["model_config"]
        want = model_config.architecture()  # training-only fields may differ
        for k in want:
            if isinstance(have, dict) and k in have and have[k] != want[k]:
                raise PayloadMismatch(f"model_config.{k}", f"{have[k]!r:.40} in the file, "
                                      f"{want[k]!r} in models.{variant} of the params")
    mc, inputs = _validated(saved)
    _weights_fit(saved["state_dict"], _on_meta(saved, mc, inputs, max_parameters))
    model = build_model(variant, mc, inputs)
    try:
        model.load_state_dict(saved["state_dict"])
    except RuntimeError as e:
        raise PayloadMismatch("state_dict", "does not fit the model: "  # one line
                              f"{' '.join(str(e).split())[:200]}") from None
    return model, inputs


def prepared_inputs(out_dir: Path, word_dim: int) -> ModelInputs:
    """The data-side facts a model is built with, from `rcpipe prepare`'s output (kept here,
    not in data/: data builds no model's inputs, only the Batch a forward takes)."""
    prepared = Prepared(out_dir)
    vocab, meta = prepared.vocab(), prepared.meta()
    return ModelInputs(word_vocab=len(vocab["words"]), char_vocab=len(vocab["chars"]),
                       word_dim=word_dim, vectors=prepared.word_vectors(),
                       no_answer="2.0" in meta["version"]["train"],
                       trained_words=meta.get("trained_words", 0))


def device_of(cfg: Config) -> torch.device:
    """The device train.device names; cuda where none exists is the user's mistake."""
    import torch

    if cfg.train.device == "cuda" and not torch.cuda.is_available():
        raise InputError(cfg.source, "train.device", "cuda asked for, but torch sees no CUDA "
                         "device here: set train.device=auto or cpu")
    if cfg.train.device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def load_model(cfg: Config, variant: str) -> tuple[nn.Module, ModelInputs]:
    """The saved model, refusing one trained on a different vocabulary (weights only)."""
    model, inputs, _ = load_payload(cfg, variant)
    return model, inputs


def load_payload(cfg: Config, variant: str) -> tuple[nn.Module, ModelInputs, dict[str, Any]]:
    """``load_model``'s model and inputs, and the payload they came from (rcpipe package
    records its model_config, which may differ from the params in training-only fields)."""
    path = layout.model_file(variant)
    # train's set (model.pt, summary) and evaluate's (na_threshold.json), whole first
    settle(path.parent, layout.PREDICTIONS)
    if not path.is_file():
        raise InputError(path, "", f"no trained model; run `rcpipe train {variant}` first")
    saved = read_payload(path, cfg.limits)
    try:
        prepared = Prepared(cfg.data.out_dir)
        # the network ``variant`` is: itself, or for the student distill.student's
        model, inputs = model_from_payload(saved, cfg.network_of(variant),
                                           prepared.vocab_digest(), cfg.model_of(variant),
                                           cfg.limits.parameters)
        return model, inputs, saved
    except PayloadMismatch as e:
        hint = f" than {prepared.vocab_file}; prepare or train again" \
            if e.field == "vocab_sha256" else ""
        hint = hint or ("; train again" if e.field.startswith("model_config") else "")
        raise InputError(path, e.field, f"{e}{hint}") from None
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a payload missing parts
        raise InputError(path, "", f"refused: not an rcpipe model file ({e!r:.120})") from None


def read_payload(path: Path, limits: ReadLimits = DEFAULT) -> dict[str, Any]:
    """A model file's payload: a regular file within limits.weights_mb, tensors and plain
    containers only (weights_only), else one located line."""
    import torch

    try:
        with reads.open_regular(path) as f:
            if (size := os.fstat(f.fileno()).st_size) > limits.weights_bytes():
                raise reads.too_big(path, size, limits.weights_bytes(), "limits.weights_mb")
            saved = torch.load(f, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        # weights_only refuses any pickled object that is not a tensor or plain container
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise InputError(path, "", f"refused: not a weights-only model file ({reason})"
                         ) from None
    if not isinstance(saved, dict):
        raise InputError(path, "", "refused: not an rcpipe model file")
    return saved


def threshold_for(cfg: Config, saved: float | None) -> float | None:
    """The no-answer threshold a model answers at: eval.na_threshold when the params set it
    (it wins over any saved one), else ``saved``, the one `rcpipe evaluate` wrote beside the
    model or into its package (chosen on the held-out questions, data.heldout's slice of
    train or data.heldout.file, or the params' of that run), else None: the model's own
    rule, na_prob > the span's prob."""
    return cfg.eval.na_threshold if cfg.eval.na_threshold is not None else saved


def na_threshold(cfg: Config, variant: str) -> float | None:
    """The threshold a variant answers at (``threshold_for``): models/<variant>/
    na_threshold.json, read only when the params do not set one."""
    from rcpipe.data.squad import read_json

    path = layout.na_threshold_file(variant)
    saved = threshold_of(read_json(path, str(path), cfg.limits), path) \
        if cfg.eval.na_threshold is None and path.is_file() else None
    return threshold_for(cfg, saved)


def threshold_of(doc: Any, path: Path) -> float | None:
    """na_threshold.json's threshold: a number or null, else a located refusal."""
    value = doc.get("na_threshold", False) if isinstance(doc, dict) else False
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
        raise InputError(path, "na_threshold", "expected a number or null")
    return value


def length_prior(cfg: Config) -> torch.Tensor | None:
    """eval.length_prior's weights, from the prepared training split (None when off)."""
    if not cfg.eval.length_prior:
        return None
    import torch

    from rcpipe.data.dataset import answer_length_prior

    train = Prepared(cfg.data.out_dir).shards("train")
    return torch.from_numpy(answer_length_prior(train, cfg.eval.max_answer_len))
