"""mt_bench coding: write a small Python function, then change it and say what a call returns.

Each task is a short function over a list of numbers or a text, with a one-line change; the
example results in the answers are computed by running the equivalent Python.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from specbench.synth.item import Item
from specbench.synth.world import FIRST_NAMES, World

_NOUNS = (("prices", "price"), ("weights", "weight"), ("scores", "score"), ("ages", "age"),
          ("lengths", "length"), ("distances", "distance"), ("votes", "vote"), ("heights", "height"))


@dataclass(frozen=True)
class _Task:
    name: str                      # the function's name
    does: str                      # "takes a list of prices and returns their sum"
    code: str
    func: Callable[[object], object]
    change: str                    # what the second turn asks to change
    new_code: str
    new_func: Callable[[object], object]
    explanation: str
    takes_text: bool = False       # else a list of numbers
    more_args: str = ""            # further arguments of the example calls (", 5")


def _loop_source(signature: str, start: str, loop: str, step: str, end: str, test: str = "") -> str:
    """`def signature:` with `start`, then `for loop:` doing `step` (if `test`), then `end`."""
    body = f"        if {test}:\n            {step}" if test else f"        {step}"
    return f"def {signature}:\n    {start}\n    for {loop}:\n{body}\n    {end}"


def _total(rng: random.Random, plural: str, single: str, k: int) -> _Task:
    name = f"total_{plural}"
    source = partial(_loop_source, f"{name}({plural})", "total = 0", f"value in {plural}", "total += value",
                     "return total")
    return _Task(name, f"takes a list of {plural} and returns their sum", source(), lambda xs: sum(xs),
                 f"only adds the {plural} that are greater than {k}", source(test=f"value > {k}"),
                 lambda xs: sum(x for x in xs if x > k),
                 "The function starts with a total of 0, adds every value in the list to it, and returns "
                 "the total at the end.")


def _largest(rng: random.Random, plural: str, single: str, k: int) -> _Task:
    name = f"largest_{single}"
    source = partial(_loop_source, f"{name}({plural})", f"best = {plural}[0]", f"value in {plural}",
                     "best = value", "return best")
    return _Task(name, f"returns the largest value in a list of {plural}", source(test="value > best"),
                 lambda xs: max(xs), f"returns the smallest of the {plural} instead", source(test="value < best"),
                 lambda xs: min(xs),
                 "The function remembers the best value seen so far and replaces it whenever it finds a "
                 "larger one.")


def _count_above(rng: random.Random, plural: str, single: str, k: int) -> _Task:
    name = f"count_{plural}_above"
    source = partial(_loop_source, f"{name}({plural}, limit)", "count = 0", f"value in {plural}", "count += 1",
                     "return count")
    return _Task(name, f"counts how many of the {plural} in a list are greater than a limit",
                 source(test="value > limit"), lambda xs: sum(1 for x in xs if x > k),
                 f"also counts the {plural} that are equal to the limit", source(test="value >= limit"),
                 lambda xs: sum(1 for x in xs if x >= k),
                 "The function goes through the list and adds 1 to the count for every value above the "
                 "limit.", more_args=f", {k}")


def _average(rng: random.Random, plural: str, single: str, k: int) -> _Task:
    name = f"average_{single}"
    code = f"def {name}({plural}):\n    if not {plural}:\n        return 0\n    return sum({plural}) / len({plural})"
    new_code = (f"def {name}({plural}):\n    if not {plural}:\n        return 0\n"
                f"    return round(sum({plural}) / len({plural}))")
    return _Task(name, f"returns the average of a list of {plural}", code, lambda xs: sum(xs) / len(xs),
                 "rounds the result to the nearest whole number", new_code, lambda xs: round(sum(xs) / len(xs)),
                 "The function returns 0 for an empty list; otherwise it divides the sum of the values "
                 "by the number of values.")


def _evens(rng: random.Random, plural: str, single: str, k: int) -> _Task:
    name = f"even_{plural}"
    source = partial(_loop_source, f"{name}({plural})", "result = []", f"value in {plural}",
                     "result.append(value)", "return result")
    return _Task(name, f"returns only the even numbers from a list of {plural}", source(test="value % 2 == 0"),
                 lambda xs: [x for x in xs if x % 2 == 0], f"keeps only the odd {plural} instead",
                 source(test="value % 2 == 1"), lambda xs: [x for x in xs if x % 2 == 1],
                 "The function builds a new list and appends every value that leaves no remainder when "
                 "divided by 2.")


def _scale(rng: random.Random, plural: str, single: str, k: int) -> _Task:
    name = f"scale_{plural}"
    source = partial(_loop_source, f"{name}({plural}, factor)", "result = []", f"value in {plural}",
                     end="return result")
    factor = rng.randint(2, 5)
    return _Task(name, f"multiplies every value in a list of {plural} by a factor",
                 source(step="result.append(value * factor)"), lambda xs: [x * factor for x in xs],
                 f"adds {k} to every value after multiplying it", source(step=f"result.append(value * factor + {k})"),
                 lambda xs: [x * factor + k for x in xs],
                 "The function builds a new list in which every value has been multiplied by the factor.",
                 more_args=f", {factor}")


def _reverse_words(rng: random.Random, plural: str, single: str, k: int) -> _Task:
    code = "def reverse_words(text):\n    words = text.split()\n    words.reverse()\n    return \" \".join(words)"
    new_code = ("def reverse_words(text):\n    words = text.split()\n    words.reverse()\n"
                "    return \" \".join(word.upper() for word in words)")
    return _Task("reverse_words", "returns the words of a sentence in reverse order", code,
                 lambda s: " ".join(reversed(s.split())), "also writes every word in capital letters",
                 new_code, lambda s: " ".join(w.upper() for w in reversed(s.split())),
                 "The function splits the text into words, reverses the list of words and joins them "
                 "again with spaces.", takes_text=True)


def _count_vowels(rng: random.Random, plural: str, single: str, k: int) -> _Task:
    source = partial(_loop_source, "count_vowels(text)", "count = 0", "letter in text.lower()", "count += 1",
                     "return count")
    return _Task("count_vowels", "counts the vowels in a piece of text", source(test="letter in \"aeiou\""),
                 lambda s: sum(1 for ch in s.lower() if ch in "aeiou"), "also counts the letter y as a vowel",
                 source(test="letter in \"aeiouy\""), lambda s: sum(1 for ch in s.lower() if ch in "aeiouy"),
                 "The function looks at every letter of the text in lower case and adds 1 to the count for "
                 "each vowel.", takes_text=True)


_TASKS = (_total, _largest, _count_above, _average, _evens, _scale, _reverse_words, _count_vowels)


def _example(rng: random.Random, world: World, task: _Task) -> tuple[str, object, object]:
    """An example call's arguments, and what the function returns before and after the change."""
    if task.takes_text:
        value: object = " ".join(rng.sample(list(world.towns) + list(FIRST_NAMES), rng.randint(2, 4)))
        call = json.dumps(value)
    else:
        value = [rng.randint(1, 30) for _ in range(rng.randint(3, 6))]
        call = repr(value) + task.more_args
    return call, task.func(value), task.new_func(value)


def generate(rng: random.Random, world: World) -> Item:
    """Write a function (with an example call); then change it and give a new call's result."""
    plural, single = rng.choice(_NOUNS)
    k = rng.randint(2, 20)
    task = _TASKS[rng.randrange(len(_TASKS))](rng, plural, single, k)
    call1, res1, _ = _example(rng, world, task)
    call2, _, res2 = _example(rng, world, task)
    name = task.name
    t1 = f"Write a Python function called {name} that {task.does}."
    a1 = (f"Here is a Python function that {task.does}:\n\n```python\n{task.code}\n```\n\n{task.explanation} "
          f"For example, {name}({call1}) returns {json.dumps(res1)}.")
    t2 = f"Change the function {name} so that it {task.change}, and tell me what {name}({call2}) returns then."
    a2 = (f"Here is the changed function. It now {task.change}:\n\n```python\n{task.new_code}\n```\n\n"
          f"With this change, {name}({call2}) returns {json.dumps(res2)}.")
    return Item("coding", [t1, t2], [a1, a2])
