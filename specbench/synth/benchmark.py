"""The benchmark: 480 questions in the official Spec-Bench schema, from one generator per category.

Ten questions for each of the eight mt_bench categories and eighty for each other subtask, in
the official order; question i of a category is drawn from its own seeded rng, redrawn while
one of its turns repeats an earlier question's turn.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from functools import lru_cache, partial

from specbench.core.files import write_atomic
from specbench.core.questions import questions_jsonl
from specbench.synth import math_reasoning, qa, rag, summarization, translation
from specbench.synth.item import CATEGORIES, MT_BENCH_CATEGORIES, Generator, Item
from specbench.synth.mt_bench import GENERATORS as MT_BENCH_GENERATORS
from specbench.synth.seeds import seeded_rng
from specbench.synth.world import World, get_world

#: category -> generator, for all 13 categories
GENERATORS: dict[str, Generator] = {
    **MT_BENCH_GENERATORS,
    "translation": translation.generate,
    "summarization": summarization.generate,
    "qa": qa.generate,
    "math_reasoning": math_reasoning.generate,
    "rag": rag.generate,
}
_QUESTIONS_PER_MT_CATEGORY = 10
_QUESTIONS_PER_SUBTASK = 80


def first_accepted(make: Callable[[int], Item], accept: Callable[[Item], bool], tries: int, what: str) -> Item:
    """The first of make(0), make(1), ... that `accept` takes; RuntimeError naming `what` after `tries`."""
    for attempt in range(tries):
        item = make(attempt)
        if accept(item):
            return item
    raise RuntimeError(f"could not make {what}")  # pragma: no cover - the template spaces are far larger


def _question(generate: Generator, world: World, seed: int, category: str, i: int, attempt: int) -> Item:
    return generate(seeded_rng("question", seed, category, i, attempt), world)


@lru_cache(maxsize=8)
def question_items(seed: int) -> tuple[Item, ...]:
    """The benchmark's items for a seed, in order (cached: callers must not mutate them)."""
    items: list[Item] = []
    seen: set[str] = set()

    def fresh(item: Item) -> bool:
        return not any(t in seen for t in item.turns)

    for category in CATEGORIES:
        count = _QUESTIONS_PER_MT_CATEGORY if category in MT_BENCH_CATEGORIES else _QUESTIONS_PER_SUBTASK
        for i in range(count):
            make = partial(_question, GENERATORS[category], get_world(), seed, category, i)
            item = first_accepted(make, fresh, 1000, f"a unique {category} question")
            seen.update(item.turns)
            items.append(item)
    return tuple(items)


def make_questions(seed: int = 0) -> list[dict]:
    """The 480 benchmark questions, official schema, deterministic for a seed."""
    return [it.as_question(i + 1) for i, it in enumerate(question_items(seed))]


def write_questions(path: str | os.PathLike, seed: int = 0) -> pathlib.Path:
    """Write make_questions(seed) as JSONL (UTF-8, '\\n' endings) atomically; return the path."""
    return write_atomic(path, questions_jsonl(make_questions(seed)))


def conversation_messages(item: dict) -> list[dict]:
    """[{'role':'user','content':turn1},{'role':'assistant','content':ref1}, ...] for an item."""
    messages: list[dict] = []
    for turn, ref in zip(item["turns"], item["reference"], strict=True):
        messages.append({"role": "user", "content": turn})
        messages.append({"role": "assistant", "content": ref})
    return messages
