"""Seeded generator of SQuAD-format data that a reader model can learn but not shortcut.

A paragraph is a handful of facts (``Relation`` rows of ``RELATIONS``) about random entities
from fixed pools, each stated by one of several sentence templates. Questions ask for one
slot of one fact through paraphrased templates that name the fact's other entities, so the
model has to match the question to the right sentence; every paragraph holds several
entities of each type (years, people, cities ...) so guessing by answer type fails. For
v2.0, unanswerable questions reuse an answerable template with one named entity swapped for
another of the same type (usually one the passage mentions in another role).

Everything comes from one ``random.Random(seed)``: same arguments, byte-identical JSON.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import string
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rcpipe.data.synth_world import (
    FIRST_NAMES,
    LAST_NAMES,
    MONTHS,
    NAMED_POOLS,
    RELATIONS,
    SHARED_KINDS,
    Relation,
)


@cache
def _parse(template: str) -> tuple[tuple[str, str | None], ...]:
    """Split a template once into (literal, slot-or-None) pieces; rendering is hot."""
    return tuple((lit, field) for lit, field, _, _ in string.Formatter().parse(template))


def template_slots(template: str) -> tuple[str, ...]:
    """The slot names a template mentions, in order."""
    return tuple(field for _, field in _parse(template) if field)


def _render(template: str, values: Mapping[str, str]) -> tuple[str, dict[str, int]]:
    """Fill a template; return the text (first letter capitalised) and each slot's offset."""
    parts: list[str] = []
    starts: dict[str, int] = {}
    pos = 0
    for literal, field in _parse(template):
        parts.append(literal)
        pos += len(literal)
        if field:
            starts[field] = pos
            parts.append(values[field])
            pos += len(values[field])
    text = "".join(parts)
    # Capitalising keeps the length, so offsets stay valid ("the University" -> "The ...").
    return text[:1].upper() + text[1:], starts


@dataclass
class _Fact:
    relation: Relation
    values: dict[str, str]
    starts: dict[str, int]  # slot -> char offset in the paragraph's context


class _Picker:
    """Draws a paragraph's entities: shared kinds may repeat, everything else stays unique.

    Years, dates, numbers and amounts are always fresh so each paragraph holds several
    distinct values of a type and "any year" is never the right answer by luck.
    """

    def __init__(self, rng: random.Random, cast: Mapping[str, list[str]]) -> None:
        self.rng = rng
        self.seen: dict[str, dict[str, None]] = {k: dict.fromkeys(v) for k, v in cast.items()}
        self.years: set[int] = set()

    def pick(self, kind: str, avoid: set[str]) -> str:
        seen = self.seen.setdefault(kind, {})
        reusable = [v for v in seen if v not in avoid]
        if kind in SHARED_KINDS and reusable and self.rng.random() < 0.35:
            return self.rng.choice(reusable)
        value = self.fresh(kind)
        seen[value] = None
        return value

    def fresh(self, kind: str) -> str:
        """A value of ``kind`` not yet in this paragraph (nor its article's cast)."""
        rng, seen = self.rng, self.seen.setdefault(kind, {})
        while True:
            if kind in ("year", "date"):
                year = rng.randint(1820, 1999)
                if year in self.years:
                    continue
                self.years.add(year)
                if kind == "year":
                    return str(year)
                return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {year}"
            if kind == "person":
                value = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
            elif kind == "number":
                value = f"{rng.randint(12, 10 ** rng.randint(3, 6)):,}"
            elif kind == "money":
                whole = rng.randint(1, 95)
                tenths = f".{rng.randint(1, 9)}" if whole < 10 else ""
                value = f"${whole}{tenths} million"
            else:
                value = rng.choice(NAMED_POOLS[kind])
            if value not in seen:
                return value


def _new_fact(picker: _Picker, facts: list[_Fact], relation: Relation) -> _Fact | None:
    """A fact of ``relation``; None if it shares a slot value with a fact of that relation.

    Keeping same-relation facts disjoint makes every question's named entities pick out
    exactly one fact, so answers are unique and no two sentences contradict each other.
    """
    values: dict[str, str] = {}
    for slot, kind in relation.slots.items():
        values[slot] = picker.pick(kind, avoid=set(values.values()))
    for other in facts:
        if other.relation is relation and any(other.values[s] == v for s, v in values.items()):
            return None
    return _Fact(relation, values, {})


def _lonely_kind(facts: list[_Fact]) -> str | None:
    """An entity kind the facts mention with one value only (its questions need no reading)."""
    values: dict[str, dict[str, None]] = {}
    for fact in facts:
        for slot, value in fact.values.items():
            values.setdefault(fact.relation.slots[slot], {})[value] = None
    return next((kind for kind, seen in values.items() if len(seen) == 1), None)


def _facts(rng: random.Random, picker: _Picker, sizes: tuple[int, int]) -> list[_Fact]:
    """A paragraph's facts: ``sizes`` (min, max) random ones, then more until every kind
    has a distractor."""
    facts: list[_Fact] = []
    target = rng.randint(*sizes)
    for _ in range(100):  # bounded: picks that keep failing just leave a kind alone
        if len(facts) < target:
            # Repeating a relation ("X raised $4 million ... Y raised $9 million") puts a
            # same-wording distractor next to the answer: only the named entities differ.
            seen = [f.relation for f in facts]
            relation = rng.choice(seen if seen and rng.random() < 0.3 else RELATIONS)
        elif (kind := _lonely_kind(facts)) is not None:
            relation = rng.choice([r for r in RELATIONS if kind in r.slots.values()])
        else:
            break
        fact = _new_fact(picker, facts, relation)
        if fact is not None:
            facts.append(fact)
    return facts


def _matches(facts: list[_Fact], relation: Relation, named: Mapping[str, str]) -> bool:
    return any(f.relation is relation and all(f.values[s] == v for s, v in named.items())
               for f in facts)


def _question(rng: random.Random, picker: _Picker, facts: list[_Fact], context: str,
              impossible: bool) -> tuple[str, dict[str, object]]:
    """One question about the paragraph: its text and the answers/plausible answers block."""
    fact = rng.choice(facts)
    asked = rng.choice(list(fact.relation.questions))
    template = rng.choice(fact.relation.questions[asked])
    named = {s: fact.values[s] for s in template_slots(template)}
    start = fact.starts[asked]
    # Sliced from the context, so a capitalised sentence-initial "The ..." stays exact.
    span = {"text": context[start:start + len(fact.values[asked])], "answer_start": start}
    if not impossible:
        return _render(template, named)[0], {"answers": [span]}
    # Swap one named entity for another of its kind, preferring one the passage mentions in
    # another role: the question still looks answerable and its answer type is present.
    slot = rng.choice(list(named))
    kind = fact.relation.slots[slot]
    in_passage = [v for f in facts for s, v in f.values.items()
                  if f.relation.slots[s] == kind and v != named[slot]]
    rng.shuffle(in_passage)
    for value in [*in_passage, picker.fresh(kind)]:
        swapped = {**named, slot: value}
        if not _matches(facts, fact.relation, swapped):
            break
    return _render(template, swapped)[0], {"answers": [], "plausible_answers": [span]}


def _paragraph(rng: random.Random, cast: Mapping[str, list[str]], n_questions: int,
               v2: bool, unanswerable_fraction: float, id_prefix: str,
               sizes: tuple[int, int]) -> dict[str, object]:
    picker = _Picker(rng, cast)
    facts = _facts(rng, picker, sizes)
    sentences: list[str] = []
    offset = 0
    for fact in facts:
        text, starts = _render(rng.choice(fact.relation.statements), fact.values)
        fact.starts = {slot: offset + start for slot, start in starts.items()}
        sentences.append(text)
        offset += len(text) + 1
    context = " ".join(sentences)
    qas: list[dict[str, object]] = []
    asked: set[str] = set()
    tries = 0
    while len(qas) < n_questions:
        impossible = v2 and rng.random() < unanswerable_fraction
        question, answers = _question(rng, picker, facts, context, impossible)
        tries += 1
        # Prefer distinct questions; give up on that once a paragraph runs out of them.
        if question in asked and tries < 20 * n_questions:
            continue
        asked.add(question)
        qid = hashlib.sha1(f"{id_prefix}:{len(qas)}".encode()).hexdigest()[:24]
        qa: dict[str, object] = {"id": qid, "question": question, "answers": answers["answers"]}
        if v2:
            qa["is_impossible"] = impossible
            if impossible:
                qa["plausible_answers"] = answers["plausible_answers"]
        qas.append(qa)
    return {"context": context, "qas": qas}


def generate(seed: int, articles: int, paragraphs_per_article: int,
             questions_per_paragraph: int, version: str = "1.1",
             unanswerable_fraction: float = 0.33, title_prefix: str = "synth",
             facts_per_paragraph: tuple[int, int] = (5, 7)) -> dict:
    """A whole SQuAD JSON object (v1.1 or v2.0) of synthetic articles.

    ``unanswerable_fraction`` is the expected share of unanswerable questions (v2.0 only);
    ``facts_per_paragraph`` (min, max) sets the passages' length (each fact is a sentence;
    a few more are added so that every entity kind has a same-kind distractor).
    Ids hash (title_prefix, seed, position), so train and dev files never share an id.
    """
    v2 = version.lstrip("v") == "2.0"
    if not v2 and version.lstrip("v") != "1.1":
        raise ValueError(f"version must be 1.1 or 2.0, got {version!r}")
    if not 0.0 <= unanswerable_fraction <= 1.0:
        raise ValueError(f"unanswerable_fraction must be in [0, 1], got {unanswerable_fraction}")
    if min(articles, paragraphs_per_article, questions_per_paragraph) < 0:
        raise ValueError("counts must be non-negative")
    if not 1 <= facts_per_paragraph[0] <= facts_per_paragraph[1]:
        raise ValueError(f"facts_per_paragraph must be 1 <= min <= max, got {facts_per_paragraph}")
    rng = random.Random(seed)
    data: list[dict[str, object]] = []
    for a in range(articles):
        # An article's cast recurs across its paragraphs, as a Wikipedia article's topic does.
        cast_picker = _Picker(rng, {})
        cast = {kind: [cast_picker.fresh(kind)] for kind in ("org", "person", "city")}
        paragraphs = [
            _paragraph(rng, cast, questions_per_paragraph, v2, unanswerable_fraction,
                       f"{title_prefix}:{seed}:{a}:{p}", tuple(facts_per_paragraph))
            for p in range(paragraphs_per_article)
        ]
        topic = cast["org"][0].removeprefix("the ").replace(" ", "_")
        data.append({"title": f"{title_prefix}_{a:05d}_{topic}", "paragraphs": paragraphs})
    return {"version": "v2.0" if v2 else "1.1", "data": data}


def write(dataset: dict, path: Path) -> None:
    """Write ``dataset`` as JSON to ``path`` (gzip when it ends in .gz), creating parents.

    The gzip header's name and mtime are pinned: the same dataset, the same bytes (DVC hashes).
    A file that holds these bytes already is left untouched, so its modification time says
    nothing changed (prepare's fingerprint, a night with the same data).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(dataset).encode("utf-8")
    if path.name.endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)
    if path.is_file() and path.stat().st_size == len(payload) and path.read_bytes() == payload:
        return
    path.write_bytes(payload)
