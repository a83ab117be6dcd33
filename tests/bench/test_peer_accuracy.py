"""bench/peer_accuracy.py and bench/peer_recipes.py (the accuracy mode beside bench/peers.py's
timing): a peer's fixed batch shapes, and chrischute/squad's LSTMs packed with their lengths on
the host; end to end, rcpipe's bidaf trained through its worker beside a stand-in peer
(tests/bench/peer_stand_in.py) is the GPU kit's call 3 in its dry run
(tests/bench/test_gpu_kit.py): both sides' runs, S and the choices, the paired verdict, the
chart, the faster side's first S steps run again identically."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from bench.peer_recipes import chrischute_modules, padded
from rcpipe.models.batch import Batch
from tests.bench.peer_stand_in import chrischute


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


def test_the_bidaf_peer_packs_its_lstm_input_with_the_lengths_on_the_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """chrischute/squad's layers.py hands pack_padded_sequence the mask's sums from the
    model's device, which torch refuses on CUDA: its name in layers.py is rebound to one that
    moves them to the host first (the CPU cannot show the error; it shows the rebinding)."""
    handed = []
    real = torch.nn.utils.rnn.pack_padded_sequence

    def seen(x: torch.Tensor, lengths: torch.Tensor, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        handed.append(lengths.tolist())
        return real(x, lengths, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils.rnn, "pack_padded_sequence", seen)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        models, _ = chrischute_modules(chrischute(tmp_path / "squad"))
        log_p1, _ = models.BiDAF(torch.randn(5, 4), 3)(torch.tensor([[1, 2, 0], [3, 0, 0]]),
                                                       torch.tensor([[3, 4], [1, 0]]))
    finally:
        for name in ("models", "layers", "util"):
            sys.modules.pop(name, None)
    assert handed == [[2, 1]]  # through the rebound name, sorted as the peer sorts them
    assert log_p1.exp()[0, 2] == 0 and log_p1.exp()[1, 1:].sum() == 0  # padding masked


@pytest.mark.parametrize("faster", ["rcpipe", "peer"])
def test_the_faster_side_trains_its_first_s_steps_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faster: str) -> None:
    """Whichever side trained further in the minutes, its first S steps (the slower side's
    count) run again at the slower side's cadence, with no clock (the cap ends it), and its
    equal-steps answers come from that run: its own may have saved nothing at or before S
    (the dry run on a busy machine: rcpipe 3 steps, the peer 8 with a checkpoint every 20)."""
    import argparse

    from bench import peer_accuracy

    trained = {"rcpipe": 3, "peer": 3} | {faster: 8}
    cadence = {"rcpipe": 2, "peer": 5}
    runs: list[tuple[str, float, int, int]] = []  # (side, minutes, cadence, steps)

    def summary(side: str, minutes: float, every: int, cap: int) -> dict:
        n = cap or trained[side]
        runs.append((side, minutes, every, n))
        return {"steps": n, "history": [{"step": s, "heldout_f1": 1.0}
                                        for s in sorted({*range(every, n + 1, every), n})]}

    def rcpipe_run(model, vectors, prepared, train_file, test, minutes,  # noqa: ANN001, ANN202
                   every, seed, run, device, extra=()):
        return summary("rcpipe", minutes, every, int(extra[0].split("=")[1]) if extra else 0)

    def peer_run(model, peer, prepared, test, minutes, seed, every,  # noqa: ANN001, ANN202
                 out, device, max_steps=0):
        s = summary("peer", minutes, every, max_steps)
        (out / "answers").mkdir(parents=True)
        for h in s["history"]:  # each answer names the run it came from
            (out / "answers" / f"step-{h['step']}.json").write_text(
                json.dumps({"q": out.parent.name}))
        return s

    monkeypatch.setattr(peer_accuracy, "rcpipe_run", rcpipe_run)
    monkeypatch.setattr(peer_accuracy, "peer_run", peer_run)
    monkeypatch.setattr(peer_accuracy, "peer_steps", lambda out, run: run.result()["steps"])
    monkeypatch.setattr(peer_accuracy, "rcpipe_answers",
                        lambda model, run, prepared, test: {"q": run.parent.name})
    args = argparse.Namespace(out=tmp_path, every=list(cadence.values()), minutes=0.1,
                              device="cpu", bidaf_peer=tmp_path / "squad")
    r = peer_accuracy.one_pair("bidaf", 42, args, None, tmp_path, tmp_path, tmp_path)

    slower = "peer" if faster == "rcpipe" else "rcpipe"
    assert r["steps"] == {**trained, "equal": 3}
    assert runs[2] == (faster, 0, cadence[slower], 3)  # capped at S, no clock
    assert r[f"{faster}_steps"]["steps"] == 3
    assert r["answers"]["minutes"] == ({"q": "rcpipe"}, {"q": "peer"})  # each side's run
    at_s = {"rcpipe": "rcpipe", "peer": "peer", faster: f"{faster}-steps"}
    assert r["answers"]["steps"] == ({"q": at_s["rcpipe"]}, {"q": at_s["peer"]})
