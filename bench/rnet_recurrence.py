"""Benchmark: R-Net's recurrences as they are against the ones they replaced, side by side.

"old" is the reference copy kept in bench/rnet_reference.py (the gated attention
directions one after the other, CharGRU packed; tests/models/test_rnet_recurrence.py holds
rcpipe's to it); "new" is rcpipe's (both directions in one batched loop, CharGRU
static-shaped). Reports, on the CPU:

- the aten ops dispatched (below autograd: kernels and views) by one forward+backward of
  BiGatedAttentionRNN at the R-Net paper's size (d = 75, Lc 200, Lq 20, batch 32), and the
  data-dependent ones (host syncs, data-dependent shapes) of one R-Net step;
- the wall time of one R-Net forward+backward at params.demo.yaml's rnet sizes and at the
  paper's, and of CharGRU alone at the demo's, median of ``--repeats`` runs after a warm-up.

Run from the repository root (it imports bench/rnet_reference.py):

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.rnet_recurrence [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.rnet_reference import OldBiGatedAttentionRNN, OpLog, with_reference_recurrences
from rcpipe.config import ModelConfig
from rcpipe.models import ModelInputs, build_model
from rcpipe.models.batch import Batch
from rcpipe.models.gated_rnn import BiGatedAttentionRNN
from rcpipe.models.layers import span_loss

DEMO = ModelConfig(hidden=48, char_dim=8, char_hidden=32, layers=1, dropout=0.0)
PAPER = ModelConfig(hidden=75, char_dim=8, char_hidden=75, layers=3, dropout=0.2)
CHAR_WIDTH = 16  # data.limits.char: every batch's chars are this wide


def make_batch(b: int, lc: int, lq: int, chars: int = 60, words: int = 2000,
               seed: int = 0) -> Batch:
    """Rows of lc/2 to lc tokens (a quarter of the words padding, as in a bucketed batch),
    words of 1 to 10 chars (English averages ~5) in CHAR_WIDTH-wide char rows."""
    g = torch.Generator().manual_seed(seed)
    c_len = torch.randint(lc // 2, lc + 1, (b,), generator=g)
    c_len[0] = lc
    q_len = torch.randint(lq // 2, lq + 1, (b,), generator=g)
    q_len[0] = lq
    c_mask = torch.arange(lc) < c_len.unsqueeze(1)  # (B, Lc)
    q_mask = torch.arange(lq) < q_len.unsqueeze(1)  # (B, Lq)

    def chars_of(mask: torch.Tensor) -> torch.Tensor:
        n = torch.randint(1, 11, mask.shape, generator=g) * mask  # (B, L) chars per word
        ids = torch.randint(2, chars, (*mask.shape, CHAR_WIDTH), generator=g)
        return ids * (torch.arange(CHAR_WIDTH) < n.unsqueeze(-1))  # (B, L, W)

    y1 = (torch.rand(b, generator=g) * (c_len - 3)).long()
    return Batch(ids=[f"q{i}" for i in range(b)],
                 cw=torch.randint(2, words, (b, lc), generator=g) * c_mask, cc=chars_of(c_mask),
                 qw=torch.randint(2, words, (b, lq), generator=g) * q_mask, qc=chars_of(q_mask),
                 c_mask=c_mask, q_mask=q_mask, y1=y1, y2=y1 + 2,
                 is_impossible=torch.zeros(b, dtype=torch.bool))


def timed(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[float, float]]:
    """Median and fastest seconds of each run; the runs alternate, so that a machine shared
    with other work slows them alike."""
    for run in runs.values():
        run()  # warm-up: allocator, the first torch.compiler.disable call
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def step(model: nn.Module, batch: Batch) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        span_loss(model(batch), batch.y1, batch.y2).backward()
    return run


def char_step(char_emb: nn.Module, chars: torch.Tensor) -> Callable[[], None]:
    return lambda: char_emb(chars).sum().backward()


def r_net(cfg: ModelConfig, word_dim: int, vectors: bool) -> tuple[nn.Module, nn.Module]:
    """New and old R-Nets with the same weights; the paper's has frozen word vectors."""
    torch.manual_seed(0)
    emb = np.random.default_rng(0).standard_normal((20000, word_dim)).astype(np.float32)
    inputs = ModelInputs(word_vocab=20000 if vectors else 2000, char_vocab=60,
                         word_dim=word_dim, vectors=emb if vectors else None, no_answer=False)
    new = build_model("rnet", cfg, inputs).train()
    return new, with_reference_recurrences(new)


def count_ops(fn: Callable[[], Any]) -> tuple[int, int, list[str]]:
    """All aten ops, those that are not views (a kernel each, or a copy), data-dependent."""
    with OpLog() as log:
        fn()
    return len(log.ops), len(log.ops) - log.views, sorted(set(log.data_dependent))


def gated_ops(repeats: int) -> dict[str, Any]:
    d, b, lc, lq = 75, 32, 200, 20
    torch.manual_seed(0)
    new = BiGatedAttentionRNN(2 * d, d, d, 0.2).train()
    old = OldBiGatedAttentionRNN(2 * d, d, d, 0.2).train()
    old.load_state_dict(new.state_dict())
    u_p = torch.randn(b, lc, 2 * d, requires_grad=True)
    u_q = torch.randn(b, lq, 2 * d, requires_grad=True)
    c_mask = torch.arange(lc) < torch.randint(lc // 2, lc + 1, (b, 1))
    q_mask = torch.arange(lq) < torch.randint(lq // 2, lq + 1, (b, 1))
    runs = {name: (lambda m=m: m(u_p, c_mask, u_q, q_mask).sum().backward())
            for name, m in (("old", old), ("new", new))}
    seconds = timed(runs, repeats)
    out: dict[str, Any] = {}
    for name, run in runs.items():
        total, kernels, _ = count_ops(run)
        out[name] = {"aten_ops": total, "non_view_ops": kernels, "seconds": seconds[name]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} thread(s), "
          f"median of {args.repeats}")

    ops = gated_ops(args.repeats)
    print("\nBiGatedAttentionRNN forward+backward, d 75, Lc 200, Lq 20, batch 32")
    print(f"{'':5} {'aten ops':>9} {'non-view':>9} {'median ms':>10} {'min ms':>8}")
    for name, row in ops.items():
        median, fastest = row["seconds"]
        print(f"{name:5} {row['aten_ops']:9d} {row['non_view_ops']:9d} {1000 * median:10.1f} "
              f"{1000 * fastest:8.1f}")

    print("\nR-Net train step (forward+backward), batch 32: median (min) ms")
    print(f"{'':28} {'old':>15} {'new':>15} {'new/old':>8}  data-dependent ops old/new")
    sizes = (("demo (d 48, Lc 70, Lq 12)", DEMO, 64, False, 70, 12),
             ("paper (d 75, Lc 200, Lq 20)", PAPER, 300, True, 200, 20))
    for label, cfg, word_dim, vectors, lc, lq in sizes:
        new, old = r_net(cfg, word_dim, vectors)
        batch = make_batch(32, lc, lq)
        t = timed({"old": step(old, batch), "new": step(new, batch)}, args.repeats)
        dd_old, dd_new = (len(count_ops(step(m, batch))[2]) for m in (old, new))
        print(f"{label:28} {row_of(t['old'])} {row_of(t['new'])} "
              f"{t['new'][0] / t['old'][0]:8.2f}  {dd_old} / {dd_new}")
        if cfg is DEMO:
            chars = torch.cat([batch.cc, batch.qc], dim=1)  # (B, Lc + Lq, W): both calls'
            t = timed({"old": char_step(old.char_emb, chars),
                       "new": char_step(new.char_emb, chars)}, args.repeats)
            print(f"{'  its CharGRU fwd+bwd':28} {row_of(t['old'])} {row_of(t['new'])} "
                  f"{t['new'][0] / t['old'][0]:8.2f}")


def row_of(seconds: tuple[float, float]) -> str:
    return f"{1000 * seconds[0]:7.1f} ({1000 * seconds[1]:5.1f})"

if __name__ == "__main__":
    main()
