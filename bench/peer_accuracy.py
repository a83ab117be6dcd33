"""Benchmark: how well rcpipe's models learn beside the implementations people know, at equal
minutes and at equal steps on this CPU (bench/peers.py's accuracy mode; docs/results/peers.md
says what both sides share and each side's recipe).

rcpipe's ``bidaf`` against chrischute/squad's BiDAF, its ``qanet`` against
BangLiu/QANet-PyTorch, on the article split of SQuAD dev v1.1, both from one prepared split
and one word-vector matrix (seeded N(0, 1) rows, trained on both sides), at the CPU preset's
widths. Each side trains by its own recipe (rcpipe's through `python -m rcpipe.train.local`,
the peer's through bench/peer_train.py), the two at once, one torch thread each, seed by
seed. Checkpoints are chosen on the held-out slice, never on the test articles. At equal
steps S (the slower side's count) the faster side's checkpoints up to S come from its run
again, capped at S with the slower side's cadence: the same first S steps (checked: held-out
F1 at the steps both runs scored agrees). rcpipe minus peer comes with the paired
paragraph-bootstrap interval over the seeds and its verdict.

    .venv/bin/python -m bench.peer_accuracy --minutes 15 --seeds 3

The peers' checkouts: ``git archive`` of their pinned commits (bench/gpu/box.PEERS) into
/tmp/peers/squad and /tmp/peers/QANet-PyTorch, or ``--bidaf-peer`` / ``--qanet-peer``. A run
already finished is not trained again, so an interrupted bench goes on where it stopped.
Writes OUT/peer-accuracy.json and OUT/peer-accuracy.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from accuracy import PRESETS, best_evaluations, panels, prepare
from accuracy import train as rcpipe_train
from common import OUT, ROOT, SPLIT, device_name, parser, write

PARAMS = PRESETS["cpu"]
WORD_DIM = 64  # params.demo.yaml's data.word_dim
# rcpipe variant: its sets to the peer's sizes, and each side's checkpoint cadence (steps),
# about a dozen checkpoints a side in 15 minutes
PAIRS: dict[str, dict[str, Any]] = {
    "bidaf": {"peer": Path("/tmp/peers/squad"), "sets": ["models.bidaf.layers=2"],
              "every": {"rcpipe": 300, "peer": 50}},
    "qanet": {"peer": Path("/tmp/peers/QANet-PyTorch"),
              "sets": ["models.qanet.emb_convs=4", "models.qanet.model_blocks=7",
                       "models.qanet.model_convs=2"],
              "every": {"rcpipe": 120, "peer": 12}},
}


def shared_vectors(work: Path, train_file: Path, test: Path) -> tuple[Path, Path]:
    """(the vectors file, the folder prepared with it): the vocabulary of a plain prepare,
    each word a seeded N(0, 1) row, prepared again so that word_emb.npy holds them."""
    plain, vectors, prepared = work / "plain" / "prepared", work / "vectors.txt", \
        work / "prepared"
    prepare(PARAMS, train_file, test, plain, [])
    if not vectors.is_file():
        words = json.loads((plain / "vocab.json").read_text())["words"][2:]  # after PAD, OOV
        rows = np.random.default_rng(0).standard_normal((len(words), WORD_DIM))
        lines = (w + " " + " ".join(f"{x:.5f}" for x in r) for w, r in zip(words, rows,
                                                                         strict=True))
        vectors.write_text("\n".join(lines) + "\n")
    prepare(PARAMS, train_file, test, prepared, [f"data.word_vectors={vectors}",
                                                 "data.missing_vectors=fixed"])
    return vectors, prepared


def peer_run(model: str, peer: Path, prepared: Path, test: Path, minutes: float, seed: int,
             every: int, out: Path, device: str, max_steps: int = 0) -> dict[str, Any]:
    """The peer trained by its recipe in its own process (bench/peer_train.py)."""
    if not (out / "summary.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        with (out.parent / f"{model}.log").open("w") as log:
            subprocess.run([sys.executable, "-m", "bench.peer_train", model, str(peer),
                            "--prepared", str(prepared), "--test", str(test),
                            "--minutes", str(minutes), "--max-steps", str(max_steps),
                            "--seed", str(seed),
                            "--eval-every", str(every), "--device", device,
                            "--out", str(out)], check=True, stdout=log, stderr=log,
                           cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads((out / "summary.json").read_text())


def rcpipe_run(model: str, vectors: Path | None, prepared: Path, train_file: Path, test: Path,
               minutes: float, every: int, seed: int, run: Path, device: str,
               extra: list[str] = ()) -> dict[str, Any]:
    """rcpipe's side through its worker; training reads word_emb.npy from ``prepared``
    (``vectors``, where given, names the file it came from, as prepare was told)."""
    if not (run / "summary.json").is_file():
        named = [f"data.word_vectors={vectors}", "data.missing_vectors=fixed"] if vectors \
            else []
        rcpipe_train(model, PARAMS, prepared, train_file, test, run, seed, minutes, every,
                     device, sets=[*named, f"models.{model}.train_word_vectors=true",
                                   *PAIRS[model]["sets"], *extra])
    return json.loads((run / "summary.json").read_text())


def peer_steps(out: Path, run: Any) -> int:
    """The steps the peer trained, once it has stopped training (before its scoring ends)."""
    while not (out / "trained.json").is_file():
        if run.done():
            run.result()  # its error, if it failed
            break
        time.sleep(2)
    return json.loads((out / "trained.json").read_text())["steps"]


def best_until(history: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The checkpoint ranked best on the held-out slice among those at or before ``steps``."""
    return max((h for h in history if h["step"] <= steps), key=lambda h: h["heldout_f1"])


def rcpipe_answers(model: str, run: Path, prepared: Path, test: Path) -> dict[str, str]:
    """The test answers of the run's best model (ranked on the held-out slice)."""
    evaluations, _, _ = best_evaluations([model], run.parent, PARAMS, prepared, test)
    return evaluations[model][0].predictions


def one_pair(model: str, seed: int, args: argparse.Namespace, vectors: Path | None,
             prepared: Path,
             train_file: Path, test: Path) -> dict[str, Any]:
    """Both sides of a pair for one seed: their runs, S, and the answers each choice gives."""
    work = args.out / "peer-accuracy" / f"seed-{seed}"
    peer = getattr(args, f"{model}_peer")
    every = dict(zip(("rcpipe", "peer"), args.every, strict=True)) if args.every \
        else PAIRS[model]["every"]
    with ThreadPoolExecutor(3) as pool:
        ours = pool.submit(rcpipe_run, model, vectors, prepared, train_file, test,
                           args.minutes, every["rcpipe"], seed, work / "rcpipe" / model,
                           args.device)
        theirs = pool.submit(peer_run, model, peer, prepared, test, args.minutes, seed,
                             every["peer"], work / "peer" / model, args.device)
        ours_s = ours.result()
        trained = {"rcpipe": ours_s["steps"], "peer": peer_steps(work / "peer" / model, theirs)}
        steps = min(trained.values())
        # the faster side's first S steps again, at the slower side's cadence, while the
        # peer's checkpoints are scored: its own run may have saved none at or before S (a
        # cadence longer than the slower side's steps). No clock: the cap ends it (a clock
        # would stop it short of S on a busy or slow device)
        faster = next((side for side, n in trained.items() if n > steps), None)
        capped = None
        if faster == "rcpipe":
            capped = pool.submit(rcpipe_run, model, vectors, prepared, train_file, test, 0,
                                 every["peer"], seed, work / "rcpipe-steps" / model,
                                 args.device, [f"models.{model}.max_steps={steps}"])
        elif faster == "peer":
            capped = pool.submit(peer_run, model, peer, prepared, test, 0, seed,
                                 every["rcpipe"], work / "peer-steps" / model, args.device,
                                 steps)
        theirs_s = theirs.result()
        capped_s = capped.result() if capped else None
    r: dict[str, Any] = {"steps": {"rcpipe": ours_s["steps"], "peer": theirs_s["steps"],
                                   "equal": steps},
                         "rcpipe": ours_s, "peer": theirs_s}
    minutes_pick = best_until(theirs_s["history"], theirs_s["steps"])["step"]
    answers = {"minutes": (rcpipe_answers(model, work / "rcpipe" / model, prepared, test),
                           peer_answers(work / "peer" / model, minutes_pick))}
    # at equal steps: the slower side's run, the faster side's capped one
    ours_steps, theirs_run, theirs_history = answers["minutes"][0], work / "peer" / model, \
        theirs_s["history"]
    if faster == "rcpipe":
        ours_steps = rcpipe_answers(model, work / "rcpipe-steps" / model, prepared, test)
    elif faster == "peer":
        theirs_run, theirs_history = work / "peer-steps" / model, capped_s["history"]
    if faster:
        long = {h["step"]: h["heldout_f1"] for h in r[faster]["history"]}
        r[f"{faster}_steps"] = capped_s
        r["same_first_steps"] = {
            "steps": [h["step"] for h in capped_s["history"] if h["step"] in long],
            "largest_heldout_f1_gap": max((abs(long[h["step"]] - h["heldout_f1"])
                                           for h in capped_s["history"] if h["step"] in long),
                                          default=None)}
    theirs_pick = best_until(theirs_history, steps)["step"]
    answers["steps"] = (ours_steps, peer_answers(theirs_run, theirs_pick))
    r["chosen_steps"] = {"peer_minutes": minutes_pick, "peer_steps": theirs_pick}
    r["answers"] = answers
    return r


def peer_answers(run: Path, step: int) -> dict[str, str]:
    """The test answers the peer's checkpoint at ``step`` of ``run`` gave (peer_train.py)."""
    return json.loads((run / "answers" / f"step-{step}.json").read_text())


def compared(runs: list[dict[str, Any]], doc: dict[str, Any]) -> dict[str, Any]:
    """At equal minutes and at equal steps: rcpipe's F1 minus the peer's over the seeds."""
    from rcpipe.scoring.compare import seeded_difference

    out = {}
    for at in ("minutes", "steps"):
        d = seeded_difference(doc, [r["answers"][at][1] for r in runs],
                              [r["answers"][at][0] for r in runs])
        out[at] = d.record() | {"line": d.line()}
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    models = list(result["models"])
    fig, axes = panels(len(models), 6, 4.2)
    for ax, model in zip(axes, models, strict=True):
        r = result["models"][model]
        for side, style, colour in (("rcpipe", "-", "C0"), ("peer", "--", "C3")):
            for j, run in enumerate(r["runs"].values()):
                h = run[side]["history"]
                ax.plot([p["minutes"] for p in h], [p["f1"] for p in h], style, marker=".",
                        color=colour, alpha=1.0 if j == 0 else 0.45,
                        label=(f"rcpipe {model}" if side == "rcpipe" else r["peer"])
                        if j == 0 else None)
        m = r["compared"]["minutes"]
        ax.set(title=f"{model}: rcpipe minus peer at {result['minutes']:g} min "
                     f"{m['mean']['diff']:+.1f} F1 ({m['verdict']})",
               xlabel="training minutes (both sides at once)",
               ylabel="test F1 (article split of SQuAD dev v1.1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['device']}: each side by its own recipe, {len(result['seeds'])} "
                 "seed(s);\ncheckpoints chosen on the held-out slice")
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = parser(__doc__, OUT, sets=False)
    ap.add_argument("--models", nargs="*", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--minutes", type=float, default=15.0, help="training minutes a side")
    ap.add_argument("--seeds", type=int, default=3, help="42, 43, ...: both sides with each")
    ap.add_argument("--bidaf-peer", type=Path, default=PAIRS["bidaf"]["peer"])
    ap.add_argument("--qanet-peer", type=Path, default=PAIRS["qanet"]["peer"])
    ap.add_argument("--every", type=int, nargs=2, metavar=("RCPIPE", "PEER"),
                    help="steps between checkpoints on each side (default: PAIRS', about a "
                    "dozen a side in 15 minutes)")
    ap.add_argument("--split", type=Path, default=SPLIT)
    ap.add_argument("--prepared", type=Path, help="shared_vectors' folder, prepared elsewhere "
                    "(the GPU kit's: its box has no spaCy); the split's test file beside it")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # its scoring runs beside the two sides' training
    train_file, test = args.split / "train-v1.1.json", args.split / "test-v1.1.json"
    vectors, prepared = (None, args.prepared) if args.prepared else \
        shared_vectors(args.out / "peer-accuracy", train_file, test)
    doc = json.loads(test.read_text())
    seeds = list(range(42, 42 + args.seeds))
    result: dict[str, Any] = {"minutes": args.minutes, "seeds": seeds, "split": "v1.1",
                              "device": device_name(torch.device(args.device))
                              if args.device == "cuda" else
                              f"{os.cpu_count()}-core CPU, 1 thread a side",
                              "models": {}}
    for model in args.models:
        runs = {}
        for seed in seeds:
            print(f"{model} seed {seed}: both sides for {args.minutes:g} min", flush=True)
            runs[seed] = one_pair(model, seed, args, vectors, prepared, train_file, test)
        found = compared(list(runs.values()), doc)
        for r in runs.values():
            del r["answers"]
        result["models"][model] = {"peer": runs[seeds[0]]["peer"]["peer"],
                                   "recipe": runs[seeds[0]]["peer"]["recipe"],
                                   "runs": {str(s): r for s, r in runs.items()},
                                   "compared": found}
        for at, d in found.items():
            print(f"{model} at equal {at}: rcpipe minus peer {d['line']}", flush=True)
    write(args.out / "peer-accuracy.json", result)
    plot(result, args.out / "peer-accuracy.png")
    print(f"-> {args.out / 'peer-accuracy.png'}")


if __name__ == "__main__":
    main()
