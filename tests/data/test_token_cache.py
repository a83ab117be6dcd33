"""Each article's tokens kept on disk (rcpipe/data/token_cache.py): read back only when
whole and its own, else tokenized again with a warning; the tokenizer's processes read a
bounded number of jobs ahead."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rcpipe.data.squad import Answer, Question, SquadFile
from rcpipe.data.token_cache import (
    MAGIC,
    Corrupt,
    Offsets,
    TokenCache,
    decode,
    encode,
    texts_of,
    tokenized,
)
from rcpipe.data.tokenize import Tokenizer, tokenize

TEXTS = ["Ada wrote code in 1843.", "Who wrote code?", "", "  spaced   out  "]


def offsets_of(texts: list[str]) -> Offsets:
    return Offsets.of([np.array([t.starts, t.ends], dtype=np.int32).T.reshape(-1, 2)
                       for t in tokenize(texts, quiet=True)])


def article(i: int, n: int = 2) -> SquadFile:
    contexts = [f"Article {i} paragraph {j}: Ada wrote code." for j in range(n)]
    questions = [Question(f"q{i}-{j}", f"Who wrote code {j}?", j, (Answer("Ada", 0),),
                          False, (), f"data[{i}]") for j in range(n)]
    return SquadFile("f.json", "1.1", contexts, [f"t{i}"] * n, questions)


def _forged(ints: list[int]) -> bytes:
    """An entry of these int32s whose checksum is right: only its content can be wrong."""
    body = np.array(ints, dtype="<i4").tobytes()
    return MAGIC + hashlib.sha256(body).digest() + body


def test_an_entry_reads_back_as_it_was_kept() -> None:
    offsets = offsets_of(TEXTS)
    back = decode(encode(offsets), TEXTS)
    assert np.array_equal(back.counts, offsets.counts) and back.counts.tolist() == [6, 4, 0, 2]
    assert np.array_equal(back.spans, offsets.spans)
    assert back.tokens(TEXTS) == tokenize(TEXTS)


@pytest.mark.parametrize(("damage", "why"), [
    (lambda b: b[:-4], "its checksum does not match its content"),
    (lambda b: b[:60] + bytes([b[60] ^ 1]) + b[61:], "its checksum does not match"),
    (lambda b: b"x" + b[1:], "not a token cache entry"),
    (lambda b: b"", "not a token cache entry"),
])
def test_a_damaged_entry_is_no_tokens(damage: object, why: str) -> None:
    with pytest.raises(Corrupt, match=why):
        decode(damage(encode(offsets_of(TEXTS))), TEXTS)  # type: ignore[operator]


@pytest.mark.parametrize(("ints", "why"), [
    ([1, 1, 0, 3], "1 texts, the article has 2"),  # another article's
    ([2, 1, 1, 0, 3], "token counts do not add up"),
    ([2, 1, 0, 0, 99], "a token outside its text"),  # past "abc"
    ([2, 1, 0, 2, 2], "a token outside its text"),  # empty
    ([2, 2, 0, 0, 2, 1, 3], "tokens out of order"),  # overlapping
])
def test_a_forged_entry_is_checked_against_its_texts(ints: list[int], why: str) -> None:
    with pytest.raises(Corrupt, match=why):
        decode(_forged(ints), ["abc", ""])


def test_the_cache_says_what_it_could_not_trust_and_tokenizes_it_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = TokenCache(tmp_path / "tokens")
    arts = [(i, article(i)) for i in range(5)]
    with Tokenizer(1) as tok:
        cold = list(tokenized(arts, cache, tok))
    assert (cache.tokenized, cache.cached, cache.corrupt) == (5, 0, 0)
    entries = sorted((tmp_path / "tokens").rglob("*.tok"))
    assert len(entries) == 5 and not list((tmp_path / "tokens").rglob(".tok-*"))
    entries[1].write_bytes(entries[1].read_bytes()[:-8])  # cut short
    entries[3].unlink()
    entries[3].mkdir()  # not a regular file: refused unread
    warm = TokenCache(tmp_path / "tokens")
    with caplog.at_level(logging.WARNING), Tokenizer(1) as tok:
        again = list(tokenized(arts, warm, tok, texts=3))
    assert (warm.tokenized, warm.cached, warm.corrupt, warm.unwritten) == (2, 3, 2, 1)
    assert [t.item for t in again] == list(range(5))
    assert [(t.contexts, t.questions) for t in again] == \
        [(t.contexts, t.questions) for t in cold]
    said = [r.getMessage() for r in caplog.records]
    assert any(str(entries[1]) in m and "checksum" in m and "tokenized again" in m
               for m in said), said
    assert any(str(entries[3]) in m and "not a regular file" in m for m in said), said
    assert "2 articles tokenized, 3 from the token cache (2 of its entries unreadable, " \
           "tokenized again; 1 not kept)" == warm.described()  # the folder in its way
    fixed = TokenCache(tmp_path / "tokens")  # the cut entry was written anew
    assert sum(fixed.get(texts_of(t.sq)) is not None for t in cold) == 4 == fixed.cached
    assert fixed.corrupt == 1  # the folder


def test_a_cache_that_cannot_be_written_is_left(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "tokens").write_text("a file where the folder goes")
    cache = TokenCache(tmp_path / "tokens")
    with caplog.at_level(logging.WARNING), Tokenizer(1) as tok:
        out = list(tokenized([(i, article(i)) for i in range(3)], cache, tok))
    assert [t.contexts[0].words[:2] for t in out] == [["Article", str(i)] for i in range(3)]
    assert (cache.tokenized, cache.unwritten) == (3, 3)
    assert sum("cannot write" in r.getMessage() for r in caplog.records) == 1


def test_the_tokenizer_reads_a_bounded_number_of_jobs_ahead() -> None:
    """Two processes, two jobs each in flight: the jobs are not read to their end (what
    Pool.imap does) before the first comes back, and the order is kept."""
    taken: list[int] = []

    def jobs() -> Iterator[tuple[int, list[str]]]:
        for i in range(40):
            taken.append(i)
            yield i, [f"text {i} of many words", "" if i % 3 else "x"]

    with Tokenizer(2) as tok:
        stream = tok.spans(jobs())
        first, spans = next(stream)
        assert first == 0 and len(taken) <= 2 * 2 + 1
        rest = list(stream)
    assert [job for job, _ in rest] == list(range(1, 40))
    alone = dict(Tokenizer(1).spans(jobs()))
    assert all(np.array_equal(a, b) for job, s in rest for a, b in
               zip(s, alone[job], strict=True))
