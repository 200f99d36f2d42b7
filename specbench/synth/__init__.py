"""A deterministic synthetic benchmark in the style of Spec-Bench, plus a training corpus.

The generator builds a small fictional world (towns, people, rivers, companies, mountains and
lakes, all fixed by a constant seed), a constructed language called Velari, and template
families for the six Spec-Bench subtasks.  Everything is written in a closed, templated
English so that a tiny language model can learn it from one or two million tokens, while the
phenomena that matter for speculative decoding are kept:

* ``summarization`` and ``rag`` answers copy whole sentences of the prompt;
* ``translation`` answers are Velari, whose words never occur in the English prompt;
* ``qa``, ``math_reasoning`` and ``mt_bench`` copy some entities and numbers and are otherwise
  formulaic.

Questions use the official Spec-Bench question schema::

    {"question_id": int, "category": str, "turns": [str, ...], "reference": [str, ...]}

Determinism: only ``random.Random`` instances seeded through SHA-256 are used, never the global
generator, Python's ``hash()``, the clock or the locale.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

from specbench.core.questions import questions_jsonl, write_atomic

__all__ = [
    "CATEGORIES",
    "GENERATOR_VERSION",
    "MT_BENCH_CATEGORIES",
    "SUBTASKS",
    "TARGET_LANGUAGE",
    "conversation_messages",
    "make_corpus",
    "make_questions",
    "translate_to_velari",
    "write_questions",
]

SUBTASKS: tuple[str, ...] = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES: tuple[str, ...] = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)
#: All 13 question categories in benchmark order.
CATEGORIES: tuple[str, ...] = MT_BENCH_CATEGORIES + SUBTASKS[1:]
#: Bump whenever the generated text changes; other modules hash it into cache keys.
GENERATOR_VERSION: str = "synth-1"
#: Name of the constructed target language of the translation subtask.
TARGET_LANGUAGE: str = "Velari"

_QUESTIONS_PER_MT_CATEGORY = 10
_QUESTIONS_PER_SUBTASK = 80
_WORLD_SEED = "specbench-synth-world-1"


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def _derive_seed(*parts: object) -> int:
    """A 64-bit seed from the parts, stable across runs, machines and PYTHONHASHSEED."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def _rng(*parts: object) -> random.Random:
    return random.Random(_derive_seed(*parts))


def _a(word: str) -> str:
    """The word with its indefinite article ("an engineer", "a baker")."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _lower_the(sentence: str) -> str:
    """Lower-case a leading "The " so the sentence can follow a comma."""
    return "t" + sentence[1:] if sentence.startswith("The ") else sentence


def _join(items: list[str]) -> str:
    """"A", "A and B", "A, B and C"."""
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _words(text: str) -> int:
    return len(text.split())


_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)


# ---------------------------------------------------------------------------------------------
# The world
# ---------------------------------------------------------------------------------------------

_REGIONS = ("Havel", "Ostrand", "Kelmar", "Brennet", "Solvaine", "Tarrow")
_TOWN_HEADS = (
    "Ash", "Bel", "Bram", "Carr", "Dun", "Elm", "Fal", "Glen", "Hol", "Kin", "Lan", "Mar", "Nor",
    "Oak", "Pen", "Ros", "Sel", "Tarn", "Wil", "Yar",
)
_TOWN_TAILS = (
    "bury", "by", "dale", "field", "ford", "haven", "holt", "mere", "mouth", "stead", "ton",
    "wick", "more", "gate",
)
_SURNAME_HEADS = (
    "Bar", "Cal", "Dor", "Fen", "Gar", "Hal", "Kes", "Lor", "Mer", "Pel", "Ras", "Sol", "Tor",
    "Val", "Wen", "Ad", "Bren", "Quen",
)
_SURNAME_TAILS = (
    "ber", "den", "dell", "grave", "ley", "man", "mont", "ric", "well", "win", "holm", "sey",
    "rick", "stone",
)
_FIRST_NAMES = (
    "Ada", "Alma", "Bela", "Cora", "Dina", "Edda", "Fern", "Greta", "Hana", "Ida", "Ilsa", "Jora",
    "Kira", "Lena", "Mara", "Mira", "Nela", "Nora", "Petra", "Rosa", "Sana", "Tala", "Una", "Vera",
    "Wren", "Yara", "Zara", "Elin", "Tessa", "Lotte", "Aldo", "Arno", "Bram", "Cass", "Dario",
    "Emil", "Finn", "Gus", "Hugo", "Ivo", "Jonas", "Karl", "Leo", "Milo", "Nico", "Otto", "Pavel",
    "Rafe", "Sven", "Tomas", "Ugo", "Viktor", "Walt", "Yann", "Zeno", "Oren", "Ansel", "Bruno",
    "Caspar", "Dorian",
)
_RIVER_NAMES = (
    "Osk", "Tarla", "Vell", "Ambra", "Risa", "Luvet", "Nera", "Kaska", "Duna", "Sevra", "Imme",
    "Orla", "Bexa", "Halda", "Wyre", "Corra", "Fenna", "Lisk", "Maro", "Ysel", "Tamsa", "Eske",
    "Grava", "Pell",
)
_MOUNTAIN_NAMES = (
    "Kor", "Ardan", "Belth", "Hurn", "Vask", "Tolm", "Sarn", "Grell", "Ulm", "Dreva", "Morn",
    "Iskar", "Fell", "Rauna", "Covar", "Tibbet",
)
_LAKE_NAMES = ("Mirren", "Ostra", "Vey", "Sallow", "Tern", "Hild", "Carrow", "Ymm", "Brisk", "Dolan")
_SEAS = ("the Grey Sea", "the Amber Sea", "the Northern Sea")
_COMPANY_PREFIXES = (
    "Silver", "Golden", "Northern", "Eastern", "Western", "Southern", "Royal", "Bright", "Iron",
    "Green", "Red", "Blue", "Stone", "Oak", "Star", "Crown",
)
_COMPANY_KINDS = (
    ("Glassworks", "glass bottles and windows"),
    ("Mills", "flour and oats"),
    ("Shipyards", "fishing boats"),
    ("Press", "books and newspapers"),
    ("Clockworks", "clocks and watches"),
    ("Brewery", "cider and beer"),
    ("Textiles", "wool cloth"),
    ("Ironworks", "iron tools and nails"),
    ("Potteries", "clay pots and plates"),
    ("Bicycles", "bicycles"),
    ("Lamps", "oil lamps"),
    ("Paper", "paper and cardboard"),
)
_INDUSTRIES = (
    "fishing", "farming", "weaving", "mining", "glassmaking", "shipbuilding", "printing",
    "clockmaking", "pottery", "brewing", "trade", "forestry",
)
_LANDMARKS = (
    "an old stone bridge", "a tall clock tower", "a great library", "a round market hall",
    "a white lighthouse", "a busy harbour", "a castle on a hill", "a large botanical garden",
    "a famous music school", "a red brick cathedral", "a covered market", "a windmill museum",
)
_PROFESSIONS = (
    "baker", "teacher", "doctor", "engineer", "painter", "sailor", "farmer", "architect",
    "musician", "carpenter", "nurse", "merchant", "writer", "fisher", "weaver", "librarian",
    "judge", "chemist", "gardener", "blacksmith",
)


@dataclass
class _Town:
    name: str
    region: str
    founded: int
    population: int
    river: str
    industry: str
    landmark: str
    mayor: str = ""


@dataclass
class _Person:
    name: str
    first: str
    profession: str
    born: int
    hometown: str
    employer: str = ""
    mayor_of: str = ""
    founded_company: str = ""


@dataclass
class _River:
    name: str
    length: int
    source: str
    mouth: str
    towns: list[str] = field(default_factory=list)


@dataclass
class _Company:
    name: str
    product: str
    founded: int
    founder: str
    hq: str
    employees: int


@dataclass
class _Mountain:
    name: str
    height: int
    region: str
    climbed: int
    rivers: list[str] = field(default_factory=list)


@dataclass
class _Lake:
    name: str
    area: int
    region: str
    depth: int
    rivers: list[str] = field(default_factory=list)


@dataclass
class _World:
    towns: dict[str, _Town]
    persons: dict[str, _Person]
    rivers: dict[str, _River]
    companies: dict[str, _Company]
    mountains: dict[str, _Mountain]
    lakes: dict[str, _Lake]
    entities: list[tuple[str, str]]  # (kind, name) in a fixed order

    def get(self, kind: str, name: str) -> object:
        return getattr(self, _KIND_TABLE[kind])[name]


_KIND_TABLE = {
    "town": "towns", "person": "persons", "river": "rivers", "company": "companies",
    "mountain": "mountains", "lake": "lakes",
}


@lru_cache(maxsize=1)
def _world() -> _World:
    """Build the fixed fictional world (independent of the question seed)."""
    rng = _rng(_WORLD_SEED)
    town_names = [h + t for h in _TOWN_HEADS for t in _TOWN_TAILS]
    rng.shuffle(town_names)
    town_names = town_names[:64]
    surnames = [h + t for h in _SURNAME_HEADS for t in _SURNAME_TAILS]
    rng.shuffle(surnames)

    mountains = {}
    for name in _MOUNTAIN_NAMES:
        full = "Mount " + name
        mountains[full] = _Mountain(full, rng.randint(9, 48) * 100 + rng.randint(0, 99), rng.choice(_REGIONS),
                                    rng.randint(1780, 1960))
    lakes = {}
    for name in _LAKE_NAMES:
        full = "Lake " + name
        lakes[full] = _Lake(full, rng.randint(5, 600), rng.choice(_REGIONS), rng.randint(8, 300))

    rivers = {}
    for name in _RIVER_NAMES:
        source = rng.choice(sorted(mountains))
        mouth = rng.choice(sorted(lakes)) if rng.random() < 0.6 else rng.choice(_SEAS)
        rivers[name] = _River(name, rng.randint(4, 120) * 10, source, mouth)
        mountains[source].rivers.append(name)
        if mouth in lakes:
            lakes[mouth].rivers.append(name)

    towns = {}
    river_list = list(rivers)
    for i, name in enumerate(town_names):
        river = river_list[i] if i < len(river_list) else rng.choice(river_list)
        towns[name] = _Town(
            name=name,
            region=rng.choice(_REGIONS),
            founded=rng.randint(1150, 1900),
            population=rng.randint(8, 2500) * 100,
            river=river,
            industry=rng.choice(_INDUSTRIES),
            landmark=rng.choice(_LANDMARKS),
        )
    for name, town in towns.items():
        rivers[town.river].towns.append(name)

    persons: dict[str, _Person] = {}
    surname_pool = surnames[:140]
    while len(persons) < 180:
        first = rng.choice(_FIRST_NAMES)
        full = first + " " + rng.choice(surname_pool)
        if full in persons:
            continue
        persons[full] = _Person(
            name=full, first=first, profession=rng.choice(_PROFESSIONS),
            born=rng.randint(1900, 2000), hometown=rng.choice(town_names),
        )
    person_names = list(persons)
    free = person_names[:]
    rng.shuffle(free)

    for name, town in towns.items():
        mayor = next(p for p in free if persons[p].born <= 1990)
        free.remove(mayor)
        town.mayor = mayor
        persons[mayor].mayor_of = name

    companies = {}
    pairs = [(p, k) for p in _COMPANY_PREFIXES for k in range(len(_COMPANY_KINDS))]
    rng.shuffle(pairs)
    for prefix, k in pairs[:48]:
        kind, product = _COMPANY_KINDS[k]
        founder = free.pop()
        born = persons[founder].born
        founded = min(2022, born + rng.randint(22, 50))
        name = f"{prefix} {kind}"
        companies[name] = _Company(
            name=name, product=product, founded=founded, founder=founder,
            hq=rng.choice(town_names), employees=rng.randint(2, 900) * 10,
        )
        persons[founder].founded_company = name
        persons[founder].employer = name
    company_names = list(companies)
    for p in free:
        if rng.random() < 0.5:
            persons[p].employer = rng.choice(company_names)

    entities: list[tuple[str, str]] = []
    entities += [("town", n) for n in towns]
    entities += [("person", n) for n in persons]
    entities += [("river", n) for n in rivers]
    entities += [("company", n) for n in companies]
    entities += [("mountain", n) for n in mountains]
    entities += [("lake", n) for n in lakes]
    return _World(towns, persons, rivers, companies, mountains, lakes, entities)


def _facts(world: _World, kind: str, name: str) -> list[tuple[str, str]]:
    """The entity's facts as (attribute, sentence), in a fixed order."""
    out: list[tuple[str, str]] = []
    if kind == "town":
        t = world.towns[name]
        out = [
            ("founded", f"The town of {name} was founded in {t.founded}."),
            ("region", f"The town of {name} lies in the province of {t.region}."),
            ("population", f"The town of {name} has a population of {t.population} people."),
            ("river", f"The river {t.river} flows through the town of {name}."),
            ("industry", f"The main industry of the town of {name} is {t.industry}."),
            ("mayor", f"The mayor of the town of {name} is {t.mayor}."),
            ("landmark", f"The town of {name} is known for {t.landmark}."),
        ]
    elif kind == "person":
        p = world.persons[name]
        out = [
            ("profession", f"{name} works as {_a(p.profession)}."),
            ("born", f"{name} was born in {p.born}."),
            ("hometown", f"{name} was born in the town of {p.hometown}."),
        ]
        if p.employer:
            out.append(("employer", f"{name} works for {p.employer}."))
        if p.mayor_of:
            out.append(("mayor_of", f"{name} is the mayor of the town of {p.mayor_of}."))
        if p.founded_company:
            year = world.companies[p.founded_company].founded
            out.append(("founded_company", f"{name} founded {p.founded_company} in {year}."))
    elif kind == "river":
        r = world.rivers[name]
        towns = "the town of " + r.towns[0] if len(r.towns) == 1 else "the towns of " + _join(r.towns)
        out = [
            ("length", f"The river {name} is {r.length} kilometres long."),
            ("source", f"The river {name} rises on {r.source}."),
            ("mouth", f"The river {name} flows into {r.mouth}."),
            ("towns", f"The river {name} flows through {towns}."),
        ]
    elif kind == "company":
        c = world.companies[name]
        out = [
            ("founded", f"{name} was founded in {c.founded}."),
            ("founder", f"{name} was founded by {c.founder}."),
            ("hq", f"{name} has its headquarters in the town of {c.hq}."),
            ("product", f"{name} makes {c.product}."),
            ("employees", f"{name} employs {c.employees} people."),
        ]
    elif kind == "mountain":
        m = world.mountains[name]
        out = [
            ("height", f"{name} is {m.height} metres high."),
            ("region", f"{name} stands in the province of {m.region}."),
            ("climbed", f"{name} was first climbed in {m.climbed}."),
        ]
        if m.rivers:
            word = "river" if len(m.rivers) == 1 else "rivers"
            out.append(("rivers", f"{name} is the source of the {word} {_join(m.rivers)}."))
    elif kind == "lake":
        lake = world.lakes[name]
        out = [
            ("area", f"{name} covers {lake.area} square kilometres."),
            ("region", f"{name} lies in the province of {lake.region}."),
            ("depth", f"{name} is {lake.depth} metres deep."),
        ]
        if lake.rivers:
            if len(lake.rivers) == 1:
                out.append(("rivers", f"The river {lake.rivers[0]} flows into {name}."))
            else:
                out.append(("rivers", f"The rivers {_join(lake.rivers)} flow into {name}."))
    return out


# Question templates per (kind, attribute); "{e}" is the entity as written mid-sentence.
_QA_TEMPLATES: dict[tuple[str, str], tuple[str, ...]] = {
    ("town", "founded"): (
        "In which year was the town of {e} founded?", "When was the town of {e} founded?",
        "What is the founding year of the town of {e}?",
    ),
    ("town", "region"): (
        "In which province does the town of {e} lie?", "Which province is the town of {e} in?",
    ),
    ("town", "population"): (
        "How many people live in the town of {e}?", "What is the population of the town of {e}?",
    ),
    ("town", "river"): (
        "Which river flows through the town of {e}?", "What river runs through the town of {e}?",
    ),
    ("town", "industry"): (
        "What is the main industry of the town of {e}?",
        "Which industry is most important in the town of {e}?",
    ),
    ("town", "mayor"): ("Who is the mayor of the town of {e}?", "Who leads the town of {e} as its mayor?"),
    ("town", "landmark"): ("What is the town of {e} known for?", "What is the town of {e} famous for?"),
    ("person", "profession"): (
        "What does {e} do for a living?", "What is the profession of {e}?", "What job does {e} have?",
    ),
    ("person", "born"): ("In which year was {e} born?", "When was {e} born?"),
    ("person", "hometown"): ("Where was {e} born?", "In which town was {e} born?"),
    ("person", "employer"): ("Which company does {e} work for?", "Who is the employer of {e}?"),
    ("person", "mayor_of"): ("Which town has {e} as its mayor?", "Of which town is {e} the mayor?"),
    ("person", "founded_company"): ("Which company did {e} found?", "What company was founded by {e}?"),
    ("river", "length"): ("How long is the river {e}?", "What is the length of the river {e}?"),
    ("river", "source"): ("Where does the river {e} rise?", "On which mountain does the river {e} begin?"),
    ("river", "mouth"): (
        "Where does the river {e} end?", "Into which lake or sea does the river {e} flow?",
    ),
    ("river", "towns"): (
        "Which towns does the river {e} flow through?", "Through which towns does the river {e} flow?",
    ),
    ("company", "founded"): ("When was {e} founded?", "In which year was {e} founded?"),
    ("company", "founder"): ("Who founded {e}?", "Who was the founder of {e}?"),
    ("company", "hq"): ("Where does {e} have its headquarters?", "In which town is {e} based?"),
    ("company", "product"): ("What does {e} make?", "What does {e} produce?"),
    ("company", "employees"): ("How many people work for {e}?", "How many people does {e} employ?"),
    ("mountain", "height"): ("How high is {e}?", "What is the height of {e}?"),
    ("mountain", "region"): ("In which province does {e} stand?", "Where is {e}?"),
    ("mountain", "climbed"): ("When was {e} first climbed?", "In which year was {e} first climbed?"),
    ("mountain", "rivers"): ("Which rivers rise on {e}?", "Which rivers have their source on {e}?"),
    ("lake", "area"): ("How large is {e}?", "What area does {e} cover?"),
    ("lake", "region"): ("In which province does {e} lie?", "Where is {e}?"),
    ("lake", "depth"): ("How deep is {e}?", "What is the depth of {e}?"),
    ("lake", "rivers"): ("Which rivers flow into {e}?", "What rivers feed {e}?"),
}

_PROFILE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "town": ("Tell me about the town of {e}.", "What do you know about the town of {e}?",
             "Give me a short profile of the town of {e}."),
    "person": ("Tell me about {e}.", "What do you know about {e}?", "Give me a short profile of {e}."),
    "river": ("Tell me about the river {e}.", "What do you know about the river {e}?",
              "Give me a short profile of the river {e}."),
    "company": ("Tell me about {e}.", "What do you know about the company {e}?",
                "Give me a short profile of {e}."),
    "mountain": ("Tell me about {e}.", "What do you know about {e}?", "Give me a short profile of {e}."),
    "lake": ("Tell me about {e}.", "What do you know about {e}?", "Give me a short profile of {e}."),
}


# ---------------------------------------------------------------------------------------------
# Items
# ---------------------------------------------------------------------------------------------

@dataclass
class _Item:
    category: str
    turns: list[str]
    reference: list[str]
    meta: dict[str, object] = field(default_factory=dict)


_Generator = Callable[[random.Random, _World], _Item]


def _pick_person(rng: random.Random, world: _World, **where: str) -> _Person:
    names = [n for n, p in world.persons.items() if all(getattr(p, k) == v for k, v in where.items())]
    if not names:
        names = list(world.persons)
    return world.persons[rng.choice(names)]


def _pick(rng: random.Random, mapping: dict[str, object]) -> str:
    return rng.choice(list(mapping))


def _distinct_firsts(rng: random.Random, n: int) -> list[str]:
    return rng.sample(_FIRST_NAMES, n)


# ---- qa -------------------------------------------------------------------------------------

def _qa_answer(facts: list[tuple[str, str]], attr: str) -> str:
    """The main fact followed by the next two facts of the entity (cyclically)."""
    idx = [a for a, _ in facts].index(attr)
    chosen = [facts[(idx + k) % len(facts)][1] for k in range(min(3, len(facts)))]
    return " ".join(chosen)


_KIND_WEIGHTS = (("town", 30), ("person", 30), ("river", 12), ("company", 18), ("mountain", 5), ("lake", 5))


def _pick_entity(rng: random.Random, world: _World) -> tuple[str, str]:
    """A random (kind, name), first drawing the kind so that every kind is well represented."""
    kind = rng.choices([k for k, _ in _KIND_WEIGHTS], [w for _, w in _KIND_WEIGHTS])[0]
    return kind, _pick(rng, getattr(world, _KIND_TABLE[kind]))


def _gen_qa(rng: random.Random, world: _World) -> _Item:
    kind, name = _pick_entity(rng, world)
    facts = _facts(world, kind, name)
    attr = rng.choice([a for a, _ in facts])
    question = rng.choice(_QA_TEMPLATES[(kind, attr)]).format(e=name)
    return _Item("qa", [question], [_qa_answer(facts, attr)], {"entity": (kind, name), "attr": attr})


def _gen_profile(rng: random.Random, world: _World, kind: str, name: str) -> _Item:
    facts = _facts(world, kind, name)
    question = rng.choice(_PROFILE_TEMPLATES[kind]).format(e=name)
    return _Item("qa", [question], [" ".join(s for _, s in facts)], {"entity": (kind, name)})


# ---- rag ------------------------------------------------------------------------------------

_RAG_INSTRUCTIONS = (
    "Answer the question using the passages below.",
    "Read the passages below and answer the question.",
    "Use the following passages to answer the question at the end.",
)


def _passage_sentences(rng: random.Random, facts: list[tuple[str, str]], must: str | None) -> list[str]:
    n = min(len(facts), rng.randint(3, 4))
    others = [f for f in facts if f[0] != must]
    rng.shuffle(others)
    chosen = others[: n - (1 if must else 0)]
    if must:
        chosen.append(next(f for f in facts if f[0] == must))
    rng.shuffle(chosen)
    return [s for _, s in chosen]


def _gen_rag(rng: random.Random, world: _World) -> _Item:
    kind, name = _pick_entity(rng, world)
    facts = _facts(world, kind, name)
    attr = rng.choice([a for a, _ in facts])
    target_sents = _passage_sentences(rng, facts, attr)
    n_passages = rng.randint(3, 5)
    same_kind = [e for e in world.entities if e[0] == kind and e[1] != name]
    picked: list[tuple[str, str]] = []
    passages: list[list[str]] = []
    # Distractors, mostly about entities of the same kind; add more (up to five passages in all)
    # while the passages are shorter than about a hundred words.
    while len(passages) < n_passages - 1 or (
        len(passages) < 4 and sum(_words(s) for p in passages + [target_sents] for s in p) < 100
    ):
        cand = rng.choice(same_kind if rng.random() < 0.6 else world.entities)
        if cand[1] != name and cand not in picked:
            picked.append(cand)
            passages.append(_passage_sentences(rng, _facts(world, *cand), None))
    target = rng.randint(0, len(passages))
    passages.insert(target, target_sents)
    relevant = dict(facts)[attr]
    pos = target_sents.index(relevant)
    # Quote up to three consecutive sentences of the passage, starting with the relevant one
    # where the passage allows.
    start = max(0, min(pos, len(target_sents) - 3))
    quoted = target_sents[start:start + 3]
    question = rng.choice(_QA_TEMPLATES[(kind, attr)]).format(e=name)
    body = "\n".join(f"Passage {i + 1}: " + " ".join(p) for i, p in enumerate(passages))
    prompt = f"{rng.choice(_RAG_INSTRUCTIONS)}\n\n{body}\n\nQuestion: {question}"
    answer = " ".join([f"According to passage {target + 1}, {_lower_the(quoted[0])}"] + quoted[1:])
    return _Item("rag", [prompt], [answer], {"entity": (kind, name)})


# ---- summarization --------------------------------------------------------------------------

_MASCOTS = ("Rovers", "Falcons", "Bears", "Wolves", "Eagles", "Lions", "Foxes", "Otters")
_WEATHER = ("dry and sunny", "cold and grey", "warm and calm", "windy but bright", "cloudy and mild")
_FOODS = ("fresh bread", "apple cake", "honey", "roasted nuts", "smoked fish", "cheese", "hot soup",
          "plum jam")
_FESTIVALS = (("harvest", "pumpkin"), ("music", "song"), ("flower", "garden"), ("lantern", "lantern"),
              ("bread", "loaf of bread"), ("river", "boat"))
_SUMMARY_INSTRUCTIONS = (
    ("Summarize the following news report in two sentences.", 2),
    ("Write a two-sentence summary of the article below.", 2),
    ("Summarize the following news report in three sentences.", 3),
    ("Give a three-sentence summary of the article below.", 3),
)


def _town_fillers(rng: random.Random, world: _World, town: str) -> list[str]:
    t = world.towns[town]
    other = rng.choice([n for n in world.towns if n != town])
    return [
        f"The town of {town} lies in the province of {t.region} and has a population of {t.population} people.",
        f"The town of {town} was founded in {t.founded} and is known for {t.landmark}.",
        f"The main industry of the town of {town} is {t.industry}.",
        f"Many visitors travelled from the nearby town of {other} to see it for themselves.",
        "Local shops and cafes said that it was one of their busiest days of the year.",
        f"The weather stayed {rng.choice(_WEATHER)} for most of the day.",
        f"Reporters from several newspapers in the province of {t.region} came to write about the event.",
    ]


def _quote_person(rng: random.Random, world: _World, town: str) -> _Person | None:
    local = [p for p in world.persons.values() if p.hometown == town and not p.mayor_of]
    return rng.choice(local) if local else None


def _event_factory(rng: random.Random, world: _World) -> tuple[str, str, str, str, list[str]]:
    cname = _pick(rng, world.companies)
    c = world.companies[cname]
    town = _pick(rng, world.towns)
    t = world.towns[town]
    other = rng.choice([n for n in world.towns if n != town])
    facility = rng.choice(("factory", "workshop", "warehouse"))
    wd = rng.choice(_WEEKDAYS)
    lead = (f"{cname} opened a new {facility} in the town of {town} on {wd}, creating "
            f"{rng.randint(2, 40) * 10} new jobs for local workers.")
    key = f"The new {facility} will make {c.product} for shops across the province of {t.region}."
    last = f"{cname} plans to open a second {facility} in the town of {other} within {rng.randint(2, 6)} years."
    pool = [
        f"Work on the building began in {rng.choice(_MONTHS)} of last year and cost about "
        f"{rng.randint(5, 90) * 10} thousand coins.",
        f"{cname} was founded in {c.founded} by {c.founder} and has its headquarters in the town of {c.hq}.",
        f"\"This is a great day for our town,\" said {t.mayor}, the mayor of the town of {town}.",
        f"The {facility} stands close to the river {t.river}, which flows through the town of {town}.",
        f"Around {rng.randint(3, 60) * 10} people came to watch the opening, and children from the "
        "local school sang a song.",
        f"The first goods from the new {facility} are expected to leave its gates in {rng.choice(_MONTHS)}.",
    ]
    return town, lead, key, last, pool


def _event_festival(rng: random.Random, world: _World) -> tuple[str, str, str, str, list[str]]:
    town = _pick(rng, world.towns)
    t = world.towns[town]
    fest, prize = rng.choice(_FESTIVALS)
    winner = world.persons[_pick(rng, world.persons)]
    lead = (f"The {fest} festival in the town of {town} drew more than {rng.randint(5, 90) * 100} "
            f"visitors on {rng.choice(_WEEKDAYS)}, the largest crowd in its history.")
    key = (f"The prize for the best {prize} went to {winner.name}, {_a(winner.profession)} from the "
           f"town of {winner.hometown}.")
    last = f"The next {fest} festival will take place in {rng.choice(_MONTHS)} next year."
    food1, food2 = rng.sample(_FOODS, 2)
    band_town = rng.choice([n for n in world.towns if n != town])
    pool = [
        f"Stalls along the main street sold {food1} and {food2} from early in the morning.",
        f"A band from the town of {band_town} played in the square until late at night.",
        f"The festival was first held in {rng.randint(max(t.founded, 1800), 2010)} and has taken "
        "place every year since.",
        f"Money from the tickets, about {rng.randint(10, 99) * 100} coins, will go to the town school.",
    ]
    speaker = _quote_person(rng, world, town)
    if speaker:
        pool.append(f"\"We have never seen so many people in our streets,\" said {speaker.name}, "
                    f"who has helped to organize the festival for {rng.randint(2, 20)} years.")
    return town, lead, key, last, pool


def _event_flood(rng: random.Random, world: _World) -> tuple[str, str, str, str, list[str]]:
    town = _pick(rng, world.towns)
    t = world.towns[town]
    r = world.rivers[t.river]
    lead = f"Heavy rain caused the river {r.name} to flood parts of the town of {town} on {rng.choice(_WEEKDAYS)}."
    key = f"About {rng.randint(4, 90) * 10} homes were damaged by the water, but no one was seriously hurt."
    last = (f"Officials say that the repairs will take about {rng.randint(3, 20)} weeks and cost "
            f"{rng.randint(2, 90) * 10} thousand coins.")
    pool = [
        f"The water rose {rng.randint(2, 6)} metres above its normal level in less than {rng.randint(3, 12)} hours.",
        f"Workers from {_pick(rng, world.companies)} helped to move families and animals to higher ground.",
        f"The river {r.name} is {r.length} kilometres long and flows into {r.mouth}.",
        f"The school hall in the town of {town} was opened so that families could spend the night there.",
        f"Farmers along the river lost {rng.randint(5, 80) * 10} tonnes of grain stored in their barns.",
        f"The mayor of the town of {town}, {t.mayor}, thanked the volunteers for their help.",
    ]
    speaker = _quote_person(rng, world, town)
    if speaker:
        pool.append(f"\"I have lived here for {rng.randint(10, 60)} years and I have never seen the water "
                    f"this high,\" said {speaker.name}, {_a(speaker.profession)} from the town of {town}.")
    return town, lead, key, last, pool


def _event_bridge(rng: random.Random, world: _World) -> tuple[str, str, str, str, list[str]]:
    town = _pick(rng, world.towns)
    t = world.towns[town]
    other = rng.choice([n for n in world.towns if n != town])
    lead = (f"A new bridge over the river {t.river} opened in the town of {town} on "
            f"{rng.choice(_WEEKDAYS)} after {rng.randint(8, 40)} months of work.")
    key = (f"The bridge is {rng.randint(4, 40) * 10} metres long and can carry up to "
           f"{rng.randint(10, 90) * 10} carts and cars every hour.")
    last = f"A second bridge is planned for the town of {other}, where work should start next spring."
    pool = [
        f"It cost {rng.randint(10, 99) * 10} thousand coins, paid for by the province of {t.region}.",
        f"Before the bridge opened, people had to travel {rng.randint(3, 30)} kilometres to the next crossing.",
        f"\"Our town is finally joined together,\" said {t.mayor}, the mayor of the town of {town}.",
        f"More than {rng.randint(4, 30) * 10} workers took part in the building of the bridge.",
        f"The old ferry, which carried people across the river {t.river} for many years, will now stop.",
    ]
    d = _pick_person(rng, world, profession=rng.choice(("architect", "engineer")))
    pool.append(f"The bridge was designed by {d.name}, {_a(d.profession)} from the town of {d.hometown}.")
    return town, lead, key, last, pool


def _event_election(rng: random.Random, world: _World) -> tuple[str, str, str, str, list[str]]:
    p = world.persons[_pick(rng, world.persons)]
    town = p.hometown
    t = world.towns[town]
    rival = world.persons[rng.choice([n for n in world.persons if n != p.name])]
    votes = rng.randint(300, 4000)
    promise = rng.choice((
        "build a new school", "repair the old roads", "open a second library",
        f"plant {rng.randint(5, 50) * 10} new trees along the river {t.river}", "lower the price of the bus",
    ))
    lead = f"{p.name} won a seat on the town council of {town} on {rng.choice(_WEEKDAYS)} with {votes} votes."
    key = f"{p.name} promised to {promise} before the end of next year."
    last = f"The new council will meet for the first time on {rng.choice(_WEEKDAYS)} next week."
    seats = rng.randint(5, 12)
    pool = [
        f"{p.name} works as {_a(p.profession)} and was born in the town of {town}.",
        f"In total, {seats + rng.randint(3, 12)} people stood for the {seats} seats on the council.",
        f"About {rng.randint(40, 90)} percent of the voters in the town of {town} took part.",
        f"\"I will work hard for every family in this town,\" said {p.name} after the result was announced.",
        f"The second place went to {rival.name}, who received {votes - rng.randint(10, 250)} votes.",
        f"The mayor of the town of {town}, {t.mayor}, congratulated all the winners.",
    ]
    return town, lead, key, last, pool


def _event_match(rng: random.Random, world: _World) -> tuple[str, str, str, str, list[str]]:
    town, other = rng.sample(list(world.towns), 2)
    m1, m2 = rng.sample(_MASCOTS, 2)
    a = rng.randint(1, 6)
    b = rng.randint(0, a - 1)
    scorer = _pick_person(rng, world, hometown=town)
    coach = _pick_person(rng, world, hometown=town)
    games = rng.randint(4, 12)
    lead = (f"The {town} {m1} beat the {other} {m2} by {a} goals to {b} in front of "
            f"{rng.randint(5, 90) * 100} fans on {rng.choice(_WEEKDAYS)}.")
    key = f"The winning goal was scored by {scorer.name} in minute {rng.randint(5, 89)}."
    last = f"The two teams will meet again in the town of {other} in {rng.choice(_MONTHS)}."
    pool = [
        f"The {town} {m1} have now won {rng.randint(1, games)} of their last {games} games.",
        "Heavy rain made the field wet and slow in the second half.",
        f"\"The players never gave up,\" said {coach.name}, the coach of the {town} {m1}.",
        f"The {other} {m2} had more of the ball but could not find a way through.",
        f"The match was played at the old ground near the river {world.towns[town].river}.",
    ]
    return town, lead, key, last, pool


def _event_discovery(rng: random.Random, world: _World) -> tuple[str, str, str, str, list[str]]:
    mname = _pick(rng, world.mountains)
    m = world.mountains[mname]
    p = world.persons[_pick(rng, world.persons)]
    town = _pick(rng, world.towns)
    lead = (f"A team led by {p.name}, {_a(p.profession)} from the town of {p.hometown}, found the "
            f"remains of an old village near {mname} on {rng.choice(_WEEKDAYS)}.")
    key = (f"The village is thought to be about {rng.randint(8, 60) * 100} years old, older than any "
           f"other known village in the province of {m.region}.")
    last = f"The finds will be shown at the museum in the town of {town} from {rng.choice(_MONTHS)}."
    pool = [
        f"The team found {rng.randint(3, 40)} clay pots, {rng.randint(5, 90)} stone tools and a small silver ring.",
        f"{mname} is {m.height} metres high and stands in the province of {m.region}.",
        f"\"We knew that people lived here long ago, but this is more than we hoped for,\" said {p.name}.",
        f"Work at the site will continue for another {rng.randint(2, 12)} weeks.",
        "The first signs of the village were spotted by a farmer who was looking for a lost sheep.",
        f"Visitors are asked to stay away from the site until the work is done in {rng.choice(_MONTHS)}.",
    ]
    return town, lead, key, last, pool


def _event_library(rng: random.Random, world: _World) -> tuple[str, str, str, str, list[str]]:
    town = _pick(rng, world.towns)
    t = world.towns[town]
    cname = _pick(rng, world.companies)
    lead = (f"A new library opened in the town of {town} on {rng.choice(_WEEKDAYS)} with more than "
            f"{rng.randint(2, 60) * 1000} books on its shelves.")
    key = f"The library was paid for by {cname}, which gave {rng.randint(10, 90) * 10} thousand coins to the project."
    last = (f"The library will be open every day except {rng.choice(_WEEKDAYS)}, from "
            f"{rng.randint(7, 10)} o'clock in the morning.")
    pool = [
        f"\"Every child in our town should be able to read a good book,\" said {t.mayor}, the mayor of "
        f"the town of {town}.",
        f"The building has {rng.randint(2, 4)} floors, a reading room for children and a quiet room for study.",
        f"{cname} has its headquarters in the town of {world.companies[cname].hq} and makes "
        f"{world.companies[cname].product}.",
        f"On the first day, {rng.randint(10, 90) * 10} people signed up for a library card.",
        "The old library, a small room above the post office, will be turned into a cafe.",
    ]
    lib = _pick_person(rng, world, profession="librarian")
    pool.append(f"The new head of the library is {lib.name}, who was born in the town of {lib.hometown}.")
    return town, lead, key, last, pool


_EVENTS = (_event_factory, _event_festival, _event_flood, _event_bridge, _event_election,
           _event_match, _event_discovery, _event_library)


def _gen_summarization(rng: random.Random, world: _World) -> _Item:
    event = rng.choice(_EVENTS)
    town, lead, key, last, pool = event(rng, world)
    pool = pool + _town_fillers(rng, world, town)
    rng.shuffle(pool)
    target = rng.randint(110, 200)
    chosen: list[str] = []
    base = _words(lead) + _words(key) + _words(last)
    for sent in pool:
        total = base + sum(_words(s) for s in chosen)
        if len(chosen) >= 7 or (total >= target and len(chosen) >= 2):
            break
        if total + _words(sent) > 220 and len(chosen) >= 2:
            continue
        chosen.append(sent)
    chosen.insert(rng.randint(0, len(chosen)), key)
    passage = " ".join([lead] + chosen + [last])
    instruction, n_sent = rng.choice(_SUMMARY_INSTRUCTIONS)
    summary = [lead, key] + ([last] if n_sent == 3 else [])
    return _Item("summarization", [f"{instruction}\n\n{passage}"], [" ".join(summary)])


# ---- translation ----------------------------------------------------------------------------

_TR_PEOPLE = (
    ("baker", "bakers"), ("farmer", "farmers"), ("teacher", "teachers"), ("child", "children"),
    ("sailor", "sailors"), ("doctor", "doctors"), ("merchant", "merchants"), ("painter", "painters"),
    ("soldier", "soldiers"), ("student", "students"), ("girl", "girls"), ("boy", "boys"),
    ("woman", "women"), ("man", "men"), ("weaver", "weavers"), ("guard", "guards"),
    ("singer", "singers"), ("hunter", "hunters"),
)
_TR_THINGS = (
    ("basket", "baskets"), ("apple", "apples"), ("book", "books"), ("letter", "letters"),
    ("loaf", "loaves"), ("boat", "boats"), ("lamp", "lamps"), ("stone", "stones"),
    ("flower", "flowers"), ("cup", "cups"), ("key", "keys"), ("coat", "coats"), ("horse", "horses"),
    ("bird", "birds"), ("dog", "dogs"), ("cat", "cats"), ("map", "maps"), ("box", "boxes"),
    ("rope", "ropes"), ("coin", "coins"), ("knife", "knives"), ("chair", "chairs"),
    ("table", "tables"), ("bell", "bells"), ("shoe", "shoes"), ("ring", "rings"), ("cake", "cakes"),
    ("candle", "candles"), ("goat", "goats"), ("blanket", "blankets"),
)
_TR_PLACES = (
    ("market", "markets"), ("river", "rivers"), ("forest", "forests"), ("house", "houses"),
    ("school", "schools"), ("bridge", "bridges"), ("garden", "gardens"), ("harbour", "harbours"),
    ("village", "villages"), ("tower", "towers"), ("mountain", "mountains"), ("field", "fields"),
    ("kitchen", "kitchens"), ("road", "roads"), ("hill", "hills"), ("lake", "lakes"),
    ("well", "wells"), ("gate", "gates"), ("shop", "shops"), ("temple", "temples"),
)
_TR_ADJS = (
    "old", "young", "small", "big", "red", "blue", "green", "white", "black", "heavy", "new",
    "happy", "quiet", "tired", "brave", "cold", "warm", "bright", "dark", "wooden", "golden",
    "tall", "clever", "poor", "rich", "strange", "beautiful", "empty", "full", "little",
)
_TR_VERBS = (
    ("carry", "carries", "carried"), ("find", "finds", "found"), ("buy", "buys", "bought"),
    ("sell", "sells", "sold"), ("bring", "brings", "brought"), ("make", "makes", "made"),
    ("see", "sees", "saw"), ("paint", "paints", "painted"), ("lose", "loses", "lost"),
    ("take", "takes", "took"), ("hold", "holds", "held"), ("open", "opens", "opened"),
    ("clean", "cleans", "cleaned"), ("give", "gives", "gave"), ("hide", "hides", "hid"),
    ("build", "builds", "built"), ("follow", "follows", "followed"), ("watch", "watches", "watched"),
    ("wash", "washes", "washed"), ("draw", "draws", "drew"), ("keep", "keeps", "kept"),
    ("break", "breaks", "broke"), ("fix", "fixes", "fixed"), ("send", "sends", "sent"),
)
# Adjectives of one group are never combined (no "cold warm cats").
_ADJ_GROUP = {a: g for g, members in enumerate((
    ("old", "young", "new"), ("small", "big", "tall", "little"), ("cold", "warm"), ("bright", "dark"),
    ("rich", "poor"), ("empty", "full"), ("red", "blue", "green", "white", "black", "golden"),
    ("happy", "tired", "quiet", "brave", "clever"),
)) for a in members}
_TR_PREPS = ("to", "from", "near", "in", "behind", "under", "across", "into")
_TR_NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_TR_TIMES_PAST = ("yesterday", "last night", "last week", "today")
_TR_TIMES_PRESENT = ("every day", "every morning", "every evening", "today")
_TR_TIMES = ("yesterday", "last night", "last week", "every day", "every morning", "every evening", "today")
_TR_NAMES = _FIRST_NAMES[::2]
_TR_INSTRUCTIONS_ONE = (
    "Translate the following sentence from English into Velari: ",
    "Translate this sentence into Velari: ",
    "Please translate the following English sentence into Velari: ",
)
_TR_INSTRUCTIONS_MANY = (
    "Translate the following text from English into Velari: ",
    "Translate these sentences into Velari: ",
    "Please translate the following English text into Velari: ",
)
_PLURAL_SUFFIX = "en"
_PAST_SUFFIX = "ta"


@dataclass(frozen=True)
class _Lexicon:
    words: dict[str, str]          # English lemma (or time phrase) -> Velari word
    noun_lemma: dict[str, tuple[str, bool]]   # English noun form -> (lemma, plural)
    verb_lemma: dict[str, tuple[str, bool]]   # English verb form -> (lemma, past)
    english: frozenset[str]        # every English word of the grammar


@lru_cache(maxsize=1)
def _lexicon() -> _Lexicon:
    """The Velari lexicon: one invented word for every English word of the grammar."""
    english_items: list[str] = []
    english_items += [sg for sg, _ in _TR_PEOPLE + _TR_THINGS + _TR_PLACES]
    english_items += list(_TR_ADJS) + [v[0] for v in _TR_VERBS] + list(_TR_PREPS)
    english_items += list(_TR_NUMBERS) + list(_TR_TIMES)
    english: set[str] = set()
    for item in english_items:
        english.update(item.split())
    for sg, pl in _TR_PEOPLE + _TR_THINGS + _TR_PLACES:
        english.update((sg, pl))
    for forms in _TR_VERBS:
        english.update(forms)
    for text in _TR_INSTRUCTIONS_ONE + _TR_INSTRUCTIONS_MANY:
        english.update(w.strip(":").lower() for w in text.split())
    english.update({"the", "a", "an"})
    banned = english | {n.lower() for n in _FIRST_NAMES}

    rng = _rng(_WORLD_SEED, "velari")
    onsets = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "th")
    vowels = ("a", "e", "i", "o", "u", "a", "o", "ai", "ou")
    codas = ("n", "r", "l", "s", "k", "m")
    words: dict[str, str] = {}
    used: set[str] = set()
    for item in english_items:
        while True:
            n_syl = rng.choice((2, 2, 3))
            w = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(n_syl))
            if n_syl == 2 or rng.random() < 0.3:
                w += rng.choice(codas)
            if w not in used and w not in banned and w + _PLURAL_SUFFIX not in banned:
                break
        used.add(w)
        words[item] = w
    noun_lemma = {}
    for sg, pl in _TR_PEOPLE + _TR_THINGS + _TR_PLACES:
        noun_lemma[sg] = (sg, False)
        noun_lemma[pl] = (sg, True)
    verb_lemma = {}
    for lemma, third, past in _TR_VERBS:
        verb_lemma[lemma] = (lemma, False)
        verb_lemma[third] = (lemma, False)
        verb_lemma[past] = (lemma, True)
    return _Lexicon(words, noun_lemma, verb_lemma, frozenset(english))


@dataclass(frozen=True)
class _NP:
    noun: str                 # English lemma, or a proper name
    plural: bool = False
    adjs: tuple[str, ...] = ()
    det: str = ""             # "the", "a", a number word, or "" for names
    name: bool = False


def _np_english(np: _NP) -> str:
    if np.name:
        return np.noun
    forms = dict(_TR_PEOPLE + _TR_THINGS + _TR_PLACES)
    noun = forms[np.noun] if np.plural else np.noun
    body = " ".join(np.adjs + (noun,))
    if np.det == "a":
        return _a(body)
    return f"{np.det} {body}"


def _velari_noun(word: str, plural: bool) -> str:
    return word + _PLURAL_SUFFIX if plural else word


def _np_velari(np: _NP, lex: _Lexicon) -> list[str]:
    if np.name:
        return [np.noun]
    out = [_velari_noun(lex.words[np.noun], np.plural)] + [lex.words[a] for a in np.adjs]
    if np.det in _TR_NUMBERS:
        out.append(lex.words[np.det])
    return out


def _random_np(rng: random.Random, nouns: tuple[tuple[str, str], ...], allow_number: bool) -> _NP:
    noun = rng.choice(nouns)[0]
    while True:
        adjs = tuple(rng.sample(_TR_ADJS, rng.choice((0, 1, 1, 1, 2))))
        if len({_ADJ_GROUP.get(a, a) for a in adjs}) == len(adjs):
            break
    roll = rng.random()
    if allow_number and roll < 0.3:
        return _NP(noun, True, adjs, rng.choice(_TR_NUMBERS))
    if roll < 0.45:
        return _NP(noun, True, adjs, "the")
    return _NP(noun, False, adjs, "the" if roll < 0.75 else "a")


def _random_sentence(rng: random.Random) -> tuple[str, str]:
    """One English sentence of the grammar and its Velari translation."""
    lex = _lexicon()
    if rng.random() < 0.35:
        subj = _NP(rng.choice(_TR_NAMES), name=True)
    else:
        subj = _random_np(rng, _TR_PEOPLE, allow_number=True)
    past = rng.random() < 0.5
    lemma, third, past_form = rng.choice(_TR_VERBS)
    verb = past_form if past else (lemma if subj.plural else third)
    obj = _random_np(rng, _TR_THINGS, allow_number=True)
    pp = None
    if rng.random() < 0.7:
        pp = (rng.choice(_TR_PREPS), _random_np(rng, _TR_PLACES, allow_number=False))
    time = None
    if rng.random() < 0.5:
        time = rng.choice(_TR_TIMES_PAST if past else _TR_TIMES_PRESENT)
    english = [_np_english(subj), verb, _np_english(obj)]
    if pp:
        english += [pp[0], _np_english(pp[1])]
    if time:
        english.append(time)
    sentence = _cap(" ".join(english)) + "."
    return sentence, _translate_sentence(sentence, lex)


def _parse_np(tokens: list[str], i: int, lex: _Lexicon) -> tuple[_NP, int]:
    tok = tokens[i]
    low = tok.lower()
    if low not in ("the", "a", "an") and low not in _TR_NUMBERS:
        return _NP(tok, name=True), i + 1
    det = "a" if low == "an" else low
    i += 1
    adjs: list[str] = []
    while tokens[i] in _TR_ADJS:
        adjs.append(tokens[i])
        i += 1
    lemma, plural = lex.noun_lemma[tokens[i]]
    return _NP(lemma, plural, tuple(adjs), det), i + 1


def _translate_sentence(sentence: str, lex: _Lexicon) -> str:
    tokens = sentence.strip().rstrip(".").split()
    time = None
    if len(tokens) >= 2 and " ".join(tokens[-2:]) in _TR_TIMES:
        time, tokens = " ".join(tokens[-2:]), tokens[:-2]
    elif tokens[-1] in _TR_TIMES:
        time, tokens = tokens[-1], tokens[:-1]
    subj, i = _parse_np(tokens, 0, lex)
    lemma, past = lex.verb_lemma[tokens[i]]
    obj, i = _parse_np(tokens, i + 1, lex)
    pp_words: list[str] = []
    if i < len(tokens):
        prep = tokens[i]
        place, i = _parse_np(tokens, i + 1, lex)
        pp_words = _np_velari(place, lex) + [lex.words[prep]]
    if i != len(tokens):
        raise ValueError(f"cannot parse sentence: {sentence!r}")
    out: list[str] = [lex.words[time]] if time else []
    out += _np_velari(subj, lex) + _np_velari(obj, lex) + pp_words
    out.append(lex.words[lemma] + (_PAST_SUFFIX if past else ""))
    return _cap(" ".join(out)) + "."


def translate_to_velari(text: str) -> str:
    """Translate English text of the benchmark's grammar into Velari (deterministic).

    Velari drops articles, puts adjectives and numbers after the noun, uses postpositions,
    is subject-object-verb, starts with the time word, marks the plural with ``-en`` and the past
    tense with ``-ta``; names are kept.  Raises ``ValueError``/``KeyError`` outside the grammar.
    """
    lex = _lexicon()
    parts = [p.strip() for p in text.strip().split(".") if p.strip()]
    return " ".join(_translate_sentence(p + ".", lex) for p in parts)


def _gen_translation(rng: random.Random, world: _World) -> _Item:
    n = rng.choice((1, 2, 2, 3))
    pairs = [_random_sentence(rng) for _ in range(n)]
    english = " ".join(e for e, _ in pairs)
    instruction = rng.choice(_TR_INSTRUCTIONS_ONE if n == 1 else _TR_INSTRUCTIONS_MANY)
    return _Item("translation", [instruction + english], [" ".join(v for _, v in pairs)])


def _gen_translation_reverse(rng: random.Random, world: _World) -> _Item:
    n = rng.choice((1, 1, 2))
    pairs = [_random_sentence(rng) for _ in range(n)]
    velari = " ".join(v for _, v in pairs)
    prompt = rng.choice((
        "Translate the following text from Velari into English: ",
        "What does this Velari text mean in English? ",
    )) + velari
    return _Item("translation", [prompt], [" ".join(e for e, _ in pairs)])


def _gen_lexicon_drill(rng: random.Random, world: _World) -> _Item:
    lex = _lexicon()
    keys = [k for k in lex.words if " " not in k]
    picked = rng.sample(keys, rng.randint(2, 5))
    prompt = "Give the Velari words for " + _join(picked) + "."
    lines = [f"In Velari, {w} is {lex.words[w]}." for w in picked]
    if rng.random() < 0.3:
        noun = rng.choice(_TR_THINGS + _TR_PEOPLE + _TR_PLACES)
        verb = rng.choice(_TR_VERBS)
        prompt += f" Also give the plural of {noun[0]} and the past tense of {verb[0]}."
        lines.append(f"The plural of {noun[0]} is {lex.words[noun[0]] + _PLURAL_SUFFIX}, "
                     f"and the past tense of {verb[0]} is {lex.words[verb[0]] + _PAST_SUFFIX}.")
    return _Item("translation", [prompt], [" ".join(lines)])


# ---- math_reasoning -------------------------------------------------------------------------

_ITEMS = ("apples", "pencils", "marbles", "stickers", "cookies", "eggs", "books", "shells",
          "stamps", "cards", "candles", "buttons")
_PLANTS = ("tomato plants", "rose bushes", "bean plants", "young trees", "pepper plants")


def _m_boxes(rng: random.Random, world: _World) -> tuple[str, str]:
    p, q = _distinct_firsts(rng, 2)
    item = rng.choice(_ITEMS)
    a, b = rng.randint(3, 9), rng.randint(4, 15)
    t = a * b
    c = rng.randint(2, t - 2)
    d = rng.randint(2, 20)
    r = t - c
    question = (f"{p} has {a} boxes of {item}. Each box holds {b} {item}. {p} gives {c} {item} to {q} "
                f"and then buys {d} more. How many {item} does {p} have now?")
    answer = (f"{p} has {a} boxes with {b} {item} in each box, so {p} has {a} * {b} = {t} {item}. "
              f"After giving {c} {item} to {q}, {p} has {t} - {c} = {r} {item}. "
              f"After buying {d} more, {p} has {r} + {d} = {r + d} {item}. The answer is {r + d}.")
    return question, answer


def _m_shopping(rng: random.Random, world: _World) -> tuple[str, str]:
    (p,) = _distinct_firsts(rng, 1)
    i1, i2 = rng.sample(_ITEMS, 2)
    a, p1, b, p2 = rng.randint(2, 9), rng.randint(2, 12), rng.randint(2, 9), rng.randint(2, 12)
    x, y = a * p1, b * p2
    z = x + y
    paid = (z // 50 + 1) * 50
    if paid - z < 2:
        paid += 50
    town = _pick(rng, world.towns)
    question = (f"At the market in the town of {town}, {i1} cost {p1} coins each and {i2} cost {p2} coins "
                f"each. {p} buys {a} {i1} and {b} {i2} and pays with {paid} coins. How many coins "
                f"does {p} get back?")
    answer = (f"The {i1} cost {a} * {p1} = {x} coins. The {i2} cost {b} * {p2} = {y} coins. "
              f"Together {p} spends {x} + {y} = {z} coins. {p} pays with {paid} coins, so {p} gets "
              f"back {paid} - {z} = {paid - z} coins. The answer is {paid - z}.")
    return question, answer


def _m_travel(rng: random.Random, world: _World) -> tuple[str, str]:
    (p,) = _distinct_firsts(rng, 1)
    h1, s1, h2, s2 = rng.randint(2, 5), rng.randint(3, 6), rng.randint(2, 4), rng.randint(10, 20)
    d1, d2 = h1 * s1, h2 * s2
    t1, t2 = rng.sample(list(world.towns), 2)
    question = (f"{p} walks from the town of {t1} for {h1} hours at {s1} kilometres per hour. Then {p} "
                f"rides a bicycle for {h2} hours at {s2} kilometres per hour and reaches the town of "
                f"{t2}. How many kilometres does {p} travel in total?")
    answer = (f"Walking, {p} travels {h1} * {s1} = {d1} kilometres. On the bicycle, {p} travels "
              f"{h2} * {s2} = {d2} kilometres. In total {p} travels {d1} + {d2} = {d1 + d2} kilometres. "
              f"The answer is {d1 + d2}.")
    return question, answer


def _m_sharing(rng: random.Random, world: _World) -> tuple[str, str]:
    (p,) = _distinct_firsts(rng, 1)
    while True:
        a, b, n = rng.randint(2, 6), rng.randint(6, 12), rng.randint(2, 6)
        total = a * b
        c = total % n + n * rng.randint(0, 1)
        if 0 < c < total and (total - c) % n == 0 and (total - c) // n >= 2:
            break
    rest = total - c
    question = (f"{p} bakes {a} trays of cookies with {b} cookies on each tray. {p} eats {c} of them and "
                f"shares the rest equally among {n} friends. How many cookies does each friend get?")
    answer = (f"{p} bakes {a} * {b} = {total} cookies. After eating {c}, there are {total} - {c} = {rest} "
              f"cookies left. Shared among {n} friends, each friend gets {rest} / {n} = {rest // n} "
              f"cookies. The answer is {rest // n}.")
    return question, answer


def _m_savings(rng: random.Random, world: _World) -> tuple[str, str]:
    (p,) = _distinct_firsts(rng, 1)
    a, w = rng.randint(3, 25), rng.randint(3, 12)
    saved = a * w
    cost = rng.randint(2, saved - 1)
    gift = rng.randint(5, 40)
    left = saved - cost
    thing = rng.choice(("a kite", "a book", "a lamp", "a pair of shoes", "a toy boat", "a hat"))
    question = (f"{p} saves {a} coins every week for {w} weeks. Then {p} buys {thing} that costs {cost} "
                f"coins, and later gets {gift} coins as a gift. How many coins does {p} have now?")
    answer = (f"{p} saves {a} * {w} = {saved} coins. After buying {thing}, {p} has {saved} - {cost} = "
              f"{left} coins. With the gift, {p} has {left} + {gift} = {left + gift} coins. "
              f"The answer is {left + gift}.")
    return question, answer


def _m_garden(rng: random.Random, world: _World) -> tuple[str, str]:
    (p,) = _distinct_firsts(rng, 1)
    plant = rng.choice(_PLANTS)
    r, k = rng.randint(3, 12), rng.randint(4, 15)
    t = r * k
    dead = rng.randint(1, t // 3)
    new = rng.randint(2, 20)
    question = (f"{p} plants {r} rows of {plant} with {k} plants in each row. {dead} of the plants die, "
                f"and {p} then plants {new} more. How many plants are in the garden now?")
    answer = (f"{p} plants {r} * {k} = {t} plants. After {dead} die, there are {t} - {dead} = {t - dead} "
              f"plants. After planting {new} more, there are {t - dead} + {new} = {t - dead + new} plants. "
              f"The answer is {t - dead + new}.")
    return question, answer


def _m_bags(rng: random.Random, world: _World) -> tuple[str, str]:
    baker = _pick_person(rng, world, profession="baker")
    while True:
        a, b, d = rng.randint(3, 8), rng.randint(8, 20), rng.randint(3, 8)
        total = a * b
        sold = rng.randint(5, total - d)
        if (total - sold) % d == 0 and (total - sold) // d >= 2:
            break
    rest = total - sold
    question = (f"{baker.name}, a baker in the town of {baker.hometown}, bakes {a} trays of muffins with "
                f"{b} muffins on each tray. {baker.first} sells {sold} muffins and packs the rest into "
                f"bags of {d}. How many bags does {baker.first} fill?")
    answer = (f"{baker.first} bakes {a} * {b} = {total} muffins. After selling {sold}, there are "
              f"{total} - {sold} = {rest} muffins left. With {d} muffins in each bag, {baker.first} fills "
              f"{rest} / {d} = {rest // d} bags. The answer is {rest // d}.")
    return question, answer


def _m_ages(rng: random.Random, world: _World) -> tuple[str, str]:
    p, q, r = _distinct_firsts(rng, 3)
    a, k = rng.randint(4, 15), rng.randint(2, 4)
    b = a * k
    d = rng.randint(1, b - 2)
    c = b - d
    question = (f"{p} is {a} years old. {q} is {k} times as old as {p}. {r} is {d} years younger than {q}. "
                f"What is the sum of their ages?")
    answer = (f"{q} is {a} * {k} = {b} years old. {r} is {b} - {d} = {c} years old. Together {p} and {q} "
              f"are {a} + {b} = {a + b} years old, and adding {r} gives {a + b} + {c} = {a + b + c} years. "
              f"The answer is {a + b + c}.")
    return question, answer


def _m_wages(rng: random.Random, world: _World) -> tuple[str, str]:
    person = _pick_person(rng, world)
    w, h, d = rng.randint(5, 20), rng.randint(3, 9), rng.randint(2, 7)
    day = w * h
    total = day * d
    spent = rng.randint(5, total - 2)
    question = (f"{person.name} works as {_a(person.profession)} and earns {w} coins per hour. "
                f"{person.first} works {h} hours each day for {d} days and then spends {spent} coins "
                f"on food. How many coins does {person.first} have left?")
    answer = (f"In one day {person.first} earns {w} * {h} = {day} coins. In {d} days that is {day} * {d} = "
              f"{total} coins. After spending {spent} coins, {person.first} has {total} - {spent} = "
              f"{total - spent} coins left. The answer is {total - spent}.")
    return question, answer


def _m_reading(rng: random.Random, world: _World) -> tuple[str, str]:
    (p,) = _distinct_firsts(rng, 1)
    while True:
        a, d, b = rng.randint(5, 30), rng.randint(2, 7), rng.randint(5, 25)
        read = a * d
        days = rng.randint(2, 8)
        pages = read + b * days
        if pages <= 600:
            break
    question = (f"A book has {pages} pages. {p} reads {a} pages every day for {d} days. After that, {p} "
                f"reads {b} pages every day. How many more days does {p} need to finish the book?")
    answer = (f"In the first {d} days {p} reads {a} * {d} = {read} pages. That leaves {pages} - {read} = "
              f"{pages - read} pages. At {b} pages a day, {p} needs {pages - read} / {b} = {days} more "
              f"days. The answer is {days}.")
    return question, answer


def _m_bus(rng: random.Random, world: _World) -> tuple[str, str]:
    town = _pick(rng, world.towns)
    a = rng.randint(20, 60)
    off1 = rng.randint(3, a - 5)
    on1 = rng.randint(2, 25)
    n1 = a - off1
    n2 = n1 + on1
    off2 = rng.randint(1, n2 - 2)
    question = (f"A bus leaves the town of {town} with {a} passengers. At the first stop, {off1} people get "
                f"off and {on1} people get on. At the second stop, {off2} people get off. How many "
                f"passengers are on the bus now?")
    answer = (f"After {off1} people get off, there are {a} - {off1} = {n1} passengers. After {on1} people "
              f"get on, there are {n1} + {on1} = {n2} passengers. At the second stop {off2} get off, so "
              f"there are {n2} - {off2} = {n2 - off2} passengers. The answer is {n2 - off2}.")
    return question, answer


def _m_half(rng: random.Random, world: _World) -> tuple[str, str]:
    p, q = _distinct_firsts(rng, 2)
    item = rng.choice(_ITEMS)
    part, word = rng.choice(((2, "half"), (3, "a third"), (4, "a quarter"), (5, "a fifth")))
    n = part * rng.randint(4, 20)
    given = n // part
    left = n - given
    lost = rng.randint(1, left - 2)
    question = (f"{p} has {n} {item}. {p} gives {word} of them to {q} and then loses {lost}. How many "
                f"{item} does {p} have left?")
    answer = (f"{word.capitalize()} of {n} is {n} / {part} = {given}, so {p} gives {given} {item} to {q}. "
              f"That leaves {n} - {given} = {left} {item}. After losing {lost}, {p} has {left} - {lost} = "
              f"{left - lost} {item}. The answer is {left - lost}.")
    return question, answer


_MATH_TEMPLATES = (_m_boxes, _m_shopping, _m_travel, _m_sharing, _m_savings, _m_garden, _m_bags,
                   _m_ages, _m_wages, _m_reading, _m_bus, _m_half)


def _gen_math_reasoning(rng: random.Random, world: _World) -> _Item:
    question, answer = rng.choice(_MATH_TEMPLATES)(rng, world)
    return _Item("math_reasoning", [question], [answer])


# ---- mt_bench: writing ----------------------------------------------------------------------

_LETTER_KINDS = ("note", "letter", "invitation", "message")
_LETTER_CLOSINGS = {
    "invitation": "I would be very happy if you could come with us.",
    "letter": "I hope you are well, and I look forward to seeing you there.",
    "note": "Please let me know soon if you can join us.",
    "message": "Write back when you can and tell me what you think.",
}


def _writing_topic(rng: random.Random, world: _World) -> tuple[str, str]:
    choice = rng.randrange(6)
    town = _pick(rng, world.towns)
    if choice == 0:
        return (f"the harvest fair in the town of {town}",
                "There will be stalls with fresh bread, apples and honey, and a band will play in the square.")
    if choice == 1:
        return (f"the opening of the new library in the town of {town}",
                f"The library has {rng.randint(2, 40) * 1000} books, and the mayor, "
                f"{world.towns[town].mayor}, will give a short speech.")
    if choice == 2:
        river = world.towns[town].river
        return (f"the boat race on the river {river}",
                f"{rng.randint(4, 12)} teams will race from the town of {town} down the river, and the "
                "winners will receive a silver cup.")
    if choice == 3:
        mname = _pick(rng, world.mountains)
        return (f"a walk up {mname}",
                f"{mname} is {world.mountains[mname].height} metres high, so we will start early and "
                "have lunch near the top.")
    if choice == 4:
        cname = _pick(rng, world.companies)
        return (f"a visit to {cname}",
                f"{cname} makes {world.companies[cname].product}, and one of the workers will show us "
                "how everything is made.")
    return (f"the summer concert in the town of {town}",
            f"The music school will play for about {rng.randint(4, 12) * 10} minutes, and afterwards "
            "there will be tea and cake.")


def _gen_writing(rng: random.Random, world: _World) -> _Item:
    to = world.persons[_pick(rng, world.persons)]
    sender = world.persons[_pick(rng, world.persons)]
    kind = rng.choice(_LETTER_KINDS)
    topic, detail = _writing_topic(rng, world)
    when = f"{rng.choice(_WEEKDAYS)}, {rng.randint(1, 28)} {rng.choice(_MONTHS)}"
    hour = rng.randint(2, 8)
    closing = _LETTER_CLOSINGS[kind]

    def letter(h: int) -> str:
        return (f"Dear {to.first},\n\nI am writing to tell you about {topic}. It will take place on {when}, "
                f"and it will start at {h} o'clock. {detail} {closing}\n\nBest wishes,\n{sender.name}")

    t1 = (f"Write a short {kind} to {to.name} about {topic}. The event is on {when}, at {hour} o'clock. "
          f"Sign it as {sender.name}.")
    variant = rng.randrange(3)
    if variant == 0:
        t2 = f"Now rewrite the {kind} to {to.name} as a list of four short points."
        a2 = (f"- What: {topic}.\n- When: {when}, at {hour} o'clock.\n- Details: {detail}\n"
              f"- From: {sender.name}.")
    elif variant == 1:
        t2 = f"Make the {kind} to {to.name} shorter, with no more than two sentences."
        a2 = (f"Dear {to.first}, please join us for {topic} on {when}, at {hour} o'clock. {closing}\n\n"
              f"Best wishes,\n{sender.name}")
    else:
        new_hour = rng.choice([h for h in range(2, 9) if h != hour])
        t2 = f"The time has changed. Rewrite the {kind} to {to.name} so that the event starts at {new_hour} o'clock."
        a2 = letter(new_hour)
    return _Item("writing", [t1, t2], [letter(hour), a2])


# ---- mt_bench: roleplay ---------------------------------------------------------------------

_ACTIVITIES = {
    "baker": ("light the big oven and knead the dough for the first loaves",
              "sell fresh bread and cakes to the people of the town",
              "clean the trays and plan the baking for the next day"),
    "teacher": ("prepare my lessons and read the homework of my pupils",
                "teach reading, writing and numbers to a class of children",
                "mark the exercise books and write notes for the parents"),
    "doctor": ("visit the patients who stayed overnight in the small hospital",
               "see people with fevers, coughs and broken bones",
               "read about new medicines and write down what I have learned"),
    "engineer": ("check the machines and the plans for the new bridge",
                 "measure, calculate and talk with the builders about each part",
                 "draw new designs at my desk by the light of a lamp"),
    "painter": ("mix my colours and stretch a fresh canvas",
                "paint the hills and the river while the light is good",
                "clean my brushes and look at what I have made"),
    "sailor": ("check the ropes and the sails of our ship",
               "steer the ship and watch the sky for bad weather",
               "eat with the crew and tell stories under the stars"),
    "farmer": ("feed the animals and milk the cows",
               "work in the fields, planting and cutting the crops",
               "repair the fences and count the sheep"),
    "architect": ("walk around the building sites to see the progress",
                  "draw plans for houses, schools and halls",
                  "meet the families who want a new home"),
    "musician": ("practise scales on my violin for an hour",
                 "teach music to young students in the town",
                 "play with my friends in the hall in front of an audience"),
    "carpenter": ("sharpen my tools and choose the wood for the day",
                  "build tables, chairs and doors in my workshop",
                  "sweep the floor and oil my tools"),
    "nurse": ("check on every patient and give them their medicine",
              "help the doctors and clean wounds",
              "write reports and speak with the night nurse"),
    "merchant": ("open my shop and count the goods on the shelves",
                 "buy and sell cloth, spices and tools with other traders",
                 "add up the money of the day in my book"),
    "writer": ("drink a cup of tea and read the news",
               "write a few pages of my new book",
               "read my pages again and change what does not sound right"),
    "fisher": ("row out onto the water before the sun rises",
               "pull in the nets and sort the fish",
               "mend the nets and sell the catch at the market"),
    "weaver": ("set up the threads on my loom",
               "weave cloth in bright colours for the market",
               "wash and dye the wool for the next day"),
    "librarian": ("open the library and put the returned books back on the shelves",
                  "help visitors find the books they need",
                  "write new cards for the catalogue"),
    "judge": ("read the papers for the cases of the day",
              "listen to both sides in the court and ask questions",
              "write down my decisions and the reasons for them"),
    "chemist": ("clean the glass tubes in my laboratory",
                "mix and heat substances and measure what happens",
                "write the results in my notebook"),
    "gardener": ("water the plants before the day gets hot",
                 "plant flowers, trim the hedges and pull weeds",
                 "rest on a bench and plan the next flower beds"),
    "blacksmith": ("light the forge and heat the iron",
                   "hammer the hot iron into tools and horseshoes",
                   "cool the tools and tidy the workshop"),
}
_ADVICE = (
    "be patient and practise a little every day",
    "learn from the people who have done the work for many years",
    "take good care of your tools and of your body",
    "always listen carefully before you speak",
    "never stop asking questions",
    "keep a notebook and write down everything you learn",
)


def _gen_roleplay(rng: random.Random, world: _World) -> _Item:
    p = world.persons[_pick(rng, world.persons)]
    town = p.hometown
    t = world.towns[town]
    prof = p.profession
    act = _ACTIVITIES[prof]
    t1 = rng.choice((
        f"Pretend that you are {p.name}, {_a(prof)} from the town of {town}. Describe a normal day in your life.",
        f"You are {p.name}, {_a(prof)} who lives in the town of {town}. A visitor asks you what you do "
        "every day. Answer in character.",
        f"Play the role of {p.name}, {_a(prof)} from the town of {town}, and tell me about your work.",
    ))
    a1 = (f"Good day to you! I am {p.name}, and I work as {_a(prof)} in the town of {town}. Every morning I "
          f"get up at {rng.randint(4, 8)} o'clock and {act[0]}. Later in the day I {act[1]}. In the "
          f"evening I {act[2]}. It is hard work, but I would not change it for anything.")
    if rng.random() < 0.5:
        t2 = f"Stay in character as {p.name}. What do you like most about the town of {town}?"
        a2 = (f"As {_a(prof)}, I love the town of {town}. The river {t.river} flows through it, and our "
              f"town is known for {t.landmark}. The town was founded in {t.founded}, and today "
              f"{t.population} people live here. I cannot imagine living anywhere else.")
    else:
        advice = rng.choice(_ADVICE)
        t2 = (f"Still speaking as {p.name}, give one piece of advice to a young person who wants to "
              f"become {_a(prof)}.")
        a2 = (f"My advice is simple: {advice}. When I started as {_a(prof)} in the town of {town}, I made "
              "many mistakes, but I learned something from each of them. If you love the work, the "
              "hard days will pass and the good days will stay with you.")
    return _Item("roleplay", [t1, t2], [a1, a2])


# ---- mt_bench: reasoning --------------------------------------------------------------------

_RELATIONS = (
    ("taller", "shorter", "tallest", "shortest", "from tallest to shortest"),
    ("older", "younger", "oldest", "youngest", "from oldest to youngest"),
    ("faster", "slower", "fastest", "slowest", "from fastest to slowest"),
    ("heavier", "lighter", "heaviest", "lightest", "from heaviest to lightest"),
)


def _gen_reasoning(rng: random.Random, world: _World) -> _Item:
    more, less, most, least, phrase = rng.choice(_RELATIONS)
    n = rng.choice((3, 4, 4))
    names = _distinct_firsts(rng, n + 1)
    order, newcomer = names[:n], names[n]
    clues = []
    for i in range(n - 1):
        if rng.random() < 0.5:
            clues.append(f"{order[i]} is {more} than {order[i + 1]}")
        else:
            clues.append(f"{order[i + 1]} is {less} than {order[i]}")
    rng.shuffle(clues)
    friends = _join(sorted(order))
    t1 = (f"{friends} are friends. " + ". ".join(clues) + f". Who is the {most}, and who is the {least}? "
          "Explain your reasoning.")
    chain = " ".join(f"{order[i]} is {more} than {order[i + 1]}." for i in range(n - 1))
    a1 = (f"Let us put the clues in order. {chain} So the order {phrase} is {_join(order)}. This means "
          f"that {order[0]} is the {most} and {order[-1]} is the {least}.")
    j = rng.randint(0, n - 2)
    t2 = (f"Now a new friend, {newcomer}, joins {_join(sorted(order))}. {newcomer} is {less} than "
          f"{order[j]} but {more} than {order[j + 1]}. What is the new order?")
    new_order = order[: j + 1] + [newcomer] + order[j + 1:]
    a2 = (f"{newcomer} is {less} than {order[j]} but {more} than {order[j + 1]}, so {newcomer} comes "
          f"between {order[j]} and {order[j + 1]}. The new order {phrase} is {_join(new_order)}. "
          f"{order[0]} is still the {most}, and {order[-1]} is still the {least}.")
    return _Item("reasoning", [t1, t2], [a1, a2])


# ---- mt_bench: math -------------------------------------------------------------------------

def _gen_math(rng: random.Random, world: _World) -> _Item:
    kind = rng.randrange(4)
    town = _pick(rng, world.towns)
    if kind == 0:
        w = rng.randint(3, 20)
        length = rng.randint(w + 1, 40)
        area, x, y = w * length, 2 * w, 2 * length
        k = rng.randint(2, 15)
        l2 = length + k
        t1 = (f"A garden in the town of {town} is a rectangle {w} metres wide and {length} metres long. "
              "What are its area and its perimeter?")
        a1 = (f"The area of a rectangle is its width times its length, so the area is {w} * {length} = {area} "
              f"square metres. For the perimeter we add all four sides. Two widths give 2 * {w} = {x} "
              f"metres and two lengths give 2 * {length} = {y} metres, so the perimeter is {x} + {y} = "
              f"{x + y} metres.")
        t2 = f"What would the area of the garden in the town of {town} be if it were {k} metres longer?"
        a2 = (f"If the garden were {k} metres longer, its length would be {length} + {k} = {l2} metres. "
              f"The new area would be {w} * {l2} = {w * l2} square metres, which is {w * l2} - {area} = "
              f"{w * l2 - area} square metres more than before.")
    elif kind == 1:
        a, x, b = rng.randint(2, 9), rng.randint(2, 15), rng.randint(1, 40)
        c = a * x + b
        t1 = f"Solve the equation {a}x + {b} = {c} for x, and explain each step."
        a1 = (f"We want to find the value of x. First we subtract {b} from both sides, and {c} - {b} = "
              f"{c - b}, so {a}x equals {c - b}. Then we divide both sides by {a}, and {c - b} / {a} = {x}. "
              f"So the solution is x = {x}.")
        t2 = f"Check that x = {x} is correct by putting it back into the equation {a}x + {b} = {c}."
        a2 = (f"We put x = {x} into the left side. First {a} * {x} = {a * x}. Then {a * x} + {b} = {c}. "
              f"This is equal to the right side, {c}, so x = {x} is correct.")
    elif kind == 2:
        n = rng.choice((3, 4, 5))
        while True:
            nums = [rng.randint(5, 60) for _ in range(n)]
            e = rng.randint(5, 60)
            if sum(nums) % n == 0 and (sum(nums) + e) % (n + 1) == 0:
                break
        listing = _join([str(v) for v in nums])
        steps, run = [], nums[0]
        for v in nums[1:]:
            steps.append(f"{run} + {v} = {run + v}.")
            run += v
        total = run
        t1 = f"What is the average of the numbers {listing}?"
        a1 = (f"To find the average, we add the numbers and divide by how many there are. {' '.join(steps)} "
              f"The sum is {total}. There are {n} numbers, so the average is {total} / {n} = {total // n}.")
        t2 = f"What is the new average if the number {e} is added to the list {listing}?"
        a2 = (f"With {e} added, the sum becomes {total} + {e} = {total + e}, and there are {n} + 1 = {n + 1} "
              f"numbers. The new average is {total + e} / {n + 1} = {(total + e) // (n + 1)}.")
    else:
        price = 20 * rng.randint(1, 20)
        pct, pct2 = rng.sample((10, 20, 25, 50), 2)
        thing = rng.choice(("coat", "lamp", "chair", "bicycle", "clock", "rug"))

        def discount(pc: int) -> str:
            raw = price * pc
            d = raw // 100
            return (f"The discount is {pc} percent of {price} coins. First {price} * {pc} = {raw}, and then "
                    f"{raw} / 100 = {d}, so the discount is {d} coins. The {thing} costs {price} - {d} = "
                    f"{price - d} coins after the discount.")

        t1 = (f"A {thing} in a shop in the town of {town} costs {price} coins. The shop gives a discount of "
              f"{pct} percent. How much does the {thing} cost after the discount?")
        a1 = discount(pct)
        t2 = (f"And what would the {thing} in the town of {town} cost if the discount were {pct2} percent "
              f"instead of {pct}?")
        a2 = discount(pct2)
    return _Item("math", [t1, t2], [a1, a2])


# ---- mt_bench: coding -----------------------------------------------------------------------

_CODE_NOUNS = (("prices", "price"), ("weights", "weight"), ("scores", "score"), ("ages", "age"),
               ("lengths", "length"), ("distances", "distance"), ("votes", "vote"), ("heights", "height"))


def _code_task(rng: random.Random, world: _World) -> tuple[str, str, str, Callable[[object], object],
                                                           str, str, Callable[[object], object], str, str]:
    """(fname, description, code, func, change, new code, new func, explanation, args template)."""
    plural, single = rng.choice(_CODE_NOUNS)
    k = rng.randint(2, 20)
    task = rng.randrange(8)
    if task == 0:
        f = f"total_{plural}"
        code = (f"def {f}({plural}):\n    total = 0\n    for value in {plural}:\n        total += value\n"
                "    return total")
        code2 = (f"def {f}({plural}):\n    total = 0\n    for value in {plural}:\n        if value > {k}:\n"
                 "            total += value\n    return total")
        return (f, f"takes a list of {plural} and returns their sum", code, lambda xs: sum(xs),
                f"only adds the {plural} that are greater than {k}", code2,
                lambda xs: sum(x for x in xs if x > k),
                "The function starts with a total of 0, adds every value in the list to it, and returns "
                "the total at the end.", "list")
    if task == 1:
        f = f"largest_{single}"
        code = (f"def {f}({plural}):\n    best = {plural}[0]\n    for value in {plural}:\n"
                "        if value > best:\n            best = value\n    return best")
        code2 = (f"def {f}({plural}):\n    best = {plural}[0]\n    for value in {plural}:\n"
                 "        if value < best:\n            best = value\n    return best")
        return (f, f"returns the largest value in a list of {plural}", code, lambda xs: max(xs),
                f"returns the smallest of the {plural} instead", code2, lambda xs: min(xs),
                "The function remembers the best value seen so far and replaces it whenever it finds a "
                "larger one.", "list")
    if task == 2:
        f = f"count_{plural}_above"
        code = (f"def {f}({plural}, limit):\n    count = 0\n    for value in {plural}:\n"
                "        if value > limit:\n            count += 1\n    return count")
        code2 = (f"def {f}({plural}, limit):\n    count = 0\n    for value in {plural}:\n"
                 "        if value >= limit:\n            count += 1\n    return count")
        return (f, f"counts how many of the {plural} in a list are greater than a limit", code,
                lambda xs: sum(1 for x in xs if x > k),
                f"also counts the {plural} that are equal to the limit", code2,
                lambda xs: sum(1 for x in xs if x >= k),
                "The function goes through the list and adds 1 to the count for every value above the "
                "limit.", f"list, {k}")
    if task == 3:
        f = f"average_{single}"
        code = (f"def {f}({plural}):\n    if not {plural}:\n        return 0\n"
                f"    return sum({plural}) / len({plural})")
        code2 = (f"def {f}({plural}):\n    if not {plural}:\n        return 0\n"
                 f"    return round(sum({plural}) / len({plural}))")
        return (f, f"returns the average of a list of {plural}", code, lambda xs: sum(xs) / len(xs),
                "rounds the result to the nearest whole number", code2,
                lambda xs: round(sum(xs) / len(xs)),
                "The function returns 0 for an empty list; otherwise it divides the sum of the values "
                "by the number of values.", "list")
    if task == 4:
        f = f"even_{plural}"
        code = (f"def {f}({plural}):\n    result = []\n    for value in {plural}:\n"
                "        if value % 2 == 0:\n            result.append(value)\n    return result")
        code2 = (f"def {f}({plural}):\n    result = []\n    for value in {plural}:\n"
                 "        if value % 2 == 1:\n            result.append(value)\n    return result")
        return (f, f"returns only the even numbers from a list of {plural}", code,
                lambda xs: [x for x in xs if x % 2 == 0], f"keeps only the odd {plural} instead", code2,
                lambda xs: [x for x in xs if x % 2 == 1],
                "The function builds a new list and appends every value that leaves no remainder when "
                "divided by 2.", "list")
    if task == 5:
        f = f"scale_{plural}"
        code = (f"def {f}({plural}, factor):\n    result = []\n    for value in {plural}:\n"
                "        result.append(value * factor)\n    return result")
        code2 = (f"def {f}({plural}, factor):\n    result = []\n    for value in {plural}:\n"
                 f"        result.append(value * factor + {k})\n    return result")
        factor = rng.randint(2, 5)
        return (f, f"multiplies every value in a list of {plural} by a factor", code,
                lambda xs: [x * factor for x in xs], f"adds {k} to every value after multiplying it",
                code2, lambda xs: [x * factor + k for x in xs],
                "The function builds a new list in which every value has been multiplied by the factor.",
                f"list, {factor}")
    if task == 6:
        f = "reverse_words"
        code = ("def reverse_words(text):\n    words = text.split()\n    words.reverse()\n"
                "    return \" \".join(words)")
        code2 = ("def reverse_words(text):\n    words = text.split()\n    words.reverse()\n"
                 "    return \" \".join(word.upper() for word in words)")
        return (f, "returns the words of a sentence in reverse order", code,
                lambda s: " ".join(reversed(s.split())), "also writes every word in capital letters",
                code2, lambda s: " ".join(w.upper() for w in reversed(s.split())),
                "The function splits the text into words, reverses the list of words and joins them "
                "again with spaces.", "text")
    f = "count_vowels"
    code = ("def count_vowels(text):\n    count = 0\n    for letter in text.lower():\n"
            "        if letter in \"aeiou\":\n            count += 1\n    return count")
    code2 = ("def count_vowels(text):\n    count = 0\n    for letter in text.lower():\n"
             "        if letter in \"aeiouy\":\n            count += 1\n    return count")
    return (f, "counts the vowels in a piece of text", code,
            lambda s: sum(1 for ch in s.lower() if ch in "aeiou"), "also counts the letter y as a vowel",
            code2, lambda s: sum(1 for ch in s.lower() if ch in "aeiouy"),
            "The function looks at every letter of the text in lower case and adds 1 to the count for "
            "each vowel.", "text")


def _gen_coding(rng: random.Random, world: _World) -> _Item:
    fname, desc, code, func, change, code2, func2, expl, args = _code_task(rng, world)

    def example() -> tuple[str, object, object]:
        if args == "text":
            words = rng.sample(list(world.towns) + list(_FIRST_NAMES), rng.randint(2, 4))
            value: object = " ".join(words)
            call = json.dumps(value)
        else:
            value = [rng.randint(1, 30) for _ in range(rng.randint(3, 6))]
            call = repr(value) + args[4:]
        return call, func(value), func2(value)

    call1, res1, _ = example()
    call2, _, res2 = example()
    t1 = f"Write a Python function called {fname} that {desc}."
    a1 = (f"Here is a Python function that {desc}:\n\n```python\n{code}\n```\n\n{expl} "
          f"For example, {fname}({call1}) returns {json.dumps(res1)}.")
    t2 = f"Change the function {fname} so that it {change}, and tell me what {fname}({call2}) returns then."
    a2 = (f"Here is the changed function. It now {change}:\n\n```python\n{code2}\n```\n\n"
          f"With this change, {fname}({call2}) returns {json.dumps(res2)}.")
    return _Item("coding", [t1, t2], [a1, a2])


# ---- mt_bench: extraction -------------------------------------------------------------------

def _gen_extraction(rng: random.Random, world: _World) -> _Item:
    date = f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1990, 2024)}"
    kind = rng.randrange(3)
    if kind == 0:
        p = world.persons[_pick(rng, world.persons)]
        cname = _pick(rng, world.companies)
        c = world.companies[cname]
        n, price = rng.randint(2, 30), rng.randint(2, 40)
        total = n * price
        record = (f"On {date}, {p.name} bought {n} crates of {c.product} from {cname} in the town of {c.hq}. "
                  f"Each crate cost {price} coins, so the bill came to {total} coins. {p.first} paid in "
                  "cash and took the goods home the same day.")
        fields = {"buyer": p.name, "seller": cname, "town": c.hq, "date": date, "quantity": n,
                  "total": total}
        units = {"quantity": " crates", "total": " coins"}
        sentence = (f"{p.name} bought {n} crates from {cname} in the town of {c.hq} on {date} and paid "
                    f"{total} coins.")
        who = p.name
        ask = "the buyer, the seller, the town, the date, the quantity and the total amount"
    elif kind == 1:
        p = world.persons[_pick(rng, world.persons)]
        q = world.persons[rng.choice([n for n in world.persons if n != p.name])]
        cname = _pick(rng, world.companies)
        c = world.companies[cname]
        hour = rng.randint(8, 17)
        subject = rng.choice(("a new order of goods", "the plans for next year", "the opening of a shop",
                              "the price of wool", "a job at the company"))
        record = (f"{p.name}, {_a(p.profession)} from the town of {p.hometown}, has arranged a meeting with "
                  f"{q.name} at the offices of {cname} in the town of {c.hq}. The meeting will take place "
                  f"on {date} at {hour} o'clock and will be about {subject}.")
        fields = {"organizer": p.name, "guest": q.name, "place": f"{cname}, {c.hq}", "date": date,
                  "time": f"{hour} o'clock", "subject": subject}
        units = {}
        sentence = (f"{p.name} will meet {q.name} at {cname} in the town of {c.hq} on {date} at {hour} "
                    f"o'clock to talk about {subject}.")
        who = p.name
        ask = "the organizer, the guest, the place, the date, the time and the subject"
    else:
        cname = _pick(rng, world.companies)
        c = world.companies[cname]
        dest = rng.choice([n for n in world.towns if n != c.hq])
        p = world.persons[_pick(rng, world.persons)]
        n, weight = rng.randint(5, 90), rng.randint(10, 900) * 10
        record = (f"{cname} shipped {n} crates of {c.product} from the town of {c.hq} to the town of {dest} on "
                  f"{date}. The shipment weighed {weight} kilograms and was checked by {p.name}, who works "
                  f"as {_a(p.profession)}.")
        fields = {"sender": cname, "goods": c.product, "quantity": n, "from": c.hq, "to": dest,
                  "date": date, "weight": weight}
        units = {"quantity": " crates", "weight": " kilograms"}
        sentence = (f"On {date}, {cname} sent {n} crates of {c.product} weighing {weight} kilograms from the "
                    f"town of {c.hq} to the town of {dest}.")
        who = cname
        ask = "the sender, the goods, the quantity, the starting town, the destination, the date and the weight"
    t1 = f"Extract {ask} from the record below. Write one field per line.\n\nRecord: {record}"
    lines = [f"{k}: {v}{units.get(k, '')}" for k, v in fields.items()]
    a1 = "Here are the details from the record:\n" + "\n".join(lines)
    if rng.random() < 0.5:
        t2 = f"Now give the details you extracted about {who} as a JSON object."
        a2 = "```json\n" + json.dumps(fields, indent=2, ensure_ascii=False) + "\n```"
    else:
        t2 = f"Now write the details you extracted about {who} as one sentence."
        a2 = sentence
    return _Item("extraction", [t1, t2], [a1, a2])


# ---- mt_bench: stem -------------------------------------------------------------------------

def _gen_stem(rng: random.Random, world: _World) -> _Item:
    kind = rng.randrange(6)
    town = _pick(rng, world.towns)
    river = world.towns[town].river
    if kind == 0:
        n, k = rng.randint(8, 24), rng.randint(2, 9) * 10
        t1 = f"Explain how the water mill on the river {river} in the town of {town} turns grain into flour."
        a1 = (f"The water mill uses the moving water of the river {river} to do work. The water pushes against "
              f"the {n} wooden paddles of the big wheel and makes the wheel turn. The wheel turns a long shaft, "
              "and the shaft turns a heavy stone inside the mill. The grain falls between this turning stone "
              "and a second stone that stays still, and it is crushed into flour. When the river is high, the "
              f"wheel turns faster and the mill can make about {k} kilograms of flour in one hour.")
        child = (f"The river {river} pushes the big wheel of the mill round and round, like your hand pushing "
                 "a toy. The wheel turns a heavy stone that crushes the grain into soft flour for bread.")
        what_q = f"What would happen to the mill in the town of {town} if the river {river} dried up in a hot summer?"
        what_a = (f"If the river {river} dried up, no water would push the paddles, so the wheel would stop "
                  "turning. Without the turning wheel, the stones would not move and the mill could not make "
                  f"any flour. The people of the town of {town} would have to take their grain to another mill "
                  "until the rain came back.")
        subject = f"the water mill in the town of {town}"
    elif kind == 1:
        cname = _pick(rng, world.companies)
        temp, hours, minutes = rng.randint(12, 16) * 100, rng.randint(6, 30), rng.randint(2, 15)
        t1 = f"Explain how the workers at {cname} make glass from sand."
        a1 = (f"Glass is made from sand, soda and lime. The workers at {cname} mix these materials and heat "
              f"them in a furnace to about {temp} degrees. At this heat the mixture melts into a thick, "
              "glowing liquid. A worker gathers some of the liquid on the end of a long pipe and blows air "
              f"into it to form a bottle or a bowl. The glass is then cooled slowly for {hours} hours so "
              "that it does not crack.")
        child = (f"The workers at {cname} make sand so hot that it melts like honey. Then they blow it into "
                 "shapes and let it cool until it is hard and clear.")
        what_q = (f"What would happen if the workers at {cname} cooled the glass in {minutes} minutes instead "
                  f"of {hours} hours?")
        what_a = (f"If the glass cooled in only {minutes} minutes, the outside would become hard while the "
                  "inside was still hot. The two parts would pull against each other, and many pieces would "
                  f"crack or break. That is why the workers at {cname} cool the glass slowly over {hours} hours.")
        subject = f"how {cname} makes glass"
    elif kind == 2:
        lake = _pick(rng, world.lakes)
        d, k = rng.randint(5, 20), rng.randint(3, 10)
        t1 = f"Why does {lake} freeze in winter while the river {river} often keeps flowing?"
        a1 = (f"{lake} freezes because its water is still. When the air is colder than zero degrees, the top "
              f"layer of the lake loses heat and turns to ice. In the river {river}, the water keeps moving, "
              "and the moving water mixes warmer water from below with the colder water at the top. This "
              f"mixing makes it much harder for ice to form. Only after many very cold days, below about "
              f"minus {d} degrees, does the river {river} freeze as well.")
        child = (f"When it is very cold, the still water of {lake} gets colder and colder until the top turns "
                 f"into ice. The river {river} keeps moving, and moving water does not freeze as easily.")
        what_q = f"What would happen to {lake} if the winter were {k} degrees warmer?"
        what_a = (f"If the winter were {k} degrees warmer, the air above {lake} would often stay above zero "
                  "degrees. The water would lose less heat, so the ice would be thin or would not form at "
                  "all. People who skate or fish on the ice would have to wait for a colder year.")
        subject = f"why {lake} freezes"
    elif kind == 3:
        mname = _pick(rng, world.mountains)
        h = world.mountains[mname].height
        t1 = f"Explain why it rains much more on the western side of {mname} than on the eastern side."
        a1 = (f"Wind carries warm, wet air from the sea toward {mname}. When the air reaches the mountain, it "
              "is pushed upward along the slope. As the air rises, it cools, and cool air cannot hold as "
              "much water. The water forms clouds and falls as rain on the western side. "
              f"{mname} is {h} metres high, so by the time the air crosses the top, most of its water is "
              "gone, and the eastern side stays dry.")
        child = (f"When wet air climbs up {mname}, it gets cold and drops its water as rain on the western "
                 "side. By the time the air comes down the other side, it has no rain left.")
        lower = rng.randint(2, 8) * 100
        what_q = f"What would change if {mname} were only {lower} metres high instead of {h} metres?"
        what_a = (f"If {mname} were only {lower} metres high, the air would not have to rise as far, so it "
                  "would cool less and drop less rain. More of the water would stay in the air and cross to "
                  "the eastern side. The difference between the wet western side and the dry eastern side "
                  "would be much smaller.")
        subject = f"the rain on {mname}"
    elif kind == 4:
        temp, minutes = rng.randint(18, 25) * 10, rng.randint(25, 50)
        t1 = f"Explain why the bread made by the bakers of the town of {town} rises in the oven."
        a1 = ("Bread rises because of yeast, a tiny living thing that is mixed into the dough. The yeast eats "
              "the sugar in the flour and gives off a gas. The gas forms many small bubbles that are trapped "
              f"in the soft dough, so the dough grows bigger. In the oven at about {temp} degrees, the bubbles "
              "grow a little more, and then the heat makes the bread firm. After about "
              f"{minutes} minutes the bread has a brown crust and a light, soft middle.")
        child = ("Tiny living things called yeast eat the sugar in the dough and blow out little bubbles. "
                 "The bubbles make the dough puff up, and the hot oven keeps it big and soft.")
        what_q = f"What would happen if the bakers of the town of {town} forgot to put yeast in the dough?"
        what_a = ("Without yeast, nothing would eat the sugar or make gas, so there would be no bubbles in "
                  "the dough. The bread would stay flat and heavy, more like a thick biscuit than a soft loaf. "
                  f"The bakers of the town of {town} would have to sell it as flat bread.")
        subject = f"the bread of the town of {town}"
    else:
        length, years = rng.randint(3, 20) * 10, rng.randint(2, 9) * 100
        t1 = f"Explain how the stone arch bridge over the river {river} in the town of {town} carries heavy carts."
        a1 = ("An arch bridge carries weight by pushing it outward and down. When a heavy cart rolls onto the "
              "bridge, its weight presses on the stones of the arch. Each stone pushes against the stones next "
              "to it, and the force travels along the curve of the arch to the ends. At each end, strong walls "
              f"of earth and stone push back and hold the arch in place. The bridge in the town of {town} is "
              f"{length} metres long, and its arch has stood for more than {years} years.")
        child = ("The stones of the bridge lean on each other in a curve, like friends holding hands. When a "
                 "cart rolls over, the stones pass the push along to the ground at both ends.")
        what_q = f"What would happen to the bridge in the town of {town} if one of the end walls were taken away?"
        what_a = ("If one end wall were taken away, nothing would push back against that end of the arch. The "
                  "stones would slide outward, the curve would open, and the arch would fall into the river "
                  f"{river}. That is why the end walls of the bridge in the town of {town} are so thick.")
        subject = f"the bridge in the town of {town}"
    if rng.random() < 0.5:
        return _Item("stem", [t1, f"Explain {subject} to a child in two sentences."], [a1, child])
    return _Item("stem", [t1, what_q], [a1, what_a])


# ---- mt_bench: humanities -------------------------------------------------------------------

_EARLY_WORK = ("farming and fishing", "trade along the river", "sheep and wool", "small workshops",
               "the timber of the nearby forests")


def _gen_humanities(rng: random.Random, world: _World) -> _Item:
    if rng.random() < 0.7:
        town = _pick(rng, world.towns)
        t = world.towns[town]
        t1 = rng.choice((f"Write a short essay about the history of the town of {town}.",
                         f"Describe how the town of {town} has changed since it was founded."))
        early = rng.choice(_EARLY_WORK)
        a1 = (f"The town of {town} has a long history. It was founded in {t.founded} in the province of "
              f"{t.region}, on the banks of the river {t.river}. In its early years, most people lived from "
              f"{early}. Over time, {t.industry} became the main industry of the town, and many families found "
              f"work in it. Today the town of {town} has a population of {t.population} people, and its mayor "
              f"is {t.mayor}. Visitors come to see {t.landmark}, which reminds everyone of the town's past. "
              f"The story of {town} shows how a small place can grow by using what it has.")
        variant = rng.randrange(3)
        if variant == 0:
            t2 = f"Summarize your essay about the town of {town} in one sentence."
            a2 = (f"The town of {town}, founded in {t.founded} on the river {t.river}, grew through "
                  f"{t.industry} and is now home to {t.population} people.")
        elif variant == 1:
            other = rng.choice([n for n in world.towns if n != town])
            o = world.towns[other]
            older, newer = (town, other) if t.founded <= o.founded else (other, town)
            y_old, y_new = sorted((t.founded, o.founded))
            big, small = (town, other) if t.population >= o.population else (other, town)
            p_big, p_small = sorted((t.population, o.population), reverse=True)
            t2 = f"Compare the town of {town} with the town of {other}."
            a2 = (f"The town of {older} is the older of the two: it was founded in {y_old}, while the town of "
                  f"{newer} was founded in {y_new}, so the difference is {y_new} - {y_old} = {y_new - y_old} "
                  f"years. The town of {big} is the larger one, with {p_big} people against {p_small}. The main "
                  f"industry of the town of {town} is {t.industry}, and the main industry of the town of "
                  f"{other} is {o.industry}.")
        else:
            t2 = f"How might the town of {town} be different today if the river {t.river} did not flow through it?"
            a2 = (f"Without the river {t.river}, the town of {town} would have had no easy way to move goods "
                  "or to turn mills, so it would probably have grown much more slowly. Fewer people would "
                  f"have settled there, and {t.industry} might never have become so important. The town "
                  "might be a small village today, known only to the people who live nearby.")
        return _Item("humanities", [t1, t2], [a1, a2])
    p = world.persons[_pick(rng, world.persons)]
    t1 = f"Write a short essay about the life and work of {p.name}."
    extra = ""
    if p.founded_company:
        c = world.companies[p.founded_company]
        extra = (f" In {c.founded}, {p.first} founded {c.name}, which makes {c.product} and today employs "
                 f"{c.employees} people.")
    elif p.employer:
        extra = f" {p.first} works for {p.employer}, where the work of every day is shared with many colleagues."
    if p.mayor_of:
        extra += f" {p.first} is also the mayor of the town of {p.mayor_of}."
    a1 = (f"{p.name} was born in the town of {p.hometown} in {p.born}. As a child, {p.first} watched the "
          f"people of the town at work and became curious about their crafts. {p.first} later became "
          f"{_a(p.profession)}, a job that asks for patience, skill and care.{extra} The life of {p.name} "
          "shows how one person can serve a whole town by doing ordinary work well.")
    t2 = f"Summarize your essay about {p.name} in one sentence."
    a2 = f"{p.name}, born in the town of {p.hometown} in {p.born}, works as {_a(p.profession)}."
    return _Item("humanities", [t1, t2], [a1, a2])


# ---------------------------------------------------------------------------------------------
# Benchmark and corpus
# ---------------------------------------------------------------------------------------------

_GENERATORS: dict[str, _Generator] = {
    "writing": _gen_writing,
    "roleplay": _gen_roleplay,
    "reasoning": _gen_reasoning,
    "math": _gen_math,
    "coding": _gen_coding,
    "extraction": _gen_extraction,
    "stem": _gen_stem,
    "humanities": _gen_humanities,
    "translation": _gen_translation,
    "summarization": _gen_summarization,
    "qa": _gen_qa,
    "math_reasoning": _gen_math_reasoning,
    "rag": _gen_rag,
}


@lru_cache(maxsize=8)
def _question_items(seed: int) -> tuple[_Item, ...]:
    world = _world()
    items: list[_Item] = []
    seen: set[str] = set()
    for category in CATEGORIES:
        count = _QUESTIONS_PER_MT_CATEGORY if category in MT_BENCH_CATEGORIES else _QUESTIONS_PER_SUBTASK
        gen = _GENERATORS[category]
        for i in range(count):
            for attempt in range(1000):
                item = gen(_rng("question", seed, category, i, attempt), world)
                if not any(t in seen for t in item.turns):
                    break
            else:  # pragma: no cover - the template spaces are far larger than needed
                raise RuntimeError(f"could not make a unique {category} question")
            seen.update(item.turns)
            items.append(item)
    return tuple(items)


def make_questions(seed: int = 0) -> list[dict]:
    """The 480 benchmark questions, official schema, deterministic for a seed."""
    return [
        {"question_id": i + 1, "category": it.category, "turns": list(it.turns),
         "reference": list(it.reference)}
        for i, it in enumerate(_question_items(seed))
    ]


def write_questions(path: str | os.PathLike, seed: int = 0) -> pathlib.Path:
    """Write make_questions(seed) as JSONL (UTF-8, '\\n' endings) atomically; return the path."""
    return write_atomic(path, questions_jsonl(make_questions(seed)))


def conversation_messages(item: dict) -> list[dict]:
    """[{'role':'user','content':turn1},{'role':'assistant','content':ref1}, ...] for an item."""
    messages: list[dict] = []
    for turn, ref in zip(item["turns"], item["reference"], strict=True):
        messages.append({"role": "user", "content": turn})
        messages.append({"role": "assistant", "content": ref})
    return messages


class _TurnIndex:
    """Answers "does this text contain any of the indexed turns?" quickly and exactly.

    A turn q of k >= 3 whitespace tokens can only occur inside a text c if its interior tokens
    q[1:min(4, k-1)] occur as consecutive whole tokens of c, so those token n-grams are used as
    keys; the exact substring test runs only on the few candidates they select.
    """

    def __init__(self, turns: Iterable[str]) -> None:
        self.short: list[str] = []
        self.keys: dict[int, dict[tuple[str, ...], list[str]]] = {1: {}, 2: {}, 3: {}}
        for q in dict.fromkeys(turns):
            toks = q.split()
            if len(toks) < 3:
                self.short.append(q)
                continue
            key = tuple(toks[1:min(4, len(toks) - 1)])
            self.keys[len(key)].setdefault(key, []).append(q)

    def hits(self, text: str) -> bool:
        if any(q in text for q in self.short):
            return True
        toks = text.split()
        for n, table in self.keys.items():
            if not table:
                continue
            grams = set(zip(*(toks[i:] for i in range(n))))
            for key in grams & table.keys():
                if any(q in text for q in table[key]):
                    return True
        return False


# Relative corpus weights of the families (one in ten conversations is additionally an
# entity profile, cycled over the whole world).
_CORPUS_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("qa", 12.0),
    ("translation", 14.0),
    ("translation_reverse", 2.0),
    ("lexicon", 2.0),
    ("summarization", 12.0),
    ("math_reasoning", 15.0),
    ("rag", 12.0),
    ("writing", 2.6),
    ("roleplay", 2.6),
    ("reasoning", 2.8),
    ("math", 2.8),
    ("coding", 2.6),
    ("extraction", 2.6),
    ("stem", 2.4),
    ("humanities", 2.6),
)
_CORPUS_EXTRA: dict[str, _Generator] = {
    "translation_reverse": _gen_translation_reverse,
    "lexicon": _gen_lexicon_drill,
}
_PROFILE_EVERY = 10


def make_corpus(n_conversations: int, seed: int = 1, question_seed: int = 0) -> Iterator[dict]:
    """Training conversations from the same families, disjoint from make_questions(question_seed).

    Yields dicts with question_id (a running index), category, turns and reference.  Every tenth
    conversation is an entity profile (all facts of one entity, cycling through the world, entities
    asked about by the qa questions first) so that the world facts can be learned; no user turn
    contains (or equals) a user turn of the benchmark questions.
    """
    world = _world()
    items = _question_items(question_seed)
    index = _TurnIndex(t for it in items for t in it.turns)
    asked = [it.meta["entity"] for it in items if it.category == "qa"]
    order = list(dict.fromkeys(asked + world.entities))
    names = [name for name, _ in _CORPUS_WEIGHTS]
    weights = [w for _, w in _CORPUS_WEIGHTS]
    for idx in range(n_conversations):
        for attempt in range(200):
            rng = _rng("corpus", seed, question_seed, idx, attempt)
            if idx % _PROFILE_EVERY == 0 and attempt == 0:
                kind, name = order[(idx // _PROFILE_EVERY) % len(order)]
                item = _gen_profile(rng, world, kind, name)
            else:
                family = rng.choices(names, weights)[0]
                gen = _CORPUS_EXTRA.get(family) or _GENERATORS[family]
                item = gen(rng, world)
            if not any(index.hits(t) for t in item.turns):
                break
        else:  # pragma: no cover - rejections are rare
            raise RuntimeError("could not make a corpus conversation disjoint from the questions")
        yield {"question_id": idx, "category": item.category, "turns": list(item.turns),
               "reference": list(item.reference)}
