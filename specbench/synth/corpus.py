"""The training corpus: conversations from the same generators, disjoint from the benchmark.

The zoo trains its models on it. The mixture leans on the subtasks a tiny model must learn
(translation, summarization, math_reasoning, rag, qa), adds reverse translations and lexicon
drills, and makes every tenth conversation an entity profile, so that the world's facts and
the Velari lexicon can be learned; no user turn contains a user turn of the benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial

from specbench.synth import qa, translation
from specbench.synth.benchmark import GENERATORS, first_accepted, question_items
from specbench.synth.item import Generator, Item
from specbench.synth.seeds import seeded_rng
from specbench.synth.world import World, get_world

#: Relative weights of the conversation families (every tenth conversation is a profile instead).
_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("qa", 12.0),
    ("translation", 14.0),
    ("translation_reverse", 2.0),
    ("lexicon", 2.0),
    ("summarization", 12.0),
    ("math_reasoning", 15.0),
    ("rag", 12.0),
    ("writing", 2.6),
    ("roleplay", 2.6),
    ("reasoning", 2.8),
    ("math", 2.8),
    ("coding", 2.6),
    ("extraction", 2.6),
    ("stem", 2.4),
    ("humanities", 2.6),
)
_FAMILIES: dict[str, Generator] = {
    **GENERATORS, "translation_reverse": translation.generate_reverse, "lexicon": translation.lexicon_drill,
}
_PROFILE_EVERY = 10


class _TurnIndex:
    """Answers "does this text contain any of the indexed turns?" quickly and exactly.

    A turn q of k >= 3 whitespace tokens can only occur inside a text c if its interior tokens
    q[1:min(4, k-1)] occur as consecutive whole tokens of c, so those token n-grams are used as
    keys; the exact substring test runs only on the few candidates they select.
    """

    def __init__(self, turns: Iterable[str]) -> None:
        self.short: list[str] = []
        self.keys: dict[int, dict[tuple[str, ...], list[str]]] = {1: {}, 2: {}, 3: {}}
        for q in dict.fromkeys(turns):
            toks = q.split()
            if len(toks) < 3:
                self.short.append(q)
                continue
            key = tuple(toks[1:min(4, len(toks) - 1)])
            self.keys[len(key)].setdefault(key, []).append(q)

    def hits(self, text: str) -> bool:
        if any(q in text for q in self.short):
            return True
        toks = text.split()
        for n, table in self.keys.items():
            if not table:
                continue
            grams = set(zip(*(toks[i:] for i in range(n))))
            for key in grams & table.keys():
                if any(q in text for q in table[key]):
                    return True
        return False


def _conversation(world: World, seed: int, question_seed: int, idx: int, profile: tuple[str, str] | None,
                  attempt: int) -> Item:
    """Attempt `attempt` at conversation `idx`: the entity's profile (first attempt only), else a
    conversation of a family drawn by weight."""
    rng = seeded_rng("corpus", seed, question_seed, idx, attempt)
    if profile and attempt == 0:
        return qa.profile(rng, world, *profile)
    family = rng.choices([name for name, _ in _WEIGHTS], [w for _, w in _WEIGHTS])[0]
    return _FAMILIES[family](rng, world)


def make_corpus(n_conversations: int, seed: int = 1, question_seed: int = 0) -> Iterator[dict]:
    """Training conversations from the same families, disjoint from make_questions(question_seed).

    Yields dicts with question_id (a running index), category, turns and reference.  Every tenth
    conversation is an entity profile (all facts of one entity, cycling through the world, entities
    asked about by the qa questions first) so that the world facts can be learned; no user turn
    contains (or equals) a user turn of the benchmark questions.
    """
    world = get_world()
    items = question_items(question_seed)
    index = _TurnIndex(t for it in items for t in it.turns)
    asked = [it.meta["entity"] for it in items if it.category == "qa"]
    order = list(dict.fromkeys(asked + world.entities))

    def disjoint(item: Item) -> bool:
        return not any(index.hits(t) for t in item.turns)

    for idx in range(n_conversations):
        profile = order[(idx // _PROFILE_EVERY) % len(order)] if idx % _PROFILE_EVERY == 0 else None
        make = partial(_conversation, world, seed, question_seed, idx, profile)
        item = first_accepted(make, disjoint, 200, "a corpus conversation disjoint from the questions")
        yield item.as_question(idx)
