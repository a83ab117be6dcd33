"""Training stages: `rcpipe train VARIANT` and `rcpipe evaluate VARIANT` (one process).

Layout (the command contract): models/<variant>/checkpoints/step-<n>.pt while training,
models/<variant>/model.pt (the best weights by dev F1, EMA weights where the variant keeps
an EMA) and models/<variant>/summary.json; evaluate writes predictions/<variant>.json,
predictions/<variant>.nbest.json and metrics/<variant>.json.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rcpipe.config import Config
from rcpipe.console import console
from rcpipe.errors import InputError
from rcpipe.stages.io import load_dataset, write_json

KEEP_CHECKPOINTS = 2


def model_dir(variant: str) -> Path:
    return Path("models") / variant


def _vocab_hash(prepared: Path) -> str:
    return hashlib.sha256((prepared / "vocab.json").read_bytes()).hexdigest()


def _model_inputs(cfg: Config):  # noqa: ANN202 - ModelInputs, imported lazily
    import numpy as np

    from rcpipe.models import ModelInputs

    d = cfg.data.out_dir
    if not (d / "train.parquet").is_file():
        raise InputError(d, "", "no prepared data; run `rcpipe prepare` first")
    vocab = json.loads((d / "vocab.json").read_text())
    meta = json.loads((d / "meta.json").read_text())
    vectors = np.load(d / "word_emb.npy") if (d / "word_emb.npy").is_file() else None
    return ModelInputs(
        word_vocab=len(vocab["words"]), char_vocab=len(vocab["chars"]),
        word_dim=cfg.data.word_dim, vectors=vectors,
        no_answer="2.0" in meta["version"]["train"],
    )


def _device(cfg: Config):  # noqa: ANN202
    import torch

    if cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def _f1_key(result: dict[str, Any]) -> tuple[float, float]:
    return result.get("exact_match", result.get("exact", 0.0)), result["f1"]


def train(cfg: Config, variant: str, force: bool = False) -> dict[str, Any]:
    """Train one variant in this process; resume from its last checkpoint if one exists."""
    import numpy as np
    import torch

    from rcpipe.console import progress
    from rcpipe.data.dataset import SquadDataset, bucket_batches
    from rcpipe.eval import metrics
    from rcpipe.models import build_model
    from rcpipe.train.loop import EMA, make_optimizer, predict, train_step

    mcfg = cfg.models.of(variant)
    out = model_dir(variant)
    ckpt_dir = out / "checkpoints"
    summary_path = out / "summary.json"
    if summary_path.is_file() and not force:
        summary = json.loads(summary_path.read_text())
        if summary.get("finished"):
            console.print(f"train {variant}: already finished ({summary_path}); nothing to do")
            return summary
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.train.seed)
    device = _device(cfg)
    inputs = _model_inputs(cfg)
    train_set = SquadDataset.from_parquet(cfg.data.out_dir / "train.parquet")
    dev_set = SquadDataset.from_parquet(cfg.data.out_dir / "dev.parquet",
                                        para_limit=cfg.train.dev_para_limit)
    dev_doc = load_dataset(cfg.data.dev_file, cfg.data.cache_dir)
    model = build_model(variant, mcfg, inputs).to(device)
    optimizer, scheduler = make_optimizer(model, mcfg.optim)
    ema = EMA(model, mcfg.optim.ema_decay) if mcfg.optim.ema_decay else None
    batch_size = mcfg.batch_size or cfg.train.batch_size

    step, epoch, best, resumed_from = 0, 0, None, 0
    latest = _latest_checkpoint(ckpt_dir)
    if latest is not None:
        state = torch.load(latest, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if ema is not None and state.get("ema"):
            ema.load_state_dict(state["ema"])
        torch.set_rng_state(state["rng"])
        step, epoch, best = state["step"], state["epoch"], state.get("best")
        resumed_from = step
        console.print(f"train {variant}: resumed from {latest} (step {step}, epoch {epoch})")

    def evaluate_dev() -> dict[str, Any]:
        batches = bucket_batches(dev_set.context_lengths(), 64, shuffle=False)
        with ema.applied(model) if ema is not None else nullcontext():
            nbest = predict(model, dev_set, batches, device, cfg.eval.max_answer_len,
                            cfg.eval.na_threshold)
        return metrics.score(dev_doc, {q: v["text"] for q, v in nbest.items()})

    t0 = time.perf_counter()
    seen, history = 0, []
    limit_s = cfg.train.max_minutes * 60
    stop = False
    lengths = train_set.context_lengths()
    with progress() as bar:
        task = bar.add_task(f"train {variant}", total=cfg.train.epochs)
        bar.update(task, completed=epoch)
        while epoch < cfg.train.epochs and not stop:
            batches = bucket_batches(lengths, batch_size, shuffle=True,
                                     seed=cfg.train.seed + epoch)
            losses = []
            for indices in batches:
                batch = train_set.collate(indices).to(device)
                losses.append(train_step(model, batch, optimizer, scheduler,
                                         mcfg.optim.grad_clip, ema))
                step += 1
                seen += len(indices)
                if step % 10 == 0:
                    rate = seen / (time.perf_counter() - t0)
                    bar.update(task, description=f"train {variant} step {step} "
                               f"loss {np.mean(losses[-10:]):.3f} {rate:.0f} ex/s")
                if (cfg.train.max_steps and step >= cfg.train.max_steps) or \
                        (limit_s and time.perf_counter() - t0 > limit_s):
                    stop = True
                    break
            epoch += 1
            result = evaluate_dev()
            em, f1 = _f1_key(result)
            history.append({"epoch": epoch, "step": step, "loss": float(np.mean(losses)),
                            "em": em, "f1": f1})
            console.print(f"train {variant}: epoch {epoch} step {step} loss "
                          f"{np.mean(losses):.3f} dev EM {em:.2f} F1 {f1:.2f}")
            if best is None or f1 > best["f1"]:
                best = {"em": em, "f1": f1, "step": step, "epoch": epoch}
                _save_model(out / "model.pt", variant, cfg, inputs, model, ema)
            _save_checkpoint(ckpt_dir, step, epoch, best, model, optimizer, scheduler, ema)
            bar.update(task, completed=epoch)

    wall = time.perf_counter() - t0
    summary = {
        "variant": variant, "world_size": 1, "steps": step, "epochs": epoch,
        "examples_per_s": round(seen / wall, 2) if wall > 0 else 0.0,
        "resumed_from_step": resumed_from, "device": str(device),
        "wall_seconds": round(wall, 2), "best_dev_em": best["em"] if best else None,
        "best_dev_f1": best["f1"] if best else None, "history": history,
        "finished": True,
    }
    write_json(out / "metrics.json", {"history": history})
    write_json(summary_path, summary)
    return summary


def _latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def _save_checkpoint(ckpt_dir: Path, step: int, epoch: int, best: dict | None,
                     model, optimizer, scheduler, ema) -> None:  # noqa: ANN001
    import torch

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step-{step}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "ema": ema.state_dict() if ema is not None else None,
                "rng": torch.get_rng_state(), "step": step, "epoch": epoch, "best": best}, tmp)
    tmp.replace(path)
    for old in sorted(ckpt_dir.glob("step-*.pt"),
                      key=lambda p: int(p.stem.split("-")[1]))[:-KEEP_CHECKPOINTS]:
        old.unlink()


def _save_model(path: Path, variant: str, cfg: Config, inputs, model, ema) -> None:  # noqa: ANN001
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    weights = dict(model.state_dict())
    if ema is not None:
        weights.update(ema.shadow)
    meta = asdict(inputs) | {"vectors": None}
    tmp = path.with_suffix(".tmp")
    torch.save({"variant": variant, "model_config": cfg.models.of(variant).model_dump(),
                "inputs": meta, "vocab_sha256": _vocab_hash(cfg.data.out_dir),
                "state_dict": {k: v.cpu() for k, v in weights.items()}}, tmp)
    tmp.replace(path)


def load_model(cfg: Config, variant: str):  # noqa: ANN201 - (nn.Module, ModelInputs)
    """The saved model, refusing one trained on a different vocabulary (weights only)."""
    import torch

    from rcpipe.config import ModelConfig
    from rcpipe.models import ModelInputs, build_model

    path = model_dir(variant) / "model.pt"
    if not path.is_file():
        raise InputError(path, "", f"no trained model; run `rcpipe train {variant}` first")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved.get("variant") != variant:
        raise InputError(path, "variant", f"holds {saved.get('variant')!r}, not {variant!r}")
    if saved["vocab_sha256"] != _vocab_hash(cfg.data.out_dir):
        raise InputError(path, "vocab_sha256", f"trained on another vocabulary than "
                         f"{cfg.data.out_dir / 'vocab.json'}; prepare or train again")
    inputs = ModelInputs(**{**saved["inputs"], "vectors": None})
    model = build_model(variant, ModelConfig.model_validate(saved["model_config"]), inputs)
    try:
        model.load_state_dict(saved["state_dict"])
    except RuntimeError as e:
        raise InputError(path, "state_dict", f"does not fit the model: {str(e)[:200]}") from None
    return model, inputs


def evaluate(cfg: Config, variant: str) -> dict[str, Any]:
    """Predict the dev set with the saved model; write predictions, nbest and metrics."""
    import torch

    from rcpipe.data.dataset import SquadDataset, bucket_batches
    from rcpipe.eval import metrics
    from rcpipe.train.loop import predict

    model, _ = load_model(cfg, variant)
    device = _device(cfg)
    model.to(device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    dev_set = SquadDataset.from_parquet(cfg.data.out_dir / "dev.parquet",
                                        para_limit=cfg.train.dev_para_limit)
    t0 = time.perf_counter()
    nbest = predict(model, dev_set, bucket_batches(dev_set.context_lengths(), 64, False),
                    device, cfg.eval.max_answer_len, cfg.eval.na_threshold)
    doc = load_dataset(cfg.data.dev_file, cfg.data.cache_dir)
    preds = {q: v["text"] for q, v in nbest.items()}
    na = {q: v["na_prob"] for q, v in nbest.items()} \
        if metrics.dataset_version(doc) == "2.0" else None
    result = metrics.score(doc, preds, na)
    write_json(Path("predictions") / f"{variant}.json", preds)
    write_json(Path("predictions") / f"{variant}.nbest.json", nbest)
    write_json(Path("metrics") / f"{variant}.json", result)
    write_json(Path("metrics") / f"{variant}.by_type.json", metrics.breakdown(doc, preds, na))
    em, f1 = _f1_key(result)
    console.print(f"evaluate {variant}: EM {em:.2f} F1 {f1:.2f} on {len(preds)} dev questions "
                  f"({time.perf_counter() - t0:.1f}s)")
    return result
