"""mt_bench reasoning: order friends from comparison clues, then fit in a new friend."""

from __future__ import annotations

import random

from specbench.synth.english import join_and
from specbench.synth.item import Item
from specbench.synth.world import World, first_names

_RELATIONS = (
    ("taller", "shorter", "tallest", "shortest", "from tallest to shortest"),
    ("older", "younger", "oldest", "youngest", "from oldest to youngest"),
    ("faster", "slower", "fastest", "slowest", "from fastest to slowest"),
    ("heavier", "lighter", "heaviest", "lightest", "from heaviest to lightest"),
)


def generate(rng: random.Random, world: World) -> Item:
    """Order three or four friends from pairwise clues; then place a newcomer in the order."""
    more, less, most, least, phrase = rng.choice(_RELATIONS)
    n = rng.choice((3, 4, 4))
    names = first_names(rng, n + 1)
    order, newcomer = names[:n], names[n]
    clues = []
    for i in range(n - 1):
        if rng.random() < 0.5:
            clues.append(f"{order[i]} is {more} than {order[i + 1]}")
        else:
            clues.append(f"{order[i + 1]} is {less} than {order[i]}")
    rng.shuffle(clues)
    friends = join_and(sorted(order))
    t1 = (f"{friends} are friends. " + ". ".join(clues) + f". Who is the {most}, and who is the {least}? "
          "Explain your reasoning.")
    chain = " ".join(f"{order[i]} is {more} than {order[i + 1]}." for i in range(n - 1))
    a1 = (f"Let us put the clues in order. {chain} So the order {phrase} is {join_and(order)}. This means "
          f"that {order[0]} is the {most} and {order[-1]} is the {least}.")
    j = rng.randint(0, n - 2)
    t2 = (f"Now a new friend, {newcomer}, joins {join_and(sorted(order))}. {newcomer} is {less} than "
          f"{order[j]} but {more} than {order[j + 1]}. What is the new order?")
    new_order = order[: j + 1] + [newcomer] + order[j + 1:]
    a2 = (f"{newcomer} is {less} than {order[j]} but {more} than {order[j + 1]}, so {newcomer} comes "
          f"between {order[j]} and {order[j + 1]}. The new order {phrase} is {join_and(new_order)}. "
          f"{order[0]} is still the {most}, and {order[-1]} is still the {least}.")
    return Item("reasoning", [t1, t2], [a1, a2])
