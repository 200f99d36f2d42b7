"""mt_bench extraction: pull the fields out of a short record, then restate them as JSON or a sentence."""

from __future__ import annotations

import json
import random
from typing import NamedTuple

from specbench.synth.english import MONTHS, with_article
from specbench.synth.item import Item
from specbench.synth.world import World, other_person, other_town, pick, pick_person


class _Record(NamedTuple):
    text: str                  # the record as prose
    fields: dict[str, object]  # what to extract, in order
    units: dict[str, str]      # a unit written after a field's value (" crates")
    sentence: str              # the fields restated as one sentence
    who: str                   # whom the record is about
    ask: str                   # the fields as the question names them


def _purchase(rng: random.Random, world: World, date: str) -> _Record:
    p = pick_person(rng, world)
    cname = pick(rng, world.companies)
    c = world.companies[cname]
    n, price = rng.randint(2, 30), rng.randint(2, 40)
    total = n * price
    text = (f"On {date}, {p.name} bought {n} crates of {c.product} from {cname} in the town of {c.hq}. "
            f"Each crate cost {price} coins, so the bill came to {total} coins. {p.first} paid in "
            "cash and took the goods home the same day.")
    fields = {"buyer": p.name, "seller": cname, "town": c.hq, "date": date, "quantity": n, "total": total}
    sentence = f"{p.name} bought {n} crates from {cname} in the town of {c.hq} on {date} and paid {total} coins."
    return _Record(text, fields, {"quantity": " crates", "total": " coins"}, sentence, p.name,
                   "the buyer, the seller, the town, the date, the quantity and the total amount")


def _meeting(rng: random.Random, world: World, date: str) -> _Record:
    p = pick_person(rng, world)
    q = other_person(rng, world, p.name)
    cname = pick(rng, world.companies)
    c = world.companies[cname]
    hour = rng.randint(8, 17)
    subject = rng.choice(("a new order of goods", "the plans for next year", "the opening of a shop",
                          "the price of wool", "a job at the company"))
    text = (f"{p.name}, {with_article(p.profession)} from the town of {p.hometown}, has arranged a meeting with "
            f"{q.name} at the offices of {cname} in the town of {c.hq}. The meeting will take place "
            f"on {date} at {hour} o'clock and will be about {subject}.")
    fields = {"organizer": p.name, "guest": q.name, "place": f"{cname}, {c.hq}", "date": date,
              "time": f"{hour} o'clock", "subject": subject}
    sentence = (f"{p.name} will meet {q.name} at {cname} in the town of {c.hq} on {date} at {hour} "
                f"o'clock to talk about {subject}.")
    return _Record(text, fields, {}, sentence, p.name,
                   "the organizer, the guest, the place, the date, the time and the subject")


def _shipment(rng: random.Random, world: World, date: str) -> _Record:
    cname = pick(rng, world.companies)
    c = world.companies[cname]
    dest = other_town(rng, world, c.hq)
    p = pick_person(rng, world)
    n, weight = rng.randint(5, 90), rng.randint(10, 900) * 10
    text = (f"{cname} shipped {n} crates of {c.product} from the town of {c.hq} to the town of {dest} on "
            f"{date}. The shipment weighed {weight} kilograms and was checked by {p.name}, who works "
            f"as {with_article(p.profession)}.")
    fields = {"sender": cname, "goods": c.product, "quantity": n, "from": c.hq, "to": dest,
              "date": date, "weight": weight}
    sentence = (f"On {date}, {cname} sent {n} crates of {c.product} weighing {weight} kilograms from the "
                f"town of {c.hq} to the town of {dest}.")
    return _Record(text, fields, {"quantity": " crates", "weight": " kilograms"}, sentence, cname,
                   "the sender, the goods, the quantity, the starting town, the destination, the date and the weight")


_RECORDS = (_purchase, _meeting, _shipment)


def generate(rng: random.Random, world: World) -> Item:
    """Extract the fields of a purchase, meeting or shipment; then give them as JSON or a sentence."""
    date = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(1990, 2024)}"
    record = _RECORDS[rng.randrange(len(_RECORDS))](rng, world, date)
    t1 = f"Extract {record.ask} from the record below. Write one field per line.\n\nRecord: {record.text}"
    lines = [f"{k}: {v}{record.units.get(k, '')}" for k, v in record.fields.items()]
    a1 = "Here are the details from the record:\n" + "\n".join(lines)
    if rng.random() < 0.5:
        t2 = f"Now give the details you extracted about {record.who} as a JSON object."
        a2 = "```json\n" + json.dumps(record.fields, indent=2, ensure_ascii=False) + "\n```"
    else:
        t2 = f"Now write the details you extracted about {record.who} as one sentence."
        a2 = record.sentence
    return Item("extraction", [t1, t2], [a1, a2])
