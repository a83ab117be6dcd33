"""Vocabularies are deterministic; GloVe-format vectors read from .txt, .gz and .zip."""

from __future__ import annotations

import gzip
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rcpipe.data.vocab import (
    OOV,
    PAD,
    Vocab,
    build_vocab,
    build_word_vocab,
    case_forms,
    embedding_matrix,
    read_vectors,
)
from rcpipe.errors import InputError

# ------------------------------------------------------------------------------ vocabularies


@pytest.mark.parametrize("missing_vectors", ["unk", "train", "fixed"])
def test_words_without_vectors_follow_missing_vectors(missing_vectors: str) -> None:
    counts = Counter({"the": 9, "zorblax": 5, "city": 4, "quux": 2})
    vectored = {"the", "city", "dev-only"}  # a dev word with a vector joins
    words, trained = build_word_vocab(counts, 1, vectored, missing_vectors)
    if missing_vectors == "unk":  # out of vocabulary: the OOV vector stands for them
        assert (words.items, trained) == ([PAD, OOV, "the", "city", "dev-only"], 0)
        assert words.id("zorblax") == words.id("quux") == 1
    elif missing_vectors == "train":  # ids 2 .. 1 + trained, by count, then the rest
        assert (words.items, trained) == ([PAD, OOV, "zorblax", "quux", "the", "city",
                                           "dev-only"], 2)
    else:  # where their count puts them (frozen random rows)
        assert (words.items, trained) == ([PAD, OOV, "the", "zorblax", "city", "quux",
                                           "dev-only"], 0)
    # without vectors every training word is in, whatever the setting says
    assert build_word_vocab(counts, 1, None, missing_vectors) == (build_vocab(counts, 1), 0)


def test_specials_are_0_and_1() -> None:
    v = build_vocab(Counter({"b": 2, "a": 5}), 1)
    assert v.items[:2] == [PAD, OOV]
    assert v.id(PAD) == 0 and v.id(OOV) == 1
    assert v.id("never seen") == 1


def test_order_by_count_then_alphabet() -> None:
    v = build_vocab(Counter({"zeta": 3, "alpha": 1, "beta": 3, "gamma": 7}), 1)
    assert v.items == [PAD, OOV, "gamma", "beta", "zeta", "alpha"]
    assert [v.id(w) for w in ("gamma", "beta", "zeta", "alpha")] == [2, 3, 4, 5]
    assert len(v) == 6


def test_deterministic_across_insertion_orders() -> None:
    words = [f"w{i % 17}" for i in range(200)] + ["Zebra", "apple", "Apple", "éclair", "ß"]
    counts = Counter(words)
    shuffled = list(counts.items())
    np.random.default_rng(3).shuffle(shuffled)
    other = Counter(dict(reversed(shuffled)))
    assert list(other) != list(counts)  # really a different insertion order
    a, b = build_vocab(counts, 1), build_vocab(other, 1)
    assert a.items == b.items
    assert all(a.id(w) == b.id(w) for w in counts)


def test_min_count() -> None:
    counts = Counter({"often": 5, "twice": 2, "once": 1})
    assert build_vocab(counts, 2).items == [PAD, OOV, "often", "twice"]
    assert build_vocab(counts, 6).items == [PAD, OOV]
    v = build_vocab(counts, 2, extra={"once", "unseen"})  # extra words join whatever their count
    assert v.items == [PAD, OOV, "often", "twice", "once", "unseen"]


def test_specials_in_counts_are_not_duplicated() -> None:
    v = build_vocab(Counter({PAD: 9, OOV: 9, "x": 1}), 1, extra={PAD})
    assert v.items == [PAD, OOV, "x"]


def test_vocab_id_lookup() -> None:
    v = Vocab([PAD, OOV, "a", "b"])
    assert [v.id(x) for x in ("a", "b", "c", PAD)] == [2, 3, 1, 0]


# ---------------------------------------------------------------------------------- vectors

GLOVE = [
    "the 0.1 0.2 0.3",
    "Paris 1 2 3",
    "paris 4 5 6",
    "PARIS 7 8 9",
    ". . 0.5 0.5 0.5",  # a word of two dots and a space
    "New York 1.5 2.5 3.5",  # a word with a space in it
    "unwanted 9 9 9",
    "the 0 0 0",  # a repeated word: the first line wins
    "long-word 1e-3 -2 3E2",
]

NAMES = {"txt": "glove.txt", "gz": "glove.txt.gz", "zip": "glove.zip"}


def _write(path: Path, lines: list[str], kind: str) -> Path:
    text = "\n".join(lines) + "\n"
    if kind == "txt":
        path.write_text(text, encoding="utf-8")
    elif kind == "gz":
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("readme.md", "not this one")
            zf.writestr("glove.6B.3d.txt", text)
    return path


@pytest.mark.parametrize("kind", ["txt", "gz", "zip"])
def test_read_vectors(tmp_path: Path, kind: str) -> None:
    path = _write(tmp_path / NAMES[kind], GLOVE, kind)
    wanted = {"the", "Paris", "paris", ". .", "New York", "long-word", "absent"}
    vectors = read_vectors(path, wanted, 3, "glove")
    assert set(vectors) == wanted - {"absent"}
    assert vectors["the"].dtype == np.float32
    np.testing.assert_array_equal(vectors["the"], np.float32([0.1, 0.2, 0.3]))
    np.testing.assert_array_equal(vectors["Paris"], [1, 2, 3])
    np.testing.assert_array_equal(vectors[". ."], [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(vectors["New York"], np.float32([1.5, 2.5, 3.5]))
    np.testing.assert_allclose(vectors["long-word"], [1e-3, -2, 300])


def test_read_vectors_trailing_space_and_header(tmp_path: Path) -> None:
    # word2vec-style "count dim" header line, and lines ending in a space (as some dumps do)
    path = _write(tmp_path / "v.txt", ["2 3", "a 1 2 3 ", "b 4 5 6"], "txt")
    vectors = read_vectors(path, {"a", "b"}, 3, "v")
    np.testing.assert_array_equal(vectors["a"], [1, 2, 3])
    np.testing.assert_array_equal(vectors["b"], [4, 5, 6])


@pytest.mark.parametrize("kind", ["txt", "gz", "zip"])
def test_read_vectors_bad_line(tmp_path: Path, kind: str) -> None:
    path = _write(tmp_path / NAMES[kind], ["a 1 2 3", "b 4 5 6", "c 7 8"], kind)
    with pytest.raises(InputError) as info:
        read_vectors(path, {"a"}, 3, "vectors.txt")
    err = info.value
    assert (err.file, err.location) == ("vectors.txt", "line 3")
    assert "3 numbers" in err.what


def test_read_vectors_wrong_dim(tmp_path: Path) -> None:
    path = _write(tmp_path / "v.txt", ["a 1 2 3"], "txt")
    with pytest.raises(InputError) as info:
        read_vectors(path, {"a"}, 5, "v")
    assert info.value.location == "line 1"


def test_read_vectors_non_number(tmp_path: Path) -> None:
    path = _write(tmp_path / "v.txt", ["a 1 2 3", "b 4 x 6"], "txt")
    assert set(read_vectors(path, {"a"}, 3, "v")) == {"a"}  # unwanted lines are not parsed
    with pytest.raises(InputError) as info:
        read_vectors(path, {"b"}, 3, "v")
    assert info.value.location == "line 2" and "non-number" in info.value.what


def test_read_vectors_zip_without_txt(tmp_path: Path) -> None:
    path = tmp_path / "v.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("vectors.bin", b"\0")
    with pytest.raises(InputError) as info:
        read_vectors(path, {"a"}, 3, "v")
    assert "no .txt" in info.value.what


# ----------------------------------------------------------------------- embedding matrix


def test_case_forms_order() -> None:
    assert case_forms("pARis") == ("pARis", "paris", "Paris", "PARIS")


def test_embedding_matrix_case_lookup_order() -> None:
    vec = {name: np.full(2, i, dtype=np.float32)
           for i, name in enumerate(["exact", "Exact", "lower", "Title", "UPPER", "Mixed"], 1)}
    # word -> which form is found first: the word itself, lower, title, then upper
    vocab = Vocab([PAD, OOV, "Exact", "LOWER", "title", "upper", "mIXED", "missing"])
    vectors = {"Exact": vec["Exact"], "exact": vec["exact"],  # the word itself wins
               "lower": vec["lower"], "Lower": vec["Title"],  # lower beats title
               "Title": vec["Title"], "TITLE": vec["UPPER"],  # title beats upper
               "UPPER": vec["UPPER"],
               "Mixed": vec["Mixed"]}
    emb, hits = embedding_matrix(vocab, vectors, 2)
    assert emb.shape == (8, 2) and emb.dtype == np.float32
    np.testing.assert_array_equal(emb[2], vec["Exact"])
    np.testing.assert_array_equal(emb[3], vec["lower"])
    np.testing.assert_array_equal(emb[4], vec["Title"])
    np.testing.assert_array_equal(emb[5], vec["UPPER"])
    np.testing.assert_array_equal(emb[6], vec["Mixed"])  # "mIXED".title() == "Mixed"
    assert hits == 5
    assert np.all(emb[0] == 0)  # PAD row is zero
    assert np.any(emb[1] != 0) and np.any(emb[7] != 0)  # OOV and misses: small random
    assert np.abs(emb[7]).max() < 1.0


def test_embedding_matrix_deterministic() -> None:
    vocab = Vocab([PAD, OOV, "a", "b"])
    e1, _ = embedding_matrix(vocab, {}, 4, seed=1)
    e2, _ = embedding_matrix(vocab, {}, 4, seed=1)
    e3, _ = embedding_matrix(vocab, {}, 4, seed=2)
    np.testing.assert_array_equal(e1, e2)
    assert not np.array_equal(e1, e3)
    assert np.all(e1[0] == 0) and np.all(e3[0] == 0)
