"""Word and character vocabularies, built deterministically, and GloVe-format word vectors."""

from __future__ import annotations

import gzip
import io
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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


def _lines(path: Path) -> Iterator[str]:
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            member = next((n for n in zf.namelist() if n.endswith(".txt")), None)
            if member is None:
                raise InputError(path, "", "zip holds no .txt file")
            with zf.open(member) as f:
                yield from io.TextIOWrapper(f, encoding="utf-8", errors="replace")
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        yield from f


def read_vectors(path: Path, wanted: set[str], dim: int, name: str) -> dict[str, np.ndarray]:
    """Vectors for the ``wanted`` strings from a GloVe-format text file.

    A line is ``word v1 ... v_dim``; the word may itself hold spaces (GloVe 840B has some),
    so the vector is the last ``dim`` fields. Only wanted lines are parsed to floats.
    """
    found: dict[str, np.ndarray] = {}
    for n, line in enumerate(_lines(path), start=1):
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
