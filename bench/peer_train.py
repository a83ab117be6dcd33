"""Train a peer's model by its own recipe (bench/peer_recipes.py) on rcpipe's prepared data,
for a wall-clock budget, scoring it as `rcpipe train` scores a run.

The clock is wall time from the first step; a step that ends past ``--minutes`` is the last
(``--max-steps N``: the N-th is, whichever comes first; ``--minutes 0``: no clock).
Every ``--eval-every`` steps and at the last, the weights it would be evaluated on (its EMA's
where its recipe keeps one) are saved; after the clock stops, each answers the held-out slice
prepare set aside and the test file through rcpipe's reader, and the official scorer scores
both. So the peer's minutes are training alone, where `rcpipe train`'s clock counts its
evaluations too (a handicap on rcpipe's side, never the peer's). Each checkpoint's test
answers are kept, so one chosen later (on the held-out slice, at equal steps) is paired
question by question without training again. Writes
``OUT/summary.json`` (history as `rcpipe train`'s: step, minutes, loss, f1, em,
heldout_f1, heldout_em; steps, examples_per_s, the recipe) and ``OUT/answers/step-N.json``.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.peer_train bidaf /tmp/peers/squad \\
        --prepared DIR --test test-v1.1.json --minutes 15 --out OUT
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import parser, write
from peer_recipes import RECIPES, Reader, Recipe, padded

from rcpipe.config.data import Window
from rcpipe.data.dataset import SquadDataset
from rcpipe.data.prepared import Prepared
from rcpipe.data.squad import read_json
from rcpipe.inference.reading import Split, heldout_split, heldout_then_dev
from rcpipe.models.layers import span_loss


def batches(n: int, size: int, rng: np.random.Generator) -> list[list[int]]:
    """One epoch: the rows shuffled, cut into batches (the peers' DataLoader(shuffle=True))."""
    order = rng.permutation(n)
    return [order[i:i + size].tolist() for i in range(0, n, size)]


def step(recipe: Recipe, batch: Any, updates: int) -> float:
    """One training step of the recipe; the loss."""
    recipe.model.train()
    recipe.optimizer.zero_grad()
    loss = span_loss(recipe.read(batch), batch.y1, batch.y2)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(recipe.model.parameters(), recipe.clip)
    recipe.optimizer.step()
    if recipe.scheduler is not None:
        recipe.scheduler.step()
    if recipe.ema is not None:
        recipe.ema(recipe.model, updates)
    return loss.item()


def evaluate(recipe: Recipe, dev: Split, held: Split | None, window: Window,
             max_len: int, device: torch.device) -> tuple[dict[str, float], dict[str, str]]:
    """(the scores, the test answers) of the model's weights as they are (a checkpoint
    holds the EMA's already, where the recipe keeps one)."""
    reader = Reader(recipe.model, recipe.read).eval()
    with torch.no_grad():
        ev, h = heldout_then_dev(reader, dev, held, "heldout", device, max_len,
                                 window=window)
    scores = {"f1": ev.result["f1"], "em": ev.result["exact_match"]}
    if h is not None:
        scores |= {"heldout_f1": h.result["f1"], "heldout_em": h.result["exact_match"]}
    return scores, ev.predictions


def main() -> None:
    ap = parser(__doc__, sets=False)
    ap.add_argument("model", choices=sorted(RECIPES))
    ap.add_argument("peer", type=Path, help="the peer's checkout (outside this repo)")
    ap.add_argument("--prepared", type=Path, required=True, help="rcpipe prepare's folder")
    ap.add_argument("--test", type=Path, required=True, help="the SQuAD file prepared as dev")
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--max-steps", type=int, default=0, help="steps at most (0: no cap)")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--device", type=torch.device, default=torch.device("cpu"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)  # as the peers' train scripts seed, before the model
    files = Prepared(args.prepared)
    vectors = files.word_vectors()
    if vectors is None:
        raise SystemExit(f"error: {args.prepared}: no word_emb.npy (prepare with word vectors)")
    # the CPU preset's widths (params.demo.yaml: hidden 32, 2 heads), as rcpipe's side
    recipe = RECIPES[args.model](args.peer, vectors, len(files.vocab()["chars"]), 32, 2,
                                 args.device)
    dev = Split(SquadDataset.from_parquet(files.dev), read_json(args.test, str(args.test)))
    found = files.heldout()
    held = heldout_split(found, None) if found else None
    saved = trained(recipe, SquadDataset.from_parquet(files.train), args.minutes,
                    args.eval_every, args.seed, args.out / "checkpoints", args.device,
                    args.max_steps)
    # how far it got, before the scoring: bench/peer_accuracy.py starts the faster side's
    # capped run
    write(args.out / "trained.json", {"steps": saved[-1]["step"], "saved": saved})
    (args.out / "answers").mkdir(exist_ok=True)
    history = []
    for point in saved:  # scored after the clock stopped: the peer's minutes train only
        path = args.out / "checkpoints" / f"step-{point['step']}.pt"
        recipe.model.load_state_dict(torch.load(path, args.device, weights_only=True))
        # rcpipe evaluate's reading: data.window's and eval.max_answer_len's defaults
        scores, answers = evaluate(recipe, dev, held, Window(), 15, args.device)
        history.append(point | scores)
        (args.out / f"answers/step-{point['step']}.json").write_text(json.dumps(answers))
        print(f"{recipe.name} step {point['step']} ({point['minutes']:.1f} min): test F1 "
              f"{scores['f1']:.2f}, held-out F1 {scores.get('heldout_f1', float('nan')):.2f}",
              flush=True)
    last, best = saved[-1], max(history, key=lambda h: h.get("heldout_f1", h["f1"]))
    write(args.out / "summary.json", {
        "peer": recipe.name, "recipe": recipe.settings, "seed": args.seed,
        "steps": last["step"], "epochs": last["epoch"], "examples": last["examples"],
        "examples_per_s": last["examples"] / (last["minutes"] * 60), "best_step": best["step"],
        "best_test_f1": best["f1"], "best_heldout_f1": best.get("heldout_f1"),
        "history": history})


def trained(recipe: Recipe, train: SquadDataset, minutes: float, every: int, seed: int,
            out: Path, device: torch.device, max_steps: int = 0) -> list[dict[str, Any]]:
    """Train for ``minutes`` of wall clock (0: no clock) or ``max_steps`` (0: no cap), the
    first reached, saving the weights it would be evaluated on (its EMA's where it keeps one)
    every ``every`` steps and at the last: a point per save."""
    rows = np.flatnonzero(train.y1 >= 0)  # v1.1: every row answers (chrischute's v1.1 filter)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    saved: list[dict[str, Any]] = []
    updates, examples, epoch, done = 0, 0, 0, False
    started = time.perf_counter()
    while not done:
        for indices in batches(len(rows), recipe.batch_size, rng):
            batch = train.collate(rows[indices].tolist(), 16).to(device)
            if recipe.pad_to:
                batch = padded(batch, *recipe.pad_to)
            loss = step(recipe, batch, updates)
            updates, examples = updates + 1, examples + len(indices)
            done = bool(minutes and time.perf_counter() - started > minutes * 60
                        or max_steps and updates >= max_steps)
            if updates % every == 0 or done:
                path = out / f"step-{updates}.pt"
                if recipe.ema is not None:
                    recipe.ema.assign(recipe.model)
                torch.save(recipe.model.state_dict(), path)
                if recipe.ema is not None:
                    recipe.ema.resume(recipe.model)
                saved.append({"epoch": epoch, "step": updates, "examples": examples,
                              "loss": loss,
                              "minutes": round((time.perf_counter() - started) / 60, 3)})
            if done:
                break
        epoch += 1
    return saved


if __name__ == "__main__":
    main()
