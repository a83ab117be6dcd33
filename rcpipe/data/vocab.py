"""Word and character vocabularies, built deterministically, and GloVe-format word vectors."""

from __future__ import annotations

import gzip
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import IO

import numpy as np

from rcpipe import reads
from rcpipe.config import ReadLimits
from rcpipe.errors import InputError

PAD, OOV = "--NULL--", "--OOV--"  # ids 0 and 1 in both vocabularies


@dataclass(frozen=True)
class Vocab:
    items: list[str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", {w: i for i, w in enumerate(self.items)})

    def __len__(self) -> int:
        return len(self.items)

    def id(self, item: str) -> int:
        return self.index.get(item, 1)  # type: ignore[attr-defined]


def build_vocab(counts: Counter[str], min_count: int, extra: Iterable[str] = ()) -> Vocab:
    """Specials, then items by falling count and then alphabetically: same input, same ids."""
    kept = {w for w, c in counts.items() if c >= min_count} | set(extra)
    kept -= {PAD, OOV}
    ordered = sorted(kept, key=lambda w: (-counts.get(w, 0), w))
    return Vocab([PAD, OOV, *ordered])


def build_word_vocab(counts: Counter[str], min_count: int, vectored: set[str] | None,
                     missing_vectors: str = "unk") -> tuple[Vocab, int]:
    """The word vocabulary and how many of its ids, from 2 on, are words to train alone.

    ``vectored``: the words (training or dev) the pretrained vectors know, or None without
    vectors (every word is then trained, whatever ``missing_vectors`` says). A training
    word they lack is, per ``missing_vectors`` (data.missing_vectors): ``unk`` left out,
    so it reads as OOV; ``train`` kept, with the others like it right after the specials
    (ids 2 .. 1 + n: the model gives these n their own trainable rows); ``fixed`` kept
    where its count puts it (the word vectors give it a frozen random row).
    """
    if vectored is None:
        return build_vocab(counts, min_count), 0
    if missing_vectors == "unk":
        return build_vocab(Counter({w: c for w, c in counts.items() if w in vectored}),
                           min_count, vectored), 0
    words = build_vocab(counts, min_count, vectored)
    if missing_vectors == "fixed":
        return words, 0
    lacking = [w for w in words.items[2:] if w not in vectored]  # count order kept
    known = [w for w in words.items[2:] if w in vectored]
    return Vocab([PAD, OOV, *lacking, *known]), len(lacking)


def case_forms(word: str) -> tuple[str, ...]:
    """Forms tried, in order, when looking a word up in the vectors (GloVe 840B is cased)."""
    return (word, word.lower(), word.title(), word.upper())


# a GloVe line is a word and its numbers (300-d: ~3 KB): a line past this is no vector, and
# reading it whole (a 3 MB zip holding a 3 GB line) was a MemoryError at 3.3 GB
LINE_BYTES = 1_000_000


@contextmanager
def _opened(path: Path, name: str) -> Iterator[IO[bytes]]:
    """The text of a word-vectors file as bytes: a .zip's first .txt member, a .gz
    inflated, else the file; a regular file only (reads.open_regular)."""
    with reads.open_regular(path, name) as raw:
        if path.suffix == ".zip":
            try:
                zf = zipfile.ZipFile(raw)
            except zipfile.BadZipFile as e:
                raise InputError(name, "", f"not a zip file ({e})") from None
            with zf:
                member = next((n for n in zf.namelist() if n.endswith(".txt")), None)
                if member is None:
                    raise InputError(name, "", "zip holds no .txt file")
                with zf.open(member) as f:
                    yield f
        elif path.suffix == ".gz":
            with gzip.open(raw) as f:
                yield f
        else:
            yield raw


def _lines(path: Path, name: str, cap: int) -> Iterator[str]:
    """The file's lines, each read within LINE_BYTES, all within ``cap`` bytes once
    inflated (limits.vectors_mb): an archive's own sizes are not trusted."""
    total = 0
    with _opened(path, name) as f:
        for n in count(1):
            try:
                line = f.readline(LINE_BYTES + 1)
            except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
                raise InputError(name, f"line {n}", f"cannot read: {e}") from None
            if not line:
                return
            total += len(line)
            if total > cap:
                raise reads.too_big(name, f"over {reads.size_text(cap)} inflated", cap,
                                    "limits.vectors_mb")
            if len(line) > LINE_BYTES:
                raise InputError(name, f"line {n}", f"over {LINE_BYTES:,} bytes: not a word "
                                 "and its numbers")
            yield line.decode("utf-8", errors="replace")


def read_vectors(path: Path, wanted: set[str], dim: int, name: str,
                 cap: int = ReadLimits().vectors_bytes()) -> dict[str, np.ndarray]:
    """Vectors for the ``wanted`` strings from a GloVe-format text file (.txt, .gz, .zip),
    read within ``cap`` bytes inflated.

    A line is ``word v1 ... v_dim``; the word may itself hold spaces (GloVe 840B has some),
    so the vector is the last ``dim`` fields. Only wanted lines are parsed to floats.
    """
    found: dict[str, np.ndarray] = {}
    for n, line in enumerate(_lines(path, name, cap), start=1):
        parts = line.rstrip("\n").rstrip(" ").split(" ")
        if len(parts) <= dim:
            if n == 1 and len(parts) == 2:  # word2vec-style header "count dim"
                continue
            raise InputError(name, f"line {n}", f"expected a word and {dim} numbers")
        word = " ".join(parts[:-dim])
        if word in wanted and word not in found:
            try:
                found[word] = np.asarray(parts[-dim:], dtype=np.float32)
            except ValueError:
                raise InputError(name, f"line {n}", "vector holds a non-number") from None
    return found


def embedding_matrix(vocab: Vocab, vectors: dict[str, np.ndarray], dim: int,
                     seed: int = 0) -> tuple[np.ndarray, int]:
    """(len(vocab), dim) float32: the first case form found, small random otherwise; PAD = 0."""
    rng = np.random.default_rng(seed)
    emb = rng.normal(0.0, 0.1, size=(len(vocab), dim)).astype(np.float32)
    emb[0] = 0.0
    hits = 0
    for i, word in enumerate(vocab.items[2:], start=2):
        vec = next((vectors[f] for f in case_forms(word) if f in vectors), None)
        if vec is not None:
            emb[i] = vec
            hits += 1
    return emb, hits
