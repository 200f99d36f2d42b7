"""The summarization subtask: a news report of a town's event, summarized in two or three sentences.

Every report has a lead, a key sentence and a closing sentence, padded with sentences about the
event and the town; the summary is the lead, the key sentence and (for three sentences) the
closing one, copied word for word.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from specbench.synth.english import MONTHS, WEEKDAYS, with_article, word_count
from specbench.synth.item import Item
from specbench.synth.world import Person, World, other_person, other_town, pick, pick_person


class _Report(NamedTuple):
    """An event's report: the summary sentences (lead, key, last) and a pool of the others."""

    town: str
    lead: str
    key: str
    last: str
    pool: list[str]


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


def _town_fillers(rng: random.Random, world: World, town: str) -> list[str]:
    """Sentences about the town and the day, to pad any report."""
    t = world.towns[town]
    other = other_town(rng, world, town)
    return [
        f"The town of {town} lies in the province of {t.region} and has a population of {t.population} people.",
        f"The town of {town} was founded in {t.founded} and is known for {t.landmark}.",
        f"The main industry of the town of {town} is {t.industry}.",
        f"Many visitors travelled from the nearby town of {other} to see it for themselves.",
        "Local shops and cafes said that it was one of their busiest days of the year.",
        f"The weather stayed {rng.choice(_WEATHER)} for most of the day.",
        f"Reporters from several newspapers in the province of {t.region} came to write about the event.",
    ]


def _quote_person(rng: random.Random, world: World, town: str) -> Person | None:
    """Somebody from the town (not a mayor) to quote, if the town has anybody."""
    local = [p for p in world.persons.values() if p.hometown == town and not p.mayor_of]
    return rng.choice(local) if local else None


def _event_factory(rng: random.Random, world: World) -> _Report:
    cname = pick(rng, world.companies)
    c = world.companies[cname]
    town = pick(rng, world.towns)
    t = world.towns[town]
    other = other_town(rng, world, town)
    facility = rng.choice(("factory", "workshop", "warehouse"))
    wd = rng.choice(WEEKDAYS)
    lead = (f"{cname} opened a new {facility} in the town of {town} on {wd}, creating "
            f"{rng.randint(2, 40) * 10} new jobs for local workers.")
    key = f"The new {facility} will make {c.product} for shops across the province of {t.region}."
    last = f"{cname} plans to open a second {facility} in the town of {other} within {rng.randint(2, 6)} years."
    pool = [
        f"Work on the building began in {rng.choice(MONTHS)} of last year and cost about "
        f"{rng.randint(5, 90) * 10} thousand coins.",
        f"{cname} was founded in {c.founded} by {c.founder} and has its headquarters in the town of {c.hq}.",
        f"\"This is a great day for our town,\" said {t.mayor}, the mayor of the town of {town}.",
        f"The {facility} stands close to the river {t.river}, which flows through the town of {town}.",
        f"Around {rng.randint(3, 60) * 10} people came to watch the opening, and children from the "
        "local school sang a song.",
        f"The first goods from the new {facility} are expected to leave its gates in {rng.choice(MONTHS)}.",
    ]
    return _Report(town, lead, key, last, pool)


def _event_festival(rng: random.Random, world: World) -> _Report:
    town = pick(rng, world.towns)
    t = world.towns[town]
    fest, prize = rng.choice(_FESTIVALS)
    winner = pick_person(rng, world)
    lead = (f"The {fest} festival in the town of {town} drew more than {rng.randint(5, 90) * 100} "
            f"visitors on {rng.choice(WEEKDAYS)}, the largest crowd in its history.")
    key = (f"The prize for the best {prize} went to {winner.name}, {with_article(winner.profession)} from the "
           f"town of {winner.hometown}.")
    last = f"The next {fest} festival will take place in {rng.choice(MONTHS)} next year."
    food1, food2 = rng.sample(_FOODS, 2)
    band_town = other_town(rng, world, town)
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
    return _Report(town, lead, key, last, pool)


def _event_flood(rng: random.Random, world: World) -> _Report:
    town = pick(rng, world.towns)
    t = world.towns[town]
    r = world.rivers[t.river]
    lead = f"Heavy rain caused the river {r.name} to flood parts of the town of {town} on {rng.choice(WEEKDAYS)}."
    key = f"About {rng.randint(4, 90) * 10} homes were damaged by the water, but no one was seriously hurt."
    last = (f"Officials say that the repairs will take about {rng.randint(3, 20)} weeks and cost "
            f"{rng.randint(2, 90) * 10} thousand coins.")
    pool = [
        f"The water rose {rng.randint(2, 6)} metres above its normal level in less than {rng.randint(3, 12)} hours.",
        f"Workers from {pick(rng, world.companies)} helped to move families and animals to higher ground.",
        f"The river {r.name} is {r.length} kilometres long and flows into {r.mouth}.",
        f"The school hall in the town of {town} was opened so that families could spend the night there.",
        f"Farmers along the river lost {rng.randint(5, 80) * 10} tonnes of grain stored in their barns.",
        f"The mayor of the town of {town}, {t.mayor}, thanked the volunteers for their help.",
    ]
    speaker = _quote_person(rng, world, town)
    if speaker:
        pool.append(f"\"I have lived here for {rng.randint(10, 60)} years and I have never seen the water "
                    f"this high,\" said {speaker.name}, {with_article(speaker.profession)} from the town of {town}.")
    return _Report(town, lead, key, last, pool)


def _event_bridge(rng: random.Random, world: World) -> _Report:
    town = pick(rng, world.towns)
    t = world.towns[town]
    other = other_town(rng, world, town)
    lead = (f"A new bridge over the river {t.river} opened in the town of {town} on "
            f"{rng.choice(WEEKDAYS)} after {rng.randint(8, 40)} months of work.")
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
    d = pick_person(rng, world, profession=rng.choice(("architect", "engineer")))
    pool.append(f"The bridge was designed by {d.name}, {with_article(d.profession)} from the town of {d.hometown}.")
    return _Report(town, lead, key, last, pool)


def _event_election(rng: random.Random, world: World) -> _Report:
    p = pick_person(rng, world)
    town = p.hometown
    t = world.towns[town]
    rival = other_person(rng, world, p.name)
    votes = rng.randint(300, 4000)
    promise = rng.choice((
        "build a new school", "repair the old roads", "open a second library",
        f"plant {rng.randint(5, 50) * 10} new trees along the river {t.river}", "lower the price of the bus",
    ))
    lead = f"{p.name} won a seat on the town council of {town} on {rng.choice(WEEKDAYS)} with {votes} votes."
    key = f"{p.name} promised to {promise} before the end of next year."
    last = f"The new council will meet for the first time on {rng.choice(WEEKDAYS)} next week."
    seats = rng.randint(5, 12)
    pool = [
        f"{p.name} works as {with_article(p.profession)} and was born in the town of {town}.",
        f"In total, {seats + rng.randint(3, 12)} people stood for the {seats} seats on the council.",
        f"About {rng.randint(40, 90)} percent of the voters in the town of {town} took part.",
        f"\"I will work hard for every family in this town,\" said {p.name} after the result was announced.",
        f"The second place went to {rival.name}, who received {votes - rng.randint(10, 250)} votes.",
        f"The mayor of the town of {town}, {t.mayor}, congratulated all the winners.",
    ]
    return _Report(town, lead, key, last, pool)


def _event_match(rng: random.Random, world: World) -> _Report:
    town, other = rng.sample(list(world.towns), 2)
    m1, m2 = rng.sample(_MASCOTS, 2)
    a = rng.randint(1, 6)
    b = rng.randint(0, a - 1)
    scorer = pick_person(rng, world, hometown=town)
    coach = pick_person(rng, world, hometown=town)
    games = rng.randint(4, 12)
    lead = (f"The {town} {m1} beat the {other} {m2} by {a} goals to {b} in front of "
            f"{rng.randint(5, 90) * 100} fans on {rng.choice(WEEKDAYS)}.")
    key = f"The winning goal was scored by {scorer.name} in minute {rng.randint(5, 89)}."
    last = f"The two teams will meet again in the town of {other} in {rng.choice(MONTHS)}."
    pool = [
        f"The {town} {m1} have now won {rng.randint(1, games)} of their last {games} games.",
        "Heavy rain made the field wet and slow in the second half.",
        f"\"The players never gave up,\" said {coach.name}, the coach of the {town} {m1}.",
        f"The {other} {m2} had more of the ball but could not find a way through.",
        f"The match was played at the old ground near the river {world.towns[town].river}.",
    ]
    return _Report(town, lead, key, last, pool)


def _event_discovery(rng: random.Random, world: World) -> _Report:
    mname = pick(rng, world.mountains)
    m = world.mountains[mname]
    p = pick_person(rng, world)
    town = pick(rng, world.towns)
    lead = (f"A team led by {p.name}, {with_article(p.profession)} from the town of {p.hometown}, found the "
            f"remains of an old village near {mname} on {rng.choice(WEEKDAYS)}.")
    key = (f"The village is thought to be about {rng.randint(8, 60) * 100} years old, older than any "
           f"other known village in the province of {m.region}.")
    last = f"The finds will be shown at the museum in the town of {town} from {rng.choice(MONTHS)}."
    pool = [
        f"The team found {rng.randint(3, 40)} clay pots, {rng.randint(5, 90)} stone tools and a small silver ring.",
        f"{mname} is {m.height} metres high and stands in the province of {m.region}.",
        f"\"We knew that people lived here long ago, but this is more than we hoped for,\" said {p.name}.",
        f"Work at the site will continue for another {rng.randint(2, 12)} weeks.",
        "The first signs of the village were spotted by a farmer who was looking for a lost sheep.",
        f"Visitors are asked to stay away from the site until the work is done in {rng.choice(MONTHS)}.",
    ]
    return _Report(town, lead, key, last, pool)


def _event_library(rng: random.Random, world: World) -> _Report:
    town = pick(rng, world.towns)
    t = world.towns[town]
    cname = pick(rng, world.companies)
    lead = (f"A new library opened in the town of {town} on {rng.choice(WEEKDAYS)} with more than "
            f"{rng.randint(2, 60) * 1000} books on its shelves.")
    key = f"The library was paid for by {cname}, which gave {rng.randint(10, 90) * 10} thousand coins to the project."
    last = (f"The library will be open every day except {rng.choice(WEEKDAYS)}, from "
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
    lib = pick_person(rng, world, profession="librarian")
    pool.append(f"The new head of the library is {lib.name}, who was born in the town of {lib.hometown}.")
    return _Report(town, lead, key, last, pool)


_EVENTS = (_event_factory, _event_festival, _event_flood, _event_bridge, _event_election,
           _event_match, _event_discovery, _event_library)


def generate(rng: random.Random, world: World) -> Item:
    """A news report of one event and a request for a two- or three-sentence summary."""
    town, lead, key, last, pool = rng.choice(_EVENTS)(rng, world)
    pool = pool + _town_fillers(rng, world, town)
    rng.shuffle(pool)
    target = rng.randint(110, 200)
    chosen: list[str] = []
    base = word_count(lead) + word_count(key) + word_count(last)
    for sent in pool:
        total = base + sum(word_count(s) for s in chosen)
        if len(chosen) >= 7 or (total >= target and len(chosen) >= 2):
            break
        if total + word_count(sent) > 220 and len(chosen) >= 2:
            continue
        chosen.append(sent)
    chosen.insert(rng.randint(0, len(chosen)), key)
    passage = " ".join([lead] + chosen + [last])
    instruction, n_sent = rng.choice(_SUMMARY_INSTRUCTIONS)
    summary = [lead, key] + ([last] if n_sent == 3 else [])
    return Item("summarization", [f"{instruction}\n\n{passage}"], [" ".join(summary)])
