"""Benchmark: training speed of every variant at a params file's sizes, side by side.

The models, optimisers and batch are the params file's (default params.yaml: the papers'
sizes) on a prepared split; each step is the Worker's own (TrainStep: TF32, the EMA, fused
Adam, the batches training makes, collated ahead). Each (device, variant, mode) gets
warm-up steps, then ``--repeats`` timed runs of ``--steps`` steps, the device synchronised
at both ends of each; the median run gives examples/s and ms per step. Devices: the CPU,
and CUDA where present. ``--modes``: fp32 (TF32 matmuls on CUDA, train.tf32) and bf16
(autocast, CUDA only), eager over the whole epoch. On CUDA also the peak memory and the
share of a step the GPU is busy. It needs no Ray or spaCy, so it runs on a bare GPU box.

``--step-modes off default reduce-overhead`` times the step with train.compile each mode on
the epoch's ``--step-shapes`` most frequent padded shapes of train.buckets' batches, compiled
by inductor on CUDA and by aot_eager on the CPU (a check, not a speed). The GPU kit's
compiled step runs one such mode a process, with ``--modes`` given none.

    .venv/bin/python bench/train_speed.py --prepared data/prepared [--params params.yaml]
    .venv/bin/python bench/train_speed.py --audit --prepared data/prepared [--devices cpu]

``--audit`` counts, per variant, what keeps a step from GPU speed (rcpipe/train/audit.py):
graphs and graph breaks under torch.compile, host syncs per step, distinct input shapes in an
epoch (train.buckets) and kernels per step (CPU operators without a GPU). Writes
bench/out/train_speed.json (train_audit.json).
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from collections.abc import Callable
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import torch
from common import OUT, ROOT, device_name, parser, sync, write

from rcpipe.config import VARIANTS, Config, load_config
from rcpipe.data.stream import TrainStream
from rcpipe.models import build_model
from rcpipe.models.layers import count_parameters
from rcpipe.train.loop import EMA, TrainStep, make_optimizer, train_step
from rcpipe.train.worker import mixed_precision
from rcpipe.trained.model_file import prepared_inputs

MODES = ("fp32", "bf16")  # the Worker's eager step over the whole epoch; bf16: CUDA only
STEP_MODES = ("off", "default", "reduce-overhead")  # the Worker's step with train.compile
STEP_BACKEND = {"cuda": "inductor", "cpu": "aot_eager"}


def stream(cfg: Config, prepared: Path, batch_size: int) -> tuple[Any, list[list[int]]]:
    """(the split's first buffer, its epoch's batches): the batches training makes
    (data/stream.py; a buffer holds the whole split here), train.buckets' shapes."""
    b = cfg.train.buckets
    return TrainStream.of(prepared, batch_size, buckets=(b.context, b.question) if b
                          else None).epoch(0).cut(0)


def built(variant: str, cfg: Config, prepared: Path, device: torch.device,
          lr_tensor: bool = False) -> tuple[Any, ...]:
    """(model, optimizer, scheduler, EMA or None) as the Worker builds them, seed 0."""
    mcfg = cfg.models.of(variant)
    torch.manual_seed(0)
    model = build_model(variant, mcfg, prepared_inputs(prepared, cfg.data.word_dim)).to(device)
    optimizer, scheduler = make_optimizer(model, mcfg.optim, lr_tensor=lr_tensor)
    return model, optimizer, scheduler, (EMA(model, mcfg.optim.ema_decay)
                                         if mcfg.optim.ema_decay else None)


def measure(variant: str, cfg: Config, prepared: Path, device: torch.device, mode: str,
            args: argparse.Namespace) -> dict[str, Any]:
    """One variant's step as the Worker takes it (TrainStep over batches collated ahead).
    Eager (fp32, bf16): the whole epoch's batches, --warmup steps first. Compiled (a step
    mode): the epoch's --step-shapes most frequent padded shapes, each compiled, and
    captured, in the warm-up (every compile is tens of seconds on a GPU). Then timed runs."""
    from torch._dynamo.utils import counters

    from rcpipe.data.dataset import ahead
    from rcpipe.train.audit import epoch_shapes

    torch._dynamo.reset()
    skipped = counters["inductor"]["cudagraph_skips"]  # graphs reduce-overhead left uncaptured
    compile = mode if mode in STEP_MODES else "off"
    data, epoch = stream(cfg, prepared, args.batch)
    model, optimizer, scheduler, ema = built(variant, cfg, prepared, device,
                                             lr_tensor=compile != "off")
    step = TrainStep(model, optimizer, scheduler, cfg.models.of(variant).optim.grad_clip, ema,
                     bf16=mode == "bf16", compile=compile, backend=STEP_BACKEND[device.type])
    shapes = epoch_shapes(data, epoch)
    kept = {shape for shape, _ in shapes.most_common(args.step_shapes if mode in STEP_MODES
                                                     else None)}
    epoch = [i for i in epoch if (len(i), *data.padded_shape(i)) in kept]
    first = {}  # a batch of each kept shape, three times: compile, warm, capture
    for indices in epoch:
        first.setdefault((len(indices), *data.padded_shape(indices)), indices)
    feed = cycle(epoch)
    losses: list[Any] = []  # every step's, kept as the Worker keeps them

    def run(batches: Any) -> int:
        seen = 0
        pinned = device.type == "cuda"  # as the Worker: page-locked, so the copy overlaps
        for batch in ahead(data.collate(i).pin() if pinned else data.collate(i)
                           for i in batches):
            # one call on both devices, so the CPU dry run goes through the box's line
            # (it called Batch.to with an argument Batch.to does not take, on CUDA only:
            # the 2026-11-27 draw lost its compiled figures to it)
            losses.append(step(batch.to(device)))
            seen += len(batch.ids)
        sync(device)
        return seen

    warm = [i for i in first.values() for _ in range(3)] if compile != "off" else \
        list(islice(feed, args.warmup))
    with mixed_precision(device, cfg.train.tf32):
        r = timed(lambda n: run(islice(feed, n)), lambda: run(warm), device, args.steps,
                  args.repeats)
    # read once every step ran, outside the timed runs, as the Worker reads them after
    # later steps: a loss left in a CUDA graph's memory is written over by then (torch raises)
    if not torch.isfinite(torch.stack(losses)).all():
        raise FloatingPointError(f"{variant} {mode}: a step's loss is not finite")
    return r | {"params": count_parameters(model, exclude_embeddings=True),
                "shapes": len(kept), "epoch_shapes": len(shapes),
                "epoch_share": sum(shapes[k] for k in kept) / sum(shapes.values()),
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skipped}


def timed(run: Callable[[int], int], warm: Callable[[], Any], device: torch.device,
          steps: int, repeats: int) -> dict[str, Any]:
    """``warm()``, then ``repeats`` runs of ``steps`` steps (``run(n)``: the examples it fed,
    the device synchronised): the median run's examples/s and ms a step; on CUDA the peak
    memory after the warm-up and the GPU's busy share."""
    t0 = time.perf_counter()
    warm()
    warmup_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rates, step_ms = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        seen = run(steps)
        wall = time.perf_counter() - t0
        rates.append(seen / wall)
        step_ms.append(wall / steps * 1000)
    r = {"examples_per_s": statistics.median(rates), "step_ms": statistics.median(step_ms),
         "runs_examples_per_s": rates, "warmup_s": warmup_s}
    if device.type == "cuda":
        r["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        r["gpu_busy"] = gpu_busy(run, device, min(steps, 4), r["step_ms"] / 1000)
    return r


def gpu_busy(run: Any, device: torch.device, steps: int, step_s: float) -> float:
    """The GPU's busy share of a step: kernel time per step, from ``steps`` steps under
    torch.profiler, over ``step_s``, the unprofiled step's wall time. Only the CUDA activity
    is recorded: recording every CPU op too slowed the host, and with it the profiled steps
    (the share came out low), and took tens of seconds to add up on the box (2026-11-27)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(steps)
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages()
                    if e.device_type == torch.autograd.DeviceType.CUDA)
    return kernel_us / 1e6 / steps / step_s


def compare(args: argparse.Namespace, prepared: Path) -> dict[str, Any]:
    cfg = load_config(args.params, args.sets)
    data, _ = stream(cfg, prepared, args.batch)
    devices = [torch.device(d) for d in args.devices if d == "cpu" or torch.cuda.is_available()]
    out: dict[str, Any] = {"params": str(args.params), "sets": args.sets, "batch": args.batch,
                           "steps": args.steps, "repeats": args.repeats,
                           "mean_context_tokens": float(data.context_lengths().mean()),
                           "devices": {}, "skipped": {}}
    for device in devices:
        modes = [m for m in args.modes if not (m == "bf16" and device.type == "cpu")]
        by_variant: dict[str, dict[str, Any]] = {}
        for v in args.variants:
            for mode in [*modes, *args.step_modes]:
                try:
                    r = measure(v, cfg, prepared, device, mode, args)
                except Exception as e:  # noqa: BLE001 - one mode failing leaves the others
                    traceback.print_exc()
                    out["skipped"][f"{v} {mode}"] = f"{type(e).__name__}: {str(e)[:300]}"
                    continue
                by_variant.setdefault(v, {})[mode] = r
                extra = (f" {r['peak_mib']:8.0f} MiB {100 * r['gpu_busy']:5.1f}% busy"
                         if "peak_mib" in r else "")
                print(f"{device.type:<5} {v:<15} {mode:<8} {r['examples_per_s']:9.1f} ex/s "
                      f"{r['step_ms']:9.1f} ms/step{extra}", flush=True)
        out["devices"][device.type] = {"name": device_name(device), "results": by_variant} | (
            {"step_backend": STEP_BACKEND[device.type]} if args.step_modes else {})
    return out


def table(out: dict[str, Any]) -> None:
    for kind, d in out["devices"].items():
        res = d["results"]
        modes = sorted({m for r in res.values() for m in r}, key=(*MODES, *STEP_MODES).index)
        print(f"\n{d['name']} ({kind}): examples/s, batch {out['batch']}, "
              f"mean context {out['mean_context_tokens']:.0f} tokens")
        print(f"{'variant':<15}" + "".join(f"{m:>12}" for m in modes) + f"{'params':>11}")
        for v, r in res.items():
            first = next(iter(r.values()))
            print(f"{v:<15}" + "".join(f"{r[m]['examples_per_s']:>12.1f}" if m in r else
                                       f"{'-':>12}" for m in modes) + f"{first['params']:>11,}")
        for a, b in (("qanet", "rnet"), ("qanet", "rnet_mult"), ("rnet_mult", "rnet")):
            if a in res and b in res:
                best = {v: max(x["examples_per_s"] for x in res[v].values()) for v in (a, b)}
                print(f"  {a} / {b} (each at its fastest mode): {best[a] / best[b]:.2f}x")


def audit_variant(variant: str, cfg: Config, prepared: Path, device: torch.device,
                  batch_size: int) -> dict[str, Any]:
    from rcpipe.train import audit

    model, optimizer, scheduler, ema = built(variant, cfg, prepared, device)
    data, epoch = stream(cfg, prepared, batch_size)
    # the counts of a step do not depend on how many rows it has: 8 rows of the epoch's
    # first batch, at that batch's padded shape, keep the audit minutes short on a CPU
    batch = data.collate(epoch[0][:8]).to(device)
    shapes = audit.epoch_shapes(data, epoch)
    grad_clip = cfg.models.of(variant).optim.grad_clip

    def step() -> None:
        train_step(model, batch, optimizer, scheduler, grad_clip, ema)

    with mixed_precision(device, cfg.train.tf32):
        step()  # warm-up: lazy state (optimiser moments, the EMA's tensors) made once
        syncs = audit.HostSyncs()
        with syncs:
            for _ in range(3):
                step()
        kernels = audit.kernels(step, device)
    graphs = audit.graph_breaks(model, batch)
    return {"graphs": graphs["graphs"], "graph_breaks": graphs["graph_breaks"],
            "break_reasons": graphs["reasons"], "host_syncs_per_step": syncs.total / 3,
            "host_sync_ops": dict(syncs.ops), "distinct_shapes_per_epoch": len(shapes),
            "batches_per_epoch": len(epoch), "kernels_per_step": kernels,
            "step_shape": list(batch.cc.shape[:2]) + [batch.qw.size(1)]}


def run_audit(args: argparse.Namespace, prepared: Path) -> dict[str, Any]:
    cfg = load_config(args.params, args.sets)
    data, _ = stream(cfg, prepared, args.batch)
    device = torch.device("cuda" if "cuda" in args.devices and torch.cuda.is_available()
                          else "cpu")
    out: dict[str, Any] = {"params": str(args.params), "sets": args.sets, "batch": args.batch,
                           "device": device_name(device),
                           "buckets": [list(e) for e in data.buckets or ()],
                           "results": {}}
    cols = ("graphs", "graph_breaks", "host_syncs_per_step", "distinct_shapes_per_epoch",
            "kernels_per_step")
    print(f"{'variant':<15}" + "".join(f"{c:>27}" for c in cols), flush=True)
    for v in args.variants:
        r = out["results"][v] = audit_variant(v, cfg, prepared, device, args.batch)
        print(f"{v:<15}" + "".join(f"{r[c]:>27g}" for c in cols), flush=True)
        for reason in r["break_reasons"]:
            print(f"{'':<15}break: {reason}")
    print(f"({out['device']}; shapes of batches of {args.batch}; each step counted on 8 rows)")
    return out


def main() -> None:
    ap = parser(__doc__, OUT / "train_speed.json")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--prepared", type=Path, required=True, help="rcpipe prepare's out_dir")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="steps per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs; the median is shown")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0: default")
    ap.add_argument("--devices", nargs="*", default=["cpu", "cuda"])
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    ap.add_argument("--step-modes", nargs="*", default=[], choices=STEP_MODES,
                    help="the Worker's TrainStep with train.compile MODE too")
    ap.add_argument("--step-shapes", type=int, default=1, help="the epoch's most frequent")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--audit", action="store_true", help="graphs, breaks, syncs, shapes, kernels")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    prepared = args.prepared.resolve()
    if args.audit:
        out = run_audit(args, prepared)
        args.out = args.out.with_name("train_audit.json")
    else:
        out = compare(args, prepared)
        table(out)
    write(args.out, out | {"prepared": str(prepared)})


if __name__ == "__main__":
    main()
