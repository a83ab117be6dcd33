"""The synthetic SQuAD generator: official structure, determinism, and data that is hard to
shortcut (distractors, paraphrases, unanswerables that look answerable) yet consistent."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import string
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from rcpipe.data import synth
from rcpipe.data import synth_world as world


def _alternation(values: Iterable[str]) -> str:
    # Longest first so "Port Kelholm" wins over a shorter name at the same position.
    return "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True))


# An entity recogniser built from the generator's pools; alternatives are tried in order, so
# dates beat their years, amounts beat their numbers and "the University of X" beats X.
_KIND_PATTERNS = {
    "date": rf"(?:{'|'.join(world.MONTHS)}) \d{{1,2}}, \d{{4}}",
    "money": r"\$\d+(?:\.\d)? million",
    "org": _alternation(world.ORGANIZATIONS),
    "structure": _alternation(world.STRUCTURES),
    "event": _alternation(world.EVENTS),
    "prize": _alternation(world.PRIZES),
    "person": rf"(?:{_alternation(world.FIRST_NAMES)}) (?:{_alternation(world.LAST_NAMES)})",
    "city": _alternation(world.CITIES),
    "country": _alternation(world.COUNTRIES),
    "year": r"\d{4}",
    "number": r"\d{1,3}(?:,\d{3})*",
}
_ENTITY = re.compile(
    r"(?<![\w$])(?:" + "|".join(f"(?P<{k}>{p})" for k, p in _KIND_PATTERNS.items()) + r")(?!\w)",
    re.IGNORECASE,
)
_CAPITALISED = re.compile(r"[A-Z][\w']*(?: (?:of |& )?[A-Z][\w']*)*")
_STOP = frozenset("what which when where whom does did have with from that this were into".split())


def _normalize(text: str) -> str:
    """The official SQuAD answer normalisation (lower, no punctuation/articles/extra space)."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _kind(text: str) -> str | None:
    match = _ENTITY.fullmatch(text)
    return match.lastgroup if match else None


def _entities(text: str) -> list[tuple[str, str]]:
    """(kind, text) of every recognised entity, in order."""
    return [(m.lastgroup or "", m.group()) for m in _ENTITY.finditer(text)]


def _qas(dataset: dict) -> Iterator[tuple[str, dict]]:
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield paragraph["context"], qa


def _answerable(dataset: dict) -> list[tuple[str, dict, dict]]:
    """(context, qa, gold span) for each answerable question."""
    return [(c, qa, qa["answers"][0]) for c, qa in _qas(dataset) if qa["answers"]]


def _question_type(question: str) -> str:
    q = question.lower()
    for phrase in ("how many", "how much"):
        if phrase in q:
            return phrase
    words = re.findall(r"\w+", q)
    first = min((words.index(w) for w in ("who", "whom", "what", "when", "where", "which")
                 if w in words), default=None)
    return "other" if first is None else words[first].replace("whom", "who")


@pytest.fixture(scope="module")
def v1() -> dict:
    return synth.generate(seed=7, articles=40, paragraphs_per_article=5, questions_per_paragraph=5)


@pytest.fixture(scope="module")
def v2() -> dict:
    return synth.generate(seed=11, articles=40, paragraphs_per_article=5,
                          questions_per_paragraph=5, version="2.0", unanswerable_fraction=0.33)


def _check_span(context: str, span: dict) -> None:
    assert set(span) == {"text", "answer_start"}
    assert span["text"]
    assert context[span["answer_start"]:span["answer_start"] + len(span["text"])] == span["text"]


def _check_common(dataset: dict) -> None:
    assert list(dataset) == ["version", "data"]
    titles = [article["title"] for article in dataset["data"]]
    assert len(set(titles)) == len(titles) == 40
    ids = [qa["id"] for _, qa in _qas(dataset)]
    assert len(ids) == len(set(ids)) == 40 * 5 * 5
    assert all(re.fullmatch(r"[0-9a-f]{24}", qid) for qid in ids)
    lengths = []
    for article in dataset["data"]:
        assert set(article) == {"title", "paragraphs"} and len(article["paragraphs"]) == 5
        for paragraph in article["paragraphs"]:
            assert set(paragraph) == {"context", "qas"}
            lengths.append(len(re.findall(r"\w+|[^\w\s]", paragraph["context"])))
    # Passages of SQuAD-like length, in tokens.
    assert 30 <= min(lengths) and max(lengths) <= 220
    assert sum(60 <= n <= 150 for n in lengths) / len(lengths) > 0.9
    for _, qa in _qas(dataset):
        assert qa["question"][0].isupper() and qa["question"].endswith("?")


def test_v11_structure(v1: dict) -> None:
    _check_common(v1)
    assert v1["version"] == "1.1"
    for context, qa in _qas(v1):
        assert set(qa) == {"id", "question", "answers"}
        assert len(qa["answers"]) == 1
        _check_span(context, qa["answers"][0])


def test_v20_structure_and_unanswerable_fraction(v2: dict) -> None:
    _check_common(v2)
    assert v2["version"] == "v2.0"
    impossible = 0
    for context, qa in _qas(v2):
        if qa["is_impossible"]:
            impossible += 1
            assert set(qa) == {"id", "question", "answers", "is_impossible", "plausible_answers"}
            assert qa["answers"] == [] and len(qa["plausible_answers"]) == 1
            _check_span(context, qa["plausible_answers"][0])
        else:
            assert set(qa) == {"id", "question", "answers", "is_impossible"}
            assert qa["is_impossible"] is False and len(qa["answers"]) == 1
            _check_span(context, qa["answers"][0])
    assert abs(impossible / 1000 - 0.33) < 0.05


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_unanswerable_fraction_extremes(fraction: float) -> None:
    data = synth.generate(3, 4, 3, 4, version="2.0", unanswerable_fraction=fraction)
    assert {qa["is_impossible"] for _, qa in _qas(data)} == {bool(fraction)}


def test_unanswerables_look_answerable(v2: dict) -> None:
    """Their plausible answer has the type the question asks for, and most name only entities
    that the passage mentions (swapped in from another role), so spotting a missing name is
    not enough to say "no answer"."""
    impossible = [(c, qa) for c, qa in _qas(v2) if qa["is_impossible"]]
    all_named_in_passage = 0
    for context, qa in impossible:
        assert _kind(qa["plausible_answers"][0]["text"]) is not None
        named = [text.lower() for _, text in _entities(qa["question"])]
        assert named, qa["question"]
        all_named_in_passage += all(name in context.lower() for name in named)
    assert all_named_in_passage / len(impossible) > 0.6


def test_same_seed_same_bytes_and_different_seed_different_data() -> None:
    args = dict(articles=5, paragraphs_per_article=3, questions_per_paragraph=4, version="2.0")
    first = json.dumps(synth.generate(seed=5, **args))
    assert json.dumps(synth.generate(seed=5, **args)) == first
    assert json.dumps(synth.generate(seed=6, **args)) != first


def test_same_bytes_across_processes() -> None:
    """No set or hash order leaks into the output: string hashing is salted per process."""
    code = ("import hashlib, json; from rcpipe.data import synth; "
            "print(hashlib.sha256(json.dumps(synth.generate(9, 4, 3, 4, '2.0')).encode())"
            ".hexdigest())")
    digests = {
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                       env={**os.environ, "PYTHONHASHSEED": salt}).stdout.strip()
        for salt in ("1", "2")
    }
    expected = hashlib.sha256(json.dumps(synth.generate(9, 4, 3, 4, "2.0")).encode()).hexdigest()
    assert digests == {expected}


def test_dev_split_is_new_data_from_the_same_distribution(v1: dict) -> None:
    dev = synth.generate(seed=8, articles=40, paragraphs_per_article=5,
                         questions_per_paragraph=5, title_prefix="dev")
    assert not {qa["id"] for _, qa in _qas(dev)} & {qa["id"] for _, qa in _qas(v1)}
    assert all(article["title"].startswith("dev_") for article in dev["data"])
    train_contexts = {p["context"] for a in v1["data"] for p in a["paragraphs"]}
    assert not {p["context"] for a in dev["data"] for p in a["paragraphs"]} & train_contexts
    # Same templates and vocabulary: the mix of question types matches closely.
    train_types = Counter(_question_type(qa["question"]) for _, qa in _qas(v1))
    dev_types = Counter(_question_type(qa["question"]) for _, qa in _qas(dev))
    assert all(abs(train_types[t] - dev_types[t]) < 60 for t in train_types | dev_types)


def test_question_types_all_present(v1: dict) -> None:
    types = Counter(_question_type(qa["question"]) for _, qa in _qas(v1))
    for qtype in ("who", "what", "when", "where", "which", "how many", "how much"):
        assert types[qtype] >= 20, types
    assert types["other"] == 0


def test_relation_table_is_consistent() -> None:
    """Statements name every slot; each asked slot has paraphrases naming other slots only."""
    for relation in world.RELATIONS:
        assert len(relation.statements) >= 2
        for statement in relation.statements:
            assert sorted(synth.template_slots(statement)) == sorted(relation.slots)
        for asked, templates in relation.questions.items():
            assert asked in relation.slots and len(templates) >= 2
            for template in templates:
                named = synth.template_slots(template)
                assert named and asked not in named and set(named) <= set(relation.slots)


def test_questions_are_paraphrased(v1: dict) -> None:
    """Most questions use a content word that their passage does not (synonyms, rewording)."""
    paraphrased = 0
    questions = list(_qas(v1))
    for context, qa in questions:
        content = {w for w in re.findall(r"[a-z]+", qa["question"]) if len(w) > 3} - _STOP
        paraphrased += bool(content - set(re.findall(r"[a-z]+", context)))
    assert paraphrased / len(questions) > 0.6


def test_passages_hold_same_type_distractors(v1: dict) -> None:
    answerable = _answerable(v1)
    typed = with_distractor = 0
    for context, _, gold in answerable:
        kind = _kind(gold["text"])
        if kind is None:
            continue
        typed += 1
        same_kind = {text.lower() for k, text in _entities(context) if k == kind}
        with_distractor += len(same_kind) >= 2
    assert typed / len(answerable) > 0.95  # the recogniser knows nearly every answer
    assert with_distractor / typed > 0.85


def test_multi_token_answers(v1: dict) -> None:
    golds = [gold["text"] for _, _, gold in _answerable(v1)]
    multi = [text for text in golds if len(text.split()) >= 2]
    assert len(multi) / len(golds) > 0.4
    kinds = Counter(_kind(text) for text in multi)
    assert kinds["person"] and kinds["date"] and kinds["org"] and kinds["money"]


def _exact_match(pairs: list[tuple[str | None, str]]) -> float:
    return sum(p is not None and _normalize(p) == _normalize(g) for p, g in pairs) / len(pairs)


def test_first_entity_baselines_fail(v1: dict) -> None:
    """Guessing the first entity of the answer's own type (told by an oracle), or the first
    capitalised span, is far from the truth."""
    typed: list[tuple[str | None, str]] = []
    capitalised: list[tuple[str | None, str]] = []
    for context, _, gold in _answerable(v1):
        kind = _kind(gold["text"])
        first = next((text for k, text in _entities(context) if k == kind), None)
        typed.append((first, gold["text"]))
        match = _CAPITALISED.search(context)
        capitalised.append((match.group() if match else None, gold["text"]))
    assert _exact_match(typed) < 0.6
    assert _exact_match(capitalised) < 0.2


def test_reading_the_right_sentence_answers(v1: dict) -> None:
    """The data is learnable: pick the sentence sharing most entities with the question, then
    its first entity of the answer's type that the question does not name. A model must learn
    these steps from text alone, but consistent data lets this oracle-typed reader win."""
    pairs: list[tuple[str | None, str]] = []
    for context, qa, gold in _answerable(v1):
        kind = _kind(gold["text"])
        named = {text.lower() for _, text in _entities(qa["question"])}
        sentences = re.split(r"(?<=\.) (?=[A-Z])", context)
        best = max(sentences, key=lambda s: sum(n in s.lower() for n in named))
        guess = next((text for k, text in _entities(best)
                      if k == kind and text.lower() not in named), None)
        pairs.append((guess, gold["text"]))
    assert _exact_match(pairs) > 0.85


@pytest.mark.parametrize("name", ["train.json", "train.json.gz"])
def test_write_round_trips(tmp_path: Path, v2: dict, name: str) -> None:
    path = tmp_path / "nested" / "dir" / name
    synth.write(v2, path)
    raw = path.read_bytes()
    if name.endswith(".gz"):
        assert raw[:2] == b"\x1f\x8b"
        raw = gzip.decompress(raw)
    assert json.loads(raw) == v2


def test_write_is_byte_identical_for_gzip(tmp_path: Path, v1: dict) -> None:
    synth.write(v1, tmp_path / "a.json.gz")
    synth.write(v1, tmp_path / "b.json.gz")
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="version"):
        synth.generate(1, 1, 1, 1, version="3.0")
    with pytest.raises(ValueError, match="unanswerable_fraction"):
        synth.generate(1, 1, 1, 1, version="2.0", unanswerable_fraction=1.5)
    with pytest.raises(ValueError, match="facts_per_paragraph"):
        synth.generate(1, 1, 1, 1, facts_per_paragraph=(3, 2))


def test_facts_per_paragraph_sets_the_passage_length() -> None:
    def mean_sentences(facts: tuple[int, int]) -> float:
        doc = synth.generate(5, 10, 3, 2, facts_per_paragraph=facts)
        contexts = [p["context"] for a in doc["data"] for p in a["paragraphs"]]
        return sum(c.count(". ") + 1 for c in contexts) / len(contexts)

    short, long = mean_sentences((2, 2)), mean_sentences((8, 8))
    assert short + 3 < long
    assert mean_sentences((2, 2)) >= 2  # distractor facts are still added


@pytest.mark.parametrize("name", ["train.json", "train.json.gz"])
def test_writing_the_same_dataset_again_leaves_the_file_untouched(tmp_path: Path,
                                                                  name: str) -> None:
    """A night that synthesises the same data must not look like new data to prepare,
    whose fingerprint reads the file's size and modification time."""
    path = tmp_path / name
    synth.write(synth.generate(3, 2, 2, 2), path)
    os.utime(path, ns=(1, 1))
    synth.write(synth.generate(3, 2, 2, 2), path)
    assert path.stat().st_mtime_ns == 1
    synth.write(synth.generate(4, 2, 2, 2), path)  # other data: written
    assert path.stat().st_mtime_ns != 1
    opened = gzip.open(path) if name.endswith(".gz") else path.open("rb")
    with opened as f:
        assert json.loads(f.read()) == synth.generate(4, 2, 2, 2)
