"""The char CNN's two paths at params.yaml's sizes, through what evaluation and serving run:
`inference/reading.predict` over a prepared split, once with the convolution
(`CharCNN.convolved`, what training runs) and once with its inference path
(`CharCNN.windowed`), alternated, one torch thread. Prints each path's time (the minimum of
``--repeats``), whether every answer is the same, the largest probability difference, and
the host reads predict made (rcpipe/train/audit.HostSyncs: 0 is one copy a batch).

    .venv/bin/python bench/char_cnn_paths.py gpu-kit/base/v1.1/prepared bidaf qanet

The models are params.yaml's, untrained (seed 0), without word vectors: the path's
numbers and time, not its accuracy.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from rcpipe.config import VARIANTS, load_config
from rcpipe.data.dataset import SquadDataset
from rcpipe.inference.reading import predict
from rcpipe.models import build_model
from rcpipe.models.embeddings import CharCNN
from rcpipe.train.audit import HostSyncs
from rcpipe.trained.model_file import prepared_inputs

ROOT = Path(__file__).resolve().parents[1]
PATHS = {"conv": CharCNN.convolved, "windowed": CharCNN.windowed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prepared", type=Path, help="a prepared split (rcpipe prepare's out_dir)")
    ap.add_argument("variants", nargs="+", choices=VARIANTS)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(ROOT / "params.yaml", ["data.word_vectors=null"])
    dataset = SquadDataset.from_parquet(args.prepared / "dev.parquet")
    inputs = prepared_inputs(args.prepared, cfg.data.word_dim)
    chosen = CharCNN.forward
    try:
        for variant in args.variants:
            torch.manual_seed(0)
            model = build_model(variant, cfg.models.of(variant), inputs).eval()
            answers, seconds, reads = {}, {name: [] for name in PATHS}, {}
            for _ in range(args.repeats):
                for name, path in PATHS.items():
                    CharCNN.forward = path  # every CharCNN of the model takes this path
                    syncs = HostSyncs()
                    start = time.perf_counter()
                    with torch.no_grad(), syncs:
                        answers[name] = predict(model, dataset, None, torch.device("cpu"))
                    seconds[name].append(time.perf_counter() - start)
                    reads[name] = dict(syncs.ops)
            conv, windowed = answers["conv"], answers["windowed"]
            same = sum(conv[q]["span_text"] == windowed[q]["span_text"] for q in conv)
            diff = max(abs(conv[q]["prob"] - windowed[q]["prob"]) for q in conv)
            fast, slow = min(seconds["windowed"]), min(seconds["conv"])
            print(f"{variant}: {len(dataset)} questions; conv {slow:.1f} s, windowed "
                  f"{fast:.1f} s ({fast / slow:.2f}x); the same answer {same}/{len(conv)}, "
                  f"max |prob difference| {diff:.2e}; host reads {reads}")
    finally:
        CharCNN.forward = chosen


if __name__ == "__main__":
    main()
