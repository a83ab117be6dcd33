"""Long contexts as overlapping windows of tokens: where each window lies, and which of its
tokens it answers for.

A context of n tokens longer than ``length`` is read as the fewest windows of ``length``
tokens whose starts are at most ``stride`` apart, spread evenly so that the first starts at
token 0 and the last ends at token n (every window is full, and consecutive windows share
at least ``length - stride`` tokens). A context of at most ``length`` tokens is one window,
the whole context: nothing about it changes.

Each token is answered for by one window, the one in which it has the most context on
both sides (BERT's max-context rule; ties to the earlier window): with windows of one
length that is the window whose centre is nearest, so each window owns one stretch and
the stretches tile the context. A window proposes only spans that start on a token it
owns, so a span cut by a window's end is never proposed there: it starts in the next
window's stretch, where it is whole as long as the windows share at least 2k - 1 tokens
for a span of k tokens (inference/window_choice.py chooses across the windows).

Pure numpy; the dataset collates a window as a slice of its row (data/dataset.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def window_starts(n: int, length: int, stride: int) -> list[int]:
    """The first token of each window over a context of ``n`` tokens: [0] when it fits."""
    if stride < 1 or length < 1:
        raise ValueError(f"length and stride must be at least 1, got {length}, {stride}")
    if n <= length:
        return [0]
    k = -(-(n - length) // stride) + 1  # the fewest windows whose starts are <= stride apart
    return [(i * (n - length)) // (k - 1) for i in range(k)]  # (k,) the last is n - length


def owned(starts: list[int], n: int, length: int) -> list[tuple[int, int]]:
    """Each window's [lo, hi) tokens, counted in the context: the tokens it answers for."""
    bounds = [0]
    for a, b in zip(starts, starts[1:], strict=False):
        # token t is the earlier window's while t - centre_a <= centre_b - t
        bounds.append((a + b + length - 1) // 2 + 1)
    bounds.append(n)
    return list(zip(bounds, bounds[1:], strict=False))


@dataclass(frozen=True)
class Windows:
    """The windows a dataset's rows are read as: window w reads tokens
    [start[w], start[w] + length[w]) of row row[w]'s context and answers for its tokens
    [own_lo[w], own_hi[w]) (counted in the window); it is window index[w] of count[row]."""

    row: np.ndarray  # (W,) int64
    start: np.ndarray  # (W,)
    length: np.ndarray  # (W,)
    own_lo: np.ndarray  # (W,) window-local
    own_hi: np.ndarray  # (W,)
    index: np.ndarray  # (W,) 0 for a row's first window
    count: np.ndarray  # (rows,) windows per row

    @classmethod
    def of(cls, lengths: np.ndarray, length: int | None = None, stride: int | None = None
           ) -> Windows:
        """Windows over rows of ``lengths`` tokens; ``length`` None: each row whole, one
        window each (window i is row i)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        n_rows = len(lengths)
        if length is None or not (lengths > length).any():
            rows = np.arange(n_rows, dtype=np.int64)
            zeros = np.zeros(n_rows, dtype=np.int64)
            return cls(rows, zeros, lengths.copy(), zeros, lengths.copy(), zeros,
                       np.ones(n_rows, dtype=np.int64))
        assert stride is not None, "a window length needs a stride"
        cols: list[list[int]] = [[], [], [], [], [], []]
        count = np.ones(n_rows, dtype=np.int64)
        for r, n in enumerate(lengths.tolist()):
            if n <= length:
                for col, v in zip(cols, (r, 0, n, 0, n, 0), strict=True):
                    col.append(v)
                continue
            starts = window_starts(n, length, stride)
            count[r] = len(starts)
            for k, (s, (lo, hi)) in enumerate(zip(starts, owned(starts, n, length),
                                                  strict=True)):
                for col, v in zip(cols, (r, s, length, lo - s, hi - s, k), strict=True):
                    col.append(v)
        row, start, size, lo, hi, index = (np.asarray(c, dtype=np.int64) for c in cols)
        return cls(row, start, size, lo, hi, index, count)

    def __len__(self) -> int:
        return len(self.row)

    def summary(self) -> dict[str, int]:
        """How many rows were read as more than one window, and as how many windows."""
        many = self.count > 1
        return {"questions": int(many.sum()), "windows": int(self.count[many].sum())}
