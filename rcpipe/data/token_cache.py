"""Each article's tokens kept on disk, so a prepare after a few new articles tokenizes only
those (spaCy is prepare's slow part).

    <data.cache_dir>/tokens/<ab>/<abcd...>.tok    one article's tokens

The key is the sha256 of the tokenizer's version tag (tokenize.version_tag: its rule and
spaCy's version) and the article's texts, its contexts then its questions, in order: what
its tokens are made of and nothing else (an answer corrected elsewhere in the article keeps
its tokens). An entry holds, after a magic line and the sha256 of the rest, little-endian
int32s: the number of texts, each text's token count, then each token's start and end.

An entry is written atomically (a temporary file renamed) and read back within the size
its texts allow (a token is one character or more), then checked: its checksum, its counts
against the texts, every token inside its text and after the one before. Anything else
(cut, corrupt, from another article, not a regular file) is tokenized again, with a
warning, and written anew; a cache that cannot be written is one warning, and prepare
tokenizes without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from rcpipe import reads
from rcpipe.data.squad import SquadFile
from rcpipe.data.tokenize import Tokenizes, Tokens, version_tag
from rcpipe.errors import InputError

log = logging.getLogger(__name__)

MAGIC = b"rcpipe tokens 1\n"
HEAD = len(MAGIC) + 32  # the magic, the body's sha256
X = TypeVar("X")


class Corrupt(ValueError):
    """A cache entry that is not an article's tokens."""


def texts_of(sq: SquadFile) -> list[str]:
    """An article's texts as its tokens are kept: its contexts, then its questions."""
    return [*sq.contexts, *(q.question for q in sq.questions)]


class Offsets(NamedTuple):
    """An article's tokens as offsets: each text's number of tokens, then every token's
    start and end, text after text (what an entry holds)."""

    counts: np.ndarray  # (n,) tokens of each text
    spans: np.ndarray  # (T, 2) start, end

    @classmethod
    def of(cls, per_text: list[np.ndarray]) -> Offsets:
        """From each text's (T_i, 2) offsets (what the tokenizer gives)."""
        return cls(np.array([len(s) for s in per_text], dtype=np.int64),
                   np.concatenate([*per_text, np.zeros((0, 2), np.int32)]))

    def tokens(self, texts: list[str]) -> list[Tokens]:
        """Each text's Tokens (a list read once an article, not an array a text)."""
        starts, ends = self.spans[:, 0].tolist(), self.spans[:, 1].tolist()  # (T,) each
        out, at = [], 0
        for text, n in zip(texts, self.counts.tolist(), strict=True):
            s, e = starts[at : at + n], ends[at : at + n]
            out.append(Tokens([text[a:b] for a, b in zip(s, e, strict=True)], s, e))
            at += n
        return out


def encode(offsets: Offsets) -> bytes:
    """An entry's bytes."""
    counts, spans = offsets
    body = np.concatenate([np.array([len(counts)], dtype="<i4"), counts.astype("<i4"),
                           spans.astype("<i4").ravel()]).tobytes()
    return MAGIC + hashlib.sha256(body).digest() + body


def cap(texts: list[str]) -> int:
    """The largest entry ``texts`` can have: a token a character at most."""
    return HEAD + 4 * (1 + len(texts) + 2 * sum(len(t) for t in texts))


def decode(data: bytes, texts: list[str]) -> Offsets:
    """The offsets of ``texts`` an entry holds, or Corrupt saying why."""
    if data[: len(MAGIC)] != MAGIC:
        raise Corrupt("not a token cache entry")
    body = data[HEAD:]
    if hashlib.sha256(body).digest() != data[len(MAGIC) : HEAD] or len(body) % 4:
        raise Corrupt("its checksum does not match its content")
    ints = np.frombuffer(body, dtype="<i4")
    n = len(texts)
    if len(ints) < 1 + n or ints[0] != n:
        raise Corrupt(f"{ints[0] if len(ints) else 'no'} texts, the article has {n}")
    counts = ints[1 : 1 + n].astype(np.int64)  # (n,) tokens of each text
    if (counts < 0).any() or 1 + n + 2 * counts.sum() != len(ints):
        raise Corrupt("its token counts do not add up to its size")
    spans = ints[1 + n :].reshape(-1, 2)  # (T, 2) every token's start and end, text by text
    starts, ends = spans[:, 0], spans[:, 1]
    owner = np.repeat(np.arange(n), counts)  # (T,) the text each token is of
    length = np.array([len(t) for t in texts], dtype=np.int64)[owner]  # (T,) its text's
    if not ((starts >= 0) & (starts < ends) & (ends <= length)).all():
        raise Corrupt("a token outside its text")
    same = owner[1:] == owner[:-1]  # (T-1,) token i+1 of the same text as token i
    if (starts[1:][same] < ends[:-1][same]).any():
        raise Corrupt("tokens out of order")
    return Offsets(counts, spans)


class TokenCache:
    """The entries under ``folder`` (None: no cache), and what a prepare took of them."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.tag = version_tag()
        self.cached = self.tokenized = self.corrupt = self.unwritten = 0

    def path(self, texts: list[str]) -> Path | None:
        if self.folder is None:
            return None
        h = hashlib.sha256(self.tag.encode() + b"\0")
        h.update(json.dumps(texts).encode())  # ASCII: a lone surrogate is text too
        key = h.hexdigest()
        return self.folder / key[:2] / f"{key}.tok"

    def get(self, texts: list[str]) -> Offsets | None:
        """The offsets kept for ``texts``, None when none (or none to trust)."""
        path = self.path(texts)
        if path is None or not path.exists():
            return None
        try:
            offsets = decode(reads.read_bytes(path, cap(texts), "its texts' size"), texts)
        except (Corrupt, InputError, OSError) as e:
            why = e.what if isinstance(e, InputError) else str(e)
            log.warning(f"token cache: {path}: {why}; tokenized again")
            self.corrupt += 1
            return None
        self.cached += 1
        return offsets

    def put(self, texts: list[str], offsets: Offsets) -> None:
        """Keep ``texts``' offsets (what cannot be written is left, said once)."""
        self.tokenized += 1
        path = self.path(texts)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tok-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(encode(offsets))
                os.replace(tmp, path)
            finally:
                Path(tmp).unlink(missing_ok=True)
        except OSError as e:  # a full disk, a read-only one: said once, prepare goes on
            if not self.unwritten:
                log.warning(f"token cache: cannot write {path} ({e}); its tokens are not "
                            "kept")
            self.unwritten += 1

    def described(self) -> str:
        said = [f"{self.corrupt} of its entries unreadable, tokenized again"] * bool(
            self.corrupt) + [f"{self.unwritten} not kept"] * bool(self.unwritten)
        return f"{self.tokenized} articles tokenized, {self.cached} from the token cache" + \
            (f" ({'; '.join(said)})" if said else "")


@dataclass(frozen=True)
class Tokenized(Generic[X]):
    """An article (``item``: what the caller passed with it) and its tokens."""

    item: X
    sq: SquadFile
    contexts: list[Tokens]
    questions: list[Tokens]


def tokenized(articles: Iterable[tuple[X, SquadFile]], cache: TokenCache,
              tokenizer: Tokenizes, texts: int = 512) -> Iterator[Tokenized[X]]:
    """Each article with its tokens, in order: from the cache, else tokenized (articles
    gathered into jobs of about ``texts`` texts, across the tokenizer's processes) and
    kept."""
    jobs = ((job, [t for a in job if a.kept is None for t in a.texts])
            for job in _jobs(articles, cache, texts))
    for job, spans in tokenizer.spans(jobs):
        done = 0
        for a in job:
            kept = a.kept
            if kept is None:  # tokenized now: its share of the job's offsets
                kept = Offsets.of(spans[done : done + len(a.texts)])
                done += len(a.texts)
                cache.put(a.texts, kept)
            tokens = kept.tokens(a.texts)
            n = len(a.sq.contexts)
            yield Tokenized(a.item, a.sq, tokens[:n], tokens[n:])


class _Pending(NamedTuple, Generic[X]):
    """An article on its way: its texts and their cached offsets (None: to tokenize)."""

    item: X
    sq: SquadFile
    texts: list[str]
    kept: Offsets | None


def _jobs(articles: Iterable[tuple[X, SquadFile]], cache: TokenCache, texts: int
          ) -> Iterator[list[_Pending[X]]]:
    """The articles in runs of about ``texts`` texts (cached ones too: a run is what is
    held at once), each looked up in the cache."""
    job: list[_Pending[X]] = []
    size = 0
    for item, sq in articles:
        article_texts = texts_of(sq)
        job.append(_Pending(item, sq, article_texts, cache.get(article_texts)))
        size += len(article_texts)
        if size >= texts:
            yield job
            job, size = [], 0
    if job:
        yield job
