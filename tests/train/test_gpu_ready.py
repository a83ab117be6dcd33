"""A training step a GPU can run at full speed, shown on the CPU by counting (train/audit.py):
few input shapes, a forward without graph breaks, no host synchronisation, and every
variant trains under train.compile."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from rcpipe.config import VARIANTS, Config, load_config
from rcpipe.data.dataset import SquadDataset
from rcpipe.data.stream import TrainStream
from rcpipe.models import build_model
from rcpipe.models.batch import Batch
from rcpipe.models.layers import span_loss
from rcpipe.train.audit import HostSyncs, epoch_shapes, graph_breaks
from rcpipe.train.local import train_local
from rcpipe.train.loop import EMA, TrainStep, make_optimizer
from rcpipe.trained.model_file import prepared_inputs
from tests.conftest import TINY_MODEL, Prepared

ROOT = Path(__file__).resolve().parents[2]
# small, but every part of each paper's model (QANet: two blocks, stochastic depth, EMA)
SMALL = {"hidden": 16, "char_dim": 8, "char_hidden": 16, "heads": 2, "model_blocks": 2,
         "emb_convs": 2, "model_convs": 2, "layers": 2, "highway_layers": 2}


def paper_config(prepared: Prepared, *sets: str, sizes: dict | None = None) -> Config:
    """params.yaml as shipped (its buckets, each paper's optimiser and EMA), at small sizes
    on the prepared synthetic split."""
    data = prepared.data
    return load_config(ROOT / "params.yaml", [
        f"data.train_file={data.train}", f"data.dev_file={data.dev}",
        f"data.out_dir={prepared.out_dir}", "data.word_vectors=null", "data.word_dim=16",
        "train.device=cpu", "train.num_workers=1", "train.batch_size=8", *sets,
        *(f"models.{v}.{k}={x}" for v in VARIANTS for k, x in (sizes or SMALL).items())])


def epoch(prepared: Prepared, cfg: Config, batch_size: int
          ) -> tuple[SquadDataset, list[list[int]]]:
    """The first epoch's batches as training cuts them (data/stream.py: one buffer)."""
    b = cfg.train.buckets
    assert b is not None
    plan = TrainStream.of(prepared.out_dir, batch_size, buckets=(b.context, b.question)
                          ).epoch(0)
    assert len(plan.buffers) == 1
    return plan.cut(0)


def test_an_epoch_has_at_most_eight_input_shapes(prepared: Prepared) -> None:
    # edges for the synthetic passages' spread (params.yaml's suit SQuAD's)
    cfg = paper_config(prepared, "train.buckets.context=[48, 96, 144, 400]",
                       "train.buckets.question=[12, 50]")
    data, batches = epoch(prepared, cfg, 4)
    shapes = epoch_shapes(data, batches)
    assert len(shapes) <= 8
    assert all(b == 4 and lc in cfg.train.buckets.context and lq in cfg.train.buckets.question
               for b, lc, lq in shapes)
    # only the last, partial batch is left out (the rows are shuffled anew each epoch)
    assert len(data) - 4 < sum(len(b) for b in batches) <= len(data)
    data.buckets = None  # each batch padded to its own longest: a shape for nearly each
    assert len(epoch_shapes(data, batches)) > len(shapes)


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_to_another_bucket_changes_no_probability(prepared: Prepared,
                                                          variant: str) -> None:
    cfg = paper_config(prepared)
    data = SquadDataset.from_parquet(prepared.out_dir / "train")
    rows = list(range(6))
    lc, lq = data.padded_shape(rows)  # the batch's own longest
    tight, loose = ((lc,), (lq,)), ((lc + 37, lc + 90), (lq + 11,))
    torch.manual_seed(0)
    model = build_model(variant, cfg.models.of(variant),
                        prepared_inputs(prepared.out_dir, 16)).eval()
    probs = []
    for buckets in (tight, loose):
        data.buckets = buckets
        batch = data.collate(rows)
        with torch.no_grad():
            p1, p2 = (lp.exp() for lp in model(batch).log_probs())  # (B, 1 + L) each
        probs.append((p1, p2, batch.cw.size(1)))
    (a1, a2, n), (b1, b2, m) = probs
    assert m == lc + 37 and n == lc
    torch.testing.assert_close(b1[:, : 1 + n], a1, atol=1e-6, rtol=0)
    torch.testing.assert_close(b2[:, : 1 + n], a2, atol=1e-6, rtol=0)
    assert (b1[:, 1 + n :] == 0).all() and (b2[:, 1 + n :] == 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_training_step_never_waits_for_the_host(prepared: Prepared, variant: str) -> None:
    """Three steps of each paper's step (its optimiser, warm-up, clipping and EMA) on
    bucketed batches: no op reads a value back to the host or makes a data-dependent
    shape (the loss is read every PROGRESS_EVERY steps, outside the step)."""
    cfg = paper_config(prepared, f"models.{variant}.optim.ema_decay=0.999")
    data, cut = epoch(prepared, cfg, 8)
    mcfg = cfg.models.of(variant)
    torch.manual_seed(0)
    model = build_model(variant, mcfg, prepared_inputs(prepared.out_dir, 16))
    optimizer, scheduler = make_optimizer(model, mcfg.optim)
    step = TrainStep(model, optimizer, scheduler, mcfg.optim.grad_clip, EMA(model, 0.999))
    batches = [data.collate(b) for b in cut[:3]]
    syncs = HostSyncs()
    with syncs:
        losses = [step(b) for b in batches]
    assert dict(syncs.ops) == {}
    with syncs:  # the counter is live: reading the loss, as the worker does every 10 steps
        assert all(bool(torch.isfinite(loss)) for loss in losses)
    assert syncs.ops == {"aten._local_scalar_dense.default": 3}


def test_a_step_keeps_its_loss_when_a_cuda_graph_replays_into_the_same_memory(
        prepared: Prepared, monkeypatch: pytest.MonkeyPatch) -> None:
    """train.compile=reduce-overhead replays each step as a CUDA graph, whose outputs live
    in the graph's memory and are written over by the next replay; the Worker keeps every
    step's loss until its next progress line or checkpoint. Here the compiled loss is
    played by one that returns each step's loss in one buffer, as a replay does (the CPU
    has no CUDA graphs): the losses read afterwards are still each step's own, each step
    tells the graphs that a new step began, and the EMA's tensors are marked static."""
    cfg = paper_config(prepared, sizes=TINY_MODEL)
    data, cut = epoch(prepared, cfg, 8)
    mcfg = cfg.models.of("bidaf")
    torch.manual_seed(0)
    model = build_model("bidaf", mcfg, prepared_inputs(prepared.out_dir, 16))
    optimizer, scheduler = make_optimizer(model, mcfg.optim, lr_tensor=True)
    ema = EMA(model, 0.999)
    step = TrainStep(model, optimizer, scheduler, mcfg.optim.grad_clip, ema,
                     compile="reduce-overhead", backend="aot_eager")
    graph_memory = torch.zeros(())
    seen: list[float] = []

    class Replay(torch.autograd.Function):
        """The loss, returned in the memory every step shares; its gradient passes."""
        @staticmethod
        def forward(ctx: Any, loss: torch.Tensor) -> torch.Tensor:
            return graph_memory.copy_(loss).view(())

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad

    def replayed(batch: Batch) -> torch.Tensor:
        loss = step.loss(batch)
        seen.append(float(loss))
        return Replay.apply(loss)

    begun = []
    monkeypatch.setattr(step, "_loss", replayed)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: begun.append(1))
    batches = [data.collate(b) for b in cut[:3]]
    losses = [step(b) for b in batches]
    assert [float(x) for x in losses] == seen and len(set(seen)) == 3
    assert len(begun) == 3
    # the update's graph changes the EMA in place: its tensors keep their addresses, so
    # they are marked static, or cudagraph trees would leave that graph uncaptured
    assert all(getattr(t, "_dynamo_static_input_type", None)
               for t in (*ema.shadow.values(), ema.count))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_tensor_of_a_step_is_made_on_the_models_device(
        prepared: Prepared, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor made on the host inside the model (a torch.arange without its device)
    meets the GPU's and raises, on a GPU only. The meta device raises the same way on the
    CPU (and computes nothing), so each variant's training forward and backward and its
    inference forward run on it here (decoding's: tests/inference/test_decode.py).
    Autocast knows no meta device: turned off there."""
    autocast = torch.autocast
    monkeypatch.setattr(torch, "autocast", lambda device_type, *a, **k: (
        contextlib.nullcontext() if device_type == "meta" else autocast(device_type, *a, **k)))
    cfg = paper_config(prepared, sizes=TINY_MODEL)
    # contexts cut to 12 tokens: on meta every op is a Python shape function, and a
    # recurrence still runs one per time step
    data = SquadDataset.from_parquet(prepared.out_dir / "train", para_limit=12)
    meta = torch.device("meta")
    # with v2.0's no-answer head, so that it is on the device too
    inputs = dataclasses.replace(prepared_inputs(prepared.out_dir, 16), no_answer=True)
    model = build_model(variant, cfg.models.of(variant), inputs).to(meta)
    batch = data.collate([0, 1]).to(meta)
    logits = model(batch)
    span_loss(logits, batch.y1, batch.y2).backward()
    assert all(p.grad is not None and p.grad.device == meta
               for p in model.parameters() if p.requires_grad)
    with torch.no_grad():
        out = model.eval()(batch)  # decoding: tests/inference
    assert out.start.device == out.na.device == meta


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_inference_forward_never_waits_for_the_host(prepared: Prepared, variant: str) -> None:
    """What evaluation and serving run (eval mode, no gradient: the char CNN's windowed
    path, each distinct word once) reads nothing back to the host inside the forward:
    decoding the spans afterwards is the one place a batch's answers come back."""
    cfg = paper_config(prepared)
    data, cut = epoch(prepared, cfg, 8)
    torch.manual_seed(0)
    model = build_model(variant, cfg.models.of(variant),
                        prepared_inputs(prepared.out_dir, 16)).eval()
    batches = [data.collate(b) for b in cut[:3]]
    syncs = HostSyncs()
    with torch.no_grad(), syncs:
        for b in batches:
            model(b)
    assert dict(syncs.ops) == {}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_training_forward_is_one_graph_but_r_nets_gated_loop(prepared: Prepared,
                                                                 variant: str) -> None:
    """Every RNN is one opaque op (models/rnn.py), so QANet, both BiDAFs and rnet_mult are
    one graph; R-Net's gated attention loop (gated_rnn.py, disabled) is the one break."""
    cfg = paper_config(prepared, sizes=TINY_MODEL)
    data, cut = epoch(prepared, cfg, 8)
    model = build_model(variant, cfg.models.of(variant), prepared_inputs(prepared.out_dir, 16))
    out = graph_breaks(model, data.collate(cut[0]))
    if variant == "rnet":
        # dynamo names the break once per frame it sits in (RNet, BiGatedAttentionRNN, ...)
        assert out["reasons"] and all("gated_rnn.py" in r for r in out["reasons"]), out
    else:
        assert (out["graphs"], out["graph_breaks"]) == (1, 0), out["reasons"]


@pytest.mark.trains
@pytest.mark.slow
def test_every_variant_trains_three_steps_compiled(prepared: Prepared, tmp_path: Path) -> None:
    """train.compile=default through the whole run (train_local: the Worker every rank
    runs). The backend is aot_eager: the same graphs, forward and backward, captured by
    dynamo and AOTAutograd, without inductor's code generation, which takes 20-105 s a
    variant on 2 cores from a cold cache (bench/train_speed.py --step-modes runs it)."""
    cfg = paper_config(prepared, "train.compile=default", "train.compile_backend=aot_eager",
                       "train.max_steps=3", "train.epochs=1", sizes=TINY_MODEL)
    for variant in VARIANTS:
        summary = train_local(cfg, variant, tmp_path / variant)
        assert summary["steps"] == 3, variant
        assert all(h["loss"] == h["loss"] for h in summary["history"])  # not NaN
