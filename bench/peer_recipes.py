"""The peers' models and training recipes as their repositories set them, on rcpipe's batches.

bench/peer_train.py trains a peer with its recipe here; bench/peer_accuracy.py sets it beside
`rcpipe train`. Each peer's model class, EMA and loss are its own (imported from its checkout
outside this repository, as bench/peers.py does); what is written here is only the loop
their train scripts run, read from them:

- chrischute/squad (train.py and args.py at 85623ad): ``BiDAF(word_vectors, hidden_size,
  drop_prob=0.2)``; Adadelta, lr 0.5, no weight decay, a constant schedule; batches of 64
  questions, padded to their longest; the gradient norm clipped at 5; its ``util.EMA`` at
  0.999 (decay warmed up as (1 + n) / (10 + n)), evaluation on the EMA weights; loss the NLL
  of its log-softmax outputs.
- BangLiu/QANet-PyTorch (QANet_main.py and trainer/QANet_trainer.py at 0ce11ca): ``QANet(
  word_mat, char_mat, 400, 50, d_model, num_head=...)`` with its char table trained
  (``--pretrained_char`` off), dropout 0.1 (words 0.1, chars 0.05, as its Embedding fixes);
  Adam, lr 1e-3, betas (0.8, 0.999), eps 1e-8, weight decay 3e-7, the lr warmed up as
  log(step + 1) / log(1000) over 1,000 steps; batches of 32 padded to 400 context and 50
  question tokens of 16 chars (its loader's fixed shapes); the gradient norm clipped at 5;
  no EMA (``--use_ema`` off); loss cross-entropy of its masked logits.

What both sides share, so that the model and its recipe are what differ: rcpipe's prepared
rows (the same tokens, windows and answers), one word-vector matrix (prepare's word_emb.npy,
trained on both sides: the peers' frozen tables are unfrozen, as rcpipe fine-tunes it), and
rcpipe's reader for answering (inference/reading.py: whole contexts, the same windows, the
best span of at most eval.max_answer_len tokens) and its official scorer.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rcpipe.models.batch import Batch
from rcpipe.models.layers import SpanLogits


@dataclass
class Recipe:
    name: str
    model: nn.Module  # the peer's own class
    batch_size: int
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    clip: float  # the gradient norm's bound
    ema: Any | None  # the peer's EMA object: ema(model, updates), .assign(model), .resume(model)
    pad_to: tuple[int, int, int] | None  # a training batch's (context, question, chars)
    read: Callable[[Batch], SpanLogits]  # the peer's forward as rcpipe's reader reads a model
    settings: dict[str, Any]  # the recipe, said in the results


def imported(peer: Path, module: str) -> Any:
    """A module of the peer's checkout (its folder first on the path)."""
    if str(peer) not in sys.path:
        sys.path.insert(0, str(peer))
    return importlib.import_module(module)


class Reader(nn.Module):
    """A peer's model as rcpipe's reader calls one: a Batch in, SpanLogits out."""

    def __init__(self, model: nn.Module, read: Callable[[Batch], SpanLogits]) -> None:
        super().__init__()
        self.model = model
        self._read = read

    def forward(self, batch: Batch) -> SpanLogits:
        return self._read(batch)


def padded(batch: Batch, context: int, question: int, chars: int) -> Batch:
    """``batch`` with its token tensors padded with 0 to fixed lengths (a peer's loader's)."""
    def pad(t: torch.Tensor, *sizes: int) -> torch.Tensor:
        widths = [w for have, want in zip(reversed(t.shape), reversed(sizes), strict=False)
                  for w in (0, max(want - have, 0))]
        return F.pad(t, widths)

    return Batch(ids=batch.ids, cw=pad(batch.cw, context), cc=pad(batch.cc, context, chars),
                 qw=pad(batch.qw, question), qc=pad(batch.qc, question, chars),
                 c_mask=pad(batch.c_mask, context), q_mask=pad(batch.q_mask, question),
                 y1=batch.y1, y2=batch.y2, is_impossible=batch.is_impossible)


def chrischute_modules(peer: Path) -> tuple[Any, Any]:
    """The peer's models.py and util.py, its layers.py packing each LSTM's input with the
    lengths on the host, where torch since 1.7 wants them (the peer, written for 1.4, hands
    over the mask's sums from the device: on CUDA an error, not a slower step)."""
    sys.modules.setdefault("ujson", json)  # util.py imports it at the top; nothing here uses it
    layers = imported(peer, "layers")

    def pack_padded_sequence(x: torch.Tensor, lengths: torch.Tensor, *args: Any,
                             **kwargs: Any) -> Any:
        return nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), *args, **kwargs)

    layers.pack_padded_sequence = pack_padded_sequence
    return imported(peer, "models"), imported(peer, "util")


def chrischute_bidaf(peer: Path, vectors: np.ndarray, chars: int, hidden: int,
                     heads: int, device: torch.device) -> Recipe:
    models, util = chrischute_modules(peer)
    model = models.BiDAF(word_vectors=torch.from_numpy(vectors), hidden_size=hidden,
                         drop_prob=0.2).to(device)  # before its EMA copies the weights
    model.emb.embed.weight.requires_grad_(True)  # trained, as rcpipe's side trains the matrix
    optimizer = torch.optim.Adadelta(model.parameters(), 0.5, weight_decay=0)

    def read(batch: Batch) -> SpanLogits:
        log_p1, log_p2 = model(batch.cw, batch.qw)  # (B, Lc) each, masked log-softmax
        return SpanLogits(log_p1, log_p2)

    return Recipe("chrischute/squad BiDAF", model, 64, optimizer, None, 5.0,
                  util.EMA(model, 0.999), None, read,
                  {"hidden_size": hidden, "drop_prob": 0.2, "optimizer": "Adadelta",
                   "lr": 0.5, "weight_decay": 0, "batch": 64, "clip": 5.0, "ema": 0.999,
                   "padding": "to the batch's longest"})


def bangliu_module(peer: Path) -> Any:
    """The peer's model/QANet.py, its PosEncoder wrapped to run on any device."""
    module = imported(peer, "model.QANet")

    def pos_encoder(x: torch.Tensor, min_timescale: float = 1.0,
                    max_timescale: float = 1.0e4) -> torch.Tensor:
        # the peer's moves its signal to x.get_device(), -1 on the CPU (an error); the same
        # signal (its own get_timing_signal) moved to x.device instead
        x = x.transpose(1, 2)  # (B, L, d)
        signal = module.get_timing_signal(x.size(1), x.size(2), min_timescale, max_timescale)
        return (x + signal.to(x.device)).transpose(1, 2)  # (B, d, L)

    module.PosEncoder = pos_encoder
    return module


def bangliu_qanet(peer: Path, vectors: np.ndarray, chars: int, hidden: int,
                  heads: int, device: torch.device) -> Recipe:
    module = bangliu_module(peer)  # no EMA: --use_ema is off in its recipe
    char_dim = 8  # rcpipe's CPU preset's char embedding width, given to both sides
    char_mat = torch.randn(chars, char_dim)
    model = module.QANet(torch.from_numpy(vectors), char_mat, 400, 50, hidden,
                         train_cemb=True, pad=0, num_head=heads).to(device)
    model.word_emb.weight.requires_grad_(True)  # trained, as rcpipe's side trains the matrix
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                                 betas=(0.8, 0.999), eps=1e-8, weight_decay=3e-7)
    warm = 1.0 / math.log(1000)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda n: warm * math.log(n + 1) if n < 1000 else 1)

    def read(batch: Batch) -> SpanLogits:
        cc, qc = (F.pad(t, (0, max(16 - t.size(-1), 0))) for t in (batch.cc, batch.qc))
        p1, p2 = model(batch.cw, cc, batch.qw, qc)  # (B, Lc) each, masked logits
        return SpanLogits(p1, p2)

    return Recipe("BangLiu/QANet-PyTorch", model, 32, optimizer, scheduler, 5.0, None,
                  (400, 50, 16), read,
                  {"d_model": hidden, "num_head": heads, "char_dim": char_dim,
                   "dropout": 0.1, "char_dropout": 0.05, "optimizer": "Adam", "lr": 1e-3,
                   "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7,
                   "warmup": "log over 1,000 steps", "batch": 32, "clip": 5.0, "ema": None,
                   "padding": "400 context, 50 question tokens, 16 chars"})


RECIPES = {"bidaf": chrischute_bidaf, "qanet": bangliu_qanet}
