"""A Reader over trained models, as every command that answers loads one: `rcpipe predict`,
`rcpipe serve` (stages/serving.py), `rcpipe export`'s check, the champion app (champion/):
models/<variant>/model.pt (weights only, refused when trained on another vocabulary or
architecture: model_file.py) or a package directory (its own vocabulary and settings:
package_dir.py), answering through inference/answer.py's Reader, the path `rcpipe evaluate`
takes through the model; the onnx runtime swaps each model's forward for its exported graph
(onnx.py), nothing else. No training code is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rcpipe import layout
from rcpipe.config import TRAINED, Config
from rcpipe.errors import InputError

if TYPE_CHECKING:  # heavy (torch): imported where it is used
    import torch

    from rcpipe.config.data import Window
    from rcpipe.inference.answer import Reader
    from rcpipe.trained.package_dir import Package

ENSEMBLE = layout.ENSEMBLE


RUNTIMES = ("torch", "onnx")


def packages_only(names: list[str]) -> bool:
    """Whether ``names`` are all package directories (which carry their own settings)."""
    from rcpipe.trained.package_dir import is_package

    return bool(names) and all(n not in TRAINED and is_package(Path(n)) for n in names)


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
    packages = [n for n in names if n not in (*TRAINED, ENSEMBLE) and Path(n).is_dir()]
    if packages:
        if len(names) != 1:
            raise InputError("--model", packages[0], "a package is served on its own")
        return _package_reader(cfg, packages[0], device)
    variants: list[str] = []
    for name in names:
        if name == ENSEMBLE:
            found = layout.trained_variants()
            if not found:
                raise InputError("models/", "", "no trained variant to ensemble; run "
                                 "`rcpipe train VARIANT` first")
            variants += found
        elif name in TRAINED:  # a variant, or the student (never one of the ensemble's)
            variants.append(name)
        else:
            raise InputError("--model", name, f"unknown model; choose from "
                             f"{', '.join((*TRAINED, ENSEMBLE))} or a package directory")
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
    from rcpipe.trained.model_file import threshold_for
    from rcpipe.trained.package_dir import load_package

    pkg = load_package(Path(name), cfg.limits)
    return package_reader(pkg, name, device, threshold_for(cfg, pkg.na_threshold),
                          cfg.data.window, cfg.data.window.max_tokens)


def package_reader(pkg: Package, name: str, device: torch.device, threshold: float | None,
                   window: Window, max_tokens: int | None = None) -> Reader:
    """A Reader over a loaded package answering under ``name``, as it serves: its
    vocabulary, decoding and no-answer head; the caller's threshold and reading of a long
    context (`rcpipe predict` and serve's, the champion gate's)."""
    from rcpipe.data.encode import TextEncoder
    from rcpipe.inference.answer import Reader

    return Reader(TextEncoder.from_vocab(pkg.vocab, pkg.char_limit),
                  {name: pkg.model.to(device)}, device, pkg.max_answer_len, {name: threshold},
                  no_answer=pkg.inputs.no_answer, length_prior=pkg.length_prior,
                  window=window, max_tokens=max_tokens)


def on_device(cfg: Config, replica: bool = True) -> Config:
    """``cfg`` with the device a model loads on: in a Reader replica, CUDA when the replica
    holds a GPU (serve.replica_gpus), else the CPU, whatever train.device says (a CPU
    replica on a GPU node must not take a GPU it did not reserve); the driver's check
    (``replica`` False: the head of a cluster has no GPU) on the CPU."""
    device = "cuda" if replica and cfg.serve.replica_gpus > 0 else "cpu"
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"device": device})})
