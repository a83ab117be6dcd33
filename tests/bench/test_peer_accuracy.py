"""bench/peer_accuracy.py end to end (the accuracy mode beside bench/peers.py's timing): rcpipe's
bidaf trained through its worker beside a peer checkout outside the repo (a stand-in shaped
as chrischute/squad's models.BiDAF and util.EMA: the real one is not in a user's clone), on a
synthetic article split; both sides' runs, S and the choices, the paired verdict, the chart,
rcpipe's first S steps run again identically, and a second run training nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.peer_recipes import padded
from rcpipe.models.batch import Batch

ROOT = Path(__file__).resolve().parents[2]

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


@pytest.mark.trains
@pytest.mark.slow
def test_both_sides_train_and_are_paired_at_equal_minutes_and_steps(tmp_path: Path) -> None:
    from rcpipe.data import synth

    split = tmp_path / "split"
    split.mkdir()
    for name, seed, articles in (("train", 13, 6), ("test", 14, 2)):
        synth.write(synth.generate(seed, articles, 3, 4, title_prefix=f"t-{name}",
                                   facts_per_paragraph=(2, 3)), split / f"{name}-v1.1.json")
    peer = tmp_path / "squad"
    peer.mkdir()
    (peer / "models.py").write_text(PEER_MODELS)
    (peer / "util.py").write_text(PEER_UTIL)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "bench.peer_accuracy", "--models", "bidaf", "--minutes",
           "0.15", "--seeds", "1", "--every", "6", "2", "--bidaf-peer", str(peer),
           "--split", str(split), "--out", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads((out / "peer-accuracy.json").read_text())["models"]["bidaf"]
    one = found["runs"]["42"]
    steps = one["steps"]
    assert steps["equal"] == min(steps["rcpipe"], steps["peer"]) > 0
    assert [h["step"] for h in one["peer"]["history"]][-1] == steps["peer"]
    assert one["peer"]["recipe"]["optimizer"] == "Adadelta"
    if steps["rcpipe"] > steps["equal"]:  # rcpipe's first S steps again: the same steps
        same = one["same_first_steps"]
        assert same["steps"] and same["largest_heldout_f1_gap"] == 0, same
        assert one["rcpipe_steps"]["steps"] == steps["equal"]
    for at in ("minutes", "steps"):
        assert found["compared"][at]["verdict"] in ("gain", "loss", "chance")
        assert "95%" in found["compared"][at]["line"]
    assert (out / "peer-accuracy.png").stat().st_size > 0
    assert "bidaf at equal minutes: rcpipe minus peer" in run.stdout
    # a second run trains nothing again: each side's finished run is read back
    summary = out / "peer-accuracy" / "seed-42" / "rcpipe" / "bidaf" / "summary.json"
    before = summary.stat().st_mtime_ns
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary.stat().st_mtime_ns == before
    assert json.loads((out / "peer-accuracy.json").read_text())["models"]["bidaf"][
        "compared"] == found["compared"]
