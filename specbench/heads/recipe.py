"""A method that trains its own head: the recipe lives in the method's module, its settings in the
method's YAML, and everything else (where the head is cached, when it is retrained, how the zoo, a kit
and `specbench train-head` build it) follows from those two.

The method class declares

    Training = MyTraining            # a dataclass of its training settings, subclassing `TrainingBase`

    @classmethod
    def train_head(cls, data: HeadData, settings: MyTraining, out: Path) -> dict:
        ...                          # train on `data`, write the head folder `out`, return its stats

and its YAML a `train:` section with the values (`tokens`, `seed`, `steps` or `epochs`, `lr`, `dtype`
and the recipe's own). `method.head: ${parts:NAME}` then names the head built for the model in use:
`zoo:NAME` is trained on the zoo's corpus the first time a run asks for it and cached under a key of the
settings, the recipe's code and the target (`part_key`); a kit's `KIT:NAME` likewise on the kit's corpus
(specbench.kit.heads), with the kit's `build.heads.NAME` overriding the YAML's settings for its target.
Every trained built-in is such a method: Medusa, EAGLE (EAGLE-2 drafts on its head), EAGLE-3, Hydra,
PPD and SpecDec.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.hardware import TRAIN_DTYPES, autocast_dtype
from specbench.core.resume import TrainingState
from specbench.engine.api import parse_settings
from specbench.heads.train import DEFAULT_TOKENS, Features, collect_exit_states, collect_features

#: the method-config key holding a trained-head method's training settings
TRAIN_KEY = "train"
#: the file a built head part's folder holds last (its stats): a folder without it is not complete
PART_CARD = "part.json"
#: bump when this module changes what a recipe is given
RECIPE_VERSION = "recipe-2"


@dataclass
class TrainingBase:
    """The settings every head recipe has (subclass it and add the recipe's own, each with a default)."""

    #: the recipe starts from the model's draft (`HeadData.draft`): a kit keys its head on the draft's settings
    starts_from_draft: ClassVar[bool] = False

    tokens: int = DEFAULT_TOKENS  # corpus tokens the frozen target is run over (packed rows; a kit's: every row)
    seed: int = field(default=0, metadata={"min": 0})  # added to the builder's seed (the zoo's, a kit's, train-head's)
    steps: int = 150  # optimiser steps (unless `epochs` is set)
    epochs: float | None = None  # passes over the training positions instead of `steps` (a kit's heads)
    lr: float = 3e-3  # peak learning rate
    dtype: str = "float32"  # the training's products: float32 | bfloat16 (autocast) | auto (bf16 where native)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise SpecbenchError(f"setting 'lr' must be a positive number, got {self.lr!r}")
        if self.epochs is not None and not self.epochs > 0:
            raise SpecbenchError(f"setting 'epochs' must be a positive number of passes over the corpus (or null "
                                 f"for `steps`), got {self.epochs!r}")
        if self.dtype not in TRAIN_DTYPES:
            raise SpecbenchError(f"setting 'dtype' must be one of {', '.join(TRAIN_DTYPES)}, got {self.dtype!r}")

    def positions_per_step(self) -> int:
        """Training positions one optimiser step reads (`epochs` to steps): `batch_positions`, or
        `batch_rows` windows of `window`; a recipe that reads another measure overrides this."""
        if hasattr(self, "batch_positions"):
            return int(self.batch_positions)
        if hasattr(self, "batch_rows") and hasattr(self, "window"):
            return int(self.batch_rows) * int(self.window)
        raise SpecbenchError(f"{type(self).__name__} has no batch_positions nor batch_rows and window, so `epochs` "
                             "cannot be turned into steps: set `steps` instead, or define positions_per_step")


@dataclass
class HeadData:
    """What a recipe trains on: the frozen target, its tokenizer, the packed training rows (the zoo's,
    `train-head`'s corpus) and, computed once per process for every recipe that asks, the target's
    features on them. A kit's corpus is a subclass (specbench.kit.heads.CorpusHeadData): every answer
    of the corpus, its states from disk, losses on answer tokens, agreement on held-out rows.

    A recipe asks it for `features`, `exit_states`, `steps(settings)` (`epochs` or `steps`),
    `compute(settings)` (the autocast dtype), `seed_of(settings)`, `desc(name)`, `ckpt` (a TrainingState
    to save progress in and resume from, or None) and `heldout(kind, head)` (card fields measured on
    held-out rows; none here)."""

    target: torch.nn.Module
    tokenizer: Any
    input_ids: torch.Tensor  # (rows, L) long
    valid: torch.Tensor  # (rows, L) bool
    base: str  # the target as the head's config records it (zoo:target, smollm2:target, a path)
    label: str = "head"  # progress bars: "<label> <method> head"
    seed: int = 0  # the builder's seed; a recipe's `seed` setting is added to it
    #: loads the model's draft (a recipe that starts from it, e.g. SpecDec); None when the model has none
    draft: Callable[[], torch.nn.Module] | None = None
    #: where a long training saves its progress and resumes from (specbench.core.resume); None: no saving
    ckpt: TrainingState | None = None
    _features: dict[tuple, Features] = field(default_factory=dict, repr=False)
    _exits: dict[tuple, torch.Tensor] = field(default_factory=dict, repr=False)

    def rows(self, tokens: int) -> int:
        """Rows that hold about `tokens` positions (all rows at most)."""
        return min(self.input_ids.shape[0], max(1, math.ceil(tokens / self.input_ids.shape[1])))

    def features(self, tokens: int, layers: Sequence[int] | None = None) -> Features:
        """The target's features on the first `rows(tokens)` rows (with `layers`, fused states too)."""
        n = self.rows(tokens)
        key = (n, tuple(layers) if layers else None)
        if key not in self._features:
            self._features[key] = collect_features(self.target, self.input_ids[:n], self.valid[:n],
                                                   desc=f"{self.label} head features", layers=key[1])
        return self._features[key]

    def exit_states(self, tokens: int, exit_layer: int) -> Any:
        """The target's state after its first `exit_layer` blocks, through its final norm, on the rows of
        `features(tokens)` (PPD's exit head)."""
        n = self.rows(tokens)
        if (n, exit_layer) not in self._exits:
            self._exits[n, exit_layer] = collect_exit_states(self.target, self.input_ids[:n], self.valid[:n],
                                                             exit_layer, desc=f"{self.label} early-exit states")
        return self._exits[n, exit_layer]

    def positions(self, tokens: int) -> int:
        """Training positions of `features(tokens)` (what an epoch passes over)."""
        return int(self.valid[:self.rows(tokens)].sum())

    def steps(self, settings: TrainingBase) -> int:
        """The optimiser steps: `settings.epochs` passes over the training positions when set, else `steps`."""
        if settings.epochs is None:
            return int(settings.steps)
        return max(1, math.ceil(settings.epochs * self.positions(settings.tokens) / settings.positions_per_step()))

    def compute(self, settings: TrainingBase) -> torch.dtype | None:
        """The autocast dtype of the training's products (None: float32)."""
        return autocast_dtype(settings.dtype)

    def seed_of(self, settings: TrainingBase) -> int:
        return self.seed + int(settings.seed)

    def desc(self, name: str) -> str:
        return f"{self.label} {name} head"

    def heldout(self, kind: str, head: torch.nn.Module) -> dict:
        """Card fields measured on held-out rows for a head of `kind` (medusa, hydra, eagle, eagle3, ppd):
        none for packed rows (no held-out split); a kit's corpus measures them."""
        return {}

    def the_draft(self, method: str) -> torch.nn.Module:
        """The model's draft, loaded; a one-line error when the model has none."""
        if self.draft is None:
            raise SpecbenchError(f"{method}'s recipe starts from the model's draft and {self.base} has none: give "
                                 "one (train-head draft=FOLDER|HUB_ID, or the model config's `draft`)")
        return self.draft()


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
