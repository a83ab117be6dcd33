"""Benchmark: rcpipe's model against a peer's, at equal sizes, on the same tensors.

A peer is a checkout outside this repository (its path an argument; nothing of it is
copied here): chrischute/squad (the CS224N BiDAF baseline, commit 85623ad) for ``bidaf``,
BangLiu/QANet-PyTorch for ``qanet``. Its model class is imported from that path and built
at the sizes rcpipe's is; both read the same real-text batch (bench/peer_text.py: the first
``--context`` tokens of ``--batch`` SQuAD articles, so words repeat as in real batches) and
train with the same optimiser (Adam, lr 1e-3; no EMA, no clipping on either side). After
``--warmup`` rounds, each of ``--repeats`` rounds times a training step and an inference
forward of each side, the side that goes first alternating round by round; it prints medians,
minimums and rcpipe/peer ratios (above 1: rcpipe slower); the differences between the two
models that remain are listed in docs/results/peers.md. One torch thread unless
``--threads``; the CPU unless ``--device`` (``cuda``: rcpipe's distinct words found on the
host and copied each step, as its collate does). Name the machine with the numbers (its
load moves them: compare within one run).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.peers bidaf /tmp/peers/squad
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.peers qanet /tmp/peers/QANet-PyTorch

``--text FILE`` reads the batch bench/peer_text.save_text_batch wrote instead of tokenizing
``--squad`` (the GPU box has no spaCy: the kit carries the batch); ``--out FILE`` writes the
timings and ratios as JSON too.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from common import ROOT, SQUAD, device_name, parser, write
from peer_recipes import bangliu_module, chrischute_modules
from peer_text import TextBatch, load_text_batch, read_text_batch
from torch import nn

from rcpipe.config import ModelConfig, load_config
from rcpipe.data.dataset import distinct_words
from rcpipe.models import ModelInputs, build_model
from rcpipe.models.batch import Batch
from rcpipe.models.layers import span_loss


@dataclass
class Side:
    name: str
    model: nn.Module
    forward: Callable[[], Any]  # the model on the batch
    loss: Callable[[Any], torch.Tensor]  # of the forward's output


def on(text: TextBatch, device: torch.device) -> TextBatch:
    """The batch's tensors on ``device``."""
    return dataclasses.replace(text, **{f.name: getattr(text, f.name).to(device)
                                        for f in dataclasses.fields(text)
                                        if isinstance(getattr(text, f.name), torch.Tensor)})


def rcpipe_side(variant: str, cfg: ModelConfig, text: TextBatch, vectors: np.ndarray,
                device: torch.device) -> Side:
    inputs = ModelInputs(word_vocab=len(vectors), char_vocab=text.char_vocab,
                         word_dim=vectors.shape[1], vectors=vectors, no_answer=False)
    model = build_model(variant, cfg, inputs).to(device)
    host, text = text, on(text, device)
    batch = Batch(ids=[str(i) for i in range(len(text.cw))], cw=text.cw, cc=text.cc,
                  qw=text.qw, qc=text.qc, c_mask=text.cw != 0, q_mask=text.qw != 0,
                  y1=text.y1, y2=text.y2,
                  is_impossible=torch.zeros(len(text.cw), dtype=bool, device=device))

    def forward() -> Any:  # collate's distinct words (on the host) counted in the step
        listed = distinct_words(host.cw.numpy(), host.cc.numpy(), host.qw.numpy(),
                                host.qc.numpy())
        listed = {k: v.to(device, non_blocking=True) for k, v in listed.items()}
        return model(Batch(**{**batch.__dict__, **listed}))

    return Side(f"rcpipe {variant}", model, forward,
                lambda out: span_loss(out, text.y1, text.y2))


def chrischute_bidaf(peer: Path, args: argparse.Namespace, text: TextBatch,
                     vectors: np.ndarray, device: torch.device) -> Side:
    model = chrischute_modules(peer)[0].BiDAF(word_vectors=torch.from_numpy(vectors),
                                              hidden_size=args.hidden,
                                              drop_prob=args.dropout).to(device)
    text = on(text, device)

    def loss(out: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.nll_loss(out[0], text.y1) + F.nll_loss(out[1], text.y2)  # as its train.py

    return Side("chrischute/squad BiDAF", model, lambda: model(text.cw, text.qw), loss)


def bangliu_qanet(peer: Path, args: argparse.Namespace, text: TextBatch,
                  vectors: np.ndarray, device: torch.device) -> Side:
    module = bangliu_module(peer)
    chars = torch.randn(text.char_vocab, args.char_dim)  # its char table: frozen, as default
    model = module.QANet(torch.from_numpy(vectors), chars, text.cw.size(1), text.qw.size(1),
                         args.hidden, dropout=args.dropout, num_head=args.heads).to(device)
    text = on(text, device)

    def loss(out: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(out[0], text.y1) + F.cross_entropy(out[1], text.y2)

    return Side("BangLiu/QANet-PyTorch", model,
                lambda: model(text.cw, text.cc, text.qw, text.qc), loss)


PEERS = {"bidaf": chrischute_bidaf, "qanet": bangliu_qanet}

def timed(fn: Callable[[], None]) -> float:
    """Seconds of ``fn``, the GPU's queue drained before and after (METHOD: synchronise)."""
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def steps(side: Side) -> dict[str, Callable[[], None]]:
    """What a round times on a side: a training step (forward, loss, backward, Adam at lr
    1e-3, its own optimiser) and an inference forward."""
    optimizer = torch.optim.Adam([p for p in side.model.parameters() if p.requires_grad],
                                 lr=1e-3)

    def train() -> None:
        side.model.train()
        optimizer.zero_grad(set_to_none=True)
        side.loss(side.forward()).backward()
        optimizer.step()

    def inference() -> None:
        side.model.eval()
        with torch.no_grad():
            side.forward()

    return {"train": train, "inference": inference}


def measure(sides: list[Side], warmup: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per round: {"train" | "inference": {side name: [...]}}, A/B alternated."""
    runs = [steps(s) for s in sides]
    times: dict[str, Any] = {kind: {s.name: [] for s in sides} for kind in runs[0]}
    for round_ in range(warmup + repeats):
        order = range(len(sides)) if round_ % 2 == 0 else reversed(range(len(sides)))
        for i in order:
            for kind, fn in runs[i].items():
                seconds = timed(fn)
                if round_ >= warmup:
                    times[kind][sides[i].name].append(seconds)
    return times


def ratios(times: dict[str, dict[str, list[float]]], ours: str, peer: str
           ) -> dict[str, dict[str, float]]:
    """Per step kind: each side's median and minimum seconds, and rcpipe/peer of each."""
    out = {}
    for kind, by_side in times.items():
        a, b = by_side[ours], by_side[peer]
        out[kind] = {"rcpipe_median_s": statistics.median(a), "rcpipe_min_s": min(a),
                     "peer_median_s": statistics.median(b), "peer_min_s": min(b),
                     "ratio_median": statistics.median(a) / statistics.median(b),
                     "ratio_min": min(a) / min(b)}
        s = out[kind]
        print(f"| {kind} | {s['rcpipe_median_s']:.3f} / {s['rcpipe_min_s']:.3f} | "
              f"{s['peer_median_s']:.3f} / {s['peer_min_s']:.3f} | "
              f"{s['ratio_median']:.2f}x / {s['ratio_min']:.2f}x |")
    return out


def main() -> None:
    ap = parser(__doc__, sets=False)
    ap.add_argument("model", choices=sorted(PEERS))
    ap.add_argument("peer", type=Path, help="the peer's checkout (outside this repo)")
    ap.add_argument("--squad", type=Path, default=SQUAD)
    ap.add_argument("--text", type=Path, help="a saved batch instead of tokenizing --squad")
    ap.add_argument("--out", type=Path, help="the timings and ratios as JSON too")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--question", type=int, default=30)
    ap.add_argument("--words", type=int, help="the frozen table's rows (20,000; --text's)")
    ap.add_argument("--word-dim", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=100)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--heads", type=int, default=4, help="QANet: both sides")
    ap.add_argument("--char-dim", type=int, default=64, help="QANet: both sides")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="rcpipe's variant")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    peer = args.peer.resolve()
    # nothing of a peer is committed here; the GPU kit's copy lives in gpu-kit/, ignored
    if peer.is_relative_to(ROOT) and not peer.is_relative_to(ROOT / "gpu-kit"):
        ap.error(f"{peer}: a peer's checkout lives outside this repository")
    try:
        if args.text:
            text, args.words = load_text_batch(args.text, args.words)
        else:
            args.words = args.words or 20_000
            text = read_text_batch(args.squad, args.batch, args.context, args.question,
                                   args.words)
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"{args.text or args.squad}: {e}" if isinstance(e, KeyError) else str(e))
    vectors = np.random.default_rng(0).normal(size=(args.words, args.word_dim)).astype(
        np.float32)
    vectors[0] = 0.0  # padding
    sizes = {"hidden": args.hidden, "dropout": args.dropout}
    if args.model == "qanet":  # the peer's char CNN: char_dim in, hidden filters of width 5
        sizes |= {"heads": args.heads, "char_dim": args.char_dim, "char_hidden": args.hidden,
                  "char_kernel": 5, "char_dropout": 0.05}
    sets = [f"models.{args.model}.{k}={v}" for k, v in sizes.items()]
    cfg = load_config(ROOT / "params.yaml", sets + [f"models.{args.model}.{s}"
                                                    for s in args.set]).models.of(args.model)
    torch.manual_seed(0)
    sides = [rcpipe_side(args.model, cfg, text, vectors, device),
             PEERS[args.model](peer, args, text, vectors, device)]
    print(f"{args.model}: batch {len(text.cw)}, context {text.cw.size(1)}, question "
          f"{text.qw.size(1)} tokens of real text ({text.distinct} distinct words of "
          f"{text.cw.numel() + text.qw.numel()} tokens), frozen {args.words} x "
          f"{args.word_dim} word vectors, hidden {args.hidden}, dropout {args.dropout}, "
          f"Adam, {device_name(device)}, {args.warmup} warm-up and "
          f"{args.repeats} timed rounds, A/B alternated")
    print(f"rcpipe {args.model}: " + ", ".join(
        f"{k} {getattr(cfg, k)}" for k in ("hidden", "layers", "char_dim", "char_hidden",
                                           "char_kernel", "dropout")))
    for side in sides:
        n = sum(p.numel() for p in side.model.parameters() if p.requires_grad)
        print(f"{side.name}: {n:,} trainable parameters")
    ours, theirs = (s.name for s in sides)
    print(f"| step | {ours}: median / min (s) | {theirs}: median / min (s) | "
          "ratio, median / min |\n|---|---|---|---|")
    steps = ratios(measure(sides, args.warmup, args.repeats), ours, theirs)
    if args.out:
        write(args.out, {"model": args.model, "peer": theirs, "device": device_name(device),
                         "batch": len(text.cw), "context": text.cw.size(1),
                         "question": text.qw.size(1), "hidden": args.hidden,
                         "warmup": args.warmup, "repeats": args.repeats, "steps": steps})
    print("\nRemaining differences: docs/results/peers.md, under this pair's table")


if __name__ == "__main__":
    main()
