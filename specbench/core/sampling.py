"""Logits processing shared by the baseline and the speculative engine.

Every method turns target (and draft) logits into a distribution through the same
function, so that "lossless" means the same thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings: temperature 0 means greedy; top_k 0 and top_p 1 disable the filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution over the last dimension after temperature, top-k and top-p (float32).

    In greedy mode this is the one-hot distribution of the argmax, so verifiers can treat
    greedy as the limit of sampling.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor) -> torch.Tensor:
    """One token id per row of a (..., V) distribution, drawn with torch's global generator."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1).reshape(probs.shape[:-1])


def next_token(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The token the target emits from `logits` (..., V): argmax when greedy, else a sample."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(probs_from_logits(logits, params))
