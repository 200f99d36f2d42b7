"""Seeded random generators: stable across runs, machines and PYTHONHASHSEED.

Every random choice of the generator goes through `seeded_rng`, never through the global
`random` state, Python's `hash()`, the clock or the locale.
"""

from __future__ import annotations

import hashlib
import random

#: Seed of the fixed fictional world and of the Velari lexicon (independent of the question seed).
WORLD_SEED = "specbench-synth-world-1"


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from the parts (SHA-256 of their text joined by a unit separator)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def seeded_rng(*parts: object) -> random.Random:
    """A fresh `random.Random` seeded from the parts."""
    return random.Random(derive_seed(*parts))
