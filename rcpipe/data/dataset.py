"""Prepared Parquet -> padded, masked torch batches, with length bucketing.

The table is held as flat numpy arrays plus offsets (Arrow's own layout), so fetching a row
is a slice, not a Python list conversion: 87k SQuAD questions fit in a few hundred MB.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from queue import Empty, Queue
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import torch

from rcpipe import reads
from rcpipe.data.prepared import Prepared
from rcpipe.data.teacher import COLUMNS as TEACHER
from rcpipe.data.windows import Windows
from rcpipe.models.batch import Batch

if TYPE_CHECKING:
    from rcpipe.data.shards import Shards

T = TypeVar("T")


class _Ragged:
    """A list<int32> column as (values, offsets): row i is values[offsets[i]:offsets[i+1]]."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        arr = column.combine_chunks()
        self.offsets = arr.offsets.to_numpy()
        self.values = arr.flatten().to_numpy(zero_copy_only=False)
        self._lengths = np.diff(self.offsets)  # (N,)

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return self._lengths

    def fill(self, rows: np.ndarray, keep: np.ndarray, out: np.ndarray,
             skip: np.ndarray | int = 0) -> None:
        """out[b, :n] = the n <= keep[b] values of row rows[b] after its first skip[b],
        every row at once."""
        first = self.offsets[rows] + skip  # (B,)
        n = np.minimum(self.offsets[rows + 1] - first, keep)  # (B,)
        b_of, t_of = _spread(n)  # (T,) each value's batch row and position in it
        out[b_of, t_of] = self.values[first[b_of] + t_of]


class _Ragged2:
    """A list<list<int32>> column (tokens -> chars) as two levels of offsets."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        arr = column.combine_chunks()
        self.outer = arr.offsets.to_numpy()
        inner = arr.flatten()
        self.inner = inner.offsets.to_numpy()
        self.values = inner.flatten().to_numpy(zero_copy_only=False)

    def row(self, i: int) -> list[np.ndarray]:
        lo, hi = self.outer[i], self.outer[i + 1]
        return [self.values[self.inner[t] : self.inner[t + 1]] for t in range(lo, hi)]

    def tokens(self, rows: np.ndarray, keep: np.ndarray, skip: np.ndarray | int = 0
               ) -> CharTokens:
        """keep[b] tokens of each row rows[b] after its first skip[b]: each one's batch row,
        position and chars (where they start in ``values``, how many), for ``fill`` and the
        char width."""
        first = self.outer[rows] + skip  # (B,) the first token read of each row
        n_tok = np.minimum(self.outer[rows + 1] - first, keep)  # (B,)
        b_of, t_of = _spread(n_tok)  # (T,) each token's batch row and position
        token = first[b_of] + t_of  # (T,) its index in the column
        start = self.inner[token]  # (T,) its first char
        return CharTokens(b_of, t_of, start, self.inner[token + 1] - start)

    def fill(self, tokens: CharTokens, out: np.ndarray) -> None:
        """out[b, t, :c] = the chars of each of ``tokens`` (c <= out's width).

        Index arithmetic over the offsets instead of a Python loop over tokens: collating a
        batch is a few numpy calls, whatever its size (a GPU step must not wait for it).
        """
        n_chars = np.minimum(tokens.n_chars, out.shape[2])  # (T,)
        k_of, c_of = _spread(n_chars)  # (C,) each char's token (into T) and position
        out[tokens.b_of[k_of], tokens.t_of[k_of], c_of] = \
            self.values[tokens.start[k_of] + c_of]


class CharTokens(NamedTuple):
    b_of: np.ndarray  # (T,) batch row
    t_of: np.ndarray  # (T,) position in the row
    start: np.ndarray  # (T,) first char in the column's values
    n_chars: np.ndarray  # (T,)


def _spread(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For counts (N,): (which of the N, position within it) of each of sum(counts) items."""
    owner = np.repeat(np.arange(len(counts)), counts)  # (sum,)
    before = np.cumsum(counts) - counts  # (N,) items ahead of each
    return owner, np.arange(len(owner)) - before[owner]


def read_table(folder: Path) -> pa.Table:
    """A prepared split's folder (``<data.out_dir>/dev``), every part checked against
    meta.json's manifest (data/shards.py), as one table."""
    return Prepared(folder.parent).shards(folder.name).read_all()


def answer_length_prior(shards: Shards, max_len: int) -> np.ndarray:
    """(max_len,) the share of a split's labelled answers of each length in tokens (k + 1
    at k), add-one smoothed, so no length the decoder allows has probability 0; its span
    columns read a row group at a time."""
    counts = np.zeros(max_len, dtype=np.int64)
    for t in shards.tables(["y1", "y2"]):
        y1, y2 = t.column("y1").to_numpy(), t.column("y2").to_numpy()
        labelled = y1 >= 0
        lengths = (y2[labelled] - y1[labelled]).astype(np.int64)  # tokens - 1
        counts += np.bincount(lengths[lengths < max_len], minlength=max_len)[:max_len]
    return ((counts + 1) / (counts.sum() + max_len)).astype(np.float32)


def char_limit_of(out_dir: Path) -> int:
    """The chars kept per word that prepare recorded in ``out_dir``'s meta.json."""
    meta = Prepared(out_dir).meta_file
    return reads.read_json(meta).get("char_limit", 16) if meta.is_file() else 16


Edges = tuple[Sequence[int], Sequence[int]]  # (context edges, question edges), increasing


def padded_length(longest: int, edges: Sequence[int] | None) -> int:
    """The length a batch whose longest row has ``longest`` tokens is padded to: the first
    edge that holds it; without edges, or past the last one, the longest itself (>= 1)."""
    longest = max(1, longest)
    for edge in edges or ():
        if edge >= longest:
            return edge
    return longest


class SquadDataset:
    """Map-style dataset over a prepared split; ``para_limit`` truncates long dev contexts;
    ``buckets`` (train.buckets) pads each batch to the edge above its longest row."""

    def __init__(self, table: pa.Table, para_limit: int | None = None,
                 char_limit: int = 16, buckets: Edges | None = None) -> None:
        self.char_limit = char_limit  # chars kept per word by prepare (data.limits.char)
        self.buckets = buckets
        self.ids = table.column("id").to_pylist()
        self.cw = _Ragged(table.column("context_word_ids"))
        self.cc = _Ragged2(table.column("context_char_ids"))
        self.qw = _Ragged(table.column("question_word_ids"))
        self.qc = _Ragged2(table.column("question_char_ids"))
        self.y1 = table.column("y1").to_numpy()
        self.y2 = table.column("y2").to_numpy()
        self.impossible = table.column("is_impossible").to_numpy(zero_copy_only=False)
        self.para_limit = para_limit
        self._contexts = table.column("context")
        self.starts = _Ragged(table.column("context_starts"))
        self.ends = _Ragged(table.column("context_ends"))
        # a student's rows carry their teacher's distributions (data/teacher.py)
        self.teacher = tuple(_Ragged(table.column(c)) for c in TEACHER) \
            if TEACHER[0] in table.column_names else ()

    def answer_text(self, i: int, start: int, end: int) -> str:
        """The context text of row i from token ``start`` to token ``end`` (inclusive)."""
        context = self._contexts[i].as_py()
        return context[int(self.starts.row(i)[start]) : int(self.ends.row(i)[end])]

    def char_span(self, i: int, start: int, end: int) -> tuple[int, int]:
        return int(self.starts.row(i)[start]), int(self.ends.row(i)[end])

    @classmethod
    def from_parquet(cls, folder: Path, para_limit: int | None = None,
                     buckets: Edges | None = None) -> SquadDataset:
        """A prepared split, whole (its folder of parts); its char limit is the one
        prepare recorded in meta.json."""
        return cls(read_table(folder), para_limit, char_limit_of(folder.parent), buckets)

    def __len__(self) -> int:
        return len(self.ids)

    def context_lengths(self) -> np.ndarray:
        lengths = self.cw.lengths()
        return np.minimum(lengths, self.para_limit) if self.para_limit else lengths

    def question_lengths(self) -> np.ndarray:
        return self.qw.lengths()

    def _lengths(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Context (cut at para_limit) and question lengths of these rows, (B,) each."""
        c_len = self.cw.lengths()[rows]  # (B,)
        if self.para_limit:
            c_len = np.minimum(c_len, self.para_limit)
        return c_len, self.qw.lengths()[rows]

    def _padded(self, c_len: np.ndarray, q_len: np.ndarray) -> tuple[int, int]:
        c_edges, q_edges = self.buckets or (None, None)
        return (padded_length(int(c_len.max(initial=0)), c_edges),
                padded_length(int(q_len.max(initial=0)), q_edges))

    def padded_shape(self, indices: Sequence[int]) -> tuple[int, int]:
        """(Lc, Lq) that ``collate(indices)`` pads to."""
        return self._padded(*self._lengths(np.asarray(indices, dtype=np.int64)))

    def collate(self, indices: Sequence[int], char_limit: int | None = None,
                windows: Windows | None = None) -> Batch:
        """Pad the rows to the longest in the batch, or to the bucket edge above it (at least
        1, so no tensor is empty), and every word to ``char_limit`` chars (default: the
        dataset's); without buckets, to the batch's longest word if that is shorter (the
        char encoders give the same output for any char padding: a CharGRU over fixed-width
        words then runs no step that only pads).

        With ``windows`` (data/windows.py) ``indices`` are windows: each is its row's tokens
        from the window's start, its label counted from there (-1 unless the answer lies
        whole in it), its id the row's.
        """
        w = np.asarray(indices, dtype=np.int64)  # (B,)
        if windows is None:
            rows, skip = w, 0
            c_len, q_len = self._lengths(rows)  # (B,) each
        else:
            rows, skip = windows.row[w], windows.start[w]  # (B,) each
            c_len, q_len = windows.length[w], self.qw.lengths()[rows]
        return self._collate(rows, skip, c_len, q_len, char_limit or self.char_limit)

    def _collate(self, rows: np.ndarray, skip: np.ndarray | int, c_len: np.ndarray,
                 q_len: np.ndarray, char_limit: int) -> Batch:
        n = len(rows)
        lc, lq = self._padded(c_len, q_len)
        c_tok, q_tok = self.cc.tokens(rows, c_len, skip), self.qc.tokens(rows, q_len)
        if self.buckets is None:
            longest = max(c_tok.n_chars.max(initial=0), q_tok.n_chars.max(initial=0))
            char_limit = max(1, min(char_limit, int(longest)))
        cw = np.zeros((n, lc), dtype=np.int64)
        qw = np.zeros((n, lq), dtype=np.int64)
        cc = np.zeros((n, lc, char_limit), dtype=np.int64)
        qc = np.zeros((n, lq, char_limit), dtype=np.int64)
        self.cw.fill(rows, c_len, cw, skip)
        self.qw.fill(rows, q_len, qw)
        self.cc.fill(c_tok, cc)
        self.qc.fill(q_tok, qc)
        y1, y2 = self.y1[rows].astype(np.int64), self.y2[rows].astype(np.int64)
        y1, y2 = y1 - skip, y2 - skip  # (B,) counted from the window's first token
        # an answer cut off by para_limit, or not whole in its window, has no label there
        outside = (y2 >= c_len) | (y1 < 0)
        y1[outside], y2[outside] = -1, -1
        cw_t, qw_t = torch.from_numpy(cw), torch.from_numpy(qw)
        teacher = {}  # a student's whole rows only: windows (evaluation's reads) carry none
        for name, column in zip(TEACHER, self.teacher if np.ndim(skip) == 0 else (),
                                strict=False):
            p = np.zeros((n, lc + 1), dtype=np.float32)  # [no-answer, the row's tokens]
            column.fill(rows, c_len + 1, p)
            teacher[name] = torch.from_numpy(p)
        return Batch(
            ids=[self.ids[i] for i in rows.tolist()],
            cw=cw_t,
            cc=torch.from_numpy(cc),
            qw=qw_t,
            qc=torch.from_numpy(qc),
            c_mask=cw_t != 0,
            q_mask=qw_t != 0,
            y1=torch.from_numpy(y1),
            y2=torch.from_numpy(y2),
            is_impossible=torch.from_numpy(self.impossible[rows].astype(bool)),
            **distinct_words(cw, cc, qw, qc), **teacher,
        )


def distinct_words(cw: np.ndarray, cc: np.ndarray, qw: np.ndarray, qc: np.ndarray
                   ) -> dict[str, torch.Tensor]:
    """Batch's ``words``, ``word_ids``, ``cu`` and ``qu``: the distinct (word id, char row)
    pairs of the context and question tokens (padding's among them) and each token's pair.
    A batch of 32 SQuAD questions has about a third as many distinct words as tokens.

    Keyed on the pair, not the chars alone: a word's whole embedding (its vector, its chars,
    the highway over both) is then a function of its row, so a model can run all of it once
    per row (models/embeddings.py's ``per_word``); chars are cut at the char limit and the
    vocabulary may fold case, so neither half alone names the word."""
    w = cc.shape[2]
    ids = np.concatenate([cw.reshape(-1, 1), qw.reshape(-1, 1)])  # (N, 1)
    flat = np.concatenate([cc.reshape(-1, w), qc.reshape(-1, w)])  # (N, W)
    pairs = np.concatenate([ids, flat], axis=1).astype(np.int32)  # (N, 1 + W)
    # each row as one opaque key: a 1-D unique, ~6x faster than np.unique(axis=0), which
    # sorts the rows column by column (word and char ids fit int32)
    keys = np.ascontiguousarray(pairs).view(np.dtype((np.void, 4 * (w + 1)))).ravel()  # (N,)
    _, first, row = np.unique(keys, return_index=True, return_inverse=True)  # (U,), (N,)
    row = row.reshape(-1)
    n_c = cc.shape[0] * cc.shape[1]
    return {"words": torch.from_numpy(flat[first]),  # (U, W)
            "word_ids": torch.from_numpy(ids[first, 0]),  # (U,)
            "cu": torch.from_numpy(row[:n_c].reshape(cc.shape[:2])),  # (B, Lc)
            "qu": torch.from_numpy(row[n_c:].reshape(qc.shape[:2]))}  # (B, Lq)


def bucket_batches(lengths: np.ndarray, batch_size: int, shuffle: bool, seed: int = 0,
                   bucket_factor: int = 50) -> list[list[int]]:
    """Batches of similar context length, so little of each batch is padding.

    Rows are shuffled, cut into pools of ``batch_size * bucket_factor``, each pool is sorted
    by length and cut into batches, and the batches are shuffled: random order, tight padding.
    Without shuffle the order is by length (deterministic, for evaluation).
    """
    n = len(lengths)
    if not shuffle:
        order = np.argsort(lengths, kind="stable")
        return [order[i : i + batch_size].tolist() for i in range(0, n, batch_size)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    pool = batch_size * bucket_factor
    batches: list[list[int]] = []
    for p in range(0, n, pool):
        chunk = order[p : p + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size].tolist() for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)  # type: ignore[arg-type]
    return batches


def iterate(dataset: SquadDataset, batches: list[list[int]], char_limit: int | None = None
            ) -> Iterator[Batch]:
    for indices in batches:
        yield dataset.collate(indices, char_limit)


def ahead(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """``items`` produced on a background thread, up to ``depth`` ahead of the consumer.

    A GPU step mostly waits for the device, so the next batches are collated (and pinned)
    meanwhile. Leaving the loop early stops the thread at its next item.
    """
    queue: Queue[tuple[bool, Any]] = Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                queue.put((True, item))
            queue.put((False, None))
        except BaseException as e:  # noqa: BLE001 - raised again in the consumer
            queue.put((False, e))

    thread = threading.Thread(target=produce, name="rcpipe-batches-ahead", daemon=True)
    thread.start()
    try:
        while True:
            more, item = queue.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                queue.get(timeout=0.05)
            except Empty:
                pass

