"""The world the synthetic SQuAD generator (rcpipe.data.synth) draws from: entity pools and
the kinds of fact (``Relation``) with their statement and question templates.

Names are invented (cities, countries, companies) so that world knowledge in pretrained
embeddings cannot give answers away; every pool is a fixed tuple, so a seed fixes the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
NAMED_POOLS: dict[str, tuple[str, ...]] = {
    "org": ORGANIZATIONS, "city": CITIES, "country": COUNTRIES, "structure": STRUCTURES,
    "event": EVENTS, "prize": PRIZES,
}
# Kinds that several facts of a paragraph may share, which links the facts into a story and
# makes the same entity appear in several roles (the raw material of unanswerable questions).
SHARED_KINDS = frozenset({"person", "org", "city", "country"})


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
