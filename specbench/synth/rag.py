"""The rag subtask: three to five passages of entity facts and a question that one passage answers.

The answer names the passage and quotes up to three of its sentences, so most of it is copied
from the prompt.
"""

from __future__ import annotations

import random

from specbench.synth.english import lower_the, word_count
from specbench.synth.item import Item
from specbench.synth.qa import QUESTION_TEMPLATES
from specbench.synth.world import World, facts, pick_entity

_INSTRUCTIONS = (
    "Answer the question using the passages below.",
    "Read the passages below and answer the question.",
    "Use the following passages to answer the question at the end.",
)


def _passage_sentences(rng: random.Random, entity_facts: list[tuple[str, str]], must: str | None) -> list[str]:
    """Three or four facts of an entity in random order, the `must` attribute's fact among them."""
    n = min(len(entity_facts), rng.randint(3, 4))
    others = [f for f in entity_facts if f[0] != must]
    rng.shuffle(others)
    chosen = others[: n - (1 if must else 0)]
    if must:
        chosen.append(next(f for f in entity_facts if f[0] == must))
    rng.shuffle(chosen)
    return [s for _, s in chosen]


def _distractors(rng: random.Random, world: World, kind: str, name: str, target: list[str],
                 n_passages: int) -> list[list[str]]:
    """Passages about other entities, mostly of the same kind; more of them (up to five passages
    in all) while the passages are shorter than about a hundred words."""
    same_kind = [e for e in world.entities if e[0] == kind and e[1] != name]
    picked: list[tuple[str, str]] = []
    passages: list[list[str]] = []
    while len(passages) < n_passages - 1 or (
        len(passages) < 4 and sum(word_count(s) for p in passages + [target] for s in p) < 100
    ):
        cand = rng.choice(same_kind if rng.random() < 0.6 else world.entities)
        if cand[1] != name and cand not in picked:
            picked.append(cand)
            passages.append(_passage_sentences(rng, facts(world, *cand), None))
    return passages


def generate(rng: random.Random, world: World) -> Item:
    """A rag question: passages, a question about one entity, an answer quoting its passage."""
    kind, name = pick_entity(rng, world)
    entity_facts = facts(world, kind, name)
    attr = rng.choice([a for a, _ in entity_facts])
    target_sents = _passage_sentences(rng, entity_facts, attr)
    passages = _distractors(rng, world, kind, name, target_sents, rng.randint(3, 5))
    target = rng.randint(0, len(passages))
    passages.insert(target, target_sents)
    pos = target_sents.index(dict(entity_facts)[attr])
    # Quote up to three consecutive sentences of the passage, starting with the relevant one
    # where the passage allows.
    start = max(0, min(pos, len(target_sents) - 3))
    quoted = target_sents[start:start + 3]
    question = rng.choice(QUESTION_TEMPLATES[(kind, attr)]).format(e=name)
    body = "\n".join(f"Passage {i + 1}: " + " ".join(p) for i, p in enumerate(passages))
    prompt = f"{rng.choice(_INSTRUCTIONS)}\n\n{body}\n\nQuestion: {question}"
    answer = " ".join([f"According to passage {target + 1}, {lower_the(quoted[0])}"] + quoted[1:])
    return Item("rag", [prompt], [answer], {"entity": (kind, name)})
