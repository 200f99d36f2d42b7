"""The fixed fictional world: towns, people, rivers, companies, mountains and lakes, and their facts.

The world is built once from `WORLD_SEED` (it does not depend on the question seed). Every
generator draws its entities from it, and `facts` states what the world knows about each one in
the very sentences that qa answers, rag passages and the corpus's entity profiles use.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

from specbench.synth.english import counted, with_article
from specbench.synth.seeds import WORLD_SEED, seeded_rng

REGIONS = ("Havel", "Ostrand", "Kelmar", "Brennet", "Solvaine", "Tarrow")
FIRST_NAMES = (
    "Ada", "Alma", "Bela", "Cora", "Dina", "Edda", "Fern", "Greta", "Hana", "Ida", "Ilsa", "Jora",
    "Kira", "Lena", "Mara", "Mira", "Nela", "Nora", "Petra", "Rosa", "Sana", "Tala", "Una", "Vera",
    "Wren", "Yara", "Zara", "Elin", "Tessa", "Lotte", "Aldo", "Arno", "Bram", "Cass", "Dario",
    "Emil", "Finn", "Gus", "Hugo", "Ivo", "Jonas", "Karl", "Leo", "Milo", "Nico", "Otto", "Pavel",
    "Rafe", "Sven", "Tomas", "Ugo", "Viktor", "Walt", "Yann", "Zeno", "Oren", "Ansel", "Bruno",
    "Caspar", "Dorian",
)
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
class Town:
    name: str
    region: str
    founded: int
    population: int
    river: str
    industry: str
    landmark: str
    mayor: str = ""


@dataclass
class Person:
    name: str
    first: str
    profession: str
    born: int
    hometown: str
    employer: str = ""
    mayor_of: str = ""
    founded_company: str = ""


@dataclass
class River:
    name: str
    length: int
    source: str
    mouth: str
    towns: list[str] = field(default_factory=list)


@dataclass
class Company:
    name: str
    product: str
    founded: int
    founder: str
    hq: str
    employees: int


@dataclass
class Mountain:
    name: str
    height: int
    region: str
    climbed: int
    rivers: list[str] = field(default_factory=list)


@dataclass
class Lake:
    name: str
    area: int
    region: str
    depth: int
    rivers: list[str] = field(default_factory=list)


#: entity kind -> the World attribute that holds that kind
_KIND_TABLE = {
    "town": "towns", "person": "persons", "river": "rivers", "company": "companies",
    "mountain": "mountains", "lake": "lakes",
}


@dataclass
class World:
    towns: dict[str, Town]
    persons: dict[str, Person]
    rivers: dict[str, River]
    companies: dict[str, Company]
    mountains: dict[str, Mountain]
    lakes: dict[str, Lake]
    entities: list[tuple[str, str]]  # (kind, name) in a fixed order

    def of_kind(self, kind: str) -> dict:
        """The entities of a kind ("town", "person", ...) by name."""
        return getattr(self, _KIND_TABLE[kind])

    def get(self, kind: str, name: str) -> object:
        return self.of_kind(kind)[name]


# ---- building the world (the order of the random draws fixes the world: keep it) --------------

def _mountains_and_lakes(rng: random.Random) -> tuple[dict[str, Mountain], dict[str, Lake]]:
    mountains = {}
    for name in _MOUNTAIN_NAMES:
        full = "Mount " + name
        mountains[full] = Mountain(full, rng.randint(9, 48) * 100 + rng.randint(0, 99), rng.choice(REGIONS),
                                   rng.randint(1780, 1960))
    lakes = {}
    for name in _LAKE_NAMES:
        full = "Lake " + name
        lakes[full] = Lake(full, rng.randint(5, 600), rng.choice(REGIONS), rng.randint(8, 300))
    return mountains, lakes


def _rivers(rng: random.Random, mountains: dict[str, Mountain], lakes: dict[str, Lake]) -> dict[str, River]:
    """Each river rises on a mountain and ends in a lake or a sea."""
    rivers = {}
    for name in _RIVER_NAMES:
        source = rng.choice(sorted(mountains))
        mouth = rng.choice(sorted(lakes)) if rng.random() < 0.6 else rng.choice(_SEAS)
        rivers[name] = River(name, rng.randint(4, 120) * 10, source, mouth)
        mountains[source].rivers.append(name)
        if mouth in lakes:
            lakes[mouth].rivers.append(name)
    return rivers


def _towns(rng: random.Random, names: list[str], rivers: dict[str, River]) -> dict[str, Town]:
    """Towns on rivers: the first ones take one river each, so that every river has a town."""
    towns = {}
    river_list = list(rivers)
    for i, name in enumerate(names):
        river = river_list[i] if i < len(river_list) else rng.choice(river_list)
        towns[name] = Town(
            name=name,
            region=rng.choice(REGIONS),
            founded=rng.randint(1150, 1900),
            population=rng.randint(8, 2500) * 100,
            river=river,
            industry=rng.choice(_INDUSTRIES),
            landmark=rng.choice(_LANDMARKS),
        )
    for name, town in towns.items():
        rivers[town.river].towns.append(name)
    return towns


def _persons(rng: random.Random, town_names: list[str], surnames: list[str]) -> dict[str, Person]:
    persons: dict[str, Person] = {}
    while len(persons) < 180:
        first = rng.choice(FIRST_NAMES)
        full = first + " " + rng.choice(surnames)
        if full in persons:
            continue
        persons[full] = Person(
            name=full, first=first, profession=rng.choice(_PROFESSIONS),
            born=rng.randint(1900, 2000), hometown=rng.choice(town_names),
        )
    return persons


def _companies(rng: random.Random, persons: dict[str, Person], free: list[str],
               town_names: list[str]) -> dict[str, Company]:
    """48 companies, each founded by a person not yet given a role (taken from the end of `free`)."""
    companies = {}
    pairs = [(p, k) for p in _COMPANY_PREFIXES for k in range(len(_COMPANY_KINDS))]
    rng.shuffle(pairs)
    for prefix, k in pairs[:48]:
        kind, product = _COMPANY_KINDS[k]
        founder = free.pop()
        founded = min(2022, persons[founder].born + rng.randint(22, 50))
        name = f"{prefix} {kind}"
        companies[name] = Company(
            name=name, product=product, founded=founded, founder=founder,
            hq=rng.choice(town_names), employees=rng.randint(2, 900) * 10,
        )
        persons[founder].founded_company = name
        persons[founder].employer = name
    return companies


@lru_cache(maxsize=1)
def get_world() -> World:
    """The fixed fictional world (built once; independent of the question seed)."""
    rng = seeded_rng(WORLD_SEED)
    town_names = [h + t for h in _TOWN_HEADS for t in _TOWN_TAILS]
    rng.shuffle(town_names)
    town_names = town_names[:64]
    surnames = [h + t for h in _SURNAME_HEADS for t in _SURNAME_TAILS]
    rng.shuffle(surnames)

    mountains, lakes = _mountains_and_lakes(rng)
    rivers = _rivers(rng, mountains, lakes)
    towns = _towns(rng, town_names, rivers)
    persons = _persons(rng, town_names, surnames[:140])
    free = list(persons)
    rng.shuffle(free)
    for name, town in towns.items():
        mayor = next(p for p in free if persons[p].born <= 1990)
        free.remove(mayor)
        town.mayor = mayor
        persons[mayor].mayor_of = name
    companies = _companies(rng, persons, free, town_names)
    company_names = list(companies)
    for p in free:
        if rng.random() < 0.5:
            persons[p].employer = rng.choice(company_names)

    built = World(towns, persons, rivers, companies, mountains, lakes, [])
    built.entities = [(kind, name) for kind in _KIND_TABLE for name in built.of_kind(kind)]
    return built


# ---- facts ------------------------------------------------------------------------------------

#: The facts of each kind, in a fixed order, as (attribute, sentence). The fields of a sentence
#: are the entity's attributes plus the phrases of `_phrases`; a fact whose attribute is empty (a
#: person with no employer, a lake that no river feeds) is not stated.
FACT_TEMPLATES: dict[str, tuple[tuple[str, str], ...]] = {
    "town": (
        ("founded", "The town of {name} was founded in {founded}."),
        ("region", "The town of {name} lies in the province of {region}."),
        ("population", "The town of {name} has a population of {population} people."),
        ("river", "The river {river} flows through the town of {name}."),
        ("industry", "The main industry of the town of {name} is {industry}."),
        ("mayor", "The mayor of the town of {name} is {mayor}."),
        ("landmark", "The town of {name} is known for {landmark}."),
    ),
    "person": (
        ("profession", "{name} works as {a_profession}."),
        ("born", "{name} was born in {born}."),
        ("hometown", "{name} was born in the town of {hometown}."),
        ("employer", "{name} works for {employer}."),
        ("mayor_of", "{name} is the mayor of the town of {mayor_of}."),
        ("founded_company", "{name} founded {founded_company} in {company_founded}."),
    ),
    "river": (
        ("length", "The river {name} is {length} kilometres long."),
        ("source", "The river {name} rises on {source}."),
        ("mouth", "The river {name} flows into {mouth}."),
        ("towns", "The river {name} flows through {town_list}."),
    ),
    "company": (
        ("founded", "{name} was founded in {founded}."),
        ("founder", "{name} was founded by {founder}."),
        ("hq", "{name} has its headquarters in the town of {hq}."),
        ("product", "{name} makes {product}."),
        ("employees", "{name} employs {employees} people."),
    ),
    "mountain": (
        ("height", "{name} is {height} metres high."),
        ("region", "{name} stands in the province of {region}."),
        ("climbed", "{name} was first climbed in {climbed}."),
        ("rivers", "{name} is the source of the {river_list}."),
    ),
    "lake": (
        ("area", "{name} covers {area} square kilometres."),
        ("region", "{name} lies in the province of {region}."),
        ("depth", "{name} is {depth} metres deep."),
        ("rivers", "The {river_list} {flow} into {name}."),
    ),
}


def _phrases(world: World, entity: object) -> dict[str, object]:
    """The fields some fact sentences need beyond the entity's own attributes."""
    if isinstance(entity, Person):
        company = world.companies.get(entity.founded_company)
        return {"a_profession": with_article(entity.profession),
                "company_founded": company.founded if company else None}
    if isinstance(entity, River) and entity.towns:
        return {"town_list": counted(entity.towns, "the town of", "the towns of")}
    if isinstance(entity, (Mountain, Lake)) and entity.rivers:
        return {"river_list": counted(entity.rivers, "river", "rivers"),
                "flow": "flows" if len(entity.rivers) == 1 else "flow"}
    return {}


def facts(world: World, kind: str, name: str) -> list[tuple[str, str]]:
    """The entity's facts as (attribute, sentence), in a fixed order."""
    entity = world.get(kind, name)
    fields = vars(entity) | _phrases(world, entity)
    return [(attr, sentence.format(**fields)) for attr, sentence in FACT_TEMPLATES[kind]
            if fields[attr] not in ("", [])]


# ---- drawing from the world -------------------------------------------------------------------

#: How often each kind of entity is asked about, so that every kind is well represented.
_KIND_WEIGHTS = (("town", 30), ("person", 30), ("river", 12), ("company", 18), ("mountain", 5), ("lake", 5))


def pick(rng: random.Random, mapping: dict[str, object]) -> str:
    """A random key of the mapping (a town, company, ... name)."""
    return rng.choice(list(mapping))


def pick_person(rng: random.Random, world: World, **where: str) -> Person:
    """A random person whose attributes match `where` (any person when none does)."""
    names = [n for n, p in world.persons.items() if all(getattr(p, k) == v for k, v in where.items())]
    if not names:
        names = list(world.persons)
    return world.persons[rng.choice(names)]


def other_town(rng: random.Random, world: World, town: str) -> str:
    """A random town other than `town`."""
    return rng.choice([n for n in world.towns if n != town])


def pick_entity(rng: random.Random, world: World) -> tuple[str, str]:
    """A random (kind, name), first drawing the kind so that every kind is well represented."""
    kind = rng.choices([k for k, _ in _KIND_WEIGHTS], [w for _, w in _KIND_WEIGHTS])[0]
    return kind, pick(rng, world.of_kind(kind))


def first_names(rng: random.Random, n: int) -> list[str]:
    """`n` distinct first names (of anybody, not of the world's persons)."""
    return rng.sample(FIRST_NAMES, n)


def other_person(rng: random.Random, world: World, name: str) -> Person:
    """A random person other than the one called `name`."""
    return world.persons[rng.choice([n for n in world.persons if n != name])]
