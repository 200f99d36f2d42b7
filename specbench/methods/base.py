"""The interface every decoding method fills in.

A method is split the way the runner times it: `prefill` runs the target over the prompt
and picks the first new token (time to first token), `decode` produces the rest. Methods
never read clocks and never write files: the runner owns timing and I/O. They may open
named sections on the timer they are given (`with timer.section("draft"): ...`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig

from specbench.models import LoadedModel
from specbench.sampling import SamplingParams, next_token
from specbench.stopping import StopCriteria
from specbench.timing import Timer


@dataclass
class Prefilled:
    """State after the prompt: the prompt ids, the first new token, the target's KV cache."""

    input_ids: torch.Tensor  # (1, prompt_len)
    tokens: list[int]  # generated so far (the first token)
    cache: Any = None
    logits: torch.Tensor | None = None  # (1, vocab) logits that produced tokens[-1]
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific state (hidden states...)


@dataclass
class GenerationResult:
    """What decode returns.

    tokens: every new token id, the first one included, truncated at the stop rule (an EOS
    that stopped generation is kept). accept_lengths: one entry per target forward after the
    prefill, the tokens that step emitted (bonus token included): all 1 for autoregressive
    decoding. So `len(tokens) == 1 + sum(accept_lengths)`. stats: per-call extras for the
    answer file (draft lengths, per-position acceptance, ...).
    """

    tokens: list[int]
    accept_lengths: list[int]
    stats: dict[str, Any] = field(default_factory=dict)


class Method:
    """Base class: holds the target, prefills with the target alone."""

    #: whether prefill and decode are separate calls (False for wrappers of model.generate)
    splits_prefill: bool = True

    def __init__(self, target: LoadedModel, cfg: DictConfig, model_cfg: DictConfig) -> None:
        self.target = target
        self.cfg = cfg  # the method's config group
        self.model_cfg = model_cfg  # the model's config group (draft path, template, ...)

    def extra_parameters(self) -> int:
        """Parameters the method adds to the target (draft model, heads), counted from the
        loaded modules; 0 for training-free methods."""
        return 0

    def reset(self) -> None:
        """Forget state carried across questions (called at the start of every run)."""

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, sampling: SamplingParams) -> Prefilled:
        cache = self.target.new_cache()
        out = self.target.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :]
        first = int(next_token(logits, sampling)[0])
        return Prefilled(input_ids=input_ids, tokens=[first], cache=cache, logits=logits)

    def decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        raise NotImplementedError
