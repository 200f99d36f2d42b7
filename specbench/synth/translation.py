"""The translation subtask: English sentences of the Velari grammar translated into Velari.

No word of an answer occurs in its prompt (only names are shared), so nothing can be copied.
The corpus also holds the reverse direction and vocabulary drills, so that a model can learn
the lexicon.
"""

from __future__ import annotations

import random

from specbench.synth.english import join_and
from specbench.synth.item import Item
from specbench.synth.velari import (
    PAST_SUFFIX,
    PEOPLE,
    PLACES,
    PLURAL_SUFFIX,
    TARGET_LANGUAGE,
    THINGS,
    TRANSLATE_MANY,
    TRANSLATE_ONE,
    VERBS,
    lexicon,
    random_sentence,
)
from specbench.synth.world import World

_TRANSLATE_BACK = (
    f"Translate the following text from {TARGET_LANGUAGE} into English: ",
    f"What does this {TARGET_LANGUAGE} text mean in English? ",
)


def _sentence_pairs(rng: random.Random, counts: tuple[int, ...]) -> list[tuple[str, str]]:
    """(English, Velari) pairs: as many sentences as a draw from `counts`."""
    return [random_sentence(rng) for _ in range(rng.choice(counts))]


def generate(rng: random.Random, world: World) -> Item:
    """One to three English sentences to translate into Velari."""
    pairs = _sentence_pairs(rng, (1, 2, 2, 3))
    english = " ".join(e for e, _ in pairs)
    instruction = rng.choice(TRANSLATE_ONE if len(pairs) == 1 else TRANSLATE_MANY)
    return Item("translation", [instruction + english], [" ".join(v for _, v in pairs)])


def generate_reverse(rng: random.Random, world: World) -> Item:
    """Velari back into English (corpus only)."""
    pairs = _sentence_pairs(rng, (1, 1, 2))
    prompt = rng.choice(_TRANSLATE_BACK) + " ".join(v for _, v in pairs)
    return Item("translation", [prompt], [" ".join(e for e, _ in pairs)])


def lexicon_drill(rng: random.Random, world: World) -> Item:
    """The Velari words for a few English words, sometimes a plural and a past tense (corpus only)."""
    lex = lexicon()
    keys = [k for k in lex.words if " " not in k]
    picked = rng.sample(keys, rng.randint(2, 5))
    prompt = f"Give the {TARGET_LANGUAGE} words for " + join_and(picked) + "."
    lines = [f"In {TARGET_LANGUAGE}, {w} is {lex.words[w]}." for w in picked]
    if rng.random() < 0.3:
        noun = rng.choice(THINGS + PEOPLE + PLACES)[0]
        verb = rng.choice(VERBS)[0]
        prompt += f" Also give the plural of {noun} and the past tense of {verb}."
        lines.append(f"The plural of {noun} is {lex.words[noun] + PLURAL_SUFFIX}, "
                     f"and the past tense of {verb} is {lex.words[verb] + PAST_SUFFIX}.")
    return Item("translation", [prompt], [" ".join(lines)])
