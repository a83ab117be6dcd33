"""The champion gate's false-promotion rate: how often it promotes one seed of a setting
over another seed of the same setting.

    .venv/bin/python bench/gate.py [--pairs 20] [--steps 300] [--eval-every 100] \
        [--first-seed 100] [--min-gain G] [--lanes 2] [--set key=value ...]

Trains bidaf of the demo preset (params.demo.yaml on its synthetic data, made once in a fresh
directory) for ``--steps`` steps with ``2 x --pairs`` seeds, each in one plain process (python
-m rcpipe.train.local, steps alone ending it), its checkpoints ranked on the held-out slice as
the demo ranks them. Then the gate as `rcpipe version --promote` runs it: every run's best
model answers the gate set (rcpipe.release.gate's ``gate_set``), and for each disjoint pair
(the first seed the champion) the paired F1 difference with its paragraph bootstrap goes to
rcpipe.release.rules.decide at ``--min-gain`` (default: params.demo.yaml's). The two sides
of a pair are the same settings, so every promotion is a false one. A run answers through
its model file, not a package: the same Reader, weights, vocabulary and decoding. From the
same runs also:

- **selection**: the nightly's candidate is the best of a run's models on the gate set, which
  flatters it on the very questions it is then judged on: disjoint triples, the candidate the
  better of two seeds on the gate set;
- **choosing min_gain honestly**: the smallest ``min_gain`` (in 0.25 steps) whose rate on the
  first half of the pairs is at most 5%, and that value's rate on the pairs it was not chosen on.

Writes bench/out/gate.json (every pair's interval) and prints the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import OUT, ROOT, parser, set_args, write

from rcpipe.config import load_config

PARAMS = ROOT / "params.demo.yaml"
VARIANT = "bidaf"
TARGET = 0.05  # the rate the default min_gain must keep under


def setup(work: Path, sets: list[str]) -> None:
    """rcpipe synth and prepare of the demo preset in ``work`` (as the demo's first stages)."""
    for command in ("synth", "prepare"):
        subprocess.run([sys.executable, "-m", "rcpipe", command, "--params", str(PARAMS),
                        *set_args(sets)], cwd=work, check=True, capture_output=True)


def train(work: Path, seed: int, args: argparse.Namespace) -> Path:
    """One seed's run of the setting, steps alone ending it (a loaded machine gets the same
    run): its best model by held-out F1, as the demo keeps it."""
    run_dir = work / "runs" / args.tag / f"{VARIANT}-seed{seed}"
    if (run_dir / "model.pt").is_file():
        return run_dir / "model.pt"
    sets = [f"train.seed={seed}", f"models.{VARIANT}.max_steps={args.steps}",
            f"train.eval_every={args.eval_every}", "train.threads=1",
            f"models.{VARIANT}.max_minutes=600", "train.max_minutes=600", "train.epochs=1000",
            *args.sets]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with run_dir.with_suffix(".log").open("w") as log:
        subprocess.run([sys.executable, "-m", "rcpipe.train.local", VARIANT,
                        "--params", str(PARAMS), "--run-dir", str(run_dir), *set_args(sets)],
                       cwd=work, check=True, stdout=subprocess.DEVNULL, stderr=log,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    history = json.loads((run_dir / "summary.json").read_text())["history"]
    print(f"  {VARIANT} seed {seed}: {args.steps} steps in {time.perf_counter() - t0:.0f} s, "
          f"dev F1 {history[-1]['f1']:.1f} at the end", flush=True)
    return run_dir / "model.pt"


def gate_answers(work: Path, models: dict[int, Path], sets: list[str]
                 ) -> tuple[Any, dict[int, dict[str, str]]]:
    """(the gate set, seed -> its model's answers there), as the gate answers."""
    import torch

    from rcpipe.data.encode import TextEncoder
    from rcpipe.data.prepared import Prepared
    from rcpipe.inference.answer import Reader
    from rcpipe.release.gate import gate_set
    from rcpipe.stages.fetch import sha256_of
    from rcpipe.trained.model_file import model_from_payload

    torch.set_num_threads(1)
    cfg = load_config(PARAMS, sets)
    out = work / cfg.data.out_dir
    cfg = load_config(PARAMS, [*sets, f"data.out_dir={out}"])
    gate = gate_set(cfg, sha256_of(work / cfg.data.dev_file))
    meta = json.loads((out / "meta.json").read_text())
    encoder = TextEncoder.from_vocab(json.loads((out / "vocab.json").read_text()),
                                     meta.get("char_limit", cfg.data.limits.char))
    ds = encoder.squad(gate.squad)
    digest = Prepared(out).vocab_digest()
    found = {}
    for seed, path in models.items():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model, inputs = model_from_payload(saved, VARIANT, digest)
        reader = Reader(encoder, {VARIANT: model.eval()}, torch.device("cpu"),
                        cfg.eval.max_answer_len, {VARIANT: None}, no_answer=inputs.no_answer,
                        window=cfg.data.window)
        found[seed] = {q: a["text"] for q, a in reader.answer_dataset(ds, VARIANT).items()}
    return gate, found


def judge(gate: Any, champion: tuple[int, dict[str, str]], candidate: tuple[int, dict[str, str]],
          min_gain: float) -> dict[str, Any]:
    """The gate's decision on one pair (champion seed, candidate seed)."""
    from dataclasses import asdict

    from rcpipe.release.rules import Score, decide
    from rcpipe.scoring.compare import paired_difference

    d = paired_difference(gate.doc, champion[1], candidate[1])
    decision = decide(Score(VARIANT, 0.0, 0.0, "", f"seed{candidate[0]}"),
                      Score(VARIANT, 0.0, 0.0, "", f"seed{champion[0]}"), d, gate.info,
                      min_gain)
    return {"champion": champion[0], "candidate": candidate[0], **asdict(d),
            "promoted": decision.promote}


def rate(rows: list[dict[str, Any]], min_gain: float) -> tuple[int, int]:
    """(promotions, pairs) at ``min_gain``: the gate promotes when low > min_gain."""
    return sum(1 for r in rows if r["low"] > min_gain), len(rows)


def main() -> None:
    ap = parser(__doc__, OUT)
    ap.add_argument("--pairs", type=int, default=20, help="disjoint seed pairs (2x runs)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--min-gain", type=float, help="default: params.demo.yaml's")
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--workdir", type=Path, help="reuse a directory (default: a fresh one)")
    ap.add_argument("--tag", default="gate", help="the runs' folder under WORKDIR/runs/")
    args = ap.parse_args()
    min_gain = load_config(PARAMS, args.sets).version.min_gain if args.min_gain is None \
        else args.min_gain
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rcpipe-gate-"))
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "data" / "prepared" / "train.parquet").is_file():
        setup(work, args.sets)
    seeds = list(range(args.first_seed, args.first_seed + 2 * args.pairs))
    print(f"{work}: {VARIANT}, {len(seeds)} seeds x {args.steps} steps, {args.lanes} at a "
          "time", flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.lanes) as pool:
        models = dict(zip(seeds, pool.map(lambda s: train(work, s, args), seeds), strict=True))
    train_s = time.perf_counter() - t0
    gate, found = gate_answers(work, models, args.sets)
    answers = list(found.items())  # seed order
    pairs = [judge(gate, answers[i], answers[i + 1], min_gain)
             for i in range(0, len(answers) - 1, 2)]
    from rcpipe.scoring.metrics import score

    f1 = {s: float(score(gate.doc, a)["f1"]) for s, a in found.items()}
    triples = []
    for i in range(0, len(answers) - 2, 3):
        better = max(answers[i + 1:i + 3], key=lambda sa: f1[sa[0]])
        triples.append(judge(gate, answers[i], better, min_gain))
    half = len(pairs) // 2
    choose, measure = pairs[:half], pairs[half:]
    grid = [0.25 * k for k in range(0, 81)]
    chosen = next((g for g in grid if rate(choose, g)[0] <= TARGET * len(choose)), None)
    result = {
        "workdir": str(work), "variant": VARIANT, "steps": args.steps,
        "eval_every": args.eval_every, "sets": args.sets, "seeds": seeds,
        "train_s": round(train_s, 1), "min_gain": min_gain, "gate_set": gate.info.__dict__,
        "gate_f1": f1, "pairs": pairs, "triples": triples,
        "rate": rate(pairs, min_gain), "rate_selected": rate(triples, min_gain),
        "chosen_on_first_half": chosen,
        "rate_chosen_on_second_half": rate(measure, chosen) if chosen is not None else None,
    }
    print(f"\ngate set: {gate.info.line()}; gate F1 over the {len(f1)} seeds: "
          f"{min(f1.values()):.1f} to {max(f1.values()):.1f}")
    for r in pairs:
        print(f"  seed {r['champion']} -> {r['candidate']}: {r['f1_a']:.1f} -> {r['f1_b']:.1f}"
              f", {r['diff']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}]"
              f"{'  PROMOTED' if r['promoted'] else ''}")
    n, total = result["rate"]
    print(f"false promotions at min_gain {min_gain:.2f}: {n} of {total} pairs "
          f"({100 * n / total:.0f}%; target <= {TARGET:.0%})")
    n, total = result["rate_selected"]
    print(f"  with the candidate the better of two seeds on the gate set: {n} of {total}")
    if chosen is not None:
        n, total = result["rate_chosen_on_second_half"]
        print(f"  min_gain chosen on the first {len(choose)} pairs: {chosen:.2f}; on the other "
              f"{total}: {n} of {total}")
    print(f"training: {train_s / 60:.1f} min")
    write(args.out / "gate.json", result)


if __name__ == "__main__":
    main()
