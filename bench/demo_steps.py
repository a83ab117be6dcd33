"""The CPU demo's training steps alone: N eager steps of every variant at params.demo.yaml's
sizes on a prepared split, one torch thread, as `make demo` trains them (its batches:
length-bucketed, padded to each batch's longest). A whole-process command to time two
versions of the code side by side, without the minutes of a full demo:

    .venv/bin/python bench/demo_steps.py data/prepared [--steps 20]
"""

from __future__ import annotations

import argparse
from itertools import islice
from pathlib import Path

import torch

from rcpipe.config import VARIANTS, load_config
from rcpipe.data.dataset import SquadDataset, bucket_batches
from rcpipe.models import build_model
from rcpipe.train.loop import EMA, make_optimizer, train_step
from rcpipe.trained.model_file import prepared_inputs

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prepared", type=Path)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    args = ap.parse_args()
    torch.set_num_threads(1)  # the demo gives each variant's job one CPU
    cfg = load_config(ROOT / "params.demo.yaml")
    data = SquadDataset.from_parquet(args.prepared / "train.parquet")
    batches = bucket_batches(data.context_lengths(), cfg.train.batch_size, True, seed=0)
    for v in args.variants:
        mcfg = cfg.models.of(v)
        torch.manual_seed(0)
        model = build_model(v, mcfg, prepared_inputs(args.prepared, cfg.data.word_dim))
        optimizer, scheduler = make_optimizer(model, mcfg.optim)
        ema = EMA(model, mcfg.optim.ema_decay) if mcfg.optim.ema_decay else None
        for indices in islice(batches, args.steps):
            train_step(model, data.collate(indices), optimizer, scheduler, mcfg.optim.grad_clip,
                       ema)


if __name__ == "__main__":
    main()
