"""mt_bench math: a small worked problem set in a town of the world, then a follow-up that changes it.

Four problem kinds: a rectangle's area and perimeter, a linear equation, an average and a
discount; every step of an answer is one operation written "a op b = c".
"""

from __future__ import annotations

import random

from specbench.synth.english import join_and
from specbench.synth.item import Item
from specbench.synth.world import World, pick

#: (first turn, first answer, second turn, second answer)
_Turns = tuple[str, str, str, str]


def _rectangle(rng: random.Random, town: str) -> _Turns:
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
    return t1, a1, t2, a2


def _equation(rng: random.Random, town: str) -> _Turns:
    a, x, b = rng.randint(2, 9), rng.randint(2, 15), rng.randint(1, 40)
    c = a * x + b
    t1 = f"Solve the equation {a}x + {b} = {c} for x, and explain each step."
    a1 = (f"We want to find the value of x. First we subtract {b} from both sides, and {c} - {b} = "
          f"{c - b}, so {a}x equals {c - b}. Then we divide both sides by {a}, and {c - b} / {a} = {x}. "
          f"So the solution is x = {x}.")
    t2 = f"Check that x = {x} is correct by putting it back into the equation {a}x + {b} = {c}."
    a2 = (f"We put x = {x} into the left side. First {a} * {x} = {a * x}. Then {a * x} + {b} = {c}. "
          f"This is equal to the right side, {c}, so x = {x} is correct.")
    return t1, a1, t2, a2


def _average(rng: random.Random, town: str) -> _Turns:
    n = rng.choice((3, 4, 5))
    while True:  # whole averages, before and after the extra number
        nums = [rng.randint(5, 60) for _ in range(n)]
        e = rng.randint(5, 60)
        if sum(nums) % n == 0 and (sum(nums) + e) % (n + 1) == 0:
            break
    listing = join_and([str(v) for v in nums])
    steps, total = [], nums[0]
    for v in nums[1:]:
        steps.append(f"{total} + {v} = {total + v}.")
        total += v
    t1 = f"What is the average of the numbers {listing}?"
    a1 = (f"To find the average, we add the numbers and divide by how many there are. {' '.join(steps)} "
          f"The sum is {total}. There are {n} numbers, so the average is {total} / {n} = {total // n}.")
    t2 = f"What is the new average if the number {e} is added to the list {listing}?"
    a2 = (f"With {e} added, the sum becomes {total} + {e} = {total + e}, and there are {n} + 1 = {n + 1} "
          f"numbers. The new average is {total + e} / {n + 1} = {(total + e) // (n + 1)}.")
    return t1, a1, t2, a2


def _discount(rng: random.Random, town: str) -> _Turns:
    price = 20 * rng.randint(1, 20)
    pct, pct2 = rng.sample((10, 20, 25, 50), 2)
    thing = rng.choice(("coat", "lamp", "chair", "bicycle", "clock", "rug"))

    def worked(pc: int) -> str:
        raw = price * pc
        d = raw // 100
        return (f"The discount is {pc} percent of {price} coins. First {price} * {pc} = {raw}, and then "
                f"{raw} / 100 = {d}, so the discount is {d} coins. The {thing} costs {price} - {d} = "
                f"{price - d} coins after the discount.")

    t1 = (f"A {thing} in a shop in the town of {town} costs {price} coins. The shop gives a discount of "
          f"{pct} percent. How much does the {thing} cost after the discount?")
    t2 = (f"And what would the {thing} in the town of {town} cost if the discount were {pct2} percent "
          f"instead of {pct}?")
    return t1, worked(pct), t2, worked(pct2)


_PROBLEMS = (_rectangle, _equation, _average, _discount)


def generate(rng: random.Random, world: World) -> Item:
    """A worked problem of one of four kinds, then a follow-up that changes one number."""
    problem = _PROBLEMS[rng.randrange(len(_PROBLEMS))]
    t1, a1, t2, a2 = problem(rng, pick(rng, world.towns))
    return Item("math", [t1, t2], [a1, a2])
