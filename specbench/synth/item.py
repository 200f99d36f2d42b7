"""The categories of the benchmark and the item every generator returns."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from specbench.synth.world import World

SUBTASKS: tuple[str, ...] = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES: tuple[str, ...] = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)
#: All 13 question categories in benchmark order.
CATEGORIES: tuple[str, ...] = MT_BENCH_CATEGORIES + SUBTASKS[1:]


@dataclass
class Item:
    """One conversation: the user's turns and the reference answers (one per turn)."""

    category: str
    turns: list[str]
    reference: list[str]
    meta: dict[str, object] = field(default_factory=dict)

    def as_question(self, question_id: int) -> dict:
        """The item in the official question schema (fresh lists: callers may mutate them)."""
        return {"question_id": question_id, "category": self.category, "turns": list(self.turns),
                "reference": list(self.reference)}


#: A generator draws one item of its category from a seeded rng and the world.
Generator = Callable[[random.Random, World], Item]
