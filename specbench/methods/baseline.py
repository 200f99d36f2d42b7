"""Autoregressive decoding with a KV cache: one target forward per new token."""

from __future__ import annotations

import torch

from specbench.methods.base import GenerationResult, Method, Prefilled
from specbench.sampling import SamplingParams, next_token
from specbench.stopping import StopCriteria
from specbench.timing import Timer


class Baseline(Method):
    @torch.inference_mode()
    def decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        tokens = list(state.tokens)
        accept_lengths: list[int] = []
        cache = state.cache
        device = self.target.device
        if stop.cut(tokens, 0) is not None:
            return GenerationResult(tokens, accept_lengths)
        while True:
            step_input = torch.tensor([[tokens[-1]]], device=device)
            logits = self.target.model(input_ids=step_input, cache=cache, use_cache=True).logits[:, -1, :]
            tokens.append(int(next_token(logits, sampling)[0]))
            accept_lengths.append(1)
            if stop.cut(tokens, len(tokens) - 1) is not None:
                return GenerationResult(tokens, accept_lengths)
