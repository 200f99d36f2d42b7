"""The qa subtask: a question about one fact of one entity, answered with that fact and the next two.

Answers restate the entity the question names; the corpus states every fact
of the world (entity profiles), so a model can learn the answers.
"""

from __future__ import annotations

import random

from specbench.synth.item import Item
from specbench.synth.world import World, facts, pick_entity

# Question templates per (kind, attribute); "{e}" is the entity as written mid-sentence.
QUESTION_TEMPLATES: dict[tuple[str, str], tuple[str, ...]] = {
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


def _answer(entity_facts: list[tuple[str, str]], attr: str) -> str:
    """The main fact followed by the next two facts of the entity (cyclically)."""
    idx = [a for a, _ in entity_facts].index(attr)
    chosen = [entity_facts[(idx + k) % len(entity_facts)][1] for k in range(min(3, len(entity_facts)))]
    return " ".join(chosen)


def generate(rng: random.Random, world: World) -> Item:
    """A qa question about one fact of a random entity."""
    kind, name = pick_entity(rng, world)
    entity_facts = facts(world, kind, name)
    attr = rng.choice([a for a, _ in entity_facts])
    question = rng.choice(QUESTION_TEMPLATES[(kind, attr)]).format(e=name)
    return Item("qa", [question], [_answer(entity_facts, attr)], {"entity": (kind, name), "attr": attr})


def profile(rng: random.Random, world: World, kind: str, name: str) -> Item:
    """A request for a profile of the entity, answered with all of its facts (corpus only)."""
    question = rng.choice(_PROFILE_TEMPLATES[kind]).format(e=name)
    return Item("qa", [question], [" ".join(s for _, s in facts(world, kind, name))], {"entity": (kind, name)})
