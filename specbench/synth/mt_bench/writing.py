"""mt_bench writing: a short letter, note or invitation about an event, then a rewrite of it."""

from __future__ import annotations

import random

from specbench.synth.english import MONTHS, WEEKDAYS
from specbench.synth.item import Item
from specbench.synth.world import World, pick, pick_person

_LETTER_KINDS = ("note", "letter", "invitation", "message")
_LETTER_CLOSINGS = {
    "invitation": "I would be very happy if you could come with us.",
    "letter": "I hope you are well, and I look forward to seeing you there.",
    "note": "Please let me know soon if you can join us.",
    "message": "Write back when you can and tell me what you think.",
}


def _topic(rng: random.Random, world: World) -> tuple[str, str]:
    """An event in the world and a sentence of detail about it."""
    choice = rng.randrange(6)
    town = pick(rng, world.towns)
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
        mname = pick(rng, world.mountains)
        return (f"a walk up {mname}",
                f"{mname} is {world.mountains[mname].height} metres high, so we will start early and "
                "have lunch near the top.")
    if choice == 4:
        cname = pick(rng, world.companies)
        return (f"a visit to {cname}",
                f"{cname} makes {world.companies[cname].product}, and one of the workers will show us "
                "how everything is made.")
    return (f"the summer concert in the town of {town}",
            f"The music school will play for about {rng.randint(4, 12) * 10} minutes, and afterwards "
            "there will be tea and cake.")


def generate(rng: random.Random, world: World) -> Item:
    """A request for a short letter about an event; then a list, a shorter letter or a new time."""
    to = pick_person(rng, world)
    sender = pick_person(rng, world)
    kind = rng.choice(_LETTER_KINDS)
    topic, detail = _topic(rng, world)
    when = f"{rng.choice(WEEKDAYS)}, {rng.randint(1, 28)} {rng.choice(MONTHS)}"
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
    return Item("writing", [t1, t2], [letter(hour), a2])
