"""The eight mt_bench categories: two-turn conversations, one module per category."""

from __future__ import annotations

from specbench.synth.item import Generator
from specbench.synth.mt_bench import coding, extraction, humanities, math, reasoning, roleplay, stem, writing

#: category -> generator, in the benchmark's order
GENERATORS: dict[str, Generator] = {
    "writing": writing.generate,
    "roleplay": roleplay.generate,
    "reasoning": reasoning.generate,
    "math": math.generate,
    "coding": coding.generate,
    "extraction": extraction.generate,
    "stem": stem.generate,
    "humanities": humanities.generate,
}
