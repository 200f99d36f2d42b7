"""The math_reasoning subtask: grade-school word problems with worked answers (GSM8K style).

Every step of an answer is one binary operation written "a op b = c", and the answer ends with
"The answer is N."; the numbers are drawn so that every step stays a whole, positive number.
"""

from __future__ import annotations

import random

from specbench.synth.english import with_article
from specbench.synth.item import Item
from specbench.synth.world import World, first_names, pick, pick_person

_ITEMS = ("apples", "pencils", "marbles", "stickers", "cookies", "eggs", "books", "shells",
          "stamps", "cards", "candles", "buttons")
_PLANTS = ("tomato plants", "rose bushes", "bean plants", "young trees", "pepper plants")


def _boxes(rng: random.Random, world: World) -> tuple[str, str]:
    p, q = first_names(rng, 2)
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


def _shopping(rng: random.Random, world: World) -> tuple[str, str]:
    (p,) = first_names(rng, 1)
    i1, i2 = rng.sample(_ITEMS, 2)
    a, p1, b, p2 = rng.randint(2, 9), rng.randint(2, 12), rng.randint(2, 9), rng.randint(2, 12)
    x, y = a * p1, b * p2
    z = x + y
    paid = (z // 50 + 1) * 50
    if paid - z < 2:
        paid += 50
    town = pick(rng, world.towns)
    question = (f"At the market in the town of {town}, {i1} cost {p1} coins each and {i2} cost {p2} coins "
                f"each. {p} buys {a} {i1} and {b} {i2} and pays with {paid} coins. How many coins "
                f"does {p} get back?")
    answer = (f"The {i1} cost {a} * {p1} = {x} coins. The {i2} cost {b} * {p2} = {y} coins. "
              f"Together {p} spends {x} + {y} = {z} coins. {p} pays with {paid} coins, so {p} gets "
              f"back {paid} - {z} = {paid - z} coins. The answer is {paid - z}.")
    return question, answer


def _travel(rng: random.Random, world: World) -> tuple[str, str]:
    (p,) = first_names(rng, 1)
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


def _sharing(rng: random.Random, world: World) -> tuple[str, str]:
    (p,) = first_names(rng, 1)
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


def _savings(rng: random.Random, world: World) -> tuple[str, str]:
    (p,) = first_names(rng, 1)
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


def _garden(rng: random.Random, world: World) -> tuple[str, str]:
    (p,) = first_names(rng, 1)
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


def _bags(rng: random.Random, world: World) -> tuple[str, str]:
    baker = pick_person(rng, world, profession="baker")
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


def _ages(rng: random.Random, world: World) -> tuple[str, str]:
    p, q, r = first_names(rng, 3)
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


def _wages(rng: random.Random, world: World) -> tuple[str, str]:
    person = pick_person(rng, world)
    w, h, d = rng.randint(5, 20), rng.randint(3, 9), rng.randint(2, 7)
    day = w * h
    total = day * d
    spent = rng.randint(5, total - 2)
    question = (f"{person.name} works as {with_article(person.profession)} and earns {w} coins per hour. "
                f"{person.first} works {h} hours each day for {d} days and then spends {spent} coins "
                f"on food. How many coins does {person.first} have left?")
    answer = (f"In one day {person.first} earns {w} * {h} = {day} coins. In {d} days that is {day} * {d} = "
              f"{total} coins. After spending {spent} coins, {person.first} has {total} - {spent} = "
              f"{total - spent} coins left. The answer is {total - spent}.")
    return question, answer


def _reading(rng: random.Random, world: World) -> tuple[str, str]:
    (p,) = first_names(rng, 1)
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


def _bus(rng: random.Random, world: World) -> tuple[str, str]:
    town = pick(rng, world.towns)
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


def _half(rng: random.Random, world: World) -> tuple[str, str]:
    p, q = first_names(rng, 2)
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


#: Each problem draws its numbers and returns (question, worked answer ending "The answer is N.").
_PROBLEMS = (_boxes, _shopping, _travel, _sharing, _savings, _garden, _bags,
                   _ages, _wages, _reading, _bus, _half)


def generate(rng: random.Random, world: World) -> Item:
    """A word problem of two to four arithmetic steps, answered step by step."""
    question, answer = rng.choice(_PROBLEMS)(rng, world)
    return Item("math_reasoning", [question], [answer])
