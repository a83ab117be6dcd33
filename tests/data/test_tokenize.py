"""Tokenization keeps exact character offsets; char spans map to token spans."""

from __future__ import annotations

import random

import pytest

from rcpipe.data import tokenize as tok
from rcpipe.data.tokenize import Tokens, char_span_to_token_span, tokenize

TRICKY = [
    "Hello, world!",
    "The U.S.A. (and Canada) aren't 'small'.",
    "naïve café—“quoted” text…   with  spaces",
    "line one\nline two\n\n\tline three\r\nend",
    "well-known state-of-the-art e-mail",
    'He said "yes"; she said \u2018no\u2019.',
    "  leading and trailing   ",
    "東京 is in 日本. Emoji 😀 and ZWJ 👩‍👩‍👧 here.",
    "$3.5 million, 1,234 people; 50% off (approx.)",
    "a\u00a0b\u2003c",  # no-break space and em space
    "",
    "   \n\t ",
    "x",
]


def _check_offsets(text: str, tokens: Tokens) -> None:
    assert len(tokens.words) == len(tokens.starts) == len(tokens.ends)
    for word, a, b in zip(tokens.words, tokens.starts, tokens.ends, strict=True):
        assert 0 <= a < b <= len(text)
        assert text[a:b] == word  # offsets slice back to the word
        assert word.strip() and not word.isspace()  # whitespace tokens are dropped
    for prev_end, next_start in zip(tokens.ends, tokens.starts[1:], strict=False):
        assert prev_end <= next_start  # in order, never overlapping
    # every non-whitespace character belongs to exactly one token
    covered = set()
    for a, b in zip(tokens.starts, tokens.ends, strict=True):
        covered.update(range(a, b))
    assert {i for i, ch in enumerate(text) if not ch.isspace()} <= covered


def test_offsets_slice_back_on_tricky_text() -> None:
    for text, tokens in zip(TRICKY, tokenize(TRICKY), strict=True):
        _check_offsets(text, tokens)


def test_known_splits() -> None:
    hello, hyphen, blank, spaces = tokenize(
        ["Hello, world!", "well-known", "   \n\t ", "a  b\n\nc"])
    assert hello.words == ["Hello", ",", "world", "!"]
    assert hello.starts == [0, 5, 7, 12] and hello.ends == [5, 6, 12, 13]
    assert hyphen.words == ["well", "-", "known"]
    assert blank == Tokens([], [], [])
    assert spaces.words == ["a", "b", "c"] and spaces.starts == [0, 3, 6]


def test_order_and_count_preserved() -> None:
    texts = [f"text number {i}." for i in range(50)] + [""] * 3
    out = tokenize(texts, chunk=7)  # many chunks, one process
    assert len(out) == len(texts)
    assert [t.words[2] for t in out[:50]] == [str(i) for i in range(50)]
    assert all(t.words == [] for t in out[50:])


def test_two_workers_equal_one(monkeypatch: pytest.MonkeyPatch) -> None:
    contexts = []

    def spy() -> object:
        contexts.append(real())
        return contexts[-1]

    real = tok._context
    monkeypatch.setattr(tok, "_context", spy)
    rng = random.Random(0)
    pool = TRICKY + ["The quick brown fox jumps over the lazy dog."]
    texts = [" ".join(rng.choice(pool) for _ in range(rng.randint(1, 4))) for _ in range(120)]
    one = tokenize(texts, workers=1, chunk=16)
    assert contexts == []  # one worker: no pool
    two = tokenize(texts, workers=2, chunk=16)
    assert len(contexts) == 1  # more texts than a chunk: a real pool of processes
    assert two == one
    for text, tokens in zip(texts, two, strict=True):
        _check_offsets(text, tokens)


# ---------------------------------------------------------------------------- span alignment

SENT = "The cat, a tabby, sat  on the mat."


@pytest.fixture(scope="module")
def toks() -> Tokens:
    return tokenize([SENT])[0]


def test_tokens_of_sentence(toks: Tokens) -> None:
    assert toks.words == ["The", "cat", ",", "a", "tabby", ",", "sat", "on", "the", "mat", "."]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 3, (0, 0)),  # exactly the first token
        (1, 2, (0, 0)),  # inside a token
        (4, 7, (1, 1)),  # "cat"
        (5, 12, (1, 4)),  # from inside "cat" to inside "tabby": the covering tokens
        (4, 16, (1, 4)),  # "cat, a tabby"
        (3, 4, None),  # only the space before "cat"
        (21, 23, None),  # the two spaces between "sat" and "on"
        (20, 24, (6, 7)),  # "t  o": touches both neighbours
        (len(SENT) - 1, len(SENT), (10, 10)),  # the final "."
        (0, len(SENT), (0, 10)),  # everything
        (len(SENT), len(SENT) + 3, None),  # past the end
    ],
)
def test_char_span_to_token_span(toks: Tokens, start: int, end: int,
                                 expected: tuple[int, int] | None) -> None:
    assert char_span_to_token_span(toks, start, end) == expected


def _brute_force(tokens: Tokens, start: int, end: int) -> tuple[int, int] | None:
    hit = [i for i, (a, b) in enumerate(zip(tokens.starts, tokens.ends, strict=True))
           if a < end and b > start]
    return (hit[0], hit[-1]) if hit else None


def test_char_span_to_token_span_matches_brute_force() -> None:
    rng = random.Random(7)
    texts = [t for t in TRICKY if t.strip()] + [SENT]
    for text, tokens in zip(texts, tokenize(texts), strict=True):
        for _ in range(300):
            start = rng.randint(0, len(text) - 1)
            end = rng.randint(start + 1, len(text))
            got = char_span_to_token_span(tokens, start, end)
            assert got == _brute_force(tokens, start, end), (text, start, end)
            if got is not None:  # the token span covers every non-space char of the span
                a, b = tokens.starts[got[0]], tokens.ends[got[1]]
                assert a <= min(i for i in range(start, end) if not text[i].isspace())
                assert b > max(i for i in range(start, end) if not text[i].isspace())


def test_char_span_on_empty_tokens() -> None:
    assert char_span_to_token_span(Tokens([], [], []), 0, 5) is None
