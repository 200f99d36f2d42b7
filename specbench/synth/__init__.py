"""A deterministic synthetic benchmark in the style of Spec-Bench, plus a training corpus.

The generator builds a small fictional world (towns, people, rivers, companies, mountains and
lakes, all fixed by a constant seed), a constructed language called Velari, and template
families for the six Spec-Bench subtasks.  Everything is written in a closed, templated
English so that a tiny language model can learn it from one or two million tokens, while the
phenomena that matter for speculative decoding are kept:

* ``summarization`` and ``rag`` answers copy whole sentences of the prompt;
* ``translation`` answers are Velari, whose words never occur in the English prompt;
* ``qa``, ``math_reasoning`` and ``mt_bench`` copy some entities and numbers and are otherwise
  formulaic.

Questions use the official Spec-Bench question schema::

    {"question_id": int, "category": str, "turns": [str, ...], "reference": [str, ...]}

Determinism: only ``random.Random`` instances seeded through SHA-256 are used, never the global
generator, Python's ``hash()``, the clock or the locale.

Modules, in import order: ``seeds`` (seeded rngs), ``english`` (text helpers), ``world`` (the
fictional world and its facts), ``item`` (categories and the item a generator returns),
``velari`` (the language), one module per subtask (``qa``, ``rag``, ``summarization``,
``translation``, ``math_reasoning``, and the package ``mt_bench`` with one module per category),
``benchmark`` (the 480 questions) and ``corpus`` (the training conversations).
"""

from specbench.synth.benchmark import conversation_messages, make_questions, write_questions
from specbench.synth.corpus import make_corpus
from specbench.synth.item import CATEGORIES, MT_BENCH_CATEGORIES, SUBTASKS
from specbench.synth.velari import TARGET_LANGUAGE, translate_to_velari

__all__ = [
    "CATEGORIES",
    "GENERATOR_VERSION",
    "MT_BENCH_CATEGORIES",
    "SUBTASKS",
    "TARGET_LANGUAGE",
    "conversation_messages",
    "make_corpus",
    "make_questions",
    "translate_to_velari",
    "write_questions",
]

#: Bump whenever the generated text changes; other modules hash it into cache keys.
GENERATOR_VERSION: str = "synth-1"
