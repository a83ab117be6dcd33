"""bench/peers.py end to end: rcpipe's bidaf beside a peer checkout outside the repo (here
tests/bench/peer_stand_in.py, shaped as chrischute/squad's: the real one is not in a user's
clone), on a small SQuAD-format file; its table, and the mistakes it refuses in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.peer_stand_in import chrischute

ROOT = Path(__file__).resolve().parents[2]


def article(title: str, context: str, question: str) -> dict:
    return {"title": title, "paragraphs": [{"context": context, "qas": [
        {"id": title, "question": question, "answers": []}]}]}


def peers(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    squad = tmp_path / "dev.json"
    squad.write_text(json.dumps({"version": "1.1", "data": [
        article("a", "The cat sat on the mat, the cat did.", "Where did the cat sit?"),
        article("b", "A dog ran in the park all day long.", "Where did the dog run?"),
    ]}))
    return subprocess.run(
        [sys.executable, "-m", "bench.peers", "bidaf", *args, "--squad", str(squad),
         "--batch", "2", "--context", "6", "--question", "3", "--words", "8",
         "--word-dim", "4", "--hidden", "4", "--warmup", "0", "--repeats", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_both_sides_are_timed_on_the_same_batch_with_their_ratios(tmp_path: Path) -> None:
    peer = chrischute(tmp_path / "squad")
    run = peers(tmp_path, str(peer))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "CPU, 1 torch thread(s), 0 warm-up and 2 timed rounds" in run.stdout
    for step in ("train", "inference"):
        row = re.search(rf"^\| {step} \| ([\d.]+) / ([\d.]+) \| ([\d.]+) / ([\d.]+) \| "
                        rf"([\d.]+)x / ([\d.]+)x \|$", run.stdout, re.MULTILINE)
        assert row, run.stdout
        median, least, peer_median, peer_least = (float(row[i]) for i in range(1, 5))
        assert 0 < least <= median and 0 <= peer_least <= peer_median  # seconds, 3 places
        assert float(row[5]) > 0 and float(row[6]) > 0
    assert "Remaining differences:" in run.stdout


@pytest.mark.parametrize(("where", "said"), [
    ("inside", "a peer's checkout lives outside this repository"),
    ("cuda", "--device cuda: no CUDA device here"),
])
def test_a_peer_inside_the_repo_or_a_missing_device_is_one_line(
        tmp_path: Path, where: str, said: str) -> None:
    import torch

    if where == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    args = [str(ROOT / "bench")] if where == "inside" else [str(tmp_path), "--device", "cuda"]
    run = peers(tmp_path, *args)
    assert run.returncode == 2 and said in run.stderr.splitlines()[-1], run.stderr
    assert "Traceback" not in run.stderr


def test_a_saved_batch_stands_for_the_squad_file_and_the_ratios_come_as_json(
        tmp_path: Path) -> None:
    """--text: the batch the GPU kit carries (the box has no spaCy), the same tensors as
    tokenizing --squad; --out: the ratios as JSON; a batch built for another table is one
    line."""
    from bench.peer_text import load_text_batch, read_text_batch, save_text_batch

    peer = chrischute(tmp_path / "squad")
    peers(tmp_path, str(peer))  # writes dev.json
    text = read_text_batch(tmp_path / "dev.json", 2, 6, 3, 8)
    saved = save_text_batch(text, 8, tmp_path / "text.pt")
    again, _ = load_text_batch(saved, 8)
    assert all((getattr(text, k) == getattr(again, k)).all() for k in ("cw", "cc", "qw", "qc"))
    out = tmp_path / "peers.json"
    run = peers(tmp_path, str(peer), "--text", str(saved), "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["model"] == "bidaf" and (got["batch"], got["context"]) == (2, 6)
    for kind in ("train", "inference"):
        s = got["steps"][kind]
        assert s["ratio_median"] == pytest.approx(s["rcpipe_median_s"] / s["peer_median_s"])
    other = save_text_batch(text, 9, tmp_path / "other.pt")
    run = peers(tmp_path, str(peer), "--text", str(other))
    assert run.returncode == 2 and "different number of words" in run.stderr.splitlines()[-1]
