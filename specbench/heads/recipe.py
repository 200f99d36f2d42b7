"""A method that trains its own head: the recipe lives in the method's module, its settings in the
method's YAML, and everything else (where the head is cached, when it is retrained, how the zoo, a kit
and `specbench train-head` build it) follows from those two.

The method class declares

    Training = MyTraining            # a dataclass of its training settings, subclassing `TrainingBase`

    @classmethod
    def train_head(cls, data: HeadData, settings: MyTraining, out: Path) -> dict:
        ...                          # train on `data`, write the head folder `out`, return its stats

and its YAML a `train:` section with the values (`tokens`, `seed`, `steps`, `lr` and the recipe's
own). `method.head: ${parts:NAME}` then names the head built for the model in use: `zoo:NAME` is
trained on the zoo's corpus the first time a run asks for it and cached under a key of the settings,
the recipe's code and the target (`part_key`); a kit's `KIT:NAME` likewise on the kit's corpus, with
the kit's `build.heads.NAME` overriding the YAML's settings for its target.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specbench.core.errors import SpecbenchError
from specbench.engine.api import parse_settings
from specbench.heads.train import DEFAULT_TOKENS, Features, collect_features

#: the method-config key holding a trained-head method's training settings
TRAIN_KEY = "train"
#: the file a built head part's folder holds last (its stats): a folder without it is not complete
PART_CARD = "part.json"
#: bump when this module changes what a recipe is given
RECIPE_VERSION = "recipe-1"


@dataclass
class TrainingBase:
    """The settings every head recipe has (subclass it and add the recipe's own, each with a default)."""

    tokens: int = DEFAULT_TOKENS  # corpus tokens the frozen target is run over (its features are kept in memory)
    seed: int = field(default=0, metadata={"min": 0})  # added to the builder's seed (the zoo's, a kit's, train-head's)
    steps: int = 150  # optimiser steps
    lr: float = 3e-3  # peak learning rate


@dataclass
class HeadData:
    """What a recipe trains on: the frozen target, its tokenizer, the packed training rows and,
    computed once per process for every recipe that asks, the target's features on them."""

    target: torch.nn.Module
    tokenizer: Any
    input_ids: torch.Tensor  # (rows, L) long
    valid: torch.Tensor  # (rows, L) bool
    base: str  # the target as the head's config records it (zoo:target, smollm2:target, a path)
    label: str = "head"  # progress bars: "<label> <method> head"
    seed: int = 0  # the builder's seed; a recipe's `seed` setting is added to it
    #: loads the model's draft (a recipe that starts from it, e.g. SpecDec); None when the model has none
    draft: Callable[[], torch.nn.Module] | None = None
    _features: dict[tuple, Features] = field(default_factory=dict, repr=False)

    def rows(self, tokens: int) -> int:
        """Rows that hold about `tokens` positions (all rows at most)."""
        return min(self.input_ids.shape[0], max(1, math.ceil(tokens / self.input_ids.shape[1])))

    def features(self, tokens: int, layers: tuple[int, ...] | None = None) -> Features:
        """The target's features on the first `rows(tokens)` rows (with `layers`, fused states too)."""
        n = self.rows(tokens)
        key = (n, tuple(layers) if layers else None)
        if key not in self._features:
            self._features[key] = collect_features(self.target, self.input_ids[:n], self.valid[:n],
                                                   desc=f"{self.label} head features", layers=layers)
        return self._features[key]


def is_trainable(cls: type) -> bool:
    """Whether a method class trains its own head (declares `Training` and `train_head`)."""
    training = getattr(cls, "Training", None)
    return isinstance(training, type) and issubclass(training, TrainingBase) and callable(
        getattr(cls, "train_head", None))


def training_settings(cls: type, values: dict | None, method: str) -> Any:
    """The `train:` values as the class's `Training` dataclass: types, ranges and unknown keys checked."""
    if not is_trainable(cls):
        raise SpecbenchError(f"method '{method}' has a `{TRAIN_KEY}:` section but {cls.__name__} trains no head "
                             "(declare Training, a TrainingBase dataclass, and a train_head classmethod, or drop "
                             f"the `{TRAIN_KEY}:` section)")
    from omegaconf import OmegaConf

    return parse_settings(cls.Training, OmegaConf.create(dict(values or {})), f"{method}.{TRAIN_KEY}")


def part_key(cls: type, settings: Any, target: str) -> str:
    """8 hex digits naming a head built with `settings` by `cls`'s recipe for `target` (a string that
    changes whenever the target's weights do): a change of any of them trains a new head."""
    code = "\n".join(inspect.getsource(obj) for obj in (cls.Training, cls.train_head))
    payload = json.dumps({"settings": asdict(settings), "code": code, "target": target, "version": RECIPE_VERSION},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:8]


def train_part(cls: type, settings: Any, data: HeadData, out: Path, method: str) -> dict:
    """Train `method`'s head with `settings` on `data` into the folder `out`; its card (the recipe's
    stats, the settings, the time) is written last, as `out/part.json`, and returned."""
    import time

    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        stats = cls.train_head(data, settings, out)
    card = {"method": method, "settings": asdict(settings), "base": data.base, **dict(stats or {}),
            "build_seconds": round(time.perf_counter() - start, 1)}
    (out / PART_CARD).write_text(json.dumps(card, indent=2) + "\n")
    return card
