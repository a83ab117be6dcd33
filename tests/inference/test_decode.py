"""best_span against a brute-force search, and the no-answer decision."""

from __future__ import annotations

import pytest
import torch

from rcpipe.inference.decode import best_span, predict_no_answer


def brute_force_span(
    p_start: torch.Tensor, p_end: torch.Tensor, max_len: int
) -> tuple[list[int], list[int], list[float]]:
    """Every allowed (i, j) in row-major order; a strictly larger product replaces the best,
    so the earliest pair wins ties."""
    starts, ends, probs = [], [], []
    batch, length = p_start.shape
    for b in range(batch):
        best = (-1.0, 0, 0)
        for i in range(length):
            for j in range(i, min(length, i + max_len)):
                prob = (p_start[b, i] * p_end[b, j]).item()
                if prob > best[0]:
                    best = (prob, i, j)
        probs.append(best[0])
        starts.append(best[1])
        ends.append(best[2])
    return starts, ends, probs


def random_probs(generator: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """Softmax over each row's first k positions, exact zeros after (padding)."""
    logits = torch.randn(batch, length, generator=generator) * 3
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    pad = torch.arange(length).unsqueeze(0) >= lengths.unsqueeze(1)  # (B, L)
    return logits.masked_fill(pad, float("-inf")).softmax(dim=-1)


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 6, (1,), generator=generator))
    length = int(torch.randint(1, 40, (1,), generator=generator))
    max_len = int(torch.randint(1, 20, (1,), generator=generator))
    p_start = random_probs(generator, batch, length)
    p_end = random_probs(generator, batch, length)

    start, end, prob = best_span(p_start, p_end, max_len=max_len)
    want_start, want_end, want_prob = brute_force_span(p_start, p_end, max_len)

    assert start.tolist() == want_start
    assert end.tolist() == want_end
    assert prob.tolist() == pytest.approx(want_prob, rel=1e-6)
    assert start.shape == end.shape == prob.shape == (batch,)
    assert start.dtype == end.dtype == torch.long
    assert bool((start <= end).all())
    assert bool((end < start + max_len).all())


def test_span_longer_than_max_len_is_not_chosen() -> None:
    # The best unconstrained pair (0, 4) is 5 tokens long.
    p_start = torch.tensor([[0.9, 0.0, 0.1, 0.0, 0.0]])
    p_end = torch.tensor([[0.0, 0.0, 0.2, 0.0, 0.8]])
    start, end, prob = best_span(p_start, p_end, max_len=5)
    assert (start.item(), end.item()) == (0, 4)
    start, end, prob = best_span(p_start, p_end, max_len=4)
    # Allowed: (0, 2) 0.18, (2, 4) 0.08, (2, 2) 0.02.
    assert (start.item(), end.item()) == (0, 2)
    assert prob.item() == pytest.approx(0.9 * 0.2)


def test_end_before_start_is_not_chosen() -> None:
    p_start = torch.tensor([[0.1, 0.0, 0.9]])
    p_end = torch.tensor([[0.9, 0.0, 0.1]])
    start, end, prob = best_span(p_start, p_end)
    # (2, 0) would be 0.81; the allowed best is (0, 0) 0.09 vs (2, 2) 0.09 vs (0, 2) 0.01:
    # a tie, which the earliest pair wins.
    assert (start.item(), end.item()) == (0, 0)
    assert prob.item() == pytest.approx(0.09)


def test_ties_go_to_the_earliest_pair() -> None:
    uniform = torch.full((2, 6), 1 / 6)
    start, end, _ = best_span(uniform, uniform, max_len=3)
    assert start.tolist() == [0, 0]
    assert end.tolist() == [0, 0]
    # An all-zero row (all padding) still returns an allowed span, of probability 0.
    zeros = torch.zeros(1, 4)
    start, end, prob = best_span(zeros, zeros)
    assert (start.item(), end.item(), prob.item()) == (0, 0, 0.0)


def test_max_len_one_picks_single_tokens() -> None:
    generator = torch.Generator().manual_seed(7)
    p_start = random_probs(generator, 4, 12)
    p_end = random_probs(generator, 4, 12)
    start, end, prob = best_span(p_start, p_end, max_len=1)
    assert torch.equal(start, end)
    assert torch.equal(start, (p_start * p_end).argmax(dim=1))
    assert torch.equal(prob, (p_start * p_end).max(dim=1).values)


def test_single_position_and_batch_of_one() -> None:
    start, end, prob = best_span(torch.tensor([[1.0]]), torch.tensor([[1.0]]))
    assert (start.tolist(), end.tolist(), prob.tolist()) == ([0], [0], [1.0])


def test_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="B, L"):
        best_span(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="B, L"):
        best_span(torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match="max_len"):
        best_span(torch.ones(1, 3), torch.ones(1, 3), max_len=0)
    with pytest.raises(ValueError, match="zero-length"):
        best_span(torch.ones(1, 0), torch.ones(1, 0))


def test_predict_no_answer() -> None:
    span_prob = torch.tensor([0.5, 0.2, 0.3, 0.4])
    na_prob = torch.tensor([0.4, 0.6, 0.3, 0.9])
    # Without a threshold: abstain when the no-answer probability beats the span's; a tie
    # answers.
    assert predict_no_answer(span_prob, na_prob).tolist() == [False, True, False, True]
    # With one: abstain when na_prob exceeds it, whatever the span's probability.
    assert predict_no_answer(span_prob, na_prob, threshold=0.4).tolist() == [
        False,
        True,
        False,
        True,
    ]
    assert predict_no_answer(span_prob, na_prob, threshold=0.3).tolist() == [
        True,
        True,
        False,
        True,
    ]
    assert predict_no_answer(span_prob, na_prob).dtype == torch.bool


def test_a_length_prior_chooses_among_spans_and_leaves_prob_unweighted() -> None:
    p_start = torch.tensor([[0.5, 0.0, 0.5, 0.0]])
    p_end = torch.tensor([[0.0, 0.5, 0.0, 0.5]])
    # (0, 1) and (2, 3) and (0, 3) and (2, 3)...: (0, 1) wins the tie without a prior
    assert best_span(p_start, p_end, 4)[:2] == (torch.tensor([0]), torch.tensor([1]))
    prior = torch.tensor([0.1, 0.1, 0.1, 0.7])  # four-token answers are the common ones
    start, end, prob = best_span(p_start, p_end, 4, length_prior=prior)
    assert (int(start), int(end)) == (0, 3)
    assert float(prob) == pytest.approx(0.25)  # p_start * p_end, not weighted


def test_a_length_prior_from_the_host_meets_probabilities_on_the_models_device() -> None:
    """eval.length_prior's weights are made on the host (NumPy), the probabilities live on
    the model's device: on a GPU a CPU prior times CUDA scores raises. The meta device
    raises the same way on the CPU, so it stands for the GPU here."""
    p = torch.rand(2, 30, device="meta")
    start, end, prob = best_span(p, p, 15, length_prior=torch.rand(15))
    assert start.device == end.device == prob.device == p.device
    assert start.shape == (2,)
