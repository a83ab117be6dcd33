"""data/windows.py: where a long context's windows lie and which tokens each answers for."""

from __future__ import annotations

import numpy as np
import pytest

from rcpipe.data.windows import Windows, owned, window_starts

CASES = [(n, length, stride) for n in (1, 7, 20, 21, 37, 100, 1570, 5003)
         for length, stride in ((20, 10), (20, 19), (20, 1), (1000, 500), (400, 200))]


@pytest.mark.parametrize(("n", "length", "stride"), CASES)
def test_windows_are_full_evenly_spread_and_cover_the_context(n: int, length: int,
                                                              stride: int) -> None:
    starts = window_starts(n, length, stride)
    if n <= length:
        assert starts == [0]  # one window, the whole context: nothing changes
        return
    assert starts[0] == 0 and starts[-1] == n - length  # full windows, the last at the end
    gaps = np.diff(starts)
    assert (gaps > 0).all() and (gaps <= stride).all()
    assert len(starts) == -(-(n - length) // stride) + 1  # the fewest that do
    assert gaps.max() - gaps.min() <= 1  # spread evenly


@pytest.mark.parametrize(("n", "length", "stride"), CASES)
def test_each_token_is_answered_for_by_the_window_where_it_has_most_context(
        n: int, length: int, stride: int) -> None:
    starts = window_starts(n, length, stride)
    own = owned(starts, n, min(length, n))
    assert own[0][0] == 0 and own[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(own, own[1:], strict=False))  # they tile
    size = min(length, n)
    for t in range(n):
        context = [min(t - s, s + size - 1 - t) if s <= t < s + size else -1 for s in starts]
        best = int(np.argmax(context))  # the first of the best: ties to the earlier window
        assert own[best][0] <= t < own[best][1], t


@pytest.mark.parametrize(("n", "length", "stride"), CASES)
def test_a_span_starting_on_an_owned_token_lies_whole_in_its_window(
        n: int, length: int, stride: int) -> None:
    k = (length - stride + 1) // 2  # the longest span the overlap guarantees
    starts = window_starts(n, length, stride)
    size = min(length, n)
    for s, (lo, hi) in zip(starts, owned(starts, n, size), strict=True):
        for t in range(lo, hi):
            if t + k <= n:  # a span of k tokens from t fits the context
                assert s <= t and t + k <= s + size, (s, t)


def test_windows_of_a_dataset() -> None:
    w = Windows.of(np.array([5, 30, 0, 20]), length=20, stride=10)
    # row 1 (30 tokens): windows at 0 and 10; the others whole
    assert w.row.tolist() == [0, 1, 1, 2, 3]
    assert w.start.tolist() == [0, 0, 10, 0, 0]
    assert w.length.tolist() == [5, 20, 20, 0, 20]
    assert w.index.tolist() == [0, 0, 1, 0, 0] and w.count.tolist() == [1, 2, 1, 1]
    # row 1's windows answer for tokens [0, 15) and [15, 30): window-local [0, 15), [5, 20)
    assert (w.own_lo.tolist(), w.own_hi.tolist()) == ([0, 0, 5, 0, 0], [5, 15, 20, 0, 20])
    assert w.summary() == {"questions": 1, "windows": 2}
    whole = Windows.of(np.array([5, 30]))  # no length: each row whole
    assert whole.row.tolist() == [0, 1] and whole.length.tolist() == [5, 30]
    assert whole.summary() == {"questions": 0, "windows": 0}
