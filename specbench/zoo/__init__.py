"""The embedded model zoo (`model=tiny`): a tiny Llama target and drafts trained on CPU.

No GPU and no downloads: `ensure_zoo()` trains a byte-level BPE tokenizer, a Llama target, a
draft distilled from it and a plain draft on the synthetic corpus (specbench.synth), writes a
quality card, and caches the result under `zoo_root()/<zoo_hash(cfg)>`. Every model folder
loads with `AutoTokenizer` / `AutoModelForCausalLM` like a hub model.
"""

from specbench.models import register_resolver
from specbench.zoo.cli import zoo_main
from specbench.zoo.store import ZOO_CODE_VERSION, ensure_zoo, is_complete, load_zoo_config, zoo_hash, zoo_root

__all__ = [
    "ZOO_CODE_VERSION", "ensure_zoo", "is_complete", "load_zoo_config", "resolve", "zoo_hash", "zoo_main", "zoo_root",
]


def resolve(name: str) -> str:
    """`zoo:NAME` -> the folder (or file) of that part of the zoo, built on first use."""
    from specbench.zoo.parts import resolve as resolve_part

    return str(resolve_part(name))


register_resolver("zoo", resolve)
