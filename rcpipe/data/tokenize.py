"""spaCy tokenization with character offsets, and answer span alignment.

``spacy.blank("en")`` gives the rule-based English tokenizer with no trained pipeline, so
nothing is downloaded. Whitespace tokens are dropped: they carry no answer and every kept
token keeps its exact character span in the original text.
"""

from __future__ import annotations

import bisect
import multiprocessing as mp
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from rcpipe.console import progress

if TYPE_CHECKING:
    import spacy

_NLP = None
# the tokenizing rule's version (spacy.blank("en"), whitespace tokens dropped): a change to
# it must change this, so that no token cached by the old rule is read (data/token_cache.py)
TOKENS = 1
T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")


@dataclass(frozen=True)
class Tokens:
    words: list[str]
    starts: list[int]  # character offset of each word in the text
    ends: list[int]  # one past its last character


def _nlp() -> spacy.language.Language:
    # spaCy is imported here, not at the top: what imports this module (predict, serve, the
    # GPU box's training) loads spaCy only when it tokenizes, and `rcpipe --help` never
    import spacy

    global _NLP
    if _NLP is None:
        _NLP = spacy.blank("en")
    return _NLP


def spans_chunk(texts: list[str]) -> list[np.ndarray]:
    """(T, 2) int32 start/end offsets of the non-space tokens of each text.

    Workers send back only offsets (compact arrays pickle fast); the parent slices the words
    out of its own copy of the text.
    """
    from spacy.attrs import IDX, IS_SPACE, LENGTH

    out = []
    for doc in _nlp().tokenizer.pipe(texts, batch_size=256):
        # one array read per doc instead of a Python Token object per token (3x faster)
        arr = doc.to_array([IDX, LENGTH, IS_SPACE])  # (T, 3)
        arr = arr[arr[:, 2] == 0]
        out.append(np.stack([arr[:, 0], arr[:, 0] + arr[:, 1]], axis=1).astype(np.int32))
    return out


def _chunks(texts: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(texts), size):
        yield texts[i : i + size]


def tokens_of(text: str, spans: np.ndarray) -> Tokens:
    """``text``'s Tokens from its (T, 2) start/end offsets."""
    starts, ends = spans[:, 0].tolist(), spans[:, 1].tolist()
    return Tokens([text[a:b] for a, b in zip(starts, ends, strict=True)], starts, ends)


def tokenize(texts: list[str], workers: int = 1, chunk: int = 512,
             desc: str = "tokenize", quiet: bool = False) -> list[Tokens]:
    """Tokenize ``texts`` in order on ``workers`` processes, with a progress bar unless
    ``quiet`` (a service tokenizing every request)."""
    results: list[Tokens] = []
    pool = _context().Pool(workers) if workers > 1 and len(texts) > chunk else None
    # the pool starts before the bar: the bar's refresh thread would rule out fork
    parts = pool.imap(spans_chunk, _chunks(texts, chunk)) if pool else map(
        spans_chunk, _chunks(texts, chunk))
    try:
        with progress(disable=quiet) as bar:
            task = bar.add_task(desc, total=len(texts))
            for part in parts:
                results.extend(tokens_of(texts[len(results)], spans) for spans in part)
                bar.advance(task, len(part))
    finally:
        if pool:
            pool.close()
            pool.join()
    return results


class Tokenizes(Protocol):
    """What prepare's passes tokenize and label with: processes here (Tokenizer) or Ray
    tasks over a cluster (cluster/tokenize_tasks.py's RayTokenizer, data.on_ray)."""

    def spans(self, jobs: Iterable[tuple[T, list[str]]], ahead: int = 2
              ) -> Iterator[tuple[T, list[np.ndarray]]]: ...

    def mapped(self, jobs: Iterable[tuple[T, A]], work: Callable[[A], R]
               ) -> Iterator[tuple[T, R]]: ...

    def described(self) -> str: ...


class Tokenizer:
    """spaCy on ``workers`` processes, the pool started once (before any progress bar:
    its refresh thread would rule out fork) for every pass that tokenizes. Each process
    loads spaCy as it starts (2-3 s), while the caller reads: a night whose few new articles
    come last does not wait for it then."""

    def __init__(self, workers: int = 1) -> None:
        self.pool = _context().Pool(workers, initializer=_nlp) if workers > 1 else None
        self.workers = workers

    def __enter__(self) -> Tokenizer:
        return self

    def __exit__(self, *_: Any) -> None:
        if self.pool is not None:  # an error's too: no process left behind
            self.pool.terminate()
            self.pool.join()

    def described(self) -> str:
        return f"{self.workers} process(es)"

    def spans(self, jobs: Iterable[tuple[T, list[str]]], ahead: int = 2
              ) -> Iterator[tuple[T, list[np.ndarray]]]:
        """Each job's texts' (T, 2) token offsets, job after job in order, at most
        ``ahead`` jobs a process read ahead of the one given back."""
        if self.pool is None:
            for job, texts in jobs:
                yield job, spans_chunk(texts) if texts else []
            return
        pool = self.pool
        yield from in_order(
            jobs, lambda texts: pool.apply_async(spans_chunk, (texts,)) if texts else None,
            lambda result: result.get() if result is not None else [], self.workers * ahead)

    def mapped(self, jobs: Iterable[tuple[T, A]], work: Callable[[A], R]
               ) -> Iterator[tuple[T, R]]:
        """``work(arg)`` of each job, in this process, in order (pass (d)'s labelling)."""
        for job, arg in jobs:
            yield job, work(arg)


def in_order(jobs: Iterable[tuple[T, A]], submit: Callable[[A], Any],
             get: Callable[[Any], R], width: int) -> Iterator[tuple[T, R]]:
    """Each job's result, job after job in order: ``submit(arg)`` starts it (a handle),
    ``get(handle)`` waits for it, at most ``width`` jobs submitted ahead of the one given
    back (Pool.imap would read ``jobs`` to their end, holding them all). The process pool
    here and Ray tasks over a cluster (cluster/tokenize_tasks.py) both go through it."""
    waiting: deque[tuple[T, Any]] = deque()

    def given() -> tuple[T, R]:
        job, handle = waiting.popleft()
        return job, get(handle)

    for job, arg in jobs:
        waiting.append((job, submit(arg)))
        if len(waiting) >= width:
            yield given()
    while waiting:
        yield given()


def version_tag() -> str:
    """What tokens depend on besides the text: this module's rule (TOKENS, bumped when it
    changes) and spaCy's version (its rules change with it); a cached token's key holds it."""
    from importlib.metadata import version

    return f"rcpipe-tokens-{TOKENS} spacy-{version('spacy')} blank-en"


def _context() -> mp.context.BaseContext:
    """fork where it is safe: the children inherit the imported spaCy (spawn re-imports it,
    4 s per process). A process that already runs threads (Prefect, Ray) gets forkserver,
    since fork would copy their locks mid-use."""
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    if "forkserver" in methods:
        mp.set_forkserver_preload(["rcpipe.data.tokenize"])
        return mp.get_context("forkserver")
    return mp.get_context("spawn")


def char_span_to_token_span(tokens: Tokens, start: int, end: int) -> tuple[int, int] | None:
    """The first and last token overlapping characters [start, end), or None if none does."""
    first = bisect.bisect_right(tokens.ends, start)  # first token ending after start
    last = bisect.bisect_left(tokens.starts, end) - 1  # last token starting before end
    return (first, last) if first <= last else None
