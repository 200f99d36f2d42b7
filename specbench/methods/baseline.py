"""Autoregressive decoding with a KV cache: one target forward per new token."""

from __future__ import annotations

import torch

from specbench.core.sampling import SamplingParams, next_token
from specbench.core.stopping import StopCriteria
from specbench.core.timing import Timer
from specbench.engine.api import GenerationResult, Method, Prefilled, Requests
from specbench.engine.batch import BatchDecoder, NoDraft, NoStats
from specbench.engine.target import model_context
from specbench.engine.verifier import verify


def top2_margin(logits: torch.Tensor) -> float:
    """Gap between the two largest logits: how close greedy decoding was to a tie."""
    top = torch.topk(logits.float(), 2, dim=-1).values
    return round(float(top[..., 0] - top[..., 1]), 5)


class Baseline(Method):
    """The reference. In greedy mode it also records the top-2 logit margin of every token,
    so the report's lossless audit can tell numerical near-ties from real mismatches.

    Batched, it is the shared batched loop with an empty draft per row: right-padded prompts,
    one forward per step for the live rows, each row stopping on its own (and leaving the batch)."""

    batch_problem = None

    def generate_batch(self, requests: Requests, slots: int, sampling: SamplingParams, timer: Timer) -> None:
        margins = top2_margin if sampling.greedy else None
        BatchDecoder(self.target, NoDraft, verify, sampling, timer, NoStats, margins,
                     model_context(self.target.model.config)).run(requests, slots)

    @torch.inference_mode()
    def decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        tokens = list(state.tokens)
        accept_lengths: list[int] = []
        margins = [top2_margin(state.logits)] if sampling.greedy and state.logits is not None else None
        stats = {"top2_margin": margins} if margins is not None else {}
        cache = state.cache
        device = self.target.device
        if stop.cut(tokens, 0) is not None:
            return GenerationResult(tokens, accept_lengths, stats)
        while True:
            step_input = torch.tensor([[tokens[-1]]], device=device)
            logits = self.target.model(input_ids=step_input, cache=cache, use_cache=True).logits[:, -1, :]
            tokens.append(int(next_token(logits, sampling)[0]))
            accept_lengths.append(1)
            if margins is not None:
                margins.append(top2_margin(logits))
            if stop.cut(tokens, len(tokens) - 1) is not None:
                return GenerationResult(tokens, accept_lengths, stats)
