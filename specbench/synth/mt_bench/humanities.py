"""mt_bench humanities: a short essay on a town's history or a person's life, then a follow-up."""

from __future__ import annotations

import random

from specbench.synth.english import with_article
from specbench.synth.item import Item
from specbench.synth.world import World, other_town, pick, pick_person

_EARLY_WORK = ("farming and fishing", "trade along the river", "sheep and wool", "small workshops",
               "the timber of the nearby forests")


def _compare_towns(rng: random.Random, world: World, town: str) -> tuple[str, str]:
    """A follow-up comparing the town with another one (age and size, with the arithmetic)."""
    t = world.towns[town]
    other = other_town(rng, world, town)
    o = world.towns[other]
    older, newer = (town, other) if t.founded <= o.founded else (other, town)
    y_old, y_new = sorted((t.founded, o.founded))
    big = town if t.population >= o.population else other
    p_big, p_small = sorted((t.population, o.population), reverse=True)
    question = f"Compare the town of {town} with the town of {other}."
    answer = (f"The town of {older} is the older of the two: it was founded in {y_old}, while the town of "
              f"{newer} was founded in {y_new}, so the difference is {y_new} - {y_old} = {y_new - y_old} "
              f"years. The town of {big} is the larger one, with {p_big} people against {p_small}. The main "
              f"industry of the town of {town} is {t.industry}, and the main industry of the town of "
              f"{other} is {o.industry}.")
    return question, answer


def _town_essay(rng: random.Random, world: World) -> Item:
    town = pick(rng, world.towns)
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
        t2, a2 = _compare_towns(rng, world, town)
    else:
        t2 = f"How might the town of {town} be different today if the river {t.river} did not flow through it?"
        a2 = (f"Without the river {t.river}, the town of {town} would have had no easy way to move goods "
              "or to turn mills, so it would probably have grown much more slowly. Fewer people would "
              f"have settled there, and {t.industry} might never have become so important. The town "
              "might be a small village today, known only to the people who live nearby.")
    return Item("humanities", [t1, t2], [a1, a2])


def _person_essay(rng: random.Random, world: World) -> Item:
    p = pick_person(rng, world)
    job = with_article(p.profession)
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
          f"{job}, a job that asks for patience, skill and care.{extra} The life of {p.name} "
          "shows how one person can serve a whole town by doing ordinary work well.")
    t2 = f"Summarize your essay about {p.name} in one sentence."
    a2 = f"{p.name}, born in the town of {p.hometown} in {p.born}, works as {job}."
    return Item("humanities", [t1, t2], [a1, a2])


def generate(rng: random.Random, world: World) -> Item:
    """An essay about a town (seven times in ten) or a person, then a summary or a follow-up."""
    if rng.random() < 0.7:
        return _town_essay(rng, world)
    return _person_essay(rng, world)
