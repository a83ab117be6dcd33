"""bench/peer_accuracy.py and bench/peer_recipes.py (the accuracy mode beside bench/peers.py's
timing): a peer's fixed batch shapes here; end to end, rcpipe's bidaf trained through its
worker beside a stand-in peer (PEER_MODELS and PEER_UTIL, shaped as chrischute/squad's
models.BiDAF and util.EMA: the real one is not in a user's clone) is the GPU kit's call 3 in
its dry run (tests/bench/test_gpu_kit.py): both sides' runs, S and the choices, the paired
verdict, the chart, rcpipe's first S steps run again identically."""

from __future__ import annotations

import torch

from bench.peer_recipes import padded
from rcpipe.models.batch import Batch

# chrischute/squad's interface: models.BiDAF(word_vectors, hidden_size, drop_prob) with its
# word table at .emb.embed, called on (context, question) word ids, giving masked
# log-probabilities; util.EMA(model, decay) called as ema(model, updates), assign, resume
PEER_MODELS = '''
import torch
from torch import nn


class Embedding(nn.Module):
    def __init__(self, word_vectors):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(word_vectors)


class BiDAF(nn.Module):
    def __init__(self, word_vectors, hidden_size, drop_prob=0.0):
        super().__init__()
        self.emb = Embedding(word_vectors)
        self.start = nn.Linear(word_vectors.size(1), 1)
        self.end = nn.Linear(word_vectors.size(1), 1)

    def forward(self, cw, qw):
        x = self.emb.embed(cw) + self.emb.embed(qw).mean(1, keepdim=True)
        mask = cw != 0
        start = self.start(x).squeeze(-1).masked_fill(~mask, -1e30)
        end = self.end(x).squeeze(-1).masked_fill(~mask, -1e30)
        return start.log_softmax(-1), end.log_softmax(-1)
'''
PEER_UTIL = '''
class EMA:
    def __init__(self, model, decay):
        self.decay, self.original = decay, {}
        self.shadow = {n: p.data.clone() for n, p in model.named_parameters()
                       if p.requires_grad}

    def __call__(self, model, num_updates):
        decay = min(self.decay, (1.0 + num_updates) / (10.0 + num_updates))
        for n, p in model.named_parameters():
            if p.requires_grad:
                self.shadow[n] = ((1.0 - decay) * p.data + decay * self.shadow[n]).clone()

    def assign(self, model):
        for n, p in model.named_parameters():
            if p.requires_grad:
                self.original[n] = p.data.clone()
                p.data = self.shadow[n]

    def resume(self, model):
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.data = self.original[n]
'''


def test_a_batch_is_padded_to_the_peers_fixed_shapes() -> None:
    b = Batch(ids=["a"], cw=torch.ones(1, 3, dtype=torch.long),
              cc=torch.ones(1, 3, 2, dtype=torch.long), qw=torch.ones(1, 2, dtype=torch.long),
              qc=torch.ones(1, 2, 2, dtype=torch.long), c_mask=torch.ones(1, 3, dtype=bool),
              q_mask=torch.ones(1, 2, dtype=bool), y1=torch.tensor([0]), y2=torch.tensor([1]),
              is_impossible=torch.zeros(1, dtype=bool))
    p = padded(b, 5, 4, 6)
    assert (p.cw.shape, p.cc.shape, p.qw.shape, p.qc.shape) == ((1, 5), (1, 5, 6), (1, 4),
                                                               (1, 4, 6))
    assert p.cw[0].tolist() == [1, 1, 1, 0, 0] and p.c_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert p.cc[0, 0].tolist() == [1, 1, 0, 0, 0, 0] and p.cc[0, 4].sum() == 0
