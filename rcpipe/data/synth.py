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

FIRST_NAMES: tuple[str, ...] = tuple(
    "Ada Alma Anton Aurelio Beatrix Bruno Camille Casimir Celia Dario Delphine Edvard Elena "
    "Emil Esther Felix Fiona Gustav Helga Hugo Ida Ingrid Ivan Jasper Johanna Jonas Karin "
    "Konrad Lara Leopold Lidia Lorenzo Magnus Margit Marius Matilda Milan Mira Nadia Nils "
    "Odette Oskar Paloma Pavel Petra Quentin Rafael Rosa Rufus Sabine Silas Sofia Stellan "
    "Tamsin Teodor Thea Ulrich Vera Viktor Wanda Werner Xenia Yara Yusuf Zelda Zoran".split()
)
LAST_NAMES: tuple[str, ...] = tuple(
    "Abernathy Albrecht Arkwright Bellamy Blackwood Brandt Castellan Corwin Dalgaard Delacroix "
    "Dunmore Eastwick Ellingham Falkner Fairweather Gallagher Grimaldi Halvorsen Hartigan "
    "Holloway Ingram Iversen Jankowski Kessler Kingsley Lachance Lindqvist Lowell Marchetti "
    "Merriweather Montague Nakamura Novak Oakhurst Okonkwo Pemberton Quarles Radcliffe "
    "Rasmussen Ravensworth Sandoval Selwyn Sorensen Strand Thackeray Tolliver Underhill "
    "Valentin Vasquez Wexley Whitlock Winterbourne Yardley Zeller Zimmermann".split()
)
# Invented place names keep world knowledge (pretrained embeddings) from giving answers away.
_CITY_ROOTS: tuple[str, ...] = tuple(
    onset + coda
    for onset in "Ash Bel Car Dun El Fen Gal Hal Kel Lor Mar Nor Oak Pel Rav Sal Stan Thorn Val "
    "Wex".split()
    for coda in "ford mere wick ton bury haven dale holm stead port gate field".split()
)
# Some multi-word cities ("Port Kelholm") give multi-token "where" answers.
CITIES: tuple[str, ...] = _CITY_ROOTS[:180] + tuple(
    f"{prefix} {root}" for prefix, root in zip("New Port Saint East Fort".split() * 12,
                                               _CITY_ROOTS[180:], strict=True)
)
COUNTRIES: tuple[str, ...] = tuple(
    "Valdoria Ostmark Kessaly Borovia Carandor Estravia Galmoria Hesperon Illyrand Jorvania "
    "Kaldonia Lusitar Marvelia Norvane Orsinia Pelagia Quorvia Rhovenia Samaria Tarvelle "
    "Umbria Veloria Westmark Zandria".split()
)
_ORG_STEMS: tuple[str, ...] = tuple(
    "Northwind Bluewater Silverline Ironbridge Goldcrest Redfern Highgate Oakmont Starling "
    "Copperfield Greenvale Whitestone Blackthorn Amberley Clearwater Lionsgate Foxhollow "
    "Brightmoor Stormhaven Eastgate Larchmont Seabrook Kingsmere Ravenhill Sunderland "
    "Westbrook Harwood Meridian Pinnacle Zenith".split()
)
_ORG_PATTERNS: tuple[str, ...] = (
    "{} Shipping Company", "{} Railway", "the {} Press", "{} Bank", "the {} Institute",
    "{} Motors", "the {} Society", "{} Textiles", "{} Insurance", "the {} Observatory",
    "{} Records", "{} Brewery",
)
ORGANIZATIONS: tuple[str, ...] = tuple(
    p.format(s) for p in _ORG_PATTERNS for s in _ORG_STEMS
) + tuple(f"the University of {c}" for c in _CITY_ROOTS[:40])
STRUCTURES: tuple[str, ...] = tuple(
    f"the {adj} {noun}"
    for adj in "Amber Granite Crescent Copper Ivory Sapphire Willow Harbour Meadow Summit "
    "Lantern Falcon Juniper Obsidian Coral Thistle".split()
    for noun in ("Bridge", "Tower", "Library", "Lighthouse", "Canal", "Stadium", "Cathedral",
                 "Museum", "Dam", "Arcade", "Viaduct", "Opera House")
)
EVENTS: tuple[str, ...] = tuple(
    f"the {c} {kind}" for c in _CITY_ROOTS[::2]
    for kind in ("Marathon", "Trade Fair", "Film Festival", "Peace Conference", "Regatta",
                 "Chess Olympiad", "World Exhibition")
)
PRIZES: tuple[str, ...] = tuple(
    f"the {name} {kind}" for name in LAST_NAMES[::2]
    for kind in ("Prize", "Medal", "Award for Science", "Fellowship", "Gold Cup")
)
MONTHS: tuple[str, ...] = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)
_NAMED_POOLS: dict[str, tuple[str, ...]] = {
    "org": ORGANIZATIONS, "city": CITIES, "country": COUNTRIES, "structure": STRUCTURES,
    "event": EVENTS, "prize": PRIZES,
}
# Kinds that several facts of a paragraph may share, which links the facts into a story and
# makes the same entity appear in several roles (the raw material of unanswerable questions).
_SHARED_KINDS = frozenset({"person", "org", "city", "country"})


@dataclass(frozen=True)
class Relation:
    """One kind of fact.

    ``slots`` maps slot name -> entity kind; ``statements`` are sentence templates naming
    every slot; ``questions`` maps the asked slot -> paraphrased question templates naming
    only other slots (the ones that pick out the fact).
    """

    name: str
    slots: Mapping[str, str]
    statements: tuple[str, ...]
    questions: Mapping[str, tuple[str, ...]]


RELATIONS: tuple[Relation, ...] = (
    Relation("founded", {"founder": "person", "org": "org", "year": "year"}, (
        "{founder} founded {org} in {year}.", "In {year}, {founder} established {org}.",
        "{org} was founded by {founder} in {year}."), {
        "founder": ("Who established {org}?", "Which person set up {org}?",
                    "{org} was started by whom?", "Who was the founder of {org}?"),
        "year": ("In what year was {org} established?", "When did {founder} set up {org}?",
                 "When was {org} created?"),
        "org": ("Which organization did {founder} start?", "What did {founder} create in {year}?"),
    }),
    Relation("headquarters", {"org": "org", "city": "city"}, (
        "The headquarters of {org} is located in {city}.", "{org} is based in {city}.",
        "{org} has its main offices in {city}."), {
        "city": ("Where is {org} headquartered?", "In which city is the head office of {org}?",
                 "Where are the main offices of {org} found?"),
        "org": ("Which organization has its headquarters in {city}?",
                "What company is headquartered in {city}?"),
    }),
    Relation("employees", {"org": "org", "count": "number"}, (
        "{org} employed {count} workers.", "At its peak, {org} had {count} employees.",
        "{org} once had a staff of {count} people."), {
        "count": ("How many people worked for {org}?", "How many employees did {org} have?",
                  "How many workers were on the payroll of {org}?"),
    }),
    Relation("born", {"person": "person", "city": "city", "year": "year"}, (
        "{person} was born in {city} in {year}.",
        "{person} was born in {year} in the city of {city}.",
        "{person}, a native of {city}, was born in {year}."), {
        "city": ("Where was {person} born?", "What is the birthplace of {person}?",
                 "{person} is a native of which city?"),
        "year": ("In what year was {person} born?", "When was {person} born?",
                 "What year did {person} come into the world?"),
        "person": ("Who was born in {city}?", "Which person is a native of {city}?"),
    }),
    Relation("led", {"person": "person", "org": "org", "date": "date"}, (
        "{person} became the director of {org} on {date}.",
        "On {date}, {person} took charge of {org}.",
        "{person} was appointed head of {org} on {date}."), {
        "person": ("Who was named head of {org}?", "Who took over the leadership of {org}?",
                   "Who began running {org} on {date}?"),
        "date": ("When did {person} take charge of {org}?",
                 "On what date was {person} put in charge of {org}?",
                 "When did {person} become leader of {org}?"),
        "org": ("Which organization did {person} start to lead on {date}?",
                "What organization came under the direction of {person}?"),
    }),
    Relation("built", {"org": "org", "structure": "structure", "city": "city", "year": "year"}, (
        "{org} built {structure} in {city} in {year}.",
        "In {year}, {org} completed {structure} in {city}.",
        "{structure} in {city} was constructed by {org} in {year}."), {
        "structure": ("What did {org} construct in {city}?",
                      "Which structure did {org} finish in {year}?"),
        "city": ("Where is {structure} located?", "In which city did {org} erect {structure}?"),
        "org": ("Who built {structure}?", "Which organization constructed {structure}?"),
        "year": ("When was {structure} completed?", "In what year did {org} finish {structure}?"),
    }),
    Relation("event", {"event": "event", "city": "city", "date": "date"}, (
        "{event} took place in {city} on {date}.", "On {date}, {city} hosted {event}.",
        "{event} was held in {city} on {date}."), {
        "city": ("Where was {event} held?", "Which city was the host of {event}?"),
        "date": ("When did {event} happen?", "On what date did {event} take place?"),
        "event": ("What event did {city} host on {date}?", "Which event took place in {city}?"),
    }),
    Relation("population", {"city": "city", "count": "number", "year": "year"}, (
        "In {year}, {city} had a population of {count}.",
        "{city} was home to {count} residents in {year}.",
        "A census in {year} counted {count} inhabitants in {city}."), {
        "count": ("How many people lived in {city} in {year}?",
                  "How many residents did {city} have?", "What was the population of {city}?"),
        "year": ("In what year did {city} have {count} inhabitants?",
                 "When was the population of {city} measured?"),
    }),
    Relation("funding", {"org": "org", "money": "money", "year": "year"}, (
        "{org} raised {money} in {year}.", "In {year}, {org} secured {money} from investors.",
        "{org} received {money} in funding in {year}."), {
        "money": ("How much money did {org} raise?", "How much funding did {org} obtain?",
                  "What amount did {org} collect from investors in {year}?"),
        "year": ("When did {org} raise {money}?", "In what year did {org} get its funding?"),
    }),
    Relation("located", {"city": "city", "country": "country"}, (
        "{city} lies in {country}.", "{city} is a city in {country}.",
        "The town of {city} is part of {country}."), {
        "country": ("In which country is {city}?", "What country does {city} belong to?",
                    "Where is {city} situated?"),
    }),
    Relation("loss", {"org": "org", "money": "money", "year": "year"}, (
        "{org} lost {money} in {year}.", "In {year}, {org} reported losses of {money}.",
        "A bad year in {year} cost {org} {money}."), {
        "money": ("How much did {org} lose?", "What was the size of the loss {org} reported?"),
        "year": ("When did {org} suffer losses of {money}?", "In what year did {org} lose money?"),
    }),
    Relation("moved", {"person": "person", "country": "country", "year": "year"}, (
        "{person} moved to {country} in {year}.", "In {year}, {person} emigrated to {country}.",
        "{person} settled in {country} in {year}."), {
        "country": ("To which country did {person} relocate?", "Where did {person} emigrate?"),
        "year": ("When did {person} relocate to {country}?",
                 "In what year did {person} leave for {country}?"),
        "person": ("Who made a new home in {country}?", "Who emigrated to {country} in {year}?"),
    }),
    Relation("visited", {"person": "person", "structure": "structure", "date": "date"}, (
        "{person} visited {structure} on {date}.", "On {date}, {person} toured {structure}.",
        "{person} paid a visit to {structure} on {date}."), {
        "date": ("When did {person} tour {structure}?",
                 "On what date did {person} go to {structure}?"),
        "structure": ("What did {person} see on {date}?", "Which landmark did {person} tour?"),
        "person": ("Who toured {structure}?", "Which person went to see {structure}?"),
    }),
    Relation("award", {"person": "person", "prize": "prize", "year": "year"}, (
        "{person} won {prize} in {year}.", "In {year}, {person} was awarded {prize}.",
        "{person} received {prize} in {year}."), {
        "prize": ("What honour did {person} receive?",
                  "Which prize was given to {person} in {year}?"),
        "person": ("Who was awarded {prize}?", "Who was the winner of {prize} in {year}?"),
        "year": ("When did {person} get {prize}?", "In what year was {person} honoured?"),
    }),
    Relation("acquired", {"buyer": "org", "target": "org", "year": "year"}, (
        "{buyer} acquired {target} in {year}.", "In {year}, {target} was bought by {buyer}.",
        "{buyer} took over {target} in {year}."), {
        "buyer": ("Which company purchased {target}?", "Who bought {target}?"),
        "target": ("What did {buyer} purchase in {year}?",
                   "Which organization did {buyer} take control of?"),
        "year": ("When did {buyer} buy {target}?", "In what year was {target} sold?"),
    }),
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
        if kind in _SHARED_KINDS and reusable and self.rng.random() < 0.35:
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
                value = rng.choice(_NAMED_POOLS[kind])
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
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(dataset).encode("utf-8")
    if path.name.endswith(".gz"):
        with path.open("wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as gz:
            gz.write(payload)
    else:
        path.write_bytes(payload)
