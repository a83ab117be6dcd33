"""A stand-in for chrischute/squad's checkout (the real one is not in a user's clone), shaped as
the files bench/peers.py and bench/peer_recipes.py import: models.BiDAF(word_vectors,
hidden_size, drop_prob) with its word table at .emb.embed, called on (context, question) word
ids, giving masked log-probabilities, its LSTM's input packed by layers.py's
pack_padded_sequence (imported by name, as the peer's is); util.EMA(model, decay) called as
ema(model, updates), assign and resume."""

from __future__ import annotations

from pathlib import Path

LAYERS = '''
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def encoded(rnn, x, lengths):
    lengths, order = lengths.sort(0, descending=True)
    out, _ = rnn(pack_padded_sequence(x[order], lengths, batch_first=True))
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
    return out[order.argsort()]
'''
MODELS = '''
from torch import nn

import layers


class Embedding(nn.Module):
    def __init__(self, word_vectors):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(word_vectors)


class BiDAF(nn.Module):
    def __init__(self, word_vectors, hidden_size, drop_prob=0.0):
        super().__init__()
        self.emb = Embedding(word_vectors)
        self.rnn = nn.LSTM(word_vectors.size(1), hidden_size, batch_first=True)
        self.start = nn.Linear(hidden_size, 1)
        self.end = nn.Linear(hidden_size, 1)

    def forward(self, cw, qw):
        mask = cw != 0
        x = self.emb.embed(cw) + self.emb.embed(qw).mean(1, keepdim=True)
        x = layers.encoded(self.rnn, x, mask.sum(-1))
        start = self.start(x).squeeze(-1).masked_fill(~mask, -1e30)
        end = self.end(x).squeeze(-1).masked_fill(~mask, -1e30)
        return start.log_softmax(-1), end.log_softmax(-1)
'''
UTIL = '''
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


def chrischute(folder: Path) -> Path:
    """The stand-in's three files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("layers.py", LAYERS), ("models.py", MODELS), ("util.py", UTIL)):
        (folder / name).write_text(text)
    return folder
