"""Benchmark: the answer-length prior (eval.length_prior), decoding only, on trained models.

Takes the best model of every variant a `bench/accuracy.py` run left under
bench/out/accuracy/<preset>/v<V>/runs/ and scores it on the test articles twice, choosing
spans by p_start * p_end alone and weighted by the training answers' length distribution.
Same models, same questions: the difference is the prior's alone.

    .venv/bin/python bench/length_prior.py [--preset cpu] [--version 1.1]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rcpipe.data.dataset import SquadDataset
from rcpipe.data.prepared import Prepared
from rcpipe.data.squad import read_json
from rcpipe.inference.reading import evaluate_model
from rcpipe.trained.model_file import model_from_payload

ROOT = Path(__file__).resolve().parents[1]
SPLIT = ROOT.parent / "shared" / "data" / "squad-split"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--version", default="1.1")
    ap.add_argument("--split", type=Path, default=SPLIT)
    ap.add_argument("--max-answer-len", type=int, default=15)
    args = ap.parse_args()
    root = ROOT / "bench" / "out" / "accuracy" / args.preset / f"v{args.version}"
    prepared = root / "prepared"
    test = args.split / f"test-v{args.version}.json"
    doc = read_json(test, str(test))
    dev = SquadDataset.from_parquet(prepared / "dev.parquet", para_limit=1000)
    prior = torch.from_numpy(SquadDataset.from_parquet(prepared / "train.parquet")
                             .answer_length_prior(args.max_answer_len))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = {}
    digest = Prepared(prepared).vocab_digest()
    for path in sorted((root / "runs").glob("*/model.pt")):
        variant = path.parent.name
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model = model_from_payload(saved, variant, digest)[0].to(device)
        plain = evaluate_model(model, dev, doc, device, args.max_answer_len).result["f1"]
        weighted = evaluate_model(model, dev, doc, device, args.max_answer_len,
                                  length_prior=prior).result["f1"]
        out[variant] = {"f1": plain, "f1_with_length_prior": weighted}
        print(f"{variant:<15} F1 {plain:6.2f}  with the length prior {weighted:6.2f} "
              f"({weighted - plain:+.2f})", flush=True)
    dest = ROOT / "bench" / "out" / f"length_prior-v{args.version}.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"-> {dest}")


if __name__ == "__main__":
    main()
